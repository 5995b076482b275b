"""Reservation policies compared by simulation: policy sweeps, the overflow question, claims.

These are what notebook 04 calls; each returns a DataFrame or a number computed from
:func:`kvlab.sim.simulate` runs.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from .. import _validate as v
from .. import claims as _claims
from ..sim import simulate
from ..sweep import sweep

SUMMARY_COLUMNS = ("max_running", "mean_batch_size", "tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s",
                   "e2e_p50_s", "e2e_p99_s", "preemptions_per_request", "num_aborted", "mean_kv_used_frac",
                   "mean_kv_reserved_frac", "reserved_unused_page_s", "normalized_latency_s_per_token")


def policy_sweep(workload: pd.DataFrame, policies: Sequence[str], max_new_tokens_grid: Sequence[int], *,
                 model: str, gpu: str, **simulate_kw: Any) -> pd.DataFrame:
    """Summary figures of every policy at every ``max_new_tokens`` (one row per pair).

    A :func:`kvlab.sweep` over policy x max_new_tokens; extra keywords are fixed simulate
    parameters (same workload, model, GPU and pool for all).
    """
    grid = {"policy": list(policies),
            "max_new_tokens": v.positive_int_array(max_new_tokens_grid, "max_new_tokens_grid").tolist()}
    table = sweep(workload, grid, fixed={"model": model, "gpu": gpu, **simulate_kw}, progress=False)
    return table[["policy", "max_new_tokens", *SUMMARY_COLUMNS]]


def tail_share(requests: pd.DataFrame, *, q: float = 90) -> float:
    """Share of preempted, completed requests whose end-to-end latency is above the run's p``q``.

    ``1 - q / 100`` if preemption struck at random; near 1 when it concentrates in the tail.
    NaN when no completed request was preempted.
    """
    done = requests[requests["outcome"] != "finished_aborted"]
    hit = done[done["num_preemptions"] > 0]
    if hit.empty:
        return float("nan")
    return float((hit["e2e_s"] > np.percentile(done["e2e_s"], q)).mean())


def overflow_study(workload: pd.DataFrame, *, reserve_tokens: int, max_new_tokens: int, model: str, gpu: str,
                   modes: Sequence[str] = ("recompute", "swap", "reject"), **simulate_kw: Any) -> pd.DataFrame:
    """Reserve ``reserve_tokens`` of output per request; what each preemption mode does to the overrun.

    Runs TGI's capped reservation (``cap_tokens = reserve_tokens``, ``max_new_tokens`` as the
    server cap; a request that outgrows its reservation is preempted) under each mode, next to
    a baseline with the same footprint and no preemption: ``reserve_max`` with
    ``max_new_tokens = reserve_tokens``, which truncates the overrunning requests instead. One
    row per run: p50/p99 end-to-end latency (seconds), preempted share, aborted and truncated
    requests, tail share (:func:`tail_share`), throughput.
    """
    reserve_tokens = v.positive_int(reserve_tokens, "reserve_tokens")
    runs = [(f"cap at {reserve_tokens} (truncate)", "reserve_max", "recompute", reserve_tokens, {})]
    runs += [(f"reserve {reserve_tokens}, {m}", "tgi", m, max_new_tokens, {"cap_tokens": reserve_tokens})
             for m in modes]
    rows = []
    for label, policy, mode, cap, params in runs:
        res = simulate(workload, policy, model=model, gpu=gpu, max_new_tokens=cap, preemption_mode=mode,
                       **params, **simulate_kw)
        s = res.summary
        rows.append({"run": label, "policy": policy, "preemption_mode": mode, "e2e_p50_s": s["e2e_p50_s"],
                     "e2e_p99_s": s["e2e_p99_s"], "preempted_request_frac": s["preempted_request_frac"],
                     "num_aborted": s["num_aborted"], "num_truncated": s["num_length_capped"],
                     "tail_share": tail_share(res.requests),
                     "tokens_per_s": s["tokens_per_s"], "max_running": s["max_running"]})
    return pd.DataFrame(rows)


def decode_scaling(iterations: pd.DataFrame) -> tuple[float, float]:
    """Slope and correlation of log(decode tokens/s) on log(batch size) over decode-only iterations.

    A slope of 1 means one forward pass serves the whole batch at no extra cost (throughput
    linear in batch size); KV reads that grow with the batch pull it below 1.
    """
    dec = iterations[(iterations["prefill_tokens"] == 0) & (iterations["decode_tokens"] > 0)
                     & (iterations["duration_s"] > 0)]
    if dec["batch_size"].nunique() < 2:
        raise ValueError("iterations need decode-only iterations of at least two batch sizes")
    fit = stats.linregress(np.log(dec["batch_size"]), np.log(dec["decode_tokens"] / dec["duration_s"]))
    return float(fit.slope), float(fit.rvalue)


def policy_claims(sweep: pd.DataFrame, overflow: pd.DataFrame, iterations: pd.DataFrame, *,
                  kvlab_setup: _claims.SetUp | str = "", cost_model: str = "", workload: str = "",
                  num_requests: int | None = None) -> pd.DataFrame:
    """The seed essay's claims of notebook 04, every value computed from the simulations passed in.

    The seed essay states these for serving in general, not for one set-up; kvlab checks them in
    the set-up it ran (``kvlab_setup``, on ``workload`` of ``num_requests`` requests), under the
    cost model that ran (``cost_model``: its value goes in that column). The vLLM paper's capacity
    claims are :mod:`kvlab.studies.vllm_paper`'s.

    Parameters
    ----------
    sweep : DataFrame
        :func:`policy_sweep` output (must include ``reserve_max`` at two or more caps).
    overflow : DataFrame
        :func:`overflow_study` output (with a ``tgi`` recompute row).
    iterations : DataFrame
        The per-iteration table of one run (for :func:`decode_scaling`).
    kvlab_setup : SetUp or str
        The set-up the runs used.
    cost_model : {"roofline", "measured", ""}
        The cost model the runs used ("" for a figure no cost model enters).
    workload : str
        The trace or profile the runs used (for the rows' provenance).
    num_requests : int, optional
        Requests per run.
    """
    def val(x: float) -> float | dict[str, float]:
        return {cost_model: x} if cost_model else x

    def inputs(metric: str, read_from: str) -> _claims.Inputs:
        return _claims.Inputs(trace=workload, trace_kind="stated in general" if workload else "no trace",
                              num_requests=num_requests, metric=metric, read_from=read_from)
    brief = "the seed essay's serving in general"
    kw = dict(source_setup=brief, kvlab_setup=kvlab_setup)
    # 1. decode throughput vs batch size.
    slope, r = decode_scaling(iterations)
    c1 = _claims.close("Throughput grows about linearly with batch size (decode tokens/s vs batch, log-log slope)",
                       "the seed essay, section 2", 1.0, val(slope), rel_tol=0.25,
                       note=f"r = {r:.2f}; below 1 as the KV read grows with the batch",
                       inputs=inputs("throughput vs batch size", "log-log fit over the decode-only iterations of "
                                     "one vllm run"), **kw)
    # 2. TTFT rises with max_new_tokens under reserve-to-max.
    rm = sweep[sweep["policy"] == "reserve_max"].sort_values("max_new_tokens")
    ratio = float(rm["ttft_p50_s"].iloc[-1] / rm["ttft_p50_s"].iloc[0])
    c2 = _claims.at_least(
        f"A large max_new_tokens raises TTFT through queueing (reserve_max p50 TTFT, "
        f"{int(rm['max_new_tokens'].iloc[-1])} vs {int(rm['max_new_tokens'].iloc[0])} tokens)",
        "the seed essay, section 2", 2.0, val(ratio), note="ratio of p50 TTFT",
        inputs=inputs("TTFT against max_new_tokens", "p50 TTFT of the reserve_max rows of the policy sweep"), **kw)
    # 3. preemption concentrates in the tail.
    rec = overflow[(overflow["policy"] == "tgi") & (overflow["preemption_mode"] == "recompute")].iloc[0]
    base = overflow[overflow["policy"] == "reserve_max"].iloc[0]
    c3 = _claims.at_least(
        "Preemption concentrates in the tail (share of preempted requests above the p90 latency)",
        "the seed essay, section 4", 0.5, val(float(rec["tail_share"])),
        inputs=inputs("where preemption strikes", "the overflow study's tgi recompute run: preempted requests "
                      "above the p90 end-to-end latency"),
        note=f"random would give 0.1; recompute vs truncating at the reservation: p50 x{rec['e2e_p50_s'] / base['e2e_p50_s']:.2f}, "
             f"p99 x{rec['e2e_p99_s'] / base['e2e_p99_s']:.2f}", **kw)
    return _claims.table([c1, c2, c3])
