"""The recipe: from your trace, model, GPU and SLO, which setting of your server to run, how many
replicas, and how sure the answer is.

What :func:`recommend` does, in order:

1. **Fit the trace to the model.** Prompts that do not fit the model's context are counted and
   left out (the server rejects them); outputs that would run past the context are counted and
   cut there. ``max_new_tokens`` defaults to the trace's own detected cap (else its longest
   output), clamped to the context.
2. **The real load.** The requests are served at the trace's own rate
   (:func:`kvlab.trace_window.trace_window`: the whole trace, a window, or a sample rescaled
   to keep the rate; ``rate_scale`` / ``qps`` ask "what if traffic grows"), and each setting's
   latencies at that load are reported in vLLM ``benchmark_serving``'s names (ms).
3. **Capacity.** For each setting, :func:`kvlab.capacity.capacity` finds the highest Poisson
   rate that meets the SLO (the same :class:`kvlab.capacity.SLO` judges the load above), on
   ``num_windows`` windows of ``window_requests`` requests spread over the trace. The median is
   the capacity; the range over the windows is the interval (with 5 windows, the range covers
   the median of the window-capacity distribution with probability ``1 - 2 / 2**5 = 94%``).
   Headroom is capacity / offered rate; replicas are ``ceil(rate / capacity)``.
4. **How sure.** Settings whose interval reaches the best one's are ties; the default is kept
   when it ties the best, and when every setting ties the answer says the knobs do not matter
   at this load. If no setting meets the SLO at the offered load the answer says the server is
   overloaded and how many replicas it needs, instead of recommending a setting.
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
from ..validate.trust_figures import trust as _trust
from ..capacity import SLO, ServingConfig, capacity, serve, slo_verdict
from ..lengths import recommend_max_new_tokens
from ..reservation import pool_pages as _pool_pages
from ..specs import model as _model, with_precision
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
#: Columns of :attr:`Recommendation.table`.
TABLE_COLUMNS = ("system", "setting", "knob", "default", "policy", "overflow", "max_num_seqs",
                 "max_num_batched_tokens", "gpu_memory_utilization", "pool_pages", "max_new_tokens",
                 "capacity_qps", "capacity_lo_qps", "capacity_hi_qps", "binding", "kv_binds_at_qps",
                 "max_tried_qps", "headroom", "replicas",
                 "num_gpus", "meets_slo_at_load", "slo_at_load", "offered_rate_per_s", *LATENCY_COLUMNS,
                 "preempted_request_frac", "unserved_frac", "tie", "recommended")
#: The possible decisions.
DECISIONS = ("recommend", "keep-default", "all-tie", "overloaded", "no-rate")


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

    def warnings(self) -> list[str]:
        out = []
        if self.prompts_over_context:
            n = self.prompts_over_context
            out.append(f"{n:,} {'prompt does' if n == 1 else 'prompts do'} not fit the model's "
                       f"{self.max_context_tokens:,}-token context: the server rejects them; left out of the "
                       f"simulation")
        if self.outputs_over_context:
            out.append(f"{self.outputs_over_context:,} outputs would run past the context: cut at "
                       f"{self.max_context_tokens:,} tokens of prompt + output")
        if self.max_new_tokens < self.trace_cap_tokens:
            out.append(f"max_new_tokens clamped from {self.trace_cap_tokens:,} to {self.max_new_tokens:,} "
                       f"(the model's context)")
        return out


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """What :func:`recommend` found (see the module note for how).

    Attributes
    ----------
    decision : str
        One of :data:`DECISIONS`.
    answer : str
        One sentence answering "what should I run", computed from the table.
    chosen : str or None
        ``"system: setting"`` of the recommendation (None when overloaded).
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
        """The action for the operator, computed from the decision and the flags."""
        rate = self.load.get("rate_per_s")
        if self.decision == "overloaded":
            return (f"{self.answer} Then re-run kvlab recommend at one replica's share of the traffic "
                    f"(--rate-scale 1/replicas) to choose its setting.")
        row = self.row(self.chosen) if self.chosen else None
        hit = self.flags if row is None else \
            self.flags[(self.flags["system"] == row["system"]) & (self.flags["setting"] == row["setting"])]
        f = (hit if len(hit) else self.flags).iloc[0]
        grow = ""
        if row is not None and rate:
            grow = (f" It carries {row['capacity_lo_qps']:.3g}-{row['capacity_hi_qps']:.3g} requests/s, "
                    f"{row['capacity_lo_qps'] / rate:.1f}x or more today's {rate:.3g}: re-run with --rate-scale "
                    f"when traffic grows past that.")
        elif rate is None:
            grow = " The trace has no arrival times: give its rate (qps) to check the load."
        return f"Launch with: {f['command']}; {f['client']}.{grow}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the decision, the load, the full table and the flags."""
        table = self.table.astype(object).where(self.table.notna(), None)
        return {"decision": self.decision, "answer": self.answer, "what_to_do": self.what_to_do,
                "chosen": self.chosen, "ties": self.ties,
                "load": self.load, "context": self.context.__dict__, "percentiles": self.percentiles,
                "setup": self.setup, "warnings": self.warnings, "capacities": self.capacities,
                "elapsed_s": self.elapsed_s, "table": table.to_dict(orient="records"),
                "flags": self.flags.to_dict(orient="records")}

    def __str__(self) -> str:
        return render_text(self)


# ------------------------------------------------------------------------------ preparation
def fit_to_context(trace: pd.DataFrame, *, model: str, max_new_tokens: int | None) -> tuple[pd.DataFrame, ContextFit]:
    """The trace as a server with this model's context serves it, and what did not fit."""
    ctx = _model(model).max_context_tokens
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
        raise ValueError(f"no prompt of the trace fits {model}'s context of {ctx:,} tokens "
                         f"(shortest prompt {int(prompt.min()):,})")
    over = fits & (prompt + output > ctx)
    served = trace.loc[fits].copy()
    served["output_tokens"] = np.minimum(output[fits], ctx - prompt[fits])
    served.attrs = dict(trace.attrs)
    cap = min(trace_cap, ctx - 1)
    max_prompt = int(prompt[fits].max())
    fit = ContextFit(max_context_tokens=ctx, max_model_len=min(ctx, max_prompt + cap), max_prompt_tokens=max_prompt,
                     max_new_tokens=cap, trace_cap_tokens=trace_cap, cap_source=source,
                     prompts_over_context=int((~fits).sum()), outputs_over_context=int(over.sum()))
    return served.reset_index(drop=True), fit


def output_percentiles(output_tokens: Any, percentiles: Sequence[float]) -> dict[str, int]:
    """``{"p50": tokens, ...}``: each percentile of the output lengths, rounded up to a whole token
    (:func:`kvlab.lengths.recommend_max_new_tokens` at ``percentiles / 100``)."""
    pcts = v.percentiles(percentiles)  # 0-100 scale; 0.95 is refused, not read as the 0.95th
    caps = recommend_max_new_tokens(output_tokens, [p / 100.0 for p in pcts])["max_new_tokens"]
    return {f"p{p:g}": int(cap) for p, cap in zip(pcts, caps)}


def serving_config(setting: Setting, *, model: str, gpu: str, tp: int, block_size: int, max_new_tokens: int,
                   cost_model: Any = None, engine: str | None = None) -> ServingConfig:
    """The :class:`kvlab.capacity.ServingConfig` that simulates ``setting`` (its KV precision on
    ``model``'s weights, its scheduler, its host pool)."""
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
                         engine=engine)


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
            "slo_at_load": slo_verdict(res, slo)}


def _no_load(requests: pd.DataFrame, config: ServingConfig, trace_cap: int) -> dict[str, Any]:
    """Without arrival times there is no load to serve: only what does not depend on it."""
    cap = min(config.max_new_tokens, trace_cap)
    truncated = int((np.minimum(requests["output_tokens"], trace_cap) > cap).sum())
    return {"offered_rate_per_s": None, **{c: float("nan") for c in LATENCY_COLUMNS},
            "preempted_request_frac": float("nan"), "unserved_frac": truncated / len(requests),
            "slo_at_load": "no offered load (the trace has no arrival times; give qps)"}


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
def _ties(table: pd.DataFrame, eligible: pd.Series) -> tuple[int | None, pd.Series]:
    """Index of the best eligible row (highest capacity) and which eligible rows tie it."""
    ok = table[eligible]
    if ok.empty:
        return None, pd.Series(False, index=table.index)
    best = ok.sort_values(["capacity_qps", "capacity_lo_qps", "default"], ascending=False, kind="stable").index[0]
    tie = eligible & (table["capacity_hi_qps"] >= table.loc[best, "capacity_lo_qps"])
    return best, tie


def _limit(binding: str) -> str:
    """What binds, without its numbers: "median scheduling delay", "P99 TBT", "aborted requests"."""
    first = binding.split(";")[0].strip()
    if first.startswith(("converged", "unreachable", "not bracketed", "stopped")):
        return ""
    if first.split()[0].isdigit():  # "3 requests aborted"
        return "aborted requests"
    if first.startswith("not sustained"):  # capacity's backlog rule: arrivals outrun the server
        return "a growing queue (requests still waiting when the last arrives)"
    words = []
    for w in first.split():
        if w.replace(".", "", 1).isdigit():
            break
        words.append(w)
    return " ".join(words) or first


def _key(row: pd.Series) -> str:
    return f"{row['system']}: {row['setting']}"


def _overlaps(a: pd.Series, b: pd.Series) -> bool:
    return bool(a["capacity_hi_qps"] >= b["capacity_lo_qps"] and a["capacity_lo_qps"] <= b["capacity_hi_qps"])


def what_binds(table: pd.DataFrame, kv_knob: pd.Series) -> str:
    """"KV memory does not bind at this load: what binds is ..." when every KV-memory knob
    (``kv_knob``: rows that change the pool, its precision, its host tier or its reservation)
    ties the default; "" when one of them moves the capacity, or there is none to compare.

    Names the SLO term the default fails first above its capacity, the knob that moves it (the
    best other setting that does not tie the default), and the load at which KV starts to bind:
    the lowest rate of the default's capacity searches at which a request was preempted for
    pages.
    """
    default = table[table["default"]]
    kv = table[kv_knob & ~table["default"]]
    if default.empty or kv.empty:
        return ""
    d = default.iloc[0]
    if not all(_overlaps(r, d) for _, r in kv.iterrows()):
        return ""
    term = _limit(str(d["binding"])) or "no SLO term within the search's range"
    others = table[~kv_knob & ~table["default"]]
    movers = [r for _, r in others.iterrows() if not _overlaps(r, d)]
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
            slo: SLO, tp: int, kv_knob: pd.Series | None = None) -> tuple[str, str, int | None]:
    """(decision, answer, chosen row index)."""
    decision, answer, chosen = _decide_setting(table, rate=rate, max_unserved_frac=max_unserved_frac,
                                               comparison=comparison, slo=slo, tp=tp)
    binds = "" if comparison or kv_knob is None or decision == "overloaded" else what_binds(table, kv_knob)
    return decision, f"{answer} {binds}".strip(), chosen


def _decide_setting(table: pd.DataFrame, *, rate: float | None, max_unserved_frac: float, comparison: bool,
                    slo: SLO, tp: int) -> tuple[str, str, int | None]:
    served = table["unserved_frac"] <= max_unserved_frac + 1e-12
    at_load = served & table["meets_slo_at_load"] if rate is not None else served
    best_any, tie_any = _ties(table, served)
    if rate is not None and not at_load.any():
        table["tie"] = tie_any  # capacity ties still read as ties
        if best_any is None:
            return "overloaded", ("No setting serves the trace without dropping or truncating requests; "
                                  "raise max_unserved_frac or the context."), None
        b = table.loc[best_any]
        need = (f"run {int(b['replicas'])} replicas ({int(b['num_gpus'])} GPUs) behind a load balancer"
                if b["capacity_qps"] > 0 else "use a larger GPU or more tensor parallelism")
        others = int(tie_any.sum()) - 1
        tied = f" ({others} other setting(s) tie it)" if others > 0 else ""
        return "overloaded", (f"Overloaded: at {rate:.3g} requests/s no setting meets the SLO ({slo}); the best, "
                              f"{_key(b)}, sustains {b['capacity_qps']:.3g} requests/s{tied}: {need}."), None
    best, tie = _ties(table, at_load)
    table["tie"] = tie
    b = table.loc[best]
    cap = f"{b['capacity_qps']:.3g} requests/s [{b['capacity_lo_qps']:.3g}-{b['capacity_hi_qps']:.3g}]"
    room = f", {b['headroom']:.1f}x the offered {rate:.3g} requests/s" if rate is not None else ""
    if bool(tie.all()) and len(table) > 1:
        if comparison:
            return "all-tie", (f"The systems tie at their defaults (capacity {cap}{room}): KV reservation is not "
                               f"the bottleneck at this load; keep the server you run at its default."), \
                table.index[at_load][0]
        default = table.index[at_load & table["default"]]
        chosen = default[0] if len(default) else best
        return "all-tie", (f"Every setting ties (capacity {cap}{room}): KV reservation is not the bottleneck at "
                           f"this load; keep the server default."), chosen
    default = table.index[tie & table["default"]]
    if not comparison and len(default):
        d = table.loc[default[0]]
        how = "it is the best setting" if default[0] == best else f"it ties the best setting ({_key(b)})"
        limit = f"; the capacity is limited by {_limit(str(d['binding']))}" if _limit(str(d["binding"])) else ""
        return "keep-default", f"Keep the default of {d['system']}: {how}, capacity {cap}{room}{limit}.", default[0]
    decision = "recommend" if rate is not None else "no-rate"
    limit = f", limited by {_limit(str(b['binding']))}" if _limit(str(b["binding"])) else ""
    replicas = (f"; {int(b['replicas'])} replica(s) carry the load" if rate is not None and b["replicas"] > 1
                else "")
    others = int(tie.sum()) - 1
    tied = f" ({others} other setting(s) tie)" if others else ""
    return decision, f"Run {_key(b)}: capacity {cap}{room}{limit}{replicas}{tied}.", best


# ------------------------------------------------------------------------------ recommend
def recommend(trace: pd.DataFrame, *, model: str, gpu: str, system: str | None = None, slo: SLO | None = None,
              tp: int = 1, block_size: int = 16, max_new_tokens: int | None = None, num_requests: int | None = None,
              how: str = "window", rate_scale: float = 1.0, qps: float | None = None,
              num_windows: int = DEFAULT_NUM_WINDOWS, window_requests: int = DEFAULT_WINDOW_REQUESTS,
              percentiles: Sequence[float] = (50, 90, 95, 99), max_unserved_frac: float = 0.0, seed: int = 0,
              cost_model: Any = None, engine: str | None = None, rel_tol: float = 0.05, max_workers: int = 1,
              progress: bool = False, candidates: Sequence[Setting] | None = None,
              save_dir: str | None = None) -> Recommendation:
    """Which setting of the server you run meets the SLO at your real load, with how much capacity.

    Parameters
    ----------
    trace : DataFrame
        ``prompt_tokens``, ``output_tokens``, optional ``arrival_s`` (seconds) and ``censored``
        (``kvlab.traces.load``, ``kvlab.traces.from_prometheus`` or a profile sample).
    model, gpu : str
        Names in ``kvlab.specs``; ``model`` may be a spec with its precision
        (``kvlab.specs.with_precision``: FP8 / INT4 weights, FP8 KV).
    system : {"vllm", "sglang", "tgi", "tensorrt-llm", "reservation"}, optional
        Search that system's settings (:func:`kvlab.recommend.systems.settings`), its newest
        version family, or the family holding a version: ``"vllm==0.8"``; None compares the
        four systems at their defaults.
    slo : kvlab.capacity.SLO, optional
        Default :data:`DEFAULT_SLO` (P99 TBT <= 100 ms, median scheduling delay <= 2 s).
    tp : int
        Tensor-parallel GPUs per replica.
    block_size : int
        Tokens per KV page.
    max_new_tokens : int, optional
        Output cap (tokens); default the trace's detected cap, else its longest output; clamped
        to the model's context.
    num_requests, how, rate_scale, qps
        The load (:func:`kvlab.trace_window.trace_window`): None serves the whole trace at its
        own rate.
    num_windows, window_requests : int
        Capacity windows and requests per window (fewer when the trace is smaller).
    percentiles : sequence of float
        Output-length percentiles reported (and reserved by the ``reservation`` recipe).
    max_unserved_frac : float
        Share of requests a setting may reject or truncate and still be chosen, in [0, 1].
    seed : int
        Seed of a sample, of Poisson arrivals, and of window ``i``'s trials (``seed + i``).
    cost_model : {"measured", "roofline"}, cost model object or None
        Iteration-time model of every simulation (``kvlab.capacity.ServingConfig.cost_model``);
        None: measured where the GPU has measurements, else the roofline. The setup records
        which ran.
    engine : str, optional
        Simulator engine.
    rel_tol : float
        Capacity search resolution (:func:`kvlab.capacity.capacity`).
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

    served, fit = fit_to_context(trace, model=model, max_new_tokens=max_new_tokens)
    if num_requests is not None:
        num_requests = min(v.positive_int(num_requests, "num_requests"), len(served))
    load: TraceWindow = trace_window(served, num_requests, how=how, seed=seed, rate_scale=rate_scale, qps=qps)
    rate = load.rate_per_s
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
        candidates = (default_settings(model=model, gpu=gpu, tp=tp, max_model_len=fit.max_model_len)
                      if system is None else
                      settings(system, model=model, gpu=gpu, tp=tp, percentiles=pct, max_new_tokens=cap,
                               max_model_len=fit.max_model_len))
    for prof in {profile_of(c).key: profile_of(c) for c in candidates}.values():
        prof.check_block_size(block_size)  # a block size the release refuses is refused here, not printed
    comparison = system is None

    n_win = min(window_requests, len(served))
    starts = window_starts(len(served), n_win, num_windows)
    windows = [trace_window(served, n_win, start_row=s).requests[["prompt_tokens", "output_tokens"]] for s in starts]
    warnings = fit.warnings()
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

    configs = [serving_config(s, model=model, gpu=gpu, tp=tp, block_size=block_size, max_new_tokens=cap,
                              cost_model=cost_model, engine=engine) for s in candidates]
    if _model(model).weight_dtype != "bf16" and configs[0].cost_label().startswith("measured"):
        warnings.append(f"{_model(model).weight_dtype} weights: the measured cost model was fitted on BF16 GEMMs, so "
                        f"here the precision changes the weight and KV memory, not the GEMM time (--cost-model "
                        f"roofline prices FP8 GEMMs at the GPU's FP8 peak)")
    cap_kw = {"rel_tol": rel_tol, "qps_start": rate or 1.0}
    jobs: list[tuple[Callable, Any]] = []
    for c in configs:
        jobs += [(_capacity, (w, c, slo, {**cap_kw, "num_requests": len(w), "seed": seed + i}))
                 for i, w in enumerate(windows)]
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
                     "binding": binding, "kv_binds_at_qps": min(kv_at) if kv_at else float("nan"),
                     "max_tried_qps": max(q[4] for q in caps), "headroom": median / rate if rate else None,
                     "replicas": replicas,
                     "num_gpus": replicas * tp if replicas is not None else None,
                     "meets_slo_at_load": at["slo_at_load"] == "meets the SLO"
                     and at["unserved_frac"] <= max_unserved_frac + 1e-12, **at, "tie": False,
                     "recommended": False})
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    kv_knob = pd.Series([s.knob in profile_of(s).kv_knobs for s in candidates], index=table.index)
    decision, answer, chosen = _decide(table, rate=rate, max_unserved_frac=max_unserved_frac, comparison=comparison,
                                       slo=slo, tp=tp, kv_knob=kv_knob)
    if chosen is not None:
        table.loc[chosen, "recommended"] = True
    flags = _flags(table, candidates, chosen, comparison, model=model, fit=fit, block_size=block_size, tp=tp,
                   save_dir=save_dir)
    m = _model(model)
    prof = None if comparison else profile_of(candidates[0])
    setup = {"model": m.name, "hf_id": m.hf_id, "weights": m.weight_dtype, "kv_cache_dtype": m.kv_cache_dtype,
             "gpu": gpu, "tp": tp, "pp": 1, "system": system or "comparison",
             "version_family": prof.family if prof else "each system's newest family at its default",
             "server": prof.describe() if prof else {},
             "default_flags": " ".join(f"{k} {val}" for k, val in candidates[0].flags.items())
             if prof and candidates[0].is_default else "", "slo": str(slo),
             "slo_p99_tbt_s": slo.tbt_p99_s, "scheduling_delay_p50_s": slo.scheduling_delay_p50_s,
             "cost_model": configs[0].cost_label(),
             "scheduler": "/".join(sorted({c.scheduler for c in configs})), "block_size": block_size,
             "num_windows": len(starts), "window_requests": n_win, "window_starts": starts, "seed": seed,
             "capacity_rel_tol": rel_tol, "capacity_arrivals": "poisson",
             "trust": _trust(cost_model, gpu=gpu)}  # validated error on real servers (kvlab.validate.trust)
    load_record = {"source": trace.attrs.get("source", "table"), **load.as_dict(), "rate_scale": rate_scale,
                   "qps": qps}
    ties = [_key(r) for _, r in table[table["tie"]].iterrows()]
    return Recommendation(decision=decision, answer=answer, chosen=None if chosen is None else _key(table.loc[chosen]),
                          ties=ties, table=table, flags=flags, load=load_record, context=fit, percentiles=pct,
                          setup=setup, warnings=warnings, capacities=capacities,
                          elapsed_s=time.perf_counter() - start)


FLAG_COLUMNS = ("system", "setting", "version", "max_model_len", "command", "client", "notes", "files")


def _flags(table: pd.DataFrame, candidates: list[Setting], chosen: int | None, comparison: bool, *, model: Any,
           fit: ContextFit, block_size: int, tp: int, save_dir: str | None = None) -> pd.DataFrame:
    """Commands for the chosen setting, or for every system in a comparison (clamped to the context);
    the config files they name are written into ``save_dir`` when given."""
    picks = list(table.index) if comparison else ([chosen] if chosen is not None else
                                                  list(table.index[table["default"]]))
    rows = []
    for i in picks:
        s = candidates[i]
        run = launch(s, model=model, max_model_len=fit.max_model_len,
                     max_prompt_tokens=min(fit.max_prompt_tokens, fit.max_model_len - 1),
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


def render_text(rec: Recommendation) -> str:
    """The terminal report, every line at most :data:`WIDTH` columns."""
    ld, s = rec.load, rec.setup
    rate = ld["rate_per_s"]
    precision = "" if (s.get("weights"), s.get("kv_cache_dtype")) in ((None, None), ("bf16", "auto")) else \
        f" ({s['weights']} weights, {s['kv_cache_dtype']} KV)"
    lines = [*_wrap(f"{s['model']}{precision} on {s['tp']} x {s['gpu']}; {s['system']} ({s['version_family']}); "
                    f"SLO {s['slo']}"),
             *_wrap(f"cost model: {s['cost_model']}; {s['scheduler']} scheduler, block {s['block_size']}"),
             *_wrap(s.get("trust") or "real servers: not validated"),
             f"load: {ld['num_requests']:,} of {ld['trace_requests']:,} requests ({ld['how']}) over "
             f"{ld['duration_s']:,.0f} s at " + (f"{rate:.3g} requests/s" if rate else "no arrival times (offline)"),
             "output tokens: " + ", ".join(f"{k} {val:,}" for k, val in rec.percentiles.items())
             + f"; max_new_tokens {rec.context.max_new_tokens:,} ({rec.context.cap_source})",
             f"capacity: median [range] over {s['num_windows']} windows of {s['window_requests']:,} requests "
             f"(Poisson), requests/s", ""]
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
    lines += ["", *_wrap(f"answer: {rec.answer}")]
    if rec.decision == "overloaded":
        lines += _wrap(f"what to do: {rec.what_to_do}")
    for w in rec.warnings:
        lines += _wrap(f"warning: {w}")
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


def _wrap(text: str, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


__all__ = ["DECISIONS", "DEFAULT_NUM_WINDOWS", "DEFAULT_SLO", "DEFAULT_WINDOW_REQUESTS", "LATENCY_COLUMNS",
           "TABLE_COLUMNS", "ContextFit", "FLAG_COLUMNS", "Recommendation", "fit_to_context", "output_percentiles",
           "recommend", "render_text", "serving_config", "what_binds"]
