"""The Python side of the compiled loop: its arrays, and the answers to what it asks.

The loop (:mod:`.loop`) is the reference engine's rules compiled by Numba; it runs on the host
(NumPy arrays) for every policy and cost model. What it cannot decide it hands back here
(:class:`_Asker`): the policy's facts about requests (asked on the backend's array module ``xp``,
for every request at the start and again for each request preempted after it generated tokens),
and, for a rule with no compiled form, ``can_admit``, ``choose_victim``, ``end_schedule`` or the
cost model's ``iteration_s``, asked exactly as the reference engine asks them. :func:`why_not`
names what is asked per question instead of compiled (``None`` when nothing is).

``KVLAB_COMPILED_FORMS=0`` ignores every compiled form, so that every question is asked (the
tests run both ways). The loop runs compiled ahead of time (:mod:`.aot`: an extension module
built on first use and loaded without importing Numba) unless ``KVLAB_AOT=0`` or that build
failed; then Numba compiles it the first time a process runs it and caches the machine code
(:mod:`kvlab._numba_cache`). Either compile is announced on stderr before it starts and its
measured time after it ends (:func:`_compile_notice` for Numba's): it takes tens of seconds, and
a silent pause that long reads as a hang.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pandas as pd

from ..._intmath import ceil_div
from ...backend import to_numpy
from ...costmodel import CostModel
from ...costmodel.flat import constants
from ...policies import Policy, Requests
from ...prefix_cache import NONE, BlockIds
from ..metrics import SUMMARY_ITERATION_COLUMNS
from ..reference import PREFIX_ITERATION_COLUMNS
from ..config import PoolConfig, PreemptionMode, SchedulerConfig, SchedulerKind, SwapConfig
from . import aot, layout as lp
from .state import WAITING, no_progress
from .tables import PREFIX_STATE_COLUMNS, STATE_COLUMNS, iteration_frame, request_columns

#: Iteration rows the buffer first holds per request (15 ints and 2 floats each; it doubles when
#: full, and pages of it that are never written cost no memory).
ROWS_PER_REQUEST = 16
MIN_ROWS = 1 << 12
#: The loop's code of each scheduler (``C[SCHED]``).
SCHEDULER_CODES = {SchedulerKind.CHUNKED: lp.SCHED_CHUNKED, SchedulerKind.PREFILL_FIRST: lp.SCHED_PREFILL_FIRST,
                   SchedulerKind.PREFILL_FIRST_CHUNKED: lp.SCHED_PREFILL_FIRST_CHUNKED,
                   SchedulerKind.MIXED_WHOLE: lp.SCHED_MIXED_WHOLE,
                   SchedulerKind.CHUNKED_ALTERNATING: lp.SCHED_CHUNKED_ALTERNATING}


def _forms_on() -> bool:
    return os.environ.get("KVLAB_COMPILED_FORMS", "1") != "0"


def why_not(policy: Policy, cost_model: CostModel) -> str | None:
    """What the compiled loop asks Python per question for this simulation, or ``None`` when nothing."""

    if not _forms_on():
        return "KVLAB_COMPILED_FORMS=0: every rule is asked"
    form = policy.compiled_form()
    asked = [what for what, holds in (
        ("can_admit", form.admission == "ask"), ("end_schedule", form.end_schedule == "ask"),
        ("choose_victim", not policy.preempts_newest)) if holds]
    if constants(cost_model) is None:
        asked.append(f"iteration_s of {type(cost_model).__name__}")
    return f"no compiled form: {', '.join(asked)} asked per question" if asked else None


def _config(policy: Policy, cost_model: CostModel, pool: PoolConfig, scheduler: SchedulerConfig,
            swap: SwapConfig, caching: bool = False, every_column: bool = True,
            as_rank: bool = False) -> tuple[np.ndarray, int, np.ndarray]:
    """The loop's configuration vector, cost-model kind and constants (``caching``: a prefix cache;
    ``every_column``: write every iteration column, else only the summary's; ``as_rank``: a
    data-parallel rank, every duration asked)."""
    forms = _forms_on()
    form = policy.compiled_form()
    admission = {"own_pages": lp.OWN_PAGES, "future_charge": lp.FUTURE_CHARGE}.get(form.admission, lp.ASK)
    state = {"none": lp.NO_STATE, "ratio_decay": lp.RATIO_DECAY}.get(form.end_schedule, lp.ASK)
    victim = lp.NEWEST if policy.preempts_newest and forms else lp.ASK
    if not forms:
        admission, state = lp.ASK, (lp.NO_STATE if state == lp.NO_STATE else lp.ASK)
    bs = pool.block_size
    shift = bs.bit_length() - 1 if bs & (bs - 1) == 0 else -1
    mode = {PreemptionMode.RECOMPUTE: lp.MODE_RECOMPUTE, PreemptionMode.SWAP: lp.MODE_SWAP,
            PreemptionMode.REJECT: lp.MODE_REJECT}[scheduler.preemption_mode]
    consts = tuple(form.constants) + (0, 1, 1, 0, 1)[len(form.constants):]
    C = np.array([bs, pool.num_pages, scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
                  SCHEDULER_CODES[scheduler.kind], policy.on_demand, mode, swap.cpu_pool_pages, shift,
                  admission, victim, state, policy.orders_queue, policy.max_new_tokens, *consts[:5], caching, every_column,
                  scheduler.async_scheduling, as_rank, policy.reserves_first_chunk],
                 dtype=np.int64)
    compiled_cost = constants(cost_model) if forms and not as_rank else None
    kind, params = compiled_cost if compiled_cost is not None else (lp.COST_ASK, np.zeros(1))
    return C, kind, params


class _Asker:
    """Answers the loop's questions: the policy's facts and rules, the cost model's latency."""

    def __init__(self, policy: Policy, cost_model: CostModel, Q: np.ndarray, run: np.ndarray, xp: ModuleType) -> None:
        self.policy, self.cost, self.Q, self.run, self.xp = policy, cost_model, Q, run, xp
        self.facts = np.zeros((Q.shape[0], lp.NUM_FACTS), dtype=np.int64)

    def ask_facts(self, ids: np.ndarray) -> None:
        """The policy's answers about requests ``ids`` at their generated tokens (asked on ``xp``)."""
        xp, pol, Q = self.xp, self.policy, self.Q
        reqs = Requests(*(xp.asarray(a) for a in (ids, Q[ids, lp.PROMPT], Q[ids, lp.OUTPUT], Q[ids, lp.GEN])), xp)
        tokens = pol.reservation_tokens(reqs)
        block = self.facts[ids]
        block[:, lp.F_RES_TOKENS] = to_numpy(xp.asarray(tokens) + xp.zeros(len(ids), dtype=xp.int64))
        block[:, lp.F_RES_PAGES] = ceil_div(block[:, lp.F_RES_TOKENS], pol.block_size)
        block[:, lp.F_ADM_PAGES] = to_numpy(xp.asarray(pol.admission_pages(reqs)) + xp.zeros(len(ids), dtype=xp.int64))
        block[:, lp.F_FITS] = to_numpy(xp.asarray(pol.fits_empty_pool(reqs)) | xp.zeros(len(ids), dtype=bool))
        block[:, lp.F_GEN] = Q[ids, lp.GEN]
        if pol.orders_queue:
            block[:, lp.F_RANK] = to_numpy(xp.asarray(pol.queue_rank(reqs)) + xp.zeros(len(ids), dtype=xp.int64))
        self.facts[ids] = block

    def one(self, r: int) -> Requests:
        """One request as the reference engine shows it (Python ints)."""
        q = self.Q[r]
        return Requests.one(r, int(q[lp.PROMPT]), int(q[lp.OUTPUT]), int(q[lp.GEN]))

    def running(self, nrun: int) -> Requests:
        """The running requests in admission order (NumPy arrays, as the reference's ``_batch``)."""
        ids = self.run[:nrun].copy()
        return Requests(ids, self.Q[ids, lp.PROMPT], self.Q[ids, lp.OUTPUT], self.Q[ids, lp.GEN], np)

    def answer(self, event: int, S: np.ndarray, F: np.ndarray) -> None:
        """Put the answer to the loop's question ``event`` in ``S`` / ``F``."""
        pol = self.policy
        if event != lp.ASK_COST:  # the policy sees the state its compiled form has kept
            pol.load_compiled_state((int(S[lp.STATE0]), int(S[lp.STATE1])))
        if event == lp.ASK_ADMIT:
            running = None if pol.admits_on_own_pages else self.running(int(S[lp.NRUN]))
            S[lp.ANSWER] = bool(pol.can_admit(self.one(int(S[lp.ASK_R])), free_pages=int(S[lp.ASK_FREE]),
                                              running=running))
        elif event == lp.ASK_VICTIM:
            S[lp.ANSWER] = int(pol.choose_victim(self.running(int(S[lp.NRUN]))))
        elif event == lp.ASK_END_SCHEDULE:
            pol.end_schedule(num_preempted=int(S[lp.NPREEMPTED]), running=self.running(int(S[lp.NRUN])))
            S[lp.STATE0], S[lp.STATE1] = pol.compiled_state()
        else:  # ASK_COST
            F[lp.ANSWER_S] = float(self.cost.iteration_s(int(S[lp.ASK_TOKENS]), int(S[lp.ASK_PAIRS]),
                                                         int(S[lp.ASK_KV]), int(S[lp.NSCHED])))
        S[lp.HAS_ANSWER] = 1


def _needs_compile(kernel: object) -> bool:
    """Whether calling the Numba dispatcher ``kernel`` will compile it: not yet loaded in this
    process, and no usable cached code (Numba's index is missing or stale for the source)."""
    if getattr(kernel, "signatures", None):
        return False
    try:
        return not kernel._cache._cache_file._load_index()  # {} when missing or stale (Numba 0.5x-0.6x)
    except Exception:  # another Numba's internals: say nothing rather than guess
        return False


def _kernel() -> tuple[Callable[..., int], bool]:
    """The loop's entry, and whether it was compiled ahead of time (:mod:`.aot`: its arguments are
    checked; built on first use) rather than Numba's JIT dispatcher (``KVLAB_AOT=0``, or no build;
    under ``NUMBA_DISABLE_JIT=1`` the dispatcher runs the loop as plain Python, as asked)."""
    if os.environ.get("KVLAB_AOT", "1") != "0" and os.environ.get("NUMBA_DISABLE_JIT", "0") in ("", "0"):
        ahead = aot.load()
        if ahead is not None:
            return ahead, True
    from . import loop  # imports Numba

    return loop.run_loop, False


def _compile_notice(kernel: object) -> float | None:
    """Announce a compile of ``kernel`` on stderr; the start time to report its duration from, or None."""
    if not _needs_compile(kernel):
        return None
    print("kvlab: compiling the simulator's loop with Numba (first run after installing or changing kvlab; "
          "cached for later runs) ...", file=sys.stderr, flush=True)
    return time.perf_counter()


def _request_state(prompt: np.ndarray, output: np.ndarray, max_new_tokens: int) -> tuple[np.ndarray, ...]:
    """Per-request arrays: Q (ints), T (times, s), E (iterations)."""
    n = prompt.shape[0]
    Q = np.zeros((n, lp.NUM_REQUEST_INTS), dtype=np.int64)
    Q[:, lp.PROMPT], Q[:, lp.OUTPUT], Q[:, lp.TARGET] = prompt, output, np.minimum(output, max_new_tokens)
    Q[:, lp.STATUS] = WAITING
    return Q, np.full((n, 5), np.nan), np.full((n, 3), -1, dtype=np.int64)


def pool_arrays(blocks: BlockIds | None, num_pages: int,
                num_requests: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The empty prefix-cache pool's arrays ``(pg, page_of, blk, rb)`` for ``blocks`` (:mod:`.prefix`;
    one-element stand-ins when ``None``)."""
    if blocks is None:
        return (np.zeros((4, 1), dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros((2, 1), dtype=np.int64),
                np.zeros((2, num_requests + 1), dtype=np.int64))
    n = num_pages
    pg = np.empty((4, n + 1), dtype=np.int64)
    pg[lp.PG_REF], pg[lp.PG_BLOCK] = 0, NONE
    pg[lp.PG_NEXT] = np.append(np.arange(1, n + 1), 0)  # the queue 0 .. n - 1 between the sentinel's links
    pg[lp.PG_PREV] = np.arange(-1, n)  # page p after p - 1; the sentinel after n - 1
    pg[lp.PG_PREV, 0] = n
    blk = np.empty((2, max(blocks.ids.size, 1)), dtype=np.int64)
    blk[lp.BL_ID, :blocks.ids.size], blk[lp.BL_PAGE] = blocks.ids, NONE
    rb = np.zeros((2, num_requests + 1), dtype=np.int64)
    rb[lp.RB_START] = blocks.start
    return pg, np.full(max(blocks.num_ids, 1), NONE, dtype=np.int64), blk, rb


def _tables(Q: np.ndarray, T: np.ndarray, E: np.ndarray, R: np.ndarray, RT: np.ndarray, num_rows: int,
            arrival_s: np.ndarray, caching: bool, every_column: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The result tables around the loop's arrays: request columns are views of ``Q``, ``T``, ``E``
    (strided; no copy, which a million-request run would pay in fresh memory), iteration columns rows of ``R``."""
    state = {name: E[:, col] for name, col in (("admitted_iter", lp.ADM_ITER), ("first_token_iter", lp.FT_ITER),
                                                ("finish_iter", lp.FIN_ITER))}
    state.update({name: T[:, col] for name, col in (
        ("admitted_s", lp.ADM_S), ("first_token_s", lp.FT_S), ("finish_s", lp.FIN_S), ("last_token_s", lp.LAST_S),
        ("max_tbt_s", lp.MAX_TBT))})
    state.update({name: Q[:, col] for name, col in (
        ("prompt", lp.PROMPT), ("output", lp.OUTPUT), ("gen", lp.GEN), ("num_preemptions", lp.NPRE),
        ("num_swaps", lp.NSWAP), ("max_res", lp.MAX_RES), ("max_used", lp.MAX_USED), ("status", lp.STATUS),
        ("abort_code", lp.ABORT), ("prefix_hit", lp.HIT), ("saved_prefill", lp.SAVED))})
    names = STATE_COLUMNS + (PREFIX_STATE_COLUMNS if caching else ())
    ints = R[:lp.NUM_ROW_INTS if caching else lp.R_CACHED, :num_rows]
    return request_columns({name: state[name] for name in names}, arrival_s), \
        iteration_frame(ints, RT[:, :num_rows], None if every_column else
                        SUMMARY_ITERATION_COLUMNS + (PREFIX_ITERATION_COLUMNS if caching else ()))


class CompiledRun:
    """One run of the compiled loop, resumable: :meth:`advance` runs it to its next stop.

    Alone it stops only when every request has finished (``DONE``). As a data-parallel rank
    (``as_rank``, :mod:`kvlab.sim.data_parallel`) it serves only the requests routed to it
    (:meth:`assign`) and also stops at each iteration's question (``ASK_COST``: :meth:`work`, answered
    by :meth:`run_for`) and where it has nothing to schedule (``RANK_IDLE``: the group sets :attr:`now_s`).
    """

    def __init__(self, *, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray,
                 max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig,
                 cost_model: CostModel, xp: ModuleType = np, blocks: BlockIds | None = None,
                 every_column: bool = True, as_rank: bool = False) -> None:
        prompt, output = (np.ascontiguousarray(a, dtype=np.int64) for a in (prompt_tokens, output_tokens))
        n, self.arrival_h = prompt.shape[0], np.asarray(arrival_s, dtype=np.float64)
        if as_rank:  # routed arrivals are appended; the rest wait at +inf
            order, self.arrival_sorted = np.zeros(n, dtype=np.int64), np.full(n, np.inf)
        else:
            order = np.argsort(self.arrival_h, kind="stable").astype(np.int64)  # arrival order, ties by row
            self.arrival_sorted = np.ascontiguousarray(self.arrival_h[order])  # the loop reads them in that order
        self.order, self.num_assigned, self.as_rank = order, 0, as_rank
        self.Q, self.T, self.E = _request_state(prompt, output, max_new_tokens)
        cap = max(min(scheduler.max_num_seqs, n), 1)  # running (and scheduled) requests at most
        self.run = np.zeros(cap, dtype=np.int64)
        self.policy, self.pool = policy, pool
        self.asker = _Asker(policy, cost_model, self.Q, self.run, xp)
        self.asker.ask_facts(np.arange(n, dtype=np.int64))
        self.caching, self.every_column = blocks is not None, every_column
        if self.caching and scheduler.preemption_mode != PreemptionMode.RECOMPUTE:
            raise ValueError(f"prefix caching preempts by recompute only, not {scheduler.preemption_mode.value!r}")
        C, cost_kind, cost_params = _config(policy, cost_model, pool, scheduler, swap, self.caching, every_column,
                                            as_rank)
        self.prefix_pool = pool_arrays(blocks, pool.num_pages, n)
        self.S, self.F = S, F = np.zeros(lp.NUM_INT_STATE, dtype=np.int64), np.zeros(lp.NUM_FLOAT_STATE)
        F[lp.PREV_START] = -1.0  # no iteration has run
        S[lp.STATE0], S[lp.STATE1] = policy.compiled_state()
        queues = [np.zeros(max(n, 1), dtype=np.int64) for _ in range(2)]  # waiting (ring or heap), swapped (ring)
        self.scratch = [np.zeros(cap * m, dtype=np.int64) for m in (1, 1, 2, 1, 1, 1)]  # scheduled ids, chunks,
        rows = MIN_ROWS + ROWS_PER_REQUEST * n                                # snapshot, stale, limbo, finishing
        self.R, self.RT = np.zeros((lp.NUM_ROW_INTS, rows), dtype=np.int64), np.zeros((2, rows))
        self.kernel, self.ahead = _kernel()
        self.head = (S, F, C, float(swap.page_copy_s), int(cost_kind), cost_params, self.Q, self.asker.facts, self.T,
                     self.E, self.order, self.arrival_sorted, *queues, self.run, *self.scratch)
        if self.ahead:
            aot.check_arguments((*self.head, self.R, self.RT, *self.prefix_pool))
        self.started = False

    def advance(self) -> int:
        """Run to the next stop (``DONE``, or a data-parallel rank's ``ASK_COST`` or ``RANK_IDLE``); its event code."""
        S = self.S
        if not self.started:  # a compile is announced by the run that needs it (the first of a group's ranks)
            self.compile_start = None if self.ahead else _compile_notice(self.kernel)
            self.started = True
        while True:
            if S[lp.NROWS] == self.R.shape[1]:  # full: double it
                self.R, self.RT = (np.concatenate([a, np.zeros_like(a)], axis=1) for a in (self.R, self.RT))
            event = self.kernel(*self.head, self.R, self.RT, *self.prefix_pool)
            if self.compile_start is not None:
                print(f"kvlab: compiled the simulator's loop in {time.perf_counter() - self.compile_start:.0f} s",
                      file=sys.stderr, flush=True)
                self.compile_start = None
            if event in (lp.DONE, lp.RANK_IDLE) or (event == lp.ASK_COST and self.as_rank):
                return event
            if event == lp.NO_PROGRESS:
                raise no_progress(int(S[lp.K]), float(self.F[lp.START]), running=self.run[:S[lp.NRUN]],
                                  waiting=int(S[lp.WQ_LEN]), swapped=int(S[lp.SW_LEN]),
                                  free_pages=self.pool.num_pages - int(S[lp.USED_PAGES]),
                                  unpromised_pages=self.pool.num_pages - int(S[lp.COMMITTED]))
            if event == lp.STALE:
                self.asker.ask_facts(self.scratch[3][:S[lp.NSTALE]].copy())
                S[lp.NSTALE] = 0
            elif event != lp.ROWS_FULL:
                self.asker.answer(event, S, self.F)

    # ---- the group's side of a data-parallel rank (:class:`kvlab.sim.data_parallel.Rank`)
    def assign(self, r: int, arrival_s: float) -> None:
        """Request ``r`` (a row) is routed here; it joins at ``arrival_s`` (routed in arrival order)."""
        self.order[self.num_assigned], self.arrival_sorted[self.num_assigned] = r, arrival_s
        self.num_assigned += 1

    @property
    def now_s(self) -> float:
        return float(self.F[lp.NOW])

    @now_s.setter
    def now_s(self, t: float) -> None:
        self.F[lp.NOW] = t

    def counts(self) -> tuple[int, int]:
        """(waiting, running) requests, the waiting ones counting those routed here and not yet joined."""
        S = self.S
        return int(S[lp.WQ_LEN] + S[lp.NLIMBO] + self.num_assigned - S[lp.ARRIVED]), int(S[lp.NRUN])

    def work(self) -> tuple[int, int, int, int, int]:
        """The asked iteration's (tokens, attention pairs, KV tokens, sequences, pages swapped)."""
        S = self.S
        return (int(S[lp.ASK_TOKENS]), int(S[lp.ASK_PAIRS]), int(S[lp.ASK_KV]), int(S[lp.NSCHED]),
                int(S[lp.SWAP_PAGES]))

    def run_for(self, duration_s: float) -> None:
        """Answer the asked iteration with its (group's) duration (s)."""
        self.F[lp.ANSWER_S], self.S[lp.HAS_ANSWER] = duration_s, 1

    def tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The request and iteration tables (:func:`run_compiled`'s), after ``DONE`` or the group's end."""
        self.policy.load_compiled_state((int(self.S[lp.STATE0]), int(self.S[lp.STATE1])))
        return _tables(self.Q, self.T, self.E, self.R, self.RT, int(self.S[lp.NROWS]), self.arrival_h, self.caching,
                       self.every_column)


def run_compiled(*, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray,
                 max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig,
                 cost_model: CostModel, xp: ModuleType = np, blocks: BlockIds | None = None,
                 every_column: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate with the compiled loop; the reference engine's tables (the policy asked on ``xp``).

    ``blocks``: the requests' prefix-cache block ids (:mod:`kvlab.prefix_blocks`) to simulate a
    prefix cache (:mod:`kvlab.prefix_cache`; recompute preemption only), else ``None``.
    ``every_column``: the iteration table has every column, else only those :func:`kvlab.sim.metrics.summarize`
    reads (:data:`~kvlab.sim.metrics.SUMMARY_ITERATION_COLUMNS`; the loop writes no others, which
    saves most of a long run's memory).
    """
    run = CompiledRun(prompt_tokens=prompt_tokens, output_tokens=output_tokens, arrival_s=arrival_s,
                      max_new_tokens=max_new_tokens, policy=policy, pool=pool, scheduler=scheduler, swap=swap,
                      cost_model=cost_model, xp=xp, blocks=blocks, every_column=every_column)
    run.advance()
    return run.tables()
