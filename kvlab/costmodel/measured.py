"""The measured cost model: iteration time from curves fitted to public GPU measurements.

One iteration on one GPU (one pipeline stage of ``layers`` layers, ``tp`` GPUs per stage) costs

    layers x (linear(T) + pointwise(T) + attention(P, K, S) + all-reduce(T))
    + lm_head(S) + overhead_s + overhead_s_per_seq x S

for ``T`` tokens computed, ``P`` causal (query, key) pairs, ``K`` KV tokens read (context after
the iteration, summed over sequences) and ``S`` sequences scheduled:

* **linear(T)**: the layer's four GEMMs (QKV, attention output, MLP up (+ gate), MLP down), each
  ``T x k @ k x n`` (per-GPU shapes under TP) priced by the GPU's fitted GEMM curve
  (:class:`GemmCurve`): a smooth maximum of the bytes moved over a fitted bandwidth and the
  FLOPs over a token-count-dependent throughput ``F T / (T + T_half)``, plus a launch time.
  Fitted per GPU to Vidur's per-operation profiles of several models and TP degrees, so any
  model shape gets a prediction from its GEMM sizes;
* **pointwise(T)**: norms, rotary embedding, activation, residual add: a launch time plus
  seconds per token-element (``T x hidden``);
* **attention**: a launch time, seconds per sequence, seconds per KV byte read (decode is
  memory-bound; efficiency depends on batch and context through the per-sequence term) and
  seconds per attention FLOP (prefill's quadratic term), fitted to Vidur's A100 attention profile
  (FlashAttention) and carried to other GPUs by their HBM bandwidth and FLOP/s ratios;
* **all-reduce(T)**: two per layer under TP, ``T x hidden x 2`` bytes each, from the fitted
  latency and bandwidth of the measured collective curve of the GPU's interconnect;
* **lm_head(S)**: the vocabulary GEMM over one token per sequence, on the same GEMM curve;
* **overheads**: per iteration and per sequence (CPU scheduling, input preparation, sampling),
  fitted to Sarathi-Serve's measured batch times after the GPU terms above: a property of that
  serving stack (Sarathi-Serve on vLLM 0.2-era Python workers), applied as is on every GPU.

The inputs are aggregates over the batch, as for the roofline, so one call prices many
iterations at once on NumPy or CuPy arrays. The constants live in
``data/costmodels/measured.json`` (written by :mod:`kvlab.costmodel.fit`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from .. import _validate as v
from .._paths import DATA_DIR
from ..backend import array_namespace
from ..specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model

CONSTANTS_PATH = DATA_DIR / "costmodels" / "measured.json"


@dataclass(frozen=True, kw_only=True)
class GemmCurve:
    """Fitted time of one ``M x k @ k x n`` GEMM on one GPU (``M`` = tokens).

    ``t = launch_s + (mem^p + comp^p)^(1/p)`` with ``mem = dtype_bytes (M k + k n + M n) / bytes_per_s``
    and ``comp = 2 n k (M + half_tokens) / flops_per_s`` (throughput ``flops_per_s x M / (M +
    half_tokens)``: small token counts under-use the tensor cores), ``p = sharpness``.
    """

    launch_s: float
    bytes_per_s: float
    flops_per_s: float
    half_tokens: float
    sharpness: float
    dtype_bytes: int = 2

    def time_s(self, m: Any, n: float, k: float) -> Any:
        """Seconds of ``m`` x ``k`` @ ``k`` x ``n`` GEMMs (``m`` scalar or array)."""
        mem = self.dtype_bytes * (m * (k + n) + k * n) / self.bytes_per_s
        comp = 2.0 * n * k * (m + self.half_tokens) / self.flops_per_s
        p = self.sharpness
        return self.launch_s + (mem ** p + comp ** p) ** (1.0 / p)


@dataclass(frozen=True, kw_only=True)
class MeasuredCostModel:
    """Iteration time of one model on one GPU configuration from fitted measured curves.

    Build it with :func:`measured` (or ``kvlab.costmodel.cost_model(..., source="measured")``).
    Times are seconds, per GPU of one pipeline stage; see the module note for the terms.

    Attributes
    ----------
    label : str
        Readable name of the model and the data it rests on (recorded in every result).
    gemm_shapes : tuple of (n, k)
        The layer's GEMMs per GPU (output and input features).
    lm_head_shape : tuple of (n, k)
        The vocabulary projection per GPU.
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
    gemm_shapes: tuple[tuple[float, float], ...]
    lm_head_shape: tuple[float, float]
    pointwise_s: float
    pointwise_s_per_element: float
    attention_s: float
    attention_s_per_seq: float
    attention_s_per_kv_token: float
    attention_s_per_pair: float
    allreduce_s: float
    allreduce_s_per_token: float
    overhead_s: float
    overhead_s_per_seq: float
    linear_flops_per_token: float
    attention_flops_per_pair: float

    def layer_linear_s(self, num_tokens: Any) -> Any:
        """The linear layers (GEMMs) of one layer over ``num_tokens`` tokens (seconds)."""
        return sum(self.gemm.time_s(num_tokens, n, k) for n, k in self.gemm_shapes)

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
        scalar = all(isinstance(x, (int, float)) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs))
        if not scalar:
            xp = array_namespace(num_tokens, attention_pairs, kv_tokens, num_seqs)
            num_tokens, attention_pairs, kv_tokens, num_seqs = (
                xp.asarray(x, dtype=xp.float64) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs))
        t = num_tokens
        layer = (self.layer_linear_s(t)
                 + self.pointwise_s + self.pointwise_s_per_element * t * self.hidden_size
                 + self.attention_s + self.attention_s_per_seq * num_seqs
                 + self.attention_s_per_kv_token * kv_tokens + self.attention_s_per_pair * attention_pairs
                 + self.allreduce_s + self.allreduce_s_per_token * t)
        return (self.num_layers * layer + self.gemm.time_s(num_seqs, *self.lm_head_shape)
                + self.overhead_s + self.overhead_s_per_seq * num_seqs)

    def marginal(self) -> MeasuredCostModel:
        """The cost of work riding iterations that run anyway (see :func:`kvlab.preemption_cost.piggyback`).

        GEMMs at their large-batch throughput with no weight reads or launches, attention and
        all-reduce without their fixed times, no per-iteration overhead; per-sequence and
        per-byte terms stay (one more sequence in the batch still costs them).
        """
        return replace(self, label=f"{self.label}, marginal",
                       gemm=replace(self.gemm, launch_s=0.0, bytes_per_s=math.inf, half_tokens=0.0),
                       pointwise_s=0.0, attention_s=0.0, allreduce_s=0.0, overhead_s=0.0, lm_head_shape=(0.0, 0.0))


@lru_cache(maxsize=1)
def constants() -> dict[str, Any]:
    """The shipped fitted constants (``data/costmodels/measured.json``); empty when absent."""
    if not CONSTANTS_PATH.exists():
        return {}
    with open(CONSTANTS_PATH, encoding="utf-8") as f:
        return json.load(f)


def _gpu_entry(gpu_name: str) -> dict[str, Any] | None:
    return constants().get("gpus", {}).get(gpu_name)


def measured_gpus() -> list[str]:
    """Catalogue GPUs with measured curves (the others fall back to the roofline)."""
    return sorted(constants().get("gpus", {}))


def has_measurements(gpu: str | GPUSpec) -> bool:
    """Whether ``gpu`` has measured curves (compute profiles of its family)."""
    return _gpu_entry(_gpu(gpu).name) is not None


def send_recv(gpu: str | GPUSpec) -> tuple[float, float]:
    """Fitted (latency_s, bytes_per_s) of one stage-to-stage send on ``gpu``'s interconnect."""
    entry = _gpu_entry(_gpu(gpu).name)
    if entry is None:
        raise ValueError(f"gpu {_gpu(gpu).name!r} has no measured curves")
    sr = constants()["networks"][entry["network"]]["send_recv"]
    return float(sr["latency_s"]), float(sr["bytes_per_s"])


def measured(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
             stack: str = "sarathi-serve") -> MeasuredCostModel:
    """The measured :class:`MeasuredCostModel` of ``model`` on ``gpu`` with TP x PP GPUs.

    Parameters
    ----------
    model, gpu : str or spec
        Model and GPU (:mod:`kvlab.specs`); ``gpu`` must have measurements
        (:func:`measured_gpus`), else ``ValueError``.
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages; the model prices one stage.
    stack : str
        Serving stack whose CPU overheads apply (a key of the constants' ``stacks``), or
        ``"none"`` for GPU time only.
    """
    m, g = _model(model), _gpu(gpu)
    tp, pp = v.positive_int(tp, "tp"), v.positive_int(pp, "pp")
    entry = _gpu_entry(g.name)
    if entry is None:
        raise ValueError(f"gpu {g.name!r} has no measured curves; measured GPUs: {', '.join(measured_gpus())}")
    c = constants()
    fam = c["families"][entry["family"]]
    stacks = c.get("stacks", {})
    if stack != "none" and stack not in stacks:
        raise ValueError(f"stack {stack!r} is not one of {', '.join(['none', *stacks])}")
    over = {"overhead_s": 0.0, "overhead_s_per_seq": 0.0} if stack == "none" else stacks[stack]
    net = c["networks"][entry["network"]]
    ar = net["all_reduce"].get(str(tp)) if tp > 1 else {"latency_s": 0.0, "bytes_per_s": math.inf}
    if ar is None:
        raise ValueError(f"no measured all-reduce over {tp} GPUs on {entry['network']}; "
                         f"measured: {', '.join(net['all_reduce'])}")
    layers = m.layers_per_gpu(pp)
    d = m.head_dim
    q = m.num_q_heads * d / tp
    kv = m.kv_heads_per_gpu(tp) * d
    ff = m.intermediate_size / tp
    h = m.hidden_size
    shapes = ((q + 2 * kv, h), (h, q), ((2 if m.gated_mlp else 1) * ff, h), (h, ff))
    att = fam["attention"]
    kv_bytes_per_token_layer = 2 * kv * 2
    flops_per_pair_layer = 4.0 * q
    return MeasuredCostModel(
        model_name=m.name, gpu_name=g.name, tp=tp, pp=pp,
        label=f"measured ({entry['label']}{'' if stack == 'none' else ' + ' + stacks[stack]['label']})",
        num_layers=layers, hidden_size=h,
        gemm=GemmCurve(**fam["gemm"]), gemm_shapes=shapes, lm_head_shape=(m.vocab_size / tp, h),
        pointwise_s=fam["pointwise"]["launch_s"],
        pointwise_s_per_element=fam["pointwise"]["s_per_element"],
        attention_s=att["launch_s"], attention_s_per_seq=att["s_per_seq"],
        attention_s_per_kv_token=att["s_per_kv_byte"] * kv_bytes_per_token_layer,
        attention_s_per_pair=att["s_per_flop"] * flops_per_pair_layer,
        allreduce_s=2 * ar["latency_s"], allreduce_s_per_token=2 * h * 2 / ar["bytes_per_s"],
        overhead_s=over["overhead_s"], overhead_s_per_seq=over["overhead_s_per_seq"],
        linear_flops_per_token=2.0 * m.num_params / (tp * pp),
        attention_flops_per_pair=flops_per_pair_layer * layers,
    )
