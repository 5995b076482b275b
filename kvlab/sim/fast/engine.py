"""The array engine: one iteration's phases on arrays, decode-only stretches, the result tables."""
from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from ..._intmath import ceil_div
from ...backend import to_numpy
from ...costmodel import CostModel
from ...policies import Policy
from ..config import PoolConfig, PreemptionMode, SchedulerConfig, SchedulerKind, SwapConfig
from ..reference import ITERATION_COLUMNS
from .lazy import Clock, LazyFacts, LazyRun, Running
from .queue import Waiting
from .state import ABORT_REASONS, ABORTED, CAPPED, PREEMPTED, RUNNING, STOPPED, SWAPPED, WAITING, Rules, no_progress
from .tables import STATE_COLUMNS, iteration_table, request_columns, rows_block

# Array iterations to run before trying a lazy run again after one could not start.
LAZY_RETRY_ITERATIONS = 16


class Step:
    """What one iteration does: the scheduled requests and chunks, preemptions, swap traffic, aborts."""

    def __init__(self, k: int, start_s: float, budget_tokens: int) -> None:
        self.k, self.start_s, self.budget_tokens = k, start_s, budget_tokens
        self.ids: list[Any] = []  # arrays of request ids, scheduled in this order
        self.chunks: list[Any] = []  # their chunks (tokens)
        self.num_scheduled = 0
        self.num_preempted = self.swap_pages = self.num_aborted = 0
        self.loop_chunks: dict[int, int] = {}  # chunks granted by the per-request loop, by request

    def add(self, ids: Any, chunks: Any, num: int, tokens: int) -> None:
        self.ids.append(ids)
        self.chunks.append(chunks)
        self.num_scheduled += num
        self.budget_tokens -= tokens


class FastEngine:
    """Runs one simulation on arrays; :meth:`run_all` returns the request and iteration tables.

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
        self.rules = Rules(policy, self)
        self.waiting = Waiting(order_h, xp.asarray(order_h, dtype=i64), self.rules)
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
        self.idle_before = False
        self._rows: list[tuple] = []
        self._blocks: list[list[np.ndarray]] = []

    # ------------------------------------------------------------------ main loop
    def run_all(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Serve every request; return (per-request columns, per-iteration table)."""
        lazy = LazyRun(self._lazy_facts(), self) if self.rules.monotone and not self.rules.ordered else None
        wait_iterations = 0  # array iterations before the next try of a lazy run
        while self.arrived < self.n or len(self.waiting) or self.run_ids.shape[0] or self.swapped:
            hi = int(np.searchsorted(self.sorted_arrival_h, self.now_s, side="right"))
            if hi > self.arrived:
                self.waiting.arrive(hi)
                self.arrived = hi
            if not (len(self.waiting) or self.run_ids.shape[0] or self.swapped):
                self.now_s = float(self.sorted_arrival_h[self.arrived])
                continue
            if lazy is not None and wait_iterations == 0 and not self.swapped and not self.waiting.front:
                if lazy.run():
                    wait_iterations = 1  # the iteration it stopped before runs on the arrays
                    continue
                wait_iterations = LAZY_RETRY_ITERATIONS
            wait_iterations = max(wait_iterations - 1, 0)
            if not self._stretch():
                self._step()
        return self._request_columns(), self._iteration_table()

    def _step(self) -> None:
        st = Step(self.k, self.now_s, self.cfg.max_num_batched_tokens)
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

    def _start_running(self, r: int, st: Step) -> None:
        self.status[r] = RUNNING
        if int(self.admitted_iter[r]) < 0:
            self.admitted_iter[r], self.admitted_s[r] = st.k, st.start_s

    def _reserve_on_admit(self, r: int) -> None:
        pages = int(ceil_div(self.rules.reservation_tokens(self.xp.asarray([r]))[0], self.bs))
        self._reserve(r, pages)
        self.max_res[r] = max(int(self.max_res[r]), pages)

    def _allocate(self, r: int, chunk: int, st: Step) -> None:
        extra = int(ceil_div(int(self.comp[r]) + chunk, self.bs)) - int(self.used[r])
        if extra > 0:
            self._grow(r, extra)
        self.max_used[r] = max(int(self.max_used[r]), int(self.used[r]))
        self.max_res[r] = max(int(self.max_res[r]), int(self.res[r]))
        st.add(self.xp.asarray([r], dtype=self.xp.int64), self.xp.asarray([chunk], dtype=self.xp.int64), 1, chunk)

    def _abort(self, r: int, reason: str, st: Step, *, preempted: bool) -> None:
        self._release(r)
        self.status[r] = ABORTED
        self.abort_code[r] = ABORT_REASONS.index(reason)
        self.num_preemptions[r] += int(preempted)
        self.finish_iter[r], self.finish_s[r] = st.k, st.start_s
        st.num_aborted += 1

    def _append_running(self, ids: Any) -> None:
        self.run_ids = self.xp.concatenate([self.run_ids, self.xp.asarray(ids, dtype=self.xp.int64).reshape(-1)])

    # ------------------------------------------------------------------ phase: running requests
    def _schedule_running(self, st: Step) -> None:
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
        need = ceil_div(c + chunk, self.bs)
        res, used = self.res[ids], self.used[ids]
        beyond = xp.where(sched, need - xp.maximum(res, used), 0)
        grow = beyond > 0
        flags = to_numpy(xp.stack([xp.maximum(beyond, 0).sum(), grow.sum(), sched.sum(), chunk.sum()]))
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

    def _schedule_running_loop(self, st: Step) -> None:
        """The reference's per-request loop, with preemption (victims, self-preemption, aborts)."""
        running = to_numpy(self.run_ids).tolist()
        decodes = [r for r in running if int(self.gen[r]) > 0 and self._rem(r) == 1]
        prefills = [r for r in running if not (int(self.gen[r]) > 0 and self._rem(r) == 1)]
        scheduled = st.loop_chunks
        for r in decodes + prefills:
            if int(self.status[r]) != RUNNING or r in scheduled:
                continue
            if st.budget_tokens == 0:
                break
            chunk = min(self._rem(r), st.budget_tokens)
            if self._preempt_until_fits(r, chunk, st, running):
                extra = int(ceil_div(int(self.comp[r]) + chunk, self.bs)) - int(self.used[r])
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

    def _preempt_until_fits(self, r: int, chunk: int, st: Step, running: list[int]) -> bool:
        need = int(ceil_div(int(self.comp[r]) + chunk, self.bs))
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

    def _preempt(self, v: int, st: Step, running: list[int]) -> None:
        chunk = st.loop_chunks.pop(v, 0)
        st.budget_tokens += chunk
        running.remove(v)
        st.num_preempted += 1
        mode = self.cfg.preemption_mode
        if mode == PreemptionMode.REJECT:
            self._abort(v, "preempted_rejected", st, preempted=True)
            return
        kv_pages = int(ceil_div(int(self.comp[v]), self.bs))
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
    def _resume_swapped(self, st: Step) -> None:
        while self.swapped and self.run_ids.shape[0] < self.cfg.max_num_seqs and st.budget_tokens > 0:
            r = self.swapped[0]
            ids = self.xp.asarray([r], dtype=self.xp.int64)
            if not bool(self.rules.fits_empty_pool(ids)[0]):
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

    def _admit_waiting(self, st: Step, *, whole: bool) -> None:
        if not self.rules.own_pages or not self._admit_prefix(st, whole=whole):
            self._admit_waiting_loop(st, whole=whole)

    def _admit_prefix(self, st: Step, *, whole: bool) -> bool:
        """Admit the queue's longest admissible prefix at once; False when the loop must run (an abort).

        For a policy that admits on its own pages: request i of the queue is admitted when its
        admission pages fit the unpromised pages less the reservations of those before it.
        """
        xp = self.xp
        n_run = int(self.run_ids.shape[0])
        m = min(self.cfg.max_num_seqs - n_run, len(self.waiting))
        if m <= 0 or st.budget_tokens <= 0:
            return True
        ids = self.waiting.first(m, xp)
        rem = self.prompt[ids] + self.gen[ids] - self.comp[ids]
        pages = ceil_div(self.rules.reservation_tokens(ids), self.bs)
        before_tokens = xp.cumsum(rem) - rem
        before_pages = xp.cumsum(pages) - pages
        loop_on = before_tokens < st.budget_tokens
        abort = ~self.rules.fits_empty_pool(ids)
        blocked = ~self.rules.can_admit(ids, self.uncommitted - before_pages)
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
        used = ceil_div(chunk, self.bs)  # the admitted hold no pages yet; chunk <= reservation
        totals = to_numpy(xp.stack([pages.sum(), used.sum(), chunk.sum()]))
        self.waiting.pop(s)
        self.status[ids] = RUNNING
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

    def _admit_waiting_loop(self, st: Step, *, whole: bool) -> None:
        xp = self.xp
        while len(self.waiting) and self.run_ids.shape[0] < self.cfg.max_num_seqs and st.budget_tokens > 0:
            r = self.waiting.head()
            ids = xp.asarray([r], dtype=xp.int64)
            if not bool(self.rules.fits_empty_pool(ids)[0]):
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
    def _execute(self, st: Step) -> None:
        xp = self.xp
        if not st.num_scheduled and not st.num_aborted and (self.idle_before or not st.num_preempted):
            raise no_progress(st.k, st.start_s, running=to_numpy(self.run_ids), waiting=len(self.waiting),
                              swapped=len(self.swapped), free_pages=self.num_pages - self.num_used,
                              unpromised_pages=self.uncommitted)
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
            sums = to_numpy(xp.stack([ch.sum(), (ch * c + ch * (ch + 1) // 2).sum(), c1.sum(),
                                      dec.astype(xp.int64).sum()]))
            num_tokens, pairs, kv_tokens, decode_tokens = (int(x) for x in sums)
            duration_s += float(self.cost.iteration_s(num_tokens, pairs, kv_tokens, st.num_scheduled))
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
        if not bool(self.rules.fits_empty_pool(ids)[0]):
            return 0  # it will be aborted: an event
        if whole and self._rem(r) > self.cfg.max_num_batched_tokens:
            return 0
        return 0 if bool(self.rules.can_admit(ids, self.uncommitted)[0]) else 2

    def _stretch(self) -> bool:
        """Run the next iterations at once if they only decode; False when the next one is not such."""
        xp, n, mnbt = self.xp, int(self.run_ids.shape[0]), self.cfg.max_num_batched_tokens
        if n == 0 or n > mnbt:
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
                                  ((g > 0) & (self.prompt[ids] + g - c == 1)).astype(xp.int64)]))
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
        duration_s = np.asarray(self.cost.iteration_s(n, kv, kv, n), dtype=np.float64)
        starts = np.cumsum(np.concatenate([[self.now_s], duration_s]))  # sequential, as now += duration
        if arrivals_matter and self.arrived < self.n:
            next_s = self.sorted_arrival_h[self.arrived]
            length = min(length, 1 + int(np.searchsorted(starts[1:length], next_s, side="left")))
        demand = np.zeros(length, dtype=np.int64)
        if self.rules.on_demand:
            demand = np.cumsum(crossings(first_new, bs, length))
            over = np.flatnonzero(demand > self.uncommitted)
            if over.size:
                length = int(over[0])
        if length < 2:
            return False
        L = length
        self.rules.end_schedule(0, L)  # the running requests as the first of the L iterations sees them
        self._record_stretch(n, L, starts, duration_s, demand[:L], np.cumsum(crossings(used_h * bs - c_h, bs, L)),
                             int((left_h == L).sum()))
        need = ceil_div(c_h + L, bs)
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

    # ------------------------------------------------------------------ the lazy-run interface (.lazy.LazyHost)
    def _lazy_facts(self) -> LazyFacts:
        """What a lazy run reads once; first admissions only (``generated = 0``)."""
        all_ids = self.xp.arange(self.n)
        prompt = to_numpy(self.prompt)
        fits = to_numpy(self.rules.fits_empty_pool(all_ids))
        if self.prefill_first:  # a whole prompt above the token budget is aborted too
            fits = fits & (prompt <= self.cfg.max_num_batched_tokens)
        order_h = self.waiting.order_h
        return LazyFacts(
            block_size=self.bs, num_pages=self.num_pages, max_num_batched_tokens=self.cfg.max_num_batched_tokens,
            max_num_seqs=self.cfg.max_num_seqs, prefill_first=self.prefill_first, on_demand=self.rules.on_demand,
            prompt_tokens=prompt.tolist(), target_tokens=to_numpy(self.target).tolist(),
            fresh_pages=to_numpy(ceil_div(self.rules.reservation_tokens(all_ids), self.bs)).tolist(),
            admission_pages=to_numpy(self.rules.admission_pages(all_ids)).tolist(), order=order_h.tolist(),
            arrival_s=self.sorted_arrival_h.tolist(), unfit_positions=np.flatnonzero(~fits[order_h]).tolist() + [self.n],
            cost=self.cost)

    def clock(self) -> Clock:
        return Clock(k=self.k, now_s=self.now_s, arrived=self.arrived, queue_lo=self.waiting.lo,
                     committed_pages=self.committed, used_pages=self.num_used, cpu_pages=self.cpu_used)

    def set_clock(self, clock: Clock) -> None:
        """After iterations that each computed tokens."""
        self.k, self.now_s, self.committed, self.num_used = clock.k, clock.now_s, clock.committed_pages, clock.used_pages
        self.arrived = self.waiting.hi = clock.arrived
        self.waiting.lo = clock.queue_lo
        self.idle_before = False

    def running(self) -> Running:
        run = self.run_ids
        ints = to_numpy(self.xp.stack([run, self.comp[run], self.gen[run], self.res[run], self.used[run],
                                       self.max_used[run], self.max_res[run]]))
        return Running(ids=ints[0], computed=ints[1], generated=ints[2], reserved=ints[3], used=ints[4],
                       max_used=ints[5], max_reserved=ints[6], last_token_s=to_numpy(self.last_token_s[run]))

    def set_running(self, running: Running) -> None:
        xp = self.xp
        ids = xp.asarray(running.ids, dtype=xp.int64)
        self.run_ids = ids
        for name, col in (("comp", running.computed), ("gen", running.generated), ("res", running.reserved),
                          ("used", running.used), ("max_used", running.max_used), ("max_res", running.max_reserved),
                          ("last_token_s", running.last_token_s)):
            getattr(self, name)[ids] = xp.asarray(col)

    def record_admitted(self, ids: np.ndarray, iterations: np.ndarray, start_s: np.ndarray) -> None:
        """First admissions: RUNNING, with their admission iteration and time."""
        xp, ids_x = self.xp, self.xp.asarray(ids)
        self.status[ids_x] = RUNNING
        self.admitted_iter[ids_x] = xp.asarray(iterations)
        self.admitted_s[ids_x] = xp.asarray(start_s)

    def record_first_tokens(self, ids: np.ndarray, iterations: np.ndarray, end_s: np.ndarray) -> None:
        xp, ids_x = self.xp, self.xp.asarray(ids)
        self.first_token_iter[ids_x] = xp.asarray(iterations)
        self.first_token_s[ids_x] = xp.asarray(end_s)

    def record_finished(self, ids: np.ndarray, iterations: np.ndarray, end_s: np.ndarray, computed: np.ndarray,
                        max_used: np.ndarray, max_reserved: np.ndarray) -> None:
        """Requests that produced their last token in iteration ``iterations`` ending at ``end_s``; pages freed."""
        xp, ids_x = self.xp, self.xp.asarray(ids)
        out, tgt = self.output[ids_x], self.target[ids_x]
        self.status[ids_x] = xp.where(out > tgt, CAPPED, STOPPED).astype(xp.int8)
        self.finish_iter[ids_x] = xp.asarray(iterations)
        self.finish_s[ids_x] = xp.asarray(end_s)
        self.last_token_s[ids_x] = xp.asarray(end_s)
        self.gen[ids_x] = tgt
        self.comp[ids_x] = xp.asarray(computed)
        self.res[ids_x] = 0
        self.used[ids_x] = 0
        self.max_used[ids_x] = xp.asarray(max_used)
        self.max_res[ids_x] = xp.asarray(max_reserved)

    def fold_token_gaps(self, ids: np.ndarray, gaps_s: np.ndarray) -> None:
        """``max_tbt_s = fmax(max_tbt_s, gap)`` for each (id, gap); an id may repeat."""
        xp = self.xp
        uniq, inv = np.unique(ids, return_inverse=True)
        current = to_numpy(self.max_tbt_s[xp.asarray(uniq)]).copy()
        np.fmax.at(current, inv, gaps_s)
        self.max_tbt_s[xp.asarray(uniq)] = xp.asarray(current)

    def append_iterations(self, columns: dict[str, Any]) -> None:
        """Iteration rows as columns (``ITERATION_COLUMNS``, host arrays of equal length)."""
        self._flush_rows()
        self._blocks.append([columns[name] for name in ITERATION_COLUMNS])

    # ------------------------------------------------------------------ results
    def _flush_rows(self) -> None:
        if self._rows:
            self._blocks.append(rows_block(self._rows))
            self._rows = []

    def _iteration_table(self) -> pd.DataFrame:
        self._flush_rows()
        return iteration_table(self._blocks)

    def _request_columns(self) -> pd.DataFrame:
        return request_columns({name: to_numpy(getattr(self, name)) for name in STATE_COLUMNS}, self.arrival_h)


def crossings(first: np.ndarray, period: int, length: int) -> np.ndarray:
    """For each iteration j in [0, length), how many requests cross a page boundary at j.

    Request r crosses at ``first[r] + m x period`` for m = 0, 1, ... (iterations); host arrays.
    """
    assert (first >= 0).all(), "a running request holds fewer pages than its context needs"
    counts = np.bincount(first[first < length], minlength=length)
    pad = -length % period
    return np.concatenate([counts, np.zeros(pad, dtype=np.int64)]).reshape(-1, period).cumsum(axis=0).ravel()[:length]
