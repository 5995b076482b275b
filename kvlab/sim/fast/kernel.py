"""The compiled loop: the reference engine's rules, one request at a time, compiled by Numba.

Written by hand because no library simulates a serving loop: it is a line-by-line port of
:mod:`kvlab.sim.reference` (read its top-of-file note for the rules) onto integer and float
arrays, so that Numba compiles it to machine code. The policy and the cost model are not
called from inside: the policy's rules arrive as per-request answers (reservation pages,
admission pages, whether the request fits an empty pool), valid for the request's generated
tokens when they were asked; the cost model arrives as constants for
:func:`kvlab.costmodel.compiled.iteration_s`.

The loop stops and returns an event code when Python must act, with every scalar of its state
saved in ``S`` and ``F`` so that the next call resumes where it stopped (always between two
iterations):

* ``DONE``: every request has finished;
* ``ROWS_FULL``: the iteration-row buffer is full (the caller hands it back doubled);
* ``STALE``: requests were preempted after generating tokens, so the policy must be asked
  again about them (ids in ``stale[:S[NSTALE]]``) before any can be readmitted; a preempted
  request is never readmitted in the iteration that preempted it;
* ``NO_PROGRESS``: the iteration at ``S[K]`` computes nothing (the reference's livelock error).

Only the default victim rule (the newest running request) is compiled; the engine routes other
policies to the array engine.
"""
from __future__ import annotations

from ..._numba_cache import njit  # first: it gives Numba a writable cache folder, keyed on the sources
import numpy as np

from ..._intmath import ceil_div
from ...costmodel.compiled import iteration_s
from .state import ABORT_REASONS, ABORTED, CAPPED, PREEMPTED, RUNNING, STOPPED, SWAPPED

_ceil_div = njit(nogil=True, inline="always")(ceil_div)  # kvlab's one ceiling division, compiled

# ---- scalar state: S (int64) and F (float64) slots
K, ARRIVED, COMMITTED, USED_PAGES, CPU_USED, IDLE, NROWS, WQ_HEAD, WQ_LEN, SW_HEAD, SW_LEN, NRUN, NSTALE = range(13)
NUM_INT_STATE = 13
NOW = 0
# ---- configuration: C (int64)
BLOCK_SIZE, NUM_PAGES, MNBT, MAX_SEQS, PREFILL_FIRST, ON_DEMAND, MODE, CPU_POOL = range(8)
MODE_RECOMPUTE, MODE_SWAP, MODE_REJECT = 0, 1, 2
# ---- per-request state: Q (int64 columns, one row per request; the fields an iteration touches
# share a cache line or two) and T (float64: the last token's time and the largest token gap, seconds)
PROMPT, GEN, COMP, RES, USED, TARGET, MAX_USED, MAX_RES, STATUS, OUTPUT, CPU, NPRE, NSWAP, ABORT = range(14)
NUM_REQUEST_INTS = 16  # 14 used; rows of 128 bytes start on cache lines (large arrays are page-aligned)
LAST_S, MAX_TBT = 0, 1
# ---- events
DONE, ROWS_FULL, STALE, NO_PROGRESS = 0, 1, 2, 3
# ---- status codes and abort reasons: the array engine's (kvlab.sim.request.RequestStatus, state.ABORT_REASONS)
EXCEEDS_POOL, EXCEEDS_TOKEN_BUDGET, KV_EXCEEDS_POOL, PREEMPTED_REJECTED = (
    ABORT_REASONS.index(reason) for reason in ("exceeds_pool", "exceeds_token_budget", "kv_exceeds_pool",
                                               "preempted_rejected"))
# ---- iteration rows: R (int64, one row per column) and RT (start, duration)
R_K, R_BATCH, R_PREFILL, R_DECODE, R_RUNNING, R_WAITING, R_SWAPPED, R_PREEMPTED, R_USED, R_RESERVED, R_FREE, \
    R_CPU, R_MOVED = range(13)
NUM_ROW_INTS = 13


@njit(nogil=True, inline="always")
def _pages(tokens, bs, shift):  # pragma: no cover (compiled)
    """Pages holding ``tokens >= 0`` tokens: a shift when ``bs == 1 << shift`` (no division), else ceil division."""
    if shift >= 0:
        return (tokens + bs - 1) >> shift
    return _ceil_div(tokens, bs)


@njit(nogil=True, inline="always")
def _promised(res_r, used_r):  # pragma: no cover (compiled)
    """Pages a request promises: the larger of its reservation and its used pages."""
    return max(res_r, used_r)


@njit(nogil=True, inline="always")
def _allocated(need, res_r, used_r):  # pragma: no cover (compiled)
    """(promised pages added, used pages added) when a request holding ``res_r`` reserved and
    ``used_r`` used pages needs ``need`` pages (scalars: array arguments would cost reference counts)."""
    if need <= used_r:
        return 0, 0
    return _promised(res_r, need) - _promised(res_r, used_r), need - used_r


@njit(nogil=True, inline="always")
def _abort(r, code, k, start, Q, fin_iter, fin_s):  # pragma: no cover (compiled)
    Q[r, STATUS] = ABORTED
    Q[r, ABORT] = code
    fin_iter[r], fin_s[r] = k, start


@njit(nogil=True, inline="always")
def _preempt(v, k, start, mode, bs, shift, cpu_free, sched_ids, sched_chunk, nsched, Q, fin_iter, fin_s, facts_gen,
             stale, nstale):  # pragma: no cover (compiled)
    """Preempt running request ``v`` (already out of the running list).

    Returns (budget returned, scheduled count, promised pages freed, used pages freed, CPU pages
    taken, stale count, where it goes: 0 aborted, 1 swapped, 2 waiting).
    """
    back = 0
    for i in range(nsched):  # a victim already scheduled in this iteration is unscheduled first
        if sched_ids[i] == v:
            back = sched_chunk[i]
            for j in range(i, nsched - 1):
                sched_ids[j] = sched_ids[j + 1]
                sched_chunk[j] = sched_chunk[j + 1]
            nsched -= 1
            break
    freed_commit, freed_used = _promised(Q[v, RES], Q[v, USED]), Q[v, USED]
    Q[v, RES] = Q[v, USED] = 0
    Q[v, NPRE] += 1
    if mode == MODE_REJECT:
        _abort(v, PREEMPTED_REJECTED, k, start, Q, fin_iter, fin_s)
        return back, nsched, freed_commit, freed_used, 0, nstale, 0
    if Q[v, GEN] != facts_gen[v]:  # the policy's answers about it change with its generated tokens
        stale[nstale] = v
        nstale += 1
    kv_pages = _pages(Q[v, COMP], bs, shift)
    if mode == MODE_SWAP and kv_pages <= cpu_free:
        Q[v, STATUS] = SWAPPED
        Q[v, CPU] = kv_pages
        Q[v, NSWAP] += 1
        return back, nsched, freed_commit, freed_used, kv_pages, nstale, 1
    Q[v, STATUS] = PREEMPTED
    Q[v, COMP] = 0
    return back, nsched, freed_commit, freed_used, 0, nstale, 2


@njit(nogil=True)
def simulate_kernel(S, F, C, page_copy_s, cost_kind, cost_params, Q, T, order, arrival,
                    res_pages, adm_pages, fits, facts_gen, adm_iter, ft_iter, fin_iter, adm_s, ft_s, fin_s,
                    wq, sw, run, sched_ids, sched_chunk, snap, stale, R, RT):  # pragma: no cover (compiled)
    """Run iterations until an event; return its code (see the module note). Arrays are mutated in place.

    ``order`` lists request ids in arrival order (ties by row) and ``arrival`` their arrival times
    in that same order (seconds, non-decreasing): ``arrival[a]`` is request ``order[a]``'s.
    """
    n = Q.shape[0]
    bs, num_pages, mnbt, max_seqs = C[BLOCK_SIZE], C[NUM_PAGES], C[MNBT], C[MAX_SEQS]
    shift = -1
    if bs & (bs - 1) == 0:
        shift = 0
        while (1 << shift) < bs:
            shift += 1
    pf, on_demand, mode, cpu_pool = C[PREFILL_FIRST] != 0, C[ON_DEMAND] != 0, C[MODE], C[CPU_POOL]
    k, arrived, committed, num_used, cpu_used = S[K], S[ARRIVED], S[COMMITTED], S[USED_PAGES], S[CPU_USED]
    idle_before, nrows = S[IDLE] != 0, S[NROWS]
    wq_head, wq_len, sw_head, sw_len, nrun, nstale = S[WQ_HEAD], S[WQ_LEN], S[SW_HEAD], S[SW_LEN], S[NRUN], 0
    now = F[NOW]
    wcap, scap, rcap, half = wq.shape[0], sw.shape[0], R.shape[1], snap.shape[0] // 2
    event = DONE
    while arrived < n or wq_len > 0 or nrun > 0 or sw_len > 0:
        while arrived < n and arrival[arrived] <= now:  # arrivals join the back of the waiting queue
            wq[(wq_head + wq_len) % wcap] = order[arrived]
            wq_len += 1
            arrived += 1
        if wq_len == 0 and nrun == 0 and sw_len == 0:
            now = arrival[arrived]
            continue
        if nrows == rcap:
            event = ROWS_FULL
            break
        start = now
        budget = mnbt
        nsched = npreempted = swap_pages = naborted = 0
        # phases: 0 whole admissions (prefill_first), 1 running requests, 2 swapped, 3 chunked admissions
        for phase in range(4):
            if phase == 0 and not (pf and sw_len == 0):
                continue
            if (phase == 1 and nsched > 0) or (phase == 2 and npreempted > 0) or (phase == 3 and (sw_len > 0 or pf)):
                break
            swapped, whole = phase == 2, phase == 0
            num_dec = num_other = i = 0
            if phase == 1:  # decodes first, then the others, each in admission order
                for j in range(nrun):
                    r = run[j]
                    if Q[r, GEN] > 0 and Q[r, PROMPT] + Q[r, GEN] - Q[r, COMP] == 1:
                        snap[num_dec] = r  # decodes in snap[:half], the others in snap[half:]
                        num_dec += 1
                    else:
                        snap[half + num_other] = r
                        num_other += 1
            while True:  # one request per pass: decide its chunk and pages, then schedule it (shared tail)
                if phase == 1:  # running requests
                    if i == num_dec + num_other:
                        break
                    r = snap[i] if i < num_dec else snap[half + i - num_dec]
                    i += 1
                    if Q[r, STATUS] != RUNNING:
                        continue  # preempted as a victim earlier in this loop
                    if budget == 0:
                        break
                    rem = Q[r, PROMPT] + Q[r, GEN] - Q[r, COMP]
                    chunk = rem if rem < budget else budget
                    need = _pages(Q[r, COMP] + chunk, bs, shift)
                    beyond = need - max(Q[r, RES], Q[r, USED])
                    fits_now = beyond <= 0
                    while not fits_now:  # preempt until it fits (on demand) or preempt itself
                        if on_demand and beyond <= num_pages - committed:
                            committed += _promised(need, Q[r, USED]) - _promised(Q[r, RES], Q[r, USED])
                            Q[r, RES] = need
                            fits_now = True
                            break
                        victim = run[nrun - 1] if on_demand else r  # the newest running request
                        if victim == r and nrun == 1 and on_demand:
                            nrun = 0
                            committed -= _promised(Q[r, RES], Q[r, USED])
                            num_used -= Q[r, USED]
                            Q[r, RES] = Q[r, USED] = 0
                            _abort(r, KV_EXCEEDS_POOL, k, start, Q, fin_iter, fin_s)
                            naborted += 1
                            break
                        j = nrun - 1
                        while run[j] != victim:
                            j -= 1
                        for i2 in range(j, nrun - 1):
                            run[i2] = run[i2 + 1]
                        nrun -= 1
                        ev = _preempt(victim, k, start, mode, bs, shift, cpu_pool - cpu_used, sched_ids, sched_chunk,
                                      nsched, Q, fin_iter, fin_s, facts_gen, stale, nstale)
                        budget += ev[0]
                        nsched = ev[1]
                        committed -= ev[2]
                        num_used -= ev[3]
                        cpu_used += ev[4]
                        swap_pages += ev[4]
                        nstale = ev[5]
                        naborted += ev[6] == 0
                        npreempted += 1
                        if ev[6] == 1:
                            sw_head = (sw_head - 1) % scap
                            sw[sw_head] = victim
                            sw_len += 1
                        elif ev[6] == 2:
                            wq_head = (wq_head - 1) % wcap
                            wq[wq_head] = victim
                            wq_len += 1
                        if victim == r:
                            break
                    if not fits_now:
                        continue
                else:  # swapped requests (phase 2) or waiting ones (0: whole prompts, 3: chunked), FCFS
                    if not ((sw_len if swapped else wq_len) > 0 and nrun < max_seqs and budget > 0):
                        break
                    r = sw[sw_head] if swapped else wq[wq_head]
                    rem = Q[r, PROMPT] + Q[r, GEN] - Q[r, COMP]
                    code = 0
                    if not fits[r]:
                        code = EXCEEDS_POOL
                    elif whole and rem > mnbt:
                        code = EXCEEDS_TOKEN_BUDGET
                    elif (whole and rem > budget) or (nrun > 0 and adm_pages[r] > num_pages - committed):
                        break
                    if swapped:
                        sw_head = (sw_head + 1) % scap
                        sw_len -= 1
                        cpu_used -= Q[r, CPU]
                    else:
                        wq_head = (wq_head + 1) % wcap
                        wq_len -= 1
                    if code:  # it holds no GPU pages
                        _abort(r, code, k, start, Q, fin_iter, fin_s)
                        naborted += 1
                        continue
                    Q[r, STATUS] = RUNNING
                    if adm_iter[r] < 0:
                        adm_iter[r], adm_s[r] = k, start
                    Q[r, RES] = res_pages[r]  # it holds no GPU pages yet
                    if swapped:  # its KV comes back from the CPU pool
                        Q[r, USED] = Q[r, CPU]
                        num_used += Q[r, CPU]
                        swap_pages += Q[r, CPU]
                        Q[r, CPU] = 0
                    committed += _promised(Q[r, RES], Q[r, USED])
                    run[nrun] = r
                    nrun += 1
                    chunk = rem if rem < budget else budget
                    need = _pages(Q[r, COMP] + chunk, bs, shift)
                # the shared tail: pages for the chunk, and the request joins the iteration
                grown = _allocated(need, Q[r, RES], Q[r, USED])
                committed += grown[0]
                num_used += grown[1]
                Q[r, USED] += grown[1]
                Q[r, MAX_USED] = max(Q[r, MAX_USED], Q[r, USED])
                Q[r, MAX_RES] = max(Q[r, MAX_RES], Q[r, RES])
                sched_ids[nsched] = r
                sched_chunk[nsched] = chunk
                nsched += 1
                budget -= chunk
        # ---- execute the iteration
        if nsched == 0 and naborted == 0 and (idle_before or npreempted == 0):
            event = NO_PROGRESS
            break
        num_tokens = pairs = kv = decode_tokens = 0
        for i in range(nsched):
            r, c = sched_ids[i], sched_chunk[i]
            num_tokens += c
            pairs += c * Q[r, COMP] + c * (c + 1) // 2
            kv += Q[r, COMP] + c
            if Q[r, GEN] > 0 and Q[r, PROMPT] + Q[r, GEN] - Q[r, COMP] == 1:
                decode_tokens += 1
        duration = swap_pages * page_copy_s
        if num_tokens > 0:
            duration += iteration_s(cost_kind, cost_params, num_tokens, pairs, kv, nsched)
        end = start + duration
        pages_used, pages_reserved = num_used, committed
        finished = 0
        for i in range(nsched):
            r = sched_ids[i]
            Q[r, COMP] += sched_chunk[i]
            if Q[r, COMP] < Q[r, PROMPT] + Q[r, GEN]:
                continue
            Q[r, GEN] += 1
            if Q[r, GEN] == 1:
                ft_iter[r], ft_s[r] = k, end
            else:
                gap = end - T[r, LAST_S]
                if np.isnan(T[r, MAX_TBT]) or gap > T[r, MAX_TBT]:
                    T[r, MAX_TBT] = gap
            T[r, LAST_S] = end
            if Q[r, GEN] < Q[r, TARGET]:
                continue
            Q[r, STATUS] = CAPPED if Q[r, OUTPUT] > Q[r, TARGET] else STOPPED
            fin_iter[r], fin_s[r] = k, end
            committed -= _promised(Q[r, RES], Q[r, USED])
            num_used -= Q[r, USED]
            Q[r, RES] = Q[r, USED] = 0
            finished += 1
        if finished > 0:
            j = 0
            for i in range(nrun):
                r = run[i]
                if Q[r, STATUS] == RUNNING:
                    run[j] = r
                    j += 1
            nrun = j
        R[R_K, nrows], R[R_BATCH, nrows], R[R_PREFILL, nrows] = k, nsched, num_tokens - decode_tokens
        R[R_DECODE, nrows], R[R_RUNNING, nrows], R[R_WAITING, nrows] = decode_tokens, nrun, wq_len
        R[R_SWAPPED, nrows], R[R_PREEMPTED, nrows], R[R_USED, nrows] = sw_len, npreempted, pages_used
        R[R_RESERVED, nrows], R[R_FREE, nrows] = pages_reserved, num_pages - pages_reserved
        R[R_CPU, nrows], R[R_MOVED, nrows] = cpu_used, swap_pages
        RT[0, nrows], RT[1, nrows] = start, duration
        nrows += 1
        idle_before = nsched == 0 and naborted == 0
        now = end
        k += 1
        if nstale > 0:
            event = STALE
            break
    S[K], S[ARRIVED], S[COMMITTED], S[USED_PAGES], S[CPU_USED] = k, arrived, committed, num_used, cpu_used
    S[IDLE], S[NROWS] = 1 if idle_before else 0, nrows
    S[WQ_HEAD], S[WQ_LEN], S[SW_HEAD], S[SW_LEN], S[NRUN], S[NSTALE] = wq_head, wq_len, sw_head, sw_len, nrun, nstale
    F[NOW] = now
    return event
