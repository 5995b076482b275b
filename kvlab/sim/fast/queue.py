"""The waiting queue of the fast engine: FCFS over the arrival order, or a heap by policy rank."""
from __future__ import annotations

import heapq
from collections import deque
from types import ModuleType
from typing import Any

import numpy as np

from .state import Rules


class Waiting:
    """The waiting queue: preempted requests in front of the arrivals (FCFS), or a heap by rank.

    Arrivals are a range ``[lo, hi)`` of the arrival order, so the FCFS queue's tail is a slice,
    not a copy.
    """

    def __init__(self, order_h: np.ndarray, order: Any, rules: Rules) -> None:
        self.order_h, self.order, self.rules = order_h, order, rules
        self.front: deque[int] = deque()
        self.lo = self.hi = 0
        self.heap: list[tuple[int, int]] | None = [] if rules.ordered else None

    def __len__(self) -> int:
        return len(self.heap) if self.heap is not None else len(self.front) + self.hi - self.lo

    def arrive(self, hi: int) -> None:
        """Requests ``order[self.hi:hi]`` join the back (or the heap)."""
        if self.heap is not None and hi > self.hi:
            ranks = self.rules.queue_ranks(self.order[self.hi:hi])
            for rank, r in zip(ranks, self.order_h[self.hi:hi].tolist()):
                heapq.heappush(self.heap, (rank, r))
            self.lo = hi
        self.hi = hi

    def head(self) -> int:
        if self.heap is not None:
            return self.heap[0][1]
        return self.front[0] if self.front else int(self.order_h[self.lo])

    def first(self, m: int, xp: ModuleType) -> Any:
        """The first ``m`` requests (array of ids, on ``xp``)."""
        if self.heap is not None:
            return xp.asarray([r for _, r in heapq.nsmallest(m, self.heap)], dtype=xp.int64)
        if not self.front:
            return self.order[self.lo:self.lo + m]
        head = list(self.front)[:m]
        return xp.concatenate([xp.asarray(head, dtype=xp.int64), self.order[self.lo:self.lo + m - len(head)]])

    def pop(self, m: int = 1) -> None:
        """Remove the first ``m`` requests."""
        if self.heap is not None:
            for _ in range(m):
                heapq.heappop(self.heap)
            return
        while m and self.front:
            self.front.popleft()
            m -= 1
        self.lo += m

    def push_front(self, r: int) -> None:
        if self.heap is not None:
            heapq.heappush(self.heap, (self.rules.queue_ranks(self.rules.eng.xp.asarray([r]))[0], r))
        else:
            self.front.appendleft(r)
