"""Model and GPU specifications: the numbers every memory and time estimate in kvlab starts from.

Shipped as ``data/models.csv`` and ``data/gpus.csv``, one row per model or GPU with its source.
Names are matched ignoring case, spaces, hyphens and underscores ("Llama-3-8B" == "llama3_8b").

KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes; under tensor
parallelism each GPU holds kv_heads / TP heads (at least one: heads are replicated when TP exceeds
them, as vLLM does) and under pipeline parallelism layers / PP layers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from functools import lru_cache

import pandas as pd

from . import _validate as v
from ._intmath import ceil_div
from ._paths import DATA_DIR

MIB = 1024**2
GIB = 1024**3


def _key(name: str) -> str:
    return re.sub(r"[\s\-_]", "", str(name)).lower()


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shapes.

    Parameters
    ----------
    num_layers, num_q_heads, num_kv_heads, head_dim, hidden_size, intermediate_size : int
        Architecture (heads and dims in elements).
    gated_mlp : bool
        SwiGLU-style MLP with three matrices (Llama) rather than two (Falcon).
    num_params : int
        Parameter count (weights), for weight bytes and linear-layer FLOPs.
    max_context_tokens : int
        Longest sequence the model accepts (prompt + output), tokens.
    """

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    gated_mlp: bool
    num_params: int
    vocab_size: int
    max_context_tokens: int
    source: str = ""

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads held by one GPU under tensor parallelism ``tp`` (replicated when tp > heads)."""
        tp = v.positive_int(tp, "tp")
        return max(1, ceil_div(self.num_kv_heads, tp))

    def layers_per_gpu(self, pp: int = 1) -> int:
        """Layers held by one GPU (the largest pipeline stage) under pipeline parallelism ``pp``."""
        pp = v.positive_int(pp, "pp")
        if pp > self.num_layers:
            raise ValueError(f"pp={pp} exceeds the {self.num_layers} layers of {self.name}")
        return ceil_div(self.num_layers, pp)

    def kv_bytes_per_token(self, *, tp: int = 1, pp: int = 1, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies on one GPU (bytes/token)."""
        dtype_bytes = v.positive_int(dtype_bytes, "dtype_bytes")
        return 2 * self.layers_per_gpu(pp) * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    def weight_bytes_per_gpu(self, *, tp: int = 1, pp: int = 1, dtype_bytes: int = 2) -> float:
        """Weight bytes held by one GPU, parameters split evenly over tp x pp GPUs (bytes)."""
        tp = v.positive_int(tp, "tp")
        pp = v.positive_int(pp, "pp")
        dtype_bytes = v.positive_int(dtype_bytes, "dtype_bytes")
        return self.num_params * dtype_bytes / (tp * pp)


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU's memory, bandwidths and compute.

    Parameters
    ----------
    memory_bytes : int
        Device memory (bytes).
    hbm_bandwidth_bytes_per_s : float
        Device-memory bandwidth (bytes/s).
    bf16_flops_per_s : float
        Dense BF16 tensor-core peak (FLOP/s), no sparsity.
    host_link_bytes_per_s : float
        GPU <-> host bandwidth per direction (bytes/s), e.g. PCIe Gen4 x16 = 31.5e9.
    interconnect_bytes_per_s : float
        GPU <-> GPU bandwidth per direction used by tensor-parallel all-reduce (bytes/s).
    """

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    host_link_bytes_per_s: float
    host_link: str
    interconnect_bytes_per_s: float
    source: str = ""


@lru_cache(maxsize=None)
def _model_table() -> pd.DataFrame:
    return pd.read_csv(DATA_DIR / "models.csv")


@lru_cache(maxsize=None)
def _gpu_table() -> pd.DataFrame:
    return pd.read_csv(DATA_DIR / "gpus.csv")


def models() -> pd.DataFrame:
    """The model catalogue as a table (one row per model, with its source)."""
    return _model_table().copy()


def gpus() -> pd.DataFrame:
    """The GPU catalogue as a table (one row per GPU, with its source)."""
    return _gpu_table().copy()


def _lookup(table: pd.DataFrame, name: str, what: str) -> pd.Series:
    keys = table["name"].map(_key)
    hit = table[keys == _key(name)]
    if hit.empty:
        raise ValueError(f"unknown {what} {name!r}: known {what}s are {', '.join(table['name'])}")
    return hit.iloc[0]


def model(name: str | ModelSpec) -> ModelSpec:
    """The :class:`ModelSpec` called ``name`` (a ``ModelSpec`` is passed through)."""
    if isinstance(name, ModelSpec):
        return name
    row = _lookup(_model_table(), name, "model")
    kw = {f.name: row[f.name] for f in fields(ModelSpec)}
    ints = {"num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size",
            "intermediate_size", "num_params", "vocab_size", "max_context_tokens"}
    kw = {k: (int(x) if k in ints else x) for k, x in kw.items()}
    kw["gated_mlp"] = bool(row["gated_mlp"])
    return ModelSpec(**kw)


def gpu(name: str | GPUSpec) -> GPUSpec:
    """The :class:`GPUSpec` called ``name`` (a ``GPUSpec`` is passed through)."""
    if isinstance(name, GPUSpec):
        return name
    row = _lookup(_gpu_table(), name, "GPU")
    return GPUSpec(
        name=row["name"],
        memory_bytes=int(row["memory_mib"]) * MIB,
        hbm_bandwidth_bytes_per_s=float(row["hbm_bandwidth_gbps"]) * 1e9,
        bf16_flops_per_s=float(row["bf16_dense_tflops"]) * 1e12,
        host_link_bytes_per_s=float(row["host_link_gbps"]) * 1e9,
        host_link=str(row["host_link"]),
        interconnect_bytes_per_s=float(row["interconnect_gbps"]) * 1e9,
        source=str(row["source"]),
    )
