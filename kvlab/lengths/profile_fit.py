"""Workload profiles fitted to real traces, or matched to published means, and written as YAML.

:func:`fit_profile` turns a trace (``prompt_tokens``, ``output_tokens``, optional ``censored``)
into a :class:`~kvlab.lengths.profiles.Profile`:

* each marginal is fitted by maximum likelihood to the integer lengths within every candidate
  family (:func:`kvlab.lengths.fit_family`): outputs flagged ``censored`` (a generation cap) enter
  as right-censored, lengths at a stated prompt cap likewise, and a trace filtered to lengths
  ``<= upper`` as truncated. Of the candidates, the profile keeps the family whose law (with its
  truncation and cap) is closest to the trace at p10, p50, p90 and p99 (smallest largest
  relative error): the profile's job is to reproduce the trace's percentiles;
* the dependence of output on prompt is a Gaussian copula, so the marginals stay exact. Its
  correlation is that of the normal scores of the two lengths' ranks (van der Waerden), except
  for a trace filtered to a total length: there the profile redraws requests over the total,
  which removes long pairs, and the correlation is chosen on a grid (step 0.05) so that the
  filtered sample reproduces the trace's percentiles best (a filtered trace's dependence sits in
  its tail: arXiv's long summaries come with short papers);
* the fit's record (trace rows, censored rows, log-likelihood, every candidate's error) and the
  profile's own sampled percentiles are kept in the file.

:data:`SHIPPED` lists how every profile in ``data/profiles/`` that rests on a trace or a
published mean was made, and :func:`regenerate` remakes them (``bench/fit_profiles.py``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import yaml
from scipy import optimize, special, stats

from .. import _validate as v
from .._paths import SHARED_DATA_DIR
from .fit import fit_family
from .profiles import PROFILE_DIR, Marginal, Profile, _quantiles

#: Percentiles a fitted profile is judged on (and keeps as the trace's ``targets``).
CHECK_PERCENTILES = (10, 50, 90, 99)
#: Families :func:`fit_profile` tries by default.
PROFILE_FAMILIES = ("log-normal-mix2", "gen-gamma", "gamma", "weibull", "log-normal", "log-t")


def _law_percentiles(dist: Any, upper: int | None, cap: int | None) -> np.ndarray:
    """p10..p99 (tokens, continuous) of ``dist`` truncated at ``upper`` and clipped at ``cap``."""
    q = np.array(CHECK_PERCENTILES, dtype=np.float64) / 100.0
    x = _quantiles(dist, q, upper)
    return x if cap is None else np.minimum(x, cap)


def _canonical(family: str, params: dict[str, float]) -> dict[str, float]:
    """A two-log-normal mixture with its lower component first (one name for one law)."""
    if family == "log-normal-mix2" and params["mu1"] > params["mu2"]:
        return {"mu1": params["mu2"], "sigma1": params["sigma2"], "mu2": params["mu1"],
                "sigma2": params["sigma1"], "weight2": 1.0 - params["weight2"]}
    return params


def _fit_marginal(x: np.ndarray, censored: np.ndarray, *, upper: int | None, cap: int | None,
                  families: Sequence[str], source: str) -> Marginal:
    emp = np.percentile(x, CHECK_PERCENTILES)
    candidates, best = {}, None
    for name in families:
        fitted = fit_family(x, name, censored=censored, upper_tokens=upper)
        err = float(np.max(np.abs(_law_percentiles(fitted.dist, upper, cap) / emp - 1.0)))
        candidates[name] = round(err, 4)
        if best is None or (err, -fitted.loglik) < (best[0], -best[1].loglik):
            best = (err, fitted)
    err, fitted = best
    return Marginal(
        family=fitted.family, params=_canonical(fitted.family, fitted.params),
        targets={f"p{q}": round(float(e), 1) for q, e in zip(CHECK_PERCENTILES, emp)}, source=source,
        upper_tokens=upper, cap_tokens=cap, method="fitted", mean_tokens=round(float(x.mean()), 2),
        fit={"n": int(x.size), "n_censored": int(censored.sum()), "loglik": round(float(fitted.loglik), 2),
             "percentile_error_by_family": candidates})


def normal_scores_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of the normal scores of the ranks of ``a`` and ``b`` (ties share their mean rank).

    The Gaussian copula's correlation estimated rank-wise (van der Waerden), unaffected by the
    marginals' shapes.
    """
    n = a.size
    za = special.ndtri(stats.rankdata(a) / (n + 1))
    zb = special.ndtri(stats.rankdata(b) / (n + 1))
    return float(np.corrcoef(za, zb)[0, 1])


def _with_check(profile: Profile, n: int, seed: int) -> Profile:
    """``profile`` with its own sampled percentiles and mean recorded in each marginal's fit."""
    df = profile.sample(n, seed=seed)
    out = {}
    for col, marg in (("prompt", profile.prompt), ("output", profile.output)):
        x = df[f"{col}_tokens"].to_numpy()
        got = np.percentile(x, CHECK_PERCENTILES)
        rec = dict(marg.fit)
        rec["profile_percentiles"] = {f"p{q}": round(float(g), 1) for q, g in zip(CHECK_PERCENTILES, got)}
        rec["profile_mean_tokens"] = round(float(x.mean()), 2)
        if marg.targets:
            rec["max_relative_error"] = round(float(max(abs(got[i] / marg.targets[f"p{q}"] - 1.0)
                                                        for i, q in enumerate(CHECK_PERCENTILES))), 4)
        rec["check"] = f"{n} requests sampled with seed {seed}"
        out[col] = Marginal(**{**marg.__dict__, "fit": rec})
    return Profile(**{**profile.__dict__, "prompt": out["prompt"], "output": out["output"]})


def fit_profile(trace: pd.DataFrame, *, name: str, source: str, trace_path: str = "", note: str = "",
                families: Iterable[str] = PROFILE_FAMILIES, prompt_upper_tokens: int | None = None,
                output_upper_tokens: int | None = None, prompt_cap_tokens: int | None = None,
                max_total_tokens: int | None = None, check_requests: int = 200_000, seed: int = 0) -> Profile:
    """A profile fitted to a trace's lengths (see the module docstring for the method).

    Parameters
    ----------
    trace : DataFrame
        Int ``prompt_tokens`` and ``output_tokens`` (>= 1), optional bool ``censored`` (the
        output hit the generation cap), as :func:`kvlab.traces.load` returns.
    name, source, note : str
        The profile's name, its citation (repository, commit, path, license) and a remark.
    trace_path : str
        Where the trace lives, relative to the repository root (kept in the profile).
    families : iterable of str
        Candidate families for each marginal.
    prompt_upper_tokens, output_upper_tokens : int, optional
        The trace was filtered to lengths <= these (truncation, tokens).
    prompt_cap_tokens : int, optional
        Prompts at or above this were clamped (a context limit): fitted as censored there and
        clipped to it when sampling (tokens).
    max_total_tokens : int, optional
        The trace was filtered to prompt + output <= this (tokens): each marginal is fitted as
        truncated at ``max_total_tokens - 1`` (unless given), and sampling redraws requests over
        the total.
    check_requests, seed : int
        Size and seed of the sample whose percentiles are recorded in the profile.

    Returns
    -------
    Profile

    Raises
    ------
    ValueError
        Missing columns, lengths < 1, or bounds the trace exceeds.
    """
    v.require_columns(trace, ("prompt_tokens", "output_tokens"), "trace")
    prompt = v.positive_int_array(trace["prompt_tokens"].to_numpy(), "trace column prompt_tokens")
    output = v.positive_int_array(trace["output_tokens"].to_numpy(), "trace column output_tokens")
    families = list(families)
    out_cens = (trace["censored"].to_numpy(dtype=bool) if "censored" in trace.columns
                else np.zeros(output.size, dtype=bool))
    out_cap = int(output[out_cens].max()) if out_cens.any() else None
    if prompt_cap_tokens is not None:
        prompt_cap_tokens = v.positive_int(prompt_cap_tokens, "prompt_cap_tokens")
        p_cens = prompt >= prompt_cap_tokens
        prompt = np.minimum(prompt, prompt_cap_tokens)
    else:
        p_cens = np.zeros(prompt.size, dtype=bool)
    if max_total_tokens is not None:
        max_total_tokens = v.positive_int(max_total_tokens, "max_total_tokens")
        worst = int((prompt + output).max())
        if worst > max_total_tokens:
            raise ValueError(f"max_total_tokens {max_total_tokens} is below the trace's longest request "
                             f"({worst} tokens)")
        # Each length leaves at least one token to the other.
        prompt_upper_tokens = max_total_tokens - 1 if prompt_upper_tokens is None else prompt_upper_tokens
        output_upper_tokens = max_total_tokens - 1 if output_upper_tokens is None else output_upper_tokens
    law = "maximum likelihood on the trace's {} lengths ({}); family chosen by percentile agreement"
    p_marg = _fit_marginal(prompt, p_cens, upper=prompt_upper_tokens, cap=prompt_cap_tokens, families=families,
                           source=law.format("prompt", _bounds_text(prompt_upper_tokens, prompt_cap_tokens, "clamped")))
    o_marg = _fit_marginal(output, out_cens, upper=output_upper_tokens, cap=out_cap, families=families,
                           source=law.format("output", _bounds_text(output_upper_tokens, out_cap, "capped")))
    rank_rho = round(normal_scores_correlation(prompt, output), 4)
    prof = Profile(name=name, source=source, note=note, prompt=p_marg, output=o_marg,
                   max_total_tokens=max_total_tokens, copula_rho=rank_rho, trace=trace_path)
    if max_total_tokens is not None:
        prof = _tune_rho(prof, seed)
    o_fit = {**prof.output.fit, "normal_scores_correlation": rank_rho}
    prof = Profile(**{**prof.__dict__, "output": Marginal(**{**prof.output.__dict__, "fit": o_fit})})
    return _with_check(prof, v.positive_int(check_requests, "check_requests"), seed)


def _tune_rho(prof: Profile, seed: int, n: int = 50_000) -> Profile:
    """``prof`` with the copula correlation on a 0.05 grid whose filtered sample is closest to the
    trace at p10..p99 of both marginals (smallest largest relative error)."""
    best = None
    for rho in np.round(np.arange(-0.95, 0.951, 0.05), 2):
        cand = Profile(**{**prof.__dict__, "copula_rho": float(rho)})
        df = cand.sample(n, seed=seed)
        err = max(float(np.max(np.abs(np.percentile(df[f"{col}_tokens"], CHECK_PERCENTILES)
                                      / np.array([m.targets[f"p{q}"] for q in CHECK_PERCENTILES]) - 1.0)))
                  for col, m in (("prompt", prof.prompt), ("output", prof.output)))
        if best is None or err < best[0]:
            best = (err, cand)
    return best[1]


def _bounds_text(upper: int | None, cap: int | None, capped: str) -> str:
    parts = ([f"truncated at {upper}"] if upper is not None else []) + \
        ([f"{capped} at {cap}: right-censored"] if cap is not None else [])
    return ", ".join(parts) if parts else "no bound"


def mean_matched_profile(*, name: str, source: str, note: str, prompt_mean_tokens: float, output_mean_tokens: float,
                         prompt_sigma: float, output_sigma: float, prompt_source: str, output_source: str,
                         prompt_upper_tokens: int | None = None, max_total_tokens: int | None = None,
                         check_requests: int = 200_000, seed: int = 0) -> Profile:
    """Log-normal prompt and output laws whose sampled means equal published means.

    The shapes (``sigma`` of log length) are assumptions the caller states; each ``mu`` is
    solved (Brent's method on the mean of ``check_requests`` draws with common random numbers)
    so that the profile's sampled mean, after its truncations and total filter, equals the
    published mean.
    """
    targets = {"prompt": v.positive_float(prompt_mean_tokens, "prompt_mean_tokens"),
               "output": v.positive_float(output_mean_tokens, "output_mean_tokens")}
    n = v.positive_int(check_requests, "check_requests")

    def build(mu_p: float, mu_o: float) -> Profile:
        return Profile(
            name=name, source=source, note=note, max_total_tokens=max_total_tokens,
            prompt=Marginal(family="log-normal", params={"mu": mu_p, "sigma": prompt_sigma}, targets={},
                            source=prompt_source, upper_tokens=prompt_upper_tokens, method="mean-matched",
                            mean_tokens=targets["prompt"]),
            output=Marginal(family="log-normal", params={"mu": mu_o, "sigma": output_sigma}, targets={},
                            source=output_source, method="mean-matched", mean_tokens=targets["output"],
                            upper_tokens=None if max_total_tokens is None else max_total_tokens - 1))

    def gap(col: str, mu_p: float, mu_o: float) -> float:
        try:
            return float(build(mu_p, mu_o).sample(n, seed=seed)[f"{col}_tokens"].mean()) - targets[col]
        except ValueError:  # so long that nearly every request is over max_total_tokens: mean too high
            return float(max_total_tokens or 0)

    def solve(f: Any, guess: float) -> float:
        return optimize.brentq(f, guess - 3.0, guess + 3.0, xtol=1e-6)

    # The total filter couples the two means: solve each with the other fixed, twice.
    mu_p = np.log(targets["prompt"]) - prompt_sigma ** 2 / 2
    mu_o = np.log(targets["output"]) - output_sigma ** 2 / 2
    for _ in range(2):
        mu_p = solve(lambda m, mu_o=mu_o: gap("prompt", m, mu_o), mu_p)
        mu_o = solve(lambda m, mu_p=mu_p: gap("output", mu_p, m), mu_o)
    return _with_check(build(float(mu_p), float(mu_o)), n, seed)


def profile_yaml(profile: Profile) -> str:
    """The YAML text of ``profile`` in the layout of ``data/profiles/*.yaml``."""
    def marg(m: Marginal) -> dict[str, Any]:
        out: dict[str, Any] = {"family": m.family, "method": m.method}
        for key in ("upper_tokens", "cap_tokens", "mean_tokens"):
            if getattr(m, key) is not None:
                out[key] = getattr(m, key)
        if m.targets:
            out["targets"] = dict(m.targets)
        out["source"] = m.source
        out["params"] = {k: float(x) for k, x in m.params.items()}
        if m.fit:
            out["fit"] = m.fit
        return out

    raw: dict[str, Any] = {"name": profile.name, "source": profile.source}
    if profile.trace:
        raw["trace"] = profile.trace
    if profile.note:
        raw["note"] = profile.note
    if profile.max_total_tokens is not None:
        raw["max_total_tokens"] = profile.max_total_tokens
    if profile.copula_rho:
        raw["copula_rho"] = profile.copula_rho
    raw["prompt"] = marg(profile.prompt)
    raw["output"] = marg(profile.output)
    head = "# Made by kvlab.lengths.profile_fit (bench/fit_profiles.py regenerates it); do not edit by hand.\n"
    return head + yaml.safe_dump(raw, sort_keys=False, width=100)


_TRACE_CITES = {
    "azure": "Azure/AzurePublicDataset commit 7909210, {path}, CC-BY 4.0",
    "sarathi": "microsoft/sarathi-serve commit 72339db (branch niyama_asplos2026), {path}, Apache-2.0",
    "vidur": "microsoft/vidur commit 8e54dd5, {path}, MIT",
}

#: How each shipped trace or mean-matched profile is made (``regenerate`` reads this).
SHIPPED: Mapping[str, Mapping[str, Any]] = {
    "azure-2023-conv": dict(
        kind="trace", file="azure2023_conv.csv",
        source="Azure LLM inference trace 2023, conversation, 1 h, 19,366 requests: "
               + _TRACE_CITES["azure"].format(path="data/AzureLLMInferenceTrace_conv.csv"),
        note="Outputs capped at 1,000 tokens in the trace (11 requests): fitted as censored, sampled draws "
             "above the cap are clipped to it and flagged censored."),
    "azure-2023-code": dict(
        kind="trace", file="azure2023_code.csv", prompt_cap_tokens=7400,
        source="Azure LLM inference trace 2023, code completion, 1 h, 8,819 requests: "
               + _TRACE_CITES["azure"].format(path="data/AzureLLMInferenceTrace_code.csv"),
        note="Prompts pile up in the last 37 tokens below the trace's 7,437 maximum (4% of requests): treated "
             "as clamped at a context limit, censored at 7,400 in the fit and clipped to 7,400 when sampling."),
    "sarathi-sharegpt": dict(
        kind="trace", file="sarathi_sharegpt_8k_llama2.csv", output_upper_tokens=1024, max_total_tokens=8192,
        source="ShareGPT chat trace of the Sarathi-Serve capacity experiments (Llama-2 tokenizer, 8k filter), "
               "30,731 requests: " + _TRACE_CITES["sarathi"].format(
                   path="data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
        note="Outputs end at 1,024 tokens with no pile-up there (4 requests at 1,024 against ~15 per token "
             "just below): the trace was filtered to outputs <= 1,024, so the fit treats 1,024 as a truncation, "
             "not a censoring cap; requests are filtered to 8,192 total tokens."),
    "arxiv-summarization": dict(
        kind="trace", file="vidur_arxiv_summarization_llama2.csv", max_total_tokens=4096,
        source="arXiv summarization trace (Llama-2 tokenizer, 4k filter), the arxiv workload of the "
               "Sarathi-Serve experiments, 28,257 requests: " + _TRACE_CITES["vidur"].format(
                   path="data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),
        note="Requests are filtered to 4,096 total tokens; long summaries come with short papers (rank "
             "correlation of prompt and output negative), which the copula keeps."),
    "vllm-sharegpt": dict(
        kind="mean", prompt_mean_tokens=161.0, output_mean_tokens=338.0, prompt_sigma=1.0, output_sigma=1.0,
        prompt_upper_tokens=1024, max_total_tokens=2048,
        source="vLLM (Kwon et al., SOSP'23), Section 6.1 / Fig. 11: ShareGPT after the benchmark's filtering, "
               "mean 161 input and 338 output tokens (OPT tokenizer)",
        prompt_source="mean 161 tokens (vLLM paper); log-normal with sigma 1.0 assumed (the paper gives means "
                      "and histograms only); prompts <= 1,024 and prompt + output <= 2,048 as vLLM's benchmark "
                      "filters them; its drop of requests under 4 tokens is not modelled",
        output_source="mean 338 tokens (vLLM paper); log-normal with sigma 1.0 assumed; truncated at 2,048 - prompt",
        note="Only the means are published: the shape (log-normal, sigma 1.0) is an assumption; prompt and "
             "output independent."),
    "vllm-alpaca": dict(
        kind="mean", prompt_mean_tokens=19.3, output_mean_tokens=58.5, prompt_sigma=0.7, output_sigma=0.9,
        prompt_upper_tokens=1024, max_total_tokens=2048,
        source="vLLM (Kwon et al., SOSP'23), Section 6.1 / Fig. 11: Alpaca, mean 19.3 input and 58.5 output "
               "tokens (ShareGPT's inputs are 8.4x and outputs 5.8x longer)",
        prompt_source="mean 19.3 tokens (vLLM paper); log-normal with sigma 0.7 assumed (short instructions of "
                      "similar length); same filter as vllm-sharegpt",
        output_source="mean 58.5 tokens (vLLM paper); log-normal with sigma 0.9 assumed",
        note="Only the means are published: the shapes are assumptions; prompt and output independent."),
    "lmsys-chat-1m": dict(
        kind="mean", prompt_mean_tokens=69.5, output_mean_tokens=214.5, prompt_sigma=1.0, output_sigma=1.0,
        source="LMSYS-Chat-1M (Zheng et al., arXiv 2309.11998, ICLR'24), Table 1: 1M conversations, 2.0 turns "
               "per sample, mean 69.5 tokens per prompt and 214.5 per response (Llama-2 tokenizer)",
        prompt_source="mean 69.5 tokens per user prompt (Table 1); log-normal with sigma 1.0 assumed. A turn "
                      "after the first carries the conversation so far, which this per-message mean leaves out",
        output_source="mean 214.5 tokens per response (Table 1); log-normal with sigma 1.0 assumed",
        note="Only the means are published: the shapes are assumptions; one request per message (no history); "
             "prompt and output independent."),
}


def regenerate(names: Iterable[str] | None = None, *, traces_dir: str | Path | None = None,
               out_dir: str | Path = PROFILE_DIR) -> pd.DataFrame:
    """Remake the shipped profiles of :data:`SHIPPED` (trace fits need ``../shared/data/traces``).

    Returns
    -------
    DataFrame, one row per profile and marginal: family, the trace's (or published) percentiles
    and mean, the profile's sampled ones and the largest relative percentile error.
    """
    from ..traces import load

    names = list(SHIPPED) if names is None else [v.choice(n, "profile", list(SHIPPED)) for n in names]
    traces_dir = Path(SHARED_DATA_DIR / "traces" if traces_dir is None else traces_dir)
    rows = []
    for name in names:
        spec = dict(SHIPPED[name])
        kind = spec.pop("kind")
        if kind == "trace":
            path = traces_dir / spec.pop("file")
            if not path.is_file():
                raise ValueError(f"trace file {path} does not exist: profile {name!r} is fitted to it")
            prof = fit_profile(load(path), name=name, trace_path=f"../shared/data/traces/{path.name}", **spec)
        else:
            prof = mean_matched_profile(name=name, **spec)
        Path(out_dir, f"{name}.yaml").write_text(profile_yaml(prof))
        for col, m in (("prompt", prof.prompt), ("output", prof.output)):
            rows.append({"profile": name, "marginal": col, "family": m.family, "method": m.method,
                         **{f"trace_{k}": x for k, x in m.targets.items()},
                         "trace_mean_tokens": m.mean_tokens,
                         **{f"profile_{k}": x for k, x in m.fit["profile_percentiles"].items()},
                         "profile_mean_tokens": m.fit["profile_mean_tokens"],
                         "max_relative_error": m.fit.get("max_relative_error", np.nan)})
    return pd.DataFrame(rows)


__all__ = ["CHECK_PERCENTILES", "PROFILE_FAMILIES", "SHIPPED", "fit_profile", "mean_matched_profile",
           "normal_scores_correlation", "profile_yaml", "regenerate"]
