"""Data-parallel ranks as vLLM V1 runs them, over either engine: in lockstep for a mixture of
experts, as independent engines for a dense model; requests routed to the least-loaded rank.

NOTE (the group's rules; each rank follows :mod:`kvlab.sim.reference`'s, with its clock set here)
-------------------------------------------------------------------------------------------------
Read in vLLM 0.19.0 (wheel, commit 2a69949). With ``--data-parallel-size`` dp, dp engine cores
each keep their own waiting queue, KV pool, ``max_num_seqs`` and token budget. Only a mixture of
experts gets the coordinated ``DPEngineCoreProc``, whose ranks' forwards meet in the experts'
collectives every layer; a dense model's ranks are independent engines (``vllm/v1/engine/core.py``
L1071-1080).

* Routing (``DPLBAsyncMPClient.get_core_engine_for_request``, ``vllm/v1/engine/core_client.py``
  L1337-1365, for both kinds): each request goes to the rank with the lowest ``4 x waiting +
  running`` (the lowest rank on a tie), and adds one to that rank's waiting count at once. The
  counts are the ranks' as of their last scheduled iteration (waiting counts requests routed there
  and not yet queued); vLLM's client reads them as the coordinator republishes them, about every
  100 ms (``vllm/v1/engine/coordinator.py`` L155, L266).
* Independent ranks (:func:`run_independent`): each request is routed at its arrival; each rank runs
  on its own clock, as one engine would, each iteration for its own duration.
* Lockstep (:func:`run_group`): every iteration starts at one instant ``t`` on all ranks, and the
  requests that have arrived by ``t`` are routed then, in arrival order. A rank that schedules work
  states its tokens ``T_r``, attention pairs, KV tokens, sequences and pages swapped. When every
  ``T_r`` is at most ``cudagraph_max_tokens`` every rank runs the largest ``T``
  (``vllm/v1/worker/dp_utils.py`` L78-90, L153: the ranks' CUDA-graph mode is synchronised to the
  lowest, and only a graph-captured step is padded; a batch above the capture size runs eagerly,
  ``vllm/v1/cudagraph_dispatcher.py`` L271-280), else each its own. The iteration lasts the longest
  of the ranks' ``pages swapped x page_copy_s + iteration_s(T, pairs, kv, seqs)`` (a rank computing
  no token adds only its swap time). A rank with nothing to schedule runs a dummy batch of one token
  (``core.py`` L1715-1723, ``vllm/v1/worker/gpu_worker.py`` L889-891): never the longest, it writes
  no iteration row. When no rank has work, ``t`` jumps to the next arrival.

In lockstep the cost model prices a rank's experts at ``dp x T`` tokens
(:mod:`kvlab.costmodel.measured`): exactly the gathered tokens when the ranks are padded; above the
capture size the longest rank's experts are priced at ``dp x T_max``, more than the ``sum T_r``
gathered (little, while the experts read their weights once: per-expert GEMMs of tens of tokens
are bandwidth-bound). Not modelled: the ranks' extra dummy steps before an idle group pauses (every
32 steps it all-reduces whether any rank has work, ``core.py`` L1752-1758), and CUDA-graph bucket
rounding of an unpadded batch.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import numpy as np
import pandas as pd

from ..costmodel import CostModel
from ..policies import Policy
from ..prefix_cache import BlockIds
from .config import PoolConfig, SchedulerConfig, SwapConfig
from .fast import layout as lp, request_frame
from .fast.compiled import CompiledRun
from .metrics import iteration_table, request_table
from .reference import ReferenceEngine
from .request import Request

#: A rank's stops (:meth:`Rank.advance`).
ASKS, IDLE = "asks", "idle"


class Rank(Protocol):
    """One data-parallel rank as the group drives it (either engine)."""

    now_s: float  # the rank's clock (s); the group sets it on an idle rank

    def advance(self) -> str:
        """Run to the next stop: ``ASKS`` (an iteration is scheduled: :meth:`work`) or ``IDLE``."""

    def work(self) -> tuple[int, int, int, int, int]:
        """The scheduled iteration's (tokens, attention pairs, KV tokens, sequences, pages swapped)."""

    def run_for(self, duration_s: float) -> None:
        """The scheduled iteration runs for ``duration_s`` (when next advanced)."""

    def counts(self) -> tuple[int, int]:
        """(waiting, running) requests."""

    def assign(self, r: int) -> None:
        """Request row ``r`` is routed here (in arrival order)."""


def route(counts: Sequence[tuple[int, int]]) -> int:
    """The rank a request goes to: the lowest ``4 x waiting + running``, the lowest rank on a tie."""
    scores = [4 * waiting + running for waiting, running in counts]
    return int(np.argmin(scores))


def group_duration_s(work: Sequence[tuple[int, int, int, int, int]], cost_model: CostModel, page_copy_s: float,
                     cudagraph_max_tokens: int) -> float:
    """An iteration's duration (s) from the working ranks' :meth:`Rank.work` (the module note): the group's
    in lockstep, or one rank's own (one entry; with ``cudagraph_max_tokens`` 0 nothing is padded)."""
    most = max(w[0] for w in work)
    padded = most <= cudagraph_max_tokens
    return max(swap * page_copy_s + (float(cost_model.iteration_s(most if padded else tokens, pairs, kv, seqs))
                                     if tokens else 0.0)
               for tokens, pairs, kv, seqs, swap in work)


class _Router:
    """Routes requests, in arrival order, to the least-loaded rank (:func:`route`)."""

    def __init__(self, ranks: Sequence[Rank], arrival_s: np.ndarray) -> None:
        self.ranks, self.arrival_s = ranks, np.asarray(arrival_s, dtype=np.float64)
        self.order = np.argsort(self.arrival_s, kind="stable")
        self.rank_of = np.full(self.arrival_s.shape[0], -1, dtype=np.int64)
        self.routed = 0

    @property
    def done(self) -> bool:
        return self.routed == self.order.shape[0]

    @property
    def next_arrival_s(self) -> float:
        return float(self.arrival_s[self.order[self.routed]]) if not self.done else np.inf

    def route_until(self, t: float) -> set[int]:
        """Route every request that has arrived by ``t``; the ranks that got one."""
        counts = [list(rank.counts()) for rank in self.ranks]
        got = set()
        while not self.done and self.next_arrival_s <= t:
            r, i = route(counts), int(self.order[self.routed])
            self.ranks[r].assign(i)
            self.rank_of[i] = r
            counts[r][0] += 1
            got.add(r)
            self.routed += 1
        return got


def run_group(ranks: Sequence[Rank], arrival_s: np.ndarray, *, cost_model: CostModel, page_copy_s: float,
              cudagraph_max_tokens: int) -> np.ndarray:
    """Serve every request on ``ranks`` in lockstep (the module note); each request's rank (row order)."""
    router = _Router(ranks, arrival_s)
    stops = [IDLE] * len(ranks)
    t = router.next_arrival_s
    while not (router.done and all(stop == IDLE for stop in stops)):
        router.route_until(t)
        for i, rank in enumerate(ranks):
            if stops[i] == IDLE:
                rank.now_s = t
                stops[i] = rank.advance()
        busy = [i for i, stop in enumerate(stops) if stop == ASKS]
        if not busy:
            if router.done:
                break
            t = router.next_arrival_s
            continue
        d = group_duration_s([ranks[i].work() for i in busy], cost_model, page_copy_s, cudagraph_max_tokens)
        t_next = t + d
        router.route_until(t_next)  # before the working ranks schedule their next iteration at t_next
        for i in busy:
            ranks[i].run_for(d)
            stops[i] = ranks[i].advance()
        t = t_next
    return router.rank_of


def run_independent(ranks: Sequence[Rank], arrival_s: np.ndarray, *, cost_model: CostModel,
                    page_copy_s: float) -> np.ndarray:
    """Serve every request on ``ranks`` as independent engines (the module note), in time order: an
    arrival is routed before any rank's iteration that ends at or after it; each request's rank."""
    router = _Router(ranks, arrival_s)
    ends, durations = [np.inf] * len(ranks), [0.0] * len(ranks)

    def start(i: int) -> None:  # the rank's next stop: an iteration priced on its own, or idle
        if ranks[i].advance() == ASKS:
            durations[i] = group_duration_s([ranks[i].work()], cost_model, page_copy_s, cudagraph_max_tokens=0)
            ends[i] = ranks[i].now_s + durations[i]
        else:
            ends[i] = np.inf

    while not router.done or min(ends) < np.inf:
        t = router.next_arrival_s
        if t <= min(ends):
            for i in sorted(router.route_until(t)):
                if ends[i] == np.inf:  # idle: it starts at the arrival
                    ranks[i].now_s = t
                    start(i)
            continue
        i = int(np.argmin(ends))
        ranks[i].run_for(durations[i])
        start(i)
    return router.rank_of


class _Wrapping:
    """A rank's clock is the clock of the engine it wraps (``inner``)."""

    inner: ReferenceEngine | CompiledRun

    @property
    def now_s(self) -> float:
        return self.inner.now_s

    @now_s.setter
    def now_s(self, t: float) -> None:
        self.inner.now_s = t


class ReferenceRank(_Wrapping):
    """A :class:`~kvlab.sim.reference.ReferenceEngine` (``as_rank=True``) as a :class:`Rank`."""

    def __init__(self, engine: ReferenceEngine, requests: list[Request]) -> None:
        self.inner, self.requests = engine, requests
        self._steps, self._step = engine.steps(), None

    def advance(self) -> str:
        self._step = next(self._steps)
        return IDLE if self._step is None else ASKS

    def work(self) -> tuple[int, int, int, int, int]:
        return (*self._step.work(), self._step.swap_pages)

    def run_for(self, duration_s: float) -> None:
        self._step.duration_s = duration_s

    def counts(self) -> tuple[int, int]:
        e = self.inner
        return len(e.waiting) + len(e.pending), len(e.running)

    def assign(self, r: int) -> None:
        self.inner.assign(self.requests[r])


class CompiledRank(_Wrapping):
    """A :class:`~kvlab.sim.fast.compiled.CompiledRun` (``as_rank=True``) as a :class:`Rank`."""

    def __init__(self, run: CompiledRun, arrival_s: np.ndarray) -> None:
        self.inner, self.arrival_s = run, arrival_s

    def advance(self) -> str:
        return IDLE if self.inner.advance() == lp.RANK_IDLE else ASKS

    def work(self) -> tuple[int, int, int, int, int]:
        return self.inner.work()

    def run_for(self, duration_s: float) -> None:
        self.inner.run_for(duration_s)

    def counts(self) -> tuple[int, int]:
        return self.inner.counts()

    def assign(self, r: int) -> None:
        self.inner.assign(r, float(self.arrival_s[r]))


def _with_rank(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' iteration tables as one, with a ``rank`` column, in start order (ties by rank)."""
    frames = [t.assign(rank=r) for r, t in enumerate(tables) if len(t)] or [tables[0].assign(rank=0)]
    return pd.concat(frames, ignore_index=True).sort_values(["start_s", "rank"], kind="stable",
                                                            ignore_index=True)


def serve(*, prompt: np.ndarray, output: np.ndarray, arrival_s: np.ndarray, ids: np.ndarray, max_new_tokens: int,
          policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig, cost_model: CostModel,
          blocks: BlockIds | None, engine: str, data_parallel: int, lockstep: bool, cudagraph_max_tokens: int,
          xp: ModuleType = np, every_column: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The request and iteration tables of ``data_parallel`` ranks on ``engine`` (``"fast"`` or
    ``"reference"``), in ``lockstep`` or independent; each rank has its own copy of the bound
    ``policy``. The request table gains a ``rank`` column, the iteration table one row per rank and
    iteration."""
    policies = [copy.deepcopy(policy) for _ in range(data_parallel)]
    if engine == "reference":
        requests = [Request(index=i, prompt_tokens=int(prompt[i]), output_tokens=int(output[i]),
                            arrival_s=float(arrival_s[i]), max_new_tokens=max_new_tokens) for i in range(len(prompt))]
        engines = [ReferenceEngine(requests, policy=p, pool=pool, scheduler=scheduler, swap=swap,
                                   cost_model=cost_model, blocks=blocks, as_rank=True) for p in policies]
        ranks: list[Rank] = [ReferenceRank(e, requests) for e in engines]
    else:
        runs = [CompiledRun(prompt_tokens=prompt, output_tokens=output, arrival_s=arrival_s,
                            max_new_tokens=max_new_tokens, policy=p, pool=pool, scheduler=scheduler, swap=swap,
                            cost_model=cost_model, xp=xp, blocks=blocks, every_column=every_column, as_rank=True)
                for p in policies]
        ranks = [CompiledRank(r, arrival_s) for r in runs]
    if lockstep:
        rank_of = run_group(ranks, arrival_s, cost_model=cost_model, page_copy_s=swap.page_copy_s,
                            cudagraph_max_tokens=cudagraph_max_tokens)
    else:
        rank_of = run_independent(ranks, arrival_s, cost_model=cost_model, page_copy_s=swap.page_copy_s)
    if engine == "reference":
        req_table = request_table(requests, ids, prefix_caching=blocks is not None)
        it_table = _with_rank([iteration_table(e.rows, prefix_caching=blocks is not None) for e in engines])
    else:
        tables = [r.tables() for r in runs]
        req_table = request_frame(pd.concat([t[0].iloc[np.flatnonzero(rank_of == r)] for r, t in enumerate(tables)])
                                  .sort_index().reset_index(drop=True), ids)
        it_table = _with_rank([t[1] for t in tables])
    req_table["rank"] = rank_of
    return req_table, it_table
