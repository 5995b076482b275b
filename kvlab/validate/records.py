"""A measured run of a real server: its set-up and what each request measured.

A :class:`RunRecord` is what :mod:`kvlab.validate` replays and compares: the server's set-up
(:class:`SetUp`: server and version, engine flags, model, GPU, parallelism, where the clock
starts, and what had to be assumed) and one row per request (``arrival_s``, ``prompt_tokens``,
``output_tokens`` and the measured ``ttft_s``, ``tpot_s``, ``e2e_s``; optionally ``client_queue_s``, and ``hash_ids``,
the prompt's block hashes, 512 tokens each, as in Mooncake's traces, which the prefix cache shares). Readers for the shared
datasets, for ``vllm bench serve`` result files and for a user's set-up YAML are in
:mod:`kvlab.validate.readers`.

TPOT is per request, ``(last token - first token) / (output tokens - 1)`` (both shared sources
and ``vllm bench serve``), which is kvlab's ``mean_tbt_s``. ``arrival_s`` is when the load offered
the request; TTFT and E2E start when the client sent it, ``client_queue_s`` later (0 unless a client
caps its requests in flight: ``vllm bench serve --max-concurrency`` holds a request behind a
semaphore and starts its clock when it is sent: ``limited_request_func`` in
``vllm/benchmarks/serve.py``, vllm-project/vllm 009e6d4, which saves the send times as
``start_times`` and the waits as ``queue_times``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..prefix_blocks import HASH_IDS
from ..sim.config import SCHEDULERS
from ..specs import NO_P2P, GPUSpec, gpu as _gpu

#: Per-request columns a run record holds (times in seconds, lengths in tokens).
REQUEST_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s")
#: Optional per-request column: seconds between the offered arrival and the client sending it.
CLIENT_QUEUE = "client_queue_s"


@dataclass(frozen=True, kw_only=True)
class SetUp:
    """How a measured run was served: what a replay needs to run it in its own set-up.

    Parameters
    ----------
    name : str
        The run's name (unique within its dataset).
    dataset : str
        The group of runs it belongs to (one error table per dataset).
    server, server_version : str
        E.g. ``"vLLM"``, ``"0.19.0"`` (``""`` when not recorded).
    engine : {"vllm-v1", "vllm-v0", "sglang", "tensorrt-llm", "tgi"}
        The serving engine (:func:`kvlab.recommend.servers.engines`): the replay runs its profile's policy, default scheduler,
        asynchronous scheduling and attention; named stacks of :mod:`kvlab.costmodel.stacks` carry its CPU
        overheads.
    model, gpu : str
        Catalogue names (:mod:`kvlab.specs`).
    tp, dp : int
        Tensor-parallel GPUs per rank and data-parallel ranks (routed by load: :mod:`kvlab.sim.data_parallel`).
    expert_parallel : int
        GPUs a mixture of experts' experts are spread over (vLLM's ``--enable-expert-parallel``:
        ``tp x dp``); 1 without expert parallelism.
    p2p : bool
        Whether the host let its GPUs reach each other peer-to-peer (default); False where it
        blocked it (PCIe ACS or an IOMMU on): collectives through host memory
        (:attr:`kvlab.specs.GPUSpec.p2p`, :mod:`kvlab.costmodel.host_collectives`).
    scheduler : {"chunked", "prefill_first", "prefill_first_chunked", "mixed_whole", "chunked_alternating"}
        V1 chunked prefill, V0 whole prefills, SGLang's unmixed chunks, TensorRT-LLM's whole prefills beside
        the decodes, or TGI's chunks admitting in alternate iterations (:func:`kvlab.simulate`'s ``scheduler``);
        None (not stated): ``chunked`` for vLLM, else the engine's profile's default.
    max_num_seqs, max_num_batched_tokens, max_model_len, block_size : int
        Engine flags (``max_model_len`` None: the model's own context).
    pool_pages : int or None
        KV blocks when the server recorded them; None: derived from ``gpu_memory_utilization``.
    gpu_memory_utilization : float
        vLLM's flag.
    kv_cache_dtype : {"auto", "fp8"}
        vLLM's ``--kv-cache-dtype``: FP8 halves the KV bytes per token (pool and attention reads).
    weight_dtype : {"bf16", "fp8", "int4"}
        The weights' precision (vLLM's ``--quantization fp8``, or an FP8 / INT4 checkpoint).
    prefix_caching : bool
        Whether the server ran its prefix cache (vLLM V1's default); the replay runs it too
        (:mod:`kvlab.prefix_cache`). A record carries no token ids, so the only prefix requests
        share is the one the set-up states (``shared_prefix_tokens``); without it, a request finds
        only its own blocks after a preemption.
    shared_prefix_tokens, shared_prefix_share : int, float
        The leading tokens a share of the requests have in common (``vllm bench serve
        --random-prefix-len``, ``--sonnet-prefix-len``, a system prompt); 0: none.
    max_concurrency : int or None
        The client's cap on requests in flight (``vllm bench serve --max-concurrency``); None: none.
    async_scheduling : bool or None
        Whether the engine scheduled each iteration while the previous one ran (vLLM V1's
        ``--async-scheduling``); None: the engine's default for its version (:attr:`schedules_async`).
    clock_start : str
        Where each request's clock starts (``"client issue"``, ``"engine queue"``, ...).
    assumptions : tuple of str
        What the source did not record and the replay assumed.
    source : str
        Where the run comes from (repository, commit, file).
    """

    name: str
    dataset: str
    server: str = "vLLM"
    server_version: str = ""
    engine: str = "vllm-v1"
    model: str
    gpu: str
    tp: int = 1
    dp: int = 1
    expert_parallel: int = 1
    p2p: bool = True
    scheduler: str | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    block_size: int = 16
    pool_pages: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    weight_dtype: str = "bf16"
    prefix_caching: bool = False
    shared_prefix_tokens: int = 0
    shared_prefix_share: float = 1.0
    max_concurrency: int | None = None
    async_scheduling: bool | None = None
    clock_start: str = "client issue"
    assumptions: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        try:
            prof = self.profile
        except ValueError as exc:
            raise ValueError(f"run {self.name}: {exc}") from None
        if self.scheduler is None:  # not stated: the engine's default schedule
            object.__setattr__(self, "scheduler", prof.scheduler)
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"run {self.name}: scheduler must be one of {', '.join(SCHEDULERS)}, "
                             f"got {self.scheduler!r}")
        for f in ("tp", "dp", "expert_parallel", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            val = getattr(self, f)
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"run {self.name}: {f} must be a positive integer, got {val!r}")
        for f in ("max_model_len", "pool_pages", "max_concurrency"):
            val = getattr(self, f)
            if val is not None and (isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1):
                raise ValueError(f"run {self.name}: {f} must be a positive integer or empty, got {val!r}")
        from ..specs import KV_CACHE_DTYPES, WEIGHT_DTYPES

        for f, known in (("kv_cache_dtype", KV_CACHE_DTYPES), ("weight_dtype", WEIGHT_DTYPES)):
            if getattr(self, f) not in known:
                raise ValueError(f"run {self.name}: {f} must be one of {', '.join(known)}, got {getattr(self, f)!r}")
        for f in ("prefix_caching", "p2p"):
            if not isinstance(getattr(self, f), (bool, np.bool_)):
                raise ValueError(f"run {self.name}: {f} must be true or false, got {getattr(self, f)!r}")
        if isinstance(self.shared_prefix_tokens, bool) or not isinstance(self.shared_prefix_tokens, (int, np.integer)) \
                or self.shared_prefix_tokens < 0:
            raise ValueError(f"run {self.name}: shared_prefix_tokens must be a whole number >= 0, "
                             f"got {self.shared_prefix_tokens!r}")
        if not 0 <= float(self.shared_prefix_share) <= 1:
            raise ValueError(f"run {self.name}: shared_prefix_share must be in [0, 1], got {self.shared_prefix_share!r}")
        if not 0 < float(self.gpu_memory_utilization) <= 1:
            raise ValueError(f"run {self.name}: gpu_memory_utilization must be in (0, 1], "
                             f"got {self.gpu_memory_utilization!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> SetUp:
        """A set-up from a mapping (a YAML file's), with errors that name ``where`` and the key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown set-up key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        missing = [k for k in ("name", "model", "gpu") if k not in data]
        if missing:
            raise ValueError(f"{where}: set-up needs {', '.join(missing)}")
        kw = dict(data)
        kw.setdefault("dataset", "user")
        kw["assumptions"] = tuple(str(a) for a in kw.get("assumptions") or ())
        try:
            return cls(**kw)
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @property
    def schedules_async(self) -> bool:
        """Whether the replay schedules asynchronously: ``async_scheduling`` when given, else vLLM V1's
        default, on from :data:`kvlab.recommend.servers.vllm.ASYNC_DEFAULT_SINCE` (v0.14.0, PR #27614)
        and so for a V1 run of unrecorded version; never for V0; another engine's profile's default (SGLang's and
        TensorRT-LLM's overlap schedulers)."""
        from ..recommend.servers.vllm import ASYNC_DEFAULT_SINCE  # here: recommend imports validate

        if self.async_scheduling is not None:
            return bool(self.async_scheduling)
        if self.engine != "vllm-v1":
            return bool(self.profile.async_scheduling)
        parts = [int(x) for x in re.findall(r"\d+", self.server_version)[:2]]
        return len(parts) < 2 or tuple(parts) >= ASYNC_DEFAULT_SINCE

    @property
    def profile(self) -> Any:
        """The server profile of the run's engine (:func:`kvlab.recommend.servers.by_engine`): its simulator policy
        and parameters, default scheduler, asynchronous scheduling, attention (``split_attention``) and kernels."""
        from ..recommend.servers import by_engine  # here: recommend imports validate

        return by_engine(self.engine)

    @property
    def kernels(self) -> str | None:
        """The kernel era the measured model prices the run on: its engine's profile's
        (:attr:`kvlab.recommend.servers.ServerProfile.kernels`: ``"2024"`` for vLLM V0, None for today's)."""
        return self.profile.kernels

    @property
    def gpu_spec(self) -> GPUSpec:
        """The GPU as the replay prices it: the catalogue's, on a host with or without GPU
        peer-to-peer (:attr:`p2p`)."""
        g = _gpu(self.gpu)
        return g if g.p2p == bool(self.p2p) else replace(g, p2p=bool(self.p2p))

    @property
    def client_clock(self) -> bool:
        """Whether each request's clock starts at the client (its TTFT and E2E include the front end's
        latency: HTTP, tokenisation, streaming the first token), not inside the engine."""
        return "client" in self.clock_start.lower()

    def describe(self) -> str:
        """The set-up in one line (what every result states)."""
        pool = f"{self.pool_pages:,} KV blocks (recorded)" if self.pool_pages else \
            f"KV pool from gpu_memory_utilization={self.gpu_memory_utilization}"
        par = f"TP{self.tp}" + (f" x DP{self.dp}" if self.dp > 1 else "") + ("" if self.p2p else f" ({NO_P2P})")
        extra = "".join([", FP8 KV" if self.kv_cache_dtype == "fp8" else "",
                         f", {self.weight_dtype.upper()} weights" if self.weight_dtype != "bf16" else "",
                         ", prefix caching on" if self.prefix_caching else "",
                         f", {self.shared_prefix_tokens}-token shared prefix"
                         + (f" on {self.shared_prefix_share:.0%} of requests" if self.shared_prefix_share < 1 else "")
                         if self.shared_prefix_tokens else "",
                         f", client max_concurrency={self.max_concurrency}" if self.max_concurrency else "",
                         ", async scheduling" if self.schedules_async else ""])
        return (f"{self.server} {self.server_version or '(version not recorded)'} [{self.engine}], {self.model} on "
                f"{self.gpu} {par}, {self.scheduler}, max_num_seqs={self.max_num_seqs}, "
                f"max_num_batched_tokens={self.max_num_batched_tokens}, "
                f"max_model_len={self.max_model_len or 'model'}, block {self.block_size}, {pool}{extra}")


@dataclass(frozen=True)
class RunRecord:
    """One measured run: its :class:`SetUp` and one row per request (:data:`REQUEST_COLUMNS`, and
    :data:`CLIENT_QUEUE`, 0 when absent).

    ``preemptions`` is the server's count of preemptions when it recorded one, else None.
    """

    setup: SetUp
    requests: pd.DataFrame = field(repr=False)
    preemptions: int | None = None

    def __post_init__(self) -> None:
        where = f"run {self.setup.name}"
        missing = [c for c in REQUEST_COLUMNS if c not in self.requests.columns]
        if missing:
            raise ValueError(f"{where}: request table lacks column(s) {', '.join(missing)}")
        cols = list(REQUEST_COLUMNS) + [c for c in (CLIENT_QUEUE, HASH_IDS) if c in self.requests.columns]
        req = self.requests.loc[:, cols].reset_index(drop=True)
        if CLIENT_QUEUE not in req.columns:
            req[CLIENT_QUEUE] = 0.0
        if len(req) < 2:
            raise ValueError(f"{where}: needs at least 2 requests, got {len(req)}")
        for c in (*REQUEST_COLUMNS, CLIENT_QUEUE):
            col = pd.to_numeric(req[c], errors="coerce")
            bad = ~np.isfinite(col.to_numpy(dtype=np.float64))
            if bad.any():
                raise ValueError(f"{where}: column {c} has {int(bad.sum())} missing or non-numeric value(s) "
                                 f"(first at row {int(np.argmax(bad))})")
            req[c] = col
        for c in ("prompt_tokens", "output_tokens"):
            if (req[c] < 1).any() or (req[c] != req[c].round()).any():
                raise ValueError(f"{where}: {c} must be positive integers")
            req[c] = req[c].astype(np.int64)
        if (req[["ttft_s", "tpot_s", "e2e_s", CLIENT_QUEUE]] < 0).any().any():
            raise ValueError(f"{where}: negative measured times")
        req = req.sort_values("arrival_s", kind="stable").reset_index(drop=True)
        req["arrival_s"] = req["arrival_s"] - req["arrival_s"].iloc[0]
        object.__setattr__(self, "requests", req)

    @property
    def name(self) -> str:
        return self.setup.name

    def workload(self) -> pd.DataFrame:
        """The requests as kvlab serves them: ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (and ``hash_ids``
        where the record has them)."""
        cols = ["arrival_s", "prompt_tokens", "output_tokens"] + ([HASH_IDS] if HASH_IDS in self.requests.columns else [])
        return self.requests[cols].copy()

    def with_setup(self, **changes: Any) -> RunRecord:
        """The same requests under a changed set-up."""
        return RunRecord(replace(self.setup, **changes), self.requests, self.preemptions)
