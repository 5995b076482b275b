"""Serving capacity under latency SLOs: the largest request rate a configuration sustains.

Sarathi-Serve's definition (OSDI 2024, section 5): capacity is the highest request rate (QPS)
at which the P99 time between tokens (TBT) stays within the SLO and the median scheduling delay
(arrival to admission) stays within 2 s. Each trial serves a fixed number of requests (2048 in
the paper) arriving as a Poisson process, and the rate is found by search.

The search (:func:`capacity`): a trial at ``qps_start``; doubling (or halving) until the SLO
flips, which brackets the capacity; then bisection of the bracket until it is narrower than
``rel_tol``. Trials use the same seed, so a trial at rate ``q`` sees the same lengths and the
same unit-rate arrivals scaled by ``1 / q`` (Poisson, Gamma or the trace's own, below): the
search is deterministic for a seed.
An SLO that a lone decode already misses, or that no rate down to ``qps_min`` meets, gives
capacity 0 with the reason, after a bounded number of trials.

The arrival process of a trial at rate ``q`` (``arrivals``; :mod:`kvlab.arrivals`):

``poisson``
    Sarathi-Serve's: exponential gaps of mean ``1 / q``.
``replay``
    The workload's own ``arrival_s``, time-compressed (or stretched) to offer ``q``
    (:func:`kvlab.arrivals.time_compressed`): its bursts, lulls and their order kept.
``gamma``
    A Gamma renewal process of rate ``q`` whose gaps have the coefficient of variation
    ``burst_cv``, by default the one measured on the workload's own gaps
    (:func:`kvlab.arrivals.gap_cv`): the trace's burstiness without its particular order.

A bursty trace (gap CV above 1) queues more at a given mean rate than Poisson arrivals, so its
capacity under ``replay`` or ``gamma`` is lower: the rate the server really sustains on it.

TBT here is every gap between two consecutive output tokens of a request, pooled over all
requests (Sarathi-Serve's per-token ``decode_token_execution_plus_preemption_time``), so a
prefill that stalls the decodes shows in the tail. It is the simulator's own ``tbt_p99_s``
(:func:`kvlab.sim.metrics.token_gaps_s` rebuilds the gaps from the per-iteration table).

Pipeline parallelism (``pp > 1``) follows :mod:`kvlab.costmodel.pipeline`: the system is ``pp`` engines
each serving ``1 / pp`` of the traffic with ``1 / pp`` of the KV pool and ``max_num_seqs`` per
micro-batch; a trial simulates one engine at ``qps / pp`` and reports the system's ``qps``.
With ``pipeline_bubbles`` (the default) a trial runs twice: once with equal micro-batches to
learn the stage times of the micro-batches in flight, then with each iteration's cycle set by
the slowest of them (:meth:`kvlab.costmodel.pipeline.PipelineCostModel.with_peers`).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import warnings
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from ._workers import worker_pool
from .arrivals import PROCESSES, gap_cv, time_compressed
from .costmodel import describe as _describe_cost, resolve as _resolve_cost
from .lengths import Profile, workload_sample
from .costmodel.pipeline import PipelineCostModel
from .prefix_blocks import HASH_IDS
from .reservation import pool_pages as _pool_pages
from .backend import backend_name, get_xp
from .sim import SimResult, finish, prepare, simulate
from .sim.batched import run_batched
from .sim.batched.choose import MODES as BATCH_MODES, choose
from .sim.config import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MAX_NUM_SEQS
from .trace_window import trace_window


_log = logging.getLogger(__name__)

#: A sustained queue still holds a few requests at any instant: fewer waiting than this never
#: counts as a growing queue (so trials of a few dozen requests are judged by the SLO alone).
MIN_BACKLOG_REQUESTS = 8


class CapacityWindowWarning(UserWarning):
    """A capacity found with short trials fails when twice as many requests are served."""


#: Columns of the trials table, in order.
TRIAL_COLUMNS = ("trial", "qps", "passed", "reason", "tbt_p99_s", "scheduling_delay_p50_s", "backlog_frac",
                 "backlog_requests", "ttft_p50_s",
                 "ttft_p99_s", "e2e_p50_s", "normalized_latency_s_per_token", "tokens_per_s", "num_aborted",
                 "num_preempted_requests", "num_tbt_max_only_requests", "mean_batch_size", "makespan_s")


#: Gap CV a Gamma renewal takes for evenly spaced arrivals (a constant-rate benchmark stage has CV 0,
#: which no Gamma distribution has): shape 10,000, gaps within about 1% of their mean.
MIN_GAP_CV = 0.01

@dataclass(frozen=True, kw_only=True)
class SLO:
    """A service-level objective: the bounds a rate must meet (``None``: not bounded).

    The default is Sarathi-Serve's (P99 TBT plus a 2 s median scheduling delay); the vLLM
    paper's capacity bounds normalized latency instead,
    ``SLO(normalized_latency_s_per_token=x, scheduling_delay_p50_s=None)``.

    Attributes
    ----------
    tbt_p99_s : float or None
        Largest allowed 99th percentile of the time between tokens (seconds, > 0).
    scheduling_delay_p50_s : float or None
        Largest allowed median delay from arrival to admission (seconds, > 0; the paper's 2 s).
    normalized_latency_s_per_token : float or None
        Largest allowed mean over requests of end-to-end latency / output tokens (seconds).
    ttft_p99_s : float or None
        Largest allowed 99th percentile of the time to first token (seconds, > 0); None (the
        default) leaves TTFT unbounded, as Sarathi-Serve's SLO does.
    """

    tbt_p99_s: float | None = None
    scheduling_delay_p50_s: float | None = 2.0
    normalized_latency_s_per_token: float | None = None
    ttft_p99_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("tbt_p99_s", "scheduling_delay_p50_s", "normalized_latency_s_per_token", "ttft_p99_s"):
            if getattr(self, name) is not None:
                v.positive_float(getattr(self, name), f"slo.{name}")
        if self.tbt_p99_s is None and self.normalized_latency_s_per_token is None:
            raise ValueError("slo needs a latency bound: tbt_p99_s or normalized_latency_s_per_token")

    def __str__(self) -> str:
        parts = [f"P99 TBT <= {self.tbt_p99_s:g} s" if self.tbt_p99_s is not None else "",
                 f"normalized latency <= {self.normalized_latency_s_per_token:g} s/token"
                 if self.normalized_latency_s_per_token is not None else "",
                 f"median delay <= {self.scheduling_delay_p50_s:g} s" if self.scheduling_delay_p50_s is not None else "",
                 f"P99 TTFT <= {self.ttft_p99_s:g} s" if self.ttft_p99_s is not None else ""]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """What is served and how: model, GPUs, scheduler, limits, reservation policy.

    Attributes
    ----------
    model, gpu : str
        Names in :mod:`kvlab.specs`.
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages (``tp x pp`` GPUs).
    scheduler : {"chunked", "prefill_first", "prefill_first_chunked", "mixed_whole", "chunked_alternating"}
        Sarathi-Serve's stall-free chunked prefill, vLLM V0's prefill-first, SGLang's chunked prefills
        that stall decodes, TensorRT-LLM's whole prefills beside the decodes, or TGI's chunked prefill
        admitting in alternate iterations (:func:`kvlab.simulate`).
    max_num_batched_tokens : int, optional
        Token budget per iteration (tokens); the simulator's default when None.
    max_num_seqs : int
        Requests running at most (per micro-batch under PP).
    policy : str
        Reservation policy (``kvlab.policy_names()``), with ``policy_params``.
    max_new_tokens : int
        The server's output cap (tokens).
    block_size : int
        Tokens per KV page.
    pool_pages : int, optional
        KV pages per GPU for the whole system; default ``kvlab.pool_pages(model, gpu, tp, pp)``.
    preemption_mode : {"recompute", "swap", "reject"}
        What a preempted request goes through.
    cost_model : {"measured", "roofline"}, cost model object or None
        The iteration-time model (:func:`kvlab.costmodel.resolve` with this TP and PP): ``None``
        is the measured model where the GPU has measurements, else the roofline; an object
        (``iteration_s`` is all that is called) is used as is.
    kernels : str, optional
        The measured model's kernel era (:func:`kvlab.costmodel.cost_model`; a published set-up's, :mod:`kvlab.presets`).
    split_attention : bool
        The server runs a mixed batch's prefill and decode attention as separate kernels
        (:func:`kvlab.costmodel.cost_model`; a server profile's, :mod:`kvlab.recommend.servers`).
    engine : str, optional
        Simulator engine; the simulator's default when None.
    stage_link : {"in-node", "internode"}
        Link between pipeline stages (:func:`kvlab.costmodel.pipeline.pipeline_cost`): the GPU
        interconnect, or the node's network when the stages span nodes.
    pipeline_bubbles : bool
        Under PP, price the bubbles of uneven micro-batches (see the module note); False keeps
        every micro-batch's cycle at ``pp x`` its own stage time.
    max_model_len : int, optional
        The served context (tokens, prompt + output); the model's ``max_context_tokens`` when
        None. Longer prompts are rejected and outputs cut at it (:mod:`kvlab.sim.context`).
    cpu_pool_pages : int, optional
        Host pages a swapped or offloaded request may go to (``kvlab.simulate``'s
        ``cpu_pool_pages``); None: the simulator's default 4 GiB.
    prefix_caching : bool
        Simulate the server's prefix cache (``kvlab.simulate``'s ``prefix_caching``: block
        identities from the workload's ``hash_ids``; recompute preemption only).
    async_scheduling : bool
        Schedule each iteration while the previous one runs (``kvlab.simulate``'s; vLLM V1's default).
    """

    model: str
    gpu: str
    tp: int = 1
    pp: int = 1
    scheduler: str = "chunked"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    policy: str = "vllm"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    block_size: int = 16
    pool_pages: int | None = None
    preemption_mode: str = "recompute"
    cost_model: Any = None
    kernels: str | None = None
    split_attention: bool = False
    engine: str | None = None
    stage_link: str = "in-node"
    pipeline_bubbles: bool = True
    max_model_len: int | None = None
    cpu_pool_pages: int | None = None
    prefix_caching: bool = False
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        v.positive_int(self.tp, "config.tp")
        v.positive_int(self.pp, "config.pp")
        self.engine_pool_pages()  # a model that does not fit the GPU says so here, not "unreachable" later

    def cost(self) -> Any:
        """The cost model the trials run with."""
        return _resolve_cost(self.cost_model, self.model, self.gpu, tp=self.tp, pp=self.pp, link=self.stage_link,
                             kernels=self.kernels, split_attention=self.split_attention)

    def cost_label(self) -> str:
        """The readable name of :meth:`cost` (recorded with every capacity result)."""
        return _describe_cost(self.cost())

    def engine_pool_pages(self) -> int:
        """KV pages of one of the ``pp`` engines (the whole pool when ``pp = 1``)."""
        pool = (_pool_pages(self.model, self.gpu, block_size=self.block_size, tp=self.tp, pp=self.pp)
                if self.pool_pages is None else v.positive_int(self.pool_pages, "config.pool_pages"))
        if pool < self.pp:
            raise ValueError(f"config.pool_pages ({pool}) must give each of the pp={self.pp} engines a page")
        return pool // self.pp


@dataclass(frozen=True, kw_only=True)
class CapacityResult:
    """What :func:`capacity` found.

    Attributes
    ----------
    capacity_qps : float
        Largest rate found that meets the SLO (requests/s); 0 when none does.
    reason : str
        Why the search stopped (converged, SLO unreachable and why, limits hit).
    trials : DataFrame
        One row per trial, in the order run (columns :data:`TRIAL_COLUMNS`).
    slo : SLO
    config : ServingConfig
    num_requests : int
    seed : int
    arrivals : {"poisson", "replay", "gamma"}
        The arrival process the trials scaled (see the module note).
    burst_cv : float or None
        The gap CV of ``gamma`` arrivals (None for the others).
    window_verdict : str
        What serving twice as many requests at the capacity found said (``capacity``'s
        ``window_check``): "steady: ...", "too short: ..." or "not checked: ..."; empty when not run.
    run_by : str
        How the trials ran: "per process", or what :func:`capacities`' batched rounds did.
    """

    capacity_qps: float
    reason: str
    trials: pd.DataFrame
    slo: SLO
    config: ServingConfig
    num_requests: int
    seed: int
    arrivals: str = "poisson"
    burst_cv: float | None = None
    window_verdict: str = ""
    run_by: str = "per process"

    def binding(self) -> str:
        """Why the lowest failing rate above the capacity failed (which SLO binds); the reason if none."""
        failed = self.trials[~self.trials["passed"].astype(bool) & (self.trials["qps"] > self.capacity_qps)]
        return str(failed.sort_values("qps")["reason"].iloc[0]) if len(failed) else self.reason

    def __str__(self) -> str:
        c = self.config
        return (f"CapacityResult({c.model} on {c.tp * c.pp} x {c.gpu} (TP{c.tp}-PP{c.pp}), {c.scheduler}, "
                f"policy {c.policy}, {self.slo}, cost model {c.cost_label()}): {self.capacity_qps:.3f} requests/s after "
                f"{len(self.trials)} trials of {self.num_requests} requests; {self.reason}")


# ---------------------------------------------------------------------------------- metrics
def slo_metrics(result: SimResult, *, warmup_frac: float = 0.0) -> dict[str, float]:
    """The SLO figures of one run and its context (seconds, counts).

    ``tbt_p99_s`` over every gap between tokens (the simulator's summary,
    :func:`kvlab.sim.metrics.token_gaps_s`); ``scheduling_delay_p50_s`` the median over the
    requests after the first ``warmup_frac`` of arrivals (they meet an empty server) of admission
    minus arrival (infinite for a request never admitted); ``backlog_frac`` the share of requests
    still waiting (not yet admitted) when the last one arrived: bounded when the rate is sustained,
    near ``1 - served rate / offered rate`` when the queue grows, whatever the number of requests;
    ``num_aborted`` the requests the server gave up on (prompts refused for the model's context are
    not counted: no rate serves them, :mod:`kvlab.sim.context`).
    """
    rq, s = result.requests, result.summary
    arrival = rq["arrival_s"].to_numpy(dtype=np.float64)
    admitted = rq["admitted_s"].to_numpy(dtype=np.float64)
    delay = np.where(np.isnan(admitted), np.inf, admitted - arrival)
    order = np.argsort(arrival, kind="stable")
    steady = order[int(math.floor(v.fraction(warmup_frac, "warmup_frac", low_open=False, high_closed=False)
                                  * len(order))):]
    last_s = float(arrival.max()) if len(arrival) else 0.0
    waiting = int(np.sum(~(admitted <= last_s)))
    return {"tbt_p99_s": s["tbt_p99_s"] if np.isfinite(s["tbt_p99_s"]) else 0.0,
            "scheduling_delay_p50_s": float(np.median(delay[steady])) if len(steady) else 0.0,
            "backlog_frac": waiting / len(arrival) if len(arrival) else 0.0, "backlog_requests": waiting,
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"], "e2e_p50_s": s["e2e_p50_s"],
            "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
            "tokens_per_s": s["tokens_per_s"], "num_aborted": int(s["num_aborted"] - s["num_rejected_context"]),
            "num_preempted_requests": int((rq["num_preemptions"] > 0).sum()),
            "num_tbt_max_only_requests": int(s["num_tbt_max_only_requests"]), "mean_batch_size": s["mean_batch_size"],
            "makespan_s": s["makespan_s"]}


# ---------------------------------------------------------------------------------- one trial
def trial_requests(workload: pd.DataFrame | str | Path | Profile, num_requests: int, seed: int = 0, *,
                   keep_arrivals: bool = False) -> pd.DataFrame:
    """The ``num_requests`` requests every trial of a search serves (``prompt_tokens``, ``output_tokens``).

    ``workload`` as in :func:`capacity`: a table or trace file gives its first ``num_requests``
    rows (:func:`kvlab.trace_window.trace_window`; a Poisson trial replaces their arrival times),
    a profile a seeded sample. ``keep_arrivals`` keeps the rows' ``arrival_s`` (for ``replay`` and
    ``gamma`` trials, which scale the trace's own arrival process); a profile has none.
    """
    num_requests = v.positive_int(num_requests, "num_requests")
    if keep_arrivals and not isinstance(workload, pd.DataFrame):
        raise ValueError("the trace's own arrival process (arrivals='replay' or 'gamma') needs a workload table "
                         "with arrival_s, not a profile or a file name; or use arrivals='poisson'")
    if isinstance(workload, (str, Path)):
        workload = workload_sample(workload, num_requests, seed=seed)[0]
    if isinstance(workload, Profile):
        return workload.sample(num_requests, seed=seed)[["prompt_tokens", "output_tokens"]]
    if not isinstance(workload, pd.DataFrame):
        raise ValueError(f"workload must be a DataFrame, a Profile, a profile name or a trace path, "
                         f"got {type(workload).__name__}")
    v.require_columns(workload, ("prompt_tokens", "output_tokens"), "workload")
    if len(workload) < num_requests:
        raise ValueError(f"workload has {len(workload)} requests, fewer than num_requests={num_requests}")
    if keep_arrivals and "arrival_s" not in workload.columns:
        raise ValueError("the trace's own arrival process (arrivals='replay' or 'gamma') needs an arrival_s column "
                         "in the workload; a trace without times can only be searched under arrivals='poisson'")
    cols = (["prompt_tokens", "output_tokens"] + (["arrival_s"] if keep_arrivals else [])
            + ([HASH_IDS] if HASH_IDS in workload.columns else []))
    return trace_window(workload, num_requests).requests[cols]


def serve(workload: pd.DataFrame, config: ServingConfig, qps: float | None, *, seed: int = 0,
          record_iterations: bool = False, arrivals: str = "poisson", burst_cv: float | None = None) -> SimResult:
    """Serve ``workload`` (prompt/output tokens) at rate ``qps`` under ``config``.

    ``arrivals`` is the process scaled to ``qps`` (see the module note): ``poisson``, ``replay``
    (the workload's own ``arrival_s`` time-compressed) or ``gamma`` (gaps with CV ``burst_cv``).
    ``qps=None`` serves it at its own ``arrival_s`` (offline when it has none; ``pp = 1`` only).
    Under PP this runs one of the ``pp`` engines at ``qps / pp`` (see the module note), twice
    when ``config.pipeline_bubbles``: the second run's cycles include the bubbles estimated from
    the first run's stage times. ``record_iterations`` keeps the per-iteration table (for
    :func:`kvlab.sim.metrics.token_gaps_s`).
    """
    workload, kw = _serve_args(workload, config, qps, seed=seed, arrivals=arrivals, burst_cv=burst_cv)
    cost = config.cost()

    def run(cost_model: Any, record: bool) -> SimResult:
        return simulate(workload, config.policy, **kw, record_iterations=record, cost_model=cost_model)

    if not (config.pipeline_bubbles and isinstance(cost, PipelineCostModel) and cost.peer_stage_s is None):
        return run(cost, record_iterations)
    return run(with_bubbles(cost, run(cost, True)), record_iterations)


def _serve_args(workload: pd.DataFrame, config: ServingConfig, qps: float | None, *, seed: int, arrivals: str,
                burst_cv: float | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The workload (arrivals scaled) and :func:`kvlab.simulate`'s keywords (but the policy, the cost model
    and ``record_iterations``) of :func:`serve`."""
    if qps is None:
        if config.pp != 1:
            raise ValueError("serving a workload at its own arrival times needs pp = 1 (give qps under PP)")
        arrivals: dict[str, Any] = {"arrivals": "auto"}
    else:
        per_engine = v.positive_float(qps, "qps") / config.pp
        kind = v.choice(arrivals, "arrivals", PROCESSES)
        if kind == "replay":
            if "arrival_s" not in workload.columns:
                raise ValueError("arrivals='replay' needs an arrival_s column in the workload")
            workload = workload.assign(arrival_s=time_compressed(workload["arrival_s"].to_numpy(), per_engine))
            arrivals = {"arrivals": "trace"}
        elif kind == "gamma":
            if burst_cv is None:
                raise ValueError("arrivals='gamma' needs burst_cv (the gaps' coefficient of variation)")
            arrivals = {"arrivals": "gamma", "qps": per_engine, "burst_cv": v.positive_float(burst_cv, "burst_cv")}
        else:
            arrivals = {"arrivals": "poisson", "qps": per_engine}
        if kind != "replay" and "arrival_s" in workload.columns:
            workload = workload.drop(columns="arrival_s")
    extra: dict[str, Any] = dict(config.policy_params)
    if config.engine is not None:
        extra["engine"] = config.engine
    return workload, dict(model=config.model, gpu=config.gpu, max_new_tokens=config.max_new_tokens,
                          block_size=config.block_size, pool_pages=config.engine_pool_pages(), tp=config.tp,
                          scheduler=config.scheduler, max_num_seqs=config.max_num_seqs,
                          max_num_batched_tokens=config.max_num_batched_tokens,
                          preemption_mode=config.preemption_mode, seed=seed, **arrivals,
                          max_model_len=config.max_model_len, cpu_pool_pages=config.cpu_pool_pages,
                          prefix_caching=config.prefix_caching, async_scheduling=config.async_scheduling, **extra)


def with_bubbles(cost: PipelineCostModel, first: SimResult) -> PipelineCostModel:
    """``cost`` with its peers' stage times taken from ``first``, a run under ``cost`` without peers.

    Each iteration of ``first`` lasted ``pp x`` its stage time; the time the engine sat idle
    (no work between arrivals) counts as rounds of empty micro-batches, one per mean cycle.
    """
    it = first.iterations
    if it is None or not len(it):
        raise ValueError("the first run must record its iterations (record_iterations=True) and have some")
    dur = it["duration_s"].to_numpy(dtype=np.float64)
    span_s = float((it["start_s"] + it["duration_s"]).max() - first.requests["arrival_s"].min())
    idle_rounds = max(span_s - float(dur.sum()), 0.0) / float(dur.mean()) if dur.mean() > 0 else 0.0
    return cost.with_peers(dur / cost.pp, idle_rounds=idle_rounds)


def slo_verdict(result: SimResult, slo: SLO) -> str:
    """``"meets the SLO"``, or every way one run misses ``slo`` (joined by ``"; "``)."""
    return _verdict(slo_metrics(result), slo)


def _verdict(m: Mapping[str, float], slo: SLO, max_backlog_frac: float | None = None) -> str:
    why = []
    if max_backlog_frac is not None and m["backlog_frac"] > max_backlog_frac \
            and m["backlog_requests"] > MIN_BACKLOG_REQUESTS:
        why.append(f"not sustained: {m['backlog_frac']:.1%} of the requests still wait when the last arrives "
                   f"(> {max_backlog_frac:.1%}: the queue grows)")
    if m["num_aborted"]:
        why.append(f"{m['num_aborted']} requests aborted")
    if slo.tbt_p99_s is not None and m["tbt_p99_s"] > slo.tbt_p99_s:
        why.append(f"P99 TBT {m['tbt_p99_s']:.4g} s > {slo.tbt_p99_s:g} s")
    if slo.normalized_latency_s_per_token is not None \
            and m["normalized_latency_s_per_token"] > slo.normalized_latency_s_per_token:
        why.append(f"normalized latency {m['normalized_latency_s_per_token']:.4g} s/token > "
                   f"{slo.normalized_latency_s_per_token:g} s/token")
    if slo.scheduling_delay_p50_s is not None and m["scheduling_delay_p50_s"] > slo.scheduling_delay_p50_s:
        why.append(f"median scheduling delay {m['scheduling_delay_p50_s']:.4g} s > {slo.scheduling_delay_p50_s:g} s")
    if slo.ttft_p99_s is not None and not m["ttft_p99_s"] <= slo.ttft_p99_s:  # NaN (no first token) misses
        why.append(f"P99 TTFT {m['ttft_p99_s']:.4g} s > {slo.ttft_p99_s:g} s")
    return "; ".join(why) or "meets the SLO"


def _trial(args: tuple[pd.DataFrame, ServingConfig, SLO, float, int, float, float | None, str, float | None]
           ) -> dict[str, Any]:
    workload, config, slo, qps, seed, warmup_frac, max_backlog_frac, arrivals, burst_cv = args
    return _trial_row(qps, serve(workload, config, qps, seed=seed, arrivals=arrivals, burst_cv=burst_cv), slo,
                      warmup_frac, max_backlog_frac)


def _trial_row(qps: float, result: SimResult, slo: SLO, warmup_frac: float, max_backlog_frac: float | None
               ) -> dict[str, Any]:
    """One trial's row of the trials table: the rate, the verdict and its figures."""
    m = slo_metrics(result, warmup_frac=warmup_frac)
    reason = _verdict(m, slo, max_backlog_frac)
    return {"qps": qps, "passed": reason == "meets the SLO", "reason": reason, **m}


# ---------------------------------------------------------------------------------- the search
def lone_decode_s(workload: pd.DataFrame, config: ServingConfig) -> float:
    """The shortest gap any token can have: one decode of the shortest prompt alone (seconds).

    Every gap spans at least one iteration that decodes the request, and the cost model grows
    with work, so no P99 TBT can be below this; an SLO under it is unreachable.
    """
    ctx = int(workload["prompt_tokens"].min()) + 1
    return float(config.cost().iteration_s(1, ctx, ctx))


def capacity(workload: pd.DataFrame | str | Path | Profile, config: ServingConfig, slo: SLO, *,
             num_requests: int = 2048, seed: int = 0, qps_start: float = 1.0, qps_min: float = 1e-3,
             qps_max: float = 1e4, rel_tol: float = 0.05, max_trials: int = 40, warmup_frac: float = 0.1,
             max_backlog_frac: float | None = 0.025, window_check: bool = True, arrivals: str = "poisson",
             burst_cv: float | None = None) -> CapacityResult:
    """Largest rate at which ``config`` meets ``slo`` (requests/s), with the trials run.

    Parameters
    ----------
    workload : DataFrame, Profile, str or Path
        Requests (``prompt_tokens``, ``output_tokens``, and ``arrival_s`` for ``replay`` and
        ``gamma``; the first ``num_requests`` rows are served), a length profile or its name
        (:func:`kvlab.lengths.list_profiles`, sampled with ``seed``), or a trace file
        (:func:`kvlab.traces.load`); the last two only under Poisson arrivals.
    config : ServingConfig
    slo : SLO
    num_requests : int
        Requests per trial (2048 in Sarathi-Serve).
    seed : int
        Seed of the workload sample and of the arrivals (the same for every trial).
    qps_start : float
        First rate tried (requests/s).
    qps_min, qps_max : float
        The search gives up below ``qps_min`` (capacity 0) and above ``qps_max`` (capacity
        ``qps_max``, reported as not bracketed).
    rel_tol : float
        Stop when the bracket ``[pass, fail]`` satisfies ``fail / pass - 1 <= rel_tol``.
    max_trials : int
        At most this many trials (the result says when it stopped for that reason).
    warmup_frac : float
        Share of a trial's first arrivals left out of the median scheduling delay: they meet an
        empty server, not the steady state the SLO is about (0 keeps every request, as
        Sarathi-Serve's trials do).
    max_backlog_frac : float or None
        A rate is sustained only when at most this share of a trial's requests (and more than
        :data:`MIN_BACKLOG_REQUESTS`) still waits when the last one arrives. A growing queue leaves about ``1 - served / offered`` of them
        waiting whatever the trial's length, so this check does not depend on ``num_requests``,
        while a median delay over a short trial hides an overload the queue has not yet shown.
        ``None``: no check (the SLO terms alone).
    window_check : bool
        After the search, serve twice ``num_requests`` at the capacity found (when the workload
        has them): if that fails, the trials were too short to reach steady state and a
        :class:`CapacityWindowWarning` names the size needed; ``window_verdict`` of the result
        says what the check found.
    arrivals : {"poisson", "replay", "gamma"}
        The arrival process scaled to each trial's rate (see the module note).
    burst_cv : float, optional
        Gap CV of ``gamma`` arrivals; default the one measured on the workload's ``arrival_s``
        (:func:`kvlab.arrivals.gap_cv`). Only with ``gamma``.

    Returns
    -------
    CapacityResult

    Raises
    ------
    ValueError
        Non-positive SLO, request count or rates; ``qps_min >= qps_max``; a bad workload.

    Notes
    -----
    A search is sequential (each rate depends on the last verdict); run several searches at
    once with :func:`capacities`, which costs no extra trial (in processes, or in rounds whose
    trials run as one batch of :mod:`kvlab.sim.batched`). Trying k rates per round
    (k-section) was tried and dropped: with k = 4 it ran 13 trials where bisection ran 7
    (bench/bench_capacity.py), so it pays only with k idle cores per search.
    """
    plan = _plan(workload, config, slo, num_requests=num_requests, seed=seed, qps_start=qps_start, qps_min=qps_min,
                 qps_max=qps_max, rel_tol=rel_tol, max_trials=max_trials, warmup_frac=warmup_frac,
                 max_backlog_frac=max_backlog_frac, arrivals=arrivals, burst_cv=burst_cv)
    if plan.unreachable:
        return plan.result([], 0.0, plan.unreachable)
    rows: list[dict[str, Any]] = []
    search = plan.search()
    try:
        qps = next(search)
        while True:
            rows.append(_trial(plan.trial_args(qps)))
            qps = search.send(rows[-1])
    except StopIteration as stop:
        found = plan.result(rows, *stop.value)
    if not window_check or not found.reason.startswith("converged"):
        return found
    return plan.window_checked(found)


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """One capacity search's checked inputs, its trial requests, and the search itself (:meth:`search`)."""

    workload: Any
    work: pd.DataFrame
    config: ServingConfig
    slo: SLO
    num_requests: int
    seed: int
    qps_start: float
    qps_min: float
    qps_max: float
    rel_tol: float
    max_trials: int
    warmup_frac: float
    max_backlog_frac: float | None
    arrivals: str
    burst_cv: float | None
    unreachable: str

    def trial_args(self, qps: float) -> tuple:
        """:func:`_trial`'s argument for a trial at ``qps``."""
        return (self.work, self.config, self.slo, qps, self.seed, self.warmup_frac, self.max_backlog_frac,
                self.arrivals, self.burst_cv)

    def result(self, rows: list[dict[str, Any]], capacity_qps: float, reason: str) -> CapacityResult:
        trials = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS[1:]))
        trials.insert(0, "trial", np.arange(len(trials)))
        return CapacityResult(capacity_qps=capacity_qps, reason=reason, trials=trials, slo=self.slo,
                              config=self.config, num_requests=self.num_requests, seed=self.seed,
                              arrivals=self.arrivals, burst_cv=self.burst_cv)

    def window_checked(self, found: CapacityResult) -> CapacityResult:
        return dataclasses.replace(found, window_verdict=_window_check(
            self.workload, self.config, self.slo, found.capacity_qps, self.num_requests, self.seed,
            self.warmup_frac, self.max_backlog_frac, self.arrivals, self.burst_cv))

    def search(self) -> Generator[float, dict[str, Any], tuple[float, str]]:
        """The search: yields each rate to try, is sent that trial's row, returns (capacity, reason)."""
        qps_min, qps_max, max_trials = self.qps_min, self.qps_max, self.max_trials
        last = yield self.qps_start
        n = 1
        # Bracket: double up from a pass, halve down from a failure.
        lo, hi = (self.qps_start, math.inf) if last["passed"] else (0.0, self.qps_start)
        while hi == math.inf:
            if lo >= qps_max:
                return lo, f"not bracketed: still meets the SLO at qps_max = {qps_max:g} requests/s"
            if n >= max_trials:
                return lo, f"stopped after max_trials = {max_trials} trials before a rate failed"
            q = min(2.0 * lo, qps_max)
            last = yield q
            n += 1
            lo, hi = (q, hi) if last["passed"] else (lo, q)
        while lo == 0.0:
            if hi <= qps_min:
                return 0.0, (f"unreachable: fails at the lowest rate tried, {hi:.4g} requests/s "
                             f"({last['reason']})")
            if n >= max_trials:
                return 0.0, f"stopped after max_trials = {max_trials} trials before a rate passed"
            q = max(hi / 2.0, qps_min)
            last = yield q
            n += 1
            lo, hi = (q, hi) if last["passed"] else (lo, q)
        # Bisect the bracket [lo (passes), hi (fails)].
        while hi / lo - 1.0 > self.rel_tol:
            if n >= max_trials:
                return lo, (f"stopped after max_trials = {max_trials} trials; bracket "
                            f"[{lo:.4g}, {hi:.4g}] requests/s")
            q = 0.5 * (lo + hi)
            last = yield q
            n += 1
            lo, hi = (q, hi) if last["passed"] else (lo, q)
        return lo, (f"converged: meets the SLO at {lo:.4g} requests/s, fails at {hi:.4g} "
                    f"(within rel_tol = {self.rel_tol:g})")


def _plan(workload: Any, config: ServingConfig, slo: SLO, *, num_requests: int, seed: int, qps_start: float,
          qps_min: float, qps_max: float, rel_tol: float, max_trials: int, warmup_frac: float,
          max_backlog_frac: float | None, arrivals: str, burst_cv: float | None) -> _Plan:
    """:func:`capacity`'s arguments checked, its trial requests drawn, and whether the SLO is reachable at all."""
    if not isinstance(slo, SLO):
        raise ValueError(f"slo must be a kvlab.capacity.SLO, got {type(slo).__name__}")
    if not isinstance(config, ServingConfig):
        raise ValueError(f"config must be a kvlab.capacity.ServingConfig, got {type(config).__name__}")
    num_requests = v.positive_int(num_requests, "num_requests")
    qps_min, qps_max = v.positive_float(qps_min, "qps_min"), v.positive_float(qps_max, "qps_max")
    if qps_min >= qps_max:
        raise ValueError(f"qps_min ({qps_min}) must be below qps_max ({qps_max})")
    qps_start = min(max(v.positive_float(qps_start, "qps_start"), qps_min), qps_max)
    rel_tol = v.positive_float(rel_tol, "rel_tol")
    max_trials = v.positive_int(max_trials, "max_trials")
    arrivals = v.choice(arrivals, "arrivals", PROCESSES)
    if burst_cv is not None and arrivals != "gamma":
        raise ValueError(f"burst_cv is used only with arrivals='gamma', not {arrivals!r}")
    work = trial_requests(workload, num_requests, seed, keep_arrivals=arrivals != "poisson")
    if arrivals == "gamma":
        burst_cv = (max(gap_cv(work["arrival_s"].to_numpy()), MIN_GAP_CV) if burst_cv is None
                    else v.positive_float(burst_cv, "burst_cv"))
    floor_s = lone_decode_s(work, config)
    unreachable = ""
    if slo.tbt_p99_s is not None and floor_s > slo.tbt_p99_s:
        unreachable = (f"unreachable: one decode of the shortest prompt alone takes {floor_s:.4g} s, "
                       f"more than the P99 TBT SLO of {slo.tbt_p99_s:g} s, at any rate")
    return _Plan(workload=workload, work=work, config=config, slo=slo, num_requests=num_requests, seed=seed,
                 qps_start=qps_start, qps_min=qps_min, qps_max=qps_max, rel_tol=rel_tol, max_trials=max_trials,
                 warmup_frac=warmup_frac, max_backlog_frac=max_backlog_frac, arrivals=arrivals, burst_cv=burst_cv,
                 unreachable=unreachable)


def _window_check(workload: Any, config: ServingConfig, slo: SLO, qps: float, num_requests: int, seed: int,
                  warmup_frac: float, max_backlog_frac: float | None, arrivals: str = "poisson",
                  burst_cv: float | None = None) -> str:
    """Serve ``2 x num_requests`` at ``qps`` (the same arrival process): what that says of the trials'
    length (warns when it fails)."""
    longer = 2 * num_requests
    try:
        work = trial_requests(workload, longer, seed, keep_arrivals=arrivals != "poisson")
    except ValueError:
        return f"not checked: the workload has fewer than {longer:,} requests"
    row = _trial((work, config, slo, qps, seed, warmup_frac, max_backlog_frac, arrivals, burst_cv))
    if row["passed"]:
        return f"steady: {longer:,} requests at {qps:.4g} requests/s also meet the SLO"
    warnings.warn(f"the capacity found with {num_requests:,}-request trials ({qps:.4g} requests/s) fails with "
                  f"{longer:,} requests ({row['reason']}): the trials are too short to reach steady state; "
                  f"use num_requests >= {longer:,}", CapacityWindowWarning, stacklevel=3)
    return f"too short: {longer:,} requests at {qps:.4g} requests/s fail ({row['reason']})"


def _capacity_job(args: tuple[Any, ServingConfig, SLO, dict[str, Any]]) -> CapacityResult:
    workload, config, slo, kw = args
    return capacity(workload, config, slo, **kw)


def capacities(workload: pd.DataFrame | str | Path | Profile, cases: Mapping[Any, tuple[ServingConfig, SLO]], *,
               max_workers: int = 1, batch: str = "auto", **capacity_kw: Any) -> dict[str, CapacityResult]:
    """:func:`capacity` of several (config, SLO) cases on one workload, searches run in parallel.

    Parameters
    ----------
    cases : mapping
        Label -> (config, slo).
    max_workers : int
        Processes; each runs whole searches (the results do not depend on it).
    batch : {"auto", "always", "never"}
        Whether the searches advance in rounds, each round's trials (one per unfinished search)
        run together by the batched engine (:mod:`kvlab.sim.batched`) where they are within its
        scope: ``always``; ``auto`` and ``never`` run each search per process, the chooser
        (:func:`kvlab.sim.batched.choose.choose`) having no device where batching was measured faster.
        The results do not depend on it; each result's ``run_by`` says what ran, and the
        choice is logged (logger ``kvlab.capacity``).
    **capacity_kw
        Passed to every :func:`capacity` call (``num_requests``, ``seed``, ``rel_tol``, ...).
    """
    max_workers = v.positive_int(max_workers, "max_workers")
    v.choice(batch, "batch", BATCH_MODES)
    jobs = [(workload, cfg, slo, capacity_kw) for cfg, slo in cases.values()]
    xp = get_xp()
    if batch == "always":
        return dict(zip(cases, _in_rounds(workload, list(cases.values()), capacity_kw, batch, xp)))
    _log.info("capacities: %d searches per process (batch=%r on %s)", len(jobs), batch, backend_name(xp))
    if max_workers == 1 or len(jobs) == 1:
        found = [_capacity_job(j) for j in jobs]
    else:
        with worker_pool(min(max_workers, len(jobs))) as pool:
            found = list(pool.map(_capacity_job, jobs))
    return dict(zip(cases, found))


def _in_rounds(workload: Any, cases: list[tuple[ServingConfig, SLO]], capacity_kw: Mapping[str, Any], batch: str,
               xp: Any) -> list[CapacityResult]:
    """The searches of ``cases`` in lockstep rounds: every unfinished search's next trial, one batch per round."""
    plans, window_check = [], True
    for cfg, slo in cases:
        args = inspect.signature(capacity).bind(workload, cfg, slo, **capacity_kw)
        args.apply_defaults()
        kw = dict(args.arguments)
        window_check = kw.pop("window_check")
        for name in ("workload", "config", "slo"):
            kw.pop(name)
        plans.append(_plan(workload, cfg, slo, **kw))
    found: list[CapacityResult | None] = [p.result([], 0.0, p.unreachable) if p.unreachable else None for p in plans]
    searches = {i: p.search() for i, p in enumerate(plans) if not p.unreachable}
    pending = {i: next(g) for i, g in searches.items()}
    rows: list[list[dict[str, Any]]] = [[] for _ in plans]
    num_rounds = num_trials = num_batched = 0
    while pending:
        items = list(pending.items())
        round_rows, batched = _round(plans, items, batch, xp)
        num_rounds, num_trials, num_batched = num_rounds + 1, num_trials + len(items), num_batched + batched
        for (i, _), row in zip(items, round_rows):
            rows[i].append(row)
            try:
                pending[i] = searches[i].send(row)
            except StopIteration as stop:
                del pending[i]
                found[i] = plans[i].result(rows[i], *stop.value)
    run_by = (f"{num_batched} of {num_trials} trials batched on {backend_name(xp)} in {num_rounds} rounds "
              f"(batch={batch!r}), the rest per process")
    _log.info("capacities: %s", run_by)
    out = []
    for p, r in zip(plans, found):
        assert r is not None
        if window_check and r.reason.startswith("converged"):
            r = p.window_checked(r)
        out.append(dataclasses.replace(r, run_by=run_by))
    return out


def _round(plans: list[_Plan], items: list[tuple[int, float]], batch: str, xp: Any) -> tuple[list[dict[str, Any]], int]:
    """The trial rows of one round (search position, rate), and how many the batched engine ran."""
    single = [(k, i, q) for k, (i, q) in enumerate(items) if plans[i].config.pp == 1]  # PP: two runs per trial
    runs = []
    for _, i, q in single:
        p = plans[i]
        work, kw = _serve_args(p.work, p.config, q, seed=p.seed, arrivals=p.arrivals, burst_cv=p.burst_cv)
        runs.append(prepare(work, p.config.policy, **kw, cost_model=p.config.cost()))
    choice = choose(runs, xp, "always" if batch == "always" else "auto")
    out: list[dict[str, Any] | None] = [None] * len(items)
    chosen = [single[j] for j in choice.batched]
    for (k, i, q), j, (req, it) in zip(chosen, choice.batched, run_batched([runs[j] for j in choice.batched], xp)
                                       if chosen else []):
        p = plans[i]
        out[k] = _trial_row(q, finish(runs[j], req, it), p.slo, p.warmup_frac, p.max_backlog_frac)
    for k, (i, q) in enumerate(items):
        if out[k] is None:
            out[k] = _trial(plans[i].trial_args(q))
    return [row for row in out if row is not None], len(chosen)


def capacity_table(found: Mapping[Any, CapacityResult], *, key_names: Sequence[str] = ("case",)) -> pd.DataFrame:
    """One row per search: the key (split over ``key_names`` when a tuple), set-up, capacity.

    Columns after the key: model, GPUs, scheduler, token budget (tokens; NaN for the
    simulator's default), policy, max_new_tokens, P99 TBT and median delay SLOs (seconds),
    ``capacity_qps`` (requests/s), trials run, and the constraint that binds just above the
    capacity (:meth:`CapacityResult.binding`).
    """
    rows = []
    for key, r in found.items():
        parts = key if isinstance(key, tuple) else (key,)
        if len(parts) != len(key_names):
            raise ValueError(f"key {key!r} does not split into key_names {tuple(key_names)}")
        c = r.config
        rows.append({**dict(zip(key_names, parts)), "model": c.model, "num_gpus": c.tp * c.pp,
                     "scheduler": c.scheduler, "token_budget_tokens": c.max_num_batched_tokens, "policy": c.policy,
                     "max_new_tokens": c.max_new_tokens, "tbt_slo_s": r.slo.tbt_p99_s,
                     "scheduling_delay_slo_s": r.slo.scheduling_delay_p50_s, "capacity_qps": r.capacity_qps,
                     "num_trials": len(r.trials), "binding": r.binding(), "cost_model": c.cost_label()})
    return pd.DataFrame(rows)
