"""Read a Hugging Face ``config.json`` into the shape fields of :class:`kvlab.specs.ModelSpec`.

One function per architecture family turns the config's own key names into one set of shapes;
:func:`count_params` then counts parameters from those shapes, so the count follows from the
config alone (no checkpoint needed). The formula, per decoder layer ``l`` and in elements:

* attention, grouped-query (GQA/MHA): ``h q d`` (query) + ``2 h k d`` (key, value) + ``q d h``
  (output), with ``h`` the hidden size, ``q`` query heads, ``k`` KV heads, ``d`` head dim, plus
  biases where the architecture has them (Qwen2: query/key/value; OPT: every projection);
* attention, multi-head latent (MLA, DeepSeek-V2/V3): ``h r_q + r_q + r_q q (d_nope + d_rope)``
  (query down-projection, its norm, up-projection; ``h q (d_nope + d_rope)`` without a query
  rank) + ``h (r_kv + d_rope) + r_kv`` (the compressed KV and rope key, its norm)
  + ``r_kv q (d_nope + d_v)`` (key/value up-projection) + ``q d_v h`` (output);
* MLP: ``3 h f`` gated (SwiGLU/GeGLU: gate, up, down) or ``2 h f`` (+ ``f + h`` biases) plain;
  a mixture-of-experts layer holds ``E`` routed experts of ``3 h f_e`` each, ``S`` shared experts
  of the same size and a router of ``h E`` (+ ``E`` score-correction biases for DeepSeek-V3);
  DeepSeek-V3's first ``first_k_dense_replace`` layers are dense MLPs of width ``f``, and so are
  Qwen3-MoE's ``mlp_only_layers`` and the layers ``decoder_sparse_step`` skips;
* norms: ``n_norm h`` per layer (``2 n_norm h`` for LayerNorm with bias), plus a final norm;
  Qwen3's per-head query and key norms add ``2 d``;
* embeddings ``V h`` (+ learned positions for OPT: ``(P + 2) h``), and an output head ``V h``
  unless ``tie_word_embeddings`` ties it to the embedding (+ ``V`` bias for GPT-J).

Active parameters (what one token multiplies, for FLOPs) count ``experts_per_token`` routed
experts instead of ``E``; every other term is the same. Both include the embedding matrices.
DeepSeek-V3's multi-token-prediction module (``num_nextn_predict_layers``) is not counted: it
is loaded only for speculative decoding.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from ._validate import read_text_file

#: ``model_type`` values :func:`shapes_from_config` reads.
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "phi3", "mixtral", "deepseek_v2",
               "deepseek_v3", "opt", "falcon", "gptj")


def load_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """A config as a dict: a mapping is copied, a path to ``config.json`` (or its folder) read."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise ValueError(f"config must be a path to a config.json or a dict, got {type(path_or_dict).__name__}")
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        raw = json.loads(read_text_file(path, "config file"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"config file {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"config file {path} is JSON nested too deeply to be a model config") from None
    if not isinstance(raw, dict):
        raise ValueError(f"config file {path} must hold a JSON object, got {type(raw).__name__}")
    return raw


#: Largest value read for a config key (a bound far above any released model: 10x the largest
#: published value or more), so a typo or a corrupt file is an error naming the key rather than
#: an OverflowError or a parameter count of quintillions. Keys not listed: ``_DEFAULT_MAXIMUM``.
_MAXIMA = {
    "num_hidden_layers": 10_000, "n_layer": 10_000,  # largest released: 126 (Llama-3.1-405B)
    "num_attention_heads": 65_536, "num_key_value_heads": 65_536, "num_kv_heads": 65_536, "n_head": 65_536,
    "vocab_size": 16_777_216,  # largest released: 262,144 (Gemma 3)
    "max_position_embeddings": 1_000_000_000, "n_positions": 1_000_000_000, "sliding_window": 1_000_000_000,
    "num_local_experts": 65_536, "n_routed_experts": 65_536, "num_experts_per_tok": 65_536,
    "n_shared_experts": 65_536, "first_k_dense_replace": 10_000, "moe_layer_freq": 10_000,
}
_DEFAULT_MAXIMUM = 1_048_576  # widths (hidden, intermediate, head dims, ranks): largest released 53,248


def _shown(val: Any) -> str:
    text = repr(val)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader:
    """Typed, bounded access to config keys, with errors that name the key and the config."""

    def __init__(self, cfg: Mapping[str, Any], where: str) -> None:
        self.cfg, self.where = cfg, where

    def int(self, *keys: str, default: int | None = None, minimum: int = 1) -> int:
        for key in keys:
            if self.cfg.get(key) is not None:
                val = self.cfg[key]
                top = _MAXIMA.get(key, _DEFAULT_MAXIMUM)
                ok = not isinstance(val, bool) and isinstance(val, (int, float)) and math.isfinite(val) \
                    and val == int(val) and minimum <= val <= top
                if not ok:
                    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
                    raise ValueError(f"{self.where}: {key} must be {what} (at most {top:,}), got {_shown(val)}")
                return int(val)
        if default is None:
            raise ValueError(f"{self.where}: missing key {' or '.join(keys)}")
        return default

    def opt_int(self, key: str) -> int | None:
        return None if self.cfg.get(key) is None else self.int(key)

    def _typed(self, key: str, default: Any, kind: type, what: str) -> Any:
        val = self.cfg.get(key, default)
        if val is None:
            return default
        if not isinstance(val, kind):
            raise ValueError(f"{self.where}: {key} must be {what}, got {_shown(val)}")
        return val

    def bool(self, key: str, default: bool) -> bool:
        return self._typed(key, default, bool, "true or false")

    def str(self, key: str, default: str) -> str:
        return self._typed(key, default, str, "a string")

    def head_dim(self, hidden: int, heads: int, hidden_key: str = "hidden_size",
                 heads_key: str = "num_attention_heads") -> int:
        """``head_dim`` if the config gives it, else ``hidden / heads``, which must divide exactly."""
        if self.cfg.get("head_dim") is not None:
            return self.int("head_dim")
        if hidden % heads:
            raise ValueError(f"{self.where}: {hidden_key} {hidden:,} is not divisible by {heads_key} {heads:,} "
                             f"and there is no head_dim key: the head dimension would be {hidden / heads:.4g}")
        return hidden // heads


def _shared(r: _Reader, **over: Any) -> dict[str, Any]:
    """Shapes common to the Llama family (RMSNorm, no biases, gated MLP, rotary positions)."""
    hidden = r.int("hidden_size")
    q = r.int("num_attention_heads")
    d = over.pop("head_dim", None) or r.head_dim(hidden, q)
    out = dict(num_layers=r.int("num_hidden_layers"), hidden_size=hidden, num_q_heads=q,
               num_kv_heads=r.int("num_key_value_heads", default=q), head_dim=d,
               intermediate_size=r.int("intermediate_size"), vocab_size=r.int("vocab_size"),
               max_context_tokens=r.int("max_position_embeddings"),
               tied=r.bool("tie_word_embeddings", False), gated_mlp=True, norms_per_layer=2,
               norm_bias=False, qkv_bias=False, o_bias=False, mlp_bias=False, positions=0, head_bias=False)
    out.update(over)
    return out


def _window(r: _Reader, num_layers: int, *, every_other: bool = False) -> dict[str, Any]:
    """Sliding-window shapes: the window (tokens) and how many layers use it."""
    use = r.bool("use_sliding_window", True)
    window = r.opt_int("sliding_window") if use else None
    if window is None or window >= r.int("max_position_embeddings"):
        return dict(sliding_window_tokens=None, num_sliding_layers=0)
    return dict(sliding_window_tokens=window, num_sliding_layers=(num_layers + 1) // 2 if every_other else num_layers)


def _llama(r: _Reader) -> dict[str, Any]:
    out = _shared(r, qkv_bias=r.bool("attention_bias", False), o_bias=r.bool("attention_bias", False),
                  mlp_bias=r.bool("mlp_bias", False))
    return {**out, **_window(r, out["num_layers"])}


def _qwen2(r: _Reader) -> dict[str, Any]:
    out = _shared(r, qkv_bias=True)  # Qwen2 has biases on q/k/v, none on o or the MLP
    return {**out, **_window(r, out["num_layers"])}


def _qwen3(r: _Reader) -> dict[str, Any]:
    # Qwen3: no q/k/v bias (``attention_bias`` false), an RMSNorm over each query and key head
    # (q_norm, k_norm: ``head_dim`` weights each, shared across heads), explicit ``head_dim``.
    out = _shared(r, qkv_bias=r.bool("attention_bias", False), o_bias=r.bool("attention_bias", False),
                  qk_norm=True)
    return {**out, **_window(r, out["num_layers"])}


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    # Qwen3-MoE (transformers' Qwen3MoeDecoderLayer): layer i is sparse unless i is in
    # mlp_only_layers or (i + 1) % decoder_sparse_step != 0; no shared experts, a bias-free router.
    out = _qwen3(r)
    n, step = out["num_layers"], r.int("decoder_sparse_step", default=1)
    only = r.cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ValueError(f"{r.where}: mlp_only_layers must be a list of layer indices, got {only!r}")
    sparse = sum(1 for i in range(n) if i not in only and (i + 1) % step == 0)
    out.update(num_experts=r.int("num_experts"), experts_per_token=r.int("num_experts_per_tok"),
               moe_intermediate_size=r.int("moe_intermediate_size"), num_dense_layers=n - sparse)
    return out


def _gemma2(r: _Reader) -> dict[str, Any]:
    # Four RMSNorms per layer (before/after attention and MLP); embeddings tied; every other
    # layer (layer 0, 2, ...) attends within the sliding window.
    out = _shared(r, norms_per_layer=4, tied=r.bool("tie_word_embeddings", True))
    return {**out, **_window(r, out["num_layers"], every_other=True)}


def _mixtral(r: _Reader) -> dict[str, Any]:
    out = _llama(r)
    out.update(num_experts=r.int("num_local_experts"), experts_per_token=r.int("num_experts_per_tok"),
               moe_intermediate_size=out["intermediate_size"])
    return out


def _deepseek_v2(r: _Reader) -> dict[str, Any]:
    """DeepSeek-V2 (and V2-Lite, ``q_lora_rank`` null: queries projected directly): V3's layout;
    its routers have no score-correction bias unless ``topk_method`` is V3's ``noaux_tc``."""
    return _deepseek(r, default_topk_method="greedy")


def _deepseek_v3(r: _Reader) -> dict[str, Any]:
    return _deepseek(r, default_topk_method="noaux_tc")


def _deepseek(r: _Reader, default_topk_method: str) -> dict[str, Any]:
    nope, rope = r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim")
    out = _shared(r, head_dim=nope + rope)
    out.update(kv_lora_rank=r.int("kv_lora_rank"), q_lora_rank=r.opt_int("q_lora_rank"), qk_rope_head_dim=rope,
               v_head_dim=r.int("v_head_dim"), num_experts=r.int("n_routed_experts"),
               experts_per_token=r.int("num_experts_per_tok"),
               num_shared_experts=r.int("n_shared_experts", default=0, minimum=0),
               moe_intermediate_size=r.int("moe_intermediate_size"),
               num_dense_layers=r.int("first_k_dense_replace", default=0, minimum=0),
               router_bias=r.str("topk_method", default_topk_method) == "noaux_tc",
               sliding_window_tokens=None, num_sliding_layers=0)
    if out["num_dense_layers"] > out["num_layers"]:
        raise ValueError(f"{r.where}: first_k_dense_replace {out['num_dense_layers']:,} exceeds num_hidden_layers "
                         f"{out['num_layers']:,}")
    if r.int("moe_layer_freq", default=1) != 1:
        raise ValueError(f"{r.where}: moe_layer_freq {r.cfg['moe_layer_freq']} is not supported (expected 1)")
    return out


def _opt(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size")
    if r.int("word_embed_proj_dim", default=hidden) != hidden:
        raise ValueError(f"{r.where}: word_embed_proj_dim != hidden_size (OPT-350m's projections) is not supported")
    q = r.int("num_attention_heads")
    return dict(num_layers=r.int("num_hidden_layers"), hidden_size=hidden, num_q_heads=q, num_kv_heads=q,
                head_dim=r.head_dim(hidden, q), intermediate_size=r.int("ffn_dim"), vocab_size=r.int("vocab_size"),
                max_context_tokens=r.int("max_position_embeddings"), tied=r.bool("tie_word_embeddings", True),
                gated_mlp=False, norms_per_layer=2, norm_bias=True, qkv_bias=r.bool("enable_bias", True),
                o_bias=r.bool("enable_bias", True), mlp_bias=r.bool("enable_bias", True),
                positions=r.int("max_position_embeddings") + 2, head_bias=False,
                sliding_window_tokens=None, num_sliding_layers=0)


def _falcon(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size")
    q = r.int("num_attention_heads")
    new = r.bool("new_decoder_architecture", False)
    if new:
        kv = r.int("num_kv_heads", default=q)
    else:
        kv = 1 if r.bool("multi_query", True) else q
    two_norms = new and r.opt_int("num_ln_in_parallel_attn") != 1
    bias = r.bool("bias", False)
    return dict(num_layers=r.int("num_hidden_layers"), hidden_size=hidden, num_q_heads=q, num_kv_heads=kv,
                head_dim=r.head_dim(hidden, q), intermediate_size=r.int("ffn_hidden_size", default=4 * hidden),
                vocab_size=r.int("vocab_size"), max_context_tokens=r.int("max_position_embeddings", default=2048),
                tied=r.bool("tie_word_embeddings", True), gated_mlp=False,
                norms_per_layer=2 if two_norms or not r.bool("parallel_attn", True) else 1, norm_bias=True,
                qkv_bias=bias, o_bias=bias, mlp_bias=bias, positions=0, head_bias=False,
                sliding_window_tokens=None, num_sliding_layers=0)


def _gptj(r: _Reader) -> dict[str, Any]:
    hidden = r.int("n_embd")
    q = r.int("n_head")
    # One LayerNorm feeds the parallel attention and MLP; q/k/v/out have no bias, the MLP and
    # the untied output head do.
    return dict(num_layers=r.int("n_layer"), hidden_size=hidden, num_q_heads=q, num_kv_heads=q,
                head_dim=r.head_dim(hidden, q, "n_embd", "n_head"),
                intermediate_size=r.int("n_inner", default=4 * hidden), vocab_size=r.int("vocab_size"),
                max_context_tokens=r.int("n_positions"), tied=r.bool("tie_word_embeddings", False), gated_mlp=False,
                norms_per_layer=1, norm_bias=True, qkv_bias=False, o_bias=False, mlp_bias=True, positions=0,
                head_bias=True, sliding_window_tokens=None, num_sliding_layers=0)


_READERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "gemma2": _gemma2, "phi3": _llama,
    "mixtral": _mixtral, "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3, "opt": _opt, "falcon": _falcon, "gptj": _gptj,
}


def shapes_from_config(cfg: Mapping[str, Any], where: str = "config") -> dict[str, Any]:
    """Architecture shapes of a config (see the module docstring for the keys read).

    Raises
    ------
    ValueError
        Unknown ``model_type``, a missing or non-integer key (named), or an unsupported variant.
    """
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in _READERS:
        raise ValueError(f"{where}: model_type {_shown(model_type)} is not supported; supported are {', '.join(MODEL_TYPES)}")
    shapes = _READERS[model_type](_Reader(cfg, where))
    if shapes.get("num_experts") and shapes["experts_per_token"] > shapes["num_experts"]:
        raise ValueError(f"{where}: num_experts_per_tok {shapes['experts_per_token']:,} exceeds the "
                         f"{shapes['num_experts']:,} experts")
    if shapes["num_q_heads"] % shapes["num_kv_heads"]:
        raise ValueError(f"{where}: {shapes['num_q_heads']} query heads are not a multiple of "
                         f"{shapes['num_kv_heads']} KV heads")
    return shapes


def count_params(s: Mapping[str, Any]) -> tuple[int, int]:
    """(total, active) parameter counts of ``shapes`` (elements); formula in the module docstring."""
    h, q, k, d = s["hidden_size"], s["num_q_heads"], s["num_kv_heads"], s["head_dim"]
    if s.get("kv_lora_rank"):
        r_q, r_kv, rope, dv = s.get("q_lora_rank"), s["kv_lora_rank"], s["qk_rope_head_dim"], s["v_head_dim"]
        query = (h * r_q + r_q + r_q * q * d) if r_q else h * q * d
        attn = query + h * (r_kv + rope) + r_kv + r_kv * q * (d - rope + dv) + q * dv * h
    else:
        attn = h * q * d + 2 * h * k * d + q * d * h
        attn += (q * d + 2 * k * d) * s["qkv_bias"] + h * s["o_bias"]
    f = s["intermediate_size"]
    dense_mlp = 3 * h * f if s["gated_mlp"] else 2 * h * f + (f + h) * s["mlp_bias"]
    norms = s["norms_per_layer"] * h * (2 if s["norm_bias"] else 1) + (2 * d if s.get("qk_norm") else 0)
    n_layers, n_experts = s["num_layers"], s.get("num_experts", 0)
    if n_experts:
        expert = 3 * h * s["moe_intermediate_size"]
        router = h * n_experts + n_experts * s.get("router_bias", False)
        n_dense = s.get("num_dense_layers", 0)
        shared = s.get("num_shared_experts", 0) * expert
        layers_total = n_layers * (attn + norms) + n_dense * dense_mlp + (n_layers - n_dense) * (
            n_experts * expert + shared + router)
        layers_active = n_layers * (attn + norms) + n_dense * dense_mlp + (n_layers - n_dense) * (
            s["experts_per_token"] * expert + shared + router)
    else:
        layers_total = layers_active = n_layers * (attn + dense_mlp + norms)
    v = s["vocab_size"]
    outer = v * h + s["positions"] * h + (0 if s["tied"] else v * h) + v * s["head_bias"] \
        + h * (2 if s["norm_bias"] else 1)
    return layers_total + outer, layers_active + outer


def spec_fields(path_or_dict: str | os.PathLike | Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """Keyword arguments of :class:`kvlab.specs.ModelSpec` for a config (see ``model_from_config``)."""
    where = "config" if isinstance(path_or_dict, Mapping) else f"config file {path_or_dict}"
    cfg = load_config(path_or_dict)
    s = shapes_from_config(cfg, where)
    total, active = count_params(s)
    if name is None:
        name = str(cfg.get("_name_or_path") or cfg.get("name_or_path") or "") or f"{cfg['model_type']}-{total / 1e9:.3g}B"
    return dict(
        name=name, num_layers=s["num_layers"], num_q_heads=s["num_q_heads"], num_kv_heads=s["num_kv_heads"],
        head_dim=s["head_dim"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        moe_intermediate_size=s.get("moe_intermediate_size", 0), gated_mlp=s["gated_mlp"], num_params=total, num_active_params=active,
        vocab_size=s["vocab_size"], max_context_tokens=s["max_context_tokens"],
        num_experts=s.get("num_experts", 0), experts_per_token=s.get("experts_per_token", 0),
        sliding_window_tokens=s.get("sliding_window_tokens"), num_sliding_layers=s.get("num_sliding_layers", 0),
        kv_lora_rank=s.get("kv_lora_rank", 0), qk_rope_head_dim=s.get("qk_rope_head_dim", 0),
        v_head_dim=s.get("v_head_dim", 0), q_lora_rank=s.get("q_lora_rank") or 0,
        num_shared_experts=s.get("num_shared_experts", 0),
        source=f"{where} (model_type {cfg['model_type']}); parameters counted from shapes "
               f"({math.ceil(total / 1e6):,}M total)")
