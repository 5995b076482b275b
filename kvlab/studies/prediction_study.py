"""Studies of reservation and scheduling by predicted output length (what notebook 06 calls).

Each function runs :func:`kvlab.sim.simulate` on one workload and returns a DataFrame of
summary figures; :func:`prediction_claims` turns them into the claims table.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import _validate as v
from .. import claims as _claims
from ..policies import QUEUE_ORDERS
from ..predict import DEFAULT_QUANTILES, LogTPredictive, SyntheticRequests, oracle_predictive, parameter_r2
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
                      tie_beta: float = 1.0, load: float = 1.5, seed: int = 0, **simulate_kw: Any) -> pd.DataFrame:
    """Each waiting-queue order, offline (all requests at time 0) and online (Poisson arrivals).

    The online rate is ``load`` times the rate at which the server completes requests with a
    full queue: half the requests over the median completion time of the FCFS offline run
    (requests/s; the median keeps the slow drain of the last long requests out of it), so the
    queue builds up when ``load > 1`` whatever the model and GPU. One row per order: ``order``,
    ``qps``, offline ``offline_tokens_per_s`` and online ``normalized_latency_s_per_token``
    (mean over requests of end-to-end latency / output tokens: the per-token latency of the
    TIE paper and the vLLM paper), ``tbt_p99_s``, ``e2e_p50_s``, ``e2e_p99_s``,
    ``preemptions_per_request``.
    """
    orders = [v.choice(o, "orders", QUEUE_ORDERS) for o in orders]
    load = v.positive_float(load, "load")
    kw = dict(model=model, gpu=gpu, max_new_tokens=max_new_tokens, quantile=quantile, prediction=prediction,
              tie_beta=tie_beta, seed=seed, **simulate_kw)
    offline = {o: simulate(workload, "predicted", queue_order=o, arrivals="offline", **kw) for o in orders}
    base = offline["fcfs"] if "fcfs" in offline else simulate(workload, "predicted", arrivals="offline", **kw)
    qps = load * 0.5 * len(workload) / float(base.requests["finish_s"].median())
    rows = []
    for o in orders:
        s = simulate(workload, "predicted", queue_order=o, arrivals="poisson", qps=qps, **kw).summary
        rows.append({"order": o, "qps": qps, "offline_tokens_per_s": offline[o].summary["tokens_per_s"],
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "tbt_p99_s": s["tbt_p99_s"], "e2e_p50_s": s["e2e_p50_s"], "e2e_p99_s": s["e2e_p99_s"],
                     "preemptions_per_request": s["preemptions_per_request"]})
    return pd.DataFrame(rows)


def prediction_claims(orders: pd.DataFrame, tradeoff: pd.DataFrame) -> pd.DataFrame:
    """Notebook 06's claims table, every kvlab value computed from the runs passed in.

    Parameters
    ----------
    orders : DataFrame
        :func:`queue_order_study` output with the ``fcfs``, ``shortest_predicted`` and ``tie`` rows.
    tradeoff : DataFrame
        :func:`quantile_tradeoff` output (``predicted`` rows and a ``reserve_max`` row).
    """
    by = orders.set_index("order")
    missing = [o for o in QUEUE_ORDERS if o not in by.index]
    if missing:
        raise ValueError(f"orders lacks the queue order(s) {missing}")
    lat = by["normalized_latency_s_per_token"]
    load_note = f"Poisson load {by['qps'].iloc[0]:.2f} requests/s"
    tie_vs_spf = float(lat["shortest_predicted"] / lat["tie"])
    c1 = _claims.close(
        "TIE lowers per-token latency 2.31x against its strongest baseline (shortest predicted first here)",
        "arXiv 2604.00499 via brief section 5", 2.31, tie_vs_spf, rel_tol=0.25,
        note=f"{load_note}; the strongest baseline (learning-to-rank) is modelled as shortest-predicted-median "
             f"first with the same predictor, so both schedulers see the same information and differ only by "
             f"the tail term")
    tie_vs_fcfs = float(lat["fcfs"] / lat["tie"])
    c2 = _claims.close("TIE lowers per-token latency ~4.7x against FCFS", "secondary source via brief section 5",
                       4.7, tie_vs_fcfs, rel_tol=0.25,
                       note=f"{load_note}; the gain of any shortest-first order grows with the queue, so it "
                            f"depends on the load")
    thr = by["offline_tokens_per_s"]
    c3 = _claims.close("TIE raises offline throughput 1.42x (against FCFS)", "arXiv 2604.00499 via brief section 5",
                       1.42, float(thr["tie"] / thr["fcfs"]), rel_tol=0.25,
                       note="offline every request is queued at once and the same predicted quantile is reserved; "
                            "order only changes which requests share a batch, not how many fit")
    pred = tradeoff[tradeoff["policy"] == "predicted"]
    best = pred.loc[pred["tokens_per_s"].idxmax()]
    worst_case = tradeoff.loc[tradeoff["policy"] == "reserve_max", "tokens_per_s"].iloc[0]
    c4 = _claims.close("Reserving a predicted length gives 6.49x the throughput of worst-case reservation",
                       "S3 (Jin et al., 2023) via brief section 5", 6.49, float(best["tokens_per_s"] / worst_case),
                       rel_tol=0.25,
                       note=f"best quantile {best['run']} vs reserve_max at the same max_new_tokens; the gain is "
                            f"bounded by how many more requests fit (max running {best['max_running']:.0f} vs "
                            f"{tradeoff.loc[tradeoff['policy'] == 'reserve_max', 'max_running'].iloc[0]:.0f}) "
                            f"and by the decode cost growing with the batch")
    return _claims.table([c1, c2, c3, c4])
