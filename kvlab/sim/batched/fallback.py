"""One simulation's step scheduled request by request: the reference's phases on one row of the batch.

The batched engine hands a row here when its step is not the common case (a preemption, an
abort, a preempted request in the queue, ...). :class:`RowStep` runs the reference engine's
``_schedule_running`` and ``_admit_waiting`` (chunked scheduler, no swap) on host copies of the
row's columns, asking the simulation's own bound policy about each request, and leaves the row's
columns as the reference leaves its requests, with each request's chunk for the iteration.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..._intmath import ceil_div
from ...policies import Policy, Requests
from ..fast.state import ABORT_REASONS, ABORTED, PREEMPTED, RUNNING

#: The per-request columns a :class:`RowStep` reads and writes (host arrays of one row).
ROW_COLUMNS = ("P", "O", "G", "C", "R", "U", "ST", "SEQ", "QK", "AI", "AS", "NP", "XI", "XS", "AB", "IDX")


class RowStep:
    """Schedule iteration ``k`` (starting at ``now_s``) of one simulation whose columns are ``h``.

    Parameters
    ----------
    h : dict of str to ndarray
        The row's columns (:data:`ROW_COLUMNS`, requests sorted by arrival), changed in place.
    policy : Policy
        The simulation's bound policy.
    counters : dict of str to int
        ``admit_count``, ``preempt_count``, ``nxt`` (first request never admitted nor aborted),
        changed in place.
    arrived : int
        Requests (in arrival order) that have arrived by ``now_s``.
    """

    def __init__(self, h: dict[str, np.ndarray], *, policy: Policy, counters: dict[str, int], arrived: int, k: int,
                 now_s: float, block_size: int, num_pages: int, budget_tokens: int, max_num_seqs: int,
                 reject: bool) -> None:
        self.h, self.policy, self.counters = h, policy, counters
        self.k, self.now_s, self.bs, self.num_pages = k, now_s, block_size, num_pages
        self.budget, self.max_num_seqs, self.reject = budget_tokens, max_num_seqs, reject
        self.chunk = np.zeros(h["P"].shape[0], dtype=np.int64)
        self.num_preempted = 0
        self.num_aborted = 0
        self.committed = int(np.maximum(h["R"], h["U"]).sum())
        running = np.flatnonzero(h["ST"] == RUNNING)
        self.running: list[int] = running[np.argsort(h["SEQ"][running], kind="stable")].tolist()
        preempted = np.flatnonzero(h["ST"] == PREEMPTED)
        new = range(counters["nxt"], arrived)
        self.waiting: list[int] = preempted[np.argsort(h["QK"][preempted], kind="stable")].tolist() + list(new)

    def run(self) -> None:
        """The reference's ``_schedule`` for the chunked scheduler without swap."""
        self._schedule_running()
        if not self.num_preempted:
            self._admit_waiting()
        self.counters["nxt"] = self._next_new()

    # ------------------------------------------------------------------ the reference's phases
    def _schedule_running(self) -> None:
        h = self.h
        decodes = [r for r in self.running if self._is_decoding(r)]
        prefills = [r for r in self.running if not self._is_decoding(r)]
        for r in decodes + prefills:
            if h["ST"][r] != RUNNING or self.chunk[r]:
                continue
            if self.budget == 0:
                break
            chunk = min(self._rem(r), self.budget)
            if self._preempt_until_fits(r, chunk):
                self._allocate(r, chunk)

    def _admit_waiting(self) -> None:
        h = self.h
        while self.waiting and len(self.running) < self.max_num_seqs and self.budget > 0:
            r = self.waiting[0]
            view = self._view(r)
            if not bool(self.policy.fits_empty_pool(view)):
                self.waiting.pop(0)
                self._abort(r, "exceeds_pool", preempted=False)
                continue
            if self.running and not bool(self.policy.can_admit(view, free_pages=self.num_pages - self.committed,
                                                                running=None)):
                break
            self.waiting.pop(0)
            h["ST"][r] = RUNNING
            self.counters["admit_count"] += 1
            h["SEQ"][r] = self.counters["admit_count"]
            if h["AI"][r] < 0:
                h["AI"][r], h["AS"][r] = self.k, self.now_s
            self._set_reserved(r, ceil_div(int(self.policy.reservation_tokens(view)), self.bs))
            self.running.append(r)
            self._allocate(r, min(self._rem(r), self.budget))

    def _preempt_until_fits(self, r: int, chunk: int) -> bool:
        h = self.h
        need = ceil_div(int(h["C"][r]) + chunk, self.bs)
        beyond = need - max(int(h["R"][r]), int(h["U"][r]))
        if beyond <= 0:
            return True
        if not self.policy.on_demand:
            self._preempt(r)
            return False
        while beyond > self.num_pages - self.committed:
            victim = self.running[-1]
            if victim == r and len(self.running) == 1:
                self.running.remove(r)
                self._abort(r, "kv_exceeds_pool", preempted=False)
                return False
            self._preempt(victim)
            if victim == r:
                return False
        self._set_reserved(r, need)
        return True

    def _preempt(self, v: int) -> None:
        h = self.h
        self.budget += int(self.chunk[v])
        self.chunk[v] = 0
        self.running.remove(v)
        self.num_preempted += 1
        if self.reject:
            self._abort(v, "preempted_rejected", preempted=True)
            return
        self._release(v)
        h["ST"][v] = PREEMPTED
        h["C"][v] = 0
        h["NP"][v] += 1
        self.counters["preempt_count"] += 1
        h["QK"][v] = -self.counters["preempt_count"]  # the front of the queue: lowest key first
        self.waiting.insert(0, v)

    def _abort(self, r: int, reason: str, *, preempted: bool) -> None:
        h = self.h
        self._release(r)
        h["ST"][r] = ABORTED
        h["AB"][r] = ABORT_REASONS.index(reason)
        h["NP"][r] += int(preempted)
        h["XI"][r], h["XS"][r] = self.k, self.now_s
        self.num_aborted += 1

    # ------------------------------------------------------------------ pages and tokens
    def _allocate(self, r: int, chunk: int) -> None:
        h = self.h
        need = ceil_div(int(h["C"][r]) + chunk, self.bs)
        if need > h["U"][r]:
            self._set_used(r, need)
        self.chunk[r] = chunk
        self.budget -= chunk

    def _set_reserved(self, r: int, pages: int) -> None:
        h = self.h
        self.committed += max(pages, int(h["U"][r])) - max(int(h["R"][r]), int(h["U"][r]))
        h["R"][r] = pages

    def _set_used(self, r: int, pages: int) -> None:
        h = self.h
        self.committed += max(int(h["R"][r]), pages) - max(int(h["R"][r]), int(h["U"][r]))
        h["U"][r] = pages

    def _release(self, r: int) -> None:
        h = self.h
        self.committed -= max(int(h["R"][r]), int(h["U"][r]))
        h["R"][r] = h["U"][r] = 0

    def _rem(self, r: int) -> int:
        h = self.h
        return int(h["P"][r] + h["G"][r] - h["C"][r])

    def _is_decoding(self, r: int) -> bool:
        return bool(self.h["G"][r] > 0) and self._rem(r) == 1

    def _view(self, r: int) -> Requests:
        h = self.h
        return Requests.one(int(h["IDX"][r]), int(h["P"][r]), int(h["O"][r]), int(h["G"][r]))

    def _next_new(self) -> int:
        """The first request never admitted nor aborted (new ones leave the queue in arrival order)."""
        st, nxt = self.h["ST"], self.counters["nxt"]
        while nxt < st.shape[0] and st[nxt] != 0:
            nxt += 1
        return nxt


def host_rows(arrays: dict[str, Any], rows: np.ndarray, to_numpy: Any) -> dict[str, np.ndarray]:
    """Host copies of rows ``rows`` of each ``(S, n)`` array in ``arrays`` (one transfer per array)."""
    return {name: np.array(to_numpy(a[rows])) for name, a in arrays.items()}
