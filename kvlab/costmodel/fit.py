"""Fit the measured cost model's curves to the public GPU measurements (:mod:`.data`).

Each term of :mod:`.measured` is fitted to the measurements of that term alone, with
``scipy.optimize`` on relative errors (the rows span orders of magnitude):

* :func:`fit_gemm`: the GEMM curve of one GPU (``scipy.optimize.least_squares`` on the log
  ratio of predicted to measured time), over every GEMM of every model and TP degree profiled
  on it;
* :func:`fit_pointwise`: launch time and seconds per token-element of one layer's pointwise ops,
  split into the hidden-state elements every GPU works on and the elements TP splits
  (non-negative least squares, ``scipy.optimize.nnls``, rows divided by their time);
* :func:`fit_attention`: the attention terms on Vidur's A100 profile (``nnls``; prefill and
  decode rows weighted equally in total), carried to every GPU by spec ratios;
* :func:`collective_curves`: an alpha-beta line (latency + bytes x seconds per byte) fitted to
  each measured all-reduce curve per GPU count, and a latency-bandwidth link per send/recv curve
  (Vidur's networks, and the host-measured ones of :mod:`.host_collectives`);
* :func:`fit_stack`: the per-iteration and per-sequence overheads of a serving stack: the part
  of Sarathi-Serve's measured batch times that the GPU terms above do not explain (``nnls``).

GPUs profiled with a serving engine's own operators (:mod:`.op_profiles`: LLMServingSim's vLLM
0.19.0 profiles of the RTX 4090 and RTX PRO 6000) get a family of their own from the same fits:
their GEMMs (:func:`profile_gemm_rows`, the vocabulary projection included), their pointwise
operators (:func:`profile_pointwise`) and their attention (:func:`profile_attention_work`), with
their own host's measured collectives where LLMServingSim measured them (:mod:`.host_collectives`:
the RTX PRO 6000 pair, with and without GPU peer-to-peer), else the nearest GPU's whose
interconnect is measured (:func:`network_gpu`). They
price their own GPU only (``"extrapolate": false``): their kernels are another stack's (a 2026
vLLM's, Vidur's are 2024 PyTorch's), and the RTX 4090 runs its kernels 24-32% faster than spec
ratios carry from any other measured GPU (notebook 08's leave-one-GPU-out table), so GPUs without
measurements keep Vidur's GPUs as their references.

Where a serving engine's own GEMM times are measured on a GPU (:mod:`.engine_gemms`: NVIDIA
aiconfigurator's vLLM tables of the A100-80GB-SXM, H100-SXM, H200, B200 and L40S), that GPU's GEMM curve is
fitted to them instead (:func:`engine_families`), and the table itself over the curve (:func:`gemm_table_ratio`)
prices a layer's GEMMs at the token counts it measured (:func:`.measured.table_correction`): the kernels a server runs today, which on the
H100 are 20-30% faster than Vidur's 2024 profiles at 65-1,024 tokens; so are its attention terms,
to the same release's measured attention kernels (:mod:`.engine_attention`). Their pointwise terms are
vLLM's own operators' (LLMServingSim's profile of the nearest RTX GPU, carried by HBM bandwidth), their
collectives the nearest measured interconnect's (:func:`network_gpu`). A GPU Vidur also profiled (the A100s, the H100) keeps
its Vidur family as its 2024 kernel era (:func:`_with_engine_family`): the servers of that time
(vLLM V0, Sarathi-Serve, whose stacks are fitted on it) ran those kernels.

:func:`fit_constants` runs them all and returns the dictionary shipped as
``data/costmodels/measured.json`` (:func:`write_constants`); ``python -m kvlab.costmodel.fit``
refits and rewrites it from ``../shared/data/measured``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from . import data as _data
from . import engine_attention as _engine_attention
from . import engine_gemms as _engine
from . import host_collectives as _host
from . import op_profiles as _op
from .measured import (CONSTANTS_PATH, CUSTOM_ALLREDUCE_MAX_BYTES, GemmCurve, MeasuredCostModel, attention_shapes,
                       build, spec_distance)
from ..specs import gpu as _gpu_spec, model as _model_spec
from .roofline import prefill_attention_pairs

#: Vidur's SKU folders, the catalogue GPUs they stand for, and how each catalogue GPU reaches
#: its interconnect curves (Vidur's network folders). A40 has no all-reduce curve: its 2-GPU
#: all-reduce is derived from its send/recv curve (a ring of two: each GPU sends half the message
#: twice, reduce-scatter then all-gather).
FAMILIES = {"a100": "A100 (Vidur's a100 profiles)", "a40": "A40 (Vidur's a40 profiles)",
            "h100": "H100 (Vidur's h100 profiles)"}
GPUS = {
    "A100-80GB-PCIe": ("a100", "a100_pairwise_nvlink"),
    "A100-80GB-SXM": ("a100", "a100_dgx"),
    "A100-40GB": ("a100", "a100_dgx"),
    "A100-40GB-PCIe": ("a100", "a100_pairwise_nvlink"),
    "A40": ("a40", "a40_pairwise_nvlink"),
    "H100-SXM": ("h100", "h100_dgx"),
}
#: The catalogue GPU each family's profiles ran on: a GPU of the family with another spec (a 40 GB
#: A100) has its terms scaled by the spec sheets' ratios to it (:func:`.measured.build`).
PROFILED_GPUS = {"a100": "A100-80GB-SXM", "a40": "A40", "h100": "H100-SXM"}
#: The attention profile's GPU: every GPU scales its byte terms by its spec HBM bandwidth and its
#: FLOP and token terms by its dense peak relative to this one.
ATTENTION_GPU = "A100-80GB-SXM"
#: Largest TP group in which every pair of GPUs has a direct NVLink path, per network (NVSwitch:
#: 8; NVLink bridges between pairs: 2): where vLLM's custom all-reduce can run.
FULL_NVLINK_GPUS = {"a100_dgx": 8, "h100_dgx": 8, "a100_pairwise_nvlink": 2, "h100_pairwise_nvlink": 2,
                    "a40_pairwise_nvlink": 2}
#: The stack whose overheads are fitted, and the GPU its batches ran on.
SARATHI_STACK = "sarathi-serve"
SARATHI_GPU, SARATHI_MODEL, SARATHI_TP = "A100-80GB-PCIe", "Yi-34B", 2
#: The kernels the Sarathi-Serve batches ran (2024): the stack is fitted on, and states, that era.
SARATHI_KERNELS = "2024"


# ------------------------------------------------------------------------------------ GEMMs
def gemm_rows(linear: pd.DataFrame) -> pd.DataFrame:
    """One row per GEMM of ``linear`` (:func:`.data.vidur_linear`): gpu, model, tp, op, m, n, k,
    time_s, and ``layer`` (the row of ``linear`` it belongs to)."""
    frames = []
    for op, (n, k) in _data.gemm_shapes(linear).items():
        frames.append(pd.DataFrame({"gpu": linear["gpu"].to_numpy(), "model": linear["model"].to_numpy(),
                                    "tp": linear["tp"].to_numpy(), "op": op, "layer": np.arange(len(linear)),
                                    "m": linear["num_tokens"].to_numpy(dtype=np.float64), "n": n, "k": k,
                                    "time_s": linear[f"{op}_s"].to_numpy()}))
    rows = pd.concat(frames, ignore_index=True)
    return rows[rows["time_s"] > 0].reset_index(drop=True)


def _gemm_curve(p: np.ndarray) -> GemmCurve:
    return GemmCurve(launch_s=float(np.exp(p[0])), bytes_per_s=float(np.exp(p[1])), flops_per_s=float(np.exp(p[2])),
                     half_tokens=float(np.exp(p[3])), sharpness=float(p[4]))


def fit_gemm(rows: pd.DataFrame) -> GemmCurve:
    """The :class:`.measured.GemmCurve` of one GPU fitted to its GEMM rows (:func:`gemm_rows`).

    Minimises the squared log ratio of predicted to measured seconds (``least_squares``, bounded:
    launch 2 ns-7 ms, half-tokens 1-22,000, sharpness 1-20, and the curve's bandwidth and
    throughput at most the GPU's spec-sheet HBM bandwidth and dense BF16 peak (the ``gpu`` column:
    a family of :data:`PROFILED_GPUS`, or a catalogue GPU's name for a user's own profile).
    Unbounded, the H100 rows fitted 4.5 TB/s on a 3.35 TB/s GPU, the misfit landing on the
    decode-sized GEMMs the curve's knee trades off against.
    """
    if len(rows) < 5:
        raise ValueError(f"fit_gemm needs at least 5 GEMM rows, got {len(rows)}")
    families = sorted(set(rows["gpu"]))
    if len(families) != 1:
        raise ValueError(f"fit_gemm fits one GPU at a time (a profiled family, {', '.join(sorted(PROFILED_GPUS))}, "
                         f"or a catalogue GPU's name); rows' gpu column holds {families}")
    try:
        spec = _gpu_spec(PROFILED_GPUS.get(families[0], families[0]))
    except ValueError as err:
        raise ValueError(f"fit_gemm: rows of gpu {families[0]!r}, which is neither a profiled family nor a "
                         f"catalogue GPU (its spec sheet bounds the curve): {err}") from None
    m, n, k, t = (rows[c].to_numpy(dtype=np.float64) for c in ("m", "n", "k", "time_s"))

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.log(_gemm_curve(p).time_s(m, n, k) / t)

    top_bw, top_fl = np.log(spec.hbm_bandwidth_bytes_per_s), np.log(spec.gemm_flops_per_s("bf16"))
    p0 = [np.log(5e-6), top_bw - 0.2, top_fl - 0.3, np.log(64.0), 2.0]
    fit = least_squares(residuals, p0, bounds=([-20, 20, 25, 0, 1], [-5, top_bw, top_fl, 10, 20]), method="trf")
    return _gemm_curve(fit.x)


def pointwise_design(linear: pd.DataFrame) -> np.ndarray:
    """The pointwise terms' columns: launch, token-elements of the hidden state (norms and residual
    adds: every GPU works on the whole hidden state), token-elements TP splits (rotary on q and k,
    the MLP activation: per-GPU widths)."""
    tp = linear["tp"].to_numpy(dtype=np.float64)
    head_dim = linear["head_dim"] if "head_dim" in linear else linear["hidden_size"] / linear["num_q_heads"]
    q = (linear["num_q_heads"] * head_dim).to_numpy(dtype=np.float64) / tp
    kv = np.maximum(1, np.ceil(linear["num_kv_heads"].to_numpy() / tp)) * head_dim.to_numpy()
    ff = linear["intermediate_size"].to_numpy(dtype=np.float64) / tp
    t = linear["num_tokens"].to_numpy(dtype=np.float64)
    return np.column_stack([np.ones(len(linear)), t * linear["hidden_size"].to_numpy(), t * (q + kv + ff)])


def fit_pointwise(linear: pd.DataFrame) -> dict[str, float]:
    """Launch time and seconds per token-element of one layer's pointwise ops on one GPU.

    ``pointwise_s = launch_s + s_per_element x tokens x hidden + s_per_sharded_element x tokens
    x (q + kv + ff per GPU)`` (:func:`pointwise_design`), fitted by ``nnls`` on relative errors
    over ``linear``'s rows of one GPU (every TP degree profiled: the split term carries TP).
    """
    t = linear["pointwise_s"].to_numpy(dtype=np.float64)
    keep = t > 0
    x = pointwise_design(linear[keep]) * np.array([1.0, 1e-9, 1e-9])
    (launch, per_h, per_s), _ = nnls(x / t[keep, None], np.ones(keep.sum()))
    return {"launch_s": float(launch), "s_per_element": float(per_h * 1e-9), "s_per_sharded_element": float(per_s * 1e-9)}


# -------------------------------------------------------------------------------- attention
def attention_work(att: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per-layer aggregates of the attention rows: sequences, tokens, KV bytes read, FLOPs, phase."""
    b = att["batch_size"].to_numpy(dtype=np.float64)
    c = att["chunk_tokens"].to_numpy(dtype=np.int64)
    k = att["context_tokens"].to_numpy(dtype=np.int64)
    d = att["head_dim"].to_numpy(dtype=np.float64)
    pairs = b * prefill_attention_pairs(c, k)
    return {"num_seqs": b, "num_tokens": b * c, "kv_bytes": 2 * att["num_kv_heads"].to_numpy() * d * 2 * b * (k + c),
            "flops": 4.0 * att["num_q_heads"].to_numpy() * d * pairs, "phase": att["phase"].to_numpy()}


ATTENTION_TERMS = ("launch_s", "s_per_seq", "s_per_token", "s_per_kv_byte", "s_per_flop")


def attention_design(work: dict[str, np.ndarray]) -> np.ndarray:
    """The attention terms' columns from per-row work (:func:`attention_work`,
    :func:`profile_attention_work`): launch, per sequence, per token, per KV byte, per FLOP, and
    where the rows have mixed batches, per decode KV byte read in a batch that also prefills."""
    cols = [np.ones(len(work["num_seqs"])), work["num_seqs"], work["num_tokens"], work["kv_bytes"], work["flops"]]
    return np.column_stack(cols + ([work["mixed_kv_bytes"]] if "mixed_kv_bytes" in work else []))


def fit_attention(att: pd.DataFrame) -> dict[str, float]:
    """Attention terms fitted to an attention profile: Vidur's (:func:`.data.vidur_attention`), an
    engine's own measured kernels (:func:`.engine_attention.profile`, one GPU and release) or an
    engine's operator profile (:func:`.op_profiles.attention`, one GPU).

    ``attention_s = launch_s + s_per_seq x seqs + s_per_token x tokens + s_per_kv_byte x KV bytes
    + s_per_flop x FLOPs`` per layer (an engine profile's also ``+ s_per_mixed_decode_kv_byte x``
    the decodes' KV bytes in its mixed batches), by ``nnls`` on relative errors; each phase
    (prefill, decode, mixed) weighs equally in total whatever its row count.
    """
    if "prefill_chunk" in att:
        t, work = att["time_s"].to_numpy(dtype=np.float64), profile_attention_work(att)
    else:
        att = att[att["attention_s"] > 0]
        t, work = att["attention_s"].to_numpy(dtype=np.float64), attention_work(att)
    phase = pd.Series(work["phase"])
    if phase.nunique() < 2:
        raise ValueError("fit_attention needs prefill and decode rows")
    w = 1.0 / np.sqrt(phase.map(phase.value_counts()).to_numpy(dtype=np.float64))
    x = attention_design(work)
    scale = np.where(x.max(axis=0) > 0, x.max(axis=0), 1.0)
    coef, _ = nnls(x / scale / t[:, None] * w[:, None], w)
    coef = coef / scale
    keys = ATTENTION_TERMS + (("s_per_mixed_decode_kv_byte",) if x.shape[1] > len(ATTENTION_TERMS) else ())
    return dict(zip(keys, map(float, coef)))


# ------------------------------------------------------------------------------ collectives
def fit_link(rows: pd.DataFrame, *, max_bytes: float = 2.0 ** 26) -> dict[str, float]:
    """Latency and bandwidth of a point-to-point link: ``time = latency_s + bytes / bytes_per_s``,
    by ``nnls`` on relative errors over the rows up to ``max_bytes`` (what one iteration sends)."""
    rows = rows[rows["message_bytes"] <= max_bytes]
    t = rows["time_s"].to_numpy(dtype=np.float64)
    x = np.column_stack([np.ones(len(rows)), rows["message_bytes"].to_numpy(dtype=np.float64) * 1e-9])
    (latency, s_per_gb), _ = nnls(x / t[:, None], np.ones(len(rows)))
    if s_per_gb <= 0:
        raise ValueError("send/recv times do not grow with the message size: cannot fit a bandwidth")
    return {"latency_s": float(latency), "bytes_per_s": float(1e9 / s_per_gb)}


def fit_alpha_beta(rows: pd.DataFrame, *, max_bytes: float = 2.0 ** 28) -> dict[str, float]:
    """Latency and seconds per byte of one collective: ``time = latency_s + s_per_byte x bytes``,
    by ``nnls`` on relative errors over every measured size up to ``max_bytes`` (each size weighs
    the same, small messages included)."""
    rows = rows[rows["message_bytes"] <= max_bytes]
    t = rows["time_s"].to_numpy(dtype=np.float64)
    x = np.column_stack([np.ones(len(rows)), rows["message_bytes"].to_numpy(dtype=np.float64) * 1e-9])
    (latency, s_per_gb), _ = nnls(x / t[:, None], np.ones(len(rows)))
    return {"latency_s": float(latency), "s_per_byte": float(s_per_gb * 1e-9)}


def collective_curves(coll: pd.DataFrame) -> dict[str, Any]:
    """Every network's collectives: ``{network: {"all_reduce": {num_gpus: fit}, "send_recv": link}}``.

    All-reduce as an alpha-beta fit per GPU count (:func:`fit_alpha_beta`), send/recv as a fitted
    link (:func:`fit_link`; pipeline sends and vLLM's custom all-reduce use it). A network without
    all-reduce curves (A40) gets a 2-GPU all-reduce derived from its send/recv link: two sends of
    half the message (ring of two). ``full_nvlink_gpus`` is :data:`FULL_NVLINK_GPUS`.
    """
    out: dict[str, Any] = {}
    for net, rows in coll.groupby("network"):
        entry: dict[str, Any] = {"all_reduce": {}, "full_nvlink_gpus": FULL_NVLINK_GPUS.get(str(net), 0)}
        sr = rows[rows["collective"] == "send_recv"]
        for n, ar in rows[rows["collective"] == "all_reduce"].groupby("num_gpus"):
            entry["all_reduce"][str(int(n))] = fit_alpha_beta(ar)
        if len(sr):
            entry["send_recv"] = fit_link(sr)
            if not entry["all_reduce"]:
                link = entry["send_recv"]
                entry["all_reduce"]["2"] = {"latency_s": 2.0 * link["latency_s"], "s_per_byte": 1.0 / link["bytes_per_s"],
                                            "derived": "2 x send_recv of half the message (ring of two)"}
        out[str(net)] = entry
    return out


def engine_all_reduce(rows: pd.DataFrame, split_bytes: float) -> dict[str, Any]:
    """One GPU's measured serving-engine TP all-reduce (:func:`.host_collectives.engine_rows`), as its
    ``gpus`` entry keeps it: per GPU count an alpha-beta line below ``split_bytes`` (vLLM's custom
    all-reduce: :data:`.measured.CUSTOM_ALLREDUCE_MAX_BYTES`) and one above (NCCL's), each fitted to its
    own side of the rows (:func:`fit_alpha_beta`); ``source`` names the measurement."""
    fits: dict[str, Any] = {}
    for n, g in rows.groupby("num_gpus"):
        small, large = g[g["message_bytes"] <= split_bytes], g[g["message_bytes"] > split_bytes]
        if len(small) >= 2 and len(large) >= 2:
            fits[str(int(n))] = {"small": fit_alpha_beta(small), "large": fit_alpha_beta(large)}
    return {"source": str(rows["source"].iloc[0]), "split_bytes": int(split_bytes), "fits": fits}


# ---------------------------------------------------------------------------- stack overheads
def batch_work(batches: pd.DataFrame) -> pd.DataFrame:
    """The iterations of Sarathi-Serve's measured batches (:func:`.data.sarathi_batches`), with
    their aggregates: one row per iteration, ``batch`` the index of the batch it belongs to.

    A batch is one iteration, except figure 9's chunked prefills: one iteration per chunk, each
    attending to the chunks before it.
    """
    rows = []
    for i, r in batches.reset_index(drop=True).iterrows():
        p, dseq, ctx = int(r["prefill_tokens"]), int(r["decode_seqs"]), int(r["decode_context_tokens"])
        chunk = int(r.get("chunk_tokens", 0) or 0) or max(p, 1)
        starts = range(0, p, chunk) if p else [0]
        for j, s in enumerate(starts):
            c = min(chunk, p - s) if p else 0
            dec = dseq if j == 0 else 0
            rows.append({"batch": i, "num_tokens": c + dec,
                         "attention_pairs": int(prefill_attention_pairs(c, s)) + dec * (ctx + 1),
                         "kv_tokens": (s + c if c else 0) + dec * (ctx + 1), "num_seqs": (1 if c else 0) + dec})
    return pd.DataFrame(rows)


def predict_batches(cost: Any, batches: pd.DataFrame) -> np.ndarray:
    """Predicted seconds of each measured batch (sum over its iterations) under ``cost``."""
    it = batch_work(batches)
    per = np.asarray(cost.iteration_s(*(it[c].to_numpy() for c in ("num_tokens", "attention_pairs", "kv_tokens",
                                                                     "num_seqs"))), dtype=np.float64)
    return np.bincount(it["batch"].to_numpy(), weights=per, minlength=len(batches))


def fit_stack(gpu_only: MeasuredCostModel, batches: pd.DataFrame) -> dict[str, float]:
    """Per-iteration and per-sequence overheads: measured minus GPU time, by ``nnls`` on relative errors.

    ``gpu_only`` is the measured model of the batches' model and GPU without overheads
    (``stack="none"``); ``batches`` the rows to fit on (warm-up batches should be left out).
    """
    if len(batches) < 2:
        raise ValueError(f"fit_stack needs at least 2 batches, got {len(batches)}")
    it = batch_work(batches)
    measured = batches["measured_s"].to_numpy(dtype=np.float64)
    gpu_s = predict_batches(gpu_only, batches)
    n = len(batches)
    iterations = np.bincount(it["batch"], minlength=n).astype(np.float64)
    seqs = np.bincount(it["batch"], weights=it["num_seqs"], minlength=n)
    x = np.column_stack([iterations, seqs]) / measured[:, None]
    (per_it, per_seq), _ = nnls(x, 1.0 - gpu_s / measured)
    return {"overhead_s": float(per_it), "overhead_s_per_seq": float(per_seq)}


# ------------------------------------------------------------------ engines' operator profiles
def _layer_shapes(model: str, tp: int) -> dict[str, tuple[float, float]]:
    """Per-GPU ``(n, k)`` of each profiled GEMM of ``model`` at ``tp`` (vLLM's fused projections)."""
    m = _model_spec(model)
    qkv, o = attention_shapes(m, tp)[0][:2]  # grouped-query attention: the fused QKV and the output
    ff = m.intermediate_size / tp
    gate = 2 if m.gated_mlp else 1
    return {"qkv_proj": qkv, "o_proj": o, "gate_up_proj": (gate * ff, m.hidden_size),
            "down_proj": (m.hidden_size, ff), "lm_head": (m.vocab_size / tp, m.hidden_size)}


def profile_gemm_rows(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per GEMM of the operator profiles (:func:`.op_profiles.layers`), in :func:`gemm_rows`'
    columns: the layer's projections at ``tokens`` and the vocabulary projection at one token per
    sequence (``layer`` numbers each (model, TP, tokens)). A mixture of experts' experts are
    profiled apart and are not among them."""
    frames = []
    for (gpu, model, tp), g in ops.groupby(["gpu", "model", "tp"]):
        for op, (n, k) in _layer_shapes(str(model), int(tp)).items():
            r = g[g["op"] == op]
            frames.append(pd.DataFrame({"gpu": gpu, "model": model, "tp": int(tp), "op": op,
                                        "layer": f"{model}/tp{tp}/" + r["tokens"].astype(str),
                                        "m": r["tokens"].to_numpy(dtype=np.float64), "n": n, "k": k,
                                        "time_s": r["time_s"].to_numpy(dtype=np.float64)}))
    return pd.concat(frames, ignore_index=True)


def profile_pointwise(ops: pd.DataFrame) -> pd.DataFrame:
    """One layer's pointwise time per (model, TP, tokens) of the operator profiles, as
    :func:`fit_pointwise` reads it: each operator of :data:`.op_profiles.POINTWISE_OPS` times its
    count per layer, over the dense models (a mixture of experts' activation runs inside its experts)."""
    rows = []
    for (gpu, model, tp, tokens), g in ops[ops["op"].isin(list(_op.POINTWISE_OPS))].groupby(
            ["gpu", "model", "tp", "tokens"]):
        if "act_fn" not in set(g["op"]):
            continue
        m = _model_spec(str(model))
        t = float(sum(_op.POINTWISE_OPS[o] * s for o, s in zip(g["op"], g["time_s"])))
        rows.append({"gpu": gpu, "model": model, "tp": int(tp), "num_tokens": int(tokens), "pointwise_s": t,
                     "hidden_size": m.hidden_size, "num_q_heads": m.num_q_heads, "num_kv_heads": m.num_kv_heads,
                     "head_dim": m.head_dim, "intermediate_size": m.intermediate_size})
    return pd.DataFrame(rows)


def profile_attention_work(att: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per-layer aggregates of an engine profile's attention rows (one chunk of ``prefill_chunk``
    tokens after ``kv_prefill`` cached, plus ``n_decode`` decodes of ``kv_decode`` context), counted
    as the simulator counts an iteration: sequences, tokens, KV bytes read, FLOPs, the decodes'
    KV bytes where the batch also prefills, and the phase."""
    pc, kp, nd, kd = (att[c].to_numpy(dtype=np.int64) for c in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"))
    kv_bytes = np.empty(len(att))
    flops = np.empty(len(att))
    for (model, tp), idx in att.groupby(["model", "tp"]).indices.items():
        m = _model_spec(str(model))
        kv_bytes[idx] = m.kv_bytes_per_token_per_layer(tp=int(tp))
        flops[idx] = m.attention_flops_per_pair_per_layer / int(tp)
    pairs = nd * (kd + 1) + prefill_attention_pairs(pc, kp)
    kv_tokens = nd * (kd + 1) + np.where(pc > 0, kp + pc, 0)
    phase = np.where(nd == 0, "prefill", np.where(pc == 0, "decode", "mixed"))
    mixed = np.where((pc > 0) & (nd > 0), nd * (kd + 1), 0)
    return {"num_seqs": (nd + (pc > 0)).astype(np.float64), "num_tokens": (pc + nd).astype(np.float64),
            "kv_bytes": kv_bytes * kv_tokens, "flops": flops * pairs, "mixed_kv_bytes": kv_bytes * mixed,
            "phase": phase}


def network_gpu(gpu: str) -> str:
    """The GPU of :data:`GPUS` whose measured interconnect prices ``gpu``'s collectives: the
    nearest by spec (:func:`.measured.spec_distance`), scaled by the interconnect ratio."""
    return min(sorted(GPUS), key=lambda name: spec_distance(_gpu_spec(gpu), _gpu_spec(name)))


def _gpu_entry(fam: str, entry: Mapping[str, Any], gpus: Mapping[str, Any],
               networks: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gpus`` entry of a GPU priced by family ``fam``: its own host's measured collectives
    (:mod:`.host_collectives`: ``network`` with GPU peer-to-peer, ``network_no_p2p`` without) or
    Vidur's, else the nearest measured interconnect's (:func:`network_gpu`), by link speed."""
    name = entry["gpu"]
    own = _host.network_name(name, True)
    if own in networks:
        out = {"family": fam, "network": own,
               "label": f"{entry['label']}, collectives measured on its own host"}
        if _host.network_name(name, False) in networks:
            out["network_no_p2p"] = _host.network_name(name, False)
        return out
    if name in gpus:
        net = gpus[name]["network"]
        return {"family": fam, "network": net, "label": f"{entry['label']}, {net} collectives"}
    near = network_gpu(name)
    net = gpus[near]["network"]
    ratio = _gpu_spec(name).interconnect_bytes_per_s / _gpu_spec(near).interconnect_bytes_per_s
    return {"family": fam, "network": net, "network_gpu": near,
            "label": f"{entry['label']}, {net} collectives of {near} x{ratio:.2f} by interconnect"}


def _with_engine_family(fam: str, entry: Mapping[str, Any], gpus: Mapping[str, Any],
                        networks: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gpus`` entries an engine family ``fam`` (:func:`engine_families`) prices: its GPU's, and where
    Vidur profiled that GPU in 2024, every GPU of that Vidur family (a 40 GB or PCIe A100, scaled by spec
    as before), each keeping the Vidur family as its ``"2024"`` era (:data:`.measured.KERNEL_ERAS`)."""
    gpu = entry["gpu"]
    vidur = gpus[gpu]["family"] if gpu in gpus and PROFILED_GPUS.get(gpus[gpu]["family"]) == gpu else None
    out = {gpu: _gpu_entry(fam, entry, gpus, networks)}
    if vidur is None:
        return out
    for name, e in gpus.items():
        if e["family"] == vidur:
            today = out[gpu] if name == gpu else {
                **e, "family": fam, "label": f"{entry['label']}, scaled by spec to {name}, {e['network']} collectives"}
            out[name] = {**today, "eras": {"2024": {"family": vidur, "label": e["label"]}}}
    return out


def gemm_table_ratio(rows: pd.DataFrame, curve: GemmCurve) -> dict[str, Any]:
    """A GEMM table over its fitted curve on the table's grid: ``tokens``, ``n``, ``k`` and ``ratio``
    (measured / curve, ``[tokens][n][k]``, 1 where the grid has no row), what prices a layer's GEMMs
    between the grid's points (:func:`.measured.table_correction`).

    Each weight shape's times are first held to the split bound: ``m`` tokens cost at most ``m / m'``
    times the ``m' < m`` before them (a GEMM can run in pieces), which removes the tables' rare spikes
    (the H100's 12,288 x 8,192 weights at 2,048 tokens: 2.15 ms, 4.5x the 1,024 tokens' 0.24 ms)."""
    toks, ns, ks = (sorted(float(x) for x in set(rows[c])) for c in ("m", "n", "k"))
    ratio = np.ones((len(toks), len(ns), len(ks)))
    for (n, k), g in rows.groupby(["n", "k"]):
        g = g.sort_values("m")
        m, t = g["m"].to_numpy(dtype=np.float64), g["time_s"].to_numpy(dtype=np.float64).copy()
        for i in range(1, len(t)):
            t[i] = min(t[i], t[i - 1] * m[i] / m[i - 1])
        ratio[[toks.index(x) for x in m], ns.index(float(n)), ks.index(float(k))] = t / curve.time_s(m, n, k)
    return {"tokens": toks, "n": ns, "k": ks, "ratio": np.round(ratio, 4).tolist()}


def _gemm_entries(table: pd.DataFrame) -> dict[str, Any]:
    """A family's GEMM curve fitted to an engine table's rows, and the table over it (:func:`gemm_table_ratio`)."""
    rows = engine_gemm_rows(table)
    curve = fit_gemm(rows)
    return {"gemm": _gemm_dict(curve), "gemm_table": gemm_table_ratio(rows, curve)}


def engine_gemm_rows(table: pd.DataFrame) -> pd.DataFrame:
    """:mod:`.engine_gemms`' rows in :func:`gemm_rows`' columns (each GEMM its own ``layer``)."""
    return pd.DataFrame({"gpu": table["gpu"], "model": "", "tp": 1, "op": "gemm", "layer": range(len(table)),
                         "m": table["m"].astype(float), "n": table["n"].astype(float), "k": table["k"].astype(float),
                         "time_s": table["time_s"].astype(float)})


def engine_families(table: pd.DataFrame, operators: Mapping[str, Any], attention: pd.DataFrame) -> dict[str, Any]:
    """A family per (GPU, engine release) of :mod:`.engine_gemms`: its GEMM curve and the table over it
    (:func:`gemm_table_ratio`), its attention terms
    fitted to the same release's measured attention (:mod:`.engine_attention`, ``attention``) where that
    was measured, and the pointwise terms of a serving engine's own operators (``operators``:
    :func:`profile_families`, LLMServingSim's vLLM 0.19.0 profiles; the one whose GPU is nearest by spec), their
    byte terms carried by the HBM bandwidth ratio: vLLM's fused norms (the residual add in the RMSNorm), rotary
    and activation, which on these GPUs price at their bytes over HBM (the model's floor) from a few hundred
    tokens, where Vidur's 2024 PyTorch profiles of the same GPUs ran 1.6-2x slower."""
    out: dict[str, Any] = {}
    for (gpu, framework, version), g in table.groupby(["gpu", "framework", "version"]):
        near = min(sorted(operators), key=lambda f: spec_distance(_gpu_spec(str(gpu)), _gpu_spec(operators[f]["gpu"])))
        ratio = _gpu_spec(operators[near]["gpu"]).hbm_bandwidth_bytes_per_s / _gpu_spec(str(gpu)).hbm_bandwidth_bytes_per_s
        pw = dict(operators[near]["pointwise"])
        pw.update(s_per_element=pw["s_per_element"] * ratio, s_per_sharded_element=pw["s_per_sharded_element"] * ratio)
        att = attention[(attention["gpu"] == gpu) & (attention["framework"] == framework)
                        & (attention["version"].astype(str) == str(version))]
        tables = "GEMM and attention tables" if len(att) else "GEMM table"
        out[f"{str(gpu).lower()}_{framework}"] = {
            "label": f"{gpu} (NVIDIA aiconfigurator's {framework} {version} {tables}; pointwise: "
                     f"vLLM's own operators, LLMServingSim's {operators[near]['gpu']} profile carried by HBM bandwidth)",
            "gpu": str(gpu), **_gemm_entries(g), "pointwise": pw,
            **({"attention": {**fit_attention(_engine_attention.profile(att)), "gpu": str(gpu)}} if len(att) else {})}
    return out


def profile_families(ops: pd.DataFrame, att: pd.DataFrame) -> dict[str, Any]:
    """A family per GPU of the operator profiles: GEMM curve, pointwise and attention terms."""
    out: dict[str, Any] = {}
    for gpu, g in ops.groupby("gpu"):
        releases = ", ".join(sorted(set(g["vllm"].astype(str))))
        out[str(gpu).lower()] = {
            "label": f"{gpu} (LLMServingSim's vLLM {releases} operator profiles)", "gpu": str(gpu),
            "gemm": _gemm_dict(fit_gemm(profile_gemm_rows(g))), "pointwise": fit_pointwise(profile_pointwise(g)),
            "attention": {**fit_attention(att[att["gpu"] == gpu]), "gpu": str(gpu)}}
    return out


def fa2_mixed_decode(families: Mapping[str, Any]) -> dict[str, Any]:
    """The extra time a decode's KV read takes in a batch that also prefills, as a ratio to its time in a
    decode-only batch (``s_per_mixed_decode_kv_byte / s_per_kv_byte``), averaged over the families whose
    attention profile has mixed batches (LLMServingSim's vLLM 0.19.0 profiles of the RTX 4090 and RTX PRO
    6000, both FlashAttention 2): :func:`.measured.build` carries it to every other GPU vLLM runs FA2 on
    (:func:`.measured.runs_fa2`) whose own attention has no mixed rows."""
    ratios = {name: f["attention"]["s_per_mixed_decode_kv_byte"] / f["attention"]["s_per_kv_byte"]
              for name, f in sorted(families.items())
              if "s_per_mixed_decode_kv_byte" in f.get("attention", {}) and f["attention"]["s_per_kv_byte"] > 0}
    if not ratios:
        raise ValueError("no attention profile with mixed batches to carry the FA2 mixed-batch penalty from")
    return {"ratio": float(np.mean(list(ratios.values()))), "from": {k: float(v) for k, v in ratios.items()},
            "source": "LLMServingSim's vLLM 0.19.0 attention profiles (FlashAttention 2): extra seconds per decode KV "
                      "byte in a batch that also prefills over those per decode KV byte"}


# ------------------------------------------------------------------------------- everything
def fit_constants(path: str | os.PathLike | None = None, *, linear: pd.DataFrame | None = None) -> dict[str, Any]:
    """Fit every curve to the measured data in ``path`` (default ``../shared/data/measured``).

    ``linear`` replaces the linear profiles read from ``path`` (e.g. a subsample). Returns the
    constants dictionary :mod:`.measured` reads (``families``, ``networks``, ``gpus``,
    ``stacks``, ``sources``).
    """
    linear = _data.vidur_linear(path) if linear is None else linear
    rows = gemm_rows(linear)
    families: dict[str, Any] = {}
    for fam in sorted(linear["gpu"].unique()):
        gemm = fit_gemm(rows[rows["gpu"] == fam])
        families[str(fam)] = {"label": FAMILIES.get(str(fam), str(fam)), "gemm": _gemm_dict(gemm),
                              "pointwise": fit_pointwise(linear[linear["gpu"] == fam])}
    att = {**fit_attention(_data.vidur_attention(path)), "gpu": ATTENTION_GPU}
    networks = collective_curves(_data.vidur_collectives(path))
    networks.update(collective_curves(_host.curve_rows(_host.rows())))
    gpus = {}
    for name, (fam, net) in GPUS.items():
        if fam not in families or net not in networks:
            continue
        gpus[name] = {"family": fam, "network": net,
                      "label": f"{families[fam]['label']}{'' if name == PROFILED_GPUS[fam] else ', scaled by spec to ' + name}"
                               f", {net} collectives"}
    for fam in families:
        families[fam]["gpu"] = PROFILED_GPUS[fam]
    operators = profile_families(_op.layers(), _op.attention())
    for fam, entry in engine_families(_engine.rows(), operators, _engine_attention.rows()).items():
        families[fam] = entry
        gpus.update(_with_engine_family(fam, entry, gpus, networks))
    for fam, entry in operators.items():
        families[fam] = entry
        gpus[entry["gpu"]] = {**_gpu_entry(fam, entry, gpus, networks), "extrapolate": False}
    for name, rows_ in _host.engine_rows(_host.rows()).groupby("gpu"):
        if name in gpus:
            gpus[name]["engine_all_reduce"] = engine_all_reduce(rows_, CUSTOM_ALLREDUCE_MAX_BYTES)
    constants: dict[str, Any] = {"families": families, "attention": att, "networks": networks, "gpus": gpus,
                                 "stacks": {}, "fa2_mixed_decode": fa2_mixed_decode(families)}
    batches = _data.sarathi_batches(path)
    fit_rows = batches[(batches["source"].str.startswith("figure-2")) & ~batches["warmup"]]
    gpu_only = build(SARATHI_MODEL, SARATHI_GPU, tp=SARATHI_TP, constants=constants, stack="none",
                     kernels=SARATHI_KERNELS)
    constants["stacks"][SARATHI_STACK] = {"label": "Sarathi-Serve OSDI'24 batch overheads",
                                          "kernels": SARATHI_KERNELS, **fit_stack(gpu_only, fit_rows)}
    constants["sources"] = SOURCES
    return constants


SOURCES = {
    "vidur": "microsoft/vidur commit 7d47513, data/profiling/ (MIT): compute/{a100,a40,h100}/*/*/mlp.csv, "
             "compute/a100/attention_llama2-70b-tp2-2024-05/attention.csv (blob ee3dec7), network/*/*.csv",
    "sarathi-serve": "microsoft/sarathi-serve commit 02d2567, osdi-experiments/ (Apache-2.0): "
                     "figure-2/decode.csv, figure-2/prefill.csv (first batch of each run left out: warm-up)",
    "llmservingsim": "casys-kaist/LLMServingSim commit 5daddb2, profiler/perf/{RTX4090,RTXPRO6000}/*/*/bf16/ (MIT): "
                     "tp*/dense.csv, attention.csv, per_sequence.csv, reduced in data/costmodels/op_profiles_*.csv",
    "aiconfigurator": "ai-dynamo/aiconfigurator commit 095f58a, aic-core/src/aiconfigurator_core/systems/data/"
                      "{a100_sxm,h100_sxm,h200_sxm,l40s}/{gemm,attention}/vllm/0.14.0, b200_sxm/{gemm,attention}/vllm/0.19.0 "
                      "gemm_perf.parquet, context_attention_perf.parquet and generation_attention_perf.parquet "
                      "(Apache-2.0), reduced in data/costmodels/engine_gemms.csv and engine_attention.csv",
    "host_collectives": "casys-kaist/LLMServingSim profiler/perf/RTXPRO6000/hardware.yaml (MIT): commit e08dc38 "
                        "(2026-09-08, no GPU peer-to-peer) and 1b2cc02 (2026-09-26, ACS and IOMMU disabled: "
                        "peer-to-peer), NCCL all_reduce and all_gather of 2 GPUs; ai-dynamo/aiconfigurator commit "
                        "095f58a, systems/data/{h100_sxm,h200_sxm,a100_sxm,l40s}/comm/vllm/0.14.0 and "
                        "{b200_sxm,rtx_pro_6000_server}/comm/vllm/0.19.0 custom_allreduce_perf.parquet (Apache-2.0): "
                        "vLLM's own TP all-reduce; reduced in data/costmodels/host_collectives.csv",
}


def _gemm_dict(g: GemmCurve) -> dict[str, float]:
    return {"launch_s": g.launch_s, "bytes_per_s": g.bytes_per_s, "flops_per_s": g.flops_per_s,
            "half_tokens": g.half_tokens, "sharpness": g.sharpness}


def write_constants(constants: Mapping[str, Any], path: str | os.PathLike = CONSTANTS_PATH) -> None:
    """Write fitted constants as JSON (sorted keys, 6 significant digits: small diffs on refits)."""
    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return float(f"{x:.6g}")
        if isinstance(x, dict):
            return {k: rounded(val) for k, val in x.items()}
        if isinstance(x, list):
            return [rounded(val) for val in x]
        return x
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rounded(dict(constants)), f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":  # python -m kvlab.costmodel.fit [measured_dir]
    import sys
    write_constants(fit_constants(sys.argv[1] if len(sys.argv) > 1 else None))
    print(f"wrote {CONSTANTS_PATH}")
