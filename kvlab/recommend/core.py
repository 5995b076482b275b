"""The recipe: from your trace, model, GPU and SLO, which setting of your server to run, how many
replicas, and how sure the answer is.

What :func:`recommend` does, in order:

1. **Fit the trace to the model.** The server's context is ``max_model_len`` (default the
   model's own context, never the trace's longest request: the printed server must accept a
   longer prompt tomorrow). Prompts that do not fit it are counted and refused (the server
   rejects them); outputs that would run past it are counted and cut there. ``max_new_tokens``
   defaults to the trace's own detected cap (else its longest output), clamped to the context.
2. **The real load.** The trace offers its own rate, refused requests included (the headline
   gives it, with how many are refused and the rate left to serve); the requests that fit are
   served at their share of it (:func:`kvlab.trace_window.trace_window`: the whole trace, a
   window, or a sample rescaled to keep the rate; ``rate_scale`` / ``qps`` ask "what if traffic
   grows"), and each setting's latencies at that load are reported in vLLM
   ``benchmark_serving``'s names (ms).
3. **Capacity.** For each setting, :func:`kvlab.capacity.capacity` finds the highest rate of
   served requests that meets the SLO (the same :class:`kvlab.capacity.SLO` judges the load
   above) by scaling the trace's own arrival process (``arrivals``: ``replay``, the window's
   arrival times time-compressed, by default; ``gamma``, a Gamma renewal with the window's gap
   CV; ``poisson``), on ``num_windows`` windows of ``window_requests`` requests spread over the
   trace. The median is the capacity; the range over the windows is the interval (with 5
   windows, the range covers the median of the window-capacity distribution with probability
   ``1 - 2 / 2**5 = 94%``). The search's grid starts at a power of two, not at the offered rate,
   so a setting's capacity does not depend on the load it is asked about. The chosen setting's
   capacity is searched under Poisson and Gamma arrivals too, beside it. Headroom is capacity /
   served rate; replicas are ``ceil(rate / capacity)``.
4. **One answer.** Every setting is searched on the same windows, so settings are compared
   window by window: a setting ties the best unless the best's capacity is higher in every
   window by more than the search's resolution (with 5 windows, a difference that holds in all 5 by chance alone has probability
   ``1 / 2**5 = 3%``, the sign test); the chosen setting is the best, or the default when it ties
   the best (every setting tying says the knobs do not matter at this load). The chosen
   setting's flags are printed and its capacity sizes the replicas: when one replica of it
   cannot carry the load the answer is "N replicas of it", and re-running at one replica's share
   (``rate_scale = 1 / N``) chooses the same setting. The chosen setting is then served at one
   replica's share of the real load, as a check.
5. **How sure.** The capacity interval, the search's resolution (``rel_tol``), and whether the
   GPU's iteration times are measured or a spec-sheet (roofline) estimate.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from .. import _validate as v
from .._workers import worker_pool
from ..arrivals import PROCESSES, gap_cv
from ..validate.trust_figures import point_trust as _point_trust, stack_of as _stack_of, trust as _trust
from ..capacity import SLO, ServingConfig, capacity, serve, slo_verdict
from ..costmodel import measured_gpus as _measured_gpus
from ..lengths import recommend_max_new_tokens
from ..prefix_blocks import HASH_IDS
from ..reservation import pool_pages as _pool_pages
from ..specs import gpu as _gpu, model as _model, with_precision
from ..trace_window import HOW, TraceWindow, offered_rate_per_s, trace_window, window_starts
from .servers import resolve as _resolve
from .systems import Setting, client_note, default_settings, launch, profile_of, settings, write_files

#: The SLO used when none is given: P99 time between tokens <= 100 ms and median scheduling
#: delay <= 2 s (the shape of Sarathi-Serve's capacity SLO; 100 ms is a common interactive bound).
DEFAULT_SLO = SLO(tbt_p99_s=0.1, scheduling_delay_p50_s=2.0)
#: Windows the capacity interval rests on, and requests per window (Sarathi-Serve serves 2,048).
DEFAULT_NUM_WINDOWS = 5
DEFAULT_WINDOW_REQUESTS = 2048
#: Latency columns at the offered load, in vLLM benchmark_serving's names (milliseconds).
LATENCY_COLUMNS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
                   "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")
#: Prefix-cache columns at the offered load (:func:`kvlab.sim.metrics.summarize`; NaN where no load
#: was served, 0 where the cache is not simulated): whether it is, tokens hit at first admission /
#: prompt tokens, prefill tokens not computed, pages reused from the cache (hit blocks), and the
#: time-weighted mean pages sharing saves and pages the cache holds that no request uses.
PREFIX_COLUMNS = ("prefix_caching", "prefix_hit_rate", "saved_prefill_tokens", "hit_pages",
                  "mean_pages_shared_saved", "mean_pages_cached", "max_pages_cached")
#: Columns of :attr:`Recommendation.table`. ``capacity_poisson_qps`` and ``capacity_gamma_qps``
#: (the median capacity under Poisson and under Gamma arrivals of the trace's gap CV) are filled
#: for the chosen setting only.
TABLE_COLUMNS = ("system", "setting", "knob", "default", "policy", "overflow", "max_num_seqs",
                 "max_num_batched_tokens", "gpu_memory_utilization", "pool_pages", "max_new_tokens",
                 "capacity_qps", "capacity_lo_qps", "capacity_hi_qps", "capacity_poisson_qps",
                 "capacity_gamma_qps", "binding", "kv_binds_at_qps", "max_tried_qps", "headroom", "replicas",
                 "num_gpus", "meets_slo_at_load", "slo_at_load", "offered_rate_per_s", *LATENCY_COLUMNS,
                 "preempted_request_frac", "unserved_frac", *PREFIX_COLUMNS, "tie", "recommended")
#: The possible decisions (``overloaded``: the chosen setting needs more than one replica).
DECISIONS = ("recommend", "keep-default", "all-tie", "overloaded", "no-rate")
#: The arrival process capacity is searched under by default (:mod:`kvlab.arrivals`).
DEFAULT_ARRIVALS = "replay"


@dataclass(frozen=True, kw_only=True)
class ContextFit:
    """How the trace fits the model's context (tokens, request counts)."""

    max_context_tokens: int
    max_model_len: int
    max_prompt_tokens: int
    max_new_tokens: int
    trace_cap_tokens: int
    cap_source: str
    prompts_over_context: int
    outputs_over_context: int
    trace_requests: int = 0
    outputs_over_cap: int = 0
    context_source: str = "the model's context"

    @property
    def served_requests(self) -> int:
        """Requests of the trace the server accepts (their prompts fit the context)."""
        return self.trace_requests - self.prompts_over_context

    @property
    def served_frac(self) -> float:
        """Share of the trace's requests the server accepts."""
        return self.served_requests / self.trace_requests if self.trace_requests else 1.0

    def refused_parts(self) -> list[str]:
        """The refused and capped requests, one phrase each (empty when every request is served in full)."""
        parts = []
        if self.prompts_over_context:
            n = self.prompts_over_context
            parts.append(f"{n:,} of {self.trace_requests:,} requests ({n / self.trace_requests:.1%}) are refused: "
                         f"{'its prompt does' if n == 1 else 'their prompts do'} not fit the "
                         f"{self.max_model_len:,}-token context ({self.context_source})")
        for n, where in ((self.outputs_over_context, "the context"),
                         (self.outputs_over_cap, f"max_new_tokens {self.max_new_tokens:,}")):
            if n:
                parts.append(f"{n:,} {'output is' if n == 1 else 'outputs are'} cut at {where}")
        return parts

    def refused(self) -> str:
        """:meth:`refused_parts` in one line ("" when every request is served in full)."""
        return "; ".join(self.refused_parts())

    def warnings(self) -> list[str]:
        out = self.refused_parts()
        if self.max_new_tokens < self.trace_cap_tokens:
            out.append(f"max_new_tokens clamped from {self.trace_cap_tokens:,} to {self.max_new_tokens:,} "
                       f"(the context)")
        return out


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """What :func:`recommend` found (see the module note for how).

    Attributes
    ----------
    decision : str
        One of :data:`DECISIONS`.
    answer : str
        What to run, computed from the table: the chosen setting, its capacity, and the
        replicas it needs.
    chosen : str or None
        ``"system: setting"`` of the recommendation (None only when no setting serves the trace
        or none meets the SLO at any rate).
    ties : list of str
        ``"system: setting"`` of every setting tied with the best (the best included).
    table : DataFrame
        One row per setting (:data:`TABLE_COLUMNS`).
    flags : DataFrame
        ``system``, ``setting``, ``version``, ``command`` (clamped to the context), ``client``
        for the chosen setting (or each system's best in a comparison).
    load : dict
        The offered load (:meth:`kvlab.trace_window.TraceWindow.as_dict`) and the trace's source.
    context : ContextFit
    percentiles : dict of str to int
        Output-length percentiles of the trace (tokens).
    setup : dict
        What the answer rests on: model, GPU, TP, system, SLO, cost model, windows, seed.
    warnings : list of str
    capacities : dict
        ``"system: setting"`` -> the capacity of each window (requests/s).
    check : dict
        The chosen setting served at one replica's share of the real load: ``replicas``,
        ``rate_per_s``, ``slo`` (the verdict), ``p99_ttft_ms``, ``p99_itl_ms`` (empty without
        a rate or a chosen setting).
    elapsed_s : float
        Wall time of the search (seconds).
    """

    decision: str
    answer: str
    chosen: str | None
    ties: list[str]
    table: pd.DataFrame
    flags: pd.DataFrame
    load: dict[str, Any]
    context: ContextFit
    percentiles: dict[str, int]
    setup: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    capacities: dict[str, list[float]] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def row(self, key: str) -> pd.Series:
        """The table row of ``"system: setting"``."""
        keys = self.table["system"] + ": " + self.table["setting"]
        hit = self.table[keys == key]
        if hit.empty:
            raise ValueError(f"no setting {key!r}; the table has {', '.join(keys)}")
        return hit.iloc[0]

    @property
    def what_to_do(self) -> str:
        """The action for the operator, computed from the decision and the flags of the chosen setting."""
        rate = self.load.get("rate_per_s")
        if self.chosen is None:
            return self.answer
        row = self.row(self.chosen)
        hit = self.flags[(self.flags["system"] == row["system"]) & (self.flags["setting"] == row["setting"])]
        f = (hit if len(hit) else self.flags).iloc[0]
        if rate is None:
            return (f"Launch with: {f['command']}; {f['client']}. The trace has no arrival times: give its rate "
                    f"(qps) to check the load.")
        n = int(row["replicas"])
        if n > 1:
            again = (f"--qps {self.load['qps'] / n:.4g}" if self.load.get("qps")
                     else f"--rate-scale {self.load.get('rate_scale', 1.0) / n:.4g}")
            search = (f" These are the systems' defaults only: before launching {n} replicas, re-run with "
                      f"--system {row['system']} (or another system) to search its settings (a tuned one "
                      "may need fewer)."
                      if self.setup.get("system") == "comparison" else "")
            return (f"Launch {n} replicas ({n * int(self.setup['tp'])} GPUs) behind a load balancer, each with: "
                    f"{f['command']}; {f['client']}. Each carries {rate / n:.3g} requests/s, one replica's share "
                    f"(re-running with {again} asks about one replica and chooses this setting).{search}")
        return (f"Launch with: {f['command']}; {f['client']}. It carries {row['capacity_lo_qps']:.3g}-"
                f"{row['capacity_hi_qps']:.3g} requests/s, {row['capacity_lo_qps'] / rate:.1f}x or more today's "
                f"{rate:.3g}: re-run with --rate-scale when traffic grows past that.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the decision, the load, the full table and the flags."""
        table = self.table.astype(object).where(self.table.notna(), None)
        return {"decision": self.decision, "answer": self.answer, "what_to_do": self.what_to_do,
                "chosen": self.chosen, "ties": self.ties,
                "load": self.load, "context": self.context.__dict__, "percentiles": self.percentiles,
                "setup": self.setup, "warnings": self.warnings, "capacities": self.capacities, "check": self.check,
                "elapsed_s": self.elapsed_s, "table": table.to_dict(orient="records"),
                "flags": self.flags.to_dict(orient="records")}

    def __str__(self) -> str:
        return render_text(self)


# ------------------------------------------------------------------------------ preparation
def fit_to_context(trace: pd.DataFrame, *, model: Any, max_new_tokens: int | None,
                   max_model_len: int | None = None) -> tuple[pd.DataFrame, ContextFit]:
    """The trace as a server with this context serves it, and what did not fit.

    ``max_model_len`` (tokens, prompt + output) is the server's context: default the model's
    ``max_context_tokens``; a larger one is refused (the model was not trained for it).
    """
    spec = _model(model)
    model_ctx = spec.max_context_tokens
    if max_model_len is None:
        ctx, ctx_source = model_ctx, f"{spec.name}'s context"
    else:
        ctx, ctx_source = v.positive_int(max_model_len, "max_model_len"), "the max_model_len given"
        if ctx > model_ctx:
            raise ValueError(f"max_model_len={ctx:,} is above {spec.name}'s context of {model_ctx:,} tokens")
    prompt = trace["prompt_tokens"].to_numpy(dtype=np.int64)
    output = trace["output_tokens"].to_numpy(dtype=np.int64)
    detected = trace.attrs.get("detected_cap_tokens")
    if max_new_tokens is not None:
        trace_cap, source = v.positive_int(max_new_tokens, "max_new_tokens"), "given"
    elif detected:
        trace_cap, source = int(detected), "the trace's detected cap"
    else:
        trace_cap, source = int(output.max()), "the trace's longest output"
    fits = prompt < ctx
    if not fits.any():
        raise ValueError(f"no prompt of the trace fits {ctx_source} of {ctx:,} tokens "
                         f"(shortest prompt {int(prompt.min()):,})")
    over = fits & (prompt + output > ctx)
    served = trace.loc[fits].copy()
    served["output_tokens"] = np.minimum(output[fits], ctx - prompt[fits])
    served.attrs = dict(trace.attrs)
    cap = min(trace_cap, ctx - 1)
    max_prompt = int(prompt[fits].max())
    fit = ContextFit(max_context_tokens=model_ctx, max_model_len=ctx, max_prompt_tokens=max_prompt,
                     max_new_tokens=cap, trace_cap_tokens=trace_cap, cap_source=source,
                     prompts_over_context=int((~fits).sum()), outputs_over_context=int(over.sum()),
                     trace_requests=len(trace), outputs_over_cap=int((served["output_tokens"] > cap).sum()),
                     context_source=ctx_source)
    return served.reset_index(drop=True), fit


def output_percentiles(output_tokens: Any, percentiles: Sequence[float]) -> dict[str, int]:
    """``{"p50": tokens, ...}``: each percentile of the output lengths, rounded up to a whole token
    (:func:`kvlab.lengths.recommend_max_new_tokens` at ``percentiles / 100``)."""
    pcts = v.percentiles(percentiles)  # 0-100 scale; 0.95 is refused, not read as the 0.95th
    caps = recommend_max_new_tokens(output_tokens, [p / 100.0 for p in pcts])["max_new_tokens"]
    return {f"p{p:g}": int(cap) for p, cap in zip(pcts, caps)}


def priced_with(setting: Setting, cost_model: Any = None) -> Any:
    """The cost model ``setting`` is simulated with: ``cost_model`` when one is given, else its family's
    fitted stack (:attr:`~kvlab.recommend.servers.base.ServerProfile.stack`, a shipped cost-model file:
    ``vllm-v1`` for vLLM >= 0.11, ``vllm-v0`` for the V0 family), or None (measured GPU time only)
    for a family without one."""
    if cost_model is not None:
        return cost_model
    stack = profile_of(setting).stack
    return None if stack == "none" else stack


def serving_config(setting: Setting, *, model: str, gpu: str, tp: int, block_size: int, max_new_tokens: int,
                   cost_model: Any = None, engine: str | None = None,
                   trace_has_block_ids: bool = False) -> ServingConfig:
    """The :class:`kvlab.capacity.ServingConfig` that simulates ``setting`` (its KV precision on
    ``model``'s weights, its scheduler, its host pool, and its prefix cache where the trace
    carries block identities: without them the cache would only return a preempted request's own
    blocks)."""
    m = _model(model)
    if setting.kv_cache_dtype != m.kv_cache_dtype:
        m = with_precision(m, kv_cache_dtype=setting.kv_cache_dtype, weights=m.weight_dtype)
    pages = _pool_pages(m, gpu, block_size=block_size, gpu_memory_utilization=setting.gpu_memory_utilization, tp=tp)
    cap = min(setting.output_cap_tokens or max_new_tokens, max_new_tokens)
    plain = isinstance(model, str) and m.kv_cache_dtype == "auto" and m.weight_dtype == "bf16"
    return ServingConfig(model=model if plain else m, gpu=gpu, tp=tp,
                         scheduler=setting.scheduler,
                         cpu_pool_pages=setting.host_pool_pages(m, block_size=block_size, tp=tp),
                         max_num_batched_tokens=max(setting.max_num_batched_tokens, block_size),
                         max_num_seqs=setting.max_num_seqs, policy=setting.policy,
                         policy_params=dict(setting.policy_params), max_new_tokens=cap, block_size=block_size,
                         pool_pages=pages, preemption_mode=setting.preemption_mode, cost_model=cost_model,
                         engine=engine, prefix_caching=setting.prefix_caching and trace_has_block_ids
                         and setting.preemption_mode == "recompute", async_scheduling=setting.async_scheduling,
                         split_attention=profile_of(setting).split_attention)


# ------------------------------------------------------------------------------ the jobs
def _at_load(args: tuple[pd.DataFrame, ServingConfig, SLO, int, int]) -> dict[str, Any]:
    """One run at the offered load: latencies (ms), preemptions, requests not served in full."""
    requests, config, slo, seed, trace_cap = args
    res = serve(requests, config, None, seed=seed)
    rq, s = res.requests, res.summary
    done = rq[rq["outcome"] != "finished_aborted"]
    tpot = done["mean_tbt_s"].dropna().to_numpy()
    # a request is served in full when it got every token the trace's own cap allows it
    truncated = int((done["generated_tokens"] < np.minimum(done["output_tokens"], trace_cap)).sum())
    ms = 1e3
    return {"offered_rate_per_s": offered_rate_per_s(rq["arrival_s"].to_numpy()),
            "median_ttft_ms": s["ttft_p50_s"] * ms, "p99_ttft_ms": s["ttft_p99_s"] * ms,
            "median_tpot_ms": float(np.median(tpot)) * ms if tpot.size else float("nan"),
            "p99_tpot_ms": float(np.percentile(tpot, 99)) * ms if tpot.size else float("nan"),
            "median_itl_ms": s["tbt_p50_s"] * ms, "p99_itl_ms": s["tbt_p99_s"] * ms,
            "median_e2el_ms": s["e2e_p50_s"] * ms, "p99_e2el_ms": s["e2e_p99_s"] * ms,
            "preempted_request_frac": s["preempted_request_frac"],
            "unserved_frac": (int(s["num_aborted"]) + truncated) / len(rq),
            "slo_at_load": slo_verdict(res, slo), **_prefix_figures(s, config)}


def _prefix_figures(summary: dict[str, float] | None, config: ServingConfig) -> dict[str, Any]:
    """The :data:`PREFIX_COLUMNS` of a run's summary (None: no run, NaN figures)."""
    out: dict[str, Any] = {"prefix_caching": config.prefix_caching}
    for col in PREFIX_COLUMNS[1:]:
        if summary is None:
            out[col] = float("nan")
        elif col == "hit_pages":
            out[col] = summary["saved_prefill_tokens"] / config.block_size
        else:
            out[col] = summary[col]
    return out


def _no_load(requests: pd.DataFrame, config: ServingConfig, trace_cap: int) -> dict[str, Any]:
    """Without arrival times there is no load to serve: only what does not depend on it."""
    cap = min(config.max_new_tokens, trace_cap)
    truncated = int((np.minimum(requests["output_tokens"], trace_cap) > cap).sum())
    return {"offered_rate_per_s": None, **{c: float("nan") for c in LATENCY_COLUMNS},
            "preempted_request_frac": float("nan"), "unserved_frac": truncated / len(requests),
            "slo_at_load": "no offered load (the trace has no arrival times; give qps)", **_prefix_figures(None, config)}


def _capacity(args: tuple[pd.DataFrame, ServingConfig, SLO, dict[str, Any]]) -> tuple[float, str, str, float, float]:
    """Capacity, what binds, why the search stopped, the lowest rate tried at which a request was
    preempted for pages (NaN: none) and the highest rate tried (requests/s)."""
    requests, config, slo, kw = args
    res = capacity(requests, config, slo, **kw)
    t = res.trials
    preempted = t.loc[t["num_preempted_requests"] > 0, "qps"]
    return (res.capacity_qps, res.binding(), res.reason, float(preempted.min()) if len(preempted) else float("nan"),
            float(t["qps"].max()) if len(t) else float("nan"))


def _run(jobs: list[tuple[Callable, Any]], max_workers: int, progress: bool) -> list[Any]:
    out: list[Any] = [None] * len(jobs)
    bar = _bar(len(jobs)) if progress else None
    try:
        if max_workers == 1:
            for i, (fn, args) in enumerate(jobs):
                out[i] = fn(args)
                if bar is not None:
                    bar.update(1)
        else:
            from ..sim.fast import load_loop

            load_loop()  # once here, before the workers fork: not once per worker
            with worker_pool(max_workers) as pool:
                futures = {pool.submit(fn, args): i for i, (fn, args) in enumerate(jobs)}
                for fut in as_completed(futures):
                    out[futures[fut]] = fut.result()
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


def _bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="recommend", unit="run", leave=False)


# ------------------------------------------------------------------------------ the decision
def _beats(a: np.ndarray, b: np.ndarray, rel_tol: float) -> bool:
    """Whether capacities ``a`` are higher than ``b`` in every window (requests/s, the same windows),
    each by more than the search's resolution ``rel_tol``: a paired comparison (sign test)."""
    return bool(np.all(a > b * (1.0 + rel_tol)))


def _ties(table: pd.DataFrame, eligible: pd.Series, windows: np.ndarray, rel_tol: float) -> tuple[int | None, pd.Series]:
    """Index of the best eligible row (highest capacity) and which eligible rows tie it.

    ``windows[i]`` holds row ``i``'s capacity per window (requests/s; the same windows for every
    row): a row ties the best unless the best :func:`_beats` it.
    """
    ok = table[eligible]
    if ok.empty:
        return None, pd.Series(False, index=table.index)
    best = ok.sort_values(["capacity_qps", "capacity_lo_qps", "default"], ascending=False, kind="stable").index[0]
    top = windows[table.index.get_loc(best)]
    tie = eligible & pd.Series([not _beats(top, w, rel_tol) for w in windows], index=table.index)
    return best, tie


def _limit(binding: str) -> str:
    """What binds, without its numbers: "median scheduling delay", "P99 TBT", "aborted requests"."""
    first = binding.split(";")[0].strip()
    if first.startswith(("converged", "unreachable", "not bracketed", "stopped")):
        return ""
    if first.startswith("not sustained"):  # kvlab.capacity's backlog rule
        return "a growing queue (requests still waiting when the last arrives)"
    if first.split()[0].isdigit():  # "3 requests aborted"
        return "aborted requests"
    words = []
    for w in first.split():
        if w[0].isdigit():  # a figure: "0.12", "2.8%"
            break
        words.append(w)
    return " ".join(words) or first


def _key(row: pd.Series) -> str:
    return f"{row['system']}: {row['setting']}"


def what_binds(table: pd.DataFrame, kv_knob: pd.Series, windows: np.ndarray, rel_tol: float) -> str:
    """"KV memory does not bind at this load: what binds is ..." when every KV-memory knob
    (``kv_knob``: rows that change the pool, its precision, its host tier or its reservation)
    ties the default; "" when one of them moves the capacity, or there is none to compare.

    Names the SLO term the default fails first above its capacity, the knob that moves it (the
    best other setting that does not tie the default), and the load at which KV starts to bind:
    the lowest rate of the default's capacity searches at which a request was preempted for
    pages. Settings are compared window by window (``windows[i]``: row ``i``'s capacity per
    window, requests/s), as :func:`_ties` compares them.
    """
    default = table[table["default"]]
    kv = table[kv_knob & ~table["default"]]
    if default.empty or kv.empty:
        return ""
    d = default.iloc[0]
    at = windows[table.index.get_loc(default.index[0])]

    def moves(i: Any) -> bool:
        w = windows[table.index.get_loc(i)]
        return _beats(w, at, rel_tol) or _beats(at, w, rel_tol)

    if any(moves(i) for i in kv.index):
        return ""
    term = _limit(str(d["binding"])) or "no SLO term within the search's range"
    others = table[~kv_knob & ~table["default"]]
    movers = [r for i, r in others.iterrows() if moves(i)]
    if movers:
        m = max(movers, key=lambda r: r["capacity_qps"])
        knob = (f"the knob that moves it is {m['knob']} ({m['setting']}: {m['capacity_qps']:.3g} requests/s against "
                f"{d['capacity_qps']:.3g} at the default)")
    else:
        knob = "and none of the knobs searched moves the capacity"
    kv_at = d["kv_binds_at_qps"]
    if kv_at == kv_at:  # not NaN
        where = (f"at the default KV starts to bind at {kv_at:.3g} requests/s (the capacity search's first "
                 f"preemption for pages)")
    else:
        where = (f"at the default no request was preempted for pages at any rate the capacity search tried (up "
                 f"to {d['max_tried_qps']:.3g} requests/s)")
        if d["policy"] == "reserve_max":
            where += "; a server that reserves everything at admission queues instead of preempting"
    return f"KV memory does not bind at this load: what binds at the default is {term}; {knob}; {where}."


def _decide(table: pd.DataFrame, *, rate: float | None, max_unserved_frac: float, comparison: bool,
            slo: SLO, tp: int, windows: np.ndarray, rel_tol: float,
            kv_knob: pd.Series | None = None) -> tuple[str, str, int | None]:
    """(decision, answer, chosen row index): :func:`_decide_setting`, then what binds (:func:`what_binds`).

    ``windows[i]`` holds row ``i``'s capacity per window (requests/s), found to within ``rel_tol``."""
    decision, answer, chosen = _decide_setting(table, rate=rate, max_unserved_frac=max_unserved_frac,
                                               comparison=comparison, slo=slo, tp=tp, windows=windows,
                                               rel_tol=rel_tol)
    binds = ("" if comparison or kv_knob is None or decision == "overloaded"
             else what_binds(table, kv_knob, windows, rel_tol))
    return decision, f"{answer} {binds}".strip(), chosen


def _decide_setting(table: pd.DataFrame, *, rate: float | None, max_unserved_frac: float, comparison: bool,
                    slo: SLO, tp: int, windows: np.ndarray, rel_tol: float) -> tuple[str, str, int | None]:
    """(decision, answer, chosen row index): one setting, chosen on capacity alone.

    Capacity does not depend on the offered rate (see the module note), so neither does the
    choice: at one replica's share of the load the same setting is chosen, and one replica of
    it carries that share.
    """
    served = table["unserved_frac"] <= max_unserved_frac + 1e-12
    best, tie = _ties(table, served, windows, rel_tol)
    table["tie"] = tie
    if best is None:
        return "overloaded", ("No setting serves the trace without dropping or truncating requests; "
                              "raise max_unserved_frac or the context."), None
    b = table.loc[best]
    if b["capacity_qps"] <= 0:
        why = _limit(str(b["binding"])) or str(b["binding"])
        return "overloaded", (f"No setting meets the SLO ({slo}) at any rate on {tp} GPU(s) per replica ({why}): "
                              f"use a larger GPU or more tensor parallelism."), None
    chosen = best
    if not comparison:
        default = table.index[tie & table["default"]]
        chosen = default[0] if len(default) else best
    c = table.loc[chosen]
    cap = f"{c['capacity_qps']:.3g} requests/s [{c['capacity_lo_qps']:.3g}-{c['capacity_hi_qps']:.3g}]"
    limit = _limit(str(c["binding"]))
    others = int(tie.sum()) - 1
    if rate is not None and int(c["replicas"]) > 1:
        n = int(c["replicas"])
        tied = f"; {others} other setting(s) tie it" if others > 0 else ""
        lim = f", limited by {limit}" if limit else ""
        return "overloaded", (f"Overloaded: one replica of {_key(c)} sustains {cap}{lim}, {c['headroom']:.2f}x the "
                              f"{rate:.3g} requests/s to serve: run {n} replicas of it ({n * tp} GPUs) behind a "
                              f"load balancer{tied}."), chosen
    room = f", {c['headroom']:.1f}x the {rate:.3g} requests/s to serve" if rate is not None else ""
    if bool(tie.all()) and len(table) > 1:
        if comparison:
            return "all-tie", (f"The systems tie at their defaults (capacity {cap}{room}): KV reservation is not "
                               f"the bottleneck at this load; keep the server you run at its default."), chosen
        return "all-tie", (f"Every setting ties (capacity {cap}{room}): KV reservation is not the bottleneck at "
                           f"this load; keep the server default."), chosen
    if not comparison and bool(c["default"]):
        how = "it is the best setting" if chosen == best else f"it ties the best setting ({_key(b)})"
        lim = f"; the capacity is limited by {limit}" if limit else ""
        return "keep-default", f"Keep the default of {c['system']}: {how}, capacity {cap}{room}{lim}.", chosen
    decision = "recommend" if rate is not None else "no-rate"
    lim = f", limited by {limit}" if limit else ""
    tied = f" ({others} other setting(s) tie)" if others else ""
    return decision, f"Run {_key(c)}: capacity {cap}{room}{lim}{tied}.", chosen


def grid_start(rate_per_s: float | None) -> float:
    """The capacity search's first rate: the power of two nearest ``rate_per_s`` (1 without a rate).

    Doubling or halving from a power of two brackets the capacity between the same two powers
    of two whatever the start, and bisection then visits the same rates: a setting's capacity
    is the same whether it is asked about the full load or one replica's share of it.
    """
    return 1.0 if not rate_per_s else float(2.0 ** round(math.log2(rate_per_s)))


# ------------------------------------------------------------------------------ recommend
def recommend(trace: pd.DataFrame, *, model: Any, gpu: Any, system: str | None = None, slo: SLO | None = None,
              tp: int = 1, block_size: int = 16, max_new_tokens: int | None = None, max_model_len: int | None = None,
              num_requests: int | None = None, how: str = "window", rate_scale: float = 1.0, qps: float | None = None,
              num_windows: int = DEFAULT_NUM_WINDOWS, window_requests: int = DEFAULT_WINDOW_REQUESTS,
              percentiles: Sequence[float] = (50, 90, 95, 99), max_unserved_frac: float = 0.0, seed: int = 0,
              arrivals: str = DEFAULT_ARRIVALS, cost_model: Any = None, engine: str | None = None,
              rel_tol: float = 0.05, max_workers: int = 1, progress: bool = False,
              candidates: Sequence[Setting] | None = None, save_dir: str | None = None) -> Recommendation:
    """Which setting of the server you run meets the SLO at your real load, with how much capacity.

    Parameters
    ----------
    trace : DataFrame
        ``prompt_tokens``, ``output_tokens``, optional ``arrival_s`` (seconds) and ``censored``
        (``kvlab.traces.load``, ``kvlab.prometheus.from_prometheus`` or a profile sample).
    model, gpu : str or spec
        Names in ``kvlab.specs``, or a :class:`kvlab.specs.ModelSpec` / :class:`kvlab.specs.GPUSpec`
        (``kvlab.specs.resolve_model`` reads a Hugging Face id or a config.json into one); ``model``
        may carry its precision (``kvlab.specs.with_precision``: FP8 / INT4 weights, FP8 KV).
    system : {"vllm", "sglang", "tgi", "tensorrt-llm", "reservation"}, optional
        Search that system's settings (:func:`kvlab.recommend.systems.settings`), its newest
        version family, or the family holding a version: ``"vllm==0.8"``; None compares the
        four systems at their defaults.
    slo : kvlab.capacity.SLO, optional
        Default :data:`DEFAULT_SLO` (P99 TBT <= 100 ms, median scheduling delay <= 2 s, no TTFT
        bound; ``SLO(ttft_p99_s=...)`` adds one).
    tp : int
        Tensor-parallel GPUs per replica.
    block_size : int
        Tokens per KV page.
    max_new_tokens : int, optional
        Output cap (tokens); default the trace's detected cap, else its longest output; clamped
        to the context.
    max_model_len : int, optional
        The server's context (tokens, prompt + output); default the model's. Longer prompts are
        refused, longer outputs cut.
    num_requests, how, rate_scale, qps
        The load (:func:`kvlab.trace_window.trace_window`): None serves the whole trace at its
        own rate. ``qps`` is the rate offered to the server, refused requests included.
    arrivals : {"replay", "gamma", "poisson"}
        The arrival process capacity is searched under (see the module note); a trace without
        arrival times is searched under Poisson arrivals.
    num_windows, window_requests : int
        Capacity windows and requests per window (fewer when the trace is smaller).
    percentiles : sequence of float
        Output-length percentiles reported (and reserved by the ``reservation`` recipe).
    max_unserved_frac : float
        Share of requests a setting may reject or truncate and still be chosen, in [0, 1].
    seed : int
        Seed of a sample, of Poisson or Gamma arrivals, and of window ``i``'s trials (``seed + i``).
    cost_model : {"measured", "roofline"}, cost model object or None
        Iteration-time model of every simulation (``kvlab.capacity.ServingConfig.cost_model``);
        None: measured where the GPU has measurements, else the roofline. The setup records
        which ran.
    engine : str, optional
        Simulator engine.
    rel_tol : float
        Capacity search resolution (:func:`kvlab.capacity.capacity`): the true capacity of a
        window lies within ``rel_tol`` above the one found (stated in the answer).
    max_workers : int
        Processes for the simulations (the answer does not depend on it).
    progress : bool
        Show a progress bar on stderr.
    candidates : sequence of Setting, optional
        Search exactly these settings instead of ``system``'s (one system: a search of it; several:
        a comparison).
    save_dir : str, optional
        Folder for the config files the printed commands name (TensorRT-LLM's extra LLM API
        YAML); the commands name them there.

    Returns
    -------
    Recommendation

    Raises
    ------
    ValueError
        A bad trace (the missing column named), model, GPU, system or parameter.
    """
    start = time.perf_counter()
    trace = v.request_table(trace, "trace")  # the trace contract: lengths, times, no duplicate columns
    if system is not None:
        _resolve(system)  # an unknown system or version family is named here
    slo = DEFAULT_SLO if slo is None else slo
    if not isinstance(slo, SLO):
        raise ValueError(f"slo must be a kvlab.capacity.SLO, got {type(slo).__name__}")
    tp, block_size = v.positive_int(tp, "tp"), v.positive_int(block_size, "block_size")
    num_windows = v.positive_int(num_windows, "num_windows")
    window_requests = v.positive_int(window_requests, "window_requests")
    max_unserved_frac = v.fraction(max_unserved_frac, "max_unserved_frac", low_open=False)
    max_workers = v.positive_int(max_workers, "max_workers")
    v.choice(how, "how", HOW)
    v.choice(arrivals, "arrivals", PROCESSES)
    model_spec, gpu_spec = _model(model), _gpu(gpu)
    model_name = model_spec.name

    served, fit = fit_to_context(trace, model=model_spec, max_new_tokens=max_new_tokens, max_model_len=max_model_len)
    if num_requests is not None:
        num_requests = min(v.positive_int(num_requests, "num_requests"), len(served))
    served_qps = None if qps is None else v.positive_float(qps, "qps") * fit.served_frac
    load: TraceWindow = trace_window(served, num_requests, how=how, seed=seed, rate_scale=rate_scale, qps=served_qps)
    rate = load.rate_per_s
    offered = rate / fit.served_frac if rate is not None else None
    pct = output_percentiles(served["output_tokens"].to_numpy(), percentiles)
    cap = fit.max_new_tokens
    if candidates is not None:
        candidates = list(candidates)
        if not candidates or not all(isinstance(c, Setting) for c in candidates):
            raise ValueError("candidates must be a non-empty list of kvlab.recommend.Setting")
        if system is not None:
            raise ValueError("give system or candidates, not both")
        systems = {c.system for c in candidates}
        system = systems.pop() if len(systems) == 1 else None
    else:
        candidates = (default_settings(model=model_spec, gpu=gpu_spec, tp=tp, max_model_len=fit.max_model_len)
                      if system is None else
                      settings(system, model=model_spec, gpu=gpu_spec, tp=tp, percentiles=pct, max_new_tokens=cap,
                               max_model_len=fit.max_model_len))
    for prof in {profile_of(c).key: profile_of(c) for c in candidates}.values():
        prof.check_block_size(block_size)  # a block size the release refuses is refused here, not printed
    comparison = system is None

    n_win = min(window_requests, len(served))
    starts = window_starts(len(served), n_win, num_windows)
    windows = [trace_window(served, n_win, start_row=s).requests for s in starts]
    # the trace's own arrival process needs times that span some seconds in every window
    timed = all(offered_rate_per_s(w.get("arrival_s")) is not None for w in windows)
    process = arrivals if timed else "poisson"
    has_ids = HASH_IDS in served.columns
    cols = ["prompt_tokens", "output_tokens"] + (["arrival_s"] if timed else []) + ([HASH_IDS] if has_ids else [])
    windows = [w[cols] for w in windows]
    warnings = fit.warnings()
    if not timed and arrivals != "poisson":
        warnings.append("the trace has no arrival times (or a window's all coincide): capacity is searched under "
                        "Poisson arrivals, not the trace's own")
    needed = num_windows * window_requests
    if len(served) < needed:
        warnings.append(f"small trace: {len(served):,} requests give {num_windows} overlapping windows of {n_win:,}; "
                        f"a stable answer needs at least {needed:,} ({num_windows} disjoint windows of "
                        f"{window_requests:,})")
    for key in ("dropped_rows", "failed_requests"):
        if trace.attrs.get(key):
            warnings.append(f"{trace.attrs[key]:,} {key.replace('_', ' ')} in the trace file, not served")
    warnings += [n for n in trace.attrs.get("notes", []) if trace.attrs.get("format") == "prometheus"]
    if trace.get("censored") is not None and bool(trace["censored"].any()):
        warnings.append(f"{int(trace['censored'].sum()):,} outputs hit the recording's cap: their true lengths "
                        f"are longer, so high percentiles are lower bounds")

    priced = [priced_with(s, cost_model) for s in candidates]
    configs = [serving_config(s, model=model_spec, gpu=gpu_spec, tp=tp, block_size=block_size, max_new_tokens=cap,
                              cost_model=cm, engine=engine, trace_has_block_ids=has_ids)
               for s, cm in zip(candidates, priced)]
    uncached = [s.label for s, c in zip(candidates, configs) if s.prefix_caching and has_ids and not c.prefix_caching]
    if uncached and len(uncached) < len(candidates):  # compared without their cache they would look worse than they are
        keep = [k for k, (s, c) in enumerate(zip(candidates, configs)) if not (s.prefix_caching and not c.prefix_caching)]
        candidates, priced, configs = ([x[k] for k in keep] for x in (candidates, priced, configs))
        warnings.append(f"not searched: {', '.join(uncached)}: kvlab prices that host tier as a swap, which its prefix "
                        f"cache cannot run with, and without the cache the setting would be compared unfairly")
    cached = sorted({c.system for c in candidates if c.prefix_caching})
    if cached and not has_ids:
        warnings.append(f"{', '.join(cached)} run a prefix cache by default, but the trace carries no block "
                        f"identities (hash_ids): no prefix hit is simulated, so where prompts share prefixes the "
                        f"prefill work and KV use are overstated")
    if model_spec.weight_dtype != "bf16" and configs[0].cost_label().startswith("measured"):
        how = ("one byte a weight at the GPU's FP8/BF16 dense-peak ratio" if model_spec.weight_dtype == "fp8" else
               "their bytes a weight at BF16 throughput")
        warnings.append(f"{model_spec.weight_dtype} weights: kvlab's measured GEMMs are BF16 ones, so these GEMMs are "
                        f"priced, not measured: {how}; the trust line's NVIDIA FP8 points (notebook 09, section 6) "
                        f"show how far that holds where they were measured")
    cap_kw = {"rel_tol": rel_tol, "qps_start": grid_start(rate)}

    def searches(c: ServingConfig, kind: str) -> list[tuple[Callable, Any]]:
        return [(_capacity, (w, c, slo, {**cap_kw, "num_requests": len(w), "seed": seed + i, "arrivals": kind}))
                for i, w in enumerate(windows)]

    jobs: list[tuple[Callable, Any]] = []
    for c in configs:
        jobs += searches(c, process)
    if rate is not None:  # last, so a progress bar's first runs are the capacity searches
        jobs += [(_at_load, (load.requests, c, slo, seed, cap)) for c in configs]
    results = _run(jobs, max_workers, progress)

    rows, capacities = [], {}
    for k, (s, c) in enumerate(zip(candidates, configs)):
        at = results[-len(configs) + k] if rate is not None else _no_load(load.requests, c, cap)
        caps = results[k * len(windows): (k + 1) * len(windows)]
        values = np.array([q[0] for q in caps])
        median = float(np.median(values))
        binding = caps[int(np.argsort(values)[len(values) // 2])][1]
        unbounded = sum(q[2].startswith("not bracketed") for q in caps)
        kv_at = [q[3] for q in caps if q[3] == q[3]]
        if unbounded:
            warnings.append(f"{s.system}: {s.label}: {unbounded} of {len(caps)} windows still meet the SLO at "
                            f"{values.max():.3g} requests/s (the search's ceiling): {n_win:,} requests are too "
                            f"few to fill the server, so its capacity is at least that")
        replicas = (math.ceil(rate / median - 1e-9) if rate is not None and median > 0 else None)
        capacities[f"{s.system}: {s.label}"] = values.tolist()
        rows.append({"system": s.system, "setting": s.label, "knob": s.knob, "default": s.is_default,
                     "policy": s.policy, "overflow": s.overflow, "max_num_seqs": s.max_num_seqs,
                     "max_num_batched_tokens": c.max_num_batched_tokens,
                     "gpu_memory_utilization": s.gpu_memory_utilization, "pool_pages": c.pool_pages,
                     "max_new_tokens": c.max_new_tokens, "capacity_qps": median,
                     "capacity_lo_qps": float(values.min()), "capacity_hi_qps": float(values.max()),
                     "capacity_poisson_qps": float("nan"), "capacity_gamma_qps": float("nan"),
                     "binding": binding, "kv_binds_at_qps": min(kv_at) if kv_at else float("nan"),
                     "max_tried_qps": max(q[4] for q in caps), "headroom": median / rate if rate else None,
                     "replicas": replicas,
                     "num_gpus": replicas * tp if replicas is not None else None,
                     "meets_slo_at_load": at["slo_at_load"] == "meets the SLO"
                     and at["unserved_frac"] <= max_unserved_frac + 1e-12, **at, "tie": False,
                     "recommended": False})
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    kv_knob = pd.Series([s.knob in profile_of(s).kv_knobs for s in candidates], index=table.index)
    per_window = np.array([capacities[f"{s.system}: {s.label}"] for s in candidates])
    decision, answer, chosen = _decide(table, rate=rate, max_unserved_frac=max_unserved_frac, comparison=comparison,
                                       slo=slo, tp=tp, windows=per_window, rel_tol=rel_tol,
                                       kv_knob=kv_knob)
    check: dict[str, Any] = {}
    if chosen is not None:
        table.loc[chosen, "recommended"] = True
        answer, check = _beside(table, chosen, configs[chosen], searches, load, answer, slo=slo, seed=seed, cap=cap,
                                process=process, max_workers=max_workers, progress=progress,
                                rate_scale=rate_scale, served=served, num_requests=num_requests, how=how,
                                served_qps=served_qps)
    if fit.prompts_over_context and rate is not None:
        answer += (f" The trace offers {offered:.3g} requests/s, but {fit.refused_parts()[0]}: "
                   f"{rate:.3g} requests/s are left to serve.")
    # the server is told the checkpoint: the model's Hugging Face id, else the spec's own name
    flags = _flags(table, candidates, chosen, comparison, model=model_spec, fit=fit, block_size=block_size, tp=tp,
                   save_dir=save_dir)
    prof = None if comparison else profile_of(candidates[0])
    cost_label = configs[0].cost_label()
    setup = {"model": model_name, "hf_id": model_spec.hf_id, "weights": model_spec.weight_dtype,
             "kv_cache_dtype": model_spec.kv_cache_dtype, "gpu": gpu_spec.name, "tp": tp, "pp": 1,
             "system": system or "comparison",
             "version_family": prof.family if prof else "each system's newest family at its default",
             "server": prof.describe() if prof else {},
             "default_flags": " ".join(f"{k} {val}" for k, val in candidates[0].flags.items())
             if prof and candidates[0].is_default else "", "slo": str(slo),
             "slo_p99_tbt_s": slo.tbt_p99_s, "scheduling_delay_p50_s": slo.scheduling_delay_p50_s,
             "slo_p99_ttft_s": slo.ttft_p99_s, "cost_model": cost_label,
             "gpu_measured": gpu_spec.name in _measured_gpus(),
             "scheduler": "/".join(sorted({c.scheduler for c in configs})),
             "block_size": block_size, "num_windows": len(starts), "window_requests": n_win, "window_starts": starts,
             "seed": seed, "capacity_rel_tol": rel_tol, "capacity_grid_start_qps": cap_kw["qps_start"],
             "capacity_arrivals": process,
             "gap_cv": gap_cv(served["arrival_s"].to_numpy()) if timed and len(served) > 2 else None,
             "stack": ", ".join(dict.fromkeys(_stack_of(cm) for cm in priced)),
             "trust": _trust_lines(candidates, priced, gpu_spec)}  # validated error on real servers
    load_record = {"source": trace.attrs.get("source", "table"), **load.as_dict(), "rate_scale": rate_scale,
                   "qps": qps, "offered_rate_per_s": offered, "trace_requests_all": fit.trace_requests,
                   "refused_requests": fit.prompts_over_context}
    ties = [_key(r) for _, r in table[table["tie"]].iterrows()]
    return Recommendation(decision=decision, answer=answer, chosen=None if chosen is None else _key(table.loc[chosen]),
                          ties=ties, table=table, flags=flags, load=load_record, context=fit, percentiles=pct,
                          setup=setup, warnings=warnings, capacities=capacities, check=check,
                          elapsed_s=time.perf_counter() - start)


def _beside(table: pd.DataFrame, chosen: int, config: ServingConfig, searches: Callable, load: TraceWindow,
            answer: str, *, slo: SLO, seed: int, cap: int, process: str, max_workers: int, progress: bool,
            rate_scale: float, served: pd.DataFrame, num_requests: int | None, how: str,
            served_qps: float | None) -> tuple[str, dict[str, Any]]:
    """The chosen setting's capacity under the other arrival processes, and its check at one replica's
    share of the load; the answer with both in words."""
    row = table.loc[chosen]
    kinds = [k for k in ("poisson", "gamma") if k != process] if process != "poisson" else []
    rate = load.rate_per_s
    n = int(row["replicas"]) if rate is not None else 1
    jobs = [j for k in kinds for j in searches(config, k)]
    share = None
    if rate is not None and n > 1:
        scale = {"rate_scale": rate_scale / n} if served_qps is None else {"qps": served_qps / n}
        share = trace_window(served, num_requests, how=how, seed=seed, **scale)
        jobs.append((_at_load, (share.requests, config, slo, seed, cap)))
    results = _run(jobs, max_workers, progress) if jobs else []
    per = (len(results) - (share is not None)) // max(len(kinds), 1)  # searches per arrival process
    found = {}
    for i, kind in enumerate(kinds):
        found[kind] = float(np.median([q[0] for q in results[i * per:(i + 1) * per]]))
        table.loc[chosen, f"capacity_{kind}_qps"] = found[kind]
    if found:
        named = {"poisson": "Poisson arrivals", "gamma": "Gamma arrivals of the same gap CV"}
        other = ", ".join(f"under {named[k]} " + (f"{q:.3g} requests/s" if q > 0 else
                                                    "none: it misses the SLO at every rate tried")
                          for k, q in found.items())
        own = "time-compressed" if process == "replay" else "a Gamma renewal of their gap CV"
        answer += f" That capacity is under the trace's own arrivals ({own}); {other}."
    if rate is None:
        return answer, {}
    at = results[-1] if share is not None else row
    check = {"replicas": n, "rate_per_s": rate / n, "slo": at["slo_at_load"], "p99_ttft_ms": at["p99_ttft_ms"],
             "p99_itl_ms": at["p99_itl_ms"]}
    where = f"one replica's share ({rate / n:.3g} requests/s)" if n > 1 else f"its rate ({rate:.3g} requests/s)"
    if at["slo_at_load"] == "meets the SLO":
        answer += (f" Check: served the trace at {where}, it meets the SLO (P99 TTFT "
                   f"{at['p99_ttft_ms'] / 1e3:.3g} s).")
    else:
        answer += (f" Check: served the whole trace at {where}, it misses the SLO ({at['slo_at_load']}): the "
                   f"trace's busiest stretch is heavier than its capacity windows; take the capacity as optimistic.")
    return answer, check


FLAG_COLUMNS = ("system", "setting", "version", "max_model_len", "command", "client", "notes", "files")


def _flags(table: pd.DataFrame, candidates: list[Setting], chosen: int | None, comparison: bool, *, model: Any,
           fit: ContextFit, block_size: int, tp: int, save_dir: str | None = None) -> pd.DataFrame:
    """Commands for the chosen setting (first), and in a comparison each other system's default.

    The server's context is ``fit.max_model_len`` (the model's or the user's), so a prompt longer
    than any in the trace is still accepted; no flags when nothing was chosen. The config files
    the commands name are written into ``save_dir`` when given.
    """
    if chosen is None:
        picks = []
    else:
        picks = [chosen] + ([i for i in table.index if i != chosen] if comparison else [])
    rows = []
    for i in picks:
        s = candidates[i]
        run = launch(s, model=model, max_model_len=fit.max_model_len, max_prompt_tokens=fit.max_model_len - 1,
                     max_new_tokens=fit.max_new_tokens, block_size=block_size, tp=tp, save_dir=save_dir)
        if save_dir is not None:
            write_files(run, save_dir)
        rows.append({"system": s.system, "setting": s.label, "version": s.version or profile_of(s).family,
                     "max_model_len": fit.max_model_len, "command": run.command,
                     "client": client_note(s, max_new_tokens=fit.max_new_tokens), "notes": list(run.notes),
                     "files": dict(run.files)})
    return pd.DataFrame(rows, columns=list(FLAG_COLUMNS))


# ------------------------------------------------------------------------------ the text
WIDTH = 100


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    return format(int(x) if spec == "d" else x, spec)


def _trust_lines(candidates: Sequence[Setting], priced: Sequence[Any], gpu: Any) -> str:
    """:func:`kvlab.validate.trust` of each stack the candidates were priced with, naming its families."""
    by_stack: dict[str, tuple[Any, list[str]]] = {}
    for s, cm in zip(candidates, priced):
        fams = by_stack.setdefault(_stack_of(cm), (cm, []))[1]
        fam = profile_of(s).family
        if fam not in fams:
            fams.append(fam)
    lines = [_trust(cm, gpu=gpu, family=", ".join(fams)) for cm, fams in by_stack.values()]
    points = _point_trust([s.system for s in candidates], gpu)
    return "; ".join(lines + ([points] if points else []))


def render_text(rec: Recommendation) -> str:
    """The terminal report, every line at most :data:`WIDTH` columns."""
    ld, s, fit = rec.load, rec.setup, rec.context
    rate, offered = ld["rate_per_s"], ld.get("offered_rate_per_s")
    gpu_note = "" if s.get("gpu_measured", True) else \
        f"; GPU not measured: spec-sheet estimate for {s['gpu']}" if s["cost_model"].startswith("roofline") else \
        f"; GPU not measured: {s['gpu']} extrapolated from the nearest measured GPU by spec ratios"
    precision = "" if (s.get("weights"), s.get("kv_cache_dtype")) in ((None, None), ("bf16", "auto")) else \
        f" ({s['weights']} weights, {s['kv_cache_dtype']} KV)"
    lines = [*_wrap(f"{s['model']}{precision} on {s['tp']} x {s['gpu']}; {s['system']} ({s['version_family']}); "
                    f"SLO {s['slo']}" + ("" if s.get("slo_p99_ttft_s") is not None else " (no TTFT bound: --slo-p99-ttft)")),
             *_wrap(f"cost model: {s['cost_model']}{gpu_note}; {s['scheduler']} scheduler, block {s['block_size']}"),
             *_wrap(s.get("trust") or "real servers: not validated")]
    if rate:
        own = "the trace's own rate" + ("" if ld["how"] == "all" else " over the rows served")
        if ld.get("qps"):
            own = "as asked (--qps)"
        elif ld.get("rate_scale", 1.0) != 1.0:
            own += f" x {ld['rate_scale']:g}"
        lines += _wrap(f"offered: {offered:.3g} requests/s, {own}; the trace holds {fit.trace_requests:,} requests")
    else:
        lines += [f"offered: no arrival times (offline); the trace holds {fit.trace_requests:,} requests"]
    if fit.refused():
        lines += _wrap(f"refused: {fit.refused()}")
    lines += _wrap(f"served: {ld['num_requests']:,} of {ld['trace_requests']:,} requests ({ld['how']}) over "
                   f"{ld['duration_s']:,.0f} s at " + (f"{rate:.3g} requests/s" if rate else "once (offline)")
                   + f"; context --max-model-len {fit.max_model_len:,} ({fit.context_source})")
    lines += ["output tokens: " + ", ".join(f"{k} {val:,}" for k, val in rec.percentiles.items())
              + f"; max_new_tokens {fit.max_new_tokens:,} ({fit.cap_source})"]
    how = {"replay": "the trace's own arrivals time-compressed",
           "gamma": "Gamma arrivals of the trace's gap CV", "poisson": "Poisson arrivals"}[s["capacity_arrivals"]]
    cv = f", gap CV {s['gap_cv']:.2f}" if s.get("gap_cv") is not None else ""
    lines += _wrap(f"capacity: highest served rate within the SLO under {how}{cv}; median [range] over "
                   f"{s['num_windows']} windows of {s['window_requests']:,} requests, each found to within "
                   f"{s['capacity_rel_tol']:.0%} (the search's grid); requests/s") + [""]
    if s.get("default_flags"):
        lines[-1:-1] = _wrap(f"default of {s['version_family']} for this model and GPU: {s['default_flags']}")
    head = f"{'setting':<30} {'capacity [range]':>22} {'headroom':>8} {'replicas':>8} {'p99 ttft':>9} " \
           f"{'p99 itl':>8}"
    lines += [head, f"{'':<30} {'req/s':>22} {'x':>8} {'':>8} {'ms':>9} {'ms':>8}"]
    for _, r in rec.table.iterrows():
        name = f"{r['system']}: {r['setting']}" if s["system"] == "comparison" else r["setting"]
        capr = f"{r['capacity_qps']:.3g} [{r['capacity_lo_qps']:.3g}-{r['capacity_hi_qps']:.3g}]"
        mark = "<- run" if r["recommended"] else ("tie" if r["tie"] else "")
        if not r["meets_slo_at_load"] and rate:
            mark = (mark + " MISS").strip()
        lines.append(f"{name[:30]:<30} {capr:>22} {_fmt(r['headroom'], '.2f'):>8} {_fmt(r['replicas'], 'd'):>8} "
                     f"{_fmt(r['p99_ttft_ms'], '.0f'):>9} {_fmt(r['p99_itl_ms'], '.1f'):>8} {mark}".rstrip())
    if rate and not rec.table["meets_slo_at_load"].all():
        lines += ["(MISS: misses the SLO when one replica serves the whole trace at its rate)"]
    lines += ["", *_wrap(f"answer: {rec.answer}")]
    if rec.decision == "overloaded" and rec.chosen is not None:
        lines += _wrap(f"what to do: {rec.what_to_do}")
    for w in rec.warnings:
        if w not in fit.refused_parts():  # those are in the headline
            lines += _wrap(f"warning: {w}")
    lines += _prefix_lines(rec)
    srv = s.get("server") or {}
    if srv:
        lines += ["", *_wrap(f"server: {srv['overflow']}; prefix cache {srv['prefix_cache']}; host KV tier "
                             f"{srv['host_offload']} (read from {srv['sources']})")]
    for _, f in rec.flags.iterrows():
        lines += ["", f"{f['system']} ({f['version']}), {f['setting']}:"] + _wrap(f["command"], indent="  ") \
            + _wrap(f["client"], indent="  ")
        for note in f["notes"]:
            lines += _wrap(f"note: {note}", indent="  ")
        for name, text in f["files"].items():
            lines += [f"  {name}:"] + [f"    {line}" for line in text.splitlines()]
    lines += ["", f"({rec.elapsed_s:.1f} s; full table: --json or --csv -o FILE)"]
    return "\n".join(line.rstrip() for line in lines)


def _prefix_lines(rec: Recommendation) -> list[str]:
    """What the prefix cache saves and holds at the offered load (the chosen setting, else the first)."""
    t = rec.table
    if not len(t) or not t["prefix_caching"].any():
        return []
    pick = t[t["recommended"]] if t["recommended"].any() else t[t["prefix_caching"]]
    r = pick.iloc[0]
    if r["prefix_hit_rate"] != r["prefix_hit_rate"]:
        return _wrap("prefix cache: simulated from the trace's hash_ids, but no load was served to measure it")
    pool = r["pool_pages"]
    return ["", *_wrap(f"prefix cache ({r['setting']}, simulated from the trace's hash_ids at the offered load): "
                       f"{r['prefix_hit_rate']:.1%} of prompt tokens hit; {r['saved_prefill_tokens']:,.0f} prefill "
                       f"tokens not computed ({r['hit_pages']:,.0f} pages reused); sharing saves "
                       f"{r['mean_pages_shared_saved']:,.1f} pages on average; the cache holds "
                       f"{r['mean_pages_cached']:,.0f} pages no request uses on average (peak "
                       f"{r['max_pages_cached']:,.0f}, {r['max_pages_cached'] / pool:.0%} of the {pool:,}-page pool; "
                       f"evicted on demand)")]


def _wrap(text: str, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


__all__ = ["DECISIONS", "DEFAULT_ARRIVALS", "DEFAULT_NUM_WINDOWS", "DEFAULT_SLO", "DEFAULT_WINDOW_REQUESTS",
           "LATENCY_COLUMNS", "TABLE_COLUMNS", "ContextFit", "FLAG_COLUMNS", "Recommendation", "fit_to_context",
           "grid_start", "output_percentiles", "recommend", "render_text", "serving_config", "what_binds"]
