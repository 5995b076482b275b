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
* **attention**: a launch time, seconds per sequence, per token, per KV byte read (decode is
  memory-bound: its efficiency varies with batch and context through the fixed, per-sequence
  and per-byte terms together) and per attention FLOP (prefill's quadratic term), fitted to
  Vidur's A100 attention profile (FlashAttention) and carried to other GPUs by the ratios of
  their fitted GEMM bandwidth and throughput;
* **all-reduce(T)**: two per layer under TP, ``T x hidden x 2`` bytes each, read off the
  measured all-reduce curve of the GPU's interconnect for ``tp`` GPUs (median times in
  log-spaced size bins, interpolated in log-log);
* **lm_head(S)**: the vocabulary GEMM over one token per sequence, on the same GEMM curve;
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

import numpy as np

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
    allreduce_log2_bytes, allreduce_curve_s : tuple of float
        The all-reduce curve over ``tp`` GPUs: log2 of the message (bytes) and its time (seconds);
        empty when ``tp == 1``.
    activation_bytes_per_token : float
        Bytes of one token's hidden state (``hidden x 2``): the all-reduce message per token.
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
    attention_s_per_token: float
    attention_s_per_kv_token: float
    attention_s_per_pair: float
    allreduce_log2_bytes: tuple[float, ...]
    allreduce_curve_s: tuple[float, ...]
    activation_bytes_per_token: float
    overhead_s: float
    overhead_s_per_seq: float
    linear_flops_per_token: float
    attention_flops_per_pair: float

    def layer_linear_s(self, num_tokens: Any) -> Any:
        """The linear layers (GEMMs) of one layer over ``num_tokens`` tokens (seconds)."""
        return sum(self.gemm.time_s(num_tokens, n, k) for n, k in self.gemm_shapes)

    def allreduce_s(self, num_tokens: Any) -> Any:
        """One all-reduce of ``num_tokens`` tokens' hidden states over the ``tp`` GPUs (seconds)."""
        if not self.allreduce_curve_s:
            return 0.0 * num_tokens
        if isinstance(num_tokens, (int, float)):
            x = math.log2(max(num_tokens, 1) * self.activation_bytes_per_token)
            return float(np.interp(x, self.allreduce_log2_bytes, self.allreduce_curve_s))
        xp = array_namespace(num_tokens)
        x = xp.log2(xp.maximum(num_tokens, 1) * self.activation_bytes_per_token)
        return xp.interp(x, xp.asarray(self.allreduce_log2_bytes), xp.asarray(self.allreduce_curve_s))

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
        if not all(isinstance(x, (int, float)) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs)):
            xp = array_namespace(num_tokens, attention_pairs, kv_tokens, num_seqs)
            num_tokens, attention_pairs, kv_tokens, num_seqs = (
                xp.asarray(x, dtype=xp.float64) for x in (num_tokens, attention_pairs, kv_tokens, num_seqs))
        t = num_tokens
        layer = (self.layer_linear_s(t)
                 + self.pointwise_s + self.pointwise_s_per_element * self.hidden_size * t
                 + self.attention_s + self.attention_s_per_seq * num_seqs + self.attention_s_per_token * t
                 + self.attention_s_per_kv_token * kv_tokens + self.attention_s_per_pair * attention_pairs
                 + 2.0 * self.allreduce_s(t))
        return (self.num_layers * layer + self.gemm.time_s(num_seqs, *self.lm_head_shape)
                + self.overhead_s + self.overhead_s_per_seq * num_seqs)

    def marginal(self) -> MeasuredCostModel:
        """The cost of work riding iterations that run anyway (see :func:`kvlab.preemption_cost.piggyback`).

        GEMMs at their large-batch throughput with no weight reads or launches, attention
        without its launch, no per-iteration overhead and no vocabulary projection; per-sequence,
        per-token, per-byte and per-FLOP terms and the all-reduce stay.
        """
        return replace(self, label=f"{self.label}, marginal",
                       gemm=replace(self.gemm, launch_s=0.0, bytes_per_s=math.inf, half_tokens=0.0),
                       pointwise_s=0.0, attention_s=0.0, overhead_s=0.0, lm_head_shape=(0.0, 0.0))


@lru_cache(maxsize=1)
def constants() -> dict[str, Any]:
    """The shipped fitted constants (``data/costmodels/measured.json``); empty when absent."""
    if not CONSTANTS_PATH.exists():
        return {}
    with open(CONSTANTS_PATH, encoding="utf-8") as f:
        return json.load(f)


def measured_gpus(consts: Mapping[str, Any] | None = None) -> list[str]:
    """Catalogue GPUs with measured curves (the others fall back to the roofline)."""
    return sorted((constants() if consts is None else consts).get("gpus", {}))


def unsupported(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1,
                consts: Mapping[str, Any] | None = None) -> str | None:
    """Why the measured model cannot price ``model`` on ``gpu`` with ``tp``, or None when it can."""
    c = constants() if consts is None else consts
    m, g = _model(model), _gpu(gpu)
    entry = c.get("gpus", {}).get(g.name)
    if entry is None:
        return f"no GPU measurements for {g.name}"
    if m.is_moe or m.is_mla:
        return f"{m.name} is {'a mixture of experts' if m.is_moe else 'MLA'}; the measured curves are of dense models"
    if tp > 1 and str(tp) not in c["networks"][entry["network"]]["all_reduce"]:
        return f"no measured all-reduce over {tp} GPUs on {entry['network']}"
    return None


def send_recv(gpu: str | GPUSpec, consts: Mapping[str, Any] | None = None) -> tuple[float, float]:
    """The fitted (latency_s, bytes_per_s) of one send between two GPUs on ``gpu``'s interconnect."""
    c = constants() if consts is None else consts
    entry = c.get("gpus", {}).get(_gpu(gpu).name)
    if entry is None:
        raise ValueError(f"gpu {_gpu(gpu).name!r} has no measured curves")
    link = c["networks"][entry["network"]]["send_recv"]
    return float(link["latency_s"]), float(link["bytes_per_s"])


def build(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
          constants: Mapping[str, Any], stack: str = "none") -> MeasuredCostModel:
    """The :class:`MeasuredCostModel` of ``model`` on ``gpu`` from the ``constants`` dictionary.

    :func:`measured` calls it with the shipped constants; :mod:`.fit` with freshly fitted ones.
    ``ValueError`` names why when the constants cannot price the pair (:func:`unsupported`).
    """
    m, g = _model(model), _gpu(gpu)
    tp, pp = v.positive_int(tp, "tp"), v.positive_int(pp, "pp")
    why = unsupported(m, g, tp=tp, consts=constants)
    if why is not None:
        raise ValueError(f"the measured cost model cannot price {m.name} on {g.name} with tp={tp}: {why} "
                         f"(measured GPUs: {', '.join(measured_gpus(constants)) or 'none'})")
    entry = constants["gpus"][g.name]
    fam = constants["families"][entry["family"]]
    stacks = constants.get("stacks", {})
    if stack != "none" and stack not in stacks:
        raise ValueError(f"stack {stack!r} is not one of {', '.join(['none', *stacks])}")
    over = {"overhead_s": 0.0, "overhead_s_per_seq": 0.0, "label": ""} if stack == "none" else stacks[stack]
    curve = constants["networks"][entry["network"]]["all_reduce"][str(tp)] if tp > 1 else \
        {"log2_bytes": [], "time_s": []}
    d = m.head_dim
    q = m.num_q_heads * d / tp
    kv = m.kv_heads_per_gpu(tp) * d
    ff = m.intermediate_size / tp
    h = m.hidden_size
    att = fam["attention"]
    scale = float(entry.get("bytes_scale", 1.0))  # HBM bandwidth of this SKU relative to the profiled one
    layers = m.layers_per_gpu(pp)
    flops_per_pair_layer = m.attention_flops_per_pair_per_layer / tp
    return MeasuredCostModel(
        model_name=m.name, gpu_name=g.name, tp=tp, pp=pp,
        label=f"measured ({entry['label']}{'' if stack == 'none' else ' + ' + over['label']})",
        num_layers=layers, hidden_size=h,
        gemm=replace(GemmCurve(**fam["gemm"]), bytes_per_s=fam["gemm"]["bytes_per_s"] * scale),
        gemm_shapes=((q + 2 * kv, h), (h, q), ((2 if m.gated_mlp else 1) * ff, h), (h, ff)),
        lm_head_shape=(m.vocab_size / tp, h),
        pointwise_s=fam["pointwise"]["launch_s"], pointwise_s_per_element=fam["pointwise"]["s_per_element"] / scale,
        attention_s=att["launch_s"], attention_s_per_seq=att["s_per_seq"], attention_s_per_token=att["s_per_token"],
        attention_s_per_kv_token=att["s_per_kv_byte"] / scale * m.kv_bytes_per_token_per_layer(tp=tp),
        attention_s_per_pair=att["s_per_flop"] * flops_per_pair_layer,
        allreduce_log2_bytes=tuple(curve["log2_bytes"]), allreduce_curve_s=tuple(curve["time_s"]),
        activation_bytes_per_token=float(h * 2),
        overhead_s=over["overhead_s"], overhead_s_per_seq=over["overhead_s_per_seq"],
        linear_flops_per_token=2.0 * (m.num_active_params or m.num_params) / (tp * pp),
        attention_flops_per_pair=flops_per_pair_layer * layers,
    )


def measured(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
             stack: str = "none") -> MeasuredCostModel:
    """The measured :class:`MeasuredCostModel` of ``model`` on ``gpu`` with TP x PP GPUs.

    Parameters
    ----------
    model, gpu : str or spec
        Model and GPU (:mod:`kvlab.specs`); a dense model on a GPU of :func:`measured_gpus`,
        else ``ValueError`` saying why.
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages; the model prices one stage.
    stack : str
        Serving stack whose CPU overheads apply (a key of the constants' ``stacks``:
        ``"sarathi-serve"``), or ``"none"`` (default) for GPU time only.
    """
    return build(model, gpu, tp=tp, pp=pp, constants=constants(), stack=stack)
