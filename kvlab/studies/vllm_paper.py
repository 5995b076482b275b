"""The vLLM paper's comparison with the Orca baselines, run in the paper's own set-up (notebook 04).

Kwon et al. (SOSP'23) serve ShareGPT requests arriving as a Poisson process and plot normalized
latency (mean over requests of end-to-end latency / output tokens) against the request rate
(Fig. 12); a system's capacity is the rate where that curve turns up. vLLM sustains 1.7-2.7x the
rate of Orca (Oracle) and 2.7-8x that of Orca (Max) "while maintaining similar latencies"
(section 6.2), and batches 2.2x the requests of Orca (Oracle) at 2 requests/s (Fig. 13a).

kvlab runs the set-up of :func:`kvlab.presets.source_setup` (``vllm-sosp23-opt-13b``: OPT-13B on
one A100-40GB, vLLM 0.1's prefill-first scheduler with its 2,560-token batch limit, maximum
sequence 2,048 tokens, the vLLM-paper ShareGPT profile) and, like the paper's benchmark, drops
requests longer than the maximum sequence length. :func:`latency_curves` simulates each policy
over a grid of rates (one curve per policy and cost model, the key figure);
:func:`rate_at_latency` reads the largest rate whose normalized latency stays within a bound
(linear interpolation in log rate between the last grid rate within it and the first beyond),
so several bounds are read off one set of runs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import _validate as v
from .. import claims as _claims
from ..lengths import profile as _profile
from ..presets import SourceSetup, source_setup
from ..reservation import pool_pages
from ..specs import GIB, model as _model
from ..sim import simulate

#: The policies of the paper's Fig. 12 (Orca's three reservation variants and vLLM).
POLICIES = ("vllm", "orca_oracle", "orca_pow2", "orca_max")
#: The claims' source, as the rows cite it.
SOURCE = "Kwon et al., vLLM (SOSP'23)"
#: The paper's Table 1: KV cache slots (tokens) of OPT-13B / 66B / 175B on their GPUs.
TABLE1_KV_SLOTS = {"vllm-sosp23-opt-13b": 15_700, "vllm-sosp23-opt-66b": 9_700}


def paper_requests(setup: SourceSetup, num_requests: int, *, seed: int = 0,
                   workload: pd.DataFrame | None = None) -> tuple[pd.DataFrame, int]:
    """``num_requests`` requests of the set-up's profile (or of ``workload``) within its maximum sequence length.

    As the paper's benchmark does, requests with prompt + output beyond ``setup.max_model_len``
    are dropped (more are drawn to make up the number). Returns the requests and how many were
    dropped per ``num_requests`` kept (on the last draw).
    """
    num_requests = v.positive_int(num_requests, "num_requests")
    if workload is None:
        draw = _profile(setup.profile).sample(4 * num_requests, seed=seed)
    else:
        v.require_columns(workload, ("prompt_tokens", "output_tokens"), "workload")
        draw = workload
    fits = ((draw["prompt_tokens"] + draw["output_tokens"]) <= setup.max_model_len).to_numpy()
    where = np.flatnonzero(fits)
    if where.size < num_requests:
        raise ValueError(f"only {where.size} of the requests fit the {setup.max_model_len}-token maximum sequence "
                         f"length; need num_requests={num_requests}")
    kept = draw.iloc[where[:num_requests]].reset_index(drop=True)[["prompt_tokens", "output_tokens"]]
    return kept, int(where[num_requests - 1] + 1 - num_requests)


def latency_curves(requests: pd.DataFrame, setup: SourceSetup, qps_grid: Sequence[float], *,
                   policies: Sequence[str] = POLICIES, cost_models: Sequence[str] = ("roofline", "measured"),
                   stop_at_s_per_token: float | None = 2.0, keep_qps: Sequence[float] = (2.0,), seed: int = 0,
                   engine: str = "fast") -> pd.DataFrame:
    """Normalized latency against request rate, per policy and cost model (the paper's Fig. 12).

    Parameters
    ----------
    requests : DataFrame
        ``prompt_tokens``, ``output_tokens`` (:func:`paper_requests`).
    setup : SourceSetup
        Model, GPU, scheduler and maximum sequence length (Orca (Max) reserves it).
    qps_grid : sequence of float
        Request rates (requests/s), run in increasing order.
    policies : sequence of str
    cost_models : sequence of {"roofline", "measured"}
        ``measured`` is skipped where it cannot run (:func:`kvlab.claims.cost_models_for`).
    stop_at_s_per_token : float or None
        Skip a curve's higher rates after the first whose normalized latency exceeds this (the
        queue only grows at higher rates; skipping them saves the slowest runs) ...
    keep_qps : sequence of float
        ... except these rates of the grid (the paper's Fig. 13a reads batch sizes at 2 requests/s).
    seed : int
        Seed of the Poisson arrivals.

    Returns
    -------
    DataFrame
        One row per run: ``cost_model``, ``policy``, ``qps``, ``normalized_latency_s_per_token``,
        ``mean_batch_size``, ``max_running``, ``tokens_per_s``, ``num_aborted``.
    """
    grid = np.sort(np.asarray([v.positive_float(q, "qps_grid") for q in qps_grid], dtype=np.float64))
    if grid.size == 0:
        raise ValueError("qps_grid must hold at least one rate (requests/s)")
    rows = []
    reasons = _claims.cost_models_for(setup.model, setup.gpu, tp=setup.tp, cost_models=list(cost_models))
    for cm in [c for c in cost_models if not reasons[c]]:
        for policy in policies:
            extra = {"max_model_len": setup.max_model_len} if policy == "orca_max" else {}
            over = False
            for qps in grid:
                if over and not np.any(np.isclose(qps, keep_qps)):
                    continue
                s = simulate(requests, policy, arrivals="poisson", qps=float(qps), seed=seed,
                             max_new_tokens=setup.max_model_len, cost_model=cm, engine=engine,
                             **setup.simulate_kw(), **extra).summary
                rows.append({"cost_model": cm, "policy": policy, "qps": float(qps),
                             "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                             "mean_batch_size": s["mean_batch_size"], "max_running": s["max_running"],
                             "tokens_per_s": s["tokens_per_s"], "num_aborted": s["num_aborted"]})
                over = over or (stop_at_s_per_token is not None
                                and s["normalized_latency_s_per_token"] > stop_at_s_per_token)
    return pd.DataFrame(rows)


def rate_at_latency(curve: pd.DataFrame, bound_s_per_token: float) -> float:
    """Largest rate at which one curve's normalized latency stays within ``bound_s_per_token`` (requests/s).

    The curve's rows (``qps``, ``normalized_latency_s_per_token``) are read in rate order up to
    the first rate beyond the bound, interpolated linearly in log rate between it and the rate
    before. NaN when even the lowest rate exceeds the bound; the highest rate when none does
    (a lower bound: the grid did not reach the knee).
    """
    bound = v.positive_float(bound_s_per_token, "bound_s_per_token")
    c = curve.sort_values("qps")
    q, lat = c["qps"].to_numpy(dtype=np.float64), c["normalized_latency_s_per_token"].to_numpy(dtype=np.float64)
    over = np.flatnonzero(~(lat <= bound))
    if over.size == 0:
        return float(q[-1])
    i = int(over[0])
    if i == 0:
        return float("nan")
    frac = (bound - lat[i - 1]) / (lat[i] - lat[i - 1])
    return float(np.exp(np.log(q[i - 1]) + frac * (np.log(q[i]) - np.log(q[i - 1]))))


def capacity_ratios(curves: pd.DataFrame, bounds_s_per_token: Sequence[float]) -> pd.DataFrame:
    """vLLM's rate over each Orca variant's at each normalized-latency bound, per cost model (and seed).

    One row per (cost model, seed, bound): ``rate_<policy>`` for every policy of ``curves`` and
    ``vllm_over_<policy>`` for the Orca variants. ``seed`` is 0 when ``curves`` has no seed column.
    """
    curves = curves if "seed" in curves else curves.assign(seed=0)
    rows = []
    for (cm, sd), by_cm in curves.groupby(["cost_model", "seed"], sort=False):
        for bound in bounds_s_per_token:
            row: dict[str, Any] = {"cost_model": cm, "seed": int(sd), "bound_s_per_token": float(bound)}
            rates = {p: rate_at_latency(c, bound) for p, c in by_cm.groupby("policy", sort=False)}
            row.update({f"rate_{p}": r for p, r in rates.items()})
            for p, r in rates.items():
                if p != "vllm" and "vllm" in rates:
                    row[f"vllm_over_{p}"] = rates["vllm"] / r if r > 0 else float("nan")
            rows.append(row)
    return pd.DataFrame(rows)


def _ratio_values(ratios: pd.DataFrame, col: str, bound: float) -> dict[str, list[float] | None]:
    """``{cost model: [ratio per seed] or None}`` at one bound."""
    out: dict[str, list[float] | None] = {}
    for cm in _claims.COST_MODELS:
        r = ratios[(ratios["cost_model"] == cm) & np.isclose(ratios["bound_s_per_token"], bound)]
        out[cm] = r[col].tolist() if len(r) and col in r else None
    return out


def _batch_values(curves: pd.DataFrame, batch_qps: float) -> dict[str, list[float] | None]:
    """``{cost model: [vLLM's mean batch over Orca (Oracle)'s per seed] or None}`` at ``batch_qps``."""
    curves = curves if "seed" in curves else curves.assign(seed=0)
    at = curves[np.isclose(curves["qps"], batch_qps)]
    out: dict[str, list[float] | None] = {}
    for cm in _claims.COST_MODELS:
        got = []
        for _, by in at[at["cost_model"] == cm].groupby("seed"):
            b = by.set_index("policy")["mean_batch_size"]
            if {"vllm", "orca_oracle"} <= set(b.index):
                got.append(float(b["vllm"] / b["orca_oracle"]))
        out[cm] = got or None
    return out


def paper_claims(curves: pd.DataFrame, ratios: pd.DataFrame, setup: SourceSetup, *, batch_qps: float = 2.0,
                 workload: str = "", inputs: _claims.Inputs | None = None,
                 sensitivity: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                 sensitivity_run: str = "") -> pd.DataFrame:
    """The vLLM paper's claims, in its set-up, under each cost model that ran, decided over seeds.

    The 1.7-2.7x and 2.7-8x ranges are the paper's over three models; kvlab's value is the ratio
    at each bound of ``ratios`` (one per seed), judged against the range. The batch ratio is read
    at ``batch_qps`` (Fig. 13a: 2 requests/s).

    Parameters
    ----------
    curves, ratios : DataFrame
        :func:`latency_curves` (with a ``seed`` column for several seeds) and :func:`capacity_ratios`.
    inputs : kvlab.claims.Inputs, optional
        What the runs rest on (the profile fitted to the paper's ShareGPT means is a stand-in).
    sensitivity : (DataFrame, DataFrame), optional
        The same curves and ratios with another ShareGPT length set in place of the stand-in
        (``sensitivity_run`` says which): a row whose verdict it leaves unchanged is judged.
    """
    src = setup.source_setup()
    why = _claims.not_run_note(_claims.cost_models_for(setup.model, setup.gpu, tp=setup.tp))
    base = inputs or _claims.Inputs()
    rows = []
    for orca, low, high in (("orca_oracle", 1.7, 2.7), ("orca_max", 2.7, 8.0)):
        col = f"vllm_over_{orca}"
        if col not in ratios:
            continue
        for bound in sorted(ratios["bound_s_per_token"].unique()):
            name = "Orca (Oracle)" if orca == "orca_oracle" else "Orca (Max)"
            alt = None if sensitivity is None else _ratio_values(sensitivity[1], col, bound)
            row_in = replace(base, metric="request rate at similar normalized latency (Fig. 12), vLLM over " + name,
                             read_from=f"kvlab's latency curves read at normalized latency {bound:g} s/token, "
                                       "one ratio per seed",
                             sensitivity=alt, sensitivity_run=sensitivity_run)
            rows.append(_claims.in_range(
                f"vLLM sustains {low:g}-{high:g}x the request rate of {name} at similar normalized latency "
                f"(read at {bound:g} s/token)",
                f"{SOURCE}, section 6.2, Fig. 12", low, high, _ratio_values(ratios, col, bound), unit="x",
                source_setup=src, inputs=row_in,
                kvlab_setup=setup.kvlab_setup(workload=workload, slo=f"normalized latency <= {bound:g} s/token"),
                note="; ".join(x for x in (why, "the paper's range spans OPT-13B/66B/175B; this row is OPT-13B"
                                           if orca == "orca_oracle" else "") if x)))
    ratio = _batch_values(curves, batch_qps)
    if any(x is not None for x in ratio.values()):
        row_in = replace(base, metric="mean batch size, vLLM over Orca (Oracle) (Fig. 13a)",
                         read_from=f"time-weighted mean batch of the {batch_qps:g} requests/s runs, one per seed",
                         sensitivity=None if sensitivity is None else _batch_values(sensitivity[0], batch_qps),
                         sensitivity_run=sensitivity_run)
        rows.append(_claims.close(
            f"vLLM batches 2.2x the requests of Orca (Oracle) at {batch_qps:g} requests/s (mean batch size)",
            f"{SOURCE}, Fig. 13a", 2.2, ratio, unit="x", source_setup=src, inputs=row_in,
            kvlab_setup=setup.kvlab_setup(workload=workload, metric="time-weighted mean batch size"), note=why))
    return _claims.table(rows)


def kv_slot_claims(names: Sequence[str] = tuple(TABLE1_KV_SLOTS)) -> pd.DataFrame:
    """The paper's Table 1 KV cache slots (tokens) against kvlab's pool in the same set-up: arithmetic, within 2%.

    kvlab's pool is :func:`kvlab.reservation.pool_pages` x block size (90% of GPU memory, less
    the weights and a 1 GiB activation reserve); a difference beyond 2% is stated as the memory
    the paper's count implies for KV against kvlab's.
    """
    rows = []
    for name in names:
        s = source_setup(name)
        m = _model(s.model)
        tokens = pool_pages(s.model, s.gpu, block_size=s.block_size, tp=s.tp) * s.block_size
        per_token = m.kv_bytes_per_token(tp=s.tp)
        implied, mine = TABLE1_KV_SLOTS[name] * per_token, tokens * per_token
        cause = (f"the paper's count implies {implied / GIB:.2f} GiB of KV per GPU, kvlab's pool {mine / GIB:.2f} GiB "
                 f"(it keeps 10% of memory back and a 1 GiB activation reserve; the paper does not state its reserve)")
        rows.append(_claims.exact(
            f"KV cache slots of {s.model} on {s.tp} x {s.gpu} (tokens)", f"{SOURCE}, Table 1",
            TABLE1_KV_SLOTS[name], float(tokens), cause=cause,
            source_setup=s.source_setup(metric="KV cache slots (tokens)"),
            kvlab_setup=s.kvlab_setup(metric="kvlab.pool_pages x block size, 90% of GPU memory"),
            inputs=_claims.Inputs(metric="KV cache slots (tokens), Table 1",
                                  read_from=f"kvlab.pool_pages x {s.block_size} tokens per page (no run)")))
    return _claims.table(rows)
