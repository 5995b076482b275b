"""vLLM V1 (``vllm>=0.11``): the ``vllm serve`` OpenAI server as its current releases run it.

Facts, read from vllm-project/vllm (the repository snapshot is larger than the fetch limit, so
no release tag could be checked out: the files were read from the search index's copies of
``main`` after v0.11, commit 002f10e0 for ``vllm/config/cache.py``; the issue's "vLLM 0.33" was
not available to read):

- ``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults``: with no user value, GPUs with
  at least 70 GiB whose name does not contain "a100" (H100, H200, B200, MI300X) default to
  ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 for the OpenAI API server (16384 /
  1024 for the ``LLM`` class); every other GPU (A100 by name, PR #17885; L4, A10G, L40S) to 2048
  / 256 (8192 / 256 for ``LLM``). ``_set_default_max_num_seqs_and_batched_tokens_args`` then
  caps the token budget at ``max_num_seqs x max_model_len`` and the sequences at the budget.
  kvlab prints ``vllm serve`` (``OPENAI_API_SERVER``).
- ``vllm/config/cache.py``, ``CacheConfig``: ``gpu_memory_utilization`` 0.92; ``block_size``
  16 by default (``DEFAULT_BLOCK_SIZE``); ``enable_prefix_caching`` True; ``cache_dtype``
  ``auto`` or ``fp8`` (= ``fp8_e4m3``), among others; ``kv_offloading_size`` (GiB, summed over
  TP ranks; None: no offload) with ``kv_offloading_backend`` ``native`` (CPU).
- Block sizes: ``BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]`` in ``vllm/config/cache.py``
  of the v0.11 releases (later ``main`` takes any positive int, but the CUDA FlashAttention
  backend needs a multiple of 16; 1 and 8 run only on backends that take them).
- V1 always runs chunked prefill (``_set_default_chunked_prefill_and_prefix_caching_args``);
  ``--preemption-mode`` and ``--swap-space`` are gone: a preempted request is recomputed, its
  full blocks kept in the prefix cache for its return.
- Async scheduling (``EngineCore.step_with_batch_queue`` in ``vllm/v1/engine/core.py``, commit
  00080ee1 of ``main``): iteration k is scheduled while k - 1 runs, so a request arriving while
  the engine is busy, and the pages and slot of one finishing, reach the schedule one iteration
  later (``kvlab.simulate``'s ``async_scheduling``), and the engine's CPU work hides under the GPU's
  (the ``vllm-v1`` stack prices an iteration as ``max(GPU, CPU)``, not their sum). Opt-in in the
  0.11-0.13 releases: ``vllm/config/scheduler.py`` of the 0.11 line (commit 01230b40, whose
  ``chunked_prefill_enabled`` is "removed in v0.12") has ``SchedulerConfig.async_scheduling: bool =
  False`` and ``get_scheduler_cls`` returns the plain ``Scheduler`` unless it is set. PR #27614 (the
  last item of the async-scheduling plan, issue #27679, after #31332 and #31373) made it
  ``None``, which ``VllmConfig`` (``vllm/config/vllm.py``: "Enable async scheduling unless there is
  an incompatible option": pooling models, some speculative methods, executors without support)
  turns on; the first release with it is v0.14.0 (2026-01-17, deepjavalibrary/djl issue #3833; its
  release notes, as an earlier reading recorded them: "Async scheduling enabled by default
  (#27614)"). :data:`ASYNC_DEFAULT_SINCE` is that release; the profile simulates
  the newest releases' default and prints ``--async-scheduling`` (a flag of every release of the
  family) so that 0.11-0.13 run as simulated.
- Prefix caching (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``, commit 003df296 of
  ``main``): on by default (``CacheConfig.enable_prefix_caching`` True); a hit is the longest
  cached run of full blocks, capped at ``num_tokens - 1`` tokens; blocks are cached when
  scheduled and freed tail first into an LRU free queue. kvlab simulates it with
  :mod:`kvlab.prefix_cache` when the trace carries block identities.
"""
from __future__ import annotations

import json

from ...specs import GIB
from .base import Context, Launch, LaunchContext, ServerProfile, Setting, change

#: Host buffer kvlab offers for ``--kv-offloading-size`` (GiB per replica).
OFFLOAD_GIB = 16
#: The first vLLM release that schedules asynchronously by default (v0.14.0, PR #27614); earlier
#: V1 releases need ``--async-scheduling``. :attr:`kvlab.validate.SetUp.schedules_async` reads it too.
ASYNC_DEFAULT_SINCE = (0, 14)


class VLLM(ServerProfile):
    system = "vllm"
    key = "vllm>=0.11"
    family = "vLLM V1 (>=0.11)"
    versions = ((0, 11), None)
    sources = ("vllm-project/vllm vllm/engine/arg_utils.py (get_batch_defaults)",
               "vllm-project/vllm vllm/config/cache.py (CacheConfig, commit 002f10e0; BlockSize of v0.11)",
               "vllm-project/vllm vllm/config/scheduler.py (async_scheduling False in the 0.11 line, commit 01230b40; "
               "None, on unless incompatible, from PR #27614 = v0.14.0)")
    overflow = "recompute (V1 has no swap; a preempted request's full blocks stay in the prefix cache)"
    prefix_cache = "on by default (--enable-prefix-caching); simulated (kvlab.prefix_cache) when the trace carries block ids (hash_ids)"
    prefix_caching = True
    async_scheduling = True  # default from ASYNC_DEFAULT_SINCE (v0.14.0); the command sets it for 0.11-0.13
    host_offload = "--kv-offloading-size GiB (native CPU offload; priced as a swap over the host link)"
    block_sizes = (1, 8, 16, 32, 64, 128, 256)
    kv_knobs = ("gpu_memory_utilization", "kv_cache_dtype", "kv_offloading_size")
    kv_cache_dtypes = {"auto": "auto", "fp8": "fp8"}
    tp_flag, kv_flag, fp8_weights_args = "--tensor-parallel-size", "--kv-cache-dtype", ("--quantization", "fp8")
    stack = "vllm-v1"  # fitted to vLLM 0.19 runs (data/costmodels/vllm-v1.json)
    policy, engine = "vllm_v1", "vllm-v1"

    def defaults(self, ctx: Context) -> dict:
        g = ctx.gpu
        big = g.memory_bytes >= 70 * GIB and "a100" not in g.name.lower()
        tokens, seqs = (8192, 1024) if big else (2048, 256)
        if ctx.max_model_len:
            tokens = min(seqs * ctx.max_model_len, tokens)
            seqs = min(seqs, tokens)
        return {"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "gpu_memory_utilization": 0.92,
                "block_size": 16, "kv_cache_dtype": "auto", "enable_prefix_caching": True,
                "enable_chunked_prefill": True, "kv_offloading_size": None}

    def settings(self, ctx: Context) -> list[Setting]:
        d = self.defaults(ctx)
        seqs, tokens, util = d["max_num_seqs"], d["max_num_batched_tokens"], d["gpu_memory_utilization"]
        base = self.base(max_num_seqs=seqs,
                         max_num_batched_tokens=tokens, gpu_memory_utilization=util,
                         kv_cache_dtype=ctx.model.kv_cache_dtype,
                         flags={"--max-num-seqs": seqs, "--max-num-batched-tokens": tokens,
                                "--gpu-memory-utilization": util, "--async-scheduling": self.async_scheduling})
        out = [base]
        out += [change(base, "max_num_seqs", n, "--max-num-seqs", max_num_seqs=n)
                for n in (128, 256, 1024) if n != seqs][:2]
        out += [change(base, "max_num_batched_tokens", n, "--max-num-batched-tokens", max_num_batched_tokens=n)
                for n in (512, 2048, 8192, 16384) if n != tokens]
        out.append(change(base, "gpu_memory_utilization", 0.95, "--gpu-memory-utilization",
                          gpu_memory_utilization=0.95))
        out += self.fp8_kv(base, ctx, "--kv-cache-dtype")
        out.append(change(base, "kv_offloading_size", OFFLOAD_GIB, "--kv-offloading-size",
                          preemption_mode="swap", host_pool_gib=float(OFFLOAD_GIB), overflow_kind="cpu offload"))
        return out

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        cap = setting.output_cap_tokens or ctx.max_new_tokens
        return Launch(argv=["vllm", "serve", ctx.checkpoint, "--max-model-len", str(ctx.max_model_len),
                            "--block-size", str(self.check_block_size(ctx.block_size)),
                            *self.option_args(setting, ctx), "--generation-config", "vllm",
                            "--override-generation-config", json.dumps({"max_new_tokens": cap})])

PROFILE = VLLM()
