"""vLLM V0 (``vllm 0.6-0.10``): the V0 engine, the default of 0.6-0.7 and ``VLLM_USE_V1=0`` in 0.8-0.10.

Facts, read from vllm-project/vllm ``vllm/engine/arg_utils.py`` as the search index stores it at
commit 001999d2 (a 0.7 release line; no release tag could be checked out, see
:mod:`kvlab.recommend.servers.vllm`):

- ``EngineArgs``: ``gpu_memory_utilization`` 0.90, ``swap_space`` 4 GiB, ``max_num_seqs`` 256
  under V0 (1024 only under V1), ``enable_prefix_caching`` off under V0, ``preemption_mode``
  unset (recompute for single-sequence requests; ``--preemption-mode swap`` swaps to the
  ``--swap-space`` CPU pool), ``--kv-cache-dtype`` ``auto`` / ``fp8`` / ``fp8_e5m2`` / ``fp8_e4m3``.
- ``create_engine_config``: chunked prefill is off unless the model's context exceeds 32K (then
  on for CUDA text models); without it the scheduler runs whole prefills first and the token
  budget defaults to ``max(max_model_len, 2048)``, with it to 512 (``SchedulerConfig`` in
  ``vllm/config.py`` of the same line: "the best balance between ITL and TTFT on A100").
- ``--block-size`` choices 8, 16, 32 (64 and 128 were added for HPU; CUDA's paged attention
  kernel takes at most 32, PR #11259).
- No async scheduling: the V0 ``LLMEngine.step`` schedules, runs the model and processes its
  outputs one after another (``async_scheduling`` is a V1 ``SchedulerConfig`` field), so the
  family's ``vllm-v0`` stack adds its CPU overheads to the GPU time (``overlap`` false).

kvlab prints every simulated value explicitly (``--max-num-batched-tokens``,
``--enable-chunked-prefill`` only where the release would turn it on), so the command runs the
scheduler kvlab simulated on any release of the family. Set ``VLLM_USE_V1=0`` on 0.8-0.10.
"""
from __future__ import annotations

from dataclasses import replace

from .base import Context, Launch, LaunchContext, Setting, change
from .vllm import VLLM

#: The V0 default CPU swap pool (GiB), ``--swap-space``.
SWAP_SPACE_GIB = 4
#: Above this context V0 turns chunked prefill on by default (tokens).
LONG_CONTEXT_TOKENS = 32768
#: V0's token budget when chunked prefill is on and none is given (tokens).
CHUNKED_TOKENS = 512


class VLLMV0(VLLM):
    system = "vllm"
    key = "vllm 0.6-0.10"
    family = "vLLM V0 (0.6-0.10, VLLM_USE_V1=0 from 0.8)"
    versions = ((0, 6), (0, 10, 99))
    sources = ("vllm-project/vllm vllm/engine/arg_utils.py (EngineArgs, create_engine_config; commit 001999d2, "
               "0.7 line)",)
    overflow = "recompute by default; --preemption-mode swap copies to a --swap-space CPU pool (4 GiB)"
    prefix_cache = "off by default under V0"
    host_offload = "--swap-space GiB with --preemption-mode swap"
    block_sizes = (8, 16, 32)
    kv_knobs = ("gpu_memory_utilization", "kv_cache_dtype", "preemption_mode")
    kv_cache_dtypes = {"auto": "auto", "fp8": "fp8"}
    stack = "vllm-v0"  # fitted to DistServe's V0-era runs (data/costmodels/vllm-v0.json)
    policy, policy_params, engine = "vllm", {"watermark_frac": 0.01}, "vllm-v0"
    kernels = "2024"  # its servers ran the kernels Vidur profiled in 2024 (the vllm-v0 stack is fitted on them)
    async_scheduling = False  # V0 schedules in step (the V1 profile it extends schedules asynchronously)

    def defaults(self, ctx: Context) -> dict:
        max_len = ctx.max_model_len or ctx.model.max_context_tokens
        chunked = max_len > LONG_CONTEXT_TOKENS
        return {"max_num_seqs": 256, "gpu_memory_utilization": 0.9, "swap_space": SWAP_SPACE_GIB,
                "preemption_mode": "recompute", "enable_chunked_prefill": chunked,
                "max_num_batched_tokens": CHUNKED_TOKENS if chunked else max(max_len, 2048), "block_size": 16,
                "kv_cache_dtype": "auto", "enable_prefix_caching": False}

    def settings(self, ctx: Context) -> list[Setting]:
        d = self.defaults(ctx)
        tokens = d["max_num_batched_tokens"]
        base = self.base(scheduler="chunked" if d["enable_chunked_prefill"] else "prefill_first",
                         max_num_seqs=256, max_num_batched_tokens=tokens, gpu_memory_utilization=0.9,
                         kv_cache_dtype=ctx.model.kv_cache_dtype,
                         flags={"--max-num-seqs": 256, "--max-num-batched-tokens": tokens,
                                "--gpu-memory-utilization": 0.9})
        out = [base,
               change(base, "preemption_mode", "swap", "--preemption-mode", preemption_mode="swap",
                      host_pool_gib=float(SWAP_SPACE_GIB), overflow_kind="swap",
                      flags={**base.flags, "--preemption-mode": "swap", "--swap-space": SWAP_SPACE_GIB}),
               change(base, "max_num_seqs", 128, "--max-num-seqs", max_num_seqs=128),
               change(base, "max_num_seqs", 512, "--max-num-seqs", max_num_seqs=512)]
        if not d["enable_chunked_prefill"]:
            out.append(change(base, "enable_chunked_prefill", "on", "--max-num-batched-tokens", CHUNKED_TOKENS,
                              scheduler="chunked", max_num_batched_tokens=CHUNKED_TOKENS))
        out.append(change(base, "gpu_memory_utilization", 0.95, "--gpu-memory-utilization",
                          gpu_memory_utilization=0.95))
        out += self.fp8_kv(base, ctx, "--kv-cache-dtype")
        return out

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        if setting.scheduler == "chunked":
            setting = replace(setting, flags={**setting.flags, "--enable-chunked-prefill": True})
        return replace(super().launch(setting, ctx),
                       notes=("set VLLM_USE_V1=0 on vLLM 0.8-0.10 to run the V0 engine",))

PROFILE = VLLMV0()
