"""The recipe: from your trace, model, GPU and latency SLO, which output reservation and which
overflow policy to run, and the server flags that apply them.

The brief (section 3) says: measure p50/p90/p95/p99 of your output lengths; for short,
light-tailed workloads reserve about the p95 and let the ~5% that overrun be preempted; for
high-variance ones use p99 or more. :func:`recommend` tests that on your own traffic: for each
percentile it simulates a server that reserves prompt + that many output tokens per request
(TGI's capped reservation, ``kvlab.policies.tgi``: a request that outgrows it is preempted) with
each overflow mode (recompute, swap, reject), next to a server that reserves the whole
``max_new_tokens`` (TensorRT-LLM's GUARANTEED_NO_EVICT, never preempts), and picks the setting
whose p99 time between tokens meets the SLO with the highest goodput.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from . import claims as _claims
from .lengths import recommend_max_new_tokens
from .sim import simulate

#: Overflow modes the recipe compares (``kvlab.simulate``'s preemption modes).
OVERFLOW_MODES = ("recompute", "swap", "reject")
#: Label of the no-overflow baseline that reserves all of ``max_new_tokens``.
RESERVE_MAX = "max_new_tokens"
#: Columns of :attr:`Recommendation.table`.
TABLE_COLUMNS = ("setting", "reserve_tokens", "overflow", "tbt_p99_s", "ttft_p99_s", "e2e_p99_s",
                 "goodput_tokens_per_s", "requests_per_s", "preempted_request_frac", "rejected_frac",
                 "max_running", "meets_slo")


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """What :func:`recommend` found.

    Attributes
    ----------
    percentiles : dict of str to int
        Output-length percentiles of the trace, e.g. ``{"p50": 20, ...}`` (tokens, rounded up).
    table : DataFrame
        One row per simulated setting (columns ``TABLE_COLUMNS``): reservation (tokens of output
        per request), overflow mode, p99 TBT / TTFT / end-to-end latency (seconds), goodput
        (tokens of completed requests per second), preempted share, rejected (aborted) share,
        largest batch,
        and whether the SLO is met.
    setting, overflow : str
        The recommended reservation (``"p95"``, ..., or ``"max_new_tokens"``) and overflow mode.
    reserve_tokens : int
        Output tokens reserved per request by the recommended setting.
    meets_slo : bool
        False when no setting meets the SLO (the recommendation is then the lowest p99 TBT).
    max_new_tokens : int
        The server's hard output cap (tokens).
    slo_p99_tbt_s : float
        The SLO: 99th percentile of the time between output tokens, over every gap (seconds).
    flags : DataFrame
        How to apply it on vLLM, TGI, TensorRT-LLM and SGLang (:func:`server_flags`).
    cost_model : str
        The iteration-time model the simulations ran with (:func:`kvlab.costmodel.describe`).
    """

    percentiles: dict[str, int]
    table: pd.DataFrame
    setting: str
    overflow: str
    reserve_tokens: int
    meets_slo: bool
    max_new_tokens: int
    slo_p99_tbt_s: float
    flags: pd.DataFrame
    cost_model: str = ""

    def __str__(self) -> str:
        row = self.table[(self.table["setting"] == self.setting) & (self.table["overflow"] == self.overflow)].iloc[0]
        verdict = "meets" if self.meets_slo else "MISSES (no setting meets it; lowest p99 TBT shown)"
        pct = ", ".join(f"{k} {val}" for k, val in self.percentiles.items())
        return (f"output tokens: {pct}\n"
                f"recommend: reserve {self.reserve_tokens} output tokens per request ({self.setting}), "
                f"overflow = {self.overflow}, max_new_tokens = {self.max_new_tokens}\n"
                f"  p99 TBT {row['tbt_p99_s'] * 1e3:.1f} ms {verdict} the SLO of "
                f"{self.slo_p99_tbt_s * 1e3:.1f} ms; goodput {row['goodput_tokens_per_s']:.1f} tokens/s")


def output_percentiles(output_tokens: Any, percentiles: Sequence[float]) -> dict[str, int]:
    """``{"p50": tokens, ...}``: each percentile of the output lengths, rounded up to a whole token
    (:func:`kvlab.lengths.recommend_max_new_tokens` at ``percentiles / 100``)."""
    pcts = [float(p) for p in percentiles]
    if not pcts or any(not 0 < p < 100 for p in pcts):
        raise ValueError(f"percentiles must be in (0, 100), got {list(percentiles)}")
    caps = recommend_max_new_tokens(output_tokens, [p / 100.0 for p in pcts])["max_new_tokens"]
    return {f"p{p:g}": int(cap) for p, cap in zip(pcts, caps)}


def _row(setting: str, reserve_tokens: int, overflow: str, res: Any, slo_s: float, max_rejected_frac: float) -> dict:
    s, req = res.summary, res.requests
    done = req["outcome"] != "finished_aborted"
    rejected = float((~done).mean())
    goodput = float(req.loc[done, "generated_tokens"].sum()) / s["makespan_s"] if s["makespan_s"] > 0 else float("nan")
    return {"setting": setting, "reserve_tokens": reserve_tokens, "overflow": overflow,
            "tbt_p99_s": s["tbt_p99_s"], "ttft_p99_s": s["ttft_p99_s"], "e2e_p99_s": s["e2e_p99_s"],
            "goodput_tokens_per_s": goodput, "requests_per_s": s["requests_per_s"],
            "preempted_request_frac": s["preempted_request_frac"], "rejected_frac": rejected,
            "max_running": s["max_running"],
            "meets_slo": bool(s["tbt_p99_s"] <= slo_s and rejected <= max_rejected_frac)}


def recommend(trace: pd.DataFrame, *, model: str, gpu: str, slo_p99_tbt_s: float,
              percentiles: Sequence[float] = (50, 90, 95, 99), modes: Sequence[str] = OVERFLOW_MODES,
              max_new_tokens: int | None = None, max_rejected_frac: float = 0.0, num_requests: int | None = 1000,
              seed: int = 0, cost_model: Any = None, **simulate_kw: Any) -> Recommendation:
    """Simulate each reservation percentile with each overflow mode and pick the best that meets the SLO.

    Parameters
    ----------
    trace : DataFrame
        Requests (``kvlab.traces.load`` or a ``kvlab.lengths`` profile sample): ``prompt_tokens``,
        ``output_tokens``, optional ``arrival_s`` (seconds; used as the arrival times unless
        ``arrivals`` is given in ``simulate_kw``). Outputs marked ``censored`` (cut at the
        recording's cap) count at their recorded length, so high percentiles are lower bounds.
    model, gpu : str
        Names in ``kvlab.specs.models()`` and ``kvlab.specs.gpus()``.
    slo_p99_tbt_s : float
        Latency SLO: the 99th percentile of the time between output tokens, over every gap of
        every request (seconds; :func:`kvlab.sim.metrics.token_gaps_s`, Sarathi-Serve's definition).
    percentiles : sequence of float
        Output-length percentiles to try as the reservation, in (0, 100).
    modes : sequence of str
        Overflow modes to try for a request that outgrows its reservation: recompute, swap, reject.
    max_new_tokens : int, optional
        The server's hard output cap (tokens); default the longest output in the trace.
    max_rejected_frac : float
        Largest share of requests the SLO allows to be rejected (reject mode), in [0, 1]; default 0.
    num_requests : int or None
        Simulate a seeded random sample of this many requests (kept in trace order); None for all.
    seed : int
        Seed of the sample and of simulated arrivals.
    cost_model : {"measured", "roofline"}, cost model object or None
        Iteration-time model of every simulation (:func:`kvlab.simulate`); ``None``: measured
        where the GPU has measurements, else the roofline.
    **simulate_kw
        Passed to :func:`kvlab.simulate` (``block_size``, ``arrivals``, ``qps``, ``pool_pages``...).

    Returns
    -------
    Recommendation

    Raises
    ------
    ValueError
        A bad trace (its missing column named), SLO, percentile, mode or share.
    """
    v.require_columns(trace, ("prompt_tokens", "output_tokens"), "trace")
    slo_s = v.positive_float(slo_p99_tbt_s, "slo_p99_tbt_s")
    max_rejected_frac = v.fraction(max_rejected_frac, "max_rejected_frac", low_open=False)
    modes = [v.choice(m, "modes", OVERFLOW_MODES) for m in ([modes] if isinstance(modes, str) else modes)]
    if not modes:
        raise ValueError("modes must name at least one overflow mode")
    for key in ("policy", "max_new_tokens", "preemption_mode", "cap_tokens", "seed"):
        if key in simulate_kw:
            raise ValueError(f"{key} is chosen by recommend(); do not pass it")
    work = trace
    if num_requests is not None and len(trace) > v.positive_int(num_requests, "num_requests"):
        rows = np.sort(np.random.default_rng(seed).choice(len(trace), num_requests, replace=False))
        work = trace.iloc[rows].reset_index(drop=True)
    pct = output_percentiles(work["output_tokens"].to_numpy(), percentiles)
    cap = (int(work["output_tokens"].max()) if max_new_tokens is None
           else v.positive_int(max_new_tokens, "max_new_tokens"))
    kw = dict(model=model, gpu=gpu, max_new_tokens=cap, seed=seed, cost_model=cost_model, **simulate_kw)

    first = simulate(work, "reserve_max", **kw)
    rows_out = [_row(RESERVE_MAX, cap, "none", first, slo_s, max_rejected_frac)]
    for label, tokens in pct.items():
        reserve = min(tokens, cap)
        for mode in modes:
            res = simulate(work, "tgi", cap_tokens=reserve, preemption_mode=mode, **kw)
            rows_out.append(_row(label, reserve, mode, res, slo_s, max_rejected_frac))
    table = pd.DataFrame(rows_out, columns=list(TABLE_COLUMNS))

    ok = table[table["meets_slo"]]
    if len(ok):
        best = ok.sort_values(["goodput_tokens_per_s", "reserve_tokens"], ascending=[False, True], kind="stable").iloc[0]
    else:
        best = table.sort_values(["tbt_p99_s", "reserve_tokens"], kind="stable").iloc[0]
    max_prompt = int(work["prompt_tokens"].max())
    return Recommendation(percentiles=pct, table=table, setting=str(best["setting"]), overflow=str(best["overflow"]),
                          reserve_tokens=int(best["reserve_tokens"]), meets_slo=bool(len(ok)),
                          max_new_tokens=cap, slo_p99_tbt_s=slo_s, cost_model=str(first.params["cost_model"]),
                          flags=server_flags(int(best["reserve_tokens"]), str(best["overflow"]),
                                             max_new_tokens=cap, max_prompt_tokens=max_prompt))


def server_flags(reserve_tokens: int, overflow: str, *, max_new_tokens: int, max_prompt_tokens: int) -> pd.DataFrame:
    """How to apply a reservation and overflow mode on four servers, with what each one lacks.

    Parameters
    ----------
    reserve_tokens : int
        Output tokens to reserve per request (tokens).
    overflow : {"none", "recompute", "swap", "reject"}
        What happens to a request that outgrows its reservation (``"none"``: it reserves all of
        ``max_new_tokens`` and never does).
    max_new_tokens : int
        Hard output cap (tokens).
    max_prompt_tokens : int
        Longest prompt to admit (tokens).

    Returns
    -------
    DataFrame
        Columns ``system``, ``flags`` (command-line or config to set), ``supported``
        (``yes`` / ``partly`` / ``no``), ``note``. Flags are those of the systems' current
        documentation (vLLM V0/V1, TGI v3, TensorRT-LLM's LLM API, SGLang); check them against
        your version.
    """
    reserve_tokens = v.positive_int(reserve_tokens, "reserve_tokens")
    overflow = v.choice(overflow, "overflow", ("none",) + OVERFLOW_MODES)
    cap = v.positive_int(max_new_tokens, "max_new_tokens")
    prompt = v.positive_int(max_prompt_tokens, "max_prompt_tokens")
    total = prompt + cap
    gen_cfg = f"--override-generation-config '{{\"max_new_tokens\": {cap}}}' --max-model-len {total}"
    truncate = f"max_new_tokens = {reserve_tokens} per request truncates the overrun instead of preempting it"
    rows = []
    # vLLM: no reservation at all, decode pages on demand; preemption recompute (V1 only), swap in V0.
    vllm_mode = {"none": ("", "no", "vLLM never reserves decode pages; it allocates on demand and preempts "
                                      "(recompute) when the pool runs dry, so reserve-to-max has no equivalent"),
                 "recompute": ("--preemption-mode recompute (V0; V1 always recomputes)", "yes",
                               "vLLM allocates decode pages on demand: no per-request reservation to set, "
                               "overruns are preempted and recomputed"),
                 "swap": ("--preemption-mode swap --swap-space <GiB> (V0 only)", "partly",
                          "swap was removed in vLLM V1, which only recomputes"),
                 "reject": ("", "no", f"no reject-on-overflow option; {truncate}")}[overflow]
    rows.append(("vLLM", f"{gen_cfg} {vllm_mode[0]}".strip(), vllm_mode[1], vllm_mode[2]))
    # TGI: reserves prompt + min(max_new_tokens, 1024); outgrowing it requeues and prefills again.
    tgi_note = ("TGI reserves min(max_new_tokens, 1024) output tokens (fixed in the router, not a flag); "
                "a request that outgrows it is requeued and prefilled again (recompute)")
    tgi_support = {"none": "partly" if cap > 1024 else "yes", "recompute": "partly", "swap": "no", "reject": "no"}[overflow]
    tgi_extra = {"swap": "; no swap", "reject": f"; no reject: {truncate}"}.get(overflow, "")
    rows.append(("TGI", f"--max-input-tokens {prompt} --max-total-tokens {total}", tgi_support, tgi_note + tgi_extra))
    # TensorRT-LLM: GUARANTEED_NO_EVICT reserves prompt + max_tokens; MAX_UTILIZATION may pause (recompute).
    if overflow == "none":
        trt = ("--max_seq_len {t} (capacity_scheduler_policy GUARANTEED_NO_EVICT, the default)".format(t=total), "yes",
               "reserves prompt + max_tokens at admission and never evicts")
    else:
        trt = (f"--max_seq_len {total} --extra_llm_api_options cfg.yaml with scheduler_config: "
               f"{{capacity_scheduler_policy: MAX_UTILIZATION}}", "partly" if overflow == "recompute" else "no",
               "no per-request reservation below max_tokens; MAX_UTILIZATION admits more and pauses requests "
               "when the KV cache is full (recomputed later)"
               + {"swap": "; no swap of paused requests", "reject": f"; no reject: {truncate}"}.get(overflow, ""))
    rows.append(("TensorRT-LLM", *trt))
    # SGLang: reserves an estimate (new_token_ratio), retracts (recompute) on decode OOM.
    sg_support = {"none": "no", "recompute": "partly", "swap": "no", "reject": "no"}[overflow]
    rows.append(("SGLang", f"--context-length {total} --schedule-conservativeness <0.3-1.0>; "
                           f"max_new_tokens = {cap} in sampling_params",
                 sg_support, "SGLang reserves an estimate min(max_new_tokens - generated, 4096) x new_token_ratio, "
                             "not a percentile; lower --schedule-conservativeness to admit more; overruns are "
                             "retracted and recomputed" + {"swap": "; no swap", "reject": f"; no reject: {truncate}",
                                                           "none": "; it cannot reserve the whole max_new_tokens"}
                 .get(overflow, "")))
    return pd.DataFrame(rows, columns=["system", "flags", "supported", "note"])


def _tail_ratio(rec: Recommendation, name: str) -> float:
    if not {"p50", "p99"} <= set(rec.percentiles):
        raise ValueError(f"the {name} recommendation must include percentiles 50 and 99, got {list(rec.percentiles)}")
    return rec.percentiles["p99"] / rec.percentiles["p50"]


def _best_of(rec: Recommendation, setting: str) -> pd.Series | None:
    rows = rec.table[(rec.table["setting"] == setting) & rec.table["meets_slo"]]
    return None if rows.empty else rows.loc[rows["goodput_tokens_per_s"].idxmax()]


def _recipe_claim(claim: str, rec: Recommendation, expected: Sequence[str], ratio: float) -> _claims.Claim:
    got = f"{rec.setting} ({rec.reserve_tokens} tokens), overflow {rec.overflow}"
    if not rec.meets_slo:
        verdict = "differs: no setting meets the SLO on this model and GPU"
    elif rec.setting in expected:
        verdict = "holds"
    else:
        chosen = rec.table[(rec.table["setting"] == rec.setting) & (rec.table["overflow"] == rec.overflow)].iloc[0]
        alts = [r for r in (_best_of(rec, s) for s in expected) if r is not None]
        if alts:
            alt = max(alts, key=lambda r: r["goodput_tokens_per_s"])
            gain = chosen["goodput_tokens_per_s"] / alt["goodput_tokens_per_s"] - 1.0
            verdict = ("holds within 1% goodput" if gain < 0.01 else "differs") + (
                f": {rec.setting} gives {gain:+.1%} goodput over the best of {'/'.join(expected)} "
                f"({alt['setting']}, {alt['overflow']}) within the SLO")
        else:
            verdict = f"differs: {'/'.join(expected)} miss the SLO; {rec.setting} meets it"
    return _claims.Claim(claim=f"{claim} (p99/p50 = {ratio:.1f})", source="brief section 3",
                         claimed=" or ".join(expected), kvlab_value=got, verdict=verdict)


def recipe_claims(main: Recommendation, light: Recommendation, heavy: Recommendation) -> pd.DataFrame:
    """Notebook 07's claims table: the brief's recipe checked on a light- and a heavy-tailed workload.

    Parameters
    ----------
    main : Recommendation
        The recommendation for the notebook's own trace (for the share preempted at p95).
    light, heavy : Recommendation
        Recommendations for a short, light-tailed and a high-variance workload (each with
        percentiles 50 and 99, and 95 in ``main``).
    """
    light_ratio, heavy_ratio = _tail_ratio(light, "light"), _tail_ratio(heavy, "heavy")
    if light_ratio >= heavy_ratio:
        raise ValueError(f"the light workload's tail (p99/p50 = {light_ratio:.1f}) must be lighter than the heavy "
                         f"one's ({heavy_ratio:.1f})")
    c1 = _recipe_claim("Short, light-tailed workload: reserve about the p95", light, ("p95",), light_ratio)
    c2 = _recipe_claim("High-variance workload: reserve the p99 or more", heavy, ("p99", RESERVE_MAX), heavy_ratio)
    at_p95 = main.table[(main.table["setting"] == "p95") & (main.table["overflow"] != "none")]
    if at_p95.empty:
        raise ValueError("the main recommendation must include the 95th percentile")
    share = float(at_p95["preempted_request_frac"].iloc[0])
    c3 = _claims.close("Reserving the p95, about 5% of requests overrun and are preempted", "brief section 3",
                       0.05, share, rel_tol=0.2,
                       note="share of requests preempted at least once; only a request that outgrows its own "
                            "reservation is preempted, and the reservation rounds up to whole pages")
    return _claims.table([c1, c2, c3])
