"""The iteration-level serving simulator: ``simulate(workload, policy, model=..., gpu=...)``.

The engine's rules are written once, at the top of :mod:`kvlab.sim.reference`.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .. import _validate as v
from ..arrivals import KINDS as ARRIVAL_KINDS, arrival_times
from ..backend import get_xp
from ..costmodel import describe as _describe_cost, resolve as _resolve_cost
from ..policies import Policy, create_policy, policy_class
from ..swap import DEFAULT_COPY_LATENCY_S, swap_model
from ..prefix_blocks import MOONCAKE_HASH_BLOCK_TOKENS, PrefixModel, block_ids, shared_keys
from ..reservation import pool_pages as _pool_pages
from ..specs import GIB, GPUSpec, ModelSpec, gpu as _gpu, model as _model
from .context import apply_context as _apply_context, merge as _merge_context
from .config import (DEFAULT_MAX_NEW_TOKENS, DEFAULT_MAX_NUM_SEQS, SCHEDULERS, PoolConfig, PreemptionMode,
                     SchedulerConfig, SchedulerKind, SwapConfig)
from .metrics import iteration_table, request_table, summarize
from .fast import run_fast
from .data_parallel import serve as serve_data_parallel
from .reference import ReferenceEngine
from .request import Request, RequestStatus

ENGINES = ("fast", "reference")


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What one simulation produced.

    Attributes
    ----------
    requests : DataFrame
        One row per request (see :func:`kvlab.sim.metrics.request_table`).
    iterations : DataFrame or None
        One row per iteration when ``record_iterations=True``.
    summary : dict of str to float
        Headline figures (see :func:`kvlab.sim.metrics.summarize`).
    params : dict
        The configuration that ran (policy, max_new_tokens, pool_pages, ...).
    """

    requests: pd.DataFrame
    iterations: pd.DataFrame | None
    summary: dict[str, float]
    params: dict[str, Any]

    def __str__(self) -> str:
        s, p = self.summary, self.params
        return (f"SimResult(policy={p['policy']}, max_new_tokens={p['max_new_tokens']}, "
                f"pool_pages={p['pool_pages']}, preemption_mode={p['preemption_mode']}): "
                f"{int(s['num_completed'])}/{int(s['num_requests'])} completed, "
                f"{s['tokens_per_s']:.1f} tokens/s, {s['requests_per_s']:.2f} requests/s, "
                f"TTFT p50 {s['ttft_p50_s']:.3f} s, e2e p50/p99 {s['e2e_p50_s']:.3f}/{s['e2e_p99_s']:.3f} s, "
                f"{s['preemptions_per_request']:.3f} preemptions/request, "
                f"KV used {s['mean_kv_used_frac']:.1%} of the pool"
                + (f", prefix cache: {s['prefix_hit_rate']:.1%} of prompt tokens hit, "
                   f"{s['saved_prefill_tokens']:,.0f} prefill tokens saved, {s['mean_pages_cached']:,.0f} pages "
                   f"cached and unused on average" if p.get("prefix_caching") else ""))


def _workload_columns(workload: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    work = v.request_table(workload, "workload")  # the trace contract: lengths, times, no duplicate columns
    prompt = work["prompt_tokens"].to_numpy()
    output = work["output_tokens"].to_numpy()
    arrival = work["arrival_s"].to_numpy() if "arrival_s" in work.columns else None
    ids = work["request_id"].to_numpy() if "request_id" in work.columns else np.arange(len(work))
    return prompt, output, arrival, ids


def simulate(workload: pd.DataFrame, policy: str | Policy = "vllm", *, model: str | ModelSpec, gpu: str | GPUSpec,
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, block_size: int = 16, pool_pages: int | None = None,
             gpu_memory_utilization: float = 0.9, tp: int = 1, scheduler: str = "chunked",
             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, max_num_batched_tokens: int | None = None,
             preemption_mode: str = "recompute", arrivals: str = "auto", qps: float | None = None,
             burst_cv: float = 1.0, cpu_pool_pages: int | None = None, copy_latency_s: float = DEFAULT_COPY_LATENCY_S,
             seed: int = 0, record_iterations: bool = False, engine: str = "fast",
             cost_model: Any = None, max_model_len: int | None = None, stack: str | None = None,
             kernels: str | None = None,
             prefix_caching: bool = False, hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS,
             prefix_model: PrefixModel | None = None, async_scheduling: bool = False, data_parallel: int = 1,
             cudagraph_max_tokens: int | None = None, **policy_params: Any) -> SimResult:
    """Serve ``workload`` under one reservation policy and return per-request and summary figures.

    Parameters
    ----------
    workload : DataFrame
        Int columns ``prompt_tokens`` and ``output_tokens`` (the true length the model would
        generate), optional float ``arrival_s`` (seconds) and ``request_id``.
    policy : str or Policy
        One of ``kvlab.policies.policy_names()``; its parameters are passed as extra keywords
        (e.g. ``watermark_frac=0.01`` for ``vllm``, ``cap_tokens`` for ``tgi``, ``quantile``
        for ``predicted``). Or a new, unbound :class:`kvlab.policies.Policy` instance (then
        no extra keywords), e.g. of a policy class not in the registry.
    model, gpu : str or spec
        Model and GPU (``kvlab.specs``), for the pool size and the cost model.
    max_new_tokens : int
        The server's output cap (tokens); default 8,192 (``kvlab.sim.config.DEFAULT_MAX_NEW_TOKENS``).
    block_size : int
        Tokens per KV page.
    pool_pages : int, optional
        GPU KV pages; default ``kvlab.pool_pages(model, gpu, ...)``.
    gpu_memory_utilization : float
        Share of GPU memory for weights + KV when ``pool_pages`` is derived.
    tp : int
        Tensor-parallel degree.
    scheduler : {"chunked", "prefill_first", "prefill_first_chunked", "mixed_whole", "chunked_alternating"}
        Stall-free chunked prefill (Sarathi-Serve, vLLM V1), whole prefills that stall decodes
        (vLLM V0), chunked prefills that stall decodes (SGLang, whose ``--enable-mixed-chunk`` is off
        by default), whole prefills beside the decodes (TensorRT-LLM without chunked prefill), or
        chunked prefill that admits in alternate iterations (TGI 3): see :mod:`kvlab.sim.reference`.
    max_num_seqs : int
        Running requests at most; default 128 (``kvlab.sim.config.DEFAULT_MAX_NUM_SEQS``).
    max_num_batched_tokens : int, optional
        Tokens per iteration; default 8192 for the whole-prefill schedulers (prefill_first, mixed_whole),
        else 2048. At least one page.
    preemption_mode : {"recompute", "swap", "reject"}
        What happens to a preempted request.
    arrivals : {"auto", "trace", "offline", "poisson", "gamma"}
        ``auto``: the workload's ``arrival_s`` if present, else offline (all at 0).
    qps : float, optional
        Request rate for ``poisson`` and ``gamma`` (requests/s).
    burst_cv : float
        Coefficient of variation of gamma inter-arrival gaps.
    cpu_pool_pages : int, optional
        CPU swap pool (pages); default 4 GiB of pages (vLLM's ``swap_space``).
    copy_latency_s : float
        Fixed latency of copying one page one way (seconds); the bytes go at the GPU's host-link
        bandwidth.
    seed : int
        Seed for arrivals and seeded policies.
    record_iterations : bool
        Keep the per-iteration table.
    engine : {"fast", "reference"}
        ``fast`` (:mod:`kvlab.sim.fast`: the reference's rules compiled by Numba, asking Python
        any rule it has no compiled form of) or ``reference`` (:mod:`kvlab.sim.reference`, one object per
        request); both give the same integers and times.
    cost_model : {"measured", "roofline"}, cost model object or None
        The iteration-time model (:func:`kvlab.costmodel.resolve`): ``None`` (default) is the
        measured model where ``gpu`` has measurements, else the spec-sheet roofline;
        ``params["cost_model"]`` of the result names the one that ran. Also the path of a
        cost-model file (``kvlab calibrate``) or a shipped stack's name (``"vllm-v0"``, ``"vllm-v1"``).
    stack : str, optional
        The serving stack added to a named cost model (:mod:`kvlab.costmodel.stacks`): ``"none"``
        (the default: GPU time only), ``"sarathi-serve"``, ``"vllm-v0"``, ``"vllm-v1"`` or a file;
        ``params["stack"]`` of the result names it.
    kernels : str, optional
        The measured model's kernel era (:func:`kvlab.costmodel.cost_model`): None for today's engines'
        measured kernels (or the named stack's era), ``"2024"`` for Vidur's 2024 profiles (the published
        set-ups of 2023-2024 run on it, :mod:`kvlab.presets`).
    max_model_len : int, optional
        The context limit (tokens, prompt + output); default the model's ``max_context_tokens``.
        A request whose prompt reaches it is rejected (aborted, reason "prompt exceeds the
        model's context"); the others generate at most ``max_model_len - prompt_tokens`` tokens
        (length-capped when that cuts them); see :mod:`kvlab.sim.context`. Given explicitly, it
        is also passed to a policy that takes ``max_model_len`` (Orca (Max)'s reservation).
    prefix_caching : bool
        Simulate a prefix cache (:mod:`kvlab.prefix_cache`: vLLM V1's automatic prefix caching;
        recompute preemption only). Off by default. Block identities come from the workload's
        ``hash_ids`` column (Mooncake traces), else from ``prefix_model``, else no block is
        shared between requests (a preempted request still finds its own); see
        :mod:`kvlab.prefix_blocks`. Both engines simulate it (the fast engine's compiled loop
        keeps the same block tables, :mod:`kvlab.sim.fast.prefix`). The result gains
        ``prefix_hit_tokens`` and ``saved_prefill_tokens`` request columns, ``pages_cached`` and
        ``pages_shared_saved`` iteration columns, and its summary the prefix figures
        (:func:`kvlab.sim.metrics.summarize`; zeros when caching is off).
    hash_block_tokens : int
        Tokens per block of the ``hash_ids`` (512, the Mooncake traces'); must be a multiple of
        ``block_size``.
    prefix_model : PrefixModel, optional
        The stated prefix model for a workload without ``hash_ids`` (system-prompt length and
        share); ignored when the workload has ids.
    async_scheduling : bool
        Schedule each iteration while the previous one runs, as vLLM V1 does by default since
        v0.14.0: while the engine is busy, admissions see arrivals, and the pages and slots of
        requests finishing, one iteration late (the reference engine's note states the rule). Off
        by default.
    data_parallel : int
        Data-parallel ranks, as vLLM V1 runs them (:mod:`kvlab.sim.data_parallel` states the rules):
        each request routed to the least-loaded rank; a mixture of experts' ranks in lockstep (every
        iteration as long as the slowest rank's, ranks padded to the largest one's tokens under CUDA
        graphs), a dense model's as independent engines. Each rank has its own ``pool_pages``,
        ``max_num_seqs`` and token budget; the cost model prices one rank (for expert parallelism,
        one built with ``ep``). The request table gains a ``rank`` column (-1 for a request the
        context rejects), the iteration table one row per rank and iteration. 1 (the default): one
        engine.
    cudagraph_max_tokens : int, optional
        With ``data_parallel > 1`` in lockstep: the largest batch CUDA graphs capture (tokens); ranks are padded
        to the largest rank's tokens only when every rank's batch is at most this. Default vLLM
        0.19's ``min(2 x max_num_seqs, 512, max_num_batched_tokens)`` (``vllm/config/vllm.py``).

    Returns
    -------
    SimResult
    """
    run = prepare(workload, policy, model=model, gpu=gpu, max_new_tokens=max_new_tokens, block_size=block_size,
                  pool_pages=pool_pages, gpu_memory_utilization=gpu_memory_utilization, tp=tp, scheduler=scheduler,
                  max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  preemption_mode=preemption_mode, arrivals=arrivals, qps=qps, burst_cv=burst_cv,
                  cpu_pool_pages=cpu_pool_pages, copy_latency_s=copy_latency_s, seed=seed, engine=engine,
                  cost_model=cost_model, max_model_len=max_model_len, stack=stack, kernels=kernels,
                  prefix_caching=prefix_caching,
                  hash_block_tokens=hash_block_tokens, prefix_model=prefix_model, async_scheduling=async_scheduling,
                  data_parallel=data_parallel, cudagraph_max_tokens=cudagraph_max_tokens, warn_stacklevel=3,
                  **policy_params)
    if run.params["data_parallel"] > 1:
        req_table, it_table = serve_data_parallel(
            prompt=run.prompt, output=run.output, arrival_s=run.arrival_s, ids=run.ids,
            max_new_tokens=run.max_new_tokens, policy=run.policy, pool=run.pool, scheduler=run.scheduler, swap=run.swap,
            cost_model=run.cost, blocks=run.blocks, engine=run.params["engine"], data_parallel=run.params["data_parallel"],
            lockstep=run.params["dp_lockstep"], cudagraph_max_tokens=run.params["cudagraph_max_tokens"], xp=get_xp(),
            every_column=record_iterations)
    elif run.params["engine"] == "fast":
        req_table, it_table = run_fast(prompt_tokens=run.prompt, output_tokens=run.output, arrival_s=run.arrival_s,
                                       request_ids=run.ids, max_new_tokens=run.max_new_tokens, policy=run.policy,
                                       pool=run.pool, scheduler=run.scheduler, swap=run.swap, cost_model=run.cost,
                                       xp=get_xp(), blocks=run.blocks, every_column=record_iterations)
    else:
        requests = [Request(index=i, prompt_tokens=int(run.prompt[i]), output_tokens=int(run.output[i]),
                            arrival_s=float(run.arrival_s[i]), max_new_tokens=run.max_new_tokens)
                    for i in range(len(run.prompt))]
        done, rows = ReferenceEngine(requests, policy=run.policy, pool=run.pool, scheduler=run.scheduler,
                                     swap=run.swap, cost_model=run.cost, blocks=run.blocks).run()
        req_table = request_table(done, run.ids, prefix_caching=run.blocks is not None)
        it_table = iteration_table(rows, prefix_caching=run.blocks is not None)
    return finish(run, req_table, it_table, record_iterations=record_iterations)


@dataclass(frozen=True, kw_only=True)
class PreparedRun:
    """One simulation checked and resolved, ready for an engine (what :func:`simulate` hands its engine).

    Attributes
    ----------
    prompt, output, arrival_s, ids : ndarray
        The requests the engine serves (context-rejected ones removed; outputs cut at the
        context; tokens, seconds).
    max_new_tokens : int
        The output cap the engine applies (tokens).
    policy : Policy
        The bound policy (one instance per run).
    pool, scheduler, swap : config
        The engine's pool, scheduler and swap configurations.
    cost : cost model
        The iteration-time model.
    context : ContextLimit
        Which workload rows the context rejected or cut (for :func:`finish`).
    all_prompt, all_output, all_arrival_s, all_ids : ndarray
        The whole workload's columns (for :func:`finish`).
    blocks : BlockIds or None
        The requests' prefix-cache block identities (:mod:`kvlab.prefix_blocks`) when caching is
        simulated, else ``None``.
    params : dict
        ``SimResult.params`` of the run.
    """

    prompt: np.ndarray
    output: np.ndarray
    arrival_s: np.ndarray
    ids: np.ndarray
    max_new_tokens: int
    policy: Policy
    pool: PoolConfig
    scheduler: SchedulerConfig
    swap: SwapConfig
    cost: Any
    context: Any
    all_prompt: np.ndarray
    all_output: np.ndarray
    all_arrival_s: np.ndarray
    all_ids: np.ndarray
    blocks: Any
    params: dict[str, Any]


def prepare(workload: pd.DataFrame, policy: str | Policy = "vllm", *, model: str | ModelSpec, gpu: str | GPUSpec,
            max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, block_size: int = 16, pool_pages: int | None = None,
            gpu_memory_utilization: float = 0.9, tp: int = 1, scheduler: str = "chunked",
            max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, max_num_batched_tokens: int | None = None,
            preemption_mode: str = "recompute", arrivals: str = "auto", qps: float | None = None,
            burst_cv: float = 1.0, cpu_pool_pages: int | None = None, copy_latency_s: float = DEFAULT_COPY_LATENCY_S,
            seed: int = 0, engine: str = "fast", cost_model: Any = None, max_model_len: int | None = None,
            stack: str | None = None, kernels: str | None = None, prefix_caching: bool = False,
            hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS, prefix_model: PrefixModel | None = None,
            async_scheduling: bool = False, data_parallel: int = 1, cudagraph_max_tokens: int | None = None,
            warn_stacklevel: int = 2, **policy_params: Any) -> PreparedRun:
    """Check and resolve :func:`simulate`'s arguments (the same ones) without running an engine."""
    all_prompt, all_output, trace_arrival, all_ids = _workload_columns(workload)
    m, g = _model(model), _gpu(gpu)
    v.choice(engine, "engine", ENGINES)
    kind = SchedulerKind(v.choice(scheduler, "scheduler", SCHEDULERS))
    mode = PreemptionMode(v.choice(preemption_mode, "preemption_mode", [k.value for k in PreemptionMode]))
    # the cap bounds every request's decode: bounded like a trace length, before anything is allocated
    max_new_tokens = v.positive_int(max_new_tokens, "max_new_tokens", maximum=v.MAX_TRACE_TOKENS)
    block_size = v.positive_int(block_size, "block_size")
    seed = v.nonnegative_int(seed, "seed")
    tp = m.check_tp(tp)
    num_pages = (_pool_pages(m, g, block_size=block_size, gpu_memory_utilization=gpu_memory_utilization, tp=tp)
                 if pool_pages is None else v.positive_int(pool_pages, "pool_pages"))
    if max_num_batched_tokens is None:
        max_num_batched_tokens = 8192 if kind in (SchedulerKind.PREFILL_FIRST, SchedulerKind.MIXED_WHOLE) else 2048
    max_num_batched_tokens = v.positive_int(max_num_batched_tokens, "max_num_batched_tokens")
    if max_num_batched_tokens < block_size:
        raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be at least one page "
                         f"(block_size = {block_size} tokens)")
    if not isinstance(async_scheduling, (bool, np.bool_)):
        raise ValueError(f"async_scheduling must be True or False, got {async_scheduling!r}")
    data_parallel = v.positive_int(data_parallel, "data_parallel")
    sched = SchedulerConfig(kind=kind, max_num_seqs=v.positive_int(max_num_seqs, "max_num_seqs"),
                            max_num_batched_tokens=max_num_batched_tokens, preemption_mode=mode,
                            async_scheduling=bool(async_scheduling))
    page_bytes = block_size * m.kv_bytes_per_token(tp=tp)
    swap = SwapConfig(
        cpu_pool_pages=(int(4 * GIB // page_bytes) if cpu_pool_pages is None
                        else v.nonnegative_int(cpu_pool_pages, "cpu_pool_pages")),
        page_copy_s=swap_model(m, g, tp=tp, copy_latency_s=copy_latency_s).page_copy_s(block_size))
    all_arrival_s = _arrivals(arrivals, len(all_prompt), trace_arrival, qps=qps, burst_cv=burst_cv, seed=seed)
    context = _apply_context(all_prompt, all_output, max_new_tokens=max_new_tokens,
                             max_model_len=(m.max_context_tokens if max_model_len is None
                                            else v.positive_int(max_model_len, "max_model_len")))
    if max_new_tokens > context.max_model_len:  # no request can hold more than the context: reserve no more
        warnings.warn(f"max_new_tokens {max_new_tokens:,} exceeds max_model_len {context.max_model_len:,}: no request "
                      f"can hold more than its context, so policies reserve with max_new_tokens = "
                      f"{context.max_model_len:,}", UserWarning, stacklevel=warn_stacklevel)
        max_new_tokens = context.max_model_len
    kept = ~context.rejected
    prompt, output, arrival_s, ids = all_prompt[kept], context.output_tokens, all_arrival_s[kept], all_ids[kept]
    cost = _resolve_cost(cost_model, m, g, tp=tp, stack=stack, kernels=kernels)
    if isinstance(policy, Policy):
        if policy_params:
            raise ValueError(f"policy parameters {sorted(policy_params)} were given with a Policy instance; "
                             f"pass them to its constructor instead")
        pol = policy
    else:
        if max_model_len is not None and "max_model_len" in inspect.signature(policy_class(policy)).parameters:
            policy_params = {**policy_params, "max_model_len": context.max_model_len}
        pol = create_policy(policy, **policy_params)
    pol.bind(output_tokens=output, max_new_tokens=max_new_tokens, block_size=block_size, num_pages=num_pages,
             seed=seed)
    pool = PoolConfig(num_pages=num_pages, block_size=block_size)
    blocks, prefix_source = None, "off"
    if not isinstance(prefix_caching, bool):
        raise ValueError(f"prefix_caching must be True or False, got {prefix_caching!r}")
    if prefix_caching:
        if mode != PreemptionMode.RECOMPUTE:
            raise ValueError(f"prefix caching preempts by recompute only (vLLM V1), not preemption_mode={mode.value!r}")
        keys, prefix_source = shared_keys(workload, block_size=block_size, hash_block_tokens=hash_block_tokens,
                                          model=prefix_model)
        target = np.minimum(output, max_new_tokens)
        kept_keys = [k for k, keep in zip(keys, kept) if keep]
        blocks = block_ids(kept_keys, -(-(prompt + target) // block_size))
    params = {"policy": pol.name, "max_new_tokens": max_new_tokens, "block_size": block_size,
              "pool_pages": num_pages, "scheduler": kind.value, "max_num_seqs": sched.max_num_seqs,
              "max_num_batched_tokens": max_num_batched_tokens, "preemption_mode": mode.value,
              "cpu_pool_pages": swap.cpu_pool_pages, "page_copy_s": swap.page_copy_s, "model": m.name,
              "gpu": g.name, "tp": tp, "engine": engine, "cost_model": _describe_cost(cost),
              "stack": _stack_name(cost_model, stack),
              "max_model_len": context.max_model_len, "prefix_caching": bool(prefix_caching),
              "async_scheduling": bool(async_scheduling),
              "prefix_blocks": prefix_source, "data_parallel": data_parallel,
              "dp_lockstep": bool(data_parallel > 1 and m.is_moe),
              "cudagraph_max_tokens": (min(2 * sched.max_num_seqs, 512, max_num_batched_tokens)
                                       if cudagraph_max_tokens is None
                                       else v.positive_int(cudagraph_max_tokens, "cudagraph_max_tokens"))}
    return PreparedRun(prompt=prompt, output=output, arrival_s=arrival_s, ids=ids, max_new_tokens=max_new_tokens,
                       policy=pol, pool=pool, scheduler=sched, swap=swap, cost=cost, context=context,
                       all_prompt=all_prompt, all_output=all_output, all_arrival_s=all_arrival_s, all_ids=all_ids,
                       blocks=blocks, params=params)


def finish(run: PreparedRun, req_table: pd.DataFrame, it_table: pd.DataFrame, *,
           record_iterations: bool = False) -> SimResult:
    """The :class:`SimResult` of ``run`` from an engine's request and iteration tables."""
    req_table = _merge_context(req_table, run.context, prompt_tokens=run.all_prompt, output_tokens=run.all_output,
                               arrival_s=run.all_arrival_s, request_ids=run.all_ids)
    return SimResult(requests=req_table, iterations=it_table if record_iterations else None,
                     summary=summarize(req_table, it_table, num_pages=run.pool.num_pages), params=dict(run.params))


def _stack_name(cost_model: Any, stack: str | None) -> str:
    """The serving stack a simulation ran with, as its result states it."""
    from ..costmodel.stacks import is_cost_model_file

    if isinstance(cost_model, str) and is_cost_model_file(cost_model):
        return cost_model
    if cost_model is None or isinstance(cost_model, str):
        return stack or "none"
    terms = getattr(cost_model, "terms", None)
    return getattr(terms, "name", None) or "as in the cost model object"


def _arrivals(kind: str, n: int, trace: np.ndarray | None, *, qps: float | None, burst_cv: float,
              seed: int) -> np.ndarray:
    kind = v.choice(kind, "arrivals", ("auto", "trace") + ARRIVAL_KINDS)
    if kind in ("auto", "trace"):  # the rate and burstiness would be ignored: refuse them
        if qps is not None:
            raise ValueError(f"qps={qps!r} is used only with arrivals='poisson' or 'gamma', not {kind!r}; "
                             f"pass arrivals='poisson' to serve the requests at that rate")
        if burst_cv != 1.0:
            raise ValueError(f"burst_cv={burst_cv!r} is used only with arrivals='gamma', not {kind!r}")
    if kind == "auto":
        return trace if trace is not None else np.zeros(n)
    if kind == "trace":
        if trace is None:
            raise ValueError("arrivals='trace' needs an arrival_s column in the workload")
        return trace
    return arrival_times(n, kind, qps=qps, cv=burst_cv, seed=seed)


__all__ = ["PreparedRun", "Request", "RequestStatus", "SimResult", "finish", "prepare", "simulate"]
