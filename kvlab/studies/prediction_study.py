"""Studies of reservation and scheduling by predicted output length (what notebook 06 calls).

Each function runs :func:`kvlab.sim.simulate` on one workload and returns a DataFrame of
summary figures; :func:`tie_claims` and :func:`s3_claims` turn them into claims tables, in
(or, for TIE, next to) the sources' own set-ups.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from .. import _validate as v
from .. import claims as _claims
from ..policies import QUEUE_ORDERS
from ..predict import (DEFAULT_QUANTILES, LogTPredictive, RankedPrediction, SyntheticRequests, oracle_predictive,
                       parameter_r2, ranking_scores)
from ..presets import SourceSetup
from ..sim import simulate

#: Summary figures every study row carries.
METRICS = ("tokens_per_s", "preemptions_per_request", "preempted_request_frac", "over_reserved_frac",
           "mean_kv_used_frac", "tbt_p50_s", "tbt_p99_s", "e2e_p99_s", "normalized_latency_s_per_token",
           "max_running")


def _metrics(summary: dict[str, float]) -> dict[str, float]:
    """The :data:`METRICS` of one run; ``over_reserved_frac`` is the time-weighted share of the
    pool promised to requests but holding no KV."""
    out = {k: summary[k] for k in METRICS if k in summary}
    out["over_reserved_frac"] = summary["mean_kv_reserved_frac"] - summary["mean_kv_used_frac"]
    return {k: out[k] for k in METRICS}


def quantile_tradeoff(workload: pd.DataFrame, prediction: LogTPredictive, *, model: str, gpu: str,
                      max_new_tokens: int, quantiles: Sequence[float] = DEFAULT_QUANTILES,
                      **simulate_kw: Any) -> pd.DataFrame:
    """Reserve each predicted quantile, next to reserve-to-max and vLLM's on-demand paging.

    One row per run (``run``, ``policy``, ``quantile`` (NaN for the baselines) and
    :data:`METRICS`): ``predicted`` at every quantile of ``quantiles``, ``reserve_max``
    (prompt + ``max_new_tokens``) and ``vllm``. Extra keywords go to :func:`kvlab.simulate`.
    """
    qs = [v.fraction(q, "quantile", high_closed=False) for q in quantiles]
    if not qs:
        raise ValueError("quantiles must hold at least one quantile in (0, 1)")
    kw = dict(model=model, gpu=gpu, max_new_tokens=max_new_tokens, **simulate_kw)
    rows = []
    for q in qs:
        s = simulate(workload, "predicted", quantile=q, prediction=prediction, **kw).summary
        rows.append({"run": f"predicted p{100 * q:g}", "policy": "predicted", "quantile": q, **_metrics(s)})
    for policy in ("reserve_max", "vllm"):
        s = simulate(workload, policy, **kw).summary
        rows.append({"run": policy, "policy": policy, "quantile": np.nan, **_metrics(s)})
    return pd.DataFrame(rows)


def quality_sweep(requests: SyntheticRequests, r2_grid: Sequence[float], *, model: str, gpu: str,
                  max_new_tokens: int, quantiles: Sequence[float] = (0.9,), seed: int = 0,
                  **simulate_kw: Any) -> pd.DataFrame:
    """Reserve each of ``quantiles`` with predictors of quality R^2 from ``r2_grid``.

    For each target R^2 (used for both ``mu`` and ``log sigma``), the oracle
    :func:`kvlab.predict.oracle_predictive` predicts ``requests.truth``; one row per (target,
    quantile): ``r2_target``, the R^2 the predictor reached (``mu_r2``, ``log_sigma_r2``),
    ``quantile`` and :data:`METRICS`. At one quantile a sharper predictor trades differently
    (each request reserves its own tail); across quantiles each predictor traces a curve of
    preemptions against over-reservation, which :func:`preemptions_at` compares at one level.
    """
    if not isinstance(requests, SyntheticRequests):
        raise ValueError(f"requests must be kvlab.predict.SyntheticRequests, got {type(requests).__name__}")
    grid = [v.fraction(r, "r2_grid", low_open=False) for r in r2_grid]
    qs = [v.fraction(q, "quantile", high_closed=False) for q in quantiles]
    if not grid or not qs:
        raise ValueError("r2_grid and quantiles must each hold at least one value")
    rows = []
    for r2 in grid:
        pred = oracle_predictive(requests.truth, r2_mu=r2, r2_log_sigma=r2, seed=seed)
        got = parameter_r2(pred, requests.truth)
        for q in qs:
            s = simulate(requests.trace, "predicted", quantile=q, prediction=pred, model=model, gpu=gpu,
                         max_new_tokens=max_new_tokens, seed=seed, **simulate_kw).summary
            rows.append({"r2_target": r2, "mu_r2": got.mu_r2, "log_sigma_r2": got.log_sigma_r2, "quantile": q,
                         **_metrics(s)})
    return pd.DataFrame(rows)


def preemptions_at(quality: pd.DataFrame, over_reserved_frac: float) -> pd.DataFrame:
    """Each predictor's preemptions per request at a common over-reservation, from its curve.

    Linear interpolation of ``preemptions_per_request`` against ``over_reserved_frac`` along
    each ``r2_target``'s rows of :func:`quality_sweep` (NaN outside the range the curve covers),
    so predictors are compared at equal waste: the lower, the more the prediction is worth.
    One row per predictor: ``r2_target``, ``mu_r2``, ``preemptions_per_request``.
    """
    level = v.fraction(over_reserved_frac, "over_reserved_frac", low_open=False)
    rows = []
    for r2, curve in quality.groupby("r2_target", sort=True):
        c = curve.sort_values("over_reserved_frac")
        x, y = c["over_reserved_frac"].to_numpy(), c["preemptions_per_request"].to_numpy()
        value = float(np.interp(level, x, y)) if x[0] <= level <= x[-1] else float("nan")
        rows.append({"r2_target": r2, "mu_r2": float(c["mu_r2"].iloc[0]), "preemptions_per_request": value})
    return pd.DataFrame(rows)


def queue_order_study(workload: pd.DataFrame, prediction: LogTPredictive, *, model: str, gpu: str,
                      max_new_tokens: int, quantile: float = 0.9, orders: Sequence[str] = QUEUE_ORDERS,
                      tie_beta: float = 1.0, kendall_tau: float = 0.55, load: float = 1.5,
                      budget_frac: float = 0.5, seed: int = 0, **simulate_kw: Any) -> pd.DataFrame:
    """Each waiting-queue order, offline (all requests at time 0) and online (Poisson arrivals).

    Every order reserves the same thing (``quantile`` of ``prediction``) and differs only in
    which waiting request goes first: ``fcfs``; ``shortest_predicted`` (the predicted median);
    ``tie`` (TIE's score from ``prediction``); ``ltr``, a learning-to-rank scheduler whose scores
    have Kendall tau ``kendall_tau`` with the true lengths (:func:`kvlab.predict.ranking_scores`:
    its own ranking error, not ``prediction``'s).

    The online rate is ``load`` times the rate at which the server completes requests with a
    full queue: half the requests over the median completion time of the FCFS offline run
    (requests/s), so the queue builds up when ``load > 1`` whatever the model and GPU.

    Offline, two throughputs: ``offline_tokens_per_s`` over the whole makespan (every order
    generates the same tokens, so it moves only through batching), and
    ``offline_requests_per_s_in_budget``, the requests finished within a time budget of
    ``budget_frac`` x the FCFS makespan, per second of budget (synthetic-data generation as a
    job that stops at a deadline: the order decides how many samples are done by then).

    Returns one row per order: ``order``, ``qps``, ``kendall_tau`` (achieved, for ``ltr``),
    ``offline_tokens_per_s``, ``offline_requests_per_s_in_budget``, online
    ``normalized_latency_s_per_token`` (mean over requests of end-to-end latency / output
    tokens: the per-token latency of the TIE and vLLM papers), ``tbt_p99_s``, ``e2e_p50_s``,
    ``e2e_p99_s``, ``preemptions_per_request``.
    """
    orders = [v.choice(o, "orders", QUEUE_ORDERS) for o in orders]
    load = v.positive_float(load, "load")
    budget_frac = v.fraction(budget_frac, "budget_frac")
    scores, tau = ranking_scores(workload["output_tokens"].to_numpy(), kendall_tau, seed=seed)
    ranked = RankedPrediction(reserve=prediction, scores=scores, kendall_tau=tau)
    kw = dict(model=model, gpu=gpu, max_new_tokens=max_new_tokens, quantile=quantile, tie_beta=tie_beta, seed=seed,
              **simulate_kw)

    def run(order: str, **more: Any) -> Any:
        return simulate(workload, "predicted", queue_order=order, prediction=ranked if order == "ltr" else prediction,
                        **kw, **more)

    offline = {o: run(o, arrivals="offline") for o in orders}
    base = offline["fcfs"] if "fcfs" in offline else run("fcfs", arrivals="offline")
    qps = load * 0.5 * len(workload) / float(base.requests["finish_s"].median())
    budget_s = budget_frac * float(base.requests["finish_s"].max())
    rows = []
    for o in orders:
        s = run(o, arrivals="poisson", qps=qps).summary
        done = int((offline[o].requests["finish_s"] <= budget_s).sum())
        rows.append({"order": o, "qps": qps, "kendall_tau": tau if o == "ltr" else float("nan"),
                     "offline_tokens_per_s": offline[o].summary["tokens_per_s"],
                     "offline_requests_per_s_in_budget": done / budget_s,
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "tbt_p99_s": s["tbt_p99_s"], "e2e_p50_s": s["e2e_p50_s"], "e2e_p99_s": s["e2e_p99_s"],
                     "preemptions_per_request": s["preemptions_per_request"]})
    return pd.DataFrame(rows)


def tie_claims(orders: Mapping[str, pd.DataFrame], setup: SourceSetup, *, workload: str = "") -> pd.DataFrame:
    """TIE's claims: not reproducible here (its set-up is not stated), with kvlab's stand-in values.

    Parameters
    ----------
    orders : mapping
        Cost model name -> :func:`queue_order_study` output with the ``fcfs``, ``ltr`` and
        ``tie`` rows, run in the stand-in set-up ``setup`` (:func:`kvlab.presets.source_setup`
        ``tie-lmsys``).
    """
    def value(col: str, num: str, den: str) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for cm in _claims.COST_MODELS:
            if cm in orders:
                by = orders[cm].set_index("order")[col]
                out[cm] = float(by[num] / by[den])
            else:
                out[cm] = None
        return out

    first = next(iter(orders.values())).set_index("order")
    inputs = _claims.Inputs(trace=workload or "synthetic requests", trace_kind="stand-in",
                            differs=("synthetic log-t requests stand in for LMSYS-Chat-1M",),
                            metric="per-token latency (mean end-to-end latency / output tokens) online; requests "
                                   "finished within a time budget offline",
                            read_from="kvlab.studies.prediction_study.queue_order_study, one online and one offline "
                                      "run per order")
    stand_in = setup.kvlab_setup(workload=f"{workload}; Poisson {first['qps'].iloc[0]:.2f} requests/s; LTR "
                                          f"Kendall tau {first.loc['ltr', 'kendall_tau']:.2f}")
    src, source = setup.source_setup(), "Zheng et al., TIE (arXiv 2604.00499)"
    rows = [
        _claims.not_reproducible("TIE lowers per-token latency 2.31x against its strongest baseline, learning to rank "
                                 "(LTR per-token latency / TIE's)", source, "2.31x", setup.missing,
                                 value=value("normalized_latency_s_per_token", "ltr", "tie"), unit="x",
                                 source_setup=src, kvlab_setup=stand_in, inputs=inputs),
        _claims.not_reproducible("TIE lowers per-token latency ~4.7x against FCFS", source + " via a secondary source "
                                 "(the seed essay, section 5)", "~4.7x", setup.missing,
                                 value=value("normalized_latency_s_per_token", "fcfs", "tie"), unit="x",
                                 source_setup=src, kvlab_setup=stand_in, inputs=inputs),
        _claims.not_reproducible("TIE raises offline data-generation throughput 1.42x (requests finished within a "
                                 "time budget, TIE / LTR)", source, "1.42x", setup.missing,
                                 value=value("offline_requests_per_s_in_budget", "tie", "ltr"), unit="x",
                                 source_setup=src, kvlab_setup=stand_in, inputs=inputs),
    ]
    return _claims.table(rows)


def s3_study(workload: pd.DataFrame, setup: SourceSetup, *, quantiles: Sequence[float] = DEFAULT_QUANTILES,
             r2_mu: float = 0.82, cost_models: Sequence[str] = ("roofline", "measured"), seed: int = 0,
             engine: str = "fast") -> pd.DataFrame:
    """S3's comparison in its set-up: reserve a predicted quantile against reserving the maximum sequence length.

    Offline (all requests at time 0). The worst case reserves ``setup.max_model_len`` tokens in
    total per request (``orca_max``); the predicted policy reserves each request's predicted
    ``quantile`` (:func:`kvlab.policies.predicted.realized_length_predictive` of quality
    ``r2_mu``, standing in for S3's predictor) and grows on demand. One row per (cost model,
    run): ``cost_model``, ``run``, ``quantile``, ``tokens_per_s``, ``max_running``,
    ``preemptions_per_request``. ``measured`` is skipped on a GPU without measurements.
    """
    qs = [v.fraction(q, "quantile", high_closed=False) for q in quantiles]
    rows = []
    reasons = _claims.cost_models_for(setup.model, setup.gpu, tp=setup.tp, cost_models=list(cost_models))
    for cm in cost_models:
        if reasons[cm]:
            continue
        kw = dict(setup.simulate_kw(), max_new_tokens=setup.max_model_len, arrivals="offline", seed=seed,
                  cost_model=cm, engine=engine)
        s = simulate(workload, "orca_max", max_model_len=setup.max_model_len, **kw).summary
        rows.append({"cost_model": cm, "run": "worst case (orca_max)", "quantile": np.nan, **_metrics(s)})
        for q in qs:
            s = simulate(workload, "predicted", quantile=q, r2_mu=r2_mu, **kw).summary
            rows.append({"cost_model": cm, "run": f"predicted p{100 * q:g}", "quantile": q, **_metrics(s)})
    return pd.DataFrame(rows)


def s3_claims(study: pd.DataFrame, setup: SourceSetup, *, workload: str = "", r2_mu: float = 0.82,
              num_requests: int | None = None) -> pd.DataFrame:
    """S3's "up to 6.49x throughput over worst-case reservation" in its set-up, per cost model.

    kvlab's value is the best predicted quantile's offline throughput over the worst case's
    ("up to"). Its inputs are stand-ins, so the row gives no verdict: the Alpaca lengths come from
    a profile matched to the vLLM paper's means (S3's own Alpaca lengths are not in the sources
    kvlab holds), S3's predictor is stood in for by a log-t predictor of R^2 ``r2_mu``, and the
    sample of ``num_requests`` bounds the batch and the makespan the throughput is read over.
    Where S3 states no batch limit (``setup.max_num_seqs_stated`` false) the cap is lifted, and
    the row says so.
    """
    value: dict[str, float | None] = {cm: None for cm in _claims.COST_MODELS}
    best, worst_batch = {}, {}
    for cm, t in study.groupby("cost_model", sort=False):
        worst = t.loc[t["quantile"].isna()].iloc[0]
        pred = t[t["quantile"].notna()]
        top = pred.loc[pred["tokens_per_s"].idxmax()]
        value[cm], best[cm] = float(top["tokens_per_s"]) / float(worst["tokens_per_s"]), top["run"]
        worst_batch[cm] = (int(worst["max_running"]), int(top["max_running"]))
    cap = ("S3 states no batch limit: the cap is lifted (the KV pool bounds the batch)" if not setup.max_num_seqs_stated
           else f"batch cap {setup.max_num_seqs} requests, as the source states")
    why = [f"best quantile {', '.join(f'{r} ({cm})' for cm, r in best.items())}", cap,
           "largest batch, worst case vs best quantile: " + ", ".join(f"{a:,} vs {b:,} ({cm})"
                                                                       for cm, (a, b) in worst_batch.items())]
    why += [x for x in [_claims.not_run_note(_claims.cost_models_for(setup.model, setup.gpu, tp=setup.tp))] if x]
    differs = (f"S3's predictor stood in for by a log-t predictor of R^2 {r2_mu:g} on the realized lengths",
               "Alpaca lengths from a profile matched to the vLLM paper's means",
               f"the throughput is read over one sample's makespan{f' ({num_requests:,} requests)' if num_requests else ''}, "
               "which bounds the batch either policy can reach")
    inputs = _claims.Inputs(trace=setup.profile, trace_kind="fitted profile", num_requests=num_requests,
                            metric="offline throughput, predicted-length reservation over worst-case reservation",
                            read_from="generated tokens/s over the makespan of one offline run per policy and quantile",
                            differs=differs)
    return _claims.table([_claims.close(
        "Reserving a predicted length gives up to 6.49x the throughput of reserving the maximum sequence length",
        "Jin et al., S3 (arXiv 2306.06000)", 6.49, value, unit="x", source_setup=setup.source_setup(),
        kvlab_setup=setup.kvlab_setup(workload=workload), note="; ".join(why), inputs=inputs)])
