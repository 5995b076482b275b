"""SGLang 0.5 (``python -m sglang.launch_server``).

Facts, read from sgl-project/sglang as the search index stores it (a 0.5 line of ``main``; the
repository snapshot is larger than the fetch limit, so 0.5.23's tag could not be checked out):

- ``python/sglang/srt/server_args.py``, ``ServerArgs._handle_gpu_memory_settings``: by GPU
  memory (MiB) ``chunked_prefill_size`` is 2048 below 35 GiB, 4096 below 60, 8192 below 160,
  16384 above; ``cuda_graph_max_bs`` 8 below 20 GiB, 24 below 35 (80 at TP >= 4), 32 below 60
  (160), 256 below 160 (512), 512 above. With no ``--mem-fraction-static``, reserved MiB =
  512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 x 1024
  (at least 10 GiB on GPUs over 60 GiB) and ``mem_fraction_static = round((memory - reserved) /
  memory, 3)``. ``schedule_conservativeness`` 1.0, ``disable_radix_cache`` False (the radix
  prefix cache is on), ``enable_hierarchical_cache`` False with ``hicache_ratio`` 2.0 (host pool
  = 2 x the device pool), ``--kv-cache-dtype`` ``auto`` / ``fp8_e5m2`` / ``fp8_e4m3`` / ``bf16``
  / ``bfloat16`` / ``fp4_e2m1``; the TP flag is ``--tp-size`` (``--tp`` works only as an
  argparse abbreviation of it).
- ``model_runner.py`` and ``scheduler.py``: ``max_running_requests`` defaults to
  ``min(max_total_tokens // 2, clamp(max_total_tokens / context_len x 512, 2048, 4096))``
  (the request-slot pool), so thousands on a large pool.
- Prefill before decode, never mixed by default: ``ServerArgs.enable_mixed_chunk`` is False
  (``--enable-mixed-chunk``: "Enabling mixing prefill and decode in a batch when using chunked
  prefill"), so ``Scheduler.is_mixed_chunk`` is False and ``scheduler.py``'s ``get_next_batch_to_run``
  runs the prefill batch ``get_new_batch_prefill`` builds whenever there is one (the request being
  chunked first, then waiting requests up to ``chunked_prefill_size`` tokens, the last one chunked)
  and decodes the running batch only when there is none: kvlab's ``prefill_first_chunked`` scheduler.
  With the flag, the running batch's decodes join the prefill batch (``mix_with_running``) and take
  one token each of its budget (``PrefillAdder``'s ``num_mixed_decode_tokens``): the ``chunked``
  scheduler, offered as a setting.
- Overflow: a decode that runs out of pages retracts requests (recompute), and admission keeps
  ``new_token_ratio`` (scaled by ``--schedule-conservativeness``) of each running request's
  remaining output free.
- Overlap scheduling, on by default: ``ServerArgs.disable_overlap_schedule`` is False (the
  server-arguments docs: "Disable the overlap scheduler, which overlaps the CPU scheduler with GPU
  model worker", default False; ``_handle_pipeline_parallelism`` turns it off only at
  ``pp_size > 1``, and speculative decoding or DP attention may too), so ``scheduler.py`` runs
  ``event_loop_overlap``: it picks batch N + 1 (``get_next_batch_to_run``) and launches it before
  ``process_batch_result`` of batch N, so requests finishing in N free their pages and slots, and
  arrivals join, one batch late: the rule of ``kvlab.simulate``'s ``async_scheduling``. Its CPU
  work hides under the GPU's only while it is the shorter: NVIDIA's measured points of SGLang 0.5.6 on the
  H200 (Llama-3.1-8B, 160-512 requests; ``kvlab.validate.points``, notebook 09 section 6b) decode at about the
  same time per token at every TP degree, above kvlab's GPU time, so the server was CPU-bound there. No stack
  fitted to them separates that CPU time from the FP8 prefill time kvlab underprices on the same points (a
  fit to them reaches its front end's bound), so the profile prices GPU time only (stack
  "none"): at hundreds of requests calibrate on the server's own runs (``kvlab calibrate``).
"""
from __future__ import annotations

from ...reservation import pool_pages
from ...specs import MIB
from .base import Context, Launch, LaunchContext, ServerProfile, Setting, change

#: SGLang's admission ratio at schedule_conservativeness 1.0 (kvlab.policies.sglang default).
INIT_RATIO = 0.7


def memory_settings(memory_mib: float, tp: int = 1, pp: int = 1) -> tuple[int, int, float]:
    """SGLang 0.5's ``(chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static)`` for a GPU
    of ``memory_mib`` MiB (``_handle_gpu_memory_settings``, single-model, no DP attention)."""
    if memory_mib < 20 * 1024:
        chunk, bs = 2048, 8
    elif memory_mib < 35 * 1024:
        chunk, bs = 2048, 24 if tp < 4 else 80
    elif memory_mib < 60 * 1024:
        chunk, bs = 4096, 32 if tp < 4 else 160
    elif memory_mib < 160 * 1024:
        chunk, bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp * pp / 8 * 1024
    if memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return chunk, bs, round((memory_mib - reserved) / memory_mib, 3)


class SGLang(ServerProfile):
    system = "sglang"
    key = "sglang 0.5"
    family = "SGLang 0.5"
    versions = ((0, 5), (0, 5, 999))
    sources = ("sgl-project/sglang python/sglang/srt/server_args.py (_handle_gpu_memory_settings, ServerArgs)",
               "sgl-project/sglang python/sglang/srt/model_executor/model_runner.py (max_num_reqs)",
               "sgl-project/sglang python/sglang/srt/managers/scheduler.py (event_loop_overlap; "
               "disable_overlap_schedule False in server_args.py)",
               "sgl-project/sglang python/sglang/srt/managers/scheduler.py (get_next_batch_to_run: prefill first; "
               "is_mixed_chunk from ServerArgs.enable_mixed_chunk, False)")
    overflow = "retract (recompute) when decoding runs out of pages"
    prefix_cache = ("radix cache on by default (--disable-radix-cache turns it off); simulated "
                    "(kvlab.prefix_cache) when the trace carries block ids (hash_ids), at kvlab's block size "
                    "(SGLang matches tokens, page_size 1)")
    prefix_caching = True
    async_scheduling = True  # the overlap scheduler (disable_overlap_schedule False)
    policy, policy_params, engine = "sglang", {"init_ratio": INIT_RATIO}, "sglang"
    scheduler = "prefill_first_chunked"  # enable_mixed_chunk False: prefill chunks run without decodes
    host_offload = ("--enable-hierarchical-cache --hicache-ratio R (host pool R x the device pool; priced as a swap "
                    "over the host link)")
    kv_knobs = ("mem_fraction_static", "kv_cache_dtype", "hierarchical_cache", "schedule_conservativeness")
    kv_cache_dtypes = {"auto": "auto", "fp8": "fp8_e4m3"}
    tp_flag, kv_flag, fp8_weights_args = "--tp-size", "--kv-cache-dtype", ("--quantization", "fp8")

    def defaults(self, ctx: Context) -> dict:
        chunk, _, frac = memory_settings(ctx.gpu.memory_bytes / MIB, tp=ctx.tp)
        context = ctx.max_model_len or ctx.model.max_context_tokens
        tokens = pool_pages(ctx.model, ctx.gpu, block_size=1, gpu_memory_utilization=frac, tp=ctx.tp)
        running = min(tokens // 2, min(max(int(tokens / context * 512), 2048), 4096))
        return {"chunked_prefill_size": chunk, "mem_fraction_static": frac, "max_running_requests": running,
                "schedule_conservativeness": 1.0, "radix_cache": True, "kv_cache_dtype": "auto",
                "enable_hierarchical_cache": False, "hicache_ratio": 2.0, "enable_mixed_chunk": False}

    def settings(self, ctx: Context) -> list[Setting]:
        d = self.defaults(ctx)
        chunk, frac, running = d["chunked_prefill_size"], d["mem_fraction_static"], d["max_running_requests"]
        base = self.base(max_num_seqs=running, max_num_batched_tokens=chunk, gpu_memory_utilization=frac,
                         kv_cache_dtype=ctx.model.kv_cache_dtype,
                         flags={"--mem-fraction-static": frac, "--max-running-requests": running,
                                "--chunked-prefill-size": chunk, "--schedule-conservativeness": 1.0})
        other_chunk = 2048 if chunk > 2048 else 8192
        out = [base,
               change(base, "schedule_conservativeness", 0.3, "--schedule-conservativeness",
                      policy_params={"init_ratio": round(INIT_RATIO * 0.3, 4)}),
               change(base, "max_running_requests", 256, "--max-running-requests", max_num_seqs=256),
               change(base, "chunked_prefill_size", other_chunk, "--chunked-prefill-size",
                      max_num_batched_tokens=other_chunk),
               change(base, "enable_mixed_chunk", "on", "--enable-mixed-chunk", True, scheduler="chunked"),
               change(base, "mem_fraction_static", round(frac + 0.04, 3), "--mem-fraction-static",
                      gpu_memory_utilization=round(frac + 0.04, 3))]
        out += self.fp8_kv(base, ctx, "--kv-cache-dtype")
        # the host pool is hicache_ratio x the device KV pool: its size in GiB follows the pool's bytes
        pool_gib = (pool_pages(ctx.model, ctx.gpu, block_size=1, gpu_memory_utilization=frac, tp=ctx.tp)
                    * ctx.model.kv_bytes_per_token(tp=ctx.tp) * ctx.tp / 2**30)
        out.append(change(base, "hierarchical_cache", "on", "--enable-hierarchical-cache", True,
                          preemption_mode="swap", host_pool_gib=2.0 * pool_gib, overflow_kind="cpu offload",
                          flags={**base.flags, "--enable-hierarchical-cache": True, "--hicache-ratio": 2.0}))
        return out

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        return Launch(argv=["python", "-m", "sglang.launch_server", "--model-path", ctx.checkpoint,
                            "--context-length", str(ctx.max_model_len), *self.option_args(setting, ctx)],
                      notes=("SGLang pages one token at a time (--page-size 1); kvlab's pages of "
                             f"{ctx.block_size} tokens overstate its rounding by under a page a request",))

    def client_note(self, setting: Setting, *, max_new_tokens: int) -> str:
        return f"clients send max_new_tokens <= {setting.output_cap_tokens or max_new_tokens} in sampling_params"


PROFILE = SGLang()
