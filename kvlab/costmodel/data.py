"""Readers of the public GPU measurements the measured cost model is fitted to.

The files stay outside the project, in ``../shared/data/measured`` from the repository root
(:data:`kvlab._paths.SHARED_DATA_DIR`); each reader returns a tidy table in seconds and bytes:

* :func:`vidur_linear`: Vidur's per-operation profiles of one transformer layer
  (``compute/<gpu>/<org>/<model>/mlp.csv``), one row per (GPU, model, TP, tokens);
* :func:`vidur_attention`: Vidur's A100 attention profile (prefill and decode kernels);
* :func:`vidur_collectives`: all-reduce and send/recv times vs message size per interconnect;
* :func:`sarathi_batches`: Sarathi-Serve's measured batch times (Yi-34B, TP2, two A100-80GB
  PCIe): figure 2 (decode and prefill batches), table 2 (decode, hybrid, prefill batches with
  their linear and attention split) and figure 9 (one prompt prefilled in chunks).

Every reader raises ``ValueError`` naming the file when it is missing or lacks a column.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .. import _validate as v
from .._paths import SHARED_DATA_DIR

#: GEMMs of one layer in Vidur's profiles: (column, what it computes).
GEMM_OPS = {"attn_pre_proj": "QKV projection", "attn_post_proj": "attention output projection",
            "mlp_up_proj": "MLP up (and gate) projection", "mlp_down_proj": "MLP down projection"}
#: Pointwise operations of one layer (each residual add runs twice per layer).
POINTWISE_OPS = {"input_layernorm": 1, "post_attention_layernorm": 1, "attn_rope": 1, "mlp_act": 1, "add": 2}
#: Vidur's model folders and the catalogue names of the same shapes (None: not in the catalogue).
VIDUR_MODELS = {"Llama-2-7b-hf": "Llama-2-7B", "Llama-2-70b-hf": "Llama-2-70B", "Meta-Llama-3-8B": "Llama-3-8B",
                "Meta-Llama-3-70B": "Llama-3-70B", "CodeLlama-34b-Instruct-hf": "CodeLlama-34B",
                "phi-2": "phi-2"}
#: Sarathi-Serve's batches: the first batch of a run (Batch Id 0) includes warm-up and is left out.
SARATHI_DECODE_CONTEXT_TOKENS = 1024


def measured_dir(path: str | os.PathLike | None = None) -> Path:
    """The folder of measured data: ``path``, else ``<shared data>/measured``; ``ValueError`` if absent."""
    d = SHARED_DATA_DIR / "measured" if path is None else Path(path)
    if not d.is_dir():
        raise ValueError(f"measured_dir {str(d)!r} is not a folder (expected ../shared/data/measured with "
                         f"vidur/ and sarathi-serve-osdi24/)")
    return d


def available(path: str | os.PathLike | None = None) -> bool:
    """Whether the measured data are present (tests and notebooks skip the fits without them)."""
    try:
        d = measured_dir(path)
    except ValueError:
        return False
    return (d / "vidur" / "compute").is_dir() and (d / "sarathi-serve-osdi24").is_dir()


def _csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise ValueError(f"measured file {str(path)!r} is missing")
    table = pd.read_csv(path)
    v.require_columns(table, columns, f"measured file {path.name} ({path.parent})")
    return table


def shipped_table(path: str | os.PathLike, columns: tuple[str, ...], remake: str) -> pd.DataFrame:
    """A table kvlab ships in ``data/costmodels`` (derived from measurements outside ``../shared``);
    ``ValueError`` names it, with the command (``remake``) that writes it, when missing or short of a column."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"shipped table {str(p)!r} is missing ({remake} writes it)")
    table = pd.read_csv(p)
    v.require_columns(table, columns, f"shipped table {p.name}")
    return table


def aiconfigurator_table(path: Path, where: str, columns: tuple[str, ...], expected: str) -> tuple[str, pd.DataFrame]:
    """One of NVIDIA aiconfigurator's parquet tables (``systems/data/<system>/...``): the catalogue name of
    the one GPU it timed, and its rows. ``ValueError`` names ``where`` when the file is missing
    (``expected`` says where it belongs), lacks ``columns``, or times other than one catalogued device.
    Reading parquet needs pyarrow (kvlab's ``parquet`` extra)."""
    from ..specs import gpu as _gpu

    if not path.is_file():
        raise ValueError(f"{where} is missing (expected {expected})")
    table = pd.read_parquet(path)
    v.require_columns(table, columns, where)
    devices = sorted(set(table["device"].astype(str)))
    if len(devices) != 1:
        raise ValueError(f"{where}: one device expected, got {devices}")
    try:
        return _gpu(devices[0]).name, table
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def write_csv_atomically(table: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``table`` as CSV (6 significant digits) to a temporary file beside ``path``, then rename it."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    table.to_csv(tmp, index=False, float_format="%.6g")
    os.replace(tmp, p)


def vidur_linear(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Vidur's linear and pointwise operation times, one row per (gpu, model, tp, num_tokens).

    Columns ``gpu`` (Vidur's SKU folder: a100, a40, h100), ``model`` (catalogue name where the
    catalogue has the shape), ``tp``, ``num_tokens``, the shape (``num_q_heads``,
    ``num_kv_heads``, ``hidden_size``, ``intermediate_size``, ``gated_mlp``), each GEMM's and
    pointwise op's median time (``<op>_s``, seconds), and ``linear_s`` (the four GEMMs) and
    ``pointwise_s`` (the pointwise ops, each add twice).
    """
    root = measured_dir(path) / "vidur" / "compute"
    shape = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
             "num_tensor_parallel_workers")
    ops = [*GEMM_OPS, *POINTWISE_OPS]
    frames = []
    for f in sorted(root.glob("*/*/*/mlp.csv")):
        t = _csv(f, shape + tuple(f"time_stats.{op}.median" for op in GEMM_OPS))
        out = pd.DataFrame({
            "gpu": f.parts[-4], "model": VIDUR_MODELS.get(f.parts[-2], f.parts[-2]),
            "tp": t["num_tensor_parallel_workers"].astype(int), "num_tokens": t["num_tokens"].astype(int),
            "num_q_heads": t["n_head"].astype(int), "num_kv_heads": t["n_kv_head"].astype(int),
            "hidden_size": t["n_embd"].astype(int), "intermediate_size": t["n_expanded_embd"].astype(int),
            "gated_mlp": t["use_gated_mlp"].astype(str).str.lower() == "true"})
        for op in ops:  # a pointwise op the architecture lacks (phi-2: one norm per layer) counts 0 s
            col = f"time_stats.{op}.median"
            out[f"{op}_s"] = t[col].to_numpy(dtype=np.float64) * 1e-3 if col in t.columns else 0.0
        frames.append(out)
    if not frames:
        raise ValueError(f"no Vidur profiles (*/*/*/mlp.csv) under {str(root)!r}")
    table = pd.concat(frames, ignore_index=True)
    table["linear_s"] = table[[f"{op}_s" for op in GEMM_OPS]].sum(axis=1)
    table["pointwise_s"] = sum(n * table[f"{op}_s"] for op, n in POINTWISE_OPS.items())
    return table


def gemm_shapes(table: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-GPU ``(n, k)`` of each GEMM of ``table``'s rows (output and input features)."""
    head_dim = table["hidden_size"] / table["num_q_heads"]
    tp = table["tp"]
    q = table["num_q_heads"] * head_dim / tp
    kv = np.maximum(1, np.ceil(table["num_kv_heads"] / tp)) * head_dim
    ff = table["intermediate_size"] / tp
    h = table["hidden_size"].astype(float)
    up = np.where(table["gated_mlp"], 2.0, 1.0) * ff
    return {"attn_pre_proj": ((q + 2 * kv).to_numpy(), h.to_numpy()), "attn_post_proj": (h.to_numpy(), q.to_numpy()),
            "mlp_up_proj": (np.asarray(up), h.to_numpy()), "mlp_down_proj": (h.to_numpy(), ff.to_numpy())}


def vidur_attention(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Vidur's A100 attention profile (Llama-2-70B shape at TP2: 32 query and 4 KV heads of 128
    per GPU; FlashAttention, block 16), one row per measurement.

    Columns ``phase`` (prefill or decode), ``batch_size``, ``chunk_tokens`` (prefill chunk; 1 for
    decode), ``context_tokens`` (KV already cached per sequence), ``attention_s`` (median, seconds,
    the kernel plus its input and output reshapes), ``num_q_heads``, ``num_kv_heads``,
    ``head_dim`` (per GPU).
    """
    f = measured_dir(path) / "vidur" / "compute" / "a100" / "attention_llama2-70b-tp2-2024-05" / "attention.csv"
    cols = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "batch_size", "prefill_chunk_size",
            "kv_cache_size", "is_prefill", "time_stats.attn_decode.median", "time_stats.attn_prefill.median",
            "time_stats.attn_input_reshape.median", "time_stats.attn_output_reshape.median")
    t = _csv(f, cols)
    prefill = t["is_prefill"].astype(str).str.lower() == "true"
    kernel = np.where(prefill, t["time_stats.attn_prefill.median"], t["time_stats.attn_decode.median"])
    tp = t["num_tensor_parallel_workers"].astype(int)
    return pd.DataFrame({
        "phase": np.where(prefill, "prefill", "decode"), "batch_size": t["batch_size"].astype(int),
        "chunk_tokens": np.where(prefill, t["prefill_chunk_size"], 1).astype(int),
        "context_tokens": t["kv_cache_size"].astype(int),
        "attention_s": (kernel + t["time_stats.attn_input_reshape.median"]
                        + t["time_stats.attn_output_reshape.median"]).to_numpy(dtype=np.float64) * 1e-3,
        "num_q_heads": (t["n_q_head"] // tp).astype(int), "num_kv_heads": (t["n_kv_head"] // tp).astype(int),
        "head_dim": (t["n_embd"] // t["n_q_head"]).astype(int)})


def vidur_collectives(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Collective times per interconnect, one row per measurement.

    Columns ``network`` (Vidur's folder, e.g. a100_pairwise_nvlink), ``collective``
    (all_reduce or send_recv), ``num_gpus``, ``message_bytes``, ``time_s`` (median, seconds).
    Only single-node runs (every GPU in one node: ``devices_per_node == num_workers``; send/recv
    between two GPUs of one node).
    """
    root = measured_dir(path) / "vidur" / "network"
    frames = []
    for f in sorted(root.glob("*/*.csv")):
        coll = f.stem
        t = _csv(f, ("num_workers", "devices_per_node", "size", f"time_stats.{coll}.median"))
        t = t[t["devices_per_node"] == t["num_workers"]]
        frames.append(pd.DataFrame({"network": f.parent.name, "collective": coll,
                                    "num_gpus": t["num_workers"].astype(int),
                                    "message_bytes": t["size"].astype(np.float64),
                                    "time_s": t[f"time_stats.{coll}.median"].to_numpy(dtype=np.float64) * 1e-3}))
    if not frames:
        raise ValueError(f"no collective curves (*/*.csv) under {str(root)!r}")
    return pd.concat(frames, ignore_index=True)


def sarathi_batches(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Sarathi-Serve's measured iterations (Yi-34B, TP2, A100-80GB PCIe pairs), one row per batch.

    Columns ``source`` (figure-2 decode, figure-2 prefill, table-2, figure-9), ``kind`` (decode,
    prefill, hybrid, chunked prefill), ``prefill_tokens``, ``chunk_tokens`` (figure 9),
    ``decode_seqs``, ``decode_context_tokens`` (the README's ~1k for figure 2; table 2 does not
    state it and 1k is assumed), ``measured_s`` (seconds), ``linear_s`` and ``attention_s``
    (table 2's split, seconds; NaN elsewhere), ``warmup`` (True for a run's first batch).
    """
    root = measured_dir(path) / "sarathi-serve-osdi24"
    rows = []
    for kind in ("decode", "prefill"):
        t = _csv(root / "figure-2" / f"{kind}.csv", ("batch_num_prefill_tokens", "batch_num_decode_tokens",
                                                     "batch_size", "Batch Id", "batch_execution_time"))
        for _, r in t.iterrows():
            rows.append({"source": f"figure-2 {kind}", "kind": kind,
                         "prefill_tokens": int(r["batch_num_prefill_tokens"]),
                         "decode_seqs": int(r["batch_num_decode_tokens"]), "chunk_tokens": 0,
                         "measured_s": float(r["batch_execution_time"]), "warmup": float(r["Batch Id"]) == 0.0})
    t = _csv(root / "table-2" / "results.csv", ("batch_num_prefill_tokens", "batch_num_decode_tokens",
                                                "batch_execution_time", "linear", "attention"))
    for _, r in t.iterrows():
        p, d = int(r["batch_num_prefill_tokens"]), int(r["batch_num_decode_tokens"])
        rows.append({"source": "table-2", "kind": "hybrid" if p and d else "prefill" if p else "decode",
                     "prefill_tokens": p, "decode_seqs": d, "chunk_tokens": 0,
                     "measured_s": float(r["batch_execution_time"]) * 1e-3, "linear_s": float(r["linear"]) * 1e-3,
                     "attention_s": float(r["attention"]) * 1e-3, "warmup": False})
    t = _csv(root / "figure-9" / "chunking-overhead.csv", ("prefill_length", "chunk_size", "prefill_execution_time"))
    for _, r in t.iterrows():
        rows.append({"source": "figure-9", "kind": "chunked prefill", "prefill_tokens": int(r["prefill_length"]),
                     "decode_seqs": 0, "chunk_tokens": int(r["chunk_size"]),
                     "measured_s": float(r["prefill_execution_time"]) * 1e-3, "warmup": False})
    table = pd.DataFrame(rows)
    table["decode_context_tokens"] = np.where(table["decode_seqs"] > 0, SARATHI_DECODE_CONTEXT_TOKENS, 0)
    return table
