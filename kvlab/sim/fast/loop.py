"""The compiled loop: the reference engine's rules, one request at a time, compiled by Numba.

Written by hand because no library simulates a serving loop: it is a port of
:mod:`kvlab.sim.reference` (read its top-of-file note for the rules) onto integer and float
arrays, phase by phase under the reference's names (:func:`_admit_waiting`,
:func:`_schedule_running`, :func:`_preempt_until_fits`, :func:`_resume_swapped`,
:func:`_end_schedule`, :func:`_execute`), so the two codings read side by side.

The loop asks whatever it cannot decide itself. The policy's answers about one request
(reservation and admission pages, whether it fits an empty pool, its queue rank) arrive as
per-request facts, valid for the generated tokens they were asked at (``F_GEN``). A rule the
loop has a compiled form of (``C[ADMISSION]``, ``C[VICTIM]``, ``C[STATE_RULE]``, the cost
model's ``cost_kind``) it evaluates; any other it hands back to Python as an event, with the
question in ``S`` (``ASK_R``, ``ASK_FREE``, ``ASK_TOKENS`` ...), and resumes where it stopped
once Python has put the answer in ``S[ANSWER]`` (``F[ANSWER_S]`` for a duration) and set
``S[HAS_ANSWER]``. Every scalar of the loop's state lives in ``S`` and ``F``, and a phase
reaches its question again on resuming before it changes anything, so a hand-back can happen in
the middle of an iteration.

Under prefix caching (``C[CACHING]``) the pool's page arrays of :mod:`kvlab.prefix_cache` come
in too (``pg``, ``page_of``, ``blk``, ``rb``; the rules compiled in :mod:`.prefix`): admission
matches and takes a request's hit, a chunk's new pages come from the free queue's head (evicting)
and its full blocks enter the cache, and a release walks the block table. ``S[USED_PAGES]`` then
counts distinct pages in use, ``S[TABLE]`` block-table entries and ``S[CACHED_FREE]`` unreferenced
pages that keep a block; ``S[COMMITTED]`` is pages in use plus every request's reservation beyond
its table, as the specification's. Without caching the same counters reduce to the per-request
sums. Events:

* ``DONE``: every request has finished; ``ROWS_FULL``: the row buffer is full (handed back
  doubled); ``NO_PROGRESS``: the iteration at ``S[K]`` computes nothing (the reference's error);
* ``STALE``: requests preempted after generating tokens need their facts asked again (ids in
  ``stale[:S[NSTALE]]``), at the end of the iteration that preempted them (none is readmitted
  in it);
* ``ASK_ADMIT`` (``can_admit`` of request ``ASK_R`` with ``ASK_FREE`` unpromised pages and
  ``run[:NRUN]`` running), ``ASK_VICTIM`` (``choose_victim`` among ``run[:NRUN]``: a position),
  ``ASK_END_SCHEDULE`` (``end_schedule`` after scheduling; the policy's compiled state goes
  both ways in ``S[STATE0:]``), ``ASK_COST`` (``iteration_s`` of ``ASK_TOKENS``, ``ASK_PAIRS``,
  ``ASK_KV``, ``NSCHED``).

A data-parallel rank (``C[AS_RANK]``, driven by :mod:`kvlab.sim.data_parallel`) hands back
``RANK_IDLE`` where it has nothing to schedule at ``F[NOW]`` (its group moves ``F[NOW]`` and
appends routed arrivals to ``order`` / ``arrival``), and asks ``ASK_COST`` for every iteration,
whose answer is then the iteration's whole duration (its group's).
"""
from __future__ import annotations

from ..._numba_cache import njit  # first: it gives Numba a writable cache folder, keyed on the sources
import numpy as np

from ..._intmath import ceil_div
from ...costmodel.compiled import iteration_s
from . import prefix as px
from .layout import (  # every slot, column and code: one definition, shared with the Python side
    K, ARRIVED, COMMITTED, USED_PAGES, CPU_USED, IDLE, NROWS, WQ_HEAD, WQ_LEN, SW_HEAD, SW_LEN, NRUN, NSTALE,
    NLIMBO, STAGE, BUDGET, NSCHED, NPREEMPTED, SWAP_PAGES, NABORTED, CURSOR, NUM_DEC, NUM_OTHER, CUR_R, CUR_CHUNK,
    HAS_ANSWER, ANSWER, ASK_R, ASK_FREE, ASK_TOKENS, ASK_PAIRS, ASK_KV, STATE0, STATE1, TABLE, CACHED_FREE, NFIN,
    ADMIT_BUSY, JOINED, JOINED_LAST, NOW, START, ANSWER_S, PREV_START, BETWEEN, WHOLE, RUNNING_PHASE, SWAPPED_PHASE,
    CHUNKED, END_SCHEDULE, EXECUTE, PREFILLS_PHASE, PREFILL_ADMIT, BLOCK_SIZE, NUM_PAGES, MNBT, MAX_SEQS, SCHED,
    ON_DEMAND, MODE, CPU_POOL, SHIFT, ADMISSION, VICTIM, STATE_RULE, ORDERED, MAX_NEW, CLIP, FLOOR_NUM, FLOOR_DEN,
    STEP_NUM, STEP_DEN, CACHING, EVERY_COLUMN, ASYNC, AS_RANK, FIRST_CHUNK, SCHED_CHUNKED, SCHED_PREFILL_FIRST,
    SCHED_PREFILL_FIRST_CHUNKED, SCHED_MIXED_WHOLE, SCHED_CHUNKED_ALTERNATING, RANK_IDLE, MODE_SWAP, MODE_REJECT,
    OWN_PAGES, FUTURE_CHARGE, NEWEST, NO_STATE, RATIO_DECAY, COST_ASK, PROMPT, GEN, COMP, RES, USED, TARGET,
    MAX_USED, MAX_RES, STATUS, OUTPUT, CPU, NPRE, NSWAP, ABORT, HIT, SAVED, LAST_S, MAX_TBT, ADM_S, FT_S, FIN_S,
    ADM_ITER, FT_ITER, FIN_ITER, F_RES_PAGES, F_ADM_PAGES, F_FITS, F_GEN, F_RES_TOKENS, F_RANK, CONTINUE, DONE,
    ROWS_FULL, STALE, NO_PROGRESS, ASK_ADMIT, ASK_VICTIM, ASK_END_SCHEDULE, ASK_COST, EXCEEDS_POOL,
    EXCEEDS_TOKEN_BUDGET, KV_EXCEEDS_POOL, PREEMPTED_REJECTED, R_K, R_BATCH, R_PREFILL, R_DECODE, R_RUNNING,
    R_WAITING, R_SWAPPED, R_PREEMPTED, R_USED, R_RESERVED, R_FREE, R_CPU, R_MOVED, R_CACHED, R_SHARED_SAVED)
from .state import ABORTED, CAPPED, PREEMPTED, RUNNING, STOPPED, SWAPPED

_jit = njit(nogil=True, inline="always")
_ceil_div = _jit(ceil_div)  # kvlab's one ceiling division, compiled

_LIMIT = 1 << 62  # products of the compiled rules stay below it, or the question goes to Python


@_jit
def _pages_of(tokens, bs, shift):  # pragma: no cover (compiled)
    """Pages holding ``tokens >= 0`` tokens: a shift when ``bs == 1 << shift`` (no division), else ceil division.

    Helpers inlined in the per-request loops take scalars: an array argument costs reference counts.
    """
    if shift >= 0:
        return (tokens + bs - 1) >> shift
    return _ceil_div(tokens, bs)


@_jit
def _promised(res_r, used_r):  # pragma: no cover (compiled)
    """Pages a request promises: the larger of its reservation and its used pages."""
    return max(res_r, used_r)


@_jit
def _remaining_of(prompt, gen, comp):  # pragma: no cover (compiled)
    """Tokens to compute before the request's next output token."""
    return prompt + gen - comp


@_jit
def _is_decoding_of(prompt, gen, comp):  # pragma: no cover (compiled)
    """Has produced a token and has its whole context cached."""
    return gen > 0 and prompt + gen - comp == 1


@_jit
def _answer(S):  # pragma: no cover (compiled)
    """Python's answer to the question the loop stopped at (consumed)."""
    S[HAS_ANSWER] = 0
    return S[ANSWER]


# ------------------------------------------------------------------ the waiting queue: FCFS ring, or a heap by rank
@_jit
def _sift_down(wq, n, Fct, i):  # pragma: no cover (compiled)
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and Fct[wq[c + 1], F_RANK] < Fct[wq[c], F_RANK]:
            c += 1
        if Fct[wq[c], F_RANK] >= Fct[wq[i], F_RANK]:
            return
        wq[i], wq[c] = wq[c], wq[i]
        i = c


@_jit
def _push_waiting(r, front, S, C, Fct, wq):  # pragma: no cover (compiled)
    """``r`` joins the waiting queue: at the back (arrival) or front (preempted), or by its rank."""
    n = S[WQ_LEN]
    if C[ORDERED]:
        wq[n] = r
        while n > 0 and Fct[wq[(n - 1) // 2], F_RANK] > Fct[wq[n], F_RANK]:
            wq[n], wq[(n - 1) // 2] = wq[(n - 1) // 2], wq[n]
            n = (n - 1) // 2
    elif front:
        S[WQ_HEAD] = (S[WQ_HEAD] - 1) % wq.shape[0]
        wq[S[WQ_HEAD]] = r
    else:
        wq[(S[WQ_HEAD] + n) % wq.shape[0]] = r
    S[WQ_LEN] += 1


@_jit
def _pop_waiting(S, C, Fct, wq):  # pragma: no cover (compiled)
    """Remove the front of the waiting queue (``wq[S[WQ_HEAD]]``)."""
    S[WQ_LEN] -= 1
    if C[ORDERED]:
        wq[0] = wq[S[WQ_LEN]]
        _sift_down(wq, S[WQ_LEN], Fct, 0)
    else:
        S[WQ_HEAD] = (S[WQ_HEAD] + 1) % wq.shape[0]


# ------------------------------------------------------------------ state changes
@_jit
def _abort(r, code, S, F, Q, T, E):  # pragma: no cover (compiled)
    """Abort ``r`` (it holds no GPU pages any more) at the start of this iteration."""
    Q[r, STATUS] = ABORTED
    Q[r, ABORT] = code
    E[r, FIN_ITER], T[r, FIN_S] = S[K], F[START]
    S[NABORTED] += 1


@_jit
def _release(r, S, C, Q, pg, blk, rb):  # pragma: no cover (compiled)
    """Free ``r``'s GPU pages (used and promised); under prefix caching, those no other request holds."""
    if C[CACHING]:
        freed, cached = px.release(r, Q[r, USED], C[NUM_PAGES], pg, blk, rb)
        S[COMMITTED] -= max(0, Q[r, RES] - Q[r, USED]) + freed
        S[USED_PAGES] -= freed
        S[TABLE] -= Q[r, USED]
        S[CACHED_FREE] += cached
    else:
        S[COMMITTED] -= _promised(Q[r, RES], Q[r, USED])
        S[USED_PAGES] -= Q[r, USED]
    Q[r, RES] = Q[r, USED] = 0


@_jit
def _release_finishing(S, C, Q, fin, pg, blk, rb):  # pragma: no cover (compiled)
    """Async scheduling: the previous iteration's finished requests give back their pages and slots."""
    for i in range(S[NFIN]):
        _release(fin[i], S, C, Q, pg, blk, rb)
    S[NFIN] = 0


@_jit
def _take_new(r, count, S, C, Q, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Under prefix caching: ``count`` new pages for ``r``'s table, from the free queue (before ``Q[r, USED]`` grows)."""
    S[CACHED_FREE] -= px.take_pages(r, Q[r, USED], count, C[NUM_PAGES], pg, page_of, blk, rb)
    S[TABLE] += count


@_jit
def _take_hits(r, hit, S, C, Q, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """``r`` (admitted, holding nothing) starts with its ``hit`` cached blocks and skips their tokens."""
    taken = px.take_hits(r, hit, pg, page_of, blk, rb)
    S[USED_PAGES] += taken
    S[COMMITTED] += taken
    S[CACHED_FREE] -= taken
    S[TABLE] += hit
    Q[r, USED] = hit
    Q[r, COMP] = hit * C[BLOCK_SIZE]
    Q[r, SAVED] += Q[r, COMP]
    if Q[r, NPRE] == 0:
        Q[r, HIT] = Q[r, COMP]


@_jit
def _remove(r, S, lst, count):  # pragma: no cover (compiled)
    """Remove ``r`` from ``lst[:S[count]]`` keeping the order; its position, or -1."""
    n = S[count]
    for j in range(n):
        if lst[j] == r:
            for i in range(j, n - 1):
                lst[i] = lst[i + 1]
            S[count] = n - 1
            return j
    return -1


@_jit
def _allocate(r, chunk, S, C, Q, sched_ids, sched_chunk, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Pages for ``r``'s chunk (beyond its reservation they are promised too); ``r`` joins the iteration.

    Under prefix caching the blocks the chunk fills enter the cache.
    """
    need = _pages_of(Q[r, COMP] + chunk, C[BLOCK_SIZE], C[SHIFT])
    if need > Q[r, USED]:
        S[COMMITTED] += _promised(Q[r, RES], need) - _promised(Q[r, RES], Q[r, USED])
        S[USED_PAGES] += need - Q[r, USED]
        if C[CACHING]:
            _take_new(r, need - Q[r, USED], S, C, Q, pg, page_of, blk, rb)
        Q[r, USED] = need
    if C[CACHING]:
        px.cache_blocks(r, (Q[r, COMP] + chunk) // C[BLOCK_SIZE], pg, page_of, blk, rb)
    Q[r, MAX_USED] = max(Q[r, MAX_USED], Q[r, USED])
    Q[r, MAX_RES] = max(Q[r, MAX_RES], Q[r, RES])
    sched_ids[S[NSCHED]] = r
    sched_chunk[S[NSCHED]] = chunk
    S[NSCHED] += 1
    S[BUDGET] -= chunk


@_jit
def _preempt(v, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, wq, sw, stale, limbo, pg, blk,
             rb):  # pragma: no cover (compiled)
    """Preempt running request ``v``: recompute, swap or reject (``preemption_mode``)."""
    _remove(v, S, run, NRUN)
    j = _remove(v, S, sched_ids, NSCHED)  # a victim already scheduled in this iteration is unscheduled first
    if j >= 0:
        S[BUDGET] += sched_chunk[j]
        for i in range(j, S[NSCHED]):
            sched_chunk[i] = sched_chunk[i + 1]
    S[NPREEMPTED] += 1
    Q[v, NPRE] += 1
    kv_pages = _pages_of(Q[v, COMP], C[BLOCK_SIZE], C[SHIFT])
    _release(v, S, C, Q, pg, blk, rb)
    if C[MODE] == MODE_REJECT:
        _abort(v, PREEMPTED_REJECTED, S, F, Q, T, E)
        return
    if Q[v, GEN] != Fct[v, F_GEN]:  # the policy's answers about it change with its generated tokens
        stale[S[NSTALE]] = v
        S[NSTALE] += 1
    if C[MODE] == MODE_SWAP and kv_pages <= C[CPU_POOL] - S[CPU_USED]:
        Q[v, STATUS], Q[v, CPU] = SWAPPED, kv_pages
        Q[v, NSWAP] += 1
        S[CPU_USED] += kv_pages
        S[SWAP_PAGES] += kv_pages
        S[SW_HEAD] = (S[SW_HEAD] - 1) % sw.shape[0]
        sw[S[SW_HEAD]] = v
        S[SW_LEN] += 1
        return
    Q[v, STATUS], Q[v, COMP] = PREEMPTED, 0
    if C[ORDERED]:  # it joins the heap next iteration, by the rank asked again for it
        limbo[S[NLIMBO]] = v
        S[NLIMBO] += 1
    else:
        _push_waiting(v, True, S, C, Fct, wq)


# ------------------------------------------------------------------ asking the policy
@_jit
def _future_charge(r, shared, S, C, Q, Fct, run):  # pragma: no cover (compiled)
    """Admission charged with the running requests' estimated future tokens x ratio (1 yes, 0 no, -1 ask)."""
    future = min(C[MAX_NEW] - Q[r, GEN], C[CLIP])
    for j in range(S[NRUN]):
        future += min(C[MAX_NEW] - Q[run[j], GEN], C[CLIP])
    if S[STATE0] > 0 and future > _LIMIT // S[STATE0]:
        return -1
    charge = _ceil_div(future * S[STATE0], S[STATE1])
    return 1 if Fct[r, F_RES_TOKENS] + charge <= (C[NUM_PAGES] - S[COMMITTED] + shared) * C[BLOCK_SIZE] else 0


@_jit
def _can_admit(r, shared, S, C, Q, Fct, run):  # pragma: no cover (compiled)
    """Whether ``r`` may be admitted with something running: 1 yes, 0 no, -1 the question is for Python.

    The free pages it is asked with are the unpromised ones plus ``shared``, its prefix-cache hit
    pages other requests hold.
    """
    if S[HAS_ANSWER]:
        return _answer(S)
    ok = -1
    if C[ADMISSION] == OWN_PAGES:
        ok = 1 if Fct[r, F_ADM_PAGES] <= C[NUM_PAGES] - S[COMMITTED] + shared else 0
    elif C[ADMISSION] == FUTURE_CHARGE:
        ok = _future_charge(r, shared, S, C, Q, Fct, run)
    if ok < 0:
        S[ASK_R], S[ASK_FREE] = r, C[NUM_PAGES] - S[COMMITTED] + shared
    return ok


@_jit
def _victim(S, C, run):  # pragma: no cover (compiled)
    """The running request to preempt, or -1 when the question is for Python."""
    if S[HAS_ANSWER]:
        return run[_answer(S)]
    return run[S[NRUN] - 1] if C[VICTIM] == NEWEST else -1


@_jit
def _ratio_decay(S, C):  # pragma: no cover (compiled)
    """ratio = max(floor, ratio - step) on exact fractions; False when the products would overflow."""
    a, b, c, d = S[STATE0], S[STATE1], C[STEP_NUM], C[STEP_DEN]
    if (a > 0 and d > _LIMIT // a) or (c > 0 and b > _LIMIT // c) or b > _LIMIT // d:
        return False
    num, den = a * d - c * b, b * d
    g = np.gcd(num, den)
    num, den = num // g, den // g
    if num > _LIMIT // C[FLOOR_DEN] or C[FLOOR_NUM] > _LIMIT // den:
        return False
    if num * C[FLOOR_DEN] < C[FLOOR_NUM] * den:
        num, den = C[FLOOR_NUM], C[FLOOR_DEN]
    S[STATE0], S[STATE1] = num, den
    return True


@_jit
def _end_schedule(S, C):  # pragma: no cover (compiled)
    """The policy's per-iteration update after scheduling: compiled, none, or asked."""
    if C[STATE_RULE] == NO_STATE:
        return CONTINUE
    if S[HAS_ANSWER]:
        _answer(S)
        return CONTINUE
    if C[STATE_RULE] == RATIO_DECAY and (S[NPREEMPTED] == 0 or S[NRUN] == 0) and _ratio_decay(S, C):
        return CONTINUE
    return ASK_END_SCHEDULE


# ------------------------------------------------------------------ scheduling phases
@_jit
def _begin(S, F, C, Q, Fct, order, arrival, wq, limbo, fin, R, pg, blk, rb):  # pragma: no cover (compiled)
    """Arrivals join the waiting queue; the clock jumps over idle gaps; a new iteration starts.

    Async scheduling while busy (``F[PREV_START] >= 0`` and a request running or swapped): the
    iteration is scheduled at ``F[PREV_START]``, so only arrivals up to then join, and the previous
    iteration's finished requests keep their pages and slots until it is scheduled; otherwise they
    are released first.
    """
    n = order.shape[0]
    for i in range(S[NLIMBO]):
        _push_waiting(limbo[i], True, S, C, Fct, wq)
    S[NLIMBO] = 0
    lagged = F[PREV_START] >= 0.0 and (S[NRUN] > 0 or S[SW_LEN] > 0)
    if not lagged:
        _release_finishing(S, C, Q, fin, pg, blk, rb)
    visible = F[PREV_START] if lagged else F[NOW]
    while True:
        while S[ARRIVED] < n and arrival[S[ARRIVED]] <= visible:
            _push_waiting(order[S[ARRIVED]], False, S, C, Fct, wq)
            S[ARRIVED] += 1
        if S[WQ_LEN] or S[NRUN] or S[SW_LEN]:
            break
        if C[AS_RANK]:  # a data-parallel rank: its group moves the clock and routes the arrivals
            F[PREV_START] = -1.0
            return RANK_IDLE
        if S[ARRIVED] == n:
            return DONE
        F[NOW] = visible = arrival[S[ARRIVED]]
        F[PREV_START] = -1.0
    if S[NROWS] == R.shape[1]:
        return ROWS_FULL
    F[START] = F[NOW]
    S[BUDGET] = C[MNBT]
    S[JOINED_LAST], S[JOINED], S[ADMIT_BUSY] = S[JOINED], 0, 0
    S[NSCHED] = S[NPREEMPTED] = S[SWAP_PAGES] = S[NABORTED] = 0
    S[CURSOR], S[CUR_R] = -1, -1
    S[STAGE] = RUNNING_PHASE if S[SW_LEN] else WHOLE if C[SCHED] == SCHED_PREFILL_FIRST \
        else PREFILLS_PHASE if C[SCHED] == SCHED_PREFILL_FIRST_CHUNKED else RUNNING_PHASE
    return CONTINUE


@_jit
def _start_running(r, swapped, res, S, F, Q, T, E, run):  # pragma: no cover (compiled)
    """``r`` (off its queue) runs: its reservation of ``res`` pages, its KV back from the CPU pool if swapped."""
    Q[r, STATUS] = RUNNING
    if E[r, ADM_ITER] < 0:
        E[r, ADM_ITER], T[r, ADM_S] = S[K], F[START]
    Q[r, RES] = res  # it holds no GPU pages yet, or only its prefix-cache hits (counted)
    if swapped:
        Q[r, USED] = Q[r, CPU]
        S[USED_PAGES] += Q[r, CPU]
        S[SWAP_PAGES] += Q[r, CPU]
        Q[r, CPU] = 0
        S[COMMITTED] += _promised(Q[r, RES], Q[r, USED])
    else:
        S[COMMITTED] += _promised(Q[r, RES], Q[r, USED]) - Q[r, USED]
    run[S[NRUN]] = r
    S[NRUN] += 1


@_jit
def _admit_waiting(whole, S, F, C, Q, Fct, T, E, wq, run, sched_ids, sched_chunk, pg, page_of, blk,
                   rb):  # pragma: no cover (compiled)
    """Admit from the front of the waiting queue until one does not fit (head-of-line blocking).

    Under prefix caching a request's hit (at most ``(prompt + generated - 1) // block_size``
    blocks) is matched before each check and taken on admission.
    """
    while S[WQ_LEN] > 0 and S[NRUN] + S[NFIN] < C[MAX_SEQS] and S[BUDGET] > 0:
        r = wq[S[WQ_HEAD]]  # (0 for the heap)
        if not Fct[r, F_FITS]:
            _pop_waiting(S, C, Fct, wq)
            _abort(r, EXCEEDS_POOL, S, F, Q, T, E)
            continue
        hit = shared = 0
        if C[CACHING]:
            hit, shared = px.match(r, (Q[r, PROMPT] + Q[r, GEN] - 1) // C[BLOCK_SIZE], pg, page_of, blk, rb)
        rem = _remaining_of(Q[r, PROMPT], Q[r, GEN], Q[r, COMP]) - hit * C[BLOCK_SIZE]
        if whole and rem > C[MNBT]:
            _pop_waiting(S, C, Fct, wq)
            _abort(r, EXCEEDS_TOKEN_BUDGET, S, F, Q, T, E)
            continue
        if whole and rem > S[BUDGET]:
            break
        first = _pages_of(hit * C[BLOCK_SIZE] + min(rem, S[BUDGET]), C[BLOCK_SIZE], C[SHIFT])  # (V1's admission)
        if S[NRUN] + S[NFIN] > 0:
            if C[FIRST_CHUNK]:
                ok = 1 if first <= C[NUM_PAGES] - S[COMMITTED] + shared else 0
            else:
                ok = _can_admit(r, shared, S, C, Q, Fct, run)
            if ok < 0:
                return ASK_ADMIT
            if ok == 0:
                break
        _pop_waiting(S, C, Fct, wq)
        S[JOINED] |= S[ADMIT_BUSY]
        if hit:
            _take_hits(r, hit, S, C, Q, pg, page_of, blk, rb)
        _start_running(r, False, first if C[FIRST_CHUNK] else Fct[r, F_RES_PAGES], S, F, Q, T, E, run)
        _allocate(r, min(rem, S[BUDGET]), S, C, Q, sched_ids, sched_chunk, pg, page_of, blk, rb)
    return CONTINUE


@_jit
def _resume_swapped(S, F, C, Q, Fct, T, E, sw, run, sched_ids, sched_chunk, pg, page_of, blk,
                    rb):  # pragma: no cover (compiled)
    """Swap requests back in from the front of the swapped queue (FCFS) until one does not fit."""
    while S[SW_LEN] > 0 and S[NRUN] + S[NFIN] < C[MAX_SEQS] and S[BUDGET] > 0:
        r = sw[S[SW_HEAD]]
        if Fct[r, F_FITS] and S[NRUN] + S[NFIN] > 0:
            ok = _can_admit(r, 0, S, C, Q, Fct, run)
            if ok < 0:
                return ASK_ADMIT
            if ok == 0:
                break
        S[SW_HEAD] = (S[SW_HEAD] + 1) % sw.shape[0]
        S[SW_LEN] -= 1
        S[CPU_USED] -= Q[r, CPU]
        if not Fct[r, F_FITS]:
            Q[r, CPU] = 0
            _abort(r, EXCEEDS_POOL, S, F, Q, T, E)
            continue
        _start_running(r, True, Fct[r, F_RES_PAGES], S, F, Q, T, E, run)
        _allocate(r, min(_remaining_of(Q[r, PROMPT], Q[r, GEN], Q[r, COMP]), S[BUDGET]), S, C, Q, sched_ids,
                  sched_chunk, pg, page_of, blk, rb)
    return CONTINUE


@_jit
def _preempt_until_fits(r, chunk, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, wq, sw, stale, limbo, pg,
                        blk, rb):  # pragma: no cover (compiled)
    """Make room for ``r``'s chunk: 1 it fits, 0 ``r`` was preempted or aborted, -1 ask for a victim."""
    need = _pages_of(Q[r, COMP] + chunk, C[BLOCK_SIZE], C[SHIFT])
    beyond = need - _promised(Q[r, RES], Q[r, USED])
    if beyond <= 0:
        return 1
    if not C[ON_DEMAND]:
        _preempt(r, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, wq, sw, stale, limbo, pg, blk, rb)
        return 0
    while beyond > C[NUM_PAGES] - S[COMMITTED]:
        victim = _victim(S, C, run)
        if victim < 0:
            return -1
        if victim == r and S[NRUN] == 1:
            S[NRUN] = 0
            _release(r, S, C, Q, pg, blk, rb)
            _abort(r, KV_EXCEEDS_POOL, S, F, Q, T, E)
            return 0
        _preempt(victim, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, wq, sw, stale, limbo, pg, blk, rb)
        if victim == r:
            return 0
    S[COMMITTED] += _promised(need, Q[r, USED]) - _promised(Q[r, RES], Q[r, USED])
    Q[r, RES] = need
    return 1


@_jit
def _snapshot(S, Q, run, snap):  # pragma: no cover (compiled)
    """The running requests in the order they are scheduled: decodes in ``snap[:half]``, the others after."""
    half, num_dec, num_other = snap.shape[0] // 2, 0, 0
    for j in range(S[NRUN]):
        r = run[j]
        if _is_decoding_of(Q[r, PROMPT], Q[r, GEN], Q[r, COMP]):
            snap[num_dec] = r
            num_dec += 1
        else:
            snap[half + num_other] = r
            num_other += 1
    S[NUM_DEC], S[NUM_OTHER], S[CURSOR] = num_dec, num_other, 0


@_jit
def _schedule_running(decodes, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, snap, wq, sw, stale, limbo, pg,
                      page_of, blk, rb):  # pragma: no cover (compiled)
    """Running requests take ``min(remaining, budget left)`` tokens: decodes first (none unless ``decodes``),
    each in admission order.

    A chunk within the request's promised pages is scheduled on local counters (the common case);
    one that needs more goes through :func:`_preempt_until_fits` on the state in ``S``.
    """
    if S[CURSOR] < 0:
        _snapshot(S, Q, run, snap)
        if not decodes:
            S[CURSOR] = S[NUM_DEC]
    half, num_dec, total = snap.shape[0] // 2, S[NUM_DEC], S[NUM_DEC] + S[NUM_OTHER]
    i, budget, nsched, num_used = S[CURSOR], S[BUDGET], S[NSCHED], S[USED_PAGES]
    while i < total:
        r = snap[i] if i < num_dec else snap[half + i - num_dec]
        if S[CUR_R] != r:  # a new request (not one resumed after asking for a victim)
            if Q[r, STATUS] != RUNNING:  # preempted as a victim earlier in this loop
                i += 1
                continue
            if budget == 0:
                break
            chunk = min(_remaining_of(Q[r, PROMPT], Q[r, GEN], Q[r, COMP]), budget)
            need = _pages_of(Q[r, COMP] + chunk, C[BLOCK_SIZE], C[SHIFT])
            if need <= _promised(Q[r, RES], Q[r, USED]):  # no page beyond its promise: nothing to preempt
                if need > Q[r, USED]:
                    num_used += need - Q[r, USED]
                    if C[CACHING]:
                        _take_new(r, need - Q[r, USED], S, C, Q, pg, page_of, blk, rb)
                    Q[r, USED] = need
                    Q[r, MAX_USED] = max(Q[r, MAX_USED], need)
                if C[CACHING]:
                    px.cache_blocks(r, (Q[r, COMP] + chunk) // C[BLOCK_SIZE], pg, page_of, blk, rb)
                sched_ids[nsched], sched_chunk[nsched] = r, chunk
                nsched += 1
                budget -= chunk
                i += 1
                continue
            S[CUR_R], S[CUR_CHUNK] = r, chunk
        S[CURSOR], S[BUDGET], S[NSCHED], S[USED_PAGES] = i, budget, nsched, num_used
        fits = _preempt_until_fits(r, S[CUR_CHUNK], S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, wq, sw,
                                   stale, limbo, pg, blk, rb)
        if fits < 0:
            return ASK_VICTIM
        if fits:
            _allocate(r, S[CUR_CHUNK], S, C, Q, sched_ids, sched_chunk, pg, page_of, blk, rb)
        S[CUR_R] = -1
        i, budget, nsched, num_used = S[CURSOR] + 1, S[BUDGET], S[NSCHED], S[USED_PAGES]
    S[CURSOR], S[BUDGET], S[NSCHED], S[USED_PAGES] = i, budget, nsched, num_used
    return CONTINUE


@_jit
def _decode_unless_scheduled(S):  # pragma: no cover (compiled)
    """prefill_first_chunked: the stage after its prefill phases: the schedule's end when they scheduled work,
    else the running phase from a fresh snapshot (every decode)."""
    if S[NSCHED] > 0:
        return END_SCHEDULE
    S[CURSOR], S[CUR_R] = -1, -1
    return RUNNING_PHASE


# ------------------------------------------------------------------ running an iteration
@_jit
def _cost_s(S, F, num_tokens, pairs, kv):  # pragma: no cover (compiled)
    """The iteration's compute time (seconds) once answered, else -1.0 with the question in ``S``."""
    if S[HAS_ANSWER]:
        S[HAS_ANSWER] = 0
        return F[ANSWER_S]
    S[ASK_TOKENS], S[ASK_PAIRS], S[ASK_KV] = num_tokens, pairs, kv
    return -1.0


@_jit
def _execute(S, F, C, page_copy_s, Q, T, E, run, sched_ids, sched_chunk, fin, R, RT, pg, blk,
             rb):  # pragma: no cover (compiled)
    """Price the iteration, compute its chunks, finish requests, write its row (async scheduling: the
    previous iteration's finished requests are released first, this one's held for the next schedule)."""
    _release_finishing(S, C, Q, fin, pg, blk, rb)
    nsched = S[NSCHED]
    if nsched == 0 and S[NABORTED] == 0 and (S[IDLE] or S[NPREEMPTED] == 0):
        return NO_PROGRESS
    num_tokens = pairs = kv = decode_tokens = 0
    for i in range(nsched):
        r, c = sched_ids[i], sched_chunk[i]
        num_tokens += c
        pairs += c * Q[r, COMP] + c * (c + 1) // 2
        kv += Q[r, COMP] + c
        decode_tokens += _is_decoding_of(Q[r, PROMPT], Q[r, GEN], Q[r, COMP])
    duration = S[SWAP_PAGES] * page_copy_s
    if num_tokens > 0 or C[AS_RANK]:  # a data-parallel rank is answered its group's whole duration
        cost = _cost_s(S, F, num_tokens, pairs, kv)
        if cost < 0.0:
            return ASK_COST
        duration = cost if C[AS_RANK] else duration + cost
    start, k = F[START], S[K]
    end = start + duration
    pages_used, pages_reserved = S[USED_PAGES], S[COMMITTED]
    pages_cached, pages_shared_saved = S[CACHED_FREE], S[TABLE] - S[USED_PAGES]
    finished = 0
    for i in range(nsched):  # each caches its chunk; a complete context gives its next token (inline: hot)
        r = sched_ids[i]
        Q[r, COMP] += sched_chunk[i]
        if Q[r, COMP] < Q[r, PROMPT] + Q[r, GEN]:
            continue
        Q[r, GEN] += 1
        if Q[r, GEN] == 1:
            E[r, FT_ITER], T[r, FT_S] = k, end
        elif np.isnan(T[r, MAX_TBT]) or end - T[r, LAST_S] > T[r, MAX_TBT]:
            T[r, MAX_TBT] = end - T[r, LAST_S]
        T[r, LAST_S] = end
        if Q[r, GEN] < Q[r, TARGET]:
            continue
        Q[r, STATUS] = CAPPED if Q[r, OUTPUT] > Q[r, TARGET] else STOPPED
        E[r, FIN_ITER], T[r, FIN_S] = k, end
        if C[ASYNC]:
            fin[S[NFIN]] = r
            S[NFIN] += 1
        else:
            _release(r, S, C, Q, pg, blk, rb)
        finished += 1
    if finished > 0:
        j = 0
        for i in range(S[NRUN]):
            if Q[run[i], STATUS] == RUNNING:
                run[j] = run[i]
                j += 1
        S[NRUN] = j
    n = S[NROWS]  # the row: the summary's columns always, the others when asked (rows never written cost no memory)
    R[R_BATCH, n], R[R_DECODE, n], R[R_USED, n], R[R_RESERVED, n] = nsched, decode_tokens, pages_used, pages_reserved
    RT[0, n], RT[1, n] = start, duration
    if C[CACHING]:
        R[R_CACHED, n], R[R_SHARED_SAVED, n] = pages_cached, pages_shared_saved
    if C[EVERY_COLUMN]:
        R[R_K, n], R[R_PREFILL, n], R[R_RUNNING, n] = k, num_tokens - decode_tokens, S[NRUN]
        R[R_WAITING, n], R[R_SWAPPED, n], R[R_PREEMPTED, n] = S[WQ_LEN] + S[NLIMBO], S[SW_LEN], S[NPREEMPTED]
        R[R_FREE, n], R[R_CPU, n], R[R_MOVED, n] = C[NUM_PAGES] - pages_reserved, S[CPU_USED], S[SWAP_PAGES]
    S[NROWS] = n + 1
    S[IDLE] = 1 if nsched == 0 and S[NABORTED] == 0 else 0
    F[NOW] = end
    F[PREV_START] = start if C[ASYNC] else -1.0
    S[K] = k + 1
    S[STAGE] = BETWEEN
    return STALE if S[NSTALE] > 0 else CONTINUE


# The phases run without reference counting (``_nrt=False``, a Numba option since 0.4x): they allocate
# nothing, and counting their arrays' references at every inlined phase cost more than the rest of an
# iteration (atomic increments: the loop ran 3-5x slower with them). The cost model's compiled
# ``iteration_s`` may allocate (``np.interp``), so :func:`run_loop`, with reference counting, prices
# each iteration between two calls of :func:`_iterate`.
@njit(nogil=True, _nrt=False)
def _iterate(S, F, C, page_copy_s, Q, Fct, T, E, order, arrival, wq, sw, run, sched_ids, sched_chunk, snap, stale,
             limbo, fin, R, RT, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Run the phases until a question or event; return its code."""
    while True:
        stage = S[STAGE]
        if stage == BETWEEN:
            ev = _begin(S, F, C, Q, Fct, order, arrival, wq, limbo, fin, R, pg, blk, rb)
        elif stage == WHOLE:
            ev = _admit_waiting(True, S, F, C, Q, Fct, T, E, wq, run, sched_ids, sched_chunk, pg, page_of, blk, rb)
            S[STAGE] = stage if ev != CONTINUE else RUNNING_PHASE if S[NSCHED] == 0 else END_SCHEDULE
        elif stage == RUNNING_PHASE:
            ev = _schedule_running(True, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, snap, wq, sw, stale,
                                   limbo, pg, page_of, blk, rb)
            S[STAGE] = stage if ev != CONTINUE else SWAPPED_PHASE if S[NPREEMPTED] == 0 else END_SCHEDULE
        elif stage == SWAPPED_PHASE:
            ev = _resume_swapped(S, F, C, Q, Fct, T, E, sw, run, sched_ids, sched_chunk, pg, page_of, blk, rb)
            if ev == CONTINUE:
                S[ADMIT_BUSY] = 1 if S[NRUN] + S[NFIN] > 0 else 0
                S[STAGE] = CHUNKED if S[SW_LEN] == 0 and (
                    C[SCHED] == SCHED_CHUNKED or C[SCHED] == SCHED_MIXED_WHOLE or C[SCHED] == SCHED_CHUNKED_ALTERNATING
                    and not (S[JOINED_LAST] and S[ADMIT_BUSY])) else END_SCHEDULE
        elif stage == PREFILLS_PHASE:  # prefill_first_chunked: partial prefills, then admissions, no decode
            ev = _schedule_running(False, S, F, C, Q, Fct, T, E, run, sched_ids, sched_chunk, snap, wq, sw, stale,
                                   limbo, pg, page_of, blk, rb)
            if ev == CONTINUE:
                S[STAGE] = PREFILL_ADMIT if S[NPREEMPTED] == 0 else _decode_unless_scheduled(S)
        elif stage == PREFILL_ADMIT:
            ev = _admit_waiting(False, S, F, C, Q, Fct, T, E, wq, run, sched_ids, sched_chunk, pg, page_of, blk, rb)
            if ev == CONTINUE:
                S[STAGE] = _decode_unless_scheduled(S)
        elif stage == CHUNKED:  # admissions beside the decodes: chunked, or whole prompts (mixed_whole)
            ev = _admit_waiting(C[SCHED] == SCHED_MIXED_WHOLE, S, F, C, Q, Fct, T, E, wq, run, sched_ids, sched_chunk, pg,
                                page_of, blk, rb)
            S[STAGE] = stage if ev != CONTINUE else END_SCHEDULE
        elif stage == END_SCHEDULE:
            ev = _end_schedule(S, C)
            S[STAGE] = stage if ev != CONTINUE else EXECUTE
        else:
            ev = _execute(S, F, C, page_copy_s, Q, T, E, run, sched_ids, sched_chunk, fin, R, RT, pg, blk, rb)
        if ev != CONTINUE:
            return ev


@njit(nogil=True)
def run_loop(S, F, C, page_copy_s, cost_kind, cost_params, Q, Fct, T, E, order, arrival, wq, sw, run, sched_ids,
             sched_chunk, snap, stale, limbo, fin, R, RT, pg, page_of, blk, rb):  # pragma: no cover (compiled)
    """Run iterations until an event; return its code (see the module note). Arrays are mutated in place.

    ``order`` lists request ids in arrival order (ties by row) and ``arrival`` their arrival times
    in that same order (seconds, non-decreasing). ``pg``, ``page_of``, ``blk``, ``rb`` are the
    prefix cache's pool (:mod:`.prefix`; stand-ins unless ``C[CACHING]``). A cost model with a compiled form
    (``cost_kind != COST_ASK``) is priced here; any other question goes back to Python.
    """
    while True:
        ev = _iterate(S, F, C, page_copy_s, Q, Fct, T, E, order, arrival, wq, sw, run, sched_ids, sched_chunk, snap,
                      stale, limbo, fin, R, RT, pg, page_of, blk, rb)
        if ev != ASK_COST or cost_kind == COST_ASK:
            return ev
        F[ANSWER_S] = iteration_s(cost_kind, cost_params, S[ASK_TOKENS], S[ASK_PAIRS], S[ASK_KV], S[NSCHED])
        S[HAS_ANSWER] = 1
