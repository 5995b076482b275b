"""The measured cost model: iteration time from curves fitted to public GPU measurements.

One iteration on one GPU (one pipeline stage of ``layers`` layers, ``tp`` GPUs per stage) costs

    layers x (linear(T) + pointwise(T) + attention(P, K, S) + all-reduce(T))
    + lm_head(S) + overhead_s + overhead_s_per_seq x S

for ``T`` tokens computed, ``P`` causal (query, key) pairs, ``K`` KV tokens read (context after
the iteration, summed over sequences) and ``S`` sequences scheduled:

Kernel eras: a GPU whose serving engine's kernels were measured (:mod:`.engine_gemms`,
:mod:`.engine_attention`: vLLM 0.14-0.19) and that Vidur profiled in 2024 (A100, H100) has both;
the engine's are the default, and ``kernels="2024"`` (:data:`KERNEL_ERAS`; what the stacks fitted
to 2024 servers state: ``"vllm-v0"``, ``"sarathi-serve"``) prices it from Vidur's 2024 profiles and
collective curves instead, as the servers of that time ran.

* **linear(T)**: the layer's four GEMMs (QKV, attention output, MLP up (+ gate), MLP down), each
  ``T x k @ k x n`` (per-GPU shapes under TP; MLA's projections below) priced by the GPU's fitted GEMM curve
  (:class:`GemmCurve`): a smooth maximum of the bytes moved over a fitted bandwidth and the
  FLOPs over a token-count-dependent throughput ``F T / (T + T_half)``, plus a launch time.
  Fitted per GPU to Vidur's per-operation profiles of several models and TP degrees, so any
  model shape gets a prediction from its GEMM sizes; never under the bytes over the spec HBM
  bandwidth or the FLOPs over the dense peak. A GPU without profiles is priced from the
  nearest profiled one by spec ratios (:func:`build`). Where the GPU's family is an engine's
  measured GEMM table (:mod:`.engine_gemms`, BF16 weights), the table prices the layer's GEMMs
  at its token counts and weight shapes, interpolated between them (:func:`table_correction`):
  the one curve runs the widest layers' GEMMs up to 13% slow on the H100 and the A100 at a few
  hundred to a few thousand tokens;
* **pointwise(T)**: norms, rotary embedding, activation, residual add: a launch time plus
  seconds per element of the hidden state (every TP rank works on all of it) and per element TP
  splits (rotary on q and k, the activation), at least their bytes over HBM; fitted to Vidur's
  2024 profiles (their era) or, for today's kernels, to vLLM's own operators (LLMServingSim's
  profiles, :mod:`.fit`);
* **attention**: a launch time, seconds per sequence, per token, per KV byte read and per
  attention FLOP, fitted to Vidur's A100 attention profile (FlashAttention) and carried to every
  GPU by the ratio of its spec HBM bandwidth (the byte term) and dense peak (the token and FLOP
  terms) to the A100's, at least its KV bytes over HBM and its FLOPs over peak; a GPU whose
  engine's own attention kernels were measured (:mod:`.engine_attention`: vLLM's FlashAttention or
  FlashInfer on the A100-80GB-SXM, H100-SXM, H200, B200 and L40S, the release of its GEMM table) has the same terms
  fitted to them (on the H100, FA3 prefills about twice as fast as the A100 profile carried); a GPU
  with an engine's own attention profile (:mod:`.op_profiles`) has its own terms, and one more: seconds
  per decode KV byte read in a batch that also prefills (vLLM 0.19 runs such a batch in one
  varlen kernel, whose decodes read their context about 3x slower than a decode-only batch
  does), applied to the decodes' context estimated by :func:`mixed_decode_kv_tokens`; every other
  GPU vLLM runs FlashAttention 2 on (:func:`runs_fa2`) carries that term as the RTX profiles' ratio
  to their decode KV term (``fa2_mixed_decode`` in the constants), times its own;
* **all-reduce(T)**: two per layer under TP, ``T x hidden x 2`` bytes each: the alpha-beta line
  fitted to the measured all-reduce curve of the GPU's interconnect for ``tp`` GPUs, or vLLM's
  custom in-node all-reduce (priced from the measured send/recv link) where it is faster and
  applies; where vLLM's own TP all-reduce was measured on the GPU's host (:mod:`.host_collectives`,
  with GPU peer-to-peer; without it vLLM runs NCCL's), that line; at least the ring's bytes over the
  interconnect;
* **mixture of experts**: the routed experts' GEMMs on the same curve at tokens per expert, and the
  shared experts (DeepSeek) as one dense MLP of their summed width on every token;
* **multi-head latent attention** (MLA, DeepSeek-V2/V3), as vLLM runs it
  (``vllm/model_executor/models/deepseek_v2.py``, ``DeepseekV2MLAAttention``, and the design note
  of ``vllm/v1/attention/backends/mla/common.py``; main-branch snapshots 002d6073 and 00a817ad):
  the query from the hidden state (``q_proj``, split by TP) or, with a query rank, through the
  replicated fused ``h -> q_lora_rank + kv_lora_rank + rope`` down-projection and ``q_b_proj``;
  the replicated ``kv_a_proj_with_mqa`` (``h -> kv_lora_rank + rope``) where there is no query
  rank; the key and value up-projections of ``kv_b_proj`` (``kv_lora_rank -> heads x nope`` and
  ``-> heads x v_head_dim``), which prefill applies to its new tokens' latents and decode absorbs
  into the query and the output (two batched GEMMs per token, the same weights and FLOPs per row);
  ``o_proj``. Attention reads the latent cache, ``(kv_lora_rank + rope) x dtype`` bytes per token
  and layer, with no head axis. Decode runs on it in the absorbed form (multi-query attention with
  a ``kv_lora_rank + rope`` key and a ``kv_lora_rank`` value per head: ``2 (r + rope) + 2 r``
  FLOPs per pair and head); prefill decompresses to per-head keys and values (``2 (nope + rope) +
  2 v_head_dim``). The aggregates split the pairs: a decode token's pairs equal its context, so
  ``min(pairs, kv_tokens)`` are priced as decode pairs and the rest (a prefill chunk's surplus,
  ``(c - 1)(k + c / 2)`` for ``c`` tokens after ``k``) as prefill pairs, exact for decode
  batches. Not priced: prefill's up-projection of a chunk's cached context (vLLM decompresses the
  cached latents of a chunked prefill, ``kv_b_proj`` over ``k`` rows) and the dense first layers
  of DeepSeek (every layer is priced as a mixture-of-experts layer);
* **weight precision**: GEMMs read ``weight_bytes`` per weight element (FP8: 1, INT4: 4 bits plus
  a BF16 scale per 128), activations in BF16; FP8 weights run on the BF16 curve scaled by the
  GPU's FP8/BF16 dense-peak ratio (1 where it has no FP8 tensor cores), floored at the FP8 peak
  (aiconfigurator's FP8 tables of vLLM's FP8 linear layer are not used: at decode sizes they time
  the B200's widest FP8 GEMMs at 0.65-0.9x the BF16 ones, yet the server decodes Llama-3.1-70B in
  FP8 on one B200 faster than its BF16 weights' bytes allow; see :mod:`kvlab.validate.points`);
  the vocabulary projection stays BF16 (quantized checkpoints keep it so);
* **lm_head(S)**: the vocabulary GEMM over one token per sequence, on the same GEMM curve (BF16);
* **overheads**: per iteration and per sequence (CPU scheduling, input preparation, sampling),
  fitted to Sarathi-Serve's measured batch times after the GPU terms above: a property of that
  serving stack (Sarathi-Serve on vLLM 0.2-era Python workers: 14 ms per iteration and 1.1 ms
  per sequence), added only when asked for (``stack="sarathi-serve"``, used to reproduce that
  paper's batches). The default (``stack="none"``) is GPU time only: a modern stack that hides its
  CPU work (vLLM V1, CUDA graphs) comes closer to it than to a 2023 Python stack, whose
  per-sequence cost would make a 64-sequence Llama-3-8B decode on H100 ~8x slower than the GPU
  takes. No modern stack's overheads are measured here; measure yours with bench/gpu_check.sh.

The inputs are aggregates over the batch, as for the roofline, so one call prices many
iterations at once on NumPy or CuPy arrays. The constants live in
``data/costmodels/measured.json`` (written by :mod:`kvlab.costmodel.fit`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping


from .. import _validate as v
from .._paths import DATA_DIR
from ..backend import array_namespace
from ..specs import NO_P2P, WEIGHT_DTYPES, GPUSpec, ModelSpec, gpu as _gpu, model as _model

CONSTANTS_PATH = DATA_DIR / "costmodels" / "measured.json"
#: The kernel eras a cost model can be asked for besides today's (None): "2024", Vidur's profiles.
KERNEL_ERAS = ("2024",)


def _maximum(a: Any, b: Any) -> Any:
    """Elementwise maximum of scalars or arrays (NumPy or CuPy)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return max(a, b)
    return array_namespace(a, b).maximum(a, b)


def _minimum(a: Any, b: Any) -> Any:
    """Elementwise minimum of scalars or arrays (NumPy or CuPy)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return min(a, b)
    return array_namespace(a, b).minimum(a, b)


def mixed_decode_kv_tokens(num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any) -> Any:
    """The decodes' context tokens (after the iteration) in a batch that also prefills, from the
    iteration's aggregates (0 in a decode-only or a prefill-only batch).

    Exact for one prefill chunk of ``c = num_tokens - num_seqs + 1 > 1`` tokens after ``p`` cached
    plus ``num_seqs - 1`` decodes: the chunk adds ``c p + c (c + 1) / 2`` pairs and ``p + c`` KV
    tokens, so ``p = (pairs - kv - c (c - 1) / 2) / (c - 1)`` and the decodes hold ``kv - p - c``.
    With several chunks it is an estimate, clamped to ``[0, kv_tokens]``; 0 where nothing was cached
    (``kv_tokens <= num_tokens``: every token read is new, so no sequence decodes, as in a batch of
    whole prompts).
    """
    c = num_tokens - num_seqs + 1.0
    if isinstance(c, (int, float)):
        if c <= 1.0 or num_seqs <= 1.0 or kv_tokens <= num_tokens:
            return 0.0
        p = max((attention_pairs - kv_tokens - c * (c - 1.0) / 2.0) / (c - 1.0), 0.0)
        return min(max(kv_tokens - p - c, 0.0), kv_tokens)
    xp = array_namespace(num_tokens, attention_pairs, kv_tokens, num_seqs)
    mixed = (c > 1.0) & (num_seqs > 1.0) & (kv_tokens > num_tokens)
    cc = xp.where(mixed, c, 2.0)
    p = xp.maximum((attention_pairs - kv_tokens - cc * (cc - 1.0) / 2.0) / (cc - 1.0), 0.0)
    return xp.where(mixed, xp.minimum(xp.maximum(kv_tokens - p - cc, 0.0), kv_tokens), 0.0)


@dataclass(frozen=True, kw_only=True)
class GemmCurve:
    """Fitted time of one ``M x k @ k x n`` GEMM on one GPU (``M`` = tokens), never under its floor.

    ``t = max(launch_s + (mem^p + comp^p)^(1/p), floor)`` with ``mem = bytes / bytes_per_s``,
    ``bytes = dtype_bytes (M k + M n) + weight_bytes k n`` (activations, weights),
    ``comp = 2 n k (M + half_tokens) / flops_per_s`` (throughput ``flops_per_s x M / (M +
    half_tokens)``: small token counts under-use the tensor cores), ``p = sharpness`` and the physical floor ``max(bytes / peak_bytes_per_s,
    2 M n k / peak_flops_per_s)`` (the GPU's spec-sheet HBM bandwidth and dense peak; infinite
    peaks for a curve as fitted, before it is put on a GPU).
    """

    launch_s: float
    bytes_per_s: float
    flops_per_s: float
    half_tokens: float
    sharpness: float
    dtype_bytes: int = 2
    weight_bytes: float = 2.0
    peak_bytes_per_s: float = math.inf
    peak_flops_per_s: float = math.inf

    def time_s(self, m: Any, n: float, k: float, launches: float = 1.0) -> Any:
        """Seconds of ``m`` x ``k`` @ ``k`` x ``n`` GEMMs (``m`` scalar or array); ``launches``: how
        many launch times it pays (0 for one expert's share of a fused mixture-of-experts kernel)."""
        moved = self.dtype_bytes * m * (k + n) + self.weight_bytes * k * n
        mem = moved / self.bytes_per_s
        comp = 2.0 * n * k * (m + self.half_tokens) / self.flops_per_s
        p = self.sharpness
        curve = launches * self.launch_s + (mem ** p + comp ** p) ** (1.0 / p)
        return _maximum(curve, self.floor_s(m, n, k))

    def floor_s(self, m: Any, n: float, k: float) -> Any:
        """The physical floor of the GEMM (seconds): its bytes over the peak bandwidth, its FLOPs over the peak."""
        moved = self.dtype_bytes * m * (k + n) + self.weight_bytes * k * n
        return _maximum(moved / self.peak_bytes_per_s, 2.0 * n * k * m / self.peak_flops_per_s)


@dataclass(frozen=True, kw_only=True)
class MeasuredCostModel:
    """Iteration time of one model on one GPU configuration from fitted measured curves.

    Build it with :func:`measured` (or ``kvlab.costmodel.cost_model(..., source="measured")``).
    Times are seconds, per GPU of one pipeline stage; see the module note for the terms. Every
    term is at least its bytes over the GPU's spec HBM bandwidth (``peak_bytes_per_s``) and its
    FLOPs over the dense peak (``peak_flops_per_s``); the all-reduce at least its ring bytes over
    the interconnect (``interconnect_bytes_per_s``).

    Attributes
    ----------
    label : str
        Readable name of the model and the data it rests on (recorded in every result).
    gemm_shapes : tuple of (n, k)
        The layer's dense GEMMs per GPU (output and input features); a mixture of experts' router.
    expert_shapes : tuple of (n, k)
        One routed expert's GEMMs per GPU (empty for a dense model); ``num_experts`` experts,
        ``experts_per_token`` used by each token, spread over ``expert_parallel`` GPUs (EP, as
        vLLM builds it: ``tp x dp`` GPUs, each holding ``num_experts / expert_parallel`` whole
        experts, not split by TP, and serving the tokens of all ``expert_parallel / tp`` data-parallel
        ranks routed to them, each rank taken to carry this one's load).
    ep_comm_latency_s, ep_comm_s_per_byte : float
        Under EP with data parallelism, the NCCL alpha-beta fit of an all-reduce over the
        ``expert_parallel / tp`` data-parallel ranks (0 without them): the dispatch (all-gather of
        the ranks' hidden states) and the combine (reduce-scatter of the experts' outputs) of
        each layer cost one all-reduce of the gathered hidden states (:meth:`layer_linear_s`).
    linear_grid_tokens, linear_grid_s, linear_tail_scale : tuple of float, tuple of float, float
        Where the GPU's family measured its engine's GEMMs over a grid of token counts and weight
        shapes (:mod:`.engine_gemms`): the grid's token counts and the layer's dense GEMMs' time at
        each (seconds, :func:`table_correction`). Up to the grid's last count the dense GEMMs cost
        that time interpolated linearly in tokens; beyond it the curve's times ``linear_tail_scale``
        (the grid's last time over the curve's there); never under their floors. Empty: the curve
        alone (routed experts and the vocabulary projection always).
    lm_head_shape : tuple of (n, k)
        The vocabulary projection per GPU, on ``head_gemm`` (BF16 weights: quantized checkpoints
        keep the LM head in BF16; ``gemm`` otherwise).
    sharded_width : float
        Elements per token of the pointwise ops that TP splits (rotary on q and k, the MLP
        activation), per GPU; the norms and residual adds work on ``hidden_size`` on every GPU.
    pointwise_bytes_per_token, attention_kv_bytes_per_token : float
        Bytes per token the pointwise ops move, and KV bytes per token attention reads (per layer).
    attention_s_per_pair, attention_s_per_decode_pair : float
        Seconds per (query, key) pair of a prefill and of a decode (:meth:`attention_layer_s`
        splits them); equal but for MLA, whose decode runs the absorbed form.
    attention_s_per_mixed_decode_kv_token : float
        Extra seconds per decode context token read in a batch that also prefills
        (:func:`mixed_decode_kv_tokens`); 0 where the attention profile has no mixed batches.
    attention_flops_per_pair_layer, attention_decode_flops_per_pair_layer : float
        FLOPs per prefill and per decode pair of one layer per GPU (the FLOP floor).
    allreduce_* : float
        Two all-reduces per layer under TP (``allreduces_per_layer``: 2, or 0 at TP1) of
        ``activation_bytes_per_token x tokens`` bytes each: ``min`` of the NCCL alpha-beta fit
        (``allreduce_latency_s + bytes x allreduce_s_per_byte``) and, up to
        ``custom_allreduce_max_bytes``, the in-node custom all-reduce of vLLM (one shot:
        ``p2p_latency_s + (tp - 1) bytes x p2p_s_per_byte``; two shots: ``2 p2p_latency_s +
        2 (tp - 1) / tp bytes x p2p_s_per_byte``), never under ``ring_factor x bytes /
        interconnect_bytes_per_s``. Where vLLM's own TP all-reduce is measured on the GPU
        (``custom_allreduce_s_per_byte > 0``), its lines: ``custom_allreduce_latency_s +
        custom_allreduce_s_per_byte x bytes`` up to ``custom_allreduce_max_bytes``, the NCCL line
        (then vLLM's measured one too) above.
    gpu_time_scale, overhead_s, overhead_s_per_seq : float
        A serving stack's terms (:mod:`.stacks`): scale on the GPU time, CPU seconds per
        iteration and per sequence.
    kernels : str or None
        The kernel era the terms rest on (module note): None for today's engines' kernels, ``"2024"``
        where they are Vidur's 2024 profiles.
    linear_flops_per_token, attention_flops_per_pair : float
        FLOPs per token of the linear layers and per attention pair (per GPU, whole stage), as in
        the roofline (facts of the model, for FLOP accounting).
    """

    model_name: str
    gpu_name: str
    tp: int
    pp: int
    label: str
    num_layers: int
    hidden_size: int
    gemm: GemmCurve
    head_gemm: GemmCurve
    gemm_shapes: tuple[tuple[float, float], ...]
    expert_shapes: tuple[tuple[float, float], ...] = ()
    num_experts: int = 0
    experts_per_token: int = 0
    expert_parallel: int = 1
    ep_comm_latency_s: float = 0.0
    ep_comm_s_per_byte: float = 0.0
    lm_head_shape: tuple[float, float]
    linear_grid_tokens: tuple[float, ...] = ()
    linear_grid_s: tuple[float, ...] = ()
    linear_tail_scale: float = 1.0
    peak_bytes_per_s: float
    peak_flops_per_s: float
    pointwise_s: float
    pointwise_s_per_element: float
    pointwise_s_per_sharded_element: float
    sharded_width: float
    pointwise_bytes_per_token: float
    attention_s: float
    attention_s_per_seq: float
    attention_s_per_token: float
    attention_s_per_kv_token: float
    attention_s_per_pair: float
    attention_s_per_decode_pair: float
    attention_s_per_mixed_decode_kv_token: float = 0.0
    attention_kv_bytes_per_token: float
    attention_flops_per_pair_layer: float
    attention_decode_flops_per_pair_layer: float
    allreduces_per_layer: float
    activation_bytes_per_token: float
    allreduce_latency_s: float
    allreduce_s_per_byte: float
    custom_allreduce_max_bytes: float
    custom_allreduce_latency_s: float = 0.0
    custom_allreduce_s_per_byte: float = 0.0
    p2p_latency_s: float
    p2p_s_per_byte: float
    ring_factor: float
    interconnect_bytes_per_s: float
    gpu_time_scale: float = 1.0
    overhead_s: float
    overhead_s_per_seq: float
    kernels: str | None = None
    linear_flops_per_token: float
    attention_flops_per_pair: float

    def layer_linear_s(self, num_tokens: Any) -> Any:
        """The linear layers (GEMMs) of one layer over ``num_tokens`` tokens (seconds).

        A mixture of experts adds its routed experts: with ``E`` experts, ``k`` per token and
        uniform routing, ``T`` tokens touch ``E (1 - (1 - k / E)^T)`` experts in expectation,
        each running its GEMMs on ``T k / touched`` tokens (each touched expert reads its weights);
        one launch per expert GEMM for all experts (a fused kernel, as vLLM's ``fused_moe``).

        Under expert parallelism ``ep = tp x dp``, as vLLM 0.19 runs it (``FusedMoEParallelConfig``
        in ``vllm/model_executor/layers/fused_moe/config.py``: each GPU owns whole experts, the
        MoE's own TP is 1; the default ``all2all_backend`` ``"allgather_reducescatter"``,
        ``vllm/config/parallel.py``, whose ``AgRsAll2AllManager`` in
        ``vllm/distributed/device_communicators/all2all.py`` all-gathers the hidden states of the
        ``dp`` data-parallel ranks and reduce-scatters the outputs; 0.19.0 wheel, commit 2a69949):
        a GPU's ``E / ep`` experts see the ``dp T`` tokens of all ranks (``dp T k / ep`` expert-tokens
        in expectation), and with ``dp > 1`` each layer adds that all-gather and reduce-scatter of
        ``dp T`` hidden states, one all-reduce of them in bytes and ring steps
        (``ep_comm_latency_s + ep_comm_s_per_byte x bytes``, at least their ring bytes over the
        interconnect). Under TP alone (``dp = 1``) the tokens are every GPU's already and the
        experts' partial outputs join the TP all-reduce that follows the MLP. The gathered top-k
        ids and weights (8 bytes per token and expert, under 2% of the hidden state) are left out.
        """
        t = sum(self.gemm.time_s(num_tokens, n, k) for n, k in self.gemm_shapes)
        if self.linear_grid_s:
            xp = array_namespace(num_tokens)
            grid = xp.interp(num_tokens, xp.asarray(self.linear_grid_tokens), xp.asarray(self.linear_grid_s))
            inside = num_tokens <= self.linear_grid_tokens[-1]
            t = xp.where(inside, grid, t * self.linear_tail_scale) if not isinstance(num_tokens, (int, float)) \
                else (float(grid) if inside else t * self.linear_tail_scale)
            t = _maximum(t, sum(self.gemm.floor_s(num_tokens, n, k) for n, k in self.gemm_shapes))
        if self.num_experts:
            e, k_tok, ep = float(self.num_experts), float(self.experts_per_token), float(self.expert_parallel)
            ranks = max(ep / self.tp, 1.0)  # data-parallel ranks whose tokens the experts see
            seen = num_tokens * ranks
            touched = e / ep * (1.0 - (1.0 - k_tok / e) ** seen)
            per = seen * k_tok / ep / _maximum(touched, 1.0)
            t = t + sum(self.gemm.launch_s + touched * self.gemm.time_s(per, n, k, 0.0) for n, k in self.expert_shapes)
            if ranks > 1:
                gathered = seen * self.activation_bytes_per_token
                t = t + _maximum(self.ep_comm_latency_s + self.ep_comm_s_per_byte * gathered,
                                 2.0 * (ranks - 1.0) / ranks * gathered / self.interconnect_bytes_per_s)
        return t

    def pointwise_layer_s(self, num_tokens: Any) -> Any:
        """One layer's norms, rotary, activation and residual adds over ``num_tokens`` tokens (seconds)."""
        t = (self.pointwise_s + self.pointwise_s_per_element * self.hidden_size * num_tokens
             + self.pointwise_s_per_sharded_element * self.sharded_width * num_tokens)
        return _maximum(t, self.pointwise_bytes_per_token * num_tokens / self.peak_bytes_per_s)

    def attention_layer_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any) -> Any:
        """One layer's attention (seconds), at least its KV bytes over HBM and FLOPs over peak.

        ``min(attention_pairs, kv_tokens)`` pairs are priced as decode pairs (a decode's pairs are
        its context), the rest as prefill pairs (see the module note on MLA); the decodes of a
        batch that also prefills pay ``attention_s_per_mixed_decode_kv_token`` more per context token.
        """
        decode = _minimum(attention_pairs, kv_tokens)
        prefill = attention_pairs - decode
        t = (self.attention_s + self.attention_s_per_seq * num_seqs + self.attention_s_per_token * num_tokens
             + self.attention_s_per_kv_token * kv_tokens + self.attention_s_per_pair * prefill
             + self.attention_s_per_decode_pair * decode)
        if self.attention_s_per_mixed_decode_kv_token:
            t = t + self.attention_s_per_mixed_decode_kv_token * mixed_decode_kv_tokens(
                num_tokens, attention_pairs, kv_tokens, num_seqs)
        flops = self.attention_flops_per_pair_layer * prefill + self.attention_decode_flops_per_pair_layer * decode
        floor = _maximum(self.attention_kv_bytes_per_token * kv_tokens / self.peak_bytes_per_s,
                         flops / self.peak_flops_per_s)
        return _maximum(t, floor)

    def allreduce_s(self, num_tokens: Any) -> Any:
        """One all-reduce of ``num_tokens`` tokens' hidden states over the ``tp`` GPUs (seconds)."""
        if not self.allreduces_per_layer:
            return 0.0 * num_tokens
        b = self.activation_bytes_per_token * num_tokens
        t = self.allreduce_latency_s + self.allreduce_s_per_byte * b
        if self.custom_allreduce_max_bytes > 0:
            if self.custom_allreduce_s_per_byte > 0:  # measured: it is what runs below the bound
                custom = self.custom_allreduce_latency_s + self.custom_allreduce_s_per_byte * b
            else:
                one = self.p2p_latency_s + (self.tp - 1) * self.p2p_s_per_byte * b
                two = 2.0 * self.p2p_latency_s + 2.0 * (self.tp - 1) / self.tp * self.p2p_s_per_byte * b
                custom = _minimum(_minimum(one, two), t)
            if isinstance(b, (int, float)):
                t = custom if b <= self.custom_allreduce_max_bytes else t
            else:
                xp = array_namespace(b)
                t = xp.where(b <= self.custom_allreduce_max_bytes, custom, t)
        return _maximum(t, self.ring_factor * b / self.interconnect_bytes_per_s)

    def gpu_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any = 1) -> Any:
        """GPU time of iterations with the given work, before the stack's terms (seconds)."""
        t = num_tokens
        layer = (self.layer_linear_s(t) + self.pointwise_layer_s(t)
                 + self.attention_layer_s(t, attention_pairs, kv_tokens, num_seqs)
                 + self.allreduces_per_layer * self.allreduce_s(t))
        return self.num_layers * layer + self.head_gemm.time_s(num_seqs, *self.lm_head_shape)

    def iteration_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any = 1) -> Any:
        """Latency of iterations with the given work (seconds).

        Parameters
        ----------
        num_tokens : int or array
            Tokens computed in the iteration (prefill chunk tokens + decode sequences).
        attention_pairs : int or array
            Causal (query, key) pairs attended, summed over the batch.
        kv_tokens : int or array
            Sum over scheduled sequences of their context length after the iteration (tokens).
        num_seqs : int or array
            Sequences scheduled (prefill chunks + decodes); default 1 (one sequence alone).
        """
        if all(isinstance(x, (int, float)) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs)):
            num_tokens, attention_pairs, kv_tokens, num_seqs = (
                float(x) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs))
        else:
            xp = array_namespace(num_tokens, attention_pairs, kv_tokens, num_seqs)
            num_tokens, attention_pairs, kv_tokens, num_seqs = (
                xp.asarray(x, dtype=xp.float64) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs))
        return (self.gpu_time_scale * self.gpu_s(num_tokens, attention_pairs, kv_tokens, num_seqs)
                + self.overhead_s + self.overhead_s_per_seq * num_seqs)

    def marginal(self) -> MeasuredCostModel:
        """The cost of work riding iterations that run anyway (see :func:`kvlab.preemption_cost.piggyback`).

        GEMMs at their large-batch throughput with no weight reads or launches, attention
        without its launch, no per-iteration overhead and no vocabulary projection; per-sequence,
        per-token, per-byte and per-FLOP terms and the all-reduce stay.
        """
        def free(g: GemmCurve) -> GemmCurve:
            return replace(g, launch_s=0.0, bytes_per_s=math.inf, half_tokens=0.0, peak_bytes_per_s=math.inf)

        return replace(self, label=f"{self.label}, marginal", gemm=free(self.gemm), head_gemm=free(self.head_gemm),
                       pointwise_s=0.0, attention_s=0.0, overhead_s=0.0, lm_head_shape=(0.0, 0.0))


@lru_cache(maxsize=1)
def constants() -> dict[str, Any]:
    """The shipped fitted constants (``data/costmodels/measured.json``); empty when absent."""
    if not CONSTANTS_PATH.exists():
        return {}
    with open(CONSTANTS_PATH, encoding="utf-8") as f:
        return json.load(f)


def _bilinear(xs: Any, ys: Any, values: Any, x: float, y: float) -> Any:
    """``values[..., i, j]`` on the grid ``xs x ys`` interpolated linearly in both at ``(x, y)``, held at the edges.

    Written out (not ``scipy.interpolate``): building a cost model must not import SciPy, which the
    ahead-of-time compiled simulator keeps out of a run's start-up."""
    import numpy as np

    def cell(grid: Any, v: float) -> tuple[int, float]:
        v = min(max(v, float(grid[0])), float(grid[-1]))
        i = int(min(max(np.searchsorted(grid, v, side="right") - 1, 0), len(grid) - 2))
        return i, (v - float(grid[i])) / (float(grid[i + 1]) - float(grid[i]))

    (i, u), (j, w) = cell(xs, x), cell(ys, y)
    return ((1 - u) * (1 - w) * values[..., i, j] + u * (1 - w) * values[..., i + 1, j]
            + (1 - u) * w * values[..., i, j + 1] + u * w * values[..., i + 1, j + 1])


def table_correction(table: Mapping[str, Any], curve: GemmCurve,
                     shapes: tuple[tuple[float, float], ...]) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """``(tokens, seconds, tail scale)`` of a layer's dense GEMMs on a measured table
    (:attr:`MeasuredCostModel.linear_grid_s`).

    ``table`` is a family's ``gemm_table`` (:func:`.fit.gemm_table_ratio`): its token counts, weight shapes
    and, at each, the measured time over the family's fitted curve. At each token count each shape's ratio is
    interpolated linearly in ``(log n, log k)`` (:func:`_bilinear`), held at the table's edges (a shape wider than
    its widest weights takes the widest's ratio), and times ``curve`` (the GPU's own, carried by spec from the
    family's); the layer's time at each token count is their sum, held non-decreasing in tokens (a GEMM over
    fewer tokens can run padded to more). The tail scale is the last time over the curve's sum there.
    """
    import numpy as np

    toks = np.asarray(table["tokens"], dtype=np.float64)
    ln, lk = np.log(np.asarray(table["n"], float)), np.log(np.asarray(table["k"], float))
    ratio = np.asarray(table["ratio"], dtype=np.float64)  # [tokens][n][k]
    measured, curve_sum = np.zeros(len(toks)), np.zeros(len(toks))
    for n, k in shapes:
        c = curve.time_s(toks, float(n), float(k))
        measured, curve_sum = measured + c * _bilinear(ln, lk, ratio, float(np.log(n)), float(np.log(k))), curve_sum + c
    measured = np.maximum.accumulate(measured)
    return (tuple(float(x) for x in toks), tuple(float(x) for x in measured),
            float(measured[-1] / curve_sum[-1]))


def measured_gpus(consts: Mapping[str, Any] | None = None) -> list[str]:
    """Catalogue GPUs with measured curves (the others are extrapolated from the nearest of them)."""
    return sorted((constants() if consts is None else consts).get("gpus", {}))


def unsupported(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1,
                consts: Mapping[str, Any] | None = None) -> str | None:
    """Why the measured model cannot price ``model`` on ``gpu`` with ``tp``, or None when it can.

    Every dense and mixture-of-experts model is priced on every catalogue GPU (GPUs without
    measurements extrapolated from the nearest measured one, :func:`reference_gpu`); left out
    is only a missing constants file. MLA's latent attention is priced from the same attention
    fit by its latent bytes and absorbed FLOPs (:func:`build`).
    """
    c = constants() if consts is None else consts
    _model(model), _gpu(gpu)  # unknown names raise here
    if not c.get("gpus"):
        return "no measured constants (data/costmodels/measured.json)"
    return None


def spec_distance(a: GPUSpec, b: GPUSpec) -> float:
    """How far two GPUs' specs lie apart: |log ratio| of HBM bandwidth plus that of dense BF16 peak."""
    return (abs(math.log(a.hbm_bandwidth_bytes_per_s / b.hbm_bandwidth_bytes_per_s))
            + abs(math.log(a.gemm_flops_per_s("bf16") / b.gemm_flops_per_s("bf16"))))


def peak_ratio(a: GPUSpec, b: GPUSpec) -> float:
    """``a``'s dense BF16 peak over ``b``'s."""
    return a.gemm_flops_per_s("bf16") / b.gemm_flops_per_s("bf16")


def reference_gpu(gpu: str | GPUSpec, consts: Mapping[str, Any] | None = None) -> str:
    """The measured GPU whose curves price ``gpu``: itself when measured, else the nearest by spec
    (:func:`spec_distance`: HBM bandwidth and compute; ties by name) among those that extrapolate
    (an entry with ``"extrapolate": false``, an engine's operator profile, prices only its own GPU)."""
    c = constants() if consts is None else consts
    g = _gpu(gpu)
    if g.name in c.get("gpus", {}):
        return g.name
    sources = [name for name, entry in c["gpus"].items() if entry.get("extrapolate", True)]
    return min(sorted(sources), key=lambda name: spec_distance(g, _gpu(name)))


def collectives_of(g: GPUSpec, ref: str, consts: Mapping[str, Any]) -> tuple[Mapping[str, Any], float, str]:
    """The measured network ``g``'s collectives run on, the bandwidth ratio that carries it to ``g``,
    and what the label says of it ("" where the GPU's entry names its only network).

    With GPU peer-to-peer (:attr:`GPUSpec.p2p`): the reference GPU's ``network``, carried by the
    interconnect ratio to the GPU it was measured on. Without: a network measured on a host that
    blocked peer-to-peer (``network_no_p2p``, :mod:`.host_collectives`): the reference GPU's own,
    else the one whose GPU is nearest in host link, carried by the host-link ratio.
    """
    entry = consts["gpus"][ref]
    if g.p2p:
        ic = g.interconnect_bytes_per_s / _gpu(entry.get("network_gpu", ref)).interconnect_bytes_per_s
        note = f"GPU peer-to-peer: {entry['network']} collectives" if "network_no_p2p" in entry else ""
        return consts["networks"][entry["network"]], ic, note  # a GPU measured both ways says which
    owners = sorted(n for n, e in consts["gpus"].items() if "network_no_p2p" in e)
    if not owners:
        raise ValueError(f"gpu {g.name!r} without peer-to-peer: no collectives measured without GPU peer-to-peer "
                         "in the constants")
    src = ref if ref in owners else min(owners, key=lambda n: abs(math.log(
        g.host_link_bytes_per_s / _gpu(n).host_link_bytes_per_s)))
    net = consts["gpus"][src]["network_no_p2p"]
    ratio = g.host_link_bytes_per_s / _gpu(src).host_link_bytes_per_s
    carried = "" if src == g.name else f" of {src} x{ratio:.2f} by host link"
    return consts["networks"][net], ratio, f"{NO_P2P}: {net} collectives{carried}"


def send_recv(gpu: str | GPUSpec, consts: Mapping[str, Any] | None = None) -> tuple[float, float]:
    """The fitted (latency_s, bytes_per_s) of one send between two GPUs of ``gpu``'s host
    (:func:`collectives_of`: a GPU without measurements its reference's, carried by link ratio)."""
    c = constants() if consts is None else consts
    g = _gpu(gpu)
    if not c.get("gpus"):
        raise ValueError(f"gpu {g.name!r} has no measured curves (no constants)")
    net, ratio, _ = collectives_of(g, reference_gpu(g, c), c)
    link = net["send_recv"]
    return float(link["latency_s"]), float(link["bytes_per_s"]) * ratio


def _allreduce_fit(net: Mapping[str, Any], tp: int) -> tuple[float, float]:
    """``(latency_s, s_per_byte)`` of the NCCL all-reduce over ``tp`` GPUs of one network: the
    fitted alpha-beta at ``tp``, else the nearest measured TP carried by the ring's step counts
    (latency x (tp - 1) / (tp0 - 1), seconds per byte x the ring factors' ratio)."""
    fits = net["all_reduce"]
    if str(tp) in fits:
        f = fits[str(tp)]
        return float(f["latency_s"]), float(f["s_per_byte"])
    tp0 = min((int(n) for n in fits), key=lambda n: (abs(math.log(n / tp)), n))
    f = fits[str(tp0)]
    ring = ((tp - 1) / tp) / ((tp0 - 1) / tp0)
    return float(f["latency_s"]) * (tp - 1) / (tp0 - 1), float(f["s_per_byte"]) * ring


#: vLLM's in-node custom all-reduce (``vllm/distributed/device_communicators/custom_all_reduce.py``,
#: releases 0.4-0.15): used for messages up to 8 MiB when every pair of the TP group has a
#: direct NVLink/NVSwitch path; above that size, and without such links, NCCL.
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2 ** 20


def _has_nvlink(g: GPUSpec) -> bool:
    """True when ``g``'s GPU-to-GPU link is faster than its host PCIe link (NVLink / NVSwitch)."""
    return g.interconnect_bytes_per_s > 1.01 * g.host_link_bytes_per_s


def attention_shapes(m: ModelSpec, tp: int) -> tuple[tuple[tuple[float, float], ...], float, float]:
    """The attention block's GEMMs ``(n, k)`` per GPU under ``tp``, and the query and key widths the
    rotary and norms touch (elements per token per GPU).

    Grouped-query attention: the fused QKV and the output projection. MLA, as vLLM builds
    ``DeepseekV2MLAAttention`` (module note): with a query rank the replicated fused down-projection
    ``(q_lora_rank + kv_lora_rank + rope, h)`` and ``q_b_proj``, else ``q_proj`` and the replicated
    ``kv_a_proj_with_mqa``; the key and value up-projections of ``kv_b_proj``; ``o_proj``.
    """
    h, d, heads = m.hidden_size, m.head_dim, m.num_q_heads / m.check_tp(tp)
    q = heads * d
    if not m.is_mla:
        kv = m.kv_heads_per_gpu(tp) * d
        return ((q + 2 * kv, h), (h, q)), q, kv
    latent = float(m.kv_lora_rank + m.qk_rope_head_dim)
    down = ((m.q_lora_rank + latent, h), (q, m.q_lora_rank)) if m.q_lora_rank else ((q, h), (latent, h))
    up = ((heads * (d - m.qk_rope_head_dim), m.kv_lora_rank), (heads * m.v_head_dim, m.kv_lora_rank))
    return (*down, *up, (h, heads * m.v_head_dim)), q, latent


def vllm_attention_backend(g: GPUSpec) -> str:
    """The attention backend vLLM runs by default on ``g`` (not MLA): ``"FA3"`` on compute capability 9.x,
    ``"FlashInfer"`` on 10.x, ``"FA2"`` on the other CUDA GPUs from 8.0, ``""`` where none of these
    (no capability stated, not a CUDA GPU). vLLM 0.15.1: ``vllm/v1/attention/backends/fa_utils.py``,
    ``get_flash_attn_version`` (FA3 on 9.x, else FA2); ``vllm/platforms/cuda.py``,
    ``_get_backend_priorities`` (FlashInfer first on 10.x, FlashAttention first elsewhere)."""
    cc = float(g.compute_capability)
    if cc < 8.0:
        return ""
    return {9: "FA3", 10: "FlashInfer"}.get(int(cc), "FA2")


def runs_fa2(g: GPUSpec) -> bool:
    """Whether vLLM runs FlashAttention 2 on ``g`` (:func:`vllm_attention_backend`). FA2 runs a batch that
    mixes prefills and decodes as one varlen call, in which each decode takes a query tile of the longest
    chunk and misses FA2's split-KV decode path (the FA2 split of vLLM pull request 58013, 2026-09, not in a
    release kvlab models), so the decodes read their context slower than in a decode-only batch; FA3's
    tile scheduler and FlashInfer's separate decode call do not."""
    return vllm_attention_backend(g) == "FA2"


def decode_attention_flops_per_pair_per_layer(m: ModelSpec) -> float:
    """FLOPs of one decode (query, key) pair in one layer, all heads: MLA's absorbed form,
    ``2 (kv_lora_rank + rope) + 2 kv_lora_rank`` per head (scores on the latent and rope key, the
    weighted sum of latents); ordinary attention as :attr:`ModelSpec.attention_flops_per_pair_per_layer`."""
    if not m.is_mla:
        return m.attention_flops_per_pair_per_layer
    return m.num_q_heads * (2.0 * (m.kv_lora_rank + m.qk_rope_head_dim) + 2.0 * m.kv_lora_rank)


def _precision_notes(m: ModelSpec, flops_ratio: float) -> list[str]:
    """What the label says about quantized weights (nothing for BF16)."""
    if m.weight_dtype == "fp8":
        return [f"FP8 weights: BF16 curve scaled by peak ratio (x{flops_ratio:.2f}), 1 byte a weight"]
    if m.weight_dtype == "int4":
        return [f"INT4 weights: {WEIGHT_DTYPES['int4']:.3f} bytes a weight, BF16 throughput"]
    return []


def check_kernels(kernels: str | None) -> str | None:
    """``kernels`` when it is None (today's engine kernels) or one of :data:`KERNEL_ERAS`, else ``ValueError``."""
    if kernels is not None and kernels not in KERNEL_ERAS:
        raise ValueError(f"kernels must be None (today's engines' measured kernels) or one of "
                         f"{', '.join(KERNEL_ERAS)}, got {kernels!r}")
    return kernels


def build(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
          constants: Mapping[str, Any], stack: str = "none", ep: int = 1,
          kernels: str | None = None, split_attention: bool = False) -> MeasuredCostModel:
    """The :class:`MeasuredCostModel` of ``model`` on ``gpu`` from the ``constants`` dictionary.

    :func:`measured` calls it with the shipped constants; :mod:`.fit` with freshly fitted ones.
    A GPU without measurements is priced from the nearest measured GPU (:func:`reference_gpu`) by
    spec ratios: GEMM and pointwise bandwidth terms by the HBM bandwidth ratio, throughput terms by
    the dense peak ratio, collective bandwidth by the interconnect ratio; its label says so.
    Attention (profiled on one A100, unless the GPU's family has its own) reaches every GPU the same way. ``ValueError`` names why
    when the constants cannot price the pair (:func:`unsupported`). ``ep`` is the expert-parallel
    degree of a mixture of experts (:meth:`MeasuredCostModel.layer_linear_s`). ``kernels``: the kernel
    era (module note; None: today's, or the one the ``stack`` states); a GPU without that era's
    measurements keeps today's. ``split_attention``: the server runs a mixed batch's prefill and decode
    attention as separate kernels (TensorRT-LLM), so its decodes pay no part of vLLM's varlen mixed-batch
    cost (the term measured on the RTX cards and carried to FA2 GPUs).
    """
    m, g = _model(model), _gpu(gpu)
    tp, pp, ep = v.positive_int(tp, "tp"), v.positive_int(pp, "pp"), v.positive_int(ep, "ep")
    if ep > 1 and (not m.is_moe or m.num_experts % ep):
        raise ValueError(f"ep={ep} needs a mixture of experts whose experts it divides; {m.name} has "
                         f"{m.num_experts} experts")
    if ep > 1 and ep % tp:
        raise ValueError(f"ep={ep} must be tp={tp} times the data-parallel ranks (vLLM's EP size is tp x dp)")
    why = unsupported(m, g, tp=tp, consts=constants)
    if why is not None:
        raise ValueError(f"the measured cost model cannot price {m.name} on {g.name} with tp={tp}: {why}")
    ref = reference_gpu(g, constants)
    stacks = constants.get("stacks", {})
    if stack != "none" and stack not in stacks:
        raise ValueError(f"stack {stack!r} is not one of {', '.join(['none', *stacks])}")
    over = {"overhead_s": 0.0, "overhead_s_per_seq": 0.0, "label": ""} if stack == "none" else stacks[stack]
    asked = check_kernels(kernels or over.get("kernels"))
    era = constants["gpus"][ref].get("eras", {}).get(asked)
    entry = dict(constants["gpus"][ref])
    if era:  # the era's own family and label, and no vLLM all-reduce measured on today's release
        entry.pop("engine_all_reduce", None)
        entry.update(era)
    fam = constants["families"][entry["family"]]
    prof = _gpu(fam["gpu"])  # the GPU the family's profiles ran on
    bw = g.hbm_bandwidth_bytes_per_s / prof.hbm_bandwidth_bytes_per_s
    fl = g.gemm_flops_per_s("bf16") / prof.gemm_flops_per_s("bf16")
    net, ic, p2p_note = collectives_of(g, ref, constants)
    ar_latency, ar_per_byte = _allreduce_fit(net, tp) if tp > 1 else (0.0, 0.0)
    ar_per_byte /= ic
    # vLLM's own TP all-reduce where measured on this GPU at this TP, with P2P: its custom line below the
    # split, its NCCL line above (measured on the GPU itself: nothing carried)
    own = entry.get("engine_all_reduce", {}) if g.p2p and ref == g.name else {}
    engine_ar = own.get("fits", {}).get(str(tp)) if tp > 1 else None
    if engine_ar:
        ar_latency, ar_per_byte = engine_ar["large"]["latency_s"], engine_ar["large"]["s_per_byte"]
        p2p_note = "; ".join(filter(None, [p2p_note, f"TP all-reduce: {own['source']}, measured"]))
    ep_latency, ep_per_byte = _allreduce_fit(net, ep // tp) if ep // tp > 1 else (0.0, 0.0)
    p2p_latency, p2p_bytes_per_s = float(net["send_recv"]["latency_s"]), float(net["send_recv"]["bytes_per_s"])
    full_nvlink = g.p2p and _has_nvlink(g) and tp <= int(net.get("full_nvlink_gpus", 0))
    h = m.hidden_size
    gate = 2 if m.gated_mlp else 1
    attention, q, kv = attention_shapes(m, tp)
    if m.is_moe:
        width = m.moe_intermediate_size or m.intermediate_size
        shared = m.num_shared_experts * width / tp  # the shared experts stay split by TP
        ff = width if ep > 1 else width / tp  # EP: whole experts per GPU
        dense = (*attention, (float(m.num_experts), h)) + (((gate * shared, h), (h, shared)) if shared else ())
        experts: tuple[tuple[float, float], ...] = ((gate * ff, h), (h, ff))
    else:
        ff = m.intermediate_size / tp
        dense, experts = (*attention, (gate * ff, h), (h, ff)), ()
    att = fam.get("attention", constants["attention"])  # a family's own attention profile, else the A100 one
    fa2 = constants.get("fa2_mixed_decode")
    kernels_of = g if g.compute_capability else _gpu(ref)  # capability not stated: the reference GPU's kernels
    carried_mixed = (fa2 is not None and runs_fa2(kernels_of) and "s_per_mixed_decode_kv_byte" not in att
                     and not split_attention)
    if carried_mixed:  # vLLM's FA2 path runs a mixed batch in one varlen call: the RTX cards' measured penalty
        att = {**att, "s_per_mixed_decode_kv_byte": fa2["ratio"] * att["s_per_kv_byte"]}
    split_note = split_attention and (runs_fa2(kernels_of) or "s_per_mixed_decode_kv_byte" in att)
    if split_attention:
        att = {k: x for k, x in att.items() if k != "s_per_mixed_decode_kv_byte"}
    att_gpu = _gpu(att["gpu"])
    att_bw = g.hbm_bandwidth_bytes_per_s / att_gpu.hbm_bandwidth_bytes_per_s
    att_fl = g.gemm_flops_per_s("bf16") / att_gpu.gemm_flops_per_s("bf16")
    layers = m.layers_per_gpu(pp)
    flops_per_pair_layer = m.attention_flops_per_pair_per_layer / tp
    decode_flops_per_pair_layer = decode_attention_flops_per_pair_per_layer(m) / tp
    kv_bytes = float(m.kv_bytes_per_token_per_layer(tp=tp))
    peak_bytes, peak_flops = g.hbm_bandwidth_bytes_per_s, g.gemm_flops_per_s("bf16")
    r = _gpu(ref)
    where = entry["label"] if ref == g.name else (
        f"extrapolated from {ref} by spec ratios: compute x{peak_ratio(g, r):.2f}, HBM bandwidth "
        f"x{g.hbm_bandwidth_bytes_per_s / r.hbm_bandwidth_bytes_per_s:.2f}"
        + (f", interconnect x{ic:.2f}" if g.p2p else ""))
    fg = fam["gemm"]
    pw = fam["pointwise"]
    head = GemmCurve(launch_s=fg["launch_s"], bytes_per_s=fg["bytes_per_s"] * bw, flops_per_s=fg["flops_per_s"] * fl,
                     half_tokens=fg["half_tokens"], sharpness=fg["sharpness"], peak_bytes_per_s=peak_bytes,
                     peak_flops_per_s=peak_flops)
    weights = g.gemm_flops_per_s(m.weight_dtype) / peak_flops  # FP8 weights: the FP8/BF16 dense-peak ratio
    layer_gemm = replace(head, flops_per_s=head.flops_per_s * weights, weight_bytes=WEIGHT_DTYPES[m.weight_dtype],
                         peak_flops_per_s=g.gemm_flops_per_s(m.weight_dtype))
    table = fam.get("gemm_table") if m.weight_dtype == "bf16" else None  # the table measured BF16 weights
    grid_tokens, grid_s, tail = table_correction(table, layer_gemm, dense) if table else ((), (), 1.0)
    notes = [*([f"{asked} kernels: {fam['label']}"] if era and ref != g.name else []),
             *(["MLA: latent cache, absorbed decode"] if m.is_mla else []), *_precision_notes(m, weights),
             *([f"FA2 mixed batches: decodes beside a prefill chunk read KV x{1 + fa2['ratio']:.2f} (the RTX cards' "
                "measured vLLM penalty; none in prefill-first batches)"]
               if carried_mixed else []),
             *(["attention split by phase: no vLLM FA2 mixed-batch penalty"] if split_note else []),
             *([p2p_note] if p2p_note and (tp > 1 or ep > 1) else [])]  # collectives only matter across GPUs
    return MeasuredCostModel(
        model_name=m.name, gpu_name=g.name, tp=tp, pp=pp,
        label=f"measured ({'; '.join([where, *notes])}{'' if stack == 'none' else ' + ' + over['label']})",
        num_layers=layers, hidden_size=h, gemm=layer_gemm, head_gemm=head,
        gemm_shapes=dense, expert_shapes=experts, linear_grid_tokens=grid_tokens, linear_grid_s=grid_s,
        linear_tail_scale=tail, num_experts=m.num_experts if m.is_moe else 0,
        experts_per_token=m.experts_per_token if m.is_moe else 0, expert_parallel=ep,
        ep_comm_latency_s=ep_latency, ep_comm_s_per_byte=ep_per_byte / ic,
        lm_head_shape=(m.vocab_size / tp, h), peak_bytes_per_s=peak_bytes, peak_flops_per_s=peak_flops,
        pointwise_s=pw["launch_s"], pointwise_s_per_element=pw["s_per_element"] / bw,
        pointwise_s_per_sharded_element=pw["s_per_sharded_element"] / bw, sharded_width=q + kv + ff,
        pointwise_bytes_per_token=2.0 * (4 * h + 6 * h + 2 * (q + kv) + (gate + 1) * ff),
        attention_s=att["launch_s"], attention_s_per_seq=att["s_per_seq"],
        attention_s_per_token=att["s_per_token"] / att_fl,
        attention_s_per_kv_token=att["s_per_kv_byte"] / att_bw * kv_bytes,
        attention_s_per_pair=att["s_per_flop"] / att_fl * flops_per_pair_layer,
        attention_s_per_decode_pair=att["s_per_flop"] / att_fl * decode_flops_per_pair_layer,
        attention_s_per_mixed_decode_kv_token=att.get("s_per_mixed_decode_kv_byte", 0.0) / att_bw * kv_bytes,
        attention_kv_bytes_per_token=kv_bytes, attention_flops_per_pair_layer=flops_per_pair_layer,
        attention_decode_flops_per_pair_layer=decode_flops_per_pair_layer,
        allreduces_per_layer=2.0 if tp > 1 else 0.0, activation_bytes_per_token=float(h * 2),
        allreduce_latency_s=ar_latency, allreduce_s_per_byte=ar_per_byte,
        custom_allreduce_max_bytes=(float(own["split_bytes"]) if engine_ar else float(CUSTOM_ALLREDUCE_MAX_BYTES)
                                    if full_nvlink and tp > 1 else 0.0),
        custom_allreduce_latency_s=engine_ar["small"]["latency_s"] if engine_ar else 0.0,
        custom_allreduce_s_per_byte=engine_ar["small"]["s_per_byte"] if engine_ar else 0.0,
        p2p_latency_s=p2p_latency, p2p_s_per_byte=1.0 / (p2p_bytes_per_s * ic),
        ring_factor=2.0 * (tp - 1) / tp, interconnect_bytes_per_s=g.peer_bytes_per_s,
        overhead_s=over["overhead_s"], overhead_s_per_seq=over["overhead_s_per_seq"], kernels=asked if era else None,
        linear_flops_per_token=2.0 * (m.num_active_params or m.num_params) / (tp * pp),
        attention_flops_per_pair=flops_per_pair_layer * layers,
    )


def measured(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
             stack: str = "none", ep: int = 1, kernels: str | None = None,
             split_attention: bool = False) -> MeasuredCostModel:
    """The measured :class:`MeasuredCostModel` of ``model`` on ``gpu`` with TP x PP GPUs.

    Parameters
    ----------
    model, gpu : str or spec
        Model and GPU (:mod:`kvlab.specs`): any model (dense, mixture of experts, MLA; BF16, FP8
        or INT4 weights) on any catalogue GPU (those outside :func:`measured_gpus` extrapolated);
        ``ValueError`` saying why where the constants cannot price it.
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages; the model prices one stage.
    stack : str
        Serving stack whose CPU overheads apply (a key of the constants' ``stacks``:
        ``"sarathi-serve"``), or ``"none"`` (default) for GPU time only.
    kernels : str or None
        The kernel era (module note): None (today's engines' kernels, or the stack's era), ``"2024"``.
    split_attention : bool
        The server runs a mixed batch's prefill and decode attention as separate kernels (:func:`build`).
    """
    return build(model, gpu, tp=tp, pp=pp, constants=constants(), stack=stack, ep=ep, kernels=kernels,
                 split_attention=split_attention)
