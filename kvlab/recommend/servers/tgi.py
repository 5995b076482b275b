"""Text Generation Inference 3 (``text-generation-launcher``), read at tag v3.3.7 (2025-12-18).

TGI is in maintenance mode (README of v3.3.7: minor bug fixes and documentation only).

Facts, from huggingface/text-generation-inference at v3.3.7:

- ``launcher/src/main.rs``: ``--cuda-memory-fraction`` defaults to 1.0; ``--max-batch-prefill-tokens``
  defaults to ``compute_optimal`` = the GPUs' FP16 FLOP/s (a table by card: L4 121e12, A100
  312e12, H100 900e12, H200 989e12, ...; unknown cards, e.g. "nvidia-h100-pcie", get none) over
  the model's FLOPs per token (``Config::flop``), used only above 100, else 4096; then capped by
  ``max_position_embeddings`` and by the tokens the memory allows (``vram_maximum``: memory x
  fraction x 0.95 minus the weights, over KV + MLP bytes per token). ``--kv-cache-dtype``
  ``fp8_e4m3fn`` / ``fp8_e5m2``; ``--num-shard`` GPUs; prefix caching on unless the model is a
  VLM or seq2seq, uses LoRA or falls back to paged attention (``resolve_attention``).
- ``server/text_generation_server/models/globals.py``: ``TGI_WIGGLE_ROOM`` 0.90 and
  ``flash_causal_lm.py``: the KV blocks fill ``free memory x cuda_memory_fraction x 0.90`` after
  warm-up, so kvlab's memory share is ``cuda_memory_fraction x 0.90``.
- ``backends/v3/src/backend.rs``: with prefill chunking (the default, ``PREFILL_CHUNKING=1``)
  ``--max-batch-size``, ``--waiting-served-ratio`` and ``--max-waiting-tokens`` are ignored, and
  ``batching_task`` sends new requests to ``prefill`` together with the running batch, which
  ``server/text_generation_server/server.py`` (``Prefill``: ``concatenate``) runs in one forward pass
  with one decode token per running request and the new requests' chunks, within
  ``--max-batch-prefill-tokens`` (``queue.rs`` ``next_batch``; ``flash_causal_lm.py``
  ``generate_token`` keeps one token per other request for later chunks). Only ``prefill`` passes take new
  requests, and ``batching_task`` follows each one that joins them to the running batch with a ``decode`` pass
  (a ``prefill`` from an idle server may be followed by a joining one), while a prompt's later chunks go on in
  every pass (``flash_causal_lm.py``, ``next_chunk_lengths``): kvlab's ``chunked_alternating`` scheduler, which
  admits no request in the iteration after one that admitted beside running requests. Not modelled: mixed
  passes run without CUDA graphs.
- ``backends/v3/src/queue.rs``: admission reserves the prompt plus the request's
  ``max_new_tokens`` of blocks (kvlab's ``tgi`` policy with its 1,024-token cap on the decode
  reservation); a request that outgrows it is re-queued (recompute).
"""
from __future__ import annotations

from .base import Context, Launch, LaunchContext, ServerProfile, Setting, change

#: TGI's share of the visible memory it profiles against (TGI_WIGGLE_ROOM).
WIGGLE_ROOM = 0.90
#: The launcher's own wiggle room in ``vram_maximum`` (TGI_WIGGLE_ROOM unset there means 0.95).
LAUNCHER_WIGGLE_ROOM = 0.95
#: ``ComputeType::f16_flop`` per card (FLOP/s), by kvlab GPU name; absent cards are unknown to TGI.
F16_FLOPS = {"L4": 121e12, "L40S": 363e12, "A10G": 125e12, "A40": 149e12, "A100-40GB": 312e12,
             "A100-80GB-SXM": 312e12, "A100-80GB-PCIe": 312e12, "H100-SXM": 900e12, "H200": 989e12}


def flop_per_token(m) -> int:
    """``Config::flop`` of TGI 3.3.7's launcher: attention and MLP FLOPs of one token, all layers."""
    q = 2 * m.num_q_heads * m.head_dim * m.hidden_size
    kv = 2 * m.num_kv_heads * m.head_dim * m.hidden_size
    inter = (m.moe_intermediate_size or m.intermediate_size) * (m.experts_per_token or 1)
    layer = q + 2 * kv + 2 * q + 2 * 3 * m.hidden_size * inter
    return layer * m.num_layers


def default_prefill_tokens(m, gpu_name: str, memory_bytes: int, tp: int, memory_fraction: float = 1.0) -> int:
    """``--max-batch-prefill-tokens``' default (``main.rs``: compute_optimal, max_position_embeddings,
    vram_maximum), for ``tp`` GPUs named ``gpu_name``."""
    flops = F16_FLOPS.get(gpu_name)
    optimal = int(flops * tp / flop_per_token(m)) if flops else None
    value = min(optimal if optimal is not None and optimal > 100 else 4096, m.max_context_tokens)
    if flops:  # vram_maximum needs a card TGI knows (ComputeType)
        experts = m.num_experts or 1
        model_bytes = 2 * ((3 * m.intermediate_size * experts * m.hidden_size
                            + (m.num_q_heads + 2 * m.num_kv_heads) * m.head_dim
                            + m.num_q_heads * m.head_dim * m.hidden_size) * m.num_layers
                           + 2 * m.hidden_size * m.vocab_size)
        token_bytes = (m.num_kv_heads * 2 * m.head_dim * 2 * m.num_layers
                       + (m.intermediate_size + m.intermediate_size // 2) * experts * 2 * 3)
        available = int(memory_bytes * tp * memory_fraction * LAUNCHER_WIGGLE_ROOM)
        if available > model_bytes:
            value = min(value, (available - model_bytes) // token_bytes)
    return int(value)


class TGI(ServerProfile):
    system = "tgi"
    key = "tgi 3"
    family = "TGI 3 (3.3.7, maintenance mode)"
    versions = ((3,), (3, 99))
    sources = ("huggingface/text-generation-inference v3.3.7 launcher/src/main.rs",
               "v3.3.7 server/text_generation_server/models/globals.py (TGI_WIGGLE_ROOM)",
               "v3.3.7 backends/v3/src/backend.rs (max_batch_size ignored with chunking)")
    overflow = "re-queue (recompute) a request that outgrows its reservation"
    prefix_cache = ("on by default with flashinfer / flashdecoding attention; simulated (kvlab.prefix_cache) "
                    "when the trace carries block ids (hash_ids)")
    prefix_caching = True
    policy, policy_params = "tgi", {"cap_tokens": 1024}  # the decode reservation capped at 1,024 tokens
    scheduler = "chunked_alternating"  # a decode pass after each admitting prefill pass
    engine = "tgi"
    host_offload = ""
    kv_knobs = ("kv_cache_dtype",)
    kv_cache_dtypes = {"auto": "auto", "fp8": "fp8_e4m3fn"}
    tp_flag, kv_flag, fp8_weights_args = "--num-shard", "--kv-cache-dtype", ("--quantize", "fp8")

    def defaults(self, ctx: Context) -> dict:
        g = ctx.gpu
        return {"cuda_memory_fraction": 1.0, "wiggle_room": WIGGLE_ROOM,
                "max_batch_prefill_tokens": default_prefill_tokens(ctx.model, g.name, g.memory_bytes, ctx.tp),
                "max_batch_size": None, "prefill_chunking": True, "prefix_caching": True, "kv_cache_dtype": "auto"}

    def settings(self, ctx: Context) -> list[Setting]:
        d = self.defaults(ctx)
        tokens = d["max_batch_prefill_tokens"]
        # with chunking TGI has no running-request cap (max_batch_size is ignored): the pool bounds it
        base = self.base(max_num_seqs=4096,
                         max_num_batched_tokens=tokens, gpu_memory_utilization=1.0 * WIGGLE_ROOM,
                         kv_cache_dtype=ctx.model.kv_cache_dtype,
                         flags={"--max-batch-prefill-tokens": tokens, "--cuda-memory-fraction": 1.0})
        out = [base]
        out += [change(base, "max_batch_prefill_tokens", n, "--max-batch-prefill-tokens", max_num_batched_tokens=n)
                for n in (2048, 4096, 8192) if n != tokens][:2]
        out += self.fp8_kv(base, ctx, "--kv-cache-dtype")
        return out

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        return Launch(argv=["text-generation-launcher", "--model-id", ctx.checkpoint,
                            "--max-input-tokens", str(ctx.max_prompt_tokens), "--max-total-tokens",
                            str(ctx.max_model_len), *self.option_args(setting, ctx)])

    def client_note(self, setting: Setting, *, max_new_tokens: int) -> str:
        cap = setting.output_cap_tokens or max_new_tokens
        return f"clients send max_new_tokens <= {cap} (TGI reserves prompt + min(max_new_tokens, 1024))"


PROFILE = TGI()
