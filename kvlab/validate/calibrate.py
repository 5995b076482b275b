"""Fit a serving stack's terms to measured runs: ``kvlab calibrate RESULTS... -o my-h100.json``.

The terms (:class:`kvlab.costmodel.stacks.StackTerms`) are a per-iteration overhead ``a``, a
per-sequence overhead ``b`` and, where the data support it, a scale ``s`` on the base model's GPU
time, so that an iteration costs ``s g + a + b S`` (``g`` the GPU time, ``S`` the sequences it
schedules); and, for runs timed from the client, the front end's latency per request ``c`` (HTTP,
tokenisation, streaming the first token), which adds to TTFT and E2E but to no iteration and so
not to TPOT. Without ``c`` a client-clocked run's TTFT can only be raised through ``a`` and ``s``,
which raise its TPOT as much: the fit then settles between the two and leaves TTFT low where the
server adds a fixed latency (DistServe's V0 runs: about 15-25 ms per request). ``c`` is fitted only
when some run has a client clock, and is 0 for an engine-side clock.

The objective is the error the validation reports: per run, the relative error of the mean
TTFT, mean E2E and mean TPOT (each run weighs the same, and all three metrics together), with all
terms non-negative (``s`` within :data:`BOUNDS`). The loss is robust (soft L1, quadratic up to
:data:`ROBUST_SCALE` relative error, linear beyond): the mean TTFT of a run at the edge of
saturation is its queue, which moves by tens of percent for a percent of throughput, and a squared
loss lets such one run drag the terms of every other.

How (and why not a black-box optimiser over whole simulations): a request's TTFT, TPOT and E2E are
sums of the durations of the iterations that ran while it waited or decoded (an engine that serves a
request is never idle). With the schedule of one replay held fixed, every metric is therefore
*linear* in ``(s, a, b, c)``: the run's mean TTFT is ``s G + a N + b Q + c`` with ``G``, ``N``,
``Q`` the GPU time, iteration count and sequence count summed over each request's window and
averaged (:func:`design`). :func:`fit` solves that bounded robust linear problem
(``scipy.optimize.least_squares``, started from ``lsq_linear``'s least-squares answer), replays
every run with the new terms (which moves the schedule: batches, queues, preemptions) and repeats
until the terms settle; the result is a fixed point at which the linear model and the simulator
agree. Simulating with every trial of a general optimiser would cost hundreds of replays and fight
the simulator's discrete steps.

The scale is fitted (``fit_scale="auto"``) only when every run is on one GPU (it corrects that
GPU's time, which is not one number across GPUs) and it lowers the fitted residual by at least
:data:`SCALE_MIN_GAIN` of its value: otherwise ``s = 1`` and only the CPU terms are fitted.

:func:`leave_one_out` refits without each run in turn and reports the error on the run left out
(never on a run the terms were fitted to).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear

from ..costmodel.stacks import StackTerms
from .records import RunRecord
from .replay import Replay, compare, replay, run_model

#: The three run-level targets, as (column of the record's requests, name).
TARGETS = (("ttft_s", "ttft"), ("e2e_s", "e2e"), ("tpot_s", "tpot"))
#: Fit the GPU-time scale only when it lowers the residual norm by this share.
SCALE_MIN_GAIN = 0.10
#: Bounds of the fitted terms: scale, per-iteration, per-sequence and per-request (front-end) overhead (s).
BOUNDS = ((0.25, 4.0), (0.0, 0.2), (0.0, 0.02), (0.0, 0.2))
#: Relative error at which the robust (soft L1) loss turns from quadratic to linear.
ROBUST_SCALE = 0.1
#: Weight of the rows that hold undetermined CPU terms at 0 (residual per second of the term).
RIDGE = 0.1
#: An overlapped fit's further starts: CPU times per iteration of these multiples of the runs' median GPU iteration.
CPU_STARTS = (1.5, 3.0)
#: Keep another start's overlapped fit over the additive start's only when it lowers the loss by this share.
CPU_MIN_GAIN = 0.25


def _window_sums(ends: np.ndarray, starts: np.ndarray, cols: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Per request, ``cols`` summed over the iterations that ran in ``(t0, t1]`` (a partly covered
    first iteration counts by the share after ``t0``)."""
    csum = np.vstack([np.zeros((1, cols.shape[1])), np.cumsum(cols, axis=0)])
    lo = np.searchsorted(ends, t0, side="right")
    hi = np.searchsorted(ends, t1 + 1e-12, side="right")
    out = csum[hi] - csum[lo]
    has = lo < hi
    k = np.minimum(lo, len(ends) - 1)
    dur = ends[k] - starts[k]
    before = np.where(has & (starts[k] < t0) & (dur > 0), (t0 - starts[k]) / np.where(dur > 0, dur, 1), 0.0)
    return out - before[:, None] * cols[k]


def design(rep: Replay, terms: StackTerms) -> dict[str, np.ndarray]:
    """Per target, the run's mean metric as a linear function of ``(s, a, b)`` under ``rep``'s schedule.

    ``rep`` must have been replayed with ``terms`` (they are taken out of its iteration times to
    recover the GPU time). Returns ``{"ttft": [G, N, Q], "e2e": [...], "tpot": [...]}``.
    """
    pred = rep.predicted
    arr = rep.record.requests["arrival_s"].to_numpy(dtype=np.float64)
    out_tok = rep.record.requests["output_tokens"].to_numpy(dtype=np.float64)
    rows = {name: np.zeros((len(pred), 3)) for _, name in TARGETS}
    for r, it in enumerate(rep.iterations):
        idx = np.flatnonzero(pred["rank"].to_numpy() == r)
        starts = it["start_s"].to_numpy(dtype=np.float64)
        dur = it["duration_s"].to_numpy(dtype=np.float64)
        seqs = it["batch_size"].to_numpy(dtype=np.float64)
        cpu = terms.overhead_s + terms.overhead_s_per_seq * seqs
        if terms.overlap:  # max(s g, cpu): an iteration moves with s g where the GPU binds, else with a + b S
            gpu_bound = dur > cpu * (1 + 1e-9)
            ran = dur > 0
            gpu = np.where(gpu_bound, dur / terms.gpu_time_scale, 0.0)
            cpu_bound = (ran & ~gpu_bound).astype(np.float64)
            cols = np.column_stack([gpu, cpu_bound, cpu_bound * seqs])
        else:
            gpu = (dur - cpu) / terms.gpu_time_scale
            cols = np.column_stack([gpu, np.ones_like(gpu), seqs])
        ends = starts + dur
        # from the client's send (its arrival unless a --max-concurrency cap held it) to the engine's first
        # and last token: the predicted times less the front end's latency
        a = arr[idx] + pred["client_queue_s"].to_numpy(dtype=np.float64)[idx]
        first = a + pred["ttft_s"].to_numpy(dtype=np.float64)[idx] - rep.front_end_s
        fin = a + pred["e2e_s"].to_numpy(dtype=np.float64)[idx] - rep.front_end_s
        rows["ttft"][idx] = _window_sums(ends, starts, cols, a, first)
        rows["e2e"][idx] = _window_sums(ends, starts, cols, a, fin)
        n1 = np.maximum(out_tok[idx] - 1, 1)
        rows["tpot"][idx] = _window_sums(ends, starts, cols, first, fin) / n1[:, None]
        rows["tpot"][idx[out_tok[idx] <= 1]] = 0.0
    return {name: m.mean(axis=0) for name, m in rows.items()}


@dataclass(frozen=True)
class Fit:
    """A fitted stack and how it was reached: the terms, the fixed-point steps, the fitted runs' residual."""

    terms: StackTerms
    steps: int
    residual: float
    scale_fitted: bool


def _solve(a_rows: np.ndarray, fit_scale: bool, fit_front: bool) -> tuple[np.ndarray, float]:
    """Robust bounded solution of ``a_rows @ (s, a, b, c) = 1`` (``s`` = 1 unless ``fit_scale``, ``c`` = 0
    unless ``fit_front``): the terms and the residual norm of the linear model over the runs' rows."""
    free = np.array([fit_scale, True, True, fit_front])
    lo, hi = np.array([b[0] for b in BOUNDS])[free], np.array([b[1] for b in BOUNDS])[free]
    fixed = np.array([1.0, 0.0, 0.0, 0.0])
    rhs = 1.0 - a_rows[:, ~free] @ fixed[~free]
    data = a_rows[:, free]
    # a term the runs do not determine (a CPU term hidden under the GPU time in every iteration) is
    # held at 0 by one ridge row: residual RIDGE x 1e-3 per ms (per 0.01 ms/sequence; 1e-4), too weak to
    # move a term the runs determine
    ridge = (RIDGE * np.diag([1.0, 100.0, 1.0]))[free[1:]][:, free[1:]]
    m = np.vstack([data, np.hstack([np.zeros((len(ridge), 1)), ridge]) if fit_scale else ridge])
    b = np.concatenate([rhs, np.zeros(len(ridge))])
    x0 = np.clip(lsq_linear(m, b, bounds=(lo, hi)).x, lo, hi)
    x = least_squares(lambda x: m @ x - b, x0, bounds=(lo, hi), loss="soft_l1", f_scale=ROBUST_SCALE).x
    out = fixed.copy()
    out[free] = x
    return out, float(np.linalg.norm(data @ x - rhs))


def _rows(reps: Sequence[Replay], terms: StackTerms) -> np.ndarray:
    """Per run and target, the design row ``(G, N, Q, F)`` over the measured mean (``F``: the front end's
    share, 1 for TTFT and E2E of a client-clocked run, else 0)."""
    out = []
    for rep in reps:
        d = design(rep, terms)
        meas = rep.record.requests
        client = 1.0 if rep.record.setup.client_clock else 0.0
        for col, name in TARGETS:
            out.append(np.append(d[name], 0.0 if name == "tpot" else client) / float(meas[col].mean()))
    return np.asarray(out)


def runs_overlap(runs: Sequence[RunRecord]) -> bool:
    """Whether the runs' engine overlaps its CPU work with the GPU's (all schedule asynchronously,
    :attr:`.records.SetUp.schedules_async`) or adds it (all in step); a mix is refused."""
    modes = {r.setup.schedules_async for r in runs}
    if len(modes) > 1:
        sync = [r.name for r in runs if not r.setup.schedules_async]
        raise ValueError(f"runs {', '.join(sync)} schedule in step and the others asynchronously: one stack "
                         "has one of the two pricings; calibrate each kind on its own, or state async_scheduling in the "
                         "set-up YAML where a run's version decides it wrongly (Python: fit(..., overlap=))")
    return modes.pop()


def runs_kernels(runs: Sequence[RunRecord]) -> str | None:
    """The kernel era the runs' engines ran (:attr:`.records.SetUp.kernels`), which the stack is fitted on
    and states; runs of different eras are refused (one stack rests on one base model)."""
    eras = {r.setup.kernels for r in runs}
    if len(eras) > 1:
        raise ValueError("runs of engines with different kernel eras ("
                         + ", ".join(sorted(f"{r.name}: {r.setup.engine}" for r in runs))
                         + "): one stack rests on one base model; calibrate each engine's runs on their own")
    return eras.pop()


def fit(runs: Sequence[RunRecord], *, name: str = "calibrated", fit_scale: bool | str = "auto",
        base: str | None = None, max_steps: int = 8, tol: float = 0.01, start: StackTerms | None = None,
        overlap: bool | None = None) -> Fit:
    """Fit a stack's terms to ``runs`` (see the module note); ``base`` is the cost-model source under it.

    Parameters
    ----------
    runs : sequence of RunRecord
        At least 2 runs.
    name : str
        The stack's name (the cost-model file's).
    fit_scale : bool or "auto"
        Fit the GPU-time scale (True), keep it at 1 (False), or fit it when it lowers the
        residual by :data:`SCALE_MIN_GAIN` ("auto").
    base : {"measured", "roofline"} or None
        The base cost model (None: measured where the GPU has measurements).
    max_steps, tol : int, float
        Fixed-point steps at most, and the relative change of every term that ends them.
    overlap : bool or None
        The engine overlaps its CPU work with the GPU (vLLM V1's async scheduling): an iteration
        costs ``max(s g, a + b S)``. The CPU terms then move only the iterations they bind (from zero
        no iteration is CPU-bound and they have no gradient), so the fit runs from several starts
        (:func:`_overlap_starts`): the additive fit's terms, and CPU times of :data:`CPU_STARTS` times the
        runs' median GPU iteration, which bind from the first step (a CPU time only a little above the
        GPU's leaves the additive fit's extra time under the GPU's iteration). It keeps the additive
        start's fit unless another's replayed loss (:func:`fit_loss`) is lower by :data:`CPU_MIN_GAIN` of
        it: a few runs of different models can fit a large CPU time a little better in standing for the
        GPU-time errors of some of them (the LLMServingSim runs do, and a run left out is then predicted
        2-3x too slow). CPU work hidden under the GPU in every iteration leaves the terms at 0. None: the
        runs' own scheduling (:attr:`.records.SetUp.schedules_async`: vLLM V1 from v0.14.0 or with
        ``--async-scheduling``; V0 runs the scheduler, the model and the output processing one after
        another), which must be the same for all of them.
    """
    if len(runs) < 2:
        raise ValueError(f"calibration needs at least 2 measured runs, got {len(runs)}")
    if fit_scale not in (True, False, "auto"):
        raise ValueError(f"fit_scale must be True, False or 'auto', got {fit_scale!r}")
    if overlap is None:
        overlap = runs_overlap(runs)
    kernels = runs_kernels(runs)
    if overlap and start is None:
        kw = dict(name=name, fit_scale=fit_scale, base=base, max_steps=max_steps, tol=tol, overlap=True)
        fits = [fit(runs, start=s, **kw) for s in _overlap_starts(runs, kw)]
        losses = [fit_loss(runs, f.terms) for f in fits]
        best = int(np.argmin(losses))
        return fits[best] if losses[best] < (1 - CPU_MIN_GAIN) * losses[0] else fits[0]
    terms = start or StackTerms(name=name, base=base, kernels=kernels)
    if fit_scale == "auto" and len({r.setup.gpu for r in runs}) > 1:
        fit_scale = False  # one scale cannot stand for several GPUs' kernels
    fit_front = any(r.setup.client_clock for r in runs)
    residual, use_scale, step = float("nan"), fit_scale is True, 0
    for step in range(1, max_steps + 1):
        replayed_with = terms
        reps = [replay_with(r, terms) for r in runs]  # the first step: terms of 0 (or the start's)
        a_rows = _rows(reps, terms)
        if fit_scale == "auto":
            x1, r1 = _solve(a_rows, False, fit_front)
            xs, rs = _solve(a_rows, True, fit_front)
            use_scale = rs < (1 - SCALE_MIN_GAIN) * r1
            x, residual = (xs, rs) if use_scale else (x1, r1)
        else:
            x, residual = _solve(a_rows, bool(fit_scale), fit_front)
        old = np.array([terms.gpu_time_scale, terms.overhead_s, terms.overhead_s_per_seq, terms.overhead_s_per_request])
        new = old + 0.7 * (x - old) if step > 2 else x  # damped after two full steps: queues respond non-linearly
        new[1:] = np.where(new[1:] < 1e-9, 0.0, new[1:])  # a term at its bound of 0 (the solver stops 1e-10 inside)
        terms = StackTerms(name=name, base=base, kernels=kernels, gpu_time_scale=float(new[0]), overhead_s=float(new[1]),
                           overhead_s_per_seq=float(new[2]), overhead_s_per_request=float(new[3]), overlap=overlap)
        if np.all(np.abs(new - old) <= tol * np.maximum(np.abs(old), [1e-3, 1e-4, 1e-5, 1e-4])):
            break
    if overlap and not any(_cpu_binds(rep, replayed_with, terms) for rep in reps):  # the ridge's remnant of a term
        terms = replace(terms, overhead_s=0.0, overhead_s_per_seq=0.0)                  # no run shows
    return Fit(terms=terms, steps=step, residual=residual, scale_fitted=bool(use_scale))


def _overlap_starts(runs: Sequence[RunRecord], kw: dict[str, Any]) -> list[StackTerms]:
    """Where an overlapped fit starts (:func:`fit`): the additive fit's terms, overlapped, then CPU times per
    iteration of :data:`CPU_STARTS` times the runs' median GPU iteration on them (no CPU term)."""
    add = replace(fit(runs, **{**kw, "overlap": False}).terms, overlap=True)
    gpu_only = replace(add, overhead_s=0.0, overhead_s_per_seq=0.0)
    dur = np.concatenate([it["duration_s"].to_numpy(dtype=np.float64) for r in runs
                          for it in replay_with(r, gpu_only).iterations])
    median = float(np.median(dur[dur > 0]))
    return [add, *(replace(gpu_only, overhead_s=q * median) for q in CPU_STARTS)]


def fit_loss(runs: Sequence[RunRecord], terms: StackTerms) -> float:
    """The fit's objective on the runs replayed with ``terms``: the robust loss (soft L1 at
    :data:`ROBUST_SCALE`) summed over each run's relative errors of mean TTFT, mean E2E and mean TPOT."""
    z = np.array([[errors_with(r, terms)[f"{m}_mean_err"] for _, m in TARGETS] for r in runs]) / ROBUST_SCALE
    return float(np.sum(2.0 * (np.sqrt(1.0 + z * z) - 1.0)))


def _cpu_binds(rep: Replay, *terms: StackTerms) -> bool:
    """Whether the CPU time of any of ``terms`` reaches the duration of an iteration of ``rep`` (replayed with
    the first of them: where its CPU time bound, the duration is that time; elsewhere the GPU's)."""
    for it in rep.iterations:
        dur, seqs = it["duration_s"].to_numpy(), it["batch_size"].to_numpy()
        if any(np.any((dur > 0) & (t.overhead_s + t.overhead_s_per_seq * seqs >= dur * (1 - 1e-9))) for t in terms):
            return True
    return False


def replay_with(record: RunRecord, terms: StackTerms) -> Replay:
    """``record`` replayed on the base model with ``terms`` (through a temporary cost-model object)."""
    from ..costmodel import cost_model
    from ..costmodel.stacks import apply

    s = record.setup
    cost = apply(cost_model(run_model(record), s.gpu_spec, tp=s.tp, source=terms.base, ep=s.expert_parallel,
                            kernels=terms.kernels, split_attention=s.profile.split_attention), terms)
    return replay(record, cost_model=cost, front_end=terms.overhead_s_per_request if s.client_clock else 0.0)


def errors_with(record: RunRecord, terms: StackTerms) -> dict[str, Any]:
    """:func:`kvlab.validate.compare` of ``record`` replayed with ``terms``."""
    return held_out_replay(record, terms)[0]


def held_out_replay(record: RunRecord, terms: StackTerms) -> tuple[dict[str, Any], Replay]:
    """``record`` replayed with ``terms``: its :func:`compare` row (stack named) and the replay."""
    rep = replay_with(record, terms)
    row = compare(rep)
    row["stack"] = terms.name
    return row, rep


def leave_one_out(runs: Sequence[RunRecord], *, replays: list | None = None, **fit_kw: Any) -> pd.DataFrame:
    """Each run predicted by terms fitted to the other runs: one :func:`compare` row per run.

    A run on a GPU none of the others ran on is predicted without a GPU-time scale (``fit_scale``
    "auto" becomes False: a scale stands for one GPU's kernels). Adds ``held_out_scale``,
    ``held_out_overhead_s``, ``held_out_overhead_s_per_seq``,
    ``held_out_overhead_s_per_request`` (the terms that predicted it). Needs at least 3 runs (2 to fit on).
    A list passed as ``replays`` receives each held-out :class:`~kvlab.validate.replay.Replay` (for per-request plots).
    """
    if len(runs) < 3:
        raise ValueError(f"leave-one-run-out needs at least 3 runs, got {len(runs)}")
    rows = []
    for i, held in enumerate(runs):
        others = [r for j, r in enumerate(runs) if j != i]
        kw = dict(fit_kw)
        if kw.get("fit_scale", "auto") == "auto" and held.setup.gpu not in {r.setup.gpu for r in others}:
            kw["fit_scale"] = False  # a GPU-time scale fitted on other GPUs' kernels does not carry to this one
        f = fit(others, **kw)
        row, rep = held_out_replay(held, f.terms)
        row.update(fold_terms(f.terms))
        rows.append(row)
        if replays is not None:
            replays.append(rep)
    return pd.DataFrame(rows)


def fold_terms(terms: StackTerms) -> dict[str, float]:
    """A held-out row's record of the terms that predicted it (its fold's): the columns :func:`leave_one_out` and
    :func:`kvlab.validate.points.held_out` add."""
    return {"held_out_scale": float(terms.gpu_time_scale), "held_out_overhead_s": float(terms.overhead_s),
            "held_out_overhead_s_per_seq": float(terms.overhead_s_per_seq),
            "held_out_overhead_s_per_request": float(terms.overhead_s_per_request)}


#: The columns of :func:`fold_terms`.
FOLD_TERMS = tuple(fold_terms(StackTerms(name="fold")))


def folds_disagree(held_out: pd.DataFrame) -> str:
    """A note when the folds of :func:`leave_one_out` fitted CPU times per iteration far apart (the largest over 2x
    the smallest and 1 ms above it): the runs do not share one CPU time; ``""`` where they agree."""
    cpu = held_out["held_out_overhead_s"].to_numpy(dtype=np.float64)
    lo, hi = float(cpu.min()), float(cpu.max())
    if hi - lo <= 1e-3 or hi <= 2.0 * lo:
        return ""
    return (f"the folds fitted {lo * 1e3:.3g}-{hi * 1e3:.3g} ms of CPU time per iteration: the runs do not share one "
            "CPU time (runs of different hosts, or one run's GPU-time error standing in for CPU time), so the held-out "
            "errors above are the spread to expect; calibrate on runs of one host")


#: Share of the fitted runs' iterations a CPU time must exceed to show in them (the percentile below).
HIDDEN_PERCENTILE = 10.0


def hidden_cpu_bound_s(runs: Sequence[RunRecord], terms: StackTerms) -> float | None:
    """For overlapped CPU terms that fitted to 0: the GPU time per iteration (s) under which the runs
    could not have shown a CPU time, the :data:`HIDDEN_PERCENTILE`-th percentile of their iterations
    (a CPU time up to it binds fewer than that share of them); None when the CPU terms were fitted
    (or the stack adds its CPU time, V0-style, where every iteration shows it)."""
    if not terms.overlap or terms.overhead_s > 0 or terms.overhead_s_per_seq > 0:
        return None
    dur = np.concatenate([it["duration_s"].to_numpy(dtype=np.float64) for r in runs
                          for it in replay_with(r, terms).iterations])
    return float(np.percentile(dur[dur > 0], HIDDEN_PERCENTILE))


def calibrate(runs: Sequence[RunRecord], *, name: str, label: str = "", command: str = "",
              fit_scale: bool | str = "auto", base: str | None = None, holdout: bool = True,
              overlap: bool | None = None) -> StackTerms:
    """Fit ``runs``, compute leave-one-run-out held-out errors, and return the terms with their record.

    The terms' ``meta`` holds the fitted runs (name, dataset, model, GPU, TP, engine), the
    held-out errors per run and their medians, the cost model the fit rests on, the command that
    remakes it and the date: what a cost-model file states (:func:`kvlab.costmodel.stacks.save`).
    """
    f = fit(runs, name=name, fit_scale=fit_scale, base=base, overlap=overlap)
    meta: dict[str, Any] = {
        "fitted_to": [{"run": r.name, "dataset": r.setup.dataset, "model": r.setup.model, "gpu": r.setup.gpu,
                       "tp": r.setup.tp, "engine": r.setup.engine, "server": f"{r.setup.server} "
                       f"{r.setup.server_version}".strip(), "requests": len(r.requests)} for r in runs],
        "fit": {"steps": f.steps, "residual": f.residual, "scale_fitted": f.scale_fitted},
        "command": command, "date": _dt.date.today().isoformat()}
    hidden = hidden_cpu_bound_s(runs, f.terms)
    if hidden is not None:
        meta["cpu_not_identified_below_s"] = hidden
    if holdout and len(runs) >= 3:
        loo = leave_one_out(runs, name=name, fit_scale=fit_scale, base=base, overlap=overlap)
        keep = ["run", "dataset", "gpu", "model", "ttft_mean_err", "e2e_mean_err", "tpot_mean_err",
                "overload_pred", "overload_meas", "overload_right", "cost_model", *FOLD_TERMS]
        meta["held_out"] = {
            "method": "leave-one-run-out: each run predicted by terms fitted to the others",
            "runs": [{k: (bool(v) if isinstance(v, (np.bool_, bool)) else (float(v) if isinstance(v, (float, np.floating))
                                                                          else v))
                      for k, v in row.items()} for row in loo[keep].to_dict(orient="records")],
            "median_abs_err": {m: float(loo[f"{m}_mean_err"].abs().median()) for m in ("ttft", "e2e", "tpot")},
            "overload_right": int(loo["overload_right"].sum())}
    return StackTerms(name=name, label=label or f"{name} (fitted to {len(runs)} measured runs)", base=base,
                      kernels=f.terms.kernels, gpu_time_scale=f.terms.gpu_time_scale, overhead_s=f.terms.overhead_s,
                      overhead_s_per_seq=f.terms.overhead_s_per_seq,
                      overhead_s_per_request=f.terms.overhead_s_per_request, overlap=f.terms.overlap, meta=meta)
