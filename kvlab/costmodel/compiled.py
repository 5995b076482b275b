"""The cost models' ``iteration_s`` for one iteration, compiled by Numba for the compiled engine loop.

The compiled loop (:mod:`kvlab.sim.fast`) prices each iteration as it runs, so it cannot call a
Python method; each model reaches it as a kind code and a float vector of its constants, built
by field name in :mod:`.flat` (:func:`~kvlab.costmodel.flat.constants`, re-exported here, as
are the field descriptions), and the compiled formulas below read the vector by the same names
(an index per name, :func:`~kvlab.costmodel.flat.layout`), never by a position written by hand.
:func:`iteration_s` repeats each model's formula, term by term in the same order, so that both
give the same float (the tests perturb every field and compare). A stack
(:class:`~kvlab.costmodel.stacks.StackedCostModel`) and a pipeline
(:class:`~kvlab.costmodel.pipeline.PipelineCostModel`) carry their inner model's vector after
their own fields. A model without a compiled form (a user's own class, a subclass that may
override ``iteration_s``) gives ``None`` and the engine keeps its array path.
"""
from __future__ import annotations

from .._numba_cache import njit
import numpy as np

from .flat import (GEMM_FIELDS, MEASURED_FIELDS, MEASURED_SHAPES, MEASURED_TABLE, PIPELINE, PIPELINE_FIELDS, ROOFLINE,
                   ROOFLINE_FIELDS, STACKED, STACKED_FIELDS, constants, field_value, layout)

R, M, S, P, G = (layout(f) for f in (ROOFLINE_FIELDS, MEASURED_FIELDS, STACKED_FIELDS, PIPELINE_FIELDS, GEMM_FIELDS))


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
def _gemm_floor_s(c, g, m, n, k):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.measured.GemmCurve.floor_s` with the curve's constants at ``c[g:]``."""
    moved = c[g + G.dtype_bytes] * m * (k + n) + c[g + G.weight_bytes] * k * n
    return max(moved / c[g + G.peak_bytes_per_s], 2.0 * n * k * m / c[g + G.peak_flops_per_s])


@njit(nogil=True, inline="always")
def _gemm_s(c, g, m, n, k, launches):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.measured.GemmCurve.time_s` with the curve's constants at ``c[g:]``."""
    moved = c[g + G.dtype_bytes] * m * (k + n) + c[g + G.weight_bytes] * k * n
    mem = moved / c[g + G.bytes_per_s]
    comp = 2.0 * n * k * (m + c[g + G.half_tokens]) / c[g + G.flops_per_s]
    p = c[g + G.sharpness]
    curve = launches * c[g + G.launch_s] + (mem ** p + comp ** p) ** (1.0 / p)
    return max(curve, _gemm_floor_s(c, g, m, n, k))


@njit(nogil=True, inline="always")
def _mixed_decode_kv(t, pairs, kv, s):  # pragma: no cover (compiled)
    """:func:`kvlab.costmodel.measured.mixed_decode_kv_tokens`."""
    c = t - s + 1.0
    if c <= 1.0 or s <= 1.0 or kv <= t:
        return 0.0
    p = max((pairs - kv - c * (c - 1.0) / 2.0) / (c - 1.0), 0.0)
    return min(max(kv - p - c, 0.0), kv)


@njit(nogil=True, inline="always")
def _measured_s(c, o, t, pairs, kv, s):  # pragma: no cover (compiled)
    """:meth:`kvlab.costmodel.measured.MeasuredCostModel.iteration_s` with its constants at ``c[o:]``."""
    at = o + len(M)
    lin, head = o + M.gemm_launch_s, o + M.head_gemm_launch_s
    num_dense = int(c[at])
    linear = 0.0
    for i in range(num_dense):
        linear += _gemm_s(c, lin, t, c[at + 1 + 2 * i], c[at + 2 + 2 * i], 1.0)
    dense_at = at
    at += 1 + 2 * num_dense
    num_expert = int(c[at])
    table = at + 1 + 2 * num_expert
    num_grid = int(c[table])
    if num_grid > 0:
        if t <= c[table + num_grid]:
            linear = np.interp(t, c[table + 1:table + 1 + num_grid], c[table + 1 + num_grid:table + 1 + 2 * num_grid])
        else:
            linear = linear * c[o + M.linear_tail_scale]
        floor = 0.0
        for i in range(num_dense):
            floor += _gemm_floor_s(c, lin, t, c[dense_at + 1 + 2 * i], c[dense_at + 2 + 2 * i])
        linear = max(linear, floor)
    if c[o + M.num_experts] > 0:
        e, k_tok, ep = c[o + M.num_experts], c[o + M.experts_per_token], c[o + M.expert_parallel]
        ranks = max(ep / c[o + M.tp], 1.0)
        seen = t * ranks
        touched = e / ep * (1.0 - (1.0 - k_tok / e) ** seen)
        per = seen * k_tok / ep / max(touched, 1.0)
        experts = 0.0
        for i in range(num_expert):
            experts += c[o + M.gemm_launch_s] + touched * _gemm_s(c, lin, per, c[at + 1 + 2 * i], c[at + 2 + 2 * i], 0.0)
        linear = linear + experts
        if ranks > 1:
            gathered = seen * c[o + M.activation_bytes_per_token]
            linear = linear + max(c[o + M.ep_comm_latency_s] + c[o + M.ep_comm_s_per_byte] * gathered,
                                  2.0 * (ranks - 1.0) / ranks * gathered / c[o + M.interconnect_bytes_per_s])
    pointwise = max(c[o + M.pointwise_s] + c[o + M.pointwise_s_per_element] * c[o + M.hidden_size] * t
                    + c[o + M.pointwise_s_per_sharded_element] * c[o + M.sharded_width] * t,
                    c[o + M.pointwise_bytes_per_token] * t / c[o + M.peak_bytes_per_s])
    decode = min(pairs, kv)
    prefill = pairs - decode
    flops = c[o + M.attention_flops_per_pair_layer] * prefill + c[o + M.attention_decode_flops_per_pair_layer] * decode
    attention = max(c[o + M.attention_s] + c[o + M.attention_s_per_seq] * s + c[o + M.attention_s_per_token] * t
                    + c[o + M.attention_s_per_kv_token] * kv + c[o + M.attention_s_per_pair] * prefill
                    + c[o + M.attention_s_per_decode_pair] * decode
                    + c[o + M.attention_s_per_mixed_decode_kv_token] * _mixed_decode_kv(t, pairs, kv, s),
                    max(c[o + M.attention_kv_bytes_per_token] * kv / c[o + M.peak_bytes_per_s],
                        flops / c[o + M.peak_flops_per_s]))
    allreduce = 0.0
    if c[o + M.allreduces_per_layer] != 0.0:
        b = c[o + M.activation_bytes_per_token] * t
        allreduce = c[o + M.allreduce_latency_s] + c[o + M.allreduce_s_per_byte] * b
        if c[o + M.custom_allreduce_max_bytes] > 0 and b <= c[o + M.custom_allreduce_max_bytes]:
            if c[o + M.custom_allreduce_s_per_byte] > 0:
                allreduce = c[o + M.custom_allreduce_latency_s] + c[o + M.custom_allreduce_s_per_byte] * b
            else:
                tp = c[o + M.tp]
                one = c[o + M.p2p_latency_s] + (tp - 1) * c[o + M.p2p_s_per_byte] * b
                two = 2.0 * c[o + M.p2p_latency_s] + 2.0 * (tp - 1) / tp * c[o + M.p2p_s_per_byte] * b
                allreduce = min(min(one, two), allreduce)
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


__all__ = ["GEMM_FIELDS", "MEASURED_FIELDS", "MEASURED_SHAPES", "MEASURED_TABLE", "PIPELINE_FIELDS", "ROOFLINE_FIELDS", "STACKED_FIELDS",
           "constants", "field_value", "iteration_s", "layout"]
