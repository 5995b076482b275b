"""The fast engine: the reference engine's rules (:mod:`kvlab.sim.reference`) on arrays.

NOTE (how it stays equal to the reference, integer for integer)
---------------------------------------------------------------
The rules are the reference engine's top-of-file note; nothing here adds or changes one. What
changes is how they are executed:

* Request state is a struct of arrays on the array module ``xp`` (NumPy, or CuPy on a GPU):
  computed/generated tokens, reserved/used pages, status, the outcome columns. The pool is
  counted, not paged: the reference's page ids never reach a result, only ``used`` and
  ``max(reserved, used)`` per request and their totals do.
* An iteration's phases are vectorised for the common case and fall back to a per-request
  port of the reference phase when the cheap check says the case is not common:
  ``_schedule_running`` hands every running request ``min(remaining, budget left)`` by a
  cumulative sum and grants its pages in one step when their sum fits the unpromised pages (no
  preemption), else it runs the per-request loop with victims; ``_admit_waiting`` admits the
  longest prefix of the queue that passes the loop's conditions (cumulative pages and tokens),
  else the per-request loop (aborts); swap-ins always run per request.
* A decode-only stretch is run as one step: when every running request is decoding, the batch
  fits the token budget, and the queue cannot admit anything (empty, or its head is blocked by
  ``max_num_seqs``, the budget, or a ``can_admit`` that stays false while pages are only taken),
  all running requests advance ``L`` iterations at once. ``L`` stops at the first finish, the
  first iteration whose page growth would preempt (on-demand policies: the cumulative new
  pages exceed the unpromised ones; reserving policies: the first page beyond a reservation),
  and the first arrival that could change the queue's head. The stretch's iteration latencies
  are one vector; its start times are a sequential cumulative sum on the host (bit-equal to
  the reference's ``now += duration``, which a parallel GPU scan would not be).
* Scheduling decisions read a few scalars per iteration (sums and flags) back to the host; no
  loop runs over requests except the fallbacks.
"""
from __future__ import annotations

import heapq
from collections import deque
from fractions import Fraction
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from ..backend import to_numpy
from ..costmodel import CostModel
from ..policies import Policy
from ..policies.orca import OrcaMaxPolicy, OrcaOraclePolicy, OrcaPow2Policy
from ..policies.predicted import PredictedPolicy
from ..policies.sglang import SGLangPolicy
from ..policies.tensorrt_llm import ReserveMaxPolicy
from ..policies.tgi import TGIPolicy
from ..policies.vllm import VLLMPolicy
from .config import PoolConfig, PreemptionMode, SchedulerConfig, SchedulerKind, SwapConfig
from .reference import ITERATION_COLUMNS
from .request import FINISH_REASON, RequestStatus

WAITING, RUNNING, PREEMPTED, SWAPPED = (int(s) for s in (RequestStatus.WAITING, RequestStatus.RUNNING,
                                                         RequestStatus.PREEMPTED, RequestStatus.SWAPPED))
STOPPED, CAPPED, ABORTED = (int(s) for s in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
                                             RequestStatus.FINISHED_ABORTED))
_LAZY_RETRY_ITERATIONS = 16
ABORT_REASONS = ("", "exceeds_pool", "exceeds_token_budget", "kv_exceeds_pool", "preempted_rejected")
# Policies whose ``can_admit`` stays false while the unpromised pages only shrink and the running set
# only decodes: a blocked queue head stays blocked through a decode-only stretch.
_MONOTONE = (ReserveMaxPolicy, OrcaOraclePolicy, OrcaPow2Policy, OrcaMaxPolicy, TGIPolicy, VLLMPolicy,
             PredictedPolicy)


def _pages(tokens: Any, block_size: int) -> Any:
    """``ceil(tokens / block_size)`` on any array module or Python int (pages)."""
    return -(-tokens // block_size)


class _View:
    """The :class:`kvlab.policies.RequestView` of one request, for policy methods called per request."""

    __slots__ = ("index", "prompt_tokens", "output_tokens", "generated_tokens")

    def __init__(self, index: int, prompt_tokens: int, output_tokens: int, generated_tokens: int) -> None:
        self.index, self.prompt_tokens = index, prompt_tokens
        self.output_tokens, self.generated_tokens = output_tokens, generated_tokens


class _Rules:
    """A policy's answers on arrays: the built-in policies' rules written as array expressions.

    A policy class kvlab does not know is asked request by request through :class:`_View`s,
    which gives the same answers, slower.
    """

    def __init__(self, policy: Policy, eng: "FastEngine") -> None:
        self.policy, self.eng = policy, eng
        self.kind = type(policy) if type(policy) in _MONOTONE + (SGLangPolicy,) else None
        self.monotone = self.kind in _MONOTONE
        self.on_demand = bool(policy.on_demand)
        self.bs, self.num_pages, self.mnt = policy.block_size, policy.num_pages, policy.max_new_tokens
        self.custom_victim = type(policy).choose_victim is not Policy.choose_victim
        self.ordered = bool(policy.orders_queue)
        if self.kind is PredictedPolicy:
            self.predicted = eng.xp.asarray(policy.predicted_tokens)

    def view(self, r: int) -> _View:
        e = self.eng
        return _View(r, int(e.prompt[r]), int(e.output[r]), int(e.gen[r]))

    # ----------------------------------------------------------------- reservation (tokens)
    def reservation_tokens(self, ids: Any) -> Any:
        """Tokens each of ``ids`` reserves on (re)admission (array of int)."""
        e, xp, k = self.eng, self.eng.xp, self.kind
        p, g = e.prompt[ids], e.gen[ids]
        if k in (VLLMPolicy, SGLangPolicy):
            return p + g
        if k is ReserveMaxPolicy:
            return p + self.mnt
        if k is OrcaOraclePolicy:
            return p + xp.minimum(e.output[ids], self.mnt)
        if k is OrcaPow2Policy:
            final = p + xp.minimum(e.output[ids], self.mnt)
            # 1 << (final - 1).bit_length(): frexp's exponent is the bit length (exact below 2**53)
            bits = xp.where(final > 1, xp.frexp((final - 1).astype(xp.float64))[1], 0).astype(xp.int64)
            return xp.minimum(xp.left_shift(xp.int64(1), bits), p + self.mnt)
        if k is OrcaMaxPolicy:
            return xp.maximum(self.policy.max_model_len, p + self.mnt)
        if k is TGIPolicy:
            return p + g + xp.minimum(self.mnt - g, self.policy.cap_tokens)
        if k is PredictedPolicy:
            return p + xp.maximum(self.predicted[ids], g)
        ids_h = to_numpy(ids).tolist()
        return xp.asarray([self.policy.reservation_tokens(self.view(r)) for r in ids_h], dtype=xp.int64)

    def can_admit_vec(self, res_pages: Any, free_pages: Any) -> Any:
        """``can_admit`` for policies whose answer depends only on the request's pages (bool array)."""
        if self.kind is VLLMPolicy:
            return free_pages - res_pages >= int(self.policy.watermark_frac * self.num_pages)
        return res_pages <= free_pages

    def fits_empty_pool(self, ids: Any, res_pages: Any) -> Any:
        """``fits_empty_pool`` of each of ``ids`` (bool array)."""
        if self.kind is SGLangPolicy:
            return res_pages <= self.num_pages
        if self.kind is not None:
            return self.can_admit_vec(res_pages, self.num_pages)
        ids_h = to_numpy(ids).tolist()
        return self.eng.xp.asarray([self.policy.fits_empty_pool(self.view(r)) for r in ids_h], dtype=bool)

    def can_admit_one(self, r: int, free_pages: int) -> bool:
        """``policy.can_admit(r, free_pages, running)`` against the engine's running set."""
        e = self.eng
        if self.kind is SGLangPolicy:
            pol, xp = self.policy, e.xp
            def remaining(g: Any) -> Any:
                return xp.minimum(self.mnt - g, pol.clip_tokens)
            future = int(remaining(e.gen[r])) + int(remaining(e.gen[e.run]).sum())
            charge = -(-future * pol.ratio.numerator // pol.ratio.denominator)
            return int(e.prompt[r] + e.gen[r]) + charge <= free_pages * self.bs
        if self.kind is not None:
            res = int(_pages(self.reservation_tokens(e.xp.asarray([r]))[0], self.bs))
            return bool(self.can_admit_vec(res, free_pages))
        running = [self.view(x) for x in to_numpy(e.run).tolist()]
        return bool(self.policy.can_admit(self.view(r), free_pages=free_pages, running=running))

    def choose_victim(self, running: list[int]) -> int:
        """``policy.choose_victim`` over the running ids (admission order)."""
        if not self.custom_victim:
            return running[-1]
        views = [self.view(x) for x in running]
        chosen = self.policy.choose_victim(views)
        return next(r for r, view in zip(running, views) if view is chosen)

    def end_schedule(self, num_preempted: int, num_iterations: int = 1) -> None:
        """``policy.end_schedule`` after each of ``num_iterations`` iterations (several: no preemption)."""
        e, pol = self.eng, self.policy
        if self.kind is SGLangPolicy:
            n = int(e.run.shape[0])
            if num_preempted and n:
                decoded = int(e.gen[e.run].sum())
                pol.ratio = min(Fraction(1), Fraction(decoded + pol.retract_steps * n, pol.max_new_tokens * n))
            else:
                pol.ratio = max(pol.min_ratio, pol.ratio - num_iterations * pol.decay_per_step)
        elif self.kind is None:
            running = [self.view(x) for x in to_numpy(e.run).tolist()]
            for _ in range(num_iterations):
                pol.end_schedule(num_preempted=num_preempted, running=running)

    def queue_rank(self, r: int) -> int:
        if self.kind is PredictedPolicy:
            return int(self.policy.ranks[r])
        return int(self.policy.queue_rank(self.view(r)))


class _Waiting:
    """The waiting queue: preempted requests in front of the arrivals (FCFS), or a heap by rank.

    Arrivals are a range ``[lo, hi)`` of the arrival order, so the FCFS queue's tail is a slice,
    not a copy.
    """

    def __init__(self, order_h: np.ndarray, order: Any, rules: _Rules) -> None:
        self.order_h, self.order, self.rules = order_h, order, rules
        self.front: deque[int] = deque()
        self.lo = self.hi = 0
        self.heap: list[tuple[int, int]] | None = [] if rules.ordered else None

    def __len__(self) -> int:
        return len(self.heap) if self.heap is not None else len(self.front) + self.hi - self.lo

    def arrive(self, hi: int) -> None:
        """Requests ``order[self.hi:hi]`` join the back (or the heap)."""
        if self.heap is not None:
            for r in self.order_h[self.hi:hi].tolist():
                heapq.heappush(self.heap, (self.rules.queue_rank(r), r))
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
            heapq.heappush(self.heap, (self.rules.queue_rank(r), r))
        else:
            self.front.appendleft(r)


class _Step:
    """What one iteration does: the scheduled requests and chunks, preemptions, swap traffic, aborts."""

    def __init__(self, k: int, start_s: float, budget_tokens: int) -> None:
        self.k, self.start_s, self.budget_tokens = k, start_s, budget_tokens
        self.ids: list[Any] = []  # arrays of request ids, scheduled in this order
        self.chunks: list[Any] = []  # their chunks (tokens)
        self.num_scheduled = 0
        self.num_preempted = self.swap_pages = self.num_aborted = 0

    def add(self, ids: Any, chunks: Any, num: int, tokens: int) -> None:
        self.ids.append(ids)
        self.chunks.append(chunks)
        self.num_scheduled += num
        self.budget_tokens -= tokens


class FastEngine:
    """Runs one simulation on arrays; :meth:`run` returns the request and iteration tables.

    Parameters are the reference engine's, with the workload as arrays (tokens, seconds) and
    the array module ``xp`` for the request state.
    """

    def __init__(self, *, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray,
                 max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig,
                 swap: SwapConfig, cost_model: CostModel, xp: ModuleType) -> None:
        n = len(prompt_tokens)
        self.xp, self.n = xp, n
        self.cfg, self.swap_cfg, self.cost = scheduler, swap, cost_model
        self.bs, self.num_pages = pool.block_size, pool.num_pages
        self.prefill_first = scheduler.kind == SchedulerKind.PREFILL_FIRST
        self.arrival_h = np.asarray(arrival_s, dtype=np.float64)
        order_h = np.argsort(self.arrival_h, kind="stable")  # arrival order, ties by row
        self.sorted_arrival_h = self.arrival_h[order_h]
        i64 = xp.int64
        self.prompt = xp.asarray(prompt_tokens, dtype=i64)
        self.output = xp.asarray(output_tokens, dtype=i64)
        self.target = xp.minimum(self.output, max_new_tokens)
        self.rules = _Rules(policy, self)
        self.waiting = _Waiting(order_h, xp.asarray(order_h, dtype=i64), self.rules)
        self.swapped: deque[int] = deque()
        self.run_ids = xp.zeros(0, dtype=i64)  # running requests, admission order
        self.comp, self.gen, self.res, self.used, self.cpu = (xp.zeros(n, dtype=i64) for _ in range(5))
        self.status = xp.full(n, WAITING, dtype=xp.int8)
        self.admitted_iter, self.first_token_iter, self.finish_iter = (xp.full(n, -1, dtype=i64) for _ in range(3))
        self.num_preemptions, self.num_swaps, self.max_res, self.max_used, self.abort_code = (
            xp.zeros(n, dtype=i64) for _ in range(5))
        self.admitted_s, self.first_token_s, self.last_token_s, self.max_tbt_s, self.finish_s = (
            xp.full(n, np.nan) for _ in range(5))
        self.committed = self.num_used = self.cpu_used = 0  # pages
        self.arrived = 0
        self.now_s = 0.0
        self.k = 0
        self.admit_count = 0
        self.idle_before = False
        self._rows: list[tuple] = []
        self._blocks: list[list[np.ndarray]] = []

    @property
    def run(self) -> Any:
        return self.run_ids

    # ------------------------------------------------------------------ main loop
    def run_all(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Serve every request; return (per-request columns, per-iteration table)."""
        lazy = _LazyRun(self) if (not self.prefill_first and self.rules.kind in _LAZY_POLICIES) else None
        wait_iterations = 0  # array iterations before the next try of a lazy run
        while self.arrived < self.n or len(self.waiting) or self.run_ids.shape[0] or self.swapped:
            hi = int(np.searchsorted(self.sorted_arrival_h, self.now_s, side="right"))
            if hi > self.arrived:
                self.waiting.arrive(hi)
                self.arrived = hi
            if not (len(self.waiting) or self.run_ids.shape[0] or self.swapped):
                self.now_s = float(self.sorted_arrival_h[self.arrived])
                continue
            if lazy is not None and wait_iterations == 0 and _LazyRun.applies(self):
                if lazy.run():
                    continue
                wait_iterations = _LAZY_RETRY_ITERATIONS
            wait_iterations = max(wait_iterations - 1, 0)
            if not self._stretch():
                self._step()
        return self._request_columns(), self._iteration_table()

    def _step(self) -> None:
        st = _Step(self.k, self.now_s, self.cfg.max_num_batched_tokens)
        if self.prefill_first and not self.swapped:
            self._admit_waiting(st, whole=True)
        if not st.num_scheduled:
            self._schedule_running(st)
            if not st.num_preempted:
                self._resume_swapped(st)
                if not self.swapped and not self.prefill_first:
                    self._admit_waiting(st, whole=False)
        self.rules.end_schedule(st.num_preempted)
        self._execute(st)

    # ------------------------------------------------------------------ pool counters (pages)
    @property
    def uncommitted(self) -> int:
        return self.num_pages - self.committed

    def _reserve(self, r: int, pages: int) -> None:
        used, res = int(self.used[r]), int(self.res[r])
        self.committed += max(pages, used) - max(res, used)
        self.res[r] = pages

    def _grow(self, r: int, pages: int) -> None:
        """Request ``r`` takes ``pages`` more pages."""
        used, res = int(self.used[r]), int(self.res[r])
        self.committed += max(res, used + pages) - max(res, used)
        self.num_used += pages
        self.used[r] = used + pages

    def _release(self, r: int) -> None:
        used, res = int(self.used[r]), int(self.res[r])
        self.committed -= max(res, used)
        self.num_used -= used
        self.used[r] = 0
        self.res[r] = 0

    # ------------------------------------------------------------------ per-request transitions
    def _rem(self, r: int) -> int:
        return int(self.prompt[r] + self.gen[r] - self.comp[r])

    def _start_running(self, r: int, st: _Step) -> None:
        self.status[r] = RUNNING
        self.admit_count += 1
        if int(self.admitted_iter[r]) < 0:
            self.admitted_iter[r], self.admitted_s[r] = st.k, st.start_s

    def _reserve_on_admit(self, r: int) -> None:
        pages = int(_pages(self.rules.reservation_tokens(self.xp.asarray([r]))[0], self.bs))
        self._reserve(r, pages)
        self.max_res[r] = max(int(self.max_res[r]), pages)

    def _allocate(self, r: int, chunk: int, st: _Step) -> None:
        extra = int(_pages(int(self.comp[r]) + chunk, self.bs)) - int(self.used[r])
        if extra > 0:
            self._grow(r, extra)
        self.max_used[r] = max(int(self.max_used[r]), int(self.used[r]))
        self.max_res[r] = max(int(self.max_res[r]), int(self.res[r]))
        st.add(self.xp.asarray([r], dtype=self.xp.int64), self.xp.asarray([chunk], dtype=self.xp.int64), 1, chunk)

    def _abort(self, r: int, reason: str, st: _Step, *, preempted: bool) -> None:
        self._release(r)
        self.status[r] = ABORTED
        self.abort_code[r] = ABORT_REASONS.index(reason)
        self.num_preemptions[r] += int(preempted)
        self.finish_iter[r], self.finish_s[r] = st.k, st.start_s
        st.num_aborted += 1

    def _append_running(self, ids: Any) -> None:
        self.run_ids = self.xp.concatenate([self.run_ids, self.xp.asarray(ids, dtype=self.xp.int64).reshape(-1)])

    # ------------------------------------------------------------------ phase: running requests
    def _schedule_running(self, st: _Step) -> None:
        xp, run = self.xp, self.run_ids
        if not run.shape[0]:
            return
        c, g = self.comp[run], self.gen[run]
        rem = self.prompt[run] + g - c
        dec = (g > 0) & (rem == 1)
        order = xp.concatenate([xp.flatnonzero(dec), xp.flatnonzero(~dec)])
        ids, rem, c = run[order], rem[order], c[order]
        before = xp.cumsum(rem) - rem
        chunk = xp.minimum(rem, xp.maximum(st.budget_tokens - before, 0))
        sched = chunk > 0
        need = _pages(c + chunk, self.bs)
        res, used = self.res[ids], self.used[ids]
        beyond = xp.where(sched, need - xp.maximum(res, used), 0)
        grow = beyond > 0
        flags = to_numpy(xp.stack([xp.maximum(beyond, 0).sum(), grow.any(), sched.sum(), chunk.sum()]))
        new_pages, any_grow, num_sched, tokens = (int(x) for x in flags)
        if (new_pages > self.uncommitted) if self.rules.on_demand else any_grow:
            self._schedule_running_loop(st)
            return
        if any_grow:  # on demand: reserve what is needed beyond the reservation
            res = xp.where(grow, need, res)
            self.res[ids] = res
            self.committed += new_pages
        new_used = xp.where(sched, xp.maximum(used, need), used)
        self.num_used += int((new_used - used).sum())
        self.used[ids] = new_used
        self.max_used[ids] = xp.maximum(self.max_used[ids], new_used)
        self.max_res[ids] = xp.maximum(self.max_res[ids], xp.where(sched, res, 0))
        if num_sched:
            st.add(ids[sched], chunk[sched], num_sched, tokens)

    def _schedule_running_loop(self, st: _Step) -> None:
        """The reference's per-request loop, with preemption (victims, self-preemption, aborts)."""
        running = to_numpy(self.run_ids).tolist()
        st.running = running
        decodes = [r for r in running if int(self.gen[r]) > 0 and self._rem(r) == 1]
        prefills = [r for r in running if not (int(self.gen[r]) > 0 and self._rem(r) == 1)]
        scheduled: dict[int, int] = {}
        st.loop_chunks = scheduled
        for r in decodes + prefills:
            if int(self.status[r]) != RUNNING or r in scheduled:
                continue
            if st.budget_tokens == 0:
                break
            chunk = min(self._rem(r), st.budget_tokens)
            if self._preempt_until_fits(r, chunk, st, running):
                extra = int(_pages(int(self.comp[r]) + chunk, self.bs)) - int(self.used[r])
                if extra > 0:
                    self._grow(r, extra)
                self.max_used[r] = max(int(self.max_used[r]), int(self.used[r]))
                self.max_res[r] = max(int(self.max_res[r]), int(self.res[r]))
                scheduled[r] = chunk
                st.budget_tokens -= chunk
        self.run_ids = self.xp.asarray(running, dtype=self.xp.int64)
        if scheduled:
            xp = self.xp
            st.ids.append(xp.asarray(list(scheduled), dtype=xp.int64))
            st.chunks.append(xp.asarray(list(scheduled.values()), dtype=xp.int64))
            st.num_scheduled += len(scheduled)

    def _preempt_until_fits(self, r: int, chunk: int, st: _Step, running: list[int]) -> bool:
        need = int(_pages(int(self.comp[r]) + chunk, self.bs))
        beyond = need - max(int(self.res[r]), int(self.used[r]))
        if beyond <= 0:
            return True
        if not self.rules.on_demand:
            self._preempt(r, st, running)
            return False
        while beyond > self.uncommitted:
            self.run_ids = self.xp.asarray(running, dtype=self.xp.int64)  # the policy may read it
            victim = self.rules.choose_victim(running)
            if victim == r and len(running) == 1:
                running.remove(r)
                self._abort(r, "kv_exceeds_pool", st, preempted=False)
                return False
            self._preempt(victim, st, running)
            if victim == r:
                return False
        self._reserve(r, need)
        return True

    def _preempt(self, v: int, st: _Step, running: list[int]) -> None:
        chunk = st.loop_chunks.pop(v, 0)
        st.budget_tokens += chunk
        running.remove(v)
        st.num_preempted += 1
        mode = self.cfg.preemption_mode
        if mode == PreemptionMode.REJECT:
            self._abort(v, "preempted_rejected", st, preempted=True)
            return
        kv_pages = int(_pages(int(self.comp[v]), self.bs))
        self._release(v)
        self.num_preemptions[v] += 1
        if mode == PreemptionMode.SWAP and kv_pages <= self.swap_cfg.cpu_pool_pages - self.cpu_used:
            self.cpu_used += kv_pages
            st.swap_pages += kv_pages
            self.status[v] = SWAPPED
            self.cpu[v] = kv_pages
            self.num_swaps[v] += 1
            self.swapped.appendleft(v)
        else:
            self.status[v] = PREEMPTED
            self.comp[v] = 0
            self.waiting.push_front(v)

    # ------------------------------------------------------------------ phase: swapped and waiting requests
    def _resume_swapped(self, st: _Step) -> None:
        while self.swapped and self.run_ids.shape[0] < self.cfg.max_num_seqs and st.budget_tokens > 0:
            r = self.swapped[0]
            ids = self.xp.asarray([r], dtype=self.xp.int64)
            res_pages = _pages(self.rules.reservation_tokens(ids), self.bs)
            if not bool(self.rules.fits_empty_pool(ids, res_pages)[0]):
                self.swapped.popleft()
                self.cpu_used -= int(self.cpu[r])
                self._abort(r, "exceeds_pool", st, preempted=False)
                continue
            if self.run_ids.shape[0] and not self.rules.can_admit_one(r, self.uncommitted):
                break
            self.swapped.popleft()
            cpu_pages = int(self.cpu[r])
            self.cpu_used -= cpu_pages
            st.swap_pages += cpu_pages
            self.cpu[r] = 0
            self._start_running(r, st)
            self._reserve_on_admit(r)
            self._grow(r, cpu_pages)
            self._append_running([r])
            self._allocate(r, min(self._rem(r), st.budget_tokens), st)

    def _admit_waiting(self, st: _Step, *, whole: bool) -> None:
        if self.rules.kind is None or self.rules.kind is SGLangPolicy or not self._admit_prefix(st, whole=whole):
            self._admit_waiting_loop(st, whole=whole)

    def _admit_prefix(self, st: _Step, *, whole: bool) -> bool:
        """Admit the queue's longest admissible prefix at once; False when the loop must run (an abort)."""
        xp = self.xp
        n_run = int(self.run_ids.shape[0])
        m = min(self.cfg.max_num_seqs - n_run, len(self.waiting))
        if m <= 0 or st.budget_tokens <= 0:
            return True
        ids = self.waiting.first(m, xp)
        rem = self.prompt[ids] + self.gen[ids] - self.comp[ids]
        pages = _pages(self.rules.reservation_tokens(ids), self.bs)
        before_tokens = xp.cumsum(rem) - rem
        before_pages = xp.cumsum(pages) - pages
        loop_on = before_tokens < st.budget_tokens
        abort = ~self.rules.fits_empty_pool(ids, pages)
        blocked = ~self.rules.can_admit_vec(pages, self.uncommitted - before_pages)
        if n_run == 0:
            blocked[0] = False
        if whole:
            abort |= rem > self.cfg.max_num_batched_tokens
            blocked |= before_tokens + rem > st.budget_tokens
        stop = ~loop_on | abort | blocked
        s = int(xp.argmax(stop)) if bool(stop.any()) else m
        if s < m and bool(loop_on[s] & abort[s]):
            return False
        if s == 0:
            return True
        ids, rem, pages = ids[:s], rem[:s], pages[:s]
        chunk = xp.minimum(rem, st.budget_tokens - before_tokens[:s])
        used = _pages(chunk, self.bs)  # the admitted hold no pages yet; chunk <= reservation
        totals = to_numpy(xp.stack([pages.sum(), used.sum(), chunk.sum()]))
        self.waiting.pop(s)
        self.status[ids] = RUNNING
        self.admit_count += s
        first = self.admitted_iter[ids] < 0
        self.admitted_iter[ids] = xp.where(first, st.k, self.admitted_iter[ids])
        self.admitted_s[ids] = xp.where(first, st.start_s, self.admitted_s[ids])
        self.res[ids] = pages
        self.used[ids] = used
        self.max_res[ids] = xp.maximum(self.max_res[ids], pages)
        self.max_used[ids] = xp.maximum(self.max_used[ids], used)
        self.committed += int(totals[0])
        self.num_used += int(totals[1])
        self._append_running(ids)
        st.add(ids, chunk, s, int(totals[2]))
        return True

    def _admit_waiting_loop(self, st: _Step, *, whole: bool) -> None:
        xp = self.xp
        while len(self.waiting) and self.run_ids.shape[0] < self.cfg.max_num_seqs and st.budget_tokens > 0:
            r = self.waiting.head()
            ids = xp.asarray([r], dtype=xp.int64)
            res_pages = _pages(self.rules.reservation_tokens(ids), self.bs)
            if not bool(self.rules.fits_empty_pool(ids, res_pages)[0]):
                self.waiting.pop()
                self._abort(r, "exceeds_pool", st, preempted=False)
                continue
            rem = self._rem(r)
            if whole and rem > self.cfg.max_num_batched_tokens:
                self.waiting.pop()
                self._abort(r, "exceeds_token_budget", st, preempted=False)
                continue
            if whole and rem > st.budget_tokens:
                break
            if self.run_ids.shape[0] and not self.rules.can_admit_one(r, self.uncommitted):
                break
            self.waiting.pop()
            self._start_running(r, st)
            self._reserve_on_admit(r)
            self._append_running([r])
            self._allocate(r, min(rem, st.budget_tokens), st)

    # ------------------------------------------------------------------ running one iteration
    def _execute(self, st: _Step) -> None:
        xp = self.xp
        if not st.num_scheduled and not st.num_aborted and (self.idle_before or not st.num_preempted):
            raise RuntimeError(
                f"iteration {st.k} at {st.start_s:.6f} s makes no progress: running={to_numpy(self.run_ids)[:5]}, "
                f"waiting={len(self.waiting)}, swapped={list(self.swapped)[:5]}, "
                f"free pages={self.num_pages - self.num_used}, unpromised pages={self.uncommitted}")
        duration_s = st.swap_pages * self.swap_cfg.page_copy_s
        decode_tokens = num_tokens = 0
        pages_used, pages_reserved = self.num_used, self.committed
        end_s = st.start_s + duration_s
        if st.num_scheduled:
            ids = st.ids[0] if len(st.ids) == 1 else xp.concatenate(st.ids)
            ch = st.chunks[0] if len(st.chunks) == 1 else xp.concatenate(st.chunks)
            c, g, p = self.comp[ids], self.gen[ids], self.prompt[ids]
            c1 = c + ch
            dec = (g > 0) & (p + g - c == 1)
            sums = to_numpy(xp.stack([ch.sum(), (ch * c + ch * (ch + 1) // 2).sum(), c1.sum(), dec.sum()]))
            num_tokens, pairs, kv_tokens, decode_tokens = (int(x) for x in sums)
            duration_s += float(self.cost.iteration_s(num_tokens, pairs, kv_tokens))
            end_s = st.start_s + duration_s
            self.comp[ids] = c1
            made = c1 == p + g
            g1 = g + made
            self.gen[ids] = g1
            first = made & (g == 0)
            self.first_token_iter[ids] = xp.where(first, st.k, self.first_token_iter[ids])
            self.first_token_s[ids] = xp.where(first, end_s, self.first_token_s[ids])
            later = made & (g > 0)
            last = self.last_token_s[ids]
            self.max_tbt_s[ids] = xp.where(later, xp.fmax(self.max_tbt_s[ids], end_s - last), self.max_tbt_s[ids])
            self.last_token_s[ids] = xp.where(made, end_s, last)
            target = self.target[ids]
            fin = made & (g1 >= target)
            if bool(fin.any()):
                done = ids[fin]
                self.status[done] = xp.where(self.output[done] > target[fin], CAPPED, STOPPED).astype(xp.int8)
                self.finish_iter[done] = st.k
                self.finish_s[done] = end_s
                res, used = self.res[done], self.used[done]
                freed = to_numpy(xp.stack([xp.maximum(res, used).sum(), used.sum()]))
                self.committed -= int(freed[0])
                self.num_used -= int(freed[1])
                self.res[done] = 0
                self.used[done] = 0
                self.run_ids = self.run_ids[self.status[self.run_ids] == RUNNING]
        self._rows.append((st.k, st.start_s, duration_s, st.num_scheduled, num_tokens - decode_tokens, decode_tokens,
                           int(self.run_ids.shape[0]), len(self.waiting), len(self.swapped), st.num_preempted,
                           pages_used, pages_reserved, self.num_pages - pages_reserved, self.cpu_used,
                           st.swap_pages))
        self.idle_before = not st.num_scheduled and not st.num_aborted
        self.now_s = end_s
        self.k += 1

    # ------------------------------------------------------------------ decode-only stretches
    def _blocked(self, r: int, budget_tokens: int, *, whole: bool, num_running: int) -> int:
        """Whether queue head ``r`` stays unadmitted through a stretch: 0 no, 1 whatever the head, 2 this head."""
        if num_running >= self.cfg.max_num_seqs or budget_tokens <= 0:
            return 1
        if not self.rules.monotone:
            return 0
        ids = self.xp.asarray([r], dtype=self.xp.int64)
        pages = _pages(self.rules.reservation_tokens(ids), self.bs)
        if not bool(self.rules.fits_empty_pool(ids, pages)[0]):
            return 0  # it will be aborted: an event
        if whole and self._rem(r) > self.cfg.max_num_batched_tokens:
            return 0
        return 0 if bool(self.rules.can_admit_vec(pages, self.uncommitted)[0]) else 2

    def _stretch(self) -> bool:
        """Run the next iterations at once if they only decode; False when the next one is not such."""
        xp, n, mnbt = self.xp, int(self.run_ids.shape[0]), self.cfg.max_num_batched_tokens
        if n == 0 or n > mnbt or self.rules.kind is None:
            return False
        if self.swapped:
            if not self._blocked(self.swapped[0], mnbt - n, whole=False, num_running=n):
                return False
            arrivals_matter = False  # waiting is not admitted while a request is swapped out
        elif len(self.waiting):
            blocked = self._blocked(self.waiting.head(), mnbt if self.prefill_first else mnbt - n,
                                    whole=self.prefill_first, num_running=n)
            if not blocked:
                return False
            arrivals_matter = blocked == 2 and self.rules.ordered  # an arrival may become the head
        else:
            arrivals_matter = True
        ids = self.run_ids
        c, g = self.comp[ids], self.gen[ids]
        res, used = self.res[ids], self.used[ids]
        cols = to_numpy(xp.stack([c, self.target[ids] - g, xp.maximum(res, used), used, res,
                                  (g > 0) & (self.prompt[ids] + g - c == 1)]))
        c_h, left_h, commit_h, used_h, res_h, decoding = cols
        if not decoding.all():
            return False
        bs = self.bs
        first_new = commit_h * bs - c_h  # first iteration whose decode needs a page beyond the commitment
        length = int(left_h.min())  # the first finish ends the stretch
        if not self.rules.on_demand:
            length = min(length, int(first_new.min()))  # a reserving policy would preempt there
        if length < 2:
            return False
        kv = int(c_h.sum()) + n * np.arange(1, length + 1)
        duration_s = np.asarray(self.cost.iteration_s(n, kv, kv), dtype=np.float64)
        starts = np.cumsum(np.concatenate([[self.now_s], duration_s]))  # sequential, as now += duration
        if arrivals_matter and self.arrived < self.n:
            next_s = self.sorted_arrival_h[self.arrived]
            length = min(length, 1 + int(np.searchsorted(starts[1:length], next_s, side="left")))
        demand = np.zeros(length, dtype=np.int64)
        if self.rules.on_demand:
            demand = np.cumsum(_crossings(first_new, bs, length))
            over = np.flatnonzero(demand > self.uncommitted)
            if over.size:
                length = int(over[0])
        if length < 2:
            return False
        L = length
        self._record_stretch(n, L, starts, duration_s, demand[:L], np.cumsum(_crossings(used_h * bs - c_h, bs, L)),
                             int((left_h == L).sum()))
        need = _pages(c_h + L, bs)
        new_used = np.maximum(used_h, need)
        new_res = np.where(need > commit_h, need, res_h) if self.rules.on_demand else res_h
        self.num_used += int((new_used - used_h).sum())
        self.committed += int(demand[L - 1])
        new_used_x, new_res_x = xp.asarray(new_used), xp.asarray(new_res)
        self.comp[ids] = c + L
        self.gen[ids] = g + L
        self.used[ids] = new_used_x
        self.res[ids] = new_res_x
        self.max_used[ids] = xp.maximum(self.max_used[ids], new_used_x)
        self.max_res[ids] = xp.maximum(self.max_res[ids], new_res_x)
        ends = starts[1:L + 1]
        self.max_tbt_s[ids] = xp.fmax(xp.fmax(self.max_tbt_s[ids], float(ends[0]) - self.last_token_s[ids]),
                                      float(np.diff(ends).max()))
        self.last_token_s[ids] = float(ends[-1])
        fin_h = left_h == L
        if fin_h.any():
            fin = xp.asarray(fin_h)
            done = ids[fin]
            self.status[done] = xp.where(self.output[done] > self.target[done], CAPPED, STOPPED).astype(xp.int8)
            self.finish_iter[done] = self.k + L - 1
            self.finish_s[done] = float(ends[-1])
            self.committed -= int(np.maximum(new_res, new_used)[fin_h].sum())
            self.num_used -= int(new_used[fin_h].sum())
            self.res[done] = 0
            self.used[done] = 0
            self.run_ids = ids[~fin]
        self.rules.end_schedule(0, L)
        self.k += L
        self.now_s = float(starts[L])
        self.idle_before = False
        return True

    def _record_stretch(self, n: int, L: int, starts: np.ndarray, duration_s: np.ndarray, demand: np.ndarray,
                        used_growth: np.ndarray, num_finished: int) -> None:
        running = np.full(L, n, dtype=np.int64)
        running[-1] -= num_finished
        waiting = len(self.waiting) + np.searchsorted(self.sorted_arrival_h, starts[:L], side="right") - self.arrived
        reserved = self.committed + demand
        full = np.full(L, 1, dtype=np.int64)
        self._flush_rows()
        self._blocks.append([self.k + np.arange(L), starts[:L], duration_s[:L], full * n, full * 0, full * n,
                             running, waiting.astype(np.int64), full * len(self.swapped), full * 0,
                             self.num_used + used_growth, reserved, self.num_pages - reserved, full * self.cpu_used,
                             full * 0])

    # ------------------------------------------------------------------ results
    def _flush_rows(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows))
            self._blocks.append([np.asarray(col, dtype=np.float64 if name in ("start_s", "duration_s") else np.int64)
                                 for name, col in zip(ITERATION_COLUMNS, cols)])
            self._rows = []

    def _iteration_table(self) -> pd.DataFrame:
        self._flush_rows()
        if not self._blocks:
            return pd.DataFrame({name: np.zeros(0, dtype=np.float64 if name in ("start_s", "duration_s")
                                                else np.int64) for name in ITERATION_COLUMNS})
        return pd.DataFrame({name: np.concatenate([b[i] for b in self._blocks])
                             for i, name in enumerate(ITERATION_COLUMNS)})

    def _request_columns(self) -> pd.DataFrame:
        h = {name: to_numpy(getattr(self, name)) for name in (
            "prompt", "output", "admitted_iter", "first_token_iter", "finish_iter", "admitted_s", "first_token_s",
            "finish_s", "gen", "num_preemptions", "num_swaps", "max_res", "max_used", "last_token_s", "max_tbt_s",
            "status", "abort_code")}
        gen = h["gen"]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_tbt_s = np.where(gen > 1, (h["last_token_s"] - h["first_token_s"]) / (gen - 1), np.nan)
        names = np.array([s.name.lower() for s in RequestStatus], dtype=object)
        reasons = np.array([FINISH_REASON.get(s, "") for s in RequestStatus], dtype=object)
        status = h["status"].astype(np.int64)
        return pd.DataFrame({
            "prompt_tokens": h["prompt"], "output_tokens": h["output"], "arrival_s": self.arrival_h,
            "admitted_iter": h["admitted_iter"], "first_token_iter": h["first_token_iter"],
            "finish_iter": h["finish_iter"], "admitted_s": h["admitted_s"], "first_token_s": h["first_token_s"],
            "finish_s": h["finish_s"], "generated_tokens": gen, "num_preemptions": h["num_preemptions"],
            "num_swaps": h["num_swaps"], "max_reserved_pages": h["max_res"], "max_used_pages": h["max_used"],
            "mean_tbt_s": mean_tbt_s, "max_tbt_s": h["max_tbt_s"], "outcome": names[status],
            "finish_reason": reasons[status], "abort_reason": np.array(ABORT_REASONS, dtype=object)[h["abort_code"]],
        })


_LAZY_POLICIES = (VLLMPolicy, ReserveMaxPolicy, OrcaOraclePolicy, OrcaPow2Policy, OrcaMaxPolicy)


class _LazyRun:
    """Iterations without preemption, run with decoding requests advanced implicitly.

    A decoding request's state is affine in the iteration index ``k``: ``computed = off + k``,
    ``generated = goff + k``; it finishes in a known iteration and needs a new page exactly when
    ``(off + k) % block_size == 0``. So an iteration only touches the requests whose state
    changes shape (admitted, prefilling, finishing) and a few totals: the number of decoders,
    the sum of their ``off``, and per page phase the number of decoders. Their outcome columns
    (times, token-gap maxima) are written when the run hands the state back to the arrays.

    Valid for the chunked scheduler, FCFS, nothing swapped, and policies that either grow on
    demand with reservation = context (vLLM: a decoder's commitment is its pages) or reserve the
    whole request (TensorRT-LLM, Orca): in both, a decoder's page need is the phase count, and
    the run hands back before any iteration whose page growth would preempt, whose decodes
    overflow the token budget, or whose admissions could reach a request to abort.
    """

    def __init__(self, eng: "FastEngine") -> None:
        self.e = eng
        e = eng
        self.prompt = to_numpy(e.prompt).tolist()
        self.target = to_numpy(e.target).tolist()
        self.output = to_numpy(e.output).tolist()
        all_ids = e.xp.arange(e.n)
        pages = _pages(e.rules.reservation_tokens(all_ids), e.bs)  # requests not yet run: generated = 0
        self.fresh_pages = to_numpy(pages).tolist()
        fits = to_numpy(e.rules.fits_empty_pool(all_ids, pages))
        self.unfit_pos = np.flatnonzero(~fits[e.waiting.order_h]).tolist() + [e.n]  # arrival positions
        self.on_demand = e.rules.kind is VLLMPolicy
        self.watermark = int(e.rules.policy.watermark_frac * e.num_pages) if self.on_demand else 0
        self.arrivals = e.sorted_arrival_h.tolist()
        self.order = e.waiting.order_h.tolist()

    @staticmethod
    def applies(eng: "FastEngine") -> bool:
        return (not eng.prefill_first and eng.rules.kind in _LAZY_POLICIES and not eng.swapped
                and not eng.waiting.front and not eng.rules.ordered)

    def run(self) -> int:
        """Run iterations until one needs the array engine; return how many ran."""
        e, bs = self.e, self.e.bs
        k0 = k = e.k
        if not self._load():
            return 0
        prompt, target, fresh_pages, order, arrivals = self.prompt, self.target, self.fresh_pages, self.order, \
            self.arrivals
        D, P, fin_at, phase_cnt = self.D, self.P, self.fin_at, self.phase_cnt
        mnbt, max_seqs, num_pages, n = e.cfg.max_num_batched_tokens, e.cfg.max_num_seqs, e.num_pages, e.n
        on_demand, watermark, waiting = self.on_demand, self.watermark, e.waiting
        w_lo, w_hi = waiting.lo, waiting.hi  # the FCFS queue is order[w_lo:w_hi]
        unfit_next = next(p for p in self.unfit_pos if p >= w_lo)
        iteration_s = e.cost.iteration_s
        rows, row_times, costs, admitted, first_tokens = self.rows, self.row_times, self.costs, self.admitted, \
            self.first_tokens
        finished, finished_last = self.finished, self.finished_last
        committed, num_used, seq, n_dec, sum_off = e.committed, e.num_used, self.seq, self.n_dec, self.sum_off
        now, arrived = e.now_s, e.arrived
        nan = float("nan")
        timed = True  # durations are computed as they run while arrivals remain; afterwards in one go
        while True:
            if timed:
                while arrived < n and arrivals[arrived] <= now:
                    arrived += 1
                w_hi = arrived
                timed = arrived < n
            n_pre, n_wait = len(P), w_hi - w_lo
            if not (n_dec or n_pre or n_wait):
                if arrived == n:
                    break  # all done
                now = arrivals[arrived]
                continue
            # ---- will this iteration stay lazy? (decided before anything changes)
            grow = phase_cnt[k % bs]
            pending = p_dec = ()
            if P:
                pending = list(P.items())
                # a recomputed request one token short of its context decodes (the reference's is_decoding)
                p_dec = [x for x in pending if x[1][1] > 0 and prompt[x[0]] + x[1][1] - x[1][0] == 1]
                if p_dec:
                    pending = p_dec + [x for x in pending
                                       if not (x[1][1] > 0 and prompt[x[0]] + x[1][1] - x[1][0] == 1)]
            if n_dec + len(p_dec) > mnbt or (on_demand and grow > num_pages - committed):
                break
            if n_wait and unfit_next < min(w_hi, w_lo + max_seqs - n_dec - n_pre):
                break  # the admissions could reach a request that does not fit an empty pool
            # ---- schedule: decodes, then prefills in admission order, then admissions
            budget = mnbt - n_dec
            num_used += grow
            if on_demand:
                committed += grow
            tokens = num_sched = n_dec
            pairs = kv = sum_off + n_dec * (k + 1)
            chunks = []
            for r, st in pending:
                if budget == 0:
                    break
                c = st[0]
                chunk = min(prompt[r] + st[1] - c, budget)
                budget -= chunk
                need = -(-(c + chunk) // bs)
                if need > st[3]:
                    num_used += need - st[3]
                    st[3] = need
                    if need > st[4]:
                        st[4] = need
                tokens += chunk
                pairs += chunk * c + chunk * (chunk + 1) // 2
                kv += c + chunk
                num_sched += 1
                chunks.append((r, chunk))
            n_run = n_dec + n_pre
            whole = []  # admitted with their whole prompt in this iteration
            while n_wait and n_run < max_seqs and budget > 0:
                r = order[w_lo]
                p = fresh_pages[r]
                free = num_pages - committed
                if n_run and not (free - p >= watermark if on_demand else p <= free):
                    break
                w_lo += 1
                n_wait -= 1
                committed += p
                rem = prompt[r]
                chunk = rem if rem <= budget else budget
                budget -= chunk
                used = -(-chunk // bs)
                num_used += used
                seq += 1
                admitted += (r, k)
                tokens += chunk
                pairs += chunk * (chunk + 1) // 2
                kv += chunk
                num_sched += 1
                n_run += 1
                if chunk == rem:
                    whole.append((r, p, used, seq))
                else:  # computed, generated, reserved, used, max used, max reserved, admission, last token
                    P[r] = [0, 0, p, used, used, p, seq, nan]
                    chunks.append((r, chunk))
            pages_used, pages_reserved, decode_tokens = num_used, committed, n_dec + len(p_dec)
            if timed:
                duration_s = float(iteration_s(tokens, pairs, kv))
                end = now + duration_s
            else:
                duration_s = end = nan
            costs += (tokens, pairs, kv)
            # ---- execute: finishing decoders, then completed prefills
            for r in fin_at.pop(k, ()):
                off, base, goff, mxu, mxr, s, j0, last = D.pop(r)
                used_final = -(-(off + k + 1) // bs)
                res_final = (base if base > used_final else used_final) if on_demand else base
                committed -= res_final if res_final > used_final else used_final
                num_used -= used_final
                n_dec -= 1
                sum_off -= off
                phase_cnt[-off % bs] -= 1
                finished += (r, k, off + k + 1, max(mxu, used_final), max(mxr, res_final), j0)
                finished_last.append(last)
            for r, p, used, s in whole:
                first_tokens += (r, k)
                c = prompt[r]
                if target[r] == 1:
                    committed -= p if p > used else used
                    num_used -= used
                    finished += (r, k, c, used, p, k)
                    finished_last.append(nan)
                    continue
                off = c - k - 1
                D[r] = (off, p if p > used else used, -k, used, p, s, k, nan)
                n_dec += 1
                sum_off += off
                phase_cnt[-off % bs] += 1
                fin_at.setdefault(k + target[r] - 1, []).append(r)
            for r, chunk in chunks:
                st = P[r]
                c = st[0] + chunk
                st[0] = c
                g = st[1]
                if c < prompt[r] + g:
                    continue
                g += 1
                del P[r]
                if g == 1:
                    first_tokens += (r, k)
                if g >= target[r]:
                    committed -= max(st[2], st[3])
                    num_used -= st[3]
                    finished += (r, k, c, st[4], st[5], k)
                    finished_last.append(st[7])
                    continue
                off = c - k - 1
                D[r] = (off, max(st[2], st[3]), g - k - 1, st[4], st[5], st[6], k, st[7])
                n_dec += 1
                sum_off += off
                phase_cnt[-off % bs] += 1
                fin_at.setdefault(k + target[r] - g, []).append(r)
            rows += (k, num_sched, tokens - decode_tokens, decode_tokens, n_dec + len(P), w_hi - w_lo,
                     pages_used, pages_reserved)
            row_times += (now, duration_s)
            k += 1
            now = end
        e.k, e.arrived, e.committed, e.num_used = k, arrived, committed, num_used
        waiting.lo, waiting.hi = w_lo, w_hi
        self._store(k0, now)
        return k - k0

    def _load(self) -> bool:
        """Take the running requests from the arrays; False if one is not of a shape this run handles."""
        e, xp, bs, k = self.e, self.e.xp, self.e.bs, self.e.k
        self.P: dict[int, list] = {}  # prefilling: computed, generated, reserved, used, max used, max reserved,
        #                               admission, last token (s)
        self.D: dict[int, tuple] = {}  # decoding: off, commitment base, goff, max used, max reserved, admission,
        #                                first iteration of its run of tokens, token before that run (s)
        self.fin_at: dict[int, list[int]] = {}
        self.phase_cnt = [0] * bs
        self.n_dec = self.sum_off = 0
        # flat lists, a record every few entries (cheaper to fill and to turn into arrays than tuples)
        self.admitted: list[int] = []  # request, iteration
        self.first_tokens: list[int] = []  # request, iteration
        self.finished: list[int] = []  # request, iteration, computed, max used, max reserved, run start
        self.finished_last: list[float] = []  # the token before the run (s)
        self.rows: list[int] = []  # iteration, batch, prefill and decode tokens, running, waiting, pages
        self.row_times: list[float] = []  # start, duration (s)
        self.costs: list[int] = []  # tokens, attention pairs, KV tokens
        run = e.run_ids
        self.seq = int(run.shape[0])
        if not self.seq:
            return True
        ints = to_numpy(xp.stack([e.comp[run], e.gen[run], e.res[run], e.used[run], e.max_used[run],
                                  e.max_res[run]])).tolist()
        last = to_numpy(e.last_token_s[run]).tolist()
        for i, (r, c, g, res, used, mxu, mxr) in enumerate(zip(to_numpy(run).tolist(), *ints)):
            if g > 0 and self.prompt[r] + g - c == 1:
                if self.on_demand and res > used:
                    return False
                off = c - k
                self.D[r] = (off, max(res, used), g - k, mxu, mxr, i + 1, k, last[i])
                self.n_dec += 1
                self.sum_off += off
                self.phase_cnt[-off % bs] += 1
                self.fin_at.setdefault(k + self.target[r] - g - 1, []).append(r)
            else:
                self.P[r] = [c, g, res, used, mxu, mxr, i + 1, last[i]]
        return True

    def _store(self, k0: int, now: float) -> None:
        """Hand the state back to the arrays: iteration rows, outcomes, the running requests."""
        e, xp, bs = self.e, self.e.xp, self.e.bs
        if not self.rows:
            return
        ints = np.asarray(self.rows, dtype=np.int64).reshape(-1, 8)
        times = np.asarray(self.row_times, dtype=np.float64).reshape(-1, 2)
        num = ints.shape[0]
        start, duration = times[:, 0].copy(), times[:, 1].copy()
        untimed = np.flatnonzero(np.isnan(duration))
        if untimed.size:
            i0 = int(untimed[0])
            cost = np.asarray(self.costs, dtype=np.int64).reshape(-1, 3)[i0:]
            duration[i0:] = e.cost.iteration_s(cost[:, 0], cost[:, 1], cost[:, 2])
            starts = np.cumsum(np.concatenate([[start[i0]], duration[i0:]]))  # sequential, as now += duration
            start[i0:] = starts[:-1]
            now = float(starts[-1])
        end = start + duration
        reserved = ints[:, 7]
        zero = np.zeros(num, dtype=np.int64)
        e._flush_rows()
        e._blocks.append([ints[:, 0], start, duration] + [ints[:, i] for i in range(1, 6)]
                         + [zero, zero, ints[:, 6], reserved, e.num_pages - reserved, zero + e.cpu_used, zero])
        k = e.k  # the next iteration
        if self.admitted:
            ids, ks = np.asarray(self.admitted, dtype=np.int64).reshape(-1, 2).T
            ids_x = xp.asarray(ids)
            e.status[ids_x] = RUNNING
            e.admitted_iter[ids_x] = xp.asarray(ks)
            e.admitted_s[ids_x] = xp.asarray(start[ks - k0])
        if self.first_tokens:
            ids, ks = np.asarray(self.first_tokens, dtype=np.int64).reshape(-1, 2).T
            e.first_token_iter[xp.asarray(ids)] = xp.asarray(ks)
            e.first_token_s[xp.asarray(ids)] = xp.asarray(end[ks - k0])
        segments = []  # (request, first iteration, last iteration, token before (s)) of each run of tokens
        if self.finished:
            ids, ks, comp, mxu, mxr, j0 = np.asarray(self.finished, dtype=np.int64).reshape(-1, 6).T
            segments.append((ids, j0, ks, np.asarray(self.finished_last, dtype=np.float64)))
            ids_x = xp.asarray(ids)
            out, tgt = e.output[ids_x], e.target[ids_x]
            e.status[ids_x] = xp.where(out > tgt, CAPPED, STOPPED).astype(xp.int8)
            e.finish_iter[ids_x] = xp.asarray(ks)
            e.finish_s[ids_x] = xp.asarray(end[ks - k0])
            e.last_token_s[ids_x] = xp.asarray(end[ks - k0])
            e.gen[ids_x] = tgt
            e.comp[ids_x] = xp.asarray(comp)
            e.res[ids_x] = 0
            e.used[ids_x] = 0
            e.max_used[ids_x] = xp.asarray(mxu)
            e.max_res[ids_x] = xp.asarray(mxr)
        running = []
        if self.D:
            ids = np.fromiter(self.D, dtype=np.int64, count=len(self.D))
            off, base, goff, mxu, mxr, seq, j0 = (np.asarray(c, dtype=np.int64)
                                                  for c in list(zip(*self.D.values()))[:7])
            last = np.asarray([d[7] for d in self.D.values()], dtype=np.float64)
            segments.append((ids, j0, np.full(ids.size, k - 1), last))
            comp = off + k
            used = _pages(comp, bs)
            res = np.maximum(base, used) if self.on_demand else base
            ids_x = xp.asarray(ids)
            e.comp[ids_x] = xp.asarray(comp)
            e.gen[ids_x] = xp.asarray(goff + k)
            e.used[ids_x] = xp.asarray(used)
            e.res[ids_x] = xp.asarray(res)
            e.max_used[ids_x] = xp.asarray(np.maximum(mxu, used))
            e.max_res[ids_x] = xp.asarray(np.maximum(mxr, res))
            e.last_token_s[ids_x] = float(end[-1])
            running.append((seq, ids))
        for r, st in self.P.items():
            e.comp[r], e.gen[r], e.res[r], e.used[r], e.max_used[r], e.max_res[r] = st[:6]
            running.append((np.asarray([st[6]]), np.asarray([r])))
        if running:
            seq, ids = (np.concatenate(c) for c in zip(*running))
            e.run_ids = xp.asarray(ids[np.argsort(seq, kind="stable")])
        else:
            e.run_ids = xp.zeros(0, dtype=xp.int64)
        if segments:
            self._token_gaps(k0, end, *(np.concatenate(c) for c in zip(*segments)))
        e.now_s = now
        e.idle_before = False

    def _token_gaps(self, k0: int, end: np.ndarray, ids: np.ndarray, j0: np.ndarray, j1: np.ndarray,
                    last: np.ndarray) -> None:
        """Fold each run of consecutive tokens into its request's largest token gap (seconds).

        Request ``ids[i]`` produced a token in every iteration from ``j0[i]`` to ``j1[i]``, its
        previous one at ``last[i]``; its gaps are ``end[j0] - last`` and the differences of
        consecutive iteration ends in ``(j0, j1]``: a range maximum, answered for all runs at
        once from a sparse table (log2(iterations) levels of running maxima).
        """
        e, xp = self.e, self.e.xp
        i0, i1 = j0 - k0, j1 - k0
        gaps = np.concatenate([[-np.inf], np.diff(end)])
        table = [gaps]
        while (1 << len(table)) <= gaps.size:
            prev, half = table[-1], 1 << (len(table) - 1)
            table.append(np.maximum(prev[:-half], prev[half:]))
        lo, hi = i0 + 1, i1  # inclusive range of gap indices
        some = hi >= lo
        level = np.zeros(ids.size, dtype=np.int64)
        level[some] = np.floor(np.log2(hi[some] - lo[some] + 1)).astype(np.int64)
        best = np.full(ids.size, np.nan)
        for lv in np.unique(level[some]).tolist():
            sel = some & (level == lv)
            t = table[lv]
            best[sel] = np.maximum(t[lo[sel]], t[hi[sel] - (1 << lv) + 1])
        with np.errstate(invalid="ignore"):
            contrib = np.fmax(end[i0] - last, best)
        uniq, inv = np.unique(ids, return_inverse=True)
        current = to_numpy(e.max_tbt_s[xp.asarray(uniq)]).copy()
        np.fmax.at(current, inv, contrib)
        e.max_tbt_s[xp.asarray(uniq)] = xp.asarray(current)


def _crossings(first: np.ndarray, period: int, length: int) -> np.ndarray:
    """For each iteration j in [0, length), how many requests cross a page boundary at j.

    Request r crosses at ``first[r] + m x period`` for m = 0, 1, ... (iterations); host arrays.
    """
    assert (first >= 0).all(), "a running request holds fewer pages than its context needs"
    counts = np.bincount(first[first < length], minlength=length)
    pad = -length % period
    return np.concatenate([counts, np.zeros(pad, dtype=np.int64)]).reshape(-1, period).cumsum(axis=0).ravel()[:length]


def run_fast(*, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray, request_ids: np.ndarray,
             max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig,
             cost_model: CostModel, xp: ModuleType) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate with the fast engine; return the request table and the iteration table.

    The tables are those of :func:`kvlab.sim.metrics.request_table` and
    :func:`kvlab.sim.metrics.iteration_table` for the reference engine, column for column.
    """
    requests, iterations = FastEngine(
        prompt_tokens=prompt_tokens, output_tokens=output_tokens, arrival_s=arrival_s,
        max_new_tokens=max_new_tokens, policy=policy, pool=pool, scheduler=scheduler, swap=swap,
        cost_model=cost_model, xp=xp).run_all()
    requests.insert(0, "request_id", request_ids)
    at = requests.columns.get_loc("mean_tbt_s")
    requests.insert(at, "ttft_s", requests["first_token_s"] - requests["arrival_s"])
    requests.insert(at + 1, "e2e_s", requests["finish_s"] - requests["arrival_s"])
    requests.loc[requests["outcome"] == RequestStatus.FINISHED_ABORTED.name.lower(), "e2e_s"] = np.nan
    return requests, iterations
