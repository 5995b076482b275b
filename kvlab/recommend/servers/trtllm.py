"""TensorRT-LLM 1.x (``trtllm-serve``, PyTorch backend).

Facts, read from NVIDIA/TensorRT-LLM as the search index stores it (a 1.x line of ``main``; the
repository snapshot is larger than the fetch limit, so no release tag could be checked out):

- ``tensorrt_llm/commands/serve.py``: CLI options ``--max_batch_size`` and ``--max_num_tokens``
  (``BuildConfig`` defaults, 2048 and 8192), ``--max_seq_len``, ``--tp_size`` (alias of
  ``--tensor_parallel_size``), ``--kv_cache_free_gpu_memory_fraction`` (alias of
  ``--free_gpu_memory_fraction``, default 0.9: the share of the memory left after the weights),
  ``--enable_chunked_prefill`` (a switch, off by default), ``--backend`` (``pytorch`` default)
  and ``--extra_llm_api_options`` / ``--config``: a YAML file of LLM API arguments that overrides
  the CLI. ``get_llm_args`` sets ``scheduler_config.capacity_scheduler_policy``
  ``GUARANTEED_NO_EVICT``.
- ``tensorrt_llm/llmapi/llm_args.py``: ``KvCacheConfig.enable_block_reuse`` True (KV block
  reuse, TensorRT-LLM's prefix cache), ``dtype`` ``auto`` or ``fp8``, ``host_cache_size``
  (bytes of host memory for evicted reusable blocks); ``SchedulerConfig.capacity_scheduler_policy``
  ``GUARANTEED_NO_EVICT`` (reserve prompt + max_tokens, never evict) or ``MAX_UTILIZATION``
  (page on demand, pause and recompute when full).
- Overlap scheduler, on by default on the PyTorch backend: ``TorchLlmArgs.disable_overlap_scheduler``
  is False in ``tensorrt_llm/llmapi/llm_args.py`` (the 1.x line with ``AttentionDpConfig``), and
  ``PyExecutor`` (``tensorrt_llm/_torch/pyexecutor/py_executor.py``) then runs
  ``_executor_loop_overlap`` (``_executor_loop`` only when it is disabled, ``_executor_loop_pp``
  under pipeline parallelism): the next step is scheduled and launched before the previous step's
  outputs are processed, kvlab's ``async_scheduling`` rule, with the CPU work under the GPU's.

Which knob goes where: the batch limits, memory fraction, TP and chunked prefill are CLI
options; the scheduler policy and the KV cache dtype exist only in the YAML file, which kvlab
writes (``--save-dir``).

How a step is batched without chunked prefill (``tensorrt_llm/_torch/pyexecutor/scheduler``,
``PyMicroBatchScheduler.schedule``; the capacity scheduler's ``GUARANTEED_NO_EVICT`` lists the
requests in generation first, then the new ones): each generation request takes one token of
``max_num_tokens``, then each context request its whole remaining prompt, the first that does not
fit ending the step's list; generation and context requests run in one step (the docs' in-flight
batching: "sequences in the context phase can be processed together with sequences in the generation
phase"). That is kvlab's ``mixed_whole`` scheduler; a prompt longer than ``max_num_tokens`` can never
be scheduled, and kvlab counts it as not served. With ``--enable_chunked_prefill`` the contexts are
cut to the tokens left (``_chunk_fcfs`` by default: first come, first served): the ``chunked`` scheduler.
Attention runs the two phases apart (``docs/source/advanced/gpt-attention.md``: the context phase's
fused multi-head attention and the generation phase's masked multi-head / XQA kernels, the context
tokens packed before the generation tokens of the in-flight batch), so kvlab prices its mixed steps
without vLLM's FA2 varlen mixed-batch cost (``split_attention``).
"""
from __future__ import annotations

from dataclasses import replace

import yaml

from .base import Context, Launch, LaunchContext, ServerProfile, Setting, change

#: File name of the extra LLM API options kvlab writes.
YAML_NAME = "extra_llm_api_options.yaml"


def utilization(ctx: Context, free_fraction: float) -> float:
    """TensorRT-LLM's share of the memory left after the weights, as a share of all memory."""
    weights = ctx.model.weight_bytes_per_gpu(tp=ctx.tp)
    mem = ctx.gpu.memory_bytes
    return min(0.99, (weights + free_fraction * (mem - weights)) / mem)


class TensorRTLLM(ServerProfile):
    system = "tensorrt-llm"
    key = "tensorrt-llm 1"
    family = "TensorRT-LLM 1.x (trtllm-serve, PyTorch backend)"
    versions = ((1,), (1, 99))
    split_attention = True  # context and generation attention are separate kernels (docs/source/advanced/gpt-attention.md)
    policy, scheduler = "reserve_max", "mixed_whole"  # GUARANTEED_NO_EVICT; no chunked prefill
    engine = "tensorrt-llm"
    sources = ("NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py (CLI, get_llm_args)",
               "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (KvCacheConfig, SchedulerConfig, "
               "disable_overlap_scheduler)",
               "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py (_executor_loop_overlap)",
               "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/scheduler (PyMicroBatchScheduler.schedule: "
               "generation, then whole contexts within max_num_tokens)")
    overflow = "none under GUARANTEED_NO_EVICT (reserves prompt + max_tokens); MAX_UTILIZATION pauses and recomputes"
    prefix_cache = ("KV block reuse on by default (kv_cache_config.enable_block_reuse); simulated "
                    "(kvlab.prefix_cache) when the trace carries block ids (hash_ids)")
    prefix_caching = True
    async_scheduling = True  # the PyTorch backend's overlap scheduler (disable_overlap_scheduler False)
    host_offload = ("kv_cache_config.host_cache_size keeps evicted reusable blocks on the host (block reuse only; "
                    "not offered until kvlab simulates reuse)")
    kv_knobs = ("kv_cache_free_gpu_memory_fraction", "kv_cache_dtype", "capacity_scheduler_policy", "max_tokens")
    kv_cache_dtypes = {"auto": "auto", "fp8": "fp8"}
    tp_flag = "--tp_size"  # the KV dtype and the scheduler policy exist only in the YAML file

    def defaults(self, ctx: Context) -> dict:
        return {"max_batch_size": 2048, "max_num_tokens": 8192, "kv_cache_free_gpu_memory_fraction": 0.9,
                "enable_chunked_prefill": False, "capacity_scheduler_policy": "GUARANTEED_NO_EVICT",
                "enable_block_reuse": True, "kv_cache_dtype": "auto", "backend": "pytorch"}

    def settings(self, ctx: Context) -> list[Setting]:
        d = self.defaults(ctx)
        base = self.base(max_num_seqs=2048,
                         max_num_batched_tokens=8192, gpu_memory_utilization=utilization(ctx, 0.9),
                         kv_cache_dtype=ctx.model.kv_cache_dtype,
                         flags={"--max_batch_size": d["max_batch_size"], "--max_num_tokens": d["max_num_tokens"],
                                "--kv_cache_free_gpu_memory_fraction": 0.9,
                                "capacity_scheduler_policy": d["capacity_scheduler_policy"]})
        chunked = change(base, "enable_chunked_prefill", "on", "--enable_chunked_prefill", True, scheduler="chunked")
        out = [base, chunked,
               change(chunked, "enable_chunked_prefill, max_num_tokens", 2048, "--max_num_tokens",
                      max_num_batched_tokens=2048),
               change(base, "capacity_scheduler_policy", "MAX_UTILIZATION", "capacity_scheduler_policy",
                      policy="vllm", policy_params={"watermark_frac": 0.0}),
               change(base, "max_batch_size", 256, "--max_batch_size", max_num_seqs=256),
               change(base, "kv_cache_free_gpu_memory_fraction", 0.95, "--kv_cache_free_gpu_memory_fraction",
                      gpu_memory_utilization=utilization(ctx, 0.95))]
        out += self.fp8_kv(base, ctx, None)
        p99, cap = ctx.percentiles.get("p99"), ctx.max_new_tokens
        if p99 is not None and (cap is None or p99 < cap):
            out.append(change(base, "max_tokens", p99, None, output_cap_tokens=p99))
        return out

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        flags = dict(setting.flags)
        options = {"scheduler_config": {"capacity_scheduler_policy": flags.pop("capacity_scheduler_policy")},
                   "kv_cache_config": {"enable_block_reuse": True,
                                       "dtype": self.kv_flag_value(setting.kv_cache_dtype)}}
        argv = ["trtllm-serve", ctx.checkpoint, "--backend", "pytorch", "--max_seq_len", str(ctx.max_model_len),
                *self.option_args(replace(setting, flags=flags), ctx), "--extra_llm_api_options", ctx.file(YAML_NAME)]
        notes: tuple[str, ...] = () if ctx.save_dir else (f"--save-dir DIR writes {YAML_NAME} (below) where the "
                                                          f"command reads it",)
        if ctx.model.weight_dtype != "bf16":
            notes += (f"TensorRT-LLM loads {ctx.model.weight_dtype.upper()} weights from a pre-quantized checkpoint "
                     f"(NVIDIA ModelOpt): give its path in place of {ctx.checkpoint}",)
        return Launch(argv=argv, files={YAML_NAME: yaml.safe_dump(options, sort_keys=False)}, notes=notes)

    def client_note(self, setting: Setting, *, max_new_tokens: int) -> str:
        cap = setting.output_cap_tokens or max_new_tokens
        return (f"clients send max_tokens <= {cap} (GUARANTEED_NO_EVICT reserves prompt + max_tokens; "
                f"an unset max_tokens reserves the whole context)")


PROFILE = TensorRTLLM()
