"""Per-operator GPU profiles of a serving engine's own layers: LLMServingSim's profiler bundles.

A bundle (casys-kaist/LLMServingSim, ``profiler/perf/<hardware>/<org>/<model>/<variant>/``) is one
model profiled on one GPU by running vLLM's layer classes with one decoder layer: ``meta.yaml``
(the GPU's product name, the model's Hugging Face id, the vLLM release, the TP degrees; each TP
degree is run on one GPU with the per-GPU shapes), and per TP degree:

* ``tp<N>/dense.csv`` (``layer, tokens, time_us``): one layer's operators (``qkv_proj``,
  ``o_proj``, ``gate_up_proj``, ``down_proj``; ``layernorm`` (each of the layer's two RMSNorms,
  with its fused residual add), ``rotary_emb``, ``act_fn``, Qwen3's ``qk_norm``) by tokens;
* ``tp<N>/attention.csv`` (``prefill_chunk, kv_prefill, n_decode, kv_decode, time_us``): one
  layer's attention over one prefill chunk after ``kv_prefill`` cached tokens plus ``n_decode``
  decodes of ``kv_decode`` context each;
* ``tp<N>/per_sequence.csv`` (``layer, sequences, time_us``): ``lm_head`` and ``sampler``;
* ``tp<N>/moe.csv`` (``tokens, activated_experts, time_us``; a mixture of experts only): one
  layer's expert block over ``tokens`` tokens spread over ``activated_experts`` experts.

Times are GPU kernel times in microseconds. kvlab ships the part it fits to, reduced to a grid
(:data:`TOKENS`, :data:`ATTENTION_GRID`) and converted to seconds and catalogue names, as
``data/costmodels/op_profiles_layers.csv``, ``op_profiles_attention.csv`` and ``op_profiles_moe.csv``
(every row: kvlab checks its experts' pricing against them, it fits nothing to them); :func:`layers`,
:func:`attention` and :func:`moe` read them, and ``python -m kvlab.costmodel.op_profiles DIR...`` rewrites them
from bundles (any folders holding ``meta.yaml`` files, e.g. a checkout's ``profiler/perf``).
A user's own bundles go through the same :func:`read_bundle`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .. import _validate as v
from .._paths import DATA_DIR
from ..specs import gpu as _gpu, model as _model
from .data import shipped_table, write_csv_atomically

LAYERS_PATH = DATA_DIR / "costmodels" / "op_profiles_layers.csv"
ATTENTION_PATH = DATA_DIR / "costmodels" / "op_profiles_attention.csv"
MOE_PATH = DATA_DIR / "costmodels" / "op_profiles_moe.csv"
REMAKE = "python -m kvlab.costmodel.op_profiles DIR"
#: The GEMMs of one layer and the pointwise operators, with how often each runs per layer.
GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
POINTWISE_OPS = {"layernorm": 2, "rotary_emb": 1, "act_fn": 1, "qk_norm": 1}
PER_SEQUENCE_OPS = ("lm_head", "sampler")
#: Token (and sequence) counts kept: every count up to 16, then powers of two and multiples of 64.
TOKENS = tuple(sorted({*range(1, 17), 24, 32, 48, 64, 96, *range(128, 2049, 64)}))
#: The attention grid kept: prefill chunk, its cached prefix, decodes, their context (tokens).
ATTENTION_GRID = {"prefill_chunk": (0, 16, 128, 512, 2048), "kv_prefill": (0, 1024, 4096, 16384),
                  "n_decode": (0, 1, 4, 16, 64, 256), "kv_decode": (0, 256, 1024, 4096, 16384)}
LAYER_COLUMNS = ("gpu", "model", "tp", "vllm", "op", "tokens", "time_s")
ATTENTION_COLUMNS = ("gpu", "model", "tp", "vllm", *ATTENTION_GRID, "time_s")
MOE_COLUMNS = ("gpu", "model", "tp", "vllm", "tokens", "activated_experts", "time_s")


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise ValueError(f"profile file {str(path)!r} is missing")
    table = pd.read_csv(path)
    v.require_columns(table, columns, f"profile file {path}")
    if not np.isfinite(table["time_us"].to_numpy(dtype=np.float64)).all() or (table["time_us"] <= 0).any():
        bad = int(np.flatnonzero(~(table["time_us"] > 0))[0])
        raise ValueError(f"profile file {path}, row {bad + 2}: time_us must be a positive number, "
                         f"got {table['time_us'].iloc[bad]!r}")
    return table


def read_bundle(path: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One bundle's operator, attention and expert-block rows (the last empty but for a mixture of
    experts), in seconds, with catalogue GPU and model names.

    ``ValueError`` names the file and what is wrong: a missing file or column, a GPU or model the
    catalogue does not know, a non-positive time.
    """
    d = Path(path)
    meta_path = d / "meta.yaml"
    if not meta_path.is_file():
        raise ValueError(f"profile bundle {str(d)!r} has no meta.yaml")
    with open(meta_path, encoding="utf-8") as f:
        meta = yaml.safe_load(f) or {}
    for key in ("gpu", "model", "tp_degrees"):
        if key not in meta:
            raise ValueError(f"{meta_path}: missing key {key!r} (expected gpu, model, tp_degrees)")
    try:
        gpu, model = _gpu(str(meta["gpu"])).name, _model(str(meta["model"])).name
    except ValueError as err:
        raise ValueError(f"{meta_path}: {err}") from None
    vllm = str(meta.get("vllm_version", ""))
    layer_frames, attention_frames, moe_frames = [], [], []
    for tp in meta["tp_degrees"]:
        tp = v.positive_int(tp, f"{meta_path} tp_degrees")
        base = {"gpu": gpu, "model": model, "tp": tp, "vllm": vllm}
        dense = _read(d / f"tp{tp}" / "dense.csv", ("layer", "tokens", "time_us"))
        per_seq = _read(d / f"tp{tp}" / "per_sequence.csv", ("layer", "sequences", "time_us"))
        ops = pd.concat([dense.rename(columns={"layer": "op"}),
                         per_seq.rename(columns={"layer": "op", "sequences": "tokens"})], ignore_index=True)
        layer_frames.append(ops.assign(**base, time_s=ops["time_us"] * 1e-6))
        att = _read(d / f"tp{tp}" / "attention.csv", (*ATTENTION_GRID, "time_us"))
        attention_frames.append(att.assign(**base, time_s=att["time_us"] * 1e-6))
        if (d / f"tp{tp}" / "moe.csv").is_file():
            moe_ = _read(d / f"tp{tp}" / "moe.csv", ("tokens", "activated_experts", "time_us"))
            moe_frames.append(moe_.assign(**base, time_s=moe_["time_us"] * 1e-6)[list(MOE_COLUMNS)])
    layers_ = pd.concat(layer_frames, ignore_index=True)
    return (layers_[list(LAYER_COLUMNS)], pd.concat(attention_frames, ignore_index=True)[list(ATTENTION_COLUMNS)],
            pd.concat(moe_frames, ignore_index=True) if moe_frames else pd.DataFrame(columns=list(MOE_COLUMNS)))


def reduce(layer_rows: pd.DataFrame, attention_rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows kvlab fits to: the operators of :data:`GEMM_OPS`, :data:`POINTWISE_OPS` and
    :data:`PER_SEQUENCE_OPS` at :data:`TOKENS`, and the attention rows on :data:`ATTENTION_GRID`."""
    ops = (*GEMM_OPS, *POINTWISE_OPS, *PER_SEQUENCE_OPS)
    keep = layer_rows["op"].isin(ops) & layer_rows["tokens"].isin(TOKENS)
    on_grid = np.logical_and.reduce([attention_rows[c].isin(vals) for c, vals in ATTENTION_GRID.items()])
    key = ["gpu", "model", "tp", "op", "tokens"]
    return (layer_rows[keep].sort_values(key).reset_index(drop=True),
            attention_rows[on_grid].sort_values(["gpu", "model", "tp", *ATTENTION_GRID]).reset_index(drop=True))


def find_bundles(roots: list[str | os.PathLike]) -> list[Path]:
    """Every bundle (folder with a ``meta.yaml``) under ``roots``, sorted."""
    found = sorted({p.parent for r in roots for p in Path(r).rglob("meta.yaml")})
    if not found:
        raise ValueError(f"no profile bundle (a folder with meta.yaml) under {', '.join(map(str, roots))}")
    return found


def layers(path: str | os.PathLike = LAYERS_PATH) -> pd.DataFrame:
    """The shipped operator rows: gpu, model, tp, vllm, op, tokens (sequences for per-sequence ops), time_s."""
    return shipped_table(path, LAYER_COLUMNS, REMAKE)


def attention(path: str | os.PathLike = ATTENTION_PATH) -> pd.DataFrame:
    """The shipped attention rows: gpu, model, tp, vllm, the :data:`ATTENTION_GRID` columns, time_s."""
    return shipped_table(path, ATTENTION_COLUMNS, REMAKE)


def moe(path: str | os.PathLike = MOE_PATH) -> pd.DataFrame:
    """The shipped expert-block rows: gpu, model, tp, vllm, tokens, activated_experts, time_s."""
    return shipped_table(path, MOE_COLUMNS, REMAKE)


def write(roots: list[str | os.PathLike], layers_path: Path = LAYERS_PATH, attention_path: Path = ATTENTION_PATH,
          moe_path: Path = MOE_PATH) -> None:
    """Read every bundle under ``roots``, reduce, and write the three shipped tables (each atomically)."""
    parts = [read_bundle(b) for b in find_bundles(roots)]
    lay, att = reduce(pd.concat([p[0] for p in parts], ignore_index=True),
                      pd.concat([p[1] for p in parts], ignore_index=True))
    blocks = [p[2] for p in parts if len(p[2])]
    experts = (pd.concat(blocks, ignore_index=True).sort_values(["gpu", "model", "tp", "tokens", "activated_experts"])
               if blocks else pd.DataFrame(columns=list(MOE_COLUMNS)))
    for table, path in ((lay, layers_path), (att, attention_path), (experts, moe_path)):
        write_csv_atomically(table, path)


if __name__ == "__main__":  # python -m kvlab.costmodel.op_profiles DIR...
    if len(sys.argv) < 2:
        sys.exit("usage: python -m kvlab.costmodel.op_profiles DIR... (folders holding profile bundles)")
    write(sys.argv[1:])
    print(f"wrote {LAYERS_PATH}, {ATTENTION_PATH} and {MOE_PATH}")
