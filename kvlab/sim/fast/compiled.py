"""The compiled path of the fast engine: when it applies, and the Python side of its loop.

The loop itself (:mod:`.kernel`) is the reference engine's rules compiled by Numba; it runs on the
host (NumPy arrays). It applies when

* the array module is NumPy (CuPy and the strict stand-in keep the array engine);
* the policy's traits say its answers about a request depend only on that request
  (``admits_on_own_pages``), it keeps no per-iteration state (not ``keeps_state``), keeps the
  waiting queue FCFS (not ``orders_queue``) and preempts the newest running request
  (``preempts_newest``); the policy is asked on arrays here, once for every request and again for
  each request preempted after it generated tokens, never from the compiled code;
* the cost model has a compiled form (:func:`kvlab.costmodel.compiled.constants`);
* Numba imports (it is a dependency of kvlab; an image without it, such as the GPU check's,
  keeps the array engine), and the environment does not set ``KVLAB_COMPILED=0`` (which the
  tests use to run the array engine on the same cases).

Otherwise :func:`why_not` says why and :func:`kvlab.sim.fast.run_fast` runs the array engine.

Numba compiles the loop the first time a process runs it and caches the machine code next to
the source (``__pycache__``); later processes load it from there. When no cached code is there
(a fresh install, or the source changed) the compile is announced on stderr before it starts,
and its measured time after it ends (:func:`_compile_notice`): it takes tens of seconds, and a
silent pause that long reads as a hang.
"""
from __future__ import annotations

import os
import sys
import time
from types import ModuleType

import numpy as np
import pandas as pd

from ..._intmath import ceil_div
from ...costmodel import CostModel
from ...policies import Policy, Requests
from ..config import PoolConfig, PreemptionMode, SchedulerConfig, SchedulerKind, SwapConfig
from .state import WAITING, no_progress
from .tables import STATE_COLUMNS, iteration_frame, request_columns

#: Iteration rows the buffer first holds per request (13 ints and 2 floats each; it doubles when
#: full, and pages of it that are never written cost no memory).
ROWS_PER_REQUEST = 16
MIN_ROWS = 1 << 12


def why_not(policy: Policy, cost_model: CostModel, xp: ModuleType) -> str | None:
    """Why the compiled loop cannot run this simulation, or ``None`` when it can."""
    if os.environ.get("KVLAB_COMPILED", "1") == "0":
        return "KVLAB_COMPILED=0"
    if xp is not np:
        return f"array module {xp.__name__} (the compiled loop runs on NumPy)"
    traits = [what for what, holds in (
        ("admission reads the running requests", not policy.admits_on_own_pages),
        ("keeps per-iteration state", policy.keeps_state), ("orders the waiting queue", policy.orders_queue),
        ("chooses its own victims", not policy.preempts_newest)) if holds]
    if traits:
        return f"policy {policy.name} {', '.join(traits)}: the array engine runs it"
    try:
        from ...costmodel.compiled import constants
    except ImportError:
        return "Numba is not installed"
    if constants(cost_model) is None:
        return f"cost model {type(cost_model).__name__} has no compiled form"
    return None


class _Facts:
    """The policy's answers per request, asked on arrays: reservation pages, admission pages, fits."""

    def __init__(self, policy: Policy, prompt: np.ndarray, output: np.ndarray, block_size: int) -> None:
        self.policy, self.prompt, self.output, self.bs = policy, prompt, output, block_size
        n = prompt.shape[0]
        self.res_pages = np.zeros(n, dtype=np.int64)
        self.adm_pages = np.zeros(n, dtype=np.int64)
        self.fits = np.zeros(n, dtype=np.bool_)
        self.gen = np.zeros(n, dtype=np.int64)  # generated tokens the answers are for

    def ask(self, ids: np.ndarray, gen: np.ndarray) -> None:
        """Ask the policy about requests ``ids`` with ``gen`` generated tokens."""
        reqs = Requests(ids, self.prompt[ids], self.output[ids], gen, np)
        self.res_pages[ids] = ceil_div(self.policy.reservation_tokens(reqs), self.bs)
        self.adm_pages[ids] = self.policy.admission_pages(reqs)
        self.fits[ids] = self.policy.fits_empty_pool(reqs)
        self.gen[ids] = gen


def _needs_compile(kernel: object) -> bool:
    """Whether calling the Numba dispatcher ``kernel`` will compile it: not yet loaded in this
    process, and no usable cached code (Numba's index is missing or stale for the source)."""
    if getattr(kernel, "signatures", None):
        return False
    try:
        return not kernel._cache._cache_file._load_index()  # {} when missing or stale (Numba 0.5x-0.6x)
    except Exception:  # another Numba's internals: say nothing rather than guess
        return False


def _compile_notice(kernel: object) -> float | None:
    """Announce a compile of ``kernel`` on stderr; the start time to report its duration from, or None."""
    if not _needs_compile(kernel):
        return None
    print("kvlab: compiling the simulator's loop with Numba (first run after installing or changing kvlab; "
          "cached for later runs) ...", file=sys.stderr, flush=True)
    return time.perf_counter()


def run_compiled(*, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray,
                 max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig,
                 cost_model: CostModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate with the compiled loop (when :func:`why_not` is ``None``); the fast engine's tables."""
    from ...costmodel.compiled import constants
    from . import kernel as kn

    n = len(prompt_tokens)
    i64 = np.int64
    prompt = np.ascontiguousarray(prompt_tokens, dtype=i64)
    output = np.ascontiguousarray(output_tokens, dtype=i64)
    arrival_h = np.asarray(arrival_s, dtype=np.float64)
    # Request ids are unsigned in the loop: indexing with them then needs no negative-index wrap.
    u64 = np.uint64
    order = np.argsort(arrival_h, kind="stable").astype(u64)  # arrival order, ties by row
    arrival_sorted = np.ascontiguousarray(arrival_h[order])  # the loop reads arrivals in that order
    facts = _Facts(policy, prompt, output, pool.block_size)
    facts.ask(np.arange(n, dtype=i64), np.zeros(n, dtype=i64))
    cost_kind, cost_params = constants(cost_model)
    mode = {PreemptionMode.RECOMPUTE: kn.MODE_RECOMPUTE, PreemptionMode.SWAP: kn.MODE_SWAP,
            PreemptionMode.REJECT: kn.MODE_REJECT}[scheduler.preemption_mode]
    C = np.array([pool.block_size, pool.num_pages, scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
                  scheduler.kind == SchedulerKind.PREFILL_FIRST, policy.on_demand, mode, swap.cpu_pool_pages], dtype=i64)
    Q = np.zeros((n, kn.NUM_REQUEST_INTS), dtype=i64)  # per-request ints, one row each
    Q[:, kn.PROMPT], Q[:, kn.OUTPUT], Q[:, kn.TARGET] = prompt, output, np.minimum(output, max_new_tokens)
    Q[:, kn.STATUS] = WAITING
    T = np.full((n, 2), np.nan)  # last token, largest token gap (s)
    once = {name: np.full(n, -1, dtype=i64) for name in ("admitted_iter", "first_token_iter", "finish_iter")}
    once.update({name: np.full(n, np.nan) for name in ("admitted_s", "first_token_s", "finish_s")})
    S, F = np.zeros(kn.NUM_INT_STATE, dtype=i64), np.zeros(1)
    cap = max(min(scheduler.max_num_seqs, n), 1)  # running (and scheduled) requests at most
    queues = [np.zeros(max(n, 1), dtype=u64) for _ in range(2)]  # waiting, swapped (ring buffers)
    scratch = [np.zeros(cap * m, dtype=t) for m, t in ((1, u64), (1, u64), (1, i64), (2, u64))]  # running,
    #                                                                   scheduled ids and chunks, snapshot
    stale = np.zeros(cap, dtype=i64)
    rows = MIN_ROWS + ROWS_PER_REQUEST * n
    R, RT = np.zeros((kn.NUM_ROW_INTS, rows), dtype=i64), np.zeros((2, rows))
    compile_start = _compile_notice(kn.simulate_kernel)
    while True:
        if S[kn.NROWS] == R.shape[1]:  # full: double it
            R, RT = (np.concatenate([a, np.zeros_like(a)], axis=1) for a in (R, RT))
        while True:
            event = kn.simulate_kernel(
                S, F, C, swap.page_copy_s, cost_kind, cost_params, Q, T, order, arrival_sorted, facts.res_pages,
                facts.adm_pages, facts.fits, facts.gen, *once.values(), *queues, *scratch, stale, R, RT)
            if compile_start is not None:
                print(f"kvlab: compiled the simulator's loop in {time.perf_counter() - compile_start:.0f} s",
                      file=sys.stderr, flush=True)
                compile_start = None
            if event != kn.STALE:
                break
            ids = stale[:S[kn.NSTALE]].copy()  # int64
            facts.ask(ids, Q[ids, kn.GEN])
        if event == kn.NO_PROGRESS:
            raise no_progress(int(S[kn.K]), float(F[kn.NOW]), running=scratch[0][:S[kn.NRUN]],
                              waiting=int(S[kn.WQ_LEN]), swapped=int(S[kn.SW_LEN]),
                              free_pages=pool.num_pages - int(S[kn.USED_PAGES]),
                              unpromised_pages=pool.num_pages - int(S[kn.COMMITTED]))
        if event == kn.DONE:
            break
    num = S[kn.NROWS]
    state = {**once, "last_token_s": T[:, kn.LAST_S], "max_tbt_s": T[:, kn.MAX_TBT]}
    state.update({name: Q[:, col] for name, col in (
        ("prompt", kn.PROMPT), ("output", kn.OUTPUT), ("gen", kn.GEN), ("num_preemptions", kn.NPRE),
        ("num_swaps", kn.NSWAP), ("max_res", kn.MAX_RES), ("max_used", kn.MAX_USED), ("status", kn.STATUS),
        ("abort_code", kn.ABORT))})
    return request_columns({name: np.ascontiguousarray(state[name]) for name in STATE_COLUMNS}, arrival_h), \
        iteration_frame(R[:, :num], RT[:, :num])
