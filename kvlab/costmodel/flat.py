"""The cost models' compiled form: a kind code and a float vector of constants, built by field name.

The compiled loop (:mod:`kvlab.sim.fast`) prices each iteration as it runs, so it cannot call a
Python method; each model is flattened to a kind code and a float64 vector of its constants
(:func:`constants`), which the compiled formulas (:mod:`.compiled`) read. One description per
model, a tuple of field names (:data:`ROOFLINE_FIELDS`, :data:`MEASURED_FIELDS`,
:data:`STACKED_FIELDS`, :data:`PIPELINE_FIELDS`; a dotted name reaches into a nested dataclass or
a tuple), builds the vector by name, and the formulas read it by the same names (an index per
name, :func:`layout`), never by a position written by hand. A model without a compiled form (a
user's own class, a subclass that may override ``iteration_s``) gives ``None``.

This module imports no Numba: a process that runs the ahead-of-time compiled loop
(:mod:`kvlab.sim.fast.aot`) builds the vector without loading it.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any

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
    "num_experts", "experts_per_token", "expert_parallel", "ep_comm_latency_s", "ep_comm_s_per_byte",
    "lm_head_shape.0", "lm_head_shape.1", "peak_bytes_per_s",
    "peak_flops_per_s", "pointwise_s", "pointwise_s_per_element", "pointwise_s_per_sharded_element", "sharded_width",
    "pointwise_bytes_per_token", "attention_s", "attention_s_per_seq", "attention_s_per_token",
    "attention_s_per_kv_token", "attention_s_per_pair", "attention_s_per_decode_pair",
    "attention_s_per_mixed_decode_kv_token", "attention_kv_bytes_per_token",
    "attention_flops_per_pair_layer", "attention_decode_flops_per_pair_layer", "allreduces_per_layer",
    "activation_bytes_per_token", "allreduce_latency_s", "allreduce_s_per_byte", "custom_allreduce_max_bytes",
    "custom_allreduce_latency_s", "custom_allreduce_s_per_byte", "p2p_latency_s", "p2p_s_per_byte", "ring_factor",
    "interconnect_bytes_per_s", "gpu_time_scale", "overhead_s", "overhead_s_per_seq", "linear_tail_scale")
MEASURED_SHAPES = ("gemm_shapes", "expert_shapes")
#: Then the dense GEMMs' measured table: a count ``g`` (0: none), ``g`` token counts, ``g`` times (seconds).
MEASURED_TABLE = ("linear_grid_tokens", "linear_grid_s")
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
        out += [len(cost.linear_grid_tokens), *cost.linear_grid_tokens, *cost.linear_grid_s]
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


__all__ = ["GEMM_FIELDS", "MEASURED_FIELDS", "MEASURED_SHAPES", "MEASURED_TABLE", "PIPELINE", "MEASURED", "PIPELINE_FIELDS", "ROOFLINE",
           "ROOFLINE_FIELDS", "STACKED", "STACKED_FIELDS", "constants", "field_value", "layout"]
