"""The spec-sheet roofline: iteration latency from model and GPU data sheets alone.

One iteration runs a forward pass over every token scheduled in it: prefill chunks (with the
context already cached before them) and one token per decoding sequence. Its time is

    max(compute, memory) + tensor-parallel all-reduce + fixed overhead

* compute = (2 x active params x tokens + layers x FLOPs per pair x attention_pairs) / TP
  / (peak dense BF16 FLOP/s x ``compute_efficiency``); active params are those one token passes
  through (a mixture of experts counts its ``experts_per_token`` experts); FLOPs per pair are
  ``2 q_heads (head_dim + v_head_dim)`` (``4 q_heads head_dim`` for ordinary attention);
  ``attention_pairs`` counts (query, key) pairs of causal attention: a decode at context L adds
  L, a prefill chunk of c tokens after k cached tokens adds c k + c (c + 1) / 2 (quadratic in sequence length);
* memory = (weights per GPU + KV bytes per token per GPU x ``kv_tokens``) / (HBM bandwidth x
  ``bandwidth_efficiency``); ``kv_tokens`` sums each scheduled sequence's context after the
  iteration (the cache it reads plus the tokens it writes);
* all-reduce: two per layer, ring, 2 (TP - 1) / TP x tokens x hidden x dtype bytes over the GPU
  interconnect, plus a latency per all-reduce.

The inputs are aggregates (sums over the batch), so one call prices many iterations or
configurations at once on NumPy or CuPy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _validate as v
from ..backend import array_namespace
from ..specs import NO_P2P, GPUSpec, ModelSpec, gpu as _gpu, model as _model


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Per-GPU roofline constants of one model on one GPU configuration.

    Build it with :func:`roofline`. All fields are per GPU, in FLOPs, bytes and seconds;
    ``label`` names where the constants come from (shown in every result that ran with it).
    """

    model_name: str
    gpu_name: str
    tp: int
    pp: int
    linear_flops_per_token: float
    attention_flops_per_pair: float
    weight_bytes: float
    kv_bytes_per_token: float
    effective_flops_per_s: float
    effective_bytes_per_s: float
    allreduce_bytes_per_token: float
    allreduce_latency_s_per_iteration: float
    interconnect_bytes_per_s: float
    iteration_overhead_s: float
    label: str = "roofline (spec sheet)"

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
            Sequences scheduled in the iteration (prefill chunks + decodes); the roofline has no
            per-sequence term and ignores it (measured models use it).
        """
        compute = (self.linear_flops_per_token * num_tokens
                   + self.attention_flops_per_pair * attention_pairs) / self.effective_flops_per_s
        memory = (self.weight_bytes + self.kv_bytes_per_token * kv_tokens) / self.effective_bytes_per_s
        comm = self.allreduce_bytes_per_token * num_tokens / self.interconnect_bytes_per_s \
            + self.allreduce_latency_s_per_iteration
        if isinstance(compute, float) and isinstance(memory, float):  # one iteration: skip array dispatch
            return max(compute, memory) + comm + self.iteration_overhead_s
        xp = array_namespace(compute, memory)
        return xp.maximum(compute, memory) + comm + self.iteration_overhead_s


def prefill_attention_pairs(chunk_tokens: Any, context_tokens: Any) -> Any:
    """Causal attention pairs of a prefill chunk of ``chunk_tokens`` after ``context_tokens`` cached.

    ``chunk x context + chunk (chunk + 1) / 2`` (token pairs; exact integers).
    """
    return chunk_tokens * context_tokens + chunk_tokens * (chunk_tokens + 1) // 2


def roofline(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1, dtype_bytes: int | None = None,
             compute_efficiency: float = 0.6, bandwidth_efficiency: float = 0.8,
             iteration_overhead_s: float = 0.002, allreduce_latency_s: float = 10e-6,
             label: str = "roofline (spec sheet)") -> CostModel:
    """The roofline :class:`CostModel` of ``model`` on ``gpu`` with TP x PP GPUs.

    Parameters
    ----------
    compute_efficiency : float
        Achieved share of peak dense FLOP/s, in (0, 1] (model FLOPs utilisation of GEMMs).
    bandwidth_efficiency : float
        Achieved share of peak HBM bandwidth, in (0, 1].
    iteration_overhead_s : float
        Fixed per-iteration cost: scheduling, kernel launches, sampling (seconds).
    allreduce_latency_s : float
        Latency of one all-reduce under TP > 1 (seconds); two per layer.
    label : str
        Readable name recorded by results (say where non-default constants come from).

    Under pipeline parallelism ``pp`` the constants describe one stage (layers / PP). Weights,
    KV and the GEMM peak follow the model's precision (``kvlab.specs.with_precision``: FP8
    weights at the GPU's FP8 peak where it has one); ``dtype_bytes`` forces one byte width on
    weights, KV and activations.
    """
    m, g = _model(model), _gpu(gpu)
    tp, pp = v.positive_int(tp, "tp"), v.positive_int(pp, "pp")
    compute_efficiency = v.fraction(compute_efficiency, "compute_efficiency")
    bandwidth_efficiency = v.fraction(bandwidth_efficiency, "bandwidth_efficiency")
    iteration_overhead_s = v.nonnegative_float(iteration_overhead_s, "iteration_overhead_s")
    allreduce_latency_s = v.nonnegative_float(allreduce_latency_s, "allreduce_latency_s")
    layers = m.layers_per_gpu(pp)
    ring = 2.0 * (tp - 1) / tp
    return CostModel(
        model_name=m.name, gpu_name=g.name, tp=tp, pp=pp,
        linear_flops_per_token=2.0 * m.num_active_params / (tp * pp),
        attention_flops_per_pair=layers * m.attention_flops_per_pair_per_layer / tp,
        weight_bytes=m.weight_bytes_per_gpu(tp=tp, pp=pp, dtype_bytes=dtype_bytes),
        kv_bytes_per_token=float(m.kv_bytes_per_token(tp=tp, pp=pp, dtype_bytes=dtype_bytes)),
        effective_flops_per_s=g.gemm_flops_per_s(m.weight_dtype) * compute_efficiency,
        effective_bytes_per_s=g.hbm_bandwidth_bytes_per_s * bandwidth_efficiency,
        allreduce_bytes_per_token=2 * layers * ring * m.hidden_size * (2 if dtype_bytes is None else dtype_bytes),
        allreduce_latency_s_per_iteration=(2 * layers * allreduce_latency_s) if tp > 1 else 0.0,
        interconnect_bytes_per_s=g.peer_bytes_per_s,
        iteration_overhead_s=iteration_overhead_s,
        label=str(label) + ("" if g.p2p or tp == 1 else f", {NO_P2P}: half the host link"),
    )
