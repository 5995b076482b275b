"""GEMM times measured through a serving engine's own linear layer: NVIDIA aiconfigurator's tables.

aiconfigurator (ai-dynamo/aiconfigurator, ``aic-core/src/aiconfigurator_core/systems/data/<system>/
gemm/<framework>/<version>/gemm_perf.parquet``) times, per GPU and engine release, one GEMM of
``m`` tokens by an ``n x k`` weight through the engine's linear layer: for vLLM, a
``RowParallelLinear`` with synthetic weights (``collector/vllm/collect_gemm.py``), six weight
copies per timed loop (so the weights come from HBM, not the L2 cache) and CUDA-graph replays,
latency in milliseconds. Its columns: ``framework, version, device, op_name, kernel_source,
gemm_dtype, m, n, k, latency``.

kvlab ships the rows it fits to (:data:`SHIPPED`: BF16, both weight dimensions in :data:`DIMS`,
``m`` in :data:`TOKENS`), in seconds and catalogue names, as ``data/costmodels/engine_gemms.csv``, and
a grid of the tables it checks its pricing against and fits nothing to (:data:`CHECKED`: other GPUs,
other releases; ``m`` in :data:`CHECK_M`, weight dims in :data:`CHECK_DIMS`) as
``engine_gemms_check.csv``. :func:`rows` and :func:`checks` read them, and ``python -m
kvlab.costmodel.engine_gemms SYSTEMS_DIR`` rewrites both from a checkout's ``systems/data`` folder
(reading parquet needs pyarrow, kvlab's ``parquet`` extra).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

from .._paths import DATA_DIR
from .data import aiconfigurator_table, shipped_table, write_csv_atomically

PATH = DATA_DIR / "costmodels" / "engine_gemms.csv"
CHECK_PATH = DATA_DIR / "costmodels" / "engine_gemms_check.csv"
#: What is shipped to fit: (aiconfigurator system folder, framework folder, release), each GPU's
#: earliest vLLM table.
SHIPPED = (("h100_sxm", "vllm", "0.14.0"), ("h200_sxm", "vllm", "0.14.0"), ("b200_sxm", "vllm", "0.19.0"),
           ("l40s", "vllm", "0.14.0"), ("a100_sxm", "vllm", "0.14.0"))
#: What is shipped to check against: the same GPUs' later releases, GPUs kvlab prices from other
#: measurements (RTX PRO 6000: LLMServingSim's operator profiles), and the
#: other engines' GEMMs on the same GPUs (SGLang's and TensorRT-LLM's linear layers; kvlab prices every
#: server's GEMMs from vLLM's).
CHECKED = (("h100_sxm", "vllm", "0.19.0"), ("h200_sxm", "vllm", "0.19.0"), ("b200_sxm", "vllm", "0.24.0"),
           ("l40s", "vllm", "0.22.0"), ("rtx_pro_6000_server", "vllm", "0.19.0"),
           ("h100_sxm", "sglang", "0.5.9"), ("h100_sxm", "sglang", "0.5.14"), ("h100_sxm", "trtllm", "1.2.0rc5"),
           ("h100_sxm", "trtllm", "1.3.0rc20"), ("h200_sxm", "sglang", "0.5.9"), ("h200_sxm", "sglang", "0.5.14"),
           ("h200_sxm", "trtllm", "1.2.0rc5"), ("h200_sxm", "trtllm", "1.3.0rc20"), ("b200_sxm", "sglang", "0.5.9"),
           ("b200_sxm", "sglang", "0.5.14"), ("b200_sxm", "trtllm", "1.2.0rc5"), ("b200_sxm", "trtllm", "1.3.0rc20"),
           ("l40s", "sglang", "0.5.9"), ("l40s", "sglang", "0.5.14"), ("l40s", "trtllm", "1.0.0"),
           ("l40s", "trtllm", "1.3.0rc20"), ("a100_sxm", "sglang", "0.5.9"), ("a100_sxm", "sglang", "0.5.10"),
           ("a100_sxm", "trtllm", "1.0.0"))
CHECK_M = (1, 4, 16, 64, 256, 1024, 4096)
CHECK_DIMS = (1024, 2048, 4096, 8192, 16384)
COLUMNS = ("gpu", "framework", "version", "m", "n", "k", "time_s")
SOURCE_COLUMNS = ("framework", "version", "device", "gemm_dtype", "m", "n", "k", "latency")
#: The weight dimensions kept (each side): a transformer's widths from 1k to 16k, every table has them.
DIMS = (1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
#: The token counts kept: those every table has (some tables sweep more).
TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192)


def read_table(systems_dir: str | os.PathLike, system: str, framework: str, version: str) -> pd.DataFrame:
    """One ``gemm_perf.parquet`` reduced to the shipped rows (BF16, both weight dims in :data:`DIMS`,
    ``m`` in :data:`TOKENS`);
    ``ValueError`` names the file when it is missing or malformed."""
    path = Path(systems_dir) / system / "gemm" / framework / version / "gemm_perf.parquet"
    gpu, table = aiconfigurator_table(path, f"GEMM table {str(path)!r}", SOURCE_COLUMNS,
                                      "<systems>/<system>/gemm/<framework>/<version>/gemm_perf.parquet")
    keep = (table["gemm_dtype"] == "bfloat16") & table["n"].isin(DIMS) & table["k"].isin(DIMS) & table["m"].isin(TOKENS)
    t = table[keep]
    if not (t["latency"] > 0).all():
        raise ValueError(f"GEMM table {str(path)!r}: latency must be positive")
    return pd.DataFrame({"gpu": gpu, "framework": framework, "version": version, "m": t["m"].astype(int),
                         "n": t["n"].astype(int), "k": t["k"].astype(int), "time_s": t["latency"] * 1e-3})[list(COLUMNS)]


def rows(path: str | os.PathLike = PATH) -> pd.DataFrame:
    """The shipped rows: gpu, framework, version, m, n, k, time_s."""
    return shipped_table(path, COLUMNS, "python -m kvlab.costmodel.engine_gemms SYSTEMS_DIR")


def checks(path: str | os.PathLike = CHECK_PATH) -> pd.DataFrame:
    """The shipped check grid: gpu, framework, version, m, n, k, time_s."""
    return shipped_table(path, COLUMNS, "python -m kvlab.costmodel.engine_gemms SYSTEMS_DIR")


def write(systems_dir: str | os.PathLike, path: Path = PATH, check_path: Path = CHECK_PATH) -> None:
    """Read the :data:`SHIPPED` and :data:`CHECKED` tables under ``systems_dir`` and write both CSVs atomically."""
    order = ["gpu", "framework", "version", "n", "k", "m"]
    table = pd.concat([read_table(systems_dir, *s) for s in SHIPPED], ignore_index=True)
    write_csv_atomically(table.sort_values(order), path)
    grid = pd.concat([read_table(systems_dir, *s) for s in CHECKED], ignore_index=True)
    grid = grid[grid["m"].isin(CHECK_M) & grid["n"].isin(CHECK_DIMS) & grid["k"].isin(CHECK_DIMS)]
    write_csv_atomically(grid.sort_values(order), check_path)


if __name__ == "__main__":  # python -m kvlab.costmodel.engine_gemms SYSTEMS_DIR
    if len(sys.argv) != 2:
        sys.exit("usage: python -m kvlab.costmodel.engine_gemms SYSTEMS_DIR (aiconfigurator's systems/data folder)")
    write(sys.argv[1])
    print(f"wrote {PATH} and {CHECK_PATH}")
