"""Measure recompute and swap on an NVIDIA GPU with CuPy (GPU only; CuPy is imported lazily).

* **swap**: timed ``cudaMemcpyAsync`` copies between device memory and pinned host memory
  (``cupy.cuda.alloc_pinned_memory``) on one ``cupy.cuda.Stream``, in both directions, for
  the copy sizes of each block size and copy mode (one copy per page per layer for K and for V
  as vLLM v0 lays the cache out, one copy per page, and large batched copies). The result is a
  copy table for :func:`kvlab.calibrate.fit_host_link`. Copies are issued from a Python loop,
  which adds about a microsecond per call to what vLLM's C++ loop pays.
* **recompute**: the prefill of ``s`` tokens through one transformer layer of the model's
  shapes (QKV, O and MLP GEMMs, causal attention) in BF16 when CuPy supports it, else FP16,
  times the layer count, plus the LM-head GEMM. Decode steps are timed the same way. The
  result is a profile table for :func:`kvlab.calibrate.fit_roofline`. Attention is plain
  CuPy (tiled causal ``matmul`` + softmax, not a fused FlashAttention kernel), and norms,
  rotary embeddings and residual adds are left out, so the measured time bounds what a serving
  engine pays from above on attention and from below on the rest.

All timings are CUDA-event times (``cupy.cuda.Event``): the median of ``repeats`` runs after
one warm-up. :func:`measured_crossover` turns the two tables into measured cost curves and
their crossover; it and :func:`causal_attention` run on the CPU too.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from ._intmath import ceil_div
from .backend import array_namespace, get_xp
from .calibrate import fit_host_link, fit_roofline, load_copies, load_profile
from .preemption_cost import crossing_tokens, crossover
from .reservation import pages_for
from .specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model
from .swap import COPY_MODES, swap_model

COPY_BUFFER_BYTES = 1 << 30        # pinned host and device buffers for the copy measurements


def _cupy() -> ModuleType:
    return get_xp("cupy")           # clear ImportError / RuntimeError without CuPy or a device


def pick_dtype(cp: ModuleType) -> tuple[Any, str]:
    """BF16 when this CuPy runs the measured operations in BF16 (through ``ml_dtypes``), else FP16.

    The check runs :func:`causal_attention` (matmul, exp, max, where, division) on small inputs
    and compares it with FP32, since a CuPy that stores BF16 may still lack some kernels.
    """
    rng = np.random.default_rng(0)
    q, k, v_ = (cp.asarray(rng.standard_normal(shape, dtype=np.float32))
                for shape in ((1, 2, 32, 16), (1, 32, 16), (1, 32, 16)))
    want = causal_attention(q, k, v_, tile_tokens=8)
    try:
        import ml_dtypes
        bf16 = ml_dtypes.bfloat16
        got = causal_attention(q.astype(bf16), k.astype(bf16), v_.astype(bf16), tile_tokens=8).astype(cp.float32)
        if float(cp.abs(got - want).max()) < 0.1:
            return bf16, "bfloat16"
    except Exception:
        pass
    return cp.float16, "float16"


def _time_s(cp: ModuleType, fn: Callable[[], Any], repeats: int, stream: Any) -> float:
    """Median CUDA-event time of ``fn`` on ``stream`` after one warm-up (seconds)."""
    with stream:
        fn()
        stream.synchronize()
        times = []
        for _ in range(repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def page_copy_bytes(model: str | ModelSpec, block_size: int, copy_mode: str, *, tp: int = 1,
               dtype_bytes: int = 2) -> int:
    """Bytes of one copy of one page for ``copy_mode`` (``per_layer_page`` or ``per_page``)."""
    m = _model(model)
    block_size = v.positive_int(block_size, "block_size")
    v.choice(copy_mode, "copy_mode", ("per_layer_page", "per_page"))
    # One copy moves one cache tensor (K, V, or MLA's latent) of one layer, or the whole page.
    per_tensor = block_size * m.kv_bytes_per_token_per_layer(tp=tp, dtype_bytes=dtype_bytes) // m.kv_tensors_per_layer
    return per_tensor if copy_mode == "per_layer_page" else per_tensor * m.kv_tensors_per_layer * m.num_layers


def measure_copies(model: str | ModelSpec, *, block_sizes: Sequence[int] = (8, 16, 32, 64, 128), tp: int = 1,
                   dtype_bytes: int = 2, num_copies: int = 512,
                   batched_bytes: Sequence[int] = (1 << 20, 1 << 24, 1 << 28), repeats: int = 3) -> pd.DataFrame:
    """Time page copies device -> pinned host (``d2h``) and back (``h2d``).

    Each row issues ``num_copies`` back-to-back copies of ``copy_bytes`` (fewer when they would
    exceed the 1 GiB buffers, at least 4) to consecutive addresses, as a swap of that many pages
    does, and reports their total time.

    Returns
    -------
    DataFrame with ``direction``, ``copy_mode``, ``block_size`` (0 for batched copies),
    ``copy_bytes``, ``num_copies``, ``seconds``: a copy table for
    :func:`kvlab.calibrate.fit_host_link`.
    """
    cp = _cupy()
    m = _model(model)
    sizes = v.positive_int_array(block_sizes, "block_sizes")
    num_copies = v.positive_int(num_copies, "num_copies")
    repeats = v.positive_int(repeats, "repeats")
    plan = [(mode, int(bs), page_copy_bytes(m, int(bs), mode, tp=tp, dtype_bytes=dtype_bytes))
            for bs in sizes for mode in ("per_layer_page", "per_page")]
    plan += [("batched", 0, int(b)) for b in v.positive_int_array(batched_bytes, "batched_bytes")]
    host = cp.cuda.alloc_pinned_memory(COPY_BUFFER_BYTES)
    device = cp.empty(COPY_BUFFER_BYTES, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    kinds = {"d2h": cp.cuda.runtime.memcpyDeviceToHost, "h2d": cp.cuda.runtime.memcpyHostToDevice}
    rows = []
    for mode, bs, size in plan:
        n = 1 if mode == "batched" else max(4, min(num_copies, COPY_BUFFER_BYTES // size))
        if n * size > COPY_BUFFER_BYTES:
            continue
        for direction, kind in kinds.items():
            dst, src = (host.ptr, device.data.ptr) if direction == "d2h" else (device.data.ptr, host.ptr)

            def copies(dst=dst, src=src, kind=kind, n=n, size=size) -> None:
                for i in range(n):
                    cp.cuda.runtime.memcpyAsync(dst + i * size, src + i * size, size, kind, stream.ptr)

            rows.append({"direction": direction, "copy_mode": mode, "block_size": bs, "copy_bytes": size,
                         "num_copies": n, "seconds": _time_s(cp, copies, repeats, stream)})
    return pd.DataFrame(rows)


def causal_attention(q: Any, k: Any, v_: Any, *, tile_tokens: int = 1024) -> Any:
    """Causal softmax attention, tiled over queries so each tile reads only the keys before it.

    Parameters
    ----------
    q : array, shape (kv_heads, group, s, head_dim)
        Queries, already scaled by ``1 / sqrt(head_dim)``; ``group`` query heads share a KV head.
    k, v_ : array, shape (kv_heads, s, head_dim)
        Keys and values.
    tile_tokens : int
        Queries per tile (tokens).

    Returns
    -------
    array, shape (kv_heads, group, s, head_dim), on the module of ``q`` (NumPy or CuPy).
    """
    xp = array_namespace(q, k, v_)
    kv_heads, group, s, d = q.shape
    out = xp.empty_like(q)
    neg = xp.asarray(-np.inf, dtype=q.dtype)
    for t0 in range(0, s, tile_tokens):
        t1 = min(s, t0 + tile_tokens)
        qt = xp.ascontiguousarray(q[:, :, t0:t1]).reshape(kv_heads, group * (t1 - t0), d)
        scores = xp.matmul(qt, xp.swapaxes(k[:, :t1], 1, 2)).reshape(kv_heads, group, t1 - t0, t1)
        future = xp.arange(t1)[None, :] > xp.arange(t0, t1)[:, None]
        scores = xp.where(future, neg, scores)
        scores = xp.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        out[:, :, t0:t1] = xp.matmul(probs.reshape(kv_heads, group * (t1 - t0), t1),
                                     v_[:, :t1]).reshape(kv_heads, group, t1 - t0, d)
    return out


@dataclass(frozen=True, kw_only=True)
class _Shapes:
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp_cols: int          # columns of the first MLP GEMM (2 x intermediate when gated), per GPU
    mlp_inner: int         # rows of the second MLP GEMM, per GPU
    gated: bool
    vocab: int

    @classmethod
    def of(cls, m: ModelSpec, tp: int) -> _Shapes:
        inner = ceil_div(m.intermediate_size, tp)
        return cls(hidden=m.hidden_size, q_heads=ceil_div(m.num_q_heads, tp), kv_heads=m.kv_heads_per_gpu(tp),
                   head_dim=m.head_dim, mlp_cols=2 * inner if m.gated_mlp else inner, mlp_inner=inner,
                   gated=m.gated_mlp, vocab=ceil_div(m.vocab_size, tp))


def _random(cp: ModuleType, shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> Any:
    """An array of ``shape`` filled from 2^20 host-drawn normals (values do not affect timing)."""
    base = cp.asarray(rng.standard_normal(1 << 20, dtype=np.float32) * 0.02)
    size = int(np.prod(shape))
    return cp.tile(base, ceil_div(size, base.size))[:size].reshape(shape).astype(dtype)


def _layer(cp: ModuleType, w: dict[str, Any], x: Any, sh: _Shapes, kv: tuple[Any, Any] | None,
           tile_tokens: int) -> Any:
    """One transformer layer's GEMMs and attention over ``x`` (prefill when ``kv`` is None,
    else one decode step per row of ``x`` against cached ``kv``)."""
    n = x.shape[0]
    d, hk, g = sh.head_dim, sh.kv_heads, sh.q_heads // sh.kv_heads
    qkv = x @ w["qkv"]
    q = qkv[:, : sh.q_heads * d] * float(1.0 / np.sqrt(d))   # a Python float keeps the dtype
    if kv is None:          # prefill: n tokens of one sequence
        q = q.reshape(n, hk, g, d).transpose(1, 2, 0, 3)
        k = cp.ascontiguousarray(qkv[:, sh.q_heads * d:(sh.q_heads + hk) * d].reshape(n, hk, d).transpose(1, 0, 2))
        vv = cp.ascontiguousarray(qkv[:, (sh.q_heads + hk) * d:].reshape(n, hk, d).transpose(1, 0, 2))
        att = causal_attention(q, k, vv, tile_tokens=tile_tokens).transpose(2, 0, 1, 3).reshape(n, sh.q_heads * d)
    else:                   # decode: n sequences, one token each, context cached in kv
        k_cache_t, v_cache = kv             # (n, kv_heads, d, context) and (n, kv_heads, context, d)
        q = cp.ascontiguousarray(q.reshape(n, hk, g, d))
        scores = cp.matmul(q, k_cache_t)                    # (n, kv_heads, g, context)
        scores = cp.exp(scores - scores.max(axis=-1, keepdims=True))
        att = cp.matmul(scores / scores.sum(axis=-1, keepdims=True), v_cache).reshape(n, sh.q_heads * d)
    h = att @ w["o"]
    up = h @ w["mlp_in"]
    if sh.gated:
        gate, lin = up[:, : sh.mlp_inner], up[:, sh.mlp_inner:]
        act = gate / (1.0 + cp.exp(-gate)) * lin           # SiLU(gate) x up
    else:
        act = up / (1.0 + cp.exp(-1.702 * up))              # GELU (sigmoid approximation)
    return act @ w["mlp_out"]


def measure_forward(model: str | ModelSpec, *, seq_tokens: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192),
                    decode_batches: Sequence[int] = (1, 16, 64), decode_contexts: Sequence[int] = (1024, 4096),
                    tp: int = 1, repeats: int = 3, tile_tokens: int = 1024, seed: int = 0) -> pd.DataFrame:
    """Time prefill (one sequence of ``s`` tokens) and decode steps of ``model``'s shapes.

    One layer is timed and multiplied by the layer count; the LM-head GEMM is added (over every
    token, as the roofline's 2 x params x tokens counts it). Lengths beyond the model's context
    are skipped.

    Returns
    -------
    DataFrame with the profile columns ``phase``, ``tokens``, ``context``, ``batch``,
    ``seconds``, plus ``layer_s``, ``lm_head_s``, ``num_layers`` and ``dtype``.
    """
    cp = _cupy()
    m = _model(model)
    tp = v.positive_int(tp, "tp")
    repeats = v.positive_int(repeats, "repeats")
    seqs = [s for s in v.positive_int_array(seq_tokens, "seq_tokens").tolist() if s <= m.max_context_tokens]
    batches = v.positive_int_array(decode_batches, "decode_batches").tolist()
    contexts = [c for c in v.positive_int_array(decode_contexts, "decode_contexts").tolist()
                if c < m.max_context_tokens]
    sh = _Shapes.of(m, tp)
    dtype, dtype_name = pick_dtype(cp)
    rng = np.random.default_rng(seed)
    w = {"qkv": _random(cp, (sh.hidden, (sh.q_heads + 2 * sh.kv_heads) * sh.head_dim), dtype, rng),
         "o": _random(cp, (sh.q_heads * sh.head_dim, sh.hidden), dtype, rng),
         "mlp_in": _random(cp, (sh.hidden, sh.mlp_cols), dtype, rng),
         "mlp_out": _random(cp, (sh.mlp_inner, sh.hidden), dtype, rng)}
    lm_head = _random(cp, (sh.hidden, sh.vocab), dtype, rng)
    cp.cuda.Device().synchronize()      # the timing stream does not wait for the default stream
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []

    def add(phase: str, tokens: int, context: int, batch: int, layer_s: float, head_s: float) -> None:
        rows.append({"phase": phase, "tokens": tokens, "context": context, "batch": batch,
                     "seconds": m.num_layers * layer_s + head_s, "layer_s": layer_s, "lm_head_s": head_s,
                     "num_layers": m.num_layers, "dtype": dtype_name})

    for s in seqs:
        with stream:
            x = _random(cp, (s, sh.hidden), dtype, rng)
        layer_s = _time_s(cp, lambda x=x: _layer(cp, w, x, sh, None, tile_tokens), repeats, stream)
        add("prefill", s, 0, 1, layer_s, _time_s(cp, lambda x=x: x @ lm_head, repeats, stream))
        del x
    for c in contexts:
        for b in batches:
            with stream:
                x = _random(cp, (b, sh.hidden), dtype, rng)
                kv = (_random(cp, (b, sh.kv_heads, sh.head_dim, c), dtype, rng),
                      _random(cp, (b, sh.kv_heads, c, sh.head_dim), dtype, rng))
            layer_s = _time_s(cp, lambda x=x, kv=kv: _layer(cp, w, x, sh, kv, tile_tokens), repeats, stream)
            add("decode", 1, c, b, layer_s, _time_s(cp, lambda x=x: x @ lm_head, repeats, stream))
            del x, kv
    cp.get_default_memory_pool().free_all_blocks()
    return pd.DataFrame(rows)


@dataclass(frozen=True, kw_only=True, eq=False)
class MeasuredCrossover:
    """Measured recompute and swap curves of one model and their crossover.

    ``crossover_tokens`` is interpolated between measured lengths (``None`` when the winner is
    the same at every one); ``curves`` holds ``seq_tokens``, ``recompute_s``, ``swap_s`` and
    ``recompute_over_swap``.
    """

    model_name: str
    block_size: int
    copy_mode: str
    crossover_tokens: float | None
    num_crossings: int
    curves: pd.DataFrame


def measured_crossover(profile: pd.DataFrame, copies: pd.DataFrame, model: str | ModelSpec, *,
                       block_size: int = 16, copy_mode: str = "per_page", tp: int = 1) -> MeasuredCrossover:
    """Recompute and swap cost of one preemption from measured tables.

    Recompute at ``s`` is the measured prefill of ``s`` tokens (profile rows with ``phase``
    prefill, ``context`` 0, ``batch`` 1). Swap is, in each direction, the number of copies the
    pages of ``s`` tokens need times the measured time of one copy of that size (from copy-table
    rows of ``copy_mode`` and ``block_size``; ``batched``: one copy of all the bytes, timed by
    the link fit of :func:`kvlab.calibrate.fit_host_link`).
    """
    m = _model(model)
    prof, cop = load_profile(profile), load_copies(copies)
    block_size = v.positive_int(block_size, "block_size")
    copy_mode = v.choice(copy_mode, "copy_mode", COPY_MODES)
    pre = prof[(prof["phase"] == "prefill") & (prof["context"] == 0) & (prof["batch"] == 1)]
    pre = pre.sort_values("tokens").drop_duplicates("tokens")
    if len(pre) < 2:
        raise ValueError("profile needs prefill rows (context 0, batch 1) at two or more lengths at least")
    seq = pre["tokens"].to_numpy(dtype=np.int64)
    pages = pages_for(seq, block_size)
    if copy_mode == "batched":
        link = fit_host_link(cop)
        nbytes = pages * block_size * page_copy_bytes(m, 1, "per_page", tp=tp)
        swap_s = 2.0 * (link.copy_latency_s + nbytes / link.link_bytes_per_s)
    else:
        size = page_copy_bytes(m, block_size, copy_mode, tp=tp)
        rows = cop[cop["copy_bytes"] == size]
        per_copy = (rows["seconds"] / rows["num_copies"]).groupby(rows["direction"]).median()
        if set(per_copy.index) != {"d2h", "h2d"}:
            raise ValueError(f"copy table has no d2h and h2d rows of {size} bytes ({copy_mode} at "
                             f"block_size {block_size} for {m.name})")
        copies_per_page = m.kv_tensors_per_layer * m.num_layers if copy_mode == "per_layer_page" else 1
        swap_s = pages * copies_per_page * (per_copy["d2h"] + per_copy["h2d"])
    rec = pre["seconds"].to_numpy(dtype=np.float64)
    at, n = crossing_tokens(seq, rec, swap_s)
    curves = pd.DataFrame({"seq_tokens": seq, "recompute_s": rec, "swap_s": swap_s,
                           "recompute_over_swap": rec / swap_s})
    return MeasuredCrossover(model_name=m.name, block_size=block_size, copy_mode=copy_mode,
                             crossover_tokens=at, num_crossings=n, curves=curves)


def run(models: Sequence[str] = ("Llama-3-8B", "Llama-2-7B"), *, gpu: str | GPUSpec = "H200",
        out_dir: str | os.PathLike = "gpu_results", block_sizes: Sequence[int] = (8, 16, 32, 64, 128),
        quick: bool = False) -> dict[str, Any]:
    """Measure every model, fit the roofline and link, and compare measured with modelled crossovers.

    Writes ``profile.csv`` and ``copies.csv`` (with a ``model`` column) and ``summary.json``
    under ``out_dir``; returns the summary. ``gpu`` names the catalogue GPU whose peak figures
    the roofline fit starts from (the machine measured). ``quick`` shrinks every grid.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g = _gpu(gpu)
    cp = _cupy()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    summary: dict[str, Any] = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                               "gpu_spec": g.name, "quick": quick, "models": {}}
    profiles, copy_tables = [], []
    for name in models:
        t0 = time.perf_counter()
        m = _model(name)
        prof = measure_forward(m, seq_tokens=(256, 1024, 4096) if quick else (256, 512, 1024, 2048, 4096, 8192, 16384),
                               decode_batches=(1, 16) if quick else (1, 16, 64, 128),
                               decode_contexts=(1024,) if quick else (1024, 4096))
        cop = measure_copies(m, block_sizes=(16,) if quick else block_sizes, num_copies=64 if quick else 512)
        roof = fit_roofline(prof, m, g)
        link = fit_host_link(cop)
        entry: dict[str, Any] = {
            "dtype": str(prof["dtype"].iloc[0]), "seconds_to_measure": time.perf_counter() - t0,
            "roofline_fit": {"compute_efficiency": roof.compute_efficiency,
                             "bandwidth_efficiency": roof.bandwidth_efficiency,
                             "iteration_overhead_s": roof.iteration_overhead_s, "rel_rmse": roof.rel_rmse,
                             "max_abs_rel_error": roof.max_abs_rel_error},
            "link_fit": {"link_bytes_per_s": link.link_bytes_per_s, "copy_latency_s": link.copy_latency_s,
                         "rel_rmse": link.rel_rmse, "max_abs_rel_error": link.max_abs_rel_error},
            "crossovers": [],
        }
        for bs in sorted(set(cop.loc[cop["block_size"] > 0, "block_size"].tolist())):
            for mode in COPY_MODES:
                meas = measured_crossover(prof, cop, m, block_size=bs, copy_mode=mode)
                fitted = crossover(m, g, bs, cost_model=roof.cost_model, swap=link.swap_model(m, g, copy_mode=mode))
                spec = crossover(m, g, bs, swap=swap_model(m, g, copy_mode=mode), cost_model="roofline")
                entry["crossovers"].append({
                    "block_size": bs, "copy_mode": mode,
                    "measured_crossover_tokens": meas.crossover_tokens, "measured_num_crossings": meas.num_crossings,
                    "measured_recompute_over_swap": meas.curves["recompute_over_swap"].round(4).tolist(),
                    "measured_seq_tokens": meas.curves["seq_tokens"].tolist(),
                    "calibrated_crossover_tokens": fitted.crossover_tokens, "calibrated_summary": fitted.summary(),
                    "spec_crossover_tokens": spec.crossover_tokens, "spec_summary": spec.summary()})
        summary["models"][m.name] = entry
        profiles.append(prof.assign(model=m.name))
        copy_tables.append(cop.assign(model=m.name))
    pd.concat(profiles).to_csv(out / "profile.csv", index=False)
    pd.concat(copy_tables).to_csv(out / "copies.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary
