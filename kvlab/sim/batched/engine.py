"""The batched engine's array program (the rules and scope are in the package docstring)."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from ..._intmath import ceil_div
from ...backend import to_numpy
from ...policies import Requests
from ..config import PreemptionMode, SchedulerKind
from ..fast.state import ABORT_REASONS, ABORTED, CAPPED, PREEMPTED, RUNNING, STOPPED, no_progress
from ..fast.tables import iteration_frame, request_columns
from ..request import RequestStatus
from .fallback import ROW_COLUMNS, RowStep, host_rows

if TYPE_CHECKING:
    from .. import PreparedRun

#: Status of a padding column (a simulation with fewer requests than the batch's widest).
PAD = 7
#: Steps whose iteration rows are kept on the device before they are copied to the host.
FLUSH_STEPS = 256
#: Every this many steps, finished simulations leave the arrays when they are at least half of them.
COMPACT_STEPS = 32
#: The (S, n) and (S,) arrays that hold one row per simulation (compaction keeps the live rows).
_ROW_ARRAYS = ("P", "O", "IDX", "T", "ARR", "RES0", "ADM0", "FITS0", "bs", "num_pages", "budget", "max_seqs",
               "on_demand", "now", "k", "nxt", "admit_count", "preempt_count", "idle_before")


@dataclass
class BatchStats:
    """What the batched engine did since the last :meth:`reset` (shown by benchmarks).

    Attributes
    ----------
    simulations, steps : int
        Simulations run and array steps taken (a batch takes as many steps as its longest member).
    iterations : int
        Iterations of all simulations (``iterations / (steps x simulations)`` is the share of
        a batch's rows that did work).
    fallback_rows : int
        Simulation-iterations scheduled request by request (:mod:`.fallback`).
    """

    simulations: int = 0
    steps: int = 0
    iterations: int = 0
    fallback_rows: int = 0

    def reset(self) -> BatchStats:
        """Zero the counts; return this object."""
        self.simulations = self.steps = self.iterations = self.fallback_rows = 0
        return self


#: The counts of every batch run in this process (:func:`run_batched` adds to them).
stats = BatchStats()


def why_not(run: PreparedRun) -> str | None:
    """Why the batched engine cannot run ``run`` (a reason to show), or ``None`` when it can."""
    pol = run.policy
    if run.blocks is not None:
        return "prefix caching (the batched engine has no prefix cache)"
    if run.scheduler.kind != SchedulerKind.CHUNKED:
        return f"scheduler {run.scheduler.kind.value} (the batched engine runs the chunked scheduler)"
    if run.scheduler.preemption_mode == PreemptionMode.SWAP:
        return "swap preemption (the batched engine runs recompute and reject)"
    if run.scheduler.async_scheduling:
        return "async scheduling (the batched engine schedules each iteration at its start)"
    if run.params.get("data_parallel", 1) > 1:
        return "data-parallel ranks (the batched engine runs one engine per simulation)"
    traits = [what for what, holds in (
        ("admission reads the running requests", not pol.admits_on_own_pages),
        ("admits on its first chunk's pages", pol.reserves_first_chunk),
        ("keeps per-iteration state", pol.keeps_state), ("orders the waiting queue", pol.orders_queue),
        ("chooses its own victims", not pol.preempts_newest)) if holds]
    if traits:
        return f"policy {pol.name} {', '.join(traits)}"
    return cost_why_not(run.cost)


#: Probe points (tokens, pairs, kv tokens, sequences) at which a cost model's answer on arrays must
#: equal its answer on Python numbers bit for bit (seeded; spans decodes to long prefills).
_PROBE = np.random.default_rng(20261202).integers(1, [8192, 1 << 24, 1 << 20, 512], size=(256, 4)).T


_CHECKED: list[tuple[Any, str | None]] = []


def cost_why_not(cost: Any) -> str | None:
    """Why ``cost`` cannot price the batch's iterations on arrays exactly as the reference does on
    Python numbers (its ``iteration_s`` fails on arrays, or differs in a bit at a probe point), or None.

    The roofline's formula is sums, products, quotients and a maximum, which IEEE arithmetic
    gives alike on arrays and Python floats; the measured model's ``**`` (NumPy's vectorised
    pow against the C library's) differs in the last bit at some points, so it is outside.
    """
    from ...costmodel.measured import MeasuredCostModel

    if isinstance(getattr(cost, "base", cost), MeasuredCostModel):  # its curves' pow: a probe can miss the points
        return (f"cost model {type(cost).__name__} gives other bits on arrays than on Python numbers (the measured "
                "model's GEMM curves raise to a fitted power, vectorised in NumPy, in the C library on numbers)")
    for seen, answer in _CHECKED:
        if same_cost(seen, cost):
            return answer
    answer = _probe(cost)
    _CHECKED[:] = [*_CHECKED[-7:], (cost, answer)]
    return answer


def _probe(cost: Any) -> str | None:
    t, p, kv, n = (np.ascontiguousarray(x) for x in _PROBE)
    try:
        on_arrays = np.asarray(cost.iteration_s(t, p, kv, n), dtype=np.float64)
    except Exception as exc:
        return f"cost model {type(cost).__name__} does not take arrays ({type(exc).__name__})"
    if on_arrays.shape != t.shape:
        return f"cost model {type(cost).__name__} does not answer per element on arrays"
    one = np.array([float(cost.iteration_s(*map(int, x))) for x in zip(t, p, kv, n)])
    if not np.array_equal(one, on_arrays):
        return (f"cost model {type(cost).__name__} gives other bits on arrays than on Python numbers at "
                f"{int((one != on_arrays).sum())} of {t.size} probe points")
    return None
    return None


def same_cost(a: Any, b: Any) -> bool:
    """Whether two cost models are the same model (one batch shares one ``iteration_s`` call)."""
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


class BatchedEngine:
    """S prepared runs (all within scope, one cost model) advanced in lockstep on array module ``xp``."""

    def __init__(self, runs: Sequence[PreparedRun], xp: ModuleType) -> None:
        if not runs:
            raise ValueError("a batch needs at least one run")
        for run in runs:
            reason = why_not(run)
            if reason is not None:
                raise ValueError(f"run outside the batched engine's scope: {reason}")
            if not same_cost(run.cost, runs[0].cost):
                raise ValueError("every run of a batch must have the same cost model")
        self.runs, self.xp, self.cost = list(runs), xp, runs[0].cost
        S, N = len(runs), max(len(r.prompt) for r in runs)
        self.S, self.N = S, N
        self.order = [np.lexsort((np.arange(len(r.arrival_s)), r.arrival_s)) for r in runs]  # arrival, then row

        def host(fill: Any, dtype: Any, get: Any) -> np.ndarray:
            out = np.full((S, N), fill, dtype=dtype)
            for s, (run, o) in enumerate(zip(runs, self.order)):
                out[s, :len(o)] = get(run, o)
            return out

        P = host(1, np.int64, lambda r, o: r.prompt[o])
        out = host(1, np.int64, lambda r, o: r.output[o])
        idx = host(0, np.int64, lambda r, o: o)
        res0, adm0, fits0 = (np.zeros((S, N), np.int64), np.zeros((S, N), np.int64), np.ones((S, N), bool))
        for s, (run, o) in enumerate(zip(runs, self.order)):  # the policy's answers about new requests
            pol, n = run.policy, len(o)
            reqs = Requests(o, P[s, :n], out[s, :n], np.zeros(n, np.int64), np)
            res0[s, :n] = ceil_div(np.asarray(pol.reservation_tokens(reqs), dtype=np.int64), run.pool.block_size)
            adm0[s, :n] = pol.admission_pages(reqs)
            fits0[s, :n] = pol.fits_empty_pool(reqs)
        status = host(0, np.int64, lambda r, o: 0)
        status[host(True, bool, lambda r, o: False)] = PAD
        a = xp.asarray
        self.P, self.O, self.IDX = a(P), a(out), a(idx)
        self.T = a(np.minimum(out, np.array([r.max_new_tokens for r in runs])[:, None]))
        self.ARR = a(host(np.inf, np.float64, lambda r, o: r.arrival_s[o]))
        self.RES0, self.ADM0, self.FITS0 = a(res0), a(adm0), a(fits0)
        self.s = {"ST": a(status)}
        for name in ("G", "C", "R", "U", "SEQ", "QK", "NP", "MR", "MU", "AB"):
            self.s[name] = xp.zeros((S, N), dtype=xp.int64)
        for name in ("AI", "FI", "XI"):
            self.s[name] = xp.full((S, N), -1, dtype=xp.int64)
        for name in ("AS", "FS", "XS", "LT", "MT"):
            self.s[name] = xp.full((S, N), np.nan, dtype=xp.float64)
        per = lambda f, dtype=np.int64: a(np.array([f(r) for r in runs], dtype=dtype))  # noqa: E731
        self.bs = per(lambda r: r.pool.block_size)
        self.num_pages = per(lambda r: r.pool.num_pages)
        self.budget = per(lambda r: r.scheduler.max_num_batched_tokens)
        self.max_seqs = per(lambda r: r.scheduler.max_num_seqs)
        self.on_demand = per(lambda r: r.policy.on_demand, bool)
        self.reject = [r.scheduler.preemption_mode == PreemptionMode.REJECT for r in runs]
        self.now = xp.zeros(S, dtype=xp.float64)
        self.k = xp.zeros(S, dtype=xp.int64)
        self.nxt = xp.zeros(S, dtype=xp.int64)
        self.admit_count = xp.zeros(S, dtype=xp.int64)
        self.preempt_count = xp.zeros(S, dtype=xp.int64)
        self.idle_before = xp.zeros(S, dtype=bool)
        self.col = xp.arange(N, dtype=xp.int64)[None, :]
        self.ids = np.arange(S)  # the run each row of the arrays holds (rows leave when compacted)
        self._final: dict[int, dict[str, np.ndarray]] = {}  # state of runs compacted out
        self._rows: list[tuple[Any, Any, Any]] = []
        self._host_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.num_steps = 0
        self.num_fallback_rows = 0

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
        """Run every simulation to the end; per run, its request table and iteration table."""
        while self._step():
            pass
        self._flush()
        return [self._tables(s) for s in range(self.S)]

    def _step(self) -> bool:
        xp, st = self.xp, self.s
        ST = st["ST"]
        live = (ST < int(RequestStatus.FINISHED_STOPPED)).any(axis=1)
        if not bool(live.any()):
            return False
        if self.num_steps % COMPACT_STEPS == 0 and self.num_steps:
            keep = to_numpy(live)
            if 2 * int(keep.sum()) <= keep.size:
                self._compact(keep)
                st = self.s
                ST = st["ST"]
                live = (ST < int(RequestStatus.FINISHED_STOPPED)).any(axis=1)
        arrived = (self.ARR <= self.now[:, None]).sum(axis=1)
        running = ST == RUNNING
        nrun = running.sum(axis=1)
        npw = (ST == PREEMPTED).sum(axis=1)
        empty = live & (nrun == 0) & (npw == 0) & (self.nxt >= arrived)
        if bool(empty.any()):  # the clock jumps to the next arrival
            head = xp.take_along_axis(self.ARR, xp.minimum(self.nxt, self.N - 1)[:, None], axis=1)[:, 0]
            self.now = xp.where(empty, head, self.now)
            arrived = (self.ARR <= self.now[:, None]).sum(axis=1)
        P, G, C, R, U = self.P, st["G"], st["C"], st["R"], st["U"]
        bs = self.bs[:, None]
        # running requests: decodes (one token each) first, then partial prefills
        rem = P + G - C
        dec = running & (G > 0) & (rem == 1)
        pre = running & ~dec
        ndec = dec.sum(axis=1)
        left = self.budget - ndec
        prem = xp.where(pre, rem, 0)
        npre, spre = pre.sum(axis=1), prem.sum(axis=1)
        pchunk = xp.minimum(prem, xp.maximum(left, 0)[:, None])
        chunk_r = dec.astype(xp.int64) + pchunk
        sched_r = chunk_r > 0
        need = ceil_div(C + chunk_r, bs)
        hold = xp.maximum(R, U)
        pos = xp.maximum(xp.where(sched_r, need - hold, 0), 0)
        unc = self.num_pages - hold.sum(axis=1)
        grow = pos.sum(axis=1)
        slow = live & ((ndec > self.budget) | ((npre > 1) & (spre > left))
                       | xp.where(self.on_demand, grow > unc, (pos > 0).any(axis=1)))
        # the queue: new requests in arrival order (columns nxt .. arrived - 1)
        left2 = left - pchunk.sum(axis=1)
        unc2 = unc - grow
        W = (self.col >= self.nxt[:, None]) & (self.col < arrived[:, None])
        enters = (left2 > 0) & (nrun < self.max_seqs)
        slow = slow | (live & enters & (npw > 0))
        fast = live & ~slow
        # The loop reaches a request when every one before it was admitted or aborted (one that
        # cannot fit even an empty pool is aborted and takes nothing); it admits a reached one that fits.
        fitW = W & self.FITS0
        Wp = xp.where(fitW, P, 0)
        bp = left2[:, None] - (xp.cumsum(Wp, axis=1) - Wp)
        Wr = xp.where(fitW, self.RES0, 0)
        up = unc2[:, None] - (xp.cumsum(Wr, axis=1) - Wr)
        m = nrun[:, None] + xp.cumsum(fitW, axis=1) - fitW  # running requests before each one's turn
        ok = (m < self.max_seqs[:, None]) & (bp > 0) & (~fitW | (m == 0) | (self.ADM0 <= up))
        reached = W & (xp.cumsum(W & ~ok, axis=1) == 0) & fast[:, None]
        adm = reached & fitW
        gone = reached & ~self.FITS0
        chunk_a = xp.where(adm, xp.minimum(P, bp), 0)
        f = fast[:, None]
        st["R"] = xp.where(adm, self.RES0, xp.where(f & (pos > 0) & self.on_demand[:, None], need, R))
        st["U"] = xp.where(adm, ceil_div(chunk_a, bs), xp.where(f & sched_r, xp.maximum(U, need), U))
        st["ST"] = xp.where(adm, RUNNING, ST)
        st["SEQ"] = xp.where(adm, self.admit_count[:, None] + xp.cumsum(adm, axis=1), st["SEQ"])
        first_admit = adm & (st["AI"] < 0)
        st["AI"] = xp.where(first_admit, self.k[:, None], st["AI"])
        st["AS"] = xp.where(first_admit, self.now[:, None], st["AS"])
        st["ST"] = xp.where(gone, ABORTED, st["ST"])
        st["AB"] = xp.where(gone, ABORT_REASONS.index("exceeds_pool"), st["AB"])
        st["XI"] = xp.where(gone, self.k[:, None], st["XI"])
        st["XS"] = xp.where(gone, self.now[:, None], st["XS"])
        num_adm = adm.sum(axis=1)
        num_aborted = gone.sum(axis=1)
        self.admit_count = self.admit_count + num_adm
        self.nxt = self.nxt + num_adm + num_aborted
        chunk = xp.where(f, chunk_r + chunk_a, 0)
        num_preempted = xp.zeros(self.ids.size, dtype=xp.int64)
        if bool(slow.any()):
            chunk, num_preempted, num_aborted = self._fallback(slow, arrived, chunk, num_preempted, num_aborted)
        self._execute(live, chunk, num_preempted, num_aborted, arrived)
        return True

    def _fallback(self, slow: Any, arrived: Any, chunk: Any, num_preempted: Any, num_aborted: Any
                  ) -> tuple[Any, Any, Any]:
        """Schedule the rows in ``slow`` request by request (:class:`.fallback.RowStep`)."""
        xp, st = self.xp, self.s
        rows = np.flatnonzero(to_numpy(slow))
        self.num_fallback_rows += rows.size
        cols = {name: st[name] for name in ROW_COLUMNS if name in st}
        cols.update(P=self.P, O=self.O, IDX=self.IDX)
        h = host_rows(cols, rows, to_numpy)
        scal = host_rows({"admit_count": self.admit_count, "preempt_count": self.preempt_count, "nxt": self.nxt,
                          "arrived": arrived, "k": self.k, "now": self.now, "bs": self.bs,
                          "num_pages": self.num_pages, "budget": self.budget, "max_seqs": self.max_seqs},
                         rows, to_numpy)
        chunks = np.zeros((rows.size, self.N), dtype=np.int64)
        pre, ab = np.zeros(rows.size, np.int64), np.zeros(rows.size, np.int64)
        for i, s in enumerate(rows.tolist()):
            row = {name: h[name][i] for name in h}
            counters = {name: int(scal[name][i]) for name in ("admit_count", "preempt_count", "nxt")}
            run = int(self.ids[s])
            step = RowStep(row, policy=self.runs[run].policy, counters=counters, arrived=int(scal["arrived"][i]),
                           k=int(scal["k"][i]), now_s=float(scal["now"][i]), block_size=int(scal["bs"][i]),
                           num_pages=int(scal["num_pages"][i]), budget_tokens=int(scal["budget"][i]),
                           max_num_seqs=int(scal["max_seqs"][i]), reject=self.reject[run])
            step.run()
            chunks[i], pre[i], ab[i] = step.chunk, step.num_preempted, step.num_aborted
            for name in ("admit_count", "preempt_count", "nxt"):
                scal[name][i] = counters[name]
        d_rows = xp.asarray(rows)
        for name in st:
            if name in h:
                st[name][d_rows] = xp.asarray(h[name])
        self.admit_count[d_rows] = xp.asarray(scal["admit_count"])
        self.preempt_count[d_rows] = xp.asarray(scal["preempt_count"])
        self.nxt[d_rows] = xp.asarray(scal["nxt"])
        chunk[d_rows] = xp.asarray(chunks)
        num_preempted[d_rows] = xp.asarray(pre)
        num_aborted[d_rows] = xp.asarray(ab)
        return chunk, num_preempted, num_aborted

    def _execute(self, live: Any, chunk: Any, num_preempted: Any, num_aborted: Any, arrived: Any) -> None:
        """Run the scheduled iteration of every live simulation (the reference's ``_execute``)."""
        xp, st = self.xp, self.s
        P, G, C = self.P, st["G"], st["C"]
        sched = chunk > 0
        num_seqs = sched.sum(axis=1)
        stuck = live & (num_seqs == 0) & (num_aborted == 0) & (self.idle_before | (num_preempted == 0))
        if bool(stuck.any()):
            s = int(np.flatnonzero(to_numpy(stuck))[0])
            h = {name: to_numpy(a[s]) for name, a in (("ST", st["ST"]), ("R", st["R"]), ("U", st["U"]),
                                                      ("IDX", self.IDX))}
            pages = int(to_numpy(self.num_pages[s]))
            raise no_progress(int(to_numpy(self.k[s])), float(to_numpy(self.now[s])),
                              running=h["IDX"][h["ST"] == RUNNING].tolist(),
                              waiting=int((h["ST"] == PREEMPTED).sum() + to_numpy(arrived[s]) - to_numpy(self.nxt[s])),
                              swapped=0, free_pages=pages - int(h["U"].sum()),
                              unpromised_pages=pages - int(np.maximum(h["R"], h["U"]).sum()))
        num_tokens = chunk.sum(axis=1)
        pairs = (chunk * C + chunk * (chunk + 1) // 2).sum(axis=1)
        kv = xp.where(sched, C + chunk, 0).sum(axis=1)
        duration = xp.where(num_tokens > 0, self.cost.iteration_s(num_tokens, pairs, kv, num_seqs), 0.0)
        end = self.now + duration
        decode_tokens = (sched & (G > 0) & (P + G - C == 1)).sum(axis=1)
        st["MR"] = xp.where(sched, xp.maximum(st["MR"], st["R"]), st["MR"])
        st["MU"] = xp.where(sched, xp.maximum(st["MU"], st["U"]), st["MU"])
        pages_used = st["U"].sum(axis=1)
        pages_reserved = xp.maximum(st["R"], st["U"]).sum(axis=1)
        C = C + chunk
        produced = sched & (C == P + G)
        G = G + produced
        first = produced & (G == 1)
        e = end[:, None]
        st["FI"] = xp.where(first, self.k[:, None], st["FI"])
        st["FS"] = xp.where(first, e, st["FS"])
        st["MT"] = xp.where(produced & ~first, xp.fmax(st["MT"], e - st["LT"]), st["MT"])
        st["LT"] = xp.where(produced, e, st["LT"])
        fin = produced & (G == self.T)
        st["ST"] = xp.where(fin, xp.where(self.O > self.T, CAPPED, STOPPED), st["ST"])
        st["XI"] = xp.where(fin, self.k[:, None], st["XI"])
        st["XS"] = xp.where(fin, e, st["XS"])
        st["R"] = xp.where(fin, 0, st["R"])
        st["U"] = xp.where(fin, 0, st["U"])
        st["C"], st["G"] = C, G
        ST = st["ST"]
        num_running = (ST == RUNNING).sum(axis=1)
        num_waiting = (ST == PREEMPTED).sum(axis=1) + xp.maximum(arrived - self.nxt, 0)
        zero = xp.zeros_like(num_seqs)
        ints = xp.stack([self.k, num_seqs, num_tokens - decode_tokens, decode_tokens, num_running, num_waiting, zero,
                         num_preempted, pages_used, pages_reserved, self.num_pages - pages_reserved, zero, zero])
        self._rows.append((ints, xp.stack([self.now, duration]), live))
        if len(self._rows) >= FLUSH_STEPS:
            self._flush()
        self.idle_before = xp.where(live, (num_seqs == 0) & (num_aborted == 0), self.idle_before)
        self.now = xp.where(live, end, self.now)
        self.k = self.k + live
        self.num_steps += 1

    def _compact(self, keep: np.ndarray) -> None:
        """Keep only the rows in ``keep`` (host mask); the others' state goes to the host."""
        self._flush()
        gone = np.flatnonzero(~keep)
        if gone.size:
            host = host_rows(self.s, gone, to_numpy)
            for j, run in enumerate(self.ids[gone].tolist()):
                self._final[run] = {name: a[j] for name, a in host.items()}
        rows = self.xp.asarray(np.flatnonzero(keep))
        for name in _ROW_ARRAYS:
            setattr(self, name, getattr(self, name)[rows])
        self.s = {name: a[rows] for name, a in self.s.items()}
        self.ids = self.ids[keep]

    # ------------------------------------------------------------------ results
    def _flush(self) -> None:
        if self._rows:
            xp = self.xp
            ints, times, live = (to_numpy(xp.stack([r[i] for r in self._rows])) for i in range(3))
            self._host_rows.append((ints, times, live, self.ids.copy()))
            self._rows = []

    def _tables(self, s: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        run, o = self.runs[s], self.order[s]
        n = len(o)
        blocks = [(b, int(np.flatnonzero(b[3] == s)[0])) for b in self._host_rows if (b[3] == s).any()]
        ints = np.concatenate([b[0][b[2][:, j], :, j] for b, j in blocks]).T
        times = np.concatenate([b[1][b[2][:, j], :, j] for b, j in blocks]).T
        if s in self._final:
            final = self._final[s]
        else:
            final = host_rows(self.s, np.flatnonzero(self.ids == s), to_numpy)
            final = {name: a[0] for name, a in final.items()}
        h = {name: np.empty(n, dtype=a.dtype) for name, a in final.items()}
        for name, a in final.items():
            h[name][o] = a[:n]
        state = {"prompt": run.prompt, "output": run.output, "admitted_iter": h["AI"], "first_token_iter": h["FI"],
                 "finish_iter": h["XI"], "admitted_s": h["AS"], "first_token_s": h["FS"], "finish_s": h["XS"],
                 "gen": h["G"], "num_preemptions": h["NP"], "num_swaps": np.zeros(n, np.int64), "max_res": h["MR"],
                 "max_used": h["MU"], "last_token_s": h["LT"], "max_tbt_s": h["MT"], "status": h["ST"],
                 "abort_code": h["AB"]}
        requests = request_columns(state, run.arrival_s)
        requests.insert(0, "request_id", run.ids)
        at = requests.columns.get_loc("mean_tbt_s")
        requests.insert(at, "ttft_s", requests["first_token_s"] - requests["arrival_s"])
        requests.insert(at + 1, "e2e_s", requests["finish_s"] - requests["arrival_s"])
        requests.loc[requests["outcome"] == RequestStatus.FINISHED_ABORTED.name.lower(), "e2e_s"] = np.nan
        return requests, iteration_frame(np.ascontiguousarray(ints), np.ascontiguousarray(times))


def run_batched(runs: Sequence[PreparedRun], xp: ModuleType) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Every run's (request table, iteration table), ``runs`` batched by cost model (each within scope)."""
    groups: list[list[int]] = []
    for i, run in enumerate(runs):
        for g in groups:
            if same_cost(runs[g[0]].cost, run.cost):
                g.append(i)
                break
        else:
            groups.append([i])
    out: list[Any] = [None] * len(runs)
    for g in groups:
        engine = BatchedEngine([runs[i] for i in g], xp)
        for i, tables in zip(g, engine.run()):
            out[i] = tables
            stats.iterations += len(tables[1])
        stats.simulations += len(g)
        stats.steps += engine.num_steps
        stats.fallback_rows += engine.num_fallback_rows
    return out


__all__ = ["BatchStats", "BatchedEngine", "run_batched", "same_cost", "stats", "why_not"]
