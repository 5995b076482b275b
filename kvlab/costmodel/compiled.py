"""The cost models' ``iteration_s`` for one iteration, compiled by Numba for the compiled engine loop.

The compiled loop (:mod:`kvlab.sim.fast`) prices each iteration as it runs, so it cannot call a
Python method; each model is flattened to a kind code and a float vector of its constants
(:func:`constants`). One description per model, a tuple of field names (:data:`ROOFLINE_FIELDS`,
:data:`MEASURED_FIELDS`, :data:`STACKED_FIELDS`, :data:`PIPELINE_FIELDS`; a dotted name reaches
into a nested dataclass or a tuple), builds the vector by name, and the compiled formulas read it
by the same names (an index per name, :func:`layout`), never by a position written by hand.
:func:`iteration_s` repeats each model's formula on Python scalars, term by term in the same
order, so that both give the same float (the tests perturb every field and compare). A stack
(:class:`~kvlab.costmodel.stacks.StackedCostModel`) and a pipeline
(:class:`~kvlab.costmodel.pipeline.PipelineCostModel`) carry their inner model's vector after
their own fields. A model without a compiled form (a user's own class, a subclass that may
override ``iteration_s``) gives ``None`` and the engine keeps its array path.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any

from .._numba_cache import njit
import numpy as np

from .measured import MeasuredCostModel
from .pipeline import PipelineCostModel
from .roofline import CostModel
from .stacks import StackedCostModel

ROOFLINE, MEASURED, STACKED, PIPELINE = 0, 1, 2, 3

#: The roofline's constants, by field name (:class:`~kvlab.costmodel.roofline.CostModel`).
ROOFLINE_FIELDS = ("linear_flops_per_token", "attention_flops_per_pair", "effective_flops_per_s", "weight_bytes",
                   "kv_bytes_per_token", "effective_bytes_per_s", "allreduce_bytes_per_token",
                   "interconnect_bytes_per_s", "allreduce_latency_s_per_iteration", "iteration_overhead_s")
#: One GEMM curve's constants (:class:`~kvlab.costmodel.measured.GemmCurve`), in the order the
#: measured model's two curves (``gemm``, ``head_gemm``) carry them.
GEMM_FIELDS = ("launch_s", "bytes_per_s", "flops_per_s", "half_tokens", "sharpness", "dtype_bytes", "weight_bytes",
               "peak_bytes_per_s", "peak_flops_per_s")
#: The measured model's scalar constants (:class:`~kvlab.costmodel.measured.MeasuredCostModel`);
#: its GEMM shapes follow them (:data:`MEASURED_SHAPES`: a count, then ``n, k`` per shape).
MEASURED_FIELDS = (
    "num_layers", "hidden_size", "tp", *(f"gemm.{f}" for f in GEMM_FIELDS), *(f"head_gemm.{f}" for f in GEMM_FIELDS),
    "num_experts", "experts_per_token", "expert_parallel", "lm_head_shape.0", "lm_head_shape.1", "peak_bytes_per_s",
    "peak_flops_per_s", "pointwise_s", "pointwise_s_per_element", "pointwise_s_per_sharded_element", "sharded_width",
    "pointwise_bytes_per_token", "attention_s", "attention_s_per_seq", "attention_s_per_token",
    "attention_s_per_kv_token", "attention_s_per_pair", "attention_s_per_decode_pair", "attention_kv_bytes_per_token",
    "attention_flops_per_pair_layer", "attention_decode_flops_per_pair_layer", "allreduces_per_layer",
    "activation_bytes_per_token", "allreduce_latency_s", "allreduce_s_per_byte", "custom_allreduce_max_bytes",
    "p2p_latency_s", "p2p_s_per_byte", "ring_factor", "interconnect_bytes_per_s", "gpu_time_scale", "overhead_s", "overhead_s_per_seq")
MEASURED_SHAPES = ("gemm_shapes", "expert_shapes")
#: A stack over any compiled model (:class:`~kvlab.costmodel.stacks.StackedCostModel`); the base's
#: kind and vector follow.
STACKED_FIELDS = ("terms.gpu_time_scale", "terms.overhead_s", "terms.overhead_s_per_seq", "terms.overlap")
#: A pipeline over any compiled stage (:class:`~kvlab.costmodel.pipeline.PipelineCostModel`): then
#: the peers' count ``n`` (0: none), their sorted times, ``F^k`` and tail sums (``n``, ``n + 1``,
#: ``n + 1`` floats, :func:`~kvlab.costmodel.pipeline.max_table`), the stage's kind and vector.
PIPELINE_FIELDS = ("pp", "activation_bytes_per_token", "send_latency_s", "link_bytes_per_s")


def layout(fields: tuple[str, ...]) -> Any:
    """The index of each field of a description, as attributes (dots become underscores)."""
    names = [f.replace(".", "_") for f in fields]
    return namedtuple("Layout", names)(*range(len(names)))


R, M, S, P, G = (layout(f) for f in (ROOFLINE_FIELDS, MEASURED_FIELDS, STACKED_FIELDS, PIPELINE_FIELDS, GEMM_FIELDS))


def field_value(obj: Any, name: str) -> float:
    """The value of a (dotted) field of ``obj``: ``"gemm.launch_s"``, ``"lm_head_shape.0"``."""
    for part in name.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return float(obj)


def _vector(cost: Any, fields: tuple[str, ...]) -> list[float]:
    return [field_value(cost, f) for f in fields]


def _flat(cost: Any) -> list[float] | None:
    """``[kind, *constants]`` of a model with a compiled form, else ``None``."""
    if type(cost) is CostModel:
        return [ROOFLINE, *_vector(cost, ROOFLINE_FIELDS)]
    if type(cost) is MeasuredCostModel:
        out = [MEASURED, *_vector(cost, MEASURED_FIELDS)]
        for name in MEASURED_SHAPES:
            shapes = getattr(cost, name)
            out += [len(shapes), *(float(x) for shape in shapes for x in shape)]
        return out
    if type(cost) is StackedCostModel:
        base = _flat(cost.base)
        return None if base is None else [STACKED, *_vector(cost, STACKED_FIELDS), *base]
    if type(cost) is PipelineCostModel:
        stage = _flat(cost.stage)
        if stage is None:
            return None
        table: list[float] = [0.0]
        if cost.peer_stage_s is not None and cost.pp > 1:
            x, cdf_k, tail = cost.peer_table
            table = [len(x), *x, *cdf_k, *tail]
        return [PIPELINE, *_vector(cost, PIPELINE_FIELDS), *table, *stage]
    return None


def constants(cost: Any) -> tuple[int, np.ndarray] | None:
    """``(kind, constants)`` of a cost model :func:`iteration_s` can price, else ``None``."""
    flat = _flat(cost)
    if flat is None:
        return None
    return int(flat[0]), np.array(flat[1:], dtype=np.float64)


@njit(nogil=True, inline="always")
def _roofline_s(c, o, t, pairs, kv):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.roofline.CostModel.iteration_s` with its constants at ``c[o:]``."""
    compute = (c[o + R.linear_flops_per_token] * t + c[o + R.attention_flops_per_pair] * pairs) \
        / c[o + R.effective_flops_per_s]
    memory = (c[o + R.weight_bytes] + c[o + R.kv_bytes_per_token] * kv) / c[o + R.effective_bytes_per_s]
    comm = c[o + R.allreduce_bytes_per_token] * t / c[o + R.interconnect_bytes_per_s] \
        + c[o + R.allreduce_latency_s_per_iteration]
    return max(compute, memory) + comm + c[o + R.iteration_overhead_s]


@njit(nogil=True, inline="always")
def _gemm_s(c, g, m, n, k, launches):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.measured.GemmCurve.time_s` with the curve's constants at ``c[g:]``."""
    moved = c[g + G.dtype_bytes] * m * (k + n) + c[g + G.weight_bytes] * k * n
    mem = moved / c[g + G.bytes_per_s]
    comp = 2.0 * n * k * (m + c[g + G.half_tokens]) / c[g + G.flops_per_s]
    p = c[g + G.sharpness]
    curve = launches * c[g + G.launch_s] + (mem ** p + comp ** p) ** (1.0 / p)
    floor = max(moved / c[g + G.peak_bytes_per_s], 2.0 * n * k * m / c[g + G.peak_flops_per_s])
    return max(curve, floor)


@njit(nogil=True, inline="always")
def _measured_s(c, o, t, pairs, kv, s):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.measured.MeasuredCostModel.iteration_s` with its constants at ``c[o:]``."""
    at = o + len(M)
    lin, head = o + M.gemm_launch_s, o + M.head_gemm_launch_s
    num_dense = int(c[at])
    linear = 0.0
    for i in range(num_dense):
        linear += _gemm_s(c, lin, t, c[at + 1 + 2 * i], c[at + 2 + 2 * i], 1.0)
    at += 1 + 2 * num_dense
    num_expert = int(c[at])
    if c[o + M.num_experts] > 0:
        e, k_tok, ep = c[o + M.num_experts], c[o + M.experts_per_token], c[o + M.expert_parallel]
        touched = e / ep * (1.0 - (1.0 - k_tok / e) ** (t * ep))
        per = t * k_tok / max(touched, 1.0)
        experts = 0.0
        for i in range(num_expert):
            experts += c[o + M.gemm_launch_s] + touched * _gemm_s(c, lin, per, c[at + 1 + 2 * i], c[at + 2 + 2 * i], 0.0)
        linear = linear + experts
        if ep > 1:
            moved = (ep - 1.0) / ep * t * k_tok * c[o + M.activation_bytes_per_token]
            linear = linear + 2.0 * (c[o + M.p2p_latency_s] + moved / c[o + M.interconnect_bytes_per_s])
    pointwise = max(c[o + M.pointwise_s] + c[o + M.pointwise_s_per_element] * c[o + M.hidden_size] * t
                    + c[o + M.pointwise_s_per_sharded_element] * c[o + M.sharded_width] * t,
                    c[o + M.pointwise_bytes_per_token] * t / c[o + M.peak_bytes_per_s])
    decode = min(pairs, kv)
    prefill = pairs - decode
    flops = c[o + M.attention_flops_per_pair_layer] * prefill + c[o + M.attention_decode_flops_per_pair_layer] * decode
    attention = max(c[o + M.attention_s] + c[o + M.attention_s_per_seq] * s + c[o + M.attention_s_per_token] * t
                    + c[o + M.attention_s_per_kv_token] * kv + c[o + M.attention_s_per_pair] * prefill
                    + c[o + M.attention_s_per_decode_pair] * decode,
                    max(c[o + M.attention_kv_bytes_per_token] * kv / c[o + M.peak_bytes_per_s],
                        flops / c[o + M.peak_flops_per_s]))
    allreduce = 0.0
    if c[o + M.allreduces_per_layer] != 0.0:
        b = c[o + M.activation_bytes_per_token] * t
        allreduce = c[o + M.allreduce_latency_s] + c[o + M.allreduce_s_per_byte] * b
        if c[o + M.custom_allreduce_max_bytes] > 0:
            tp = c[o + M.tp]
            one = c[o + M.p2p_latency_s] + (tp - 1) * c[o + M.p2p_s_per_byte] * b
            two = 2.0 * c[o + M.p2p_latency_s] + 2.0 * (tp - 1) / tp * c[o + M.p2p_s_per_byte] * b
            if b <= c[o + M.custom_allreduce_max_bytes]:
                allreduce = min(allreduce, min(one, two))
        allreduce = max(allreduce, c[o + M.ring_factor] * b / c[o + M.interconnect_bytes_per_s])
    layer = linear + pointwise + attention + c[o + M.allreduces_per_layer] * allreduce
    gpu = c[o + M.num_layers] * layer + _gemm_s(c, head, s, c[o + M.lm_head_shape_0], c[o + M.lm_head_shape_1], 1.0)
    return c[o + M.gpu_time_scale] * gpu + c[o + M.overhead_s] + c[o + M.overhead_s_per_seq] * s


@njit(nogil=True, inline="always")
def _base_s(kind, c, o, t, pairs, kv, s):  # pragma: no cover (compiled)
    if kind == ROOFLINE:
        return _roofline_s(c, o, t, pairs, kv)
    return _measured_s(c, o, t, pairs, kv, s)


@njit(nogil=True, inline="always")
def _stacked_s(kind, c, o, t, pairs, kv, s):  # pragma: no cover (compiled)
    """A model that may be a stack over a base (:class:`~kvlab.costmodel.stacks.StackedCostModel`)."""
    if kind == STACKED:
        gpu = c[o + S.terms_gpu_time_scale] * _base_s(int(c[o + len(S)]), c, o + len(S) + 1, t, pairs, kv, s)
        cpu = c[o + S.terms_overhead_s] + c[o + S.terms_overhead_s_per_seq] * s
        return max(gpu, cpu) if c[o + S.terms_overlap] != 0.0 else gpu + cpu
    return _base_s(kind, c, o, t, pairs, kv, s)


@njit(nogil=True)
def iteration_s(kind, c, num_tokens, attention_pairs, kv_tokens, num_seqs):  # pragma: no cover (compiled)
    """Seconds of one iteration (ints: tokens, attention pairs, KV tokens, sequences) under model ``kind``."""
    t, pairs, kv, s = float(num_tokens), float(attention_pairs), float(kv_tokens), float(num_seqs)
    if kind != PIPELINE:
        return _stacked_s(kind, c, 0, t, pairs, kv, s)
    at = len(P)
    n = int(c[at])
    stage_at = at + 1 + (3 * n + 2 if n > 0 else 0)
    own = _stacked_s(int(c[stage_at]), c, stage_at + 1, t, pairs, kv, s) \
        + c[P.send_latency_s] + c[P.activation_bytes_per_token] * t / c[P.link_bytes_per_s]
    if n == 0:
        return c[P.pp] * own
    x = c[at + 1:at + 1 + n]
    i = np.searchsorted(x, own, side="right")
    return c[P.pp] * (own * c[at + 1 + n + i] + c[at + 2 + 2 * n + i])


__all__ = ["GEMM_FIELDS", "MEASURED_FIELDS", "MEASURED_SHAPES", "PIPELINE_FIELDS", "ROOFLINE_FIELDS", "STACKED_FIELDS",
           "constants", "field_value", "iteration_s", "layout"]
