"""The cost models' ``iteration_s`` for one iteration, compiled by Numba for the compiled engine loop.

The compiled loop (:mod:`kvlab.sim.fast.kernel`) prices each iteration as it runs, so it cannot
call a Python method; each model here is flattened to a kind code and a float vector of its
constants (:func:`constants`), and :func:`iteration_s` repeats the model's formula on Python
scalars, term by term in the same order, so that both give the same float (the tests compare
them on random inputs). A model without a compiled form (a pipeline, a user's own class, a
subclass that may override ``iteration_s``) gives ``None`` and the engine keeps its array path.
"""
from __future__ import annotations

import math
from typing import Any

from .. import _numba_cache  # noqa: F401  (first: it gives Numba a writable cache folder)
import numba
import numpy as np

from .measured import MeasuredCostModel
from .roofline import CostModel

ROOFLINE, MEASURED = 0, 1


def constants(cost: Any) -> tuple[int, np.ndarray] | None:
    """``(kind, constants)`` of a cost model :func:`iteration_s` can price, else ``None``."""
    if type(cost) is CostModel:
        return ROOFLINE, np.array([
            cost.linear_flops_per_token, cost.attention_flops_per_pair, cost.effective_flops_per_s,
            cost.weight_bytes, cost.kv_bytes_per_token, cost.effective_bytes_per_s, cost.allreduce_bytes_per_token,
            cost.interconnect_bytes_per_s, cost.allreduce_latency_s_per_iteration, cost.iteration_overhead_s],
            dtype=np.float64)
    if type(cost) is MeasuredCostModel:
        g = cost.gemm
        return MEASURED, np.array([
            cost.num_layers, cost.hidden_size, g.launch_s, g.bytes_per_s, g.flops_per_s, g.half_tokens,
            g.sharpness, g.dtype_bytes, *cost.lm_head_shape, cost.pointwise_s, cost.pointwise_s_per_element,
            cost.attention_s, cost.attention_s_per_seq, cost.attention_s_per_token, cost.attention_s_per_kv_token,
            cost.attention_s_per_pair, cost.activation_bytes_per_token, cost.overhead_s, cost.overhead_s_per_seq,
            len(cost.gemm_shapes), *(x for shape in cost.gemm_shapes for x in shape),
            len(cost.allreduce_curve_s), *cost.allreduce_log2_bytes, *cost.allreduce_curve_s], dtype=np.float64)
    return None


@numba.njit(cache=True, nogil=True, inline="always")
def _gemm_s(c, m, n, k):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.measured.GemmCurve.time_s` with the curve at ``c[2:8]``."""
    mem = c[7] * (m * (k + n) + k * n) / c[3]
    comp = 2.0 * n * k * (m + c[5]) / c[4]
    p = c[6]
    return c[2] + (mem ** p + comp ** p) ** (1.0 / p)


@numba.njit(cache=True, nogil=True)
def iteration_s(kind, c, num_tokens, attention_pairs, kv_tokens, num_seqs):  # pragma: no cover (compiled)
    """Seconds of one iteration (ints: tokens, attention pairs, KV tokens, sequences) under model ``kind``."""
    t, pairs, kv, s = num_tokens, attention_pairs, kv_tokens, num_seqs
    if kind == ROOFLINE:
        compute = (c[0] * t + c[1] * pairs) / c[2]
        memory = (c[3] + c[4] * kv) / c[5]
        comm = c[6] * t / c[7] + c[8]
        return max(compute, memory) + comm + c[9]
    num_shapes = int(c[20])
    linear = 0.0
    for i in range(num_shapes):
        linear += _gemm_s(c, t, c[21 + 2 * i], c[22 + 2 * i])
    at = 21 + 2 * num_shapes
    num_curve = int(c[at])
    allreduce = 0.0
    if num_curve > 0:
        x = math.log2(max(t, 1) * c[17])
        allreduce = np.interp(x, c[at + 1:at + 1 + num_curve], c[at + 1 + num_curve:at + 1 + 2 * num_curve])
    layer = (linear + c[10] + c[11] * c[1] * t + c[12] + c[13] * s + c[14] * t + c[15] * kv + c[16] * pairs
             + 2.0 * allreduce)
    return c[0] * layer + _gemm_s(c, s, c[8], c[9]) + c[18] + c[19] * s
