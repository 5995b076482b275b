"""Model and GPU specifications: the numbers every memory and time estimate in kvlab starts from.

Shipped as ``data/models.csv`` and ``data/gpus.csv``, one row per model or GPU with its source
(a model's ``hf_id`` is the Hugging Face repository its row comes from; its ``variant_ids``, the
repositories of its fine-tunes that keep its architecture, e.g. the chat and instruct models, are
looked up as the same model, the spec's ``hf_id`` then the one named);
:func:`model_from_config` builds a :class:`ModelSpec` from any Hugging Face ``config.json``, and
:func:`gpu_from_file` a :class:`GPUSpec` from a YAML file with the columns of ``gpus.csv``;
:func:`resolve_model` and :func:`resolve_gpu` read what a user types (a name, a Hugging Face id,
a file). Names are matched ignoring case, spaces, hyphens and underscores ("Llama-3-8B" ==
"llama3_8b"); an unknown name is answered with the closest known ones.

KV bytes per token, per layer:

* grouped-query / multi-head attention: 2 (K and V) x kv_heads x head_dim x dtype_bytes; under
  tensor parallelism each GPU holds kv_heads / TP heads (at least one: heads are replicated
  when TP exceeds them, as vLLM does);
* multi-head latent attention (MLA, DeepSeek-V2/V3): one compressed latent of ``kv_lora_rank``
  elements plus the shared rope key of ``qk_rope_head_dim`` elements, x dtype_bytes, not
  heads x head_dim; the latent has no head axis, so every tensor-parallel GPU holds all of it
  (as vLLM's MLA cache does).

Under pipeline parallelism ``layers / PP`` layers sit on one GPU (the largest stage).
Sliding-window layers (Mistral-7B-v0.1, Gemma-2, Phi-3) are counted like full-attention layers in
:meth:`ModelSpec.kv_bytes_per_token`: the paged pool keeps every token of a sequence in every
layer, which is exact up to the window and an upper bound beyond it (vLLM without its hybrid
allocator); :meth:`ModelSpec.kv_bytes` gives the bytes when windowed layers keep only the window.
Weights count total parameters (every expert is stored); FLOPs count active parameters (a
mixture-of-experts token passes through ``experts_per_token`` experts).

Precision (:func:`with_precision`): ``kv_cache_dtype`` ``auto`` stores K and V in the model's
16-bit dtype (2 bytes), ``fp8`` in one byte (vLLM ``--kv-cache-dtype fp8``, SGLang ``fp8_e4m3``,
TGI ``fp8_e4m3fn``, TensorRT-LLM ``kv_cache_config.dtype: fp8``), so a pool holds twice the
pages. ``weight_dtype`` ``bf16`` (2 bytes a parameter), ``fp8`` (1 byte: W8A8 checkpoints) or
``int4`` (half a byte plus one 16-bit scale per group of 128: AWQ / GPTQ W4A16); quantized
checkpoints keep the embedding and the LM head in BF16 (vocab x hidden each). FP8 weights run
their GEMMs at the GPU's FP8 peak where it has one (:meth:`GPUSpec.gemm_flops_per_s`); INT4
weights are dequantized to BF16 for the GEMM.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Mapping

import pandas as pd

from . import _validate as v
from ._intmath import ceil_div
from ._paths import DATA_DIR
from .hf_config import spec_fields

MIB = 1024**2
GIB = 1024**3

#: KV-cache storage dtypes and their bytes per element (``auto``: the model's 16-bit dtype).
KV_CACHE_DTYPES = {"auto": 2, "fp8": 1}
#: Weight precisions and their bytes per quantized parameter (int4: 4 bits + a BF16 scale per 128).
WEIGHT_DTYPES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5 + 2.0 / 128}


def _key(name: str) -> str:
    return re.sub(r"[\s\-_]", "", str(name)).lower()


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shapes.

    Parameters
    ----------
    num_layers, num_q_heads, num_kv_heads, head_dim, hidden_size, intermediate_size : int
        Architecture (heads and dims in elements). ``head_dim`` is the query/key head dim
        (MLA: ``qk_nope_head_dim + qk_rope_head_dim``); ``intermediate_size`` the dense MLP width.
    gated_mlp : bool
        SwiGLU-style MLP with three matrices (Llama) rather than two (Falcon, OPT, GPT-J).
    num_params : int
        Total parameter count (every expert), for weight bytes.
    vocab_size : int
        Vocabulary (tokens).
    max_context_tokens : int
        Longest sequence the model accepts (prompt + output), tokens.
    num_active_params : int, optional
        Parameters one token passes through (mixture of experts: ``experts_per_token`` of the
        routed experts), for linear-layer FLOPs; default ``num_params`` (dense).
    num_experts, experts_per_token, moe_intermediate_size : int
        Routed experts per MoE layer, experts each token uses, width of one expert's MLP; 0 for
        a dense model (``moe_intermediate_size`` 0 means ``intermediate_size``).
    num_shared_experts : int
        Experts of width ``moe_intermediate_size`` every token passes through besides its routed
        ones (DeepSeek-V3: 1); 0 when none.
    sliding_window_tokens : int, optional
        Attention window of the windowed layers (tokens); None when every layer is global.
    num_sliding_layers : int
        Layers that attend within the window (Gemma-2: every other layer).
    kv_lora_rank, qk_rope_head_dim : int
        MLA's compressed KV rank and rope key dim (elements); 0 for grouped-query attention.
    q_lora_rank : int
        MLA's compressed query rank (elements; DeepSeek-V3: 1536); 0 when queries are projected
        from the hidden state directly (DeepSeek-V2-Lite) or the model is not MLA.
    v_head_dim : int
        Value head dim when it differs from ``head_dim`` (MLA); 0 means ``head_dim``.
    source : str
        Where the numbers come from.
    hf_id : str
        Hugging Face repository of the checkpoint ("" when none is published).
    kv_cache_dtype : {"auto", "fp8"}
        KV-cache storage (:data:`KV_CACHE_DTYPES`).
    weight_dtype : {"bf16", "fp8", "int4"}
        Weight precision (:data:`WEIGHT_DTYPES`).
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
    num_active_params: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    sliding_window_tokens: int | None = None
    num_sliding_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    num_shared_experts: int = 0
    hf_id: str = ""
    kv_cache_dtype: str = "auto"
    weight_dtype: str = "bf16"

    def __post_init__(self) -> None:
        v.choice(self.kv_cache_dtype, f"{self.name}: kv_cache_dtype", tuple(KV_CACHE_DTYPES))
        v.choice(self.weight_dtype, f"{self.name}: weight_dtype", tuple(WEIGHT_DTYPES))
        for f in _INT_FIELDS:
            v.positive_int(getattr(self, f), f"{self.name}: {f}")
        for f in _ZERO_INT_FIELDS:
            v.nonnegative_int(getattr(self, f), f"{self.name}: {f}")
        if self.num_active_params == 0:
            object.__setattr__(self, "num_active_params", self.num_params)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.num_active_params > self.num_params:
            raise ValueError(f"{self.name}: num_active_params {self.num_active_params} exceeds num_params "
                             f"{self.num_params}")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(f"{self.name}: experts_per_token must be in 1..num_experts ({self.num_experts}), "
                             f"got {self.experts_per_token}")
        if self.num_sliding_layers > self.num_layers:
            raise ValueError(f"{self.name}: num_sliding_layers {self.num_sliding_layers} exceeds the "
                             f"{self.num_layers} layers")
        if (self.sliding_window_tokens is None) != (self.num_sliding_layers == 0):
            raise ValueError(f"{self.name}: sliding_window_tokens and num_sliding_layers go together "
                             f"(got {self.sliding_window_tokens!r} and {self.num_sliding_layers})")
        if self.sliding_window_tokens is not None:
            v.positive_int(self.sliding_window_tokens, f"{self.name}: sliding_window_tokens")
        if bool(self.kv_lora_rank) != bool(self.qk_rope_head_dim):
            raise ValueError(f"{self.name}: MLA needs both kv_lora_rank and qk_rope_head_dim "
                             f"(got {self.kv_lora_rank} and {self.qk_rope_head_dim})")
        if self.q_lora_rank and not self.kv_lora_rank:
            raise ValueError(f"{self.name}: q_lora_rank {self.q_lora_rank} is MLA's; it needs kv_lora_rank")
        if self.num_shared_experts and not self.num_experts:
            raise ValueError(f"{self.name}: num_shared_experts {self.num_shared_experts} needs routed experts "
                             f"(num_experts is 0)")
        if self.is_mla and self.qk_rope_head_dim >= self.head_dim:
            raise ValueError(f"{self.name}: MLA head_dim {self.head_dim} must exceed qk_rope_head_dim "
                             f"{self.qk_rope_head_dim} (head_dim = qk_nope_head_dim + qk_rope_head_dim)")

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (a compressed KV latent per layer)."""
        return self.kv_lora_rank > 0

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K or V element (2 for ``auto``, 1 for ``fp8``)."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype]

    @property
    def unquantized_params(self) -> int:
        """Parameters a quantized checkpoint keeps in BF16: the embedding and the LM head
        (``2 x vocab x hidden``, at most every parameter)."""
        return min(self.num_params, 2 * self.vocab_size * self.hidden_size)

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.num_experts > 0

    @property
    def kv_tensors_per_layer(self) -> int:
        """Cache tensors per layer: 2 (K and V) for grouped-query attention, 1 latent for MLA."""
        return 1 if self.is_mla else 2

    @property
    def attention_flops_per_pair_per_layer(self) -> float:
        """FLOPs of one (query, key) pair in one layer, all heads: ``2 q (head_dim + v_head_dim)``.

        Scores (``2 head_dim`` per head) plus the weighted sum of values (``2 v_head_dim``);
        ``4 q head_dim`` for ordinary attention. MLA is counted with its keys and values
        decompressed (how prefill runs; decode on the latent costs more FLOPs, fewer bytes).
        """
        return 2.0 * self.num_q_heads * (self.head_dim + self.v_head_dim)

    def check_tp(self, tp: Any) -> int:
        """``tp`` as an int if tensor parallelism can split this model that way, else ``ValueError``.

        As vLLM requires: ``tp`` divides the query heads, and the KV heads split evenly
        (``tp`` divides them) or are replicated evenly (they divide ``tp``). MLA's one latent is
        replicated on every GPU, so only the query heads count.
        """
        tp = v.positive_int(tp, "tp")
        if self.num_q_heads % tp:
            raise ValueError(f"tp={tp} does not divide the {self.num_q_heads} attention heads of {self.name}; "
                             f"use a divisor of {self.num_q_heads}")
        if not self.is_mla and self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ValueError(f"tp={tp} neither divides nor is a multiple of the {self.num_kv_heads} KV heads of "
                             f"{self.name}, so they cannot be split or replicated evenly")
        return tp

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads held by one GPU under tensor parallelism ``tp`` (replicated when tp > heads)."""
        tp = self.check_tp(tp)
        return max(1, ceil_div(self.num_kv_heads, tp))

    def layers_per_gpu(self, pp: int = 1) -> int:
        """Layers held by one GPU (the largest pipeline stage) under pipeline parallelism ``pp``."""
        pp = v.positive_int(pp, "pp")
        if pp > self.num_layers:
            raise ValueError(f"pp={pp} exceeds the {self.num_layers} layers of {self.name}")
        return ceil_div(self.num_layers, pp)

    def kv_bytes_per_token_per_layer(self, *, tp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token occupies in one layer on one GPU (bytes/token).

        ``2 x kv_heads_per_gpu(tp) x head_dim x dtype_bytes``, or for MLA
        ``(kv_lora_rank + qk_rope_head_dim) x dtype_bytes`` on every GPU; ``dtype_bytes``
        defaults to the spec's :attr:`kv_dtype_bytes`.
        """
        dtype_bytes = self.kv_dtype_bytes if dtype_bytes is None else v.positive_int(dtype_bytes, "dtype_bytes")
        tp = v.positive_int(tp, "tp")
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    def kv_bytes_per_token(self, *, tp: int = 1, pp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token occupies on one GPU (bytes/token), every layer holding it.

        What the paged pool reserves per token (see the module docstring for sliding windows).
        """
        per_layer = self.kv_bytes_per_token_per_layer(tp=tp, dtype_bytes=dtype_bytes)
        return self.layers_per_gpu(pp) * per_layer

    def kv_bytes(self, context_tokens: int, *, tp: int = 1, pp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV-cache bytes of one sequence of ``context_tokens`` on one GPU when windowed layers
        keep only their last ``sliding_window_tokens`` tokens (bytes).

        Under pipeline parallelism, the largest stage with as many full-attention layers as it
        can hold (an upper bound over stages).
        """
        context_tokens = v.nonnegative_int(context_tokens, "context_tokens")
        per_layer = self.kv_bytes_per_token_per_layer(tp=tp, dtype_bytes=dtype_bytes)
        layers = self.layers_per_gpu(pp)
        full = min(layers, self.num_layers - self.num_sliding_layers)
        window = context_tokens if self.sliding_window_tokens is None else min(context_tokens,
                                                                               self.sliding_window_tokens)
        return per_layer * (full * context_tokens + (layers - full) * window)

    def weight_bytes_per_gpu(self, *, tp: int = 1, pp: int = 1, dtype_bytes: float | None = None) -> float:
        """Weight bytes held by one GPU, all ``num_params`` split evenly over tp x pp GPUs (bytes).

        ``dtype_bytes`` (bytes a parameter, all of them) defaults to the spec's
        ``weight_dtype``: BF16 everywhere, or the quantized bytes with
        :attr:`unquantized_params` kept in BF16.
        """
        tp = self.check_tp(tp)
        pp = v.positive_int(pp, "pp")
        if dtype_bytes is not None:
            return self.num_params * v.positive_float(dtype_bytes, "dtype_bytes") / (tp * pp)
        per_param = WEIGHT_DTYPES[self.weight_dtype]
        if self.weight_dtype == "bf16":
            return self.num_params * per_param / (tp * pp)
        keep = self.unquantized_params
        return ((self.num_params - keep) * per_param + keep * WEIGHT_DTYPES["bf16"]) / (tp * pp)


_INT_FIELDS = ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
               "num_params", "vocab_size", "max_context_tokens")
_ZERO_INT_FIELDS = ("num_active_params", "num_experts", "experts_per_token", "moe_intermediate_size",
                    "num_sliding_layers", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "q_lora_rank",
                    "num_shared_experts")


#: What a cost model's label says where it priced a host without GPU peer-to-peer (``GPUSpec.p2p`` false).
NO_P2P = "no GPU peer-to-peer"


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
    fp8_flops_per_s : float
        Dense FP8 tensor-core peak (FLOP/s); 0 where the GPU has no FP8 tensor cores.
    host_link_bytes_per_s : float
        GPU <-> host bandwidth per direction (bytes/s), e.g. PCIe Gen4 x16 = 31.5e9.
    interconnect_bytes_per_s : float
        GPU <-> GPU bandwidth per direction inside a node, used by tensor-parallel all-reduce
        (bytes/s).
    internode_bytes_per_s : float
        Bandwidth per direction one GPU gets to a GPU in another node (bytes/s): the link of a
        pipeline stage boundary that crosses nodes, e.g. one 200 Gb/s InfiniBand HDR adapter
        per GPU = 25e9.
    internode_link : str
        That link in words (the node type it assumes).
    compute_capability : float
        CUDA compute capability (8.0 Ampere A100, 8.9 Ada, 9.0 Hopper, 10.0 Blackwell B200, 12.0
        Blackwell RTX); 0 where not an NVIDIA GPU or not stated (the measured model then takes the
        kernels of the GPU it extrapolates from). It picks the kernels an engine runs (vLLM:
        FlashAttention 3 on 9.x, FlashInfer first on 10.x, FlashAttention 2 elsewhere).
    p2p : bool
        Whether the GPUs of a node reach each other peer-to-peer (NVLink, or PCIe P2P). False
        where the host blocks it (PCIe ACS or an IOMMU on, some VMs): NCCL then stages collectives
        through host memory and vLLM's custom all-reduce is off (:mod:`kvlab.costmodel.host_collectives`).
        A property of the host, not of the GPU: the catalogue's GPUs have it (True).
    """

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    host_link_bytes_per_s: float
    host_link: str
    interconnect_bytes_per_s: float
    internode_bytes_per_s: float
    internode_link: str
    source: str = ""
    fp8_flops_per_s: float = 0.0
    compute_capability: float = 0.0
    p2p: bool = True

    @property
    def peer_bytes_per_s(self) -> float:
        """GPU-to-GPU bandwidth per direction a collective gets (bytes/s): the interconnect with
        peer-to-peer; without it, half the host link (a copy staged through host memory crosses a
        PCIe link twice; the RTX PRO 6000 pair measured 0.46x its P2P bandwidth this way)."""
        return self.interconnect_bytes_per_s if self.p2p else self.host_link_bytes_per_s / 2.0

    @property
    def has_fp8(self) -> bool:
        """Whether the GPU has FP8 tensor cores (Hopper, Ada, Blackwell, MI300)."""
        return self.fp8_flops_per_s > 0

    def gemm_flops_per_s(self, weight_dtype: str = "bf16") -> float:
        """Dense GEMM peak for weights of ``weight_dtype`` (FLOP/s): FP8 weights at the FP8 peak
        where the GPU has one, everything else (BF16, INT4 dequantized to BF16) at the BF16 peak."""
        v.choice(weight_dtype, "weight_dtype", tuple(WEIGHT_DTYPES))
        return self.fp8_flops_per_s if weight_dtype == "fp8" and self.has_fp8 else self.bf16_flops_per_s


@cache
def _model_table() -> pd.DataFrame:
    return pd.read_csv(DATA_DIR / "models.csv")


@cache
def _gpu_table() -> pd.DataFrame:
    return pd.read_csv(DATA_DIR / "gpus.csv")


def models() -> pd.DataFrame:
    """The model catalogue as a table (one row per model, with its source)."""
    return _model_table().copy()


def gpus() -> pd.DataFrame:
    """The GPU catalogue as a table (one row per GPU, with its source)."""
    return _gpu_table().copy()


def suggestions(name: str, names: Any, limit: int = 4) -> list[str]:
    """The known names closest to ``name`` (for "did you mean"): those it is part of, then close spellings.

    Examples
    --------
    >>> suggestions("h100", ["A100-40GB", "H100-SXM", "H100-PCIe", "H200"])
    ['H100-SXM', 'H100-PCIe']
    """
    by_key = {_key(n): str(n) for n in names}
    key = _key(name)
    part = [n for k, n in by_key.items() if key and key in k]
    close = [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=limit, cutoff=0.6)]
    return list(dict.fromkeys(part + close))[:limit]


def _unknown(name: str, names: Any, what: str) -> ValueError:
    names = [str(n) for n in names]
    near = suggestions(name, names)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    return ValueError(f"unknown {what} {name!r}{hint} (known {what}s are {', '.join(names)})")


#: GPUs by the product names ``nvidia-smi --query-gpu=name`` prints (which servers' logs and
#: benchmark records carry, e.g. LLMServingSim's ``meta.json``: "NVIDIA GeForce RTX 4090").
GPU_PRODUCT_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100-SXM", "NVIDIA H100 PCIe": "H100-PCIe", "NVIDIA H200": "H200",
    "NVIDIA H200 141GB HBM3e": "H200", "NVIDIA B200": "B200", "NVIDIA A100-SXM4-80GB": "A100-80GB-SXM",
    "NVIDIA A100-SXM4-40GB": "A100-40GB", "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA A100-PCIE-40GB": "A100-40GB-PCIe", "NVIDIA A40": "A40", "NVIDIA A10G": "A10G", "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S", "NVIDIA GeForce RTX 4090": "RTX4090",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTXPRO6000",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "RTXPRO6000",
}
#: Other spellings of the same boards, as clouds' and vendors' lists write them (the form factor named, which a
#: bare "H100" does not: its PCIe, SXM and NVL boards differ up to 2x in bandwidth, so it stays a question).
GPU_SPELLINGS = {"H100 SXM5": "H100-SXM", "H100 SXM5 80GB": "H100-SXM", "H100 SXM 80GB": "H100-SXM",
                 "A100 SXM4 80GB": "A100-80GB-SXM", "A100 SXM 80GB": "A100-80GB-SXM", "A100 SXM4 40GB": "A100-40GB",
                 "H200 SXM": "H200", "H200 SXM 141GB": "H200"}


def _variant_ids(cell: object) -> list[str]:
    """A model row's fine-tunes of the same architecture (its ``variant_ids`` cell, ``;``-separated)."""
    return [] if pd.isna(cell) else [v for v in str(cell).split(";") if v]


def _lookup(table: pd.DataFrame, name: str, what: str) -> pd.Series:
    """The row called ``name``: by catalogue name, else (models) by Hugging Face id or a variant's (with or
    without its owner), else (GPUs) by the product name ``nvidia-smi`` prints; spaces, dashes, underscores and
    case do not matter."""
    key = _key(name)
    hit = table[table["name"].map(_key) == key]
    if hit.empty and "hf_id" in table.columns:
        hit = table[table["hf_id"].fillna("").map(_key) == key]
    if hit.empty and "variant_ids" in table.columns:
        hit = table[table["variant_ids"].map(lambda cell: key in map(_key, _variant_ids(cell)))]
    if hit.empty and "hf_id" in table.columns and "/" not in name:  # a repository named without its owner
        ids = table["hf_id"].fillna("") + ";" + table["variant_ids"].fillna("")
        hit = table[ids.map(lambda cell: key in (_key(v.rpartition("/")[2]) for v in _variant_ids(cell)))]
    if hit.empty and what == "GPU":  # nvidia-smi's product names, with or without "NVIDIA", and other spellings
        aliases = {_key(k.removeprefix("NVIDIA ")): v for k, v in GPU_PRODUCT_NAMES.items()}
        aliases.update({_key(k): v for k, v in (*GPU_PRODUCT_NAMES.items(), *GPU_SPELLINGS.items())})
        alias = aliases.get(key.removeprefix("nvidia"))
        hit = table[table["name"].map(_key) == _key(alias)] if alias else hit
    if hit.empty:
        raise _unknown(name, table["name"], what)
    return hit.iloc[0]


def _optional_int(value: object) -> int | None:
    return None if pd.isna(value) else int(value)


def model(name: str | ModelSpec) -> ModelSpec:
    """The :class:`ModelSpec` called ``name`` (a ``ModelSpec`` is passed through)."""
    if isinstance(name, ModelSpec):
        return name
    return _catalogue_model(str(name))


@cache
def _catalogue_model(name: str) -> ModelSpec:
    """:func:`model` of a name, once per name (the catalogue is read once; a spec is immutable)."""
    row = _lookup(_model_table(), name, "model")
    variant = [v for v in _variant_ids(row.get("variant_ids")) if _key(name) in (_key(v), _key(v.rpartition("/")[2]))]
    kw: dict = {"name": str(row["name"]), "source": str(row["source"]), "gated_mlp": bool(row["gated_mlp"]),
                "hf_id": variant[0] if variant else "" if pd.isna(row["hf_id"]) else str(row["hf_id"]),
                "sliding_window_tokens": _optional_int(row["sliding_window_tokens"])}
    kw.update({f: int(row[f]) for f in _INT_FIELDS})
    kw.update({f: _optional_int(row[f]) or 0 for f in _ZERO_INT_FIELDS})
    return ModelSpec(**kw)


def model_from_config(path_or_dict: str | os.PathLike | Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (path, folder holding it, or dict).

    Reads ``model_type`` llama, mistral, qwen2, qwen3, gemma2, phi3 (dense, grouped-query), mixtral
    and qwen3_moe (mixture of experts), deepseek_v2 and deepseek_v3 (MLA + mixture of experts), opt, falcon and
    gptj, and
    counts total and active parameters from the shapes (formula in :mod:`kvlab.hf_config`;
    tied embeddings counted once). The result works wherever kvlab takes a model name.

    Parameters
    ----------
    path_or_dict : path or mapping
        The config.
    name : str, optional
        The spec's name; default the config's ``_name_or_path``, else ``<model_type>-<size>B``.

    Raises
    ------
    ValueError
        Unreadable file, unsupported ``model_type``, or a missing or malformed key (named).

    Examples
    --------
    >>> cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    ...        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256}
    >>> m = model_from_config(cfg, name="toy")
    >>> m.kv_bytes_per_token()  # 2 (K, V) x 2 layers x 2 KV heads x 16 head dim x 2 bytes
    256
    """
    return ModelSpec(**spec_fields(path_or_dict, name))


def gpu(name: str | GPUSpec) -> GPUSpec:
    """The :class:`GPUSpec` called ``name`` (a ``GPUSpec`` is passed through)."""
    if isinstance(name, GPUSpec):
        return name
    return _catalogue_gpu(str(name))


@cache
def _catalogue_gpu(name: str) -> GPUSpec:
    """:func:`gpu` of a name, once per name (the catalogue is read once; a spec is immutable)."""
    return _gpu_from_row(_lookup(_gpu_table(), name, "GPU"), "data/gpus.csv")


#: Columns of ``data/gpus.csv`` (and keys of a GPU spec file): number columns with their units.
GPU_NUMBER_FIELDS = {"memory_mib": "MiB", "hbm_bandwidth_gbps": "GB/s", "bf16_dense_tflops": "TFLOP/s",
                     "host_link_gbps": "GB/s", "interconnect_gbps": "GB/s", "internode_gbps": "GB/s"}
GPU_TEXT_FIELDS = ("name", "host_link", "internode_link", "source")


def _gpu_from_row(row: Mapping[str, Any], where: str) -> GPUSpec:
    """A :class:`GPUSpec` from the columns of ``gpus.csv`` (numbers positive, each bad field named)."""
    num = {f: v.positive_float(row[f], f"{where}: {f} ({unit})") for f, unit in GPU_NUMBER_FIELDS.items()}
    return GPUSpec(
        name=str(row["name"]),
        memory_bytes=int(num["memory_mib"] * MIB),
        hbm_bandwidth_bytes_per_s=num["hbm_bandwidth_gbps"] * 1e9,
        bf16_flops_per_s=num["bf16_dense_tflops"] * 1e12,
        host_link_bytes_per_s=num["host_link_gbps"] * 1e9,
        host_link=str(row["host_link"]),
        interconnect_bytes_per_s=num["interconnect_gbps"] * 1e9,
        internode_bytes_per_s=num["internode_gbps"] * 1e9,
        internode_link=str(row["internode_link"]),
        source=str(row["source"]),
        fp8_flops_per_s=0.0 if pd.isna(row["fp8_dense_tflops"]) else float(row["fp8_dense_tflops"]) * 1e12,
        compute_capability=0.0 if pd.isna(row.get("compute_capability")) else v.positive_float(
            row["compute_capability"], f"{where}: compute_capability"),
    )


def gpu_from_file(path: str | os.PathLike) -> GPUSpec:
    """A :class:`GPUSpec` from a YAML file whose keys are the columns of ``data/gpus.csv``.

    ``name`` and the six numbers (``memory_mib``, ``hbm_bandwidth_gbps``, ``bf16_dense_tflops``
    dense BF16, ``host_link_gbps``, ``interconnect_gbps``, ``internode_gbps``, each per
    direction) are required; ``host_link``, ``internode_link`` and ``source`` are text
    (default: "given in <path>"); ``p2p`` (true or false, default true) says whether the host lets
    its GPUs reach each other peer-to-peer (:attr:`GPUSpec.p2p`); ``compute_capability`` (optional) picks
    the kernels an engine runs (:attr:`GPUSpec.compute_capability`). Such a GPU has no measured iteration
    times: kvlab prices it from the nearest measured GPU by spec ratios and says so.

    Raises
    ------
    ValueError
        Unreadable file, not a mapping, a missing or unknown key, or a number that is not positive.
    """
    where = f"GPU spec file {os.fspath(path)}"
    data = v.yaml_data(v.read_text_file(os.fspath(path), "GPU spec file", max_bytes=1 << 20), where)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of the columns of data/gpus.csv, got {type(data).__name__}")
    fields = ("name", *GPU_NUMBER_FIELDS)
    missing = [f for f in fields if data.get(f) is None]
    optional = {"fp8_dense_tflops", "compute_capability", "p2p"}
    unknown = sorted(set(map(str, data)) - set(fields) - set(GPU_TEXT_FIELDS) - optional)
    if missing or unknown:
        raise ValueError(f"{where}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown key {', '.join(unknown)}"] if unknown
                                                                      else []))
            + f" (keys: {', '.join(fields + GPU_TEXT_FIELDS[1:])}, fp8_dense_tflops, compute_capability and p2p "
              f"(optional), as the "
              f"columns of data/gpus.csv)")
    p2p = data.pop("p2p", True)
    if not isinstance(p2p, bool):
        raise ValueError(f"{where}: p2p must be true or false, got {p2p!r}")
    row = {"host_link": "given", "internode_link": "given", "source": f"given in {os.fspath(path)}",
           "fp8_dense_tflops": float("nan"), "compute_capability": float("nan"), **data}
    return replace(_gpu_from_row(row, where), p2p=p2p)


def resolve_model(text: str | ModelSpec) -> ModelSpec:
    """The model a user names: a catalogue name, a Hugging Face id of the catalogue (its ``hf_id`` or
    ``variant_ids`` columns; no hub access), or a path to a ``config.json`` (or the folder holding one).

    Raises
    ------
    ValueError
        Nothing matches: the closest names are suggested, and an uncatalogued Hugging Face id is
        told to pass its ``config.json``.
    """
    if isinstance(text, ModelSpec):
        return text
    text = str(text)
    path = os.path.expanduser(text)
    if text.endswith(".json") or os.path.isdir(path) or os.path.isfile(path):
        spec = model_from_config(path)
        # a config saved from the hub names its repository (_name_or_path "Qwen/Qwen3-8B"): the id to load
        is_id = re.fullmatch(r"[\w.-]+/[\w.-]+", spec.name) and not os.path.exists(spec.name)
        return replace(spec, hf_id=spec.name) if is_id and not spec.hf_id else spec
    try:
        return model(text)
    except ValueError:
        if "/" not in text:
            raise
    table = _model_table()
    ids = [*table["hf_id"].dropna().astype(str), *(v for cell in table["variant_ids"] for v in _variant_ids(cell))]
    near = suggestions(text, ids)
    raise ValueError(f"Hugging Face id {text!r} is not in kvlab's catalogue"
                     + (f" (did you mean {' or '.join(near)}?)" if near else "")
                     + "; download its config.json and pass its path (--model path/to/config.json)")


def resolve_gpu(name: str | None = None, spec_file: str | os.PathLike | None = None) -> GPUSpec:
    """The GPU a user names (a catalogue name) or describes (a YAML file, :func:`gpu_from_file`); one of them."""
    if (name is None) == (spec_file is None):
        raise ValueError("give a GPU name (--gpu) or a GPU spec file (--gpu-spec), one of them")
    return gpu(name) if spec_file is None else gpu_from_file(spec_file)


def with_precision(model_: str | ModelSpec, *, kv_cache_dtype: str = "auto", weights: str = "bf16") -> ModelSpec:
    """``model_`` with its KV cache stored as ``kv_cache_dtype`` and its weights as ``weights``.

    The result works wherever kvlab takes a model: its KV bytes per token, weight bytes and so
    the pool's pages (``kvlab.pool_pages``) and the cost models follow the precision.

    Examples
    --------
    >>> m = with_precision("Llama-3-8B", kv_cache_dtype="fp8")
    >>> m.kv_bytes_per_token(), model("Llama-3-8B").kv_bytes_per_token()
    (65536, 131072)
    """
    m = model(model_)
    v.choice(kv_cache_dtype, "kv_cache_dtype", tuple(KV_CACHE_DTYPES))
    v.choice(weights, "weights", tuple(WEIGHT_DTYPES))
    return replace(m, kv_cache_dtype=kv_cache_dtype, weight_dtype=weights)
