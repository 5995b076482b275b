"""Attention times measured through a serving engine's own attention backend: NVIDIA aiconfigurator's tables.

aiconfigurator (ai-dynamo/aiconfigurator, ``aic-core/src/aiconfigurator_core/systems/data/<system>/
attention/<framework>/<version>/``) times, per GPU and engine release, one layer's attention through the
engine's own backend (for vLLM its FlashAttention build, ``kernel_source`` ``vllm_flash_attn``: FA3 on
Hopper, FA2 elsewhere; CUDA-graph replays, latency in milliseconds):

* ``context_attention_perf.parquet``: a prefill of ``batch_size`` sequences of ``isl`` tokens each from
  an empty cache (causal);
* ``generation_attention_perf.parquet``: one decode token of each of ``batch_size`` sequences over
  ``step`` cached tokens (``isl`` 1).

Both name ``num_heads``, ``num_key_value_heads`` and ``head_dim`` per GPU, ``kv_cache_dtype`` and
``attn_dtype``, and ``kernel_source``: the backend timed (some tables time several; kvlab keeps the one
vLLM runs by default there, :func:`default_kernel`).

kvlab ships the rows it fits to (:data:`SHIPPED`, each GPU's GEMM release of :mod:`.engine_gemms`) and
those it only checks against (:data:`CHECKED`: later releases, and GPUs it prices from other
measurements; batches of :data:`CHECK_BATCH`), reduced by :func:`read_table` and :func:`physical` to
BF16 activations and KV cache, ``head_dim`` 128, the head counts of :data:`HEADS` and :data:`KV_HEADS`
and the sizes of :data:`MAX_PREFILL_TOKENS` and :data:`MAX_DECODE_BATCH`, in seconds, in the columns
:func:`kvlab.costmodel.fit.fit_attention` reads (``phase``, ``batch_size``, ``chunk_tokens``,
``context_tokens``, ``num_q_heads``, ``num_kv_heads``, ``head_dim``) as
``data/costmodels/engine_attention.csv`` and ``engine_attention_check.csv``. ``python -m
kvlab.costmodel.engine_attention SYSTEMS_DIR`` rewrites both (reading parquet needs pyarrow,
kvlab's ``parquet`` extra).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .._paths import DATA_DIR
from ..specs import gpu as _gpu
from .data import aiconfigurator_table, shipped_table, write_csv_atomically
from .engine_gemms import SHIPPED
from .measured import vllm_attention_backend

PATH = DATA_DIR / "costmodels" / "engine_attention.csv"
CHECK_PATH = DATA_DIR / "costmodels" / "engine_attention_check.csv"
REMAKE = "python -m kvlab.costmodel.engine_attention SYSTEMS_DIR"
#: What is checked against, never fitted to: the same GPUs' latest vLLM releases, and the vLLM tables of
#: GPUs kvlab prices from other measurements (RTX PRO 6000: LLMServingSim's operator profiles of vLLM 0.19.0).
CHECKED = (("h100_sxm", "vllm", "0.19.0"), ("h200_sxm", "vllm", "0.19.0"), ("b200_sxm", "vllm", "0.22.0"),
           ("l40s", "vllm", "0.24.0"), ("rtx_pro_6000_server", "vllm", "0.19.0"))
COLUMNS = ("gpu", "framework", "version", "phase", "batch_size", "chunk_tokens", "context_tokens", "num_q_heads",
           "num_kv_heads", "head_dim", "time_s")
SOURCE_COLUMNS = ("framework", "version", "device", "kernel_source", "batch_size", "isl", "num_heads",
                  "num_key_value_heads", "head_dim", "attn_dtype", "kv_cache_dtype", "step", "latency")
KEY = ("batch_size", "isl", "num_heads", "num_key_value_heads", "step")
#: Query heads per GPU kept: those of today's models split by TP (every table has them).
HEADS = (8, 16, 32, 64)
#: KV heads per GPU kept (at most the query heads): grouped-query attention split by TP, and 32 (multi-head
#: attention of 7B-class models; the decode tables stop at 8).
KV_HEADS = (1, 2, 4, 8, 32)
#: Prefill rows kept: ``batch_size x isl`` up to this many tokens (a chunk's size and beyond).
MAX_PREFILL_TOKENS = 65_536
#: Decode rows kept: batches up to this size, contexts up to 16k tokens, ``batch x context`` up to 2^20.
MAX_DECODE_BATCH = 256
MAX_DECODE_CONTEXT = 16_384
MAX_DECODE_KV_TOKENS = 2 ** 20
#: Batch sizes of the check rows (a coarser grid of the same shapes).
CHECK_BATCH = (1, 4, 16, 64, 256)


def default_kernel(gpu: str, kernels: list[str], where: str) -> str:
    """Which of a table's ``kernel_source`` values is vLLM's default backend on ``gpu`` (catalogue name,
    :func:`.measured.vllm_attention_backend`): FlashInfer's, or FlashAttention's (FA2 or FA3, not the FA4
    some later tables add); ``ValueError`` where the table has none or several."""
    if vllm_attention_backend(_gpu(gpu)) == "FlashInfer":
        chosen = [k for k in kernels if k.startswith("vllm_flashinfer")]
    else:
        chosen = [k for k in kernels if k.startswith("vllm_flash_attn") and not k.endswith("fa4")]
    if len(chosen) != 1:
        raise ValueError(f"{where}: expected one kernel of vLLM's default backend on {gpu} among {kernels}")
    return chosen[0]


def _read(path: Path, where: str) -> tuple[str, pd.DataFrame]:
    """``path``'s GPU (catalogue name) and its rows kept: BF16, ``head_dim`` 128, :data:`HEADS` x
    :data:`KV_HEADS`, vLLM's default kernel, repeated measurements of one shape as their median."""
    where = f"{where} {path}"
    gpu, table = aiconfigurator_table(path, where, SOURCE_COLUMNS,
                                      f"<systems>/<system>/attention/<framework>/<version>/{path.name}")
    if not (table["latency"] > 0).all():
        raise ValueError(f"{where}: latency must be positive")
    kernel = default_kernel(gpu, sorted(set(table["kernel_source"].astype(str))), where)
    keep = ((table["kernel_source"] == kernel) & (table["attn_dtype"] == "bfloat16")
            & (table["kv_cache_dtype"] == "bfloat16") & (table["head_dim"] == 128)
            & table["num_heads"].isin(HEADS) & table["num_key_value_heads"].isin(KV_HEADS)
            & (table["num_key_value_heads"] <= table["num_heads"]))
    return gpu, table[keep].groupby(list(KEY), as_index=False)["latency"].median()


def read_table(systems_dir: str | os.PathLike, system: str, framework: str, version: str) -> pd.DataFrame:
    """One release's context and generation tables reduced to the shipped rows (:data:`COLUMNS`): a
    prefill row is ``batch_size`` chunks of ``isl`` tokens after no cached context, a decode row
    ``batch_size`` decodes after ``step`` cached tokens. ``ValueError`` names the file when it is missing
    or malformed."""
    folder = Path(systems_dir) / system / "attention" / framework / version
    gpu, ctx = _read(folder / "context_attention_perf.parquet", "context attention table")
    ctx = ctx[ctx["batch_size"] * ctx["isl"] <= MAX_PREFILL_TOKENS]
    gen_gpu, gen = _read(folder / "generation_attention_perf.parquet", "generation attention table")
    gen = gen[(gen["batch_size"] <= MAX_DECODE_BATCH) & (gen["step"] <= MAX_DECODE_CONTEXT)
              & (gen["batch_size"] * gen["step"] <= MAX_DECODE_KV_TOKENS)]
    if gen_gpu != gpu or ctx.empty or gen.empty:
        raise ValueError(f"attention tables under {folder}: one GPU with prefill and decode rows expected, got "
                         f"{gpu} and {gen_gpu}, {len(ctx)} prefill and {len(gen)} decode rows")
    parts = [(ctx, "prefill", ctx["isl"], 0), (gen, "decode", 1, gen["step"])]
    out = pd.concat([pd.DataFrame({"gpu": gpu, "framework": framework, "version": version, "phase": phase,
                                   "batch_size": t["batch_size"].astype(int), "chunk_tokens": chunk,
                                   "context_tokens": context, "num_q_heads": t["num_heads"].astype(int),
                                   "num_kv_heads": t["num_key_value_heads"].astype(int),
                                   "head_dim": 128, "time_s": t["latency"] * 1e-3})
                     for t, phase, chunk, context in parts], ignore_index=True)
    return out[list(COLUMNS)].astype({"chunk_tokens": np.int64, "context_tokens": np.int64})


def physical(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``table`` (:data:`COLUMNS`) without what cannot be one layer's attention from HBM, and what was
    dropped: a release's prefill rows where any is faster than its FLOPs at the GPU's dense BF16 peak
    (that table does not time the full causal prefill its columns describe), and decode rows faster than
    their KV bytes at the GPU's HBM bandwidth (the KV of the one timed layer served from the L2 cache,
    as in a model whose every layer reads its own it is not)."""
    from .fit import attention_work  # the fit's own count of the rows' FLOPs and KV bytes

    keep = np.ones(len(table), dtype=bool)
    notes = []
    for (gpu, version), t in table.groupby(["gpu", "version"], sort=False):
        g = _gpu(str(gpu))
        work = attention_work(t)
        time = t["time_s"].to_numpy()
        prefill = (t["phase"] == "prefill").to_numpy()
        too_fast = time < work["flops"] / g.gemm_flops_per_s("bf16")
        cached = ~prefill & (time < work["kv_bytes"] / g.hbm_bandwidth_bytes_per_s)
        if too_fast[prefill].any():
            notes.append(f"{gpu} {version} prefill: {int(too_fast[prefill].sum())} of {int(prefill.sum())} rows faster "
                         "than the dense peak (not the full causal prefill): every prefill row dropped")
            keep[t.index[prefill]] = False
        if cached.any():
            notes.append(f"{gpu} {version} decode: {int(cached.sum())} of {int((~prefill).sum())} rows faster than HBM "
                         "(the KV served from L2) dropped")
            keep[t.index[cached]] = False
    return table[keep], notes


def rows(path: str | os.PathLike = PATH) -> pd.DataFrame:
    """The shipped rows (:data:`COLUMNS`) kvlab fits each GPU's attention to."""
    return shipped_table(path, COLUMNS, REMAKE)


def checks(path: str | os.PathLike = CHECK_PATH) -> pd.DataFrame:
    """The shipped rows (:data:`COLUMNS`) kvlab checks its attention against and fits nothing to."""
    return shipped_table(path, COLUMNS, REMAKE)


def profile(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s rows as :func:`kvlab.costmodel.fit.fit_attention` reads an attention profile
    (``attention_s`` for ``time_s``)."""
    return table.rename(columns={"time_s": "attention_s"})


def write(systems_dir: str | os.PathLike, path: Path = PATH, check_path: Path = CHECK_PATH) -> list[str]:
    """Read the :data:`SHIPPED` (:mod:`.engine_gemms`' releases) and :data:`CHECKED` tables under
    ``systems_dir``, keep what is physical (:func:`physical`), write both CSVs atomically and return what
    was dropped."""
    order = ["gpu", "framework", "version", "phase", "num_q_heads", "num_kv_heads", "batch_size", "chunk_tokens",
             "context_tokens"]
    notes = []
    for chosen, out, batches in ((SHIPPED, path, None), (CHECKED, check_path, CHECK_BATCH)):
        table, dropped = physical(pd.concat([read_table(systems_dir, *s) for s in chosen], ignore_index=True))
        notes += dropped
        if batches:
            table = table[table["batch_size"].isin(batches)]
        write_csv_atomically(table.sort_values(order), out)
    return notes


if __name__ == "__main__":  # python -m kvlab.costmodel.engine_attention SYSTEMS_DIR
    if len(sys.argv) != 2:
        sys.exit(f"usage: {REMAKE} (aiconfigurator's systems/data folder)")
    for line in write(sys.argv[1]):
        print(f"left out {line}")
    print(f"wrote {PATH} and {CHECK_PATH}")
