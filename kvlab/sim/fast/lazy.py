"""Lazy runs: iterations without preemption, with decoding requests advanced implicitly."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..._intmath import ceil_div
from ...costmodel import CostModel


#: Entries of a run's row-time list (two per iteration) before its rows are packed into arrays.
ROWS_PER_BLOCK = 1 << 17


@dataclass(frozen=True, kw_only=True)
class LazyFacts:
    """What a lazy run reads once: the run's limits and each request's fixed answers (host lists).

    Indexed by request row unless said otherwise; pages in pages, tokens in tokens.
    """

    block_size: int
    num_pages: int
    max_num_batched_tokens: int
    max_num_seqs: int
    prefill_first: bool
    on_demand: bool  # the policy grows reservations on demand (else a page beyond one is a preemption)
    prompt_tokens: list[int]
    target_tokens: list[int]  # min(output, max_new_tokens)
    fresh_pages: list[int]  # pages reserved on a first admission
    admission_pages: list[int]  # unpromised pages a first admission needs
    order: list[int]  # rows in arrival order
    arrival_s: list[float]  # arrival times in arrival order (seconds)
    unfit_positions: list[int]  # arrival positions of requests admission would abort, then len(order)
    cost: CostModel


@dataclass(kw_only=True)
class Clock:
    """The engine's scalars a lazy run advances: the next iteration, its start (s), arrivals seen,
    the FCFS queue's first arrival position, promised and used pages, CPU pages in use."""

    k: int
    now_s: float
    arrived: int
    queue_lo: int
    committed_pages: int
    used_pages: int
    cpu_pages: int


@dataclass(kw_only=True)
class Running:
    """The running requests in admission order (host arrays): tokens, pages, the last token's time (s)."""

    ids: np.ndarray
    computed: np.ndarray
    generated: np.ndarray
    reserved: np.ndarray
    used: np.ndarray
    max_used: np.ndarray
    max_reserved: np.ndarray
    last_token_s: np.ndarray


class LazyHost(Protocol):
    """What a lazy run needs of the engine: its clock, its running requests, and where outcomes go.

    Ids, iterations and times are host arrays; each ``record_*`` writes the named request columns.
    """

    def clock(self) -> Clock: ...

    def set_clock(self, clock: Clock) -> None: ...

    def running(self) -> Running: ...

    def set_running(self, running: Running) -> None: ...

    def record_admitted(self, ids: np.ndarray, iterations: np.ndarray, start_s: np.ndarray) -> None: ...

    def record_first_tokens(self, ids: np.ndarray, iterations: np.ndarray, end_s: np.ndarray) -> None: ...

    def record_finished(self, ids: np.ndarray, iterations: np.ndarray, end_s: np.ndarray, computed: np.ndarray,
                        max_used: np.ndarray, max_reserved: np.ndarray) -> None: ...

    def fold_token_gaps(self, ids: np.ndarray, gaps_s: np.ndarray) -> None: ...

    def append_iterations(self, columns: dict[str, Any]) -> None: ...


class LazyRun:
    """Iterations without preemption, run with decoding requests advanced implicitly.

    Decoders advance on a clock ``v`` of decode iterations (every iteration under chunked
    prefill; under prefill_first, those that admit no whole prompt). A decoding request's state
    is affine in ``v``: ``computed = off + v``, ``generated = goff + v``; it finishes at a known
    ``v``, needs a page exactly when ``(off + v) % block_size == 0``, and its commitment starts
    growing with its pages at a known ``v`` (when its context reaches its reservation; at once
    when it reserved only its context). So an iteration only touches the requests whose state
    changes shape (admitted, prefilling, finishing) and a few totals: the number of decoders, the
    sum of their ``off``,
    and per page phase the decoders and those whose commitment grows. Their outcome columns
    (times, token-gap maxima) are written when the run hands the state back to the arrays.

    Valid for FCFS queues of first admissions with nothing swapped, under a policy whose
    admission depends only on the request's own pages and which keeps no per-iteration state
    (the engine checks). The run hands back before any iteration whose page growth would preempt
    (on demand: the new commitments exceed the unpromised pages; otherwise: a decoder reaches
    its reservation), whose decodes overflow the token budget, or whose admissions could reach
    a request to abort. It sees the engine only through :class:`LazyHost` and the policy only
    through the answers in :class:`LazyFacts`.

    The loop is written in Python scalars, not against the array module: an iteration touches a
    handful of requests, and one array call (NumPy: 1-5 us, CuPy: a kernel launch) costs more
    than the whole scalar update; the write-back to the request arrays is vectorised.
    """

    def __init__(self, facts: LazyFacts, host: LazyHost) -> None:
        self.facts, self.host = facts, host

    def run(self) -> int:
        """Run iterations until one needs the array engine; return how many ran."""
        f, clock = self.facts, self.host.clock()
        bs = f.block_size
        k0 = k = clock.k
        self._load(clock.k)
        prompt, target, fresh_pages, admit_pages, order, arrivals = f.prompt_tokens, f.target_tokens, \
            f.fresh_pages, f.admission_pages, f.order, f.arrival_s
        D, P, fin_at, phase_cnt, commit_cnt, act_at = self.D, self.P, self.fin_at, self.phase_cnt, self.commit_cnt, \
            self.act_at
        mnbt, max_seqs, num_pages, n = f.max_num_batched_tokens, f.max_num_seqs, f.num_pages, len(order)
        on_demand, pf = f.on_demand, f.prefill_first
        now, arrived = clock.now_s, clock.arrived
        w_lo, w_hi = clock.queue_lo, arrived  # the FCFS queue is order[w_lo:w_hi]
        unfit_next = f.unfit_positions[bisect.bisect_left(f.unfit_positions, w_lo)]
        iteration_s = f.cost.iteration_s
        rows, row_times, costs, admitted, first_tokens = self.rows, self.row_times, self.costs, self.admitted, \
            self.first_tokens
        finished, finished_last, v_real = self.finished, self.finished_last, self.v_real
        committed, num_used, seq, n_dec, sum_off = clock.committed_pages, clock.used_pages, self.seq, self.n_dec, \
            self.sum_off
        v = k  # the next decode iteration's index on the decoders' clock (== k under chunked prefill)
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
            n_whole = 0  # prefill_first: whole prompts this iteration admits (then nothing decodes)
            if pf:
                budget, free, n_run, i = mnbt, num_pages - committed, n_dec + n_pre, w_lo
                while i < w_hi and n_run < max_seqs and budget > 0:
                    if unfit_next == i:
                        break
                    r = order[i]
                    rem = prompt[r]
                    if rem > budget or (n_run and admit_pages[r] > free):
                        break
                    free -= fresh_pages[r]
                    budget -= rem
                    n_run += 1
                    i += 1
                if i < w_hi and unfit_next == i and n_run < max_seqs and budget > 0:
                    break  # the admission reaches a request to abort
                n_whole = i - w_lo
            decode = n_whole == 0
            pending = p_dec = ()
            grow = grow_commit = 0
            if decode:
                acts = act_at.pop(v, None) if act_at else None  # decoders whose commitment starts growing
                if acts is not None:
                    acts = [r for r in acts if r in D]
                    if acts and not on_demand:
                        break  # a decoder needs a page beyond its reservation: the reference preempts it
                    for r in acts:
                        commit_cnt[-D[r][0] % bs] += 1
                phase = v % bs
                grow, grow_commit = phase_cnt[phase], commit_cnt[phase]
                if P:
                    pending = list(P.items())
                    # a recomputed request one token short of its context decodes (the reference's is_decoding)
                    p_dec = [x for x in pending if x[1][1] > 0 and prompt[x[0]] + x[1][1] - x[1][0] == 1]
                    if p_dec:
                        pending = p_dec + [x for x in pending
                                           if not (x[1][1] > 0 and prompt[x[0]] + x[1][1] - x[1][0] == 1)]
                if n_dec + len(p_dec) > mnbt or grow_commit > num_pages - committed:
                    break
                if not pf and n_wait and unfit_next < min(w_hi, w_lo + max_seqs - n_dec - n_pre):
                    break  # the admissions could reach a request that does not fit an empty pool
            # ---- schedule: decodes, then prefills in admission order, then admissions
            if decode:
                budget = mnbt - n_dec
                num_used += grow
                committed += grow_commit
                tokens = num_sched = n_dec
                pairs = kv = sum_off + n_dec * (v + 1)
            else:
                budget, tokens, num_sched, pairs, kv = mnbt, 0, 0, 0, 0
            chunks = []
            for r, st in pending:
                if budget == 0:
                    break
                c = st[0]
                chunk = min(prompt[r] + st[1] - c, budget)
                budget -= chunk
                need = ceil_div(c + chunk, bs)
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
            while (n_whole if pf else n_wait and n_run < max_seqs and budget > 0):
                r = order[w_lo]
                p = fresh_pages[r]
                if n_run and admit_pages[r] > num_pages - committed:
                    break
                w_lo += 1
                n_wait -= 1
                n_whole -= 1
                committed += p
                rem = prompt[r]
                chunk = rem if rem <= budget else budget
                budget -= chunk
                used = ceil_div(chunk, bs)
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
            pages_used, pages_reserved = num_used, committed
            decode_tokens = n_dec + len(p_dec) if decode else 0
            if timed:
                duration_s = float(iteration_s(tokens, pairs, kv, num_sched))
                end = now + duration_s
            else:
                duration_s = end = nan
                costs += (tokens, pairs, kv, num_sched)
            # ---- execute: finishing decoders, then completed prefills
            if decode:
                for r in fin_at.pop(v, ()):
                    off, res0, commit0, act, _goff, mxu, mxr, s, v0, last, last_k = D.pop(r)
                    used_final = ceil_div(off + v + 1, bs)
                    res_final = used_final if on_demand and used_final > commit0 else res0
                    committed -= res_final if res_final > used_final else used_final
                    num_used -= used_final
                    n_dec -= 1
                    sum_off -= off
                    phase_cnt[-off % bs] -= 1
                    if act <= v:
                        commit_cnt[-off % bs] -= 1
                    finished += (r, k, off + v + 1, mxu if mxu > used_final else used_final,
                                 mxr if mxr > res_final else res_final, v0, v, last_k)
                    finished_last.append(last)
            vf = v + 1 if decode else v  # the first decode of a request that joins the decoders now
            for r, p, used, s in whole:
                first_tokens += (r, k)
                c = prompt[r]
                if target[r] == 1:
                    committed -= p if p > used else used
                    num_used -= used
                    finished += (r, k, c, used, p, vf, vf - 1, -1)  # no token gap
                    finished_last.append(nan)
                    continue
                off = c - vf
                commit0 = p if p > used else used
                fin = vf + target[r] - 2
                act = commit0 * bs - off  # first decode needing a page beyond commit0
                if on_demand and commit0 == used:
                    act = v  # its pages and commitment grow together from now on
                    commit_cnt[-off % bs] += 1
                elif act <= fin:
                    act_at.setdefault(act, []).append(r)
                # its token run starts at this iteration's decodes (chunked) or the next ones (after a
                # whole prefill, its first token then precedes the run)
                D[r] = (off, p, commit0, act, 1 - vf, used, p, s, v if decode else vf, nan, -1 if decode else k)
                n_dec += 1
                sum_off += off
                phase_cnt[-off % bs] += 1
                fin_at.setdefault(fin, []).append(r)
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
                    finished += (r, k, c, st[4], st[5], v, v, -1)
                    finished_last.append(st[7])
                    continue
                off = c - v - 1
                commit0 = max(st[2], st[3])
                fin = v + target[r] - g
                act = commit0 * bs - off
                if on_demand and commit0 == st[3]:
                    act = v
                    commit_cnt[-off % bs] += 1
                elif act <= fin:
                    act_at.setdefault(act, []).append(r)
                D[r] = (off, st[2], commit0, act, g - v - 1, st[4], st[5], st[6], v, st[7], -1)
                n_dec += 1
                sum_off += off
                phase_cnt[-off % bs] += 1
                fin_at.setdefault(fin, []).append(r)
            rows += (k, num_sched, tokens - decode_tokens, decode_tokens, n_dec + len(P), w_hi - w_lo,
                     pages_used, pages_reserved)
            row_times += (now, duration_s)
            if len(row_times) >= ROWS_PER_BLOCK:  # keep long runs' rows as arrays (8 bytes an entry)
                self._pack_rows()
            if decode:
                v_real.append(k)
                v += 1
            k += 1
            now = end
        if k > k0:  # now is nan after untimed iterations: _store computes it
            self._store(Clock(k=k, now_s=now, arrived=arrived, queue_lo=w_lo, committed_pages=committed,
                              used_pages=num_used, cpu_pages=clock.cpu_pages), k0, v)
        return k - k0

    def _load(self, k: int) -> None:
        """Take the running requests from the engine (``k``: the next iteration)."""
        f = self.facts
        bs = f.block_size
        self.P: dict[int, list] = {}  # prefilling: computed, generated, reserved, used, max used, max reserved,
        #                               admission, last token (s)
        self.D: dict[int, tuple] = {}  # decoding: off, reserved and committed pages when it began decoding,
        #                                the decode its commitment starts growing in, goff, max used, max reserved,
        #                                admission, first decode of its run of tokens, the token before that run
        #                                (seconds, or the iteration that made it when in this run, else -1)
        self.fin_at: dict[int, list[int]] = {}  # decode -> decoders finishing in it
        self.act_at: dict[int, list[int]] = {}  # decode -> decoders whose commitment starts growing in it
        self.phase_cnt = [0] * bs  # decoders by page phase: each needs a page when (off + v) % block_size == 0
        self.commit_cnt = [0] * bs  # those of them whose commitment grows with their pages
        self.n_dec = self.sum_off = 0
        # flat lists, a record every few entries (cheaper to fill and to turn into arrays than tuples)
        self.admitted: list[int] = []  # request, iteration
        self.first_tokens: list[int] = []  # request, iteration
        self.finished: list[int] = []  # request, iteration, computed, max used, max reserved, token run
        #                                (first and last decode, iteration of the token before or -1)
        self.finished_last: list[float] = []  # the token before the run (s)
        self.rows: list[int] = []  # iteration, batch, prefill and decode tokens, running, waiting, pages
        self.row_times: list[float] = []  # start, duration (s)
        self.costs: list[int] = []  # tokens, attention pairs, KV tokens, sequences of the untimed iterations
        self.row_blocks: list[np.ndarray] = []  # rows, row times and costs packed as arrays
        self.time_blocks: list[np.ndarray] = []
        self.cost_blocks: list[np.ndarray] = []
        self.v_real: list[int] = []  # the iteration of each decode of this run (decodes are numbered from k)
        run = self.host.running()
        self.seq = int(run.ids.size)
        cols = (run.ids, run.computed, run.generated, run.reserved, run.used, run.max_used, run.max_reserved)
        last = run.last_token_s.tolist()
        for i, (r, c, g, res, used, mxu, mxr) in enumerate(zip(*(c.tolist() for c in cols))):
            if g > 0 and f.prompt_tokens[r] + g - c == 1:
                off = c - k
                commit0 = max(res, used)
                fin = k + f.target_tokens[r] - g - 1
                act = commit0 * bs - off
                if f.on_demand and commit0 == used:
                    act = k
                    self.commit_cnt[-off % bs] += 1
                elif act <= fin:
                    self.act_at.setdefault(act, []).append(r)
                self.D[r] = (off, res, commit0, act, g - k, mxu, mxr, i + 1, k, last[i], -1)
                self.n_dec += 1
                self.sum_off += off
                self.phase_cnt[-off % bs] += 1
                self.fin_at.setdefault(fin, []).append(r)
            else:
                self.P[r] = [c, g, res, used, mxu, mxr, i + 1, last[i]]

    def _pack_rows(self) -> None:
        """Move the rows, row times and costs collected so far into arrays (the lists are emptied in place)."""
        for items, blocks, dtype in ((self.rows, self.row_blocks, np.int64), (self.row_times, self.time_blocks,
                                     np.float64), (self.costs, self.cost_blocks, np.int64)):
            if items:
                blocks.append(np.asarray(items, dtype=dtype))
                items.clear()

    def _store(self, clock: Clock, k0: int, v_end: int) -> None:
        """Hand the state back to the engine: iteration rows, outcomes, the running requests, the clock."""
        f, host, bs = self.facts, self.host, self.facts.block_size
        self._pack_rows()
        ints = np.concatenate(self.row_blocks).reshape(-1, 8)
        times = np.concatenate(self.time_blocks).reshape(-1, 2)
        num = ints.shape[0]
        start, duration = times[:, 0].copy(), times[:, 1].copy()
        untimed = np.flatnonzero(np.isnan(duration))
        if untimed.size:
            i0 = int(untimed[0])
            cost = np.concatenate(self.cost_blocks).reshape(-1, 4)  # the untimed iterations
            duration[i0:] = f.cost.iteration_s(cost[:, 0], cost[:, 1], cost[:, 2], cost[:, 3])
            starts = np.cumsum(np.concatenate([[start[i0]], duration[i0:]]))  # sequential, as now += duration
            start[i0:] = starts[:-1]
            clock.now_s = float(starts[-1])
        end = start + duration
        reserved = ints[:, 7]
        zero = np.zeros(num, dtype=np.int64)
        host.append_iterations({
            "iteration": ints[:, 0], "start_s": start, "duration_s": duration, "batch_size": ints[:, 1],
            "prefill_tokens": ints[:, 2], "decode_tokens": ints[:, 3], "num_running": ints[:, 4],
            "num_waiting": ints[:, 5], "num_swapped": zero, "num_preempted": zero, "pages_used": ints[:, 6],
            "pages_reserved": reserved, "pages_free": f.num_pages - reserved, "pages_swapped": zero + clock.cpu_pages,
            "swap_pages_moved": zero})
        decode_end = end[np.asarray(self.v_real, dtype=np.int64) - k0]  # end of each decode (s), from decode k0
        if self.admitted:
            ids, ks = np.asarray(self.admitted, dtype=np.int64).reshape(-1, 2).T
            host.record_admitted(ids, ks, start[ks - k0])
        if self.first_tokens:
            ids, ks = np.asarray(self.first_tokens, dtype=np.int64).reshape(-1, 2).T
            host.record_first_tokens(ids, ks, end[ks - k0])
        segments = []  # (request, first decode, last decode, token before (s)) of each run of tokens
        if self.finished:
            ids, ks, comp, mxu, mxr, v0, v1, last_k = np.asarray(self.finished, dtype=np.int64).reshape(-1, 8).T
            last = np.asarray(self.finished_last, dtype=np.float64)
            last = np.where(last_k >= 0, end[np.maximum(last_k - k0, 0)], last)
            segments.append((ids, v0, v1, last))
            host.record_finished(ids, ks, end[ks - k0], comp, mxu, mxr)
        parts = []  # (admission, ids, computed, generated, reserved, used, max used, max reserved, last token)
        if self.D:
            ids = np.fromiter(self.D, dtype=np.int64, count=len(self.D))
            off, res0, commit0, _, goff, mxu, mxr, seq, v0 = (np.asarray(c, dtype=np.int64)
                                                              for c in list(zip(*self.D.values()))[:9])
            last_before = np.asarray([d[9] for d in self.D.values()], dtype=np.float64)
            last_k = np.asarray([d[10] for d in self.D.values()], dtype=np.int64)
            last = np.where(last_k >= 0, end[np.maximum(last_k - k0, 0)], last_before)
            segments.append((ids, v0, np.full(ids.size, v_end - 1), last))
            comp = off + v_end
            used = ceil_div(comp, bs)
            res = np.where(used > commit0, used, res0) if f.on_demand else res0
            decoded = v0 <= v_end - 1  # made a token in a decode of this run: the last one
            last_token = np.where(decoded, decode_end[v_end - 1 - k0] if decoded.any() else np.nan, last)
            parts.append((seq, ids, comp, goff + v_end, res, used, np.maximum(mxu, used), np.maximum(mxr, res),
                          last_token))
        if self.P:
            ids = np.fromiter(self.P, dtype=np.int64, count=len(self.P))
            c, g, res, used, mxu, mxr, seq = (np.asarray(col, dtype=np.int64)
                                              for col in list(zip(*self.P.values()))[:7])
            parts.append((seq, ids, c, g, res, used, mxu, mxr,
                          np.asarray([st[7] for st in self.P.values()], dtype=np.float64)))
        if parts:
            cols = [np.concatenate(c) for c in zip(*parts)]
            order = np.argsort(cols[0], kind="stable")
            cols = [c[order] for c in cols[1:]]
        else:
            cols = [np.zeros(0, dtype=np.int64)] * 7 + [np.zeros(0)]
        host.set_running(Running(ids=cols[0], computed=cols[1], generated=cols[2], reserved=cols[3], used=cols[4],
                                 max_used=cols[5], max_reserved=cols[6], last_token_s=cols[7]))
        if segments:
            ids, v0, v1, last = (np.concatenate(c) for c in zip(*segments))
            some = v1 >= v0
            if some.any():
                host.fold_token_gaps(ids[some], token_gaps(decode_end, v0[some] - k0, v1[some] - k0, last[some]))
        host.set_clock(clock)


def token_gaps(end: np.ndarray, i0: np.ndarray, i1: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The largest token gap (seconds) of each run of consecutive tokens.

    Run ``j`` produced a token in every decode from ``i0[j]`` to ``i1[j]`` (``end``: their end
    times), its previous token at ``last[j]`` (NaN: none); its gaps are ``end[i0] - last`` and
    the differences of consecutive decode ends in ``(i0, i1]``: a range maximum, answered for
    all runs at once from a sparse table (log2(decodes) levels of running maxima).
    """
    gaps = np.concatenate([[-np.inf], np.diff(end)])
    table = [gaps]
    while (1 << len(table)) <= gaps.size:
        prev, half = table[-1], 1 << (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    lo, hi = i0 + 1, i1  # inclusive range of gap indices
    some = hi >= lo
    level = np.zeros(i0.size, dtype=np.int64)
    level[some] = np.floor(np.log2(hi[some] - lo[some] + 1)).astype(np.int64)
    best = np.full(i0.size, np.nan)
    for lv in np.unique(level[some]).tolist():
        sel = some & (level == lv)
        t = table[lv]
        best[sel] = np.maximum(t[lo[sel]], t[hi[sel] - (1 << lv) + 1])
    with np.errstate(invalid="ignore"):
        return np.fmax(end[i0] - last, best)
