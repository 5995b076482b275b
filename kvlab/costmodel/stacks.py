"""Serving stacks fitted to real servers, and the cost-model files that carry them.

A *stack* is what a serving engine adds to the GPU time of an iteration: a per-iteration and a
per-sequence CPU overhead (scheduling, input preparation, sampling, detokenisation) and, where the
data support it, a scale on the GPU time itself (the engine's kernels against the measured
curves'). An iteration then costs

    gpu_time_scale x gpu_s(T, P, K, S) + overhead_s + overhead_s_per_seq x S

with ``gpu_s`` the base model's iteration time (:func:`kvlab.costmodel.cost_model`, stack
"none"). Where the engine overlaps its CPU work with the GPU's (``overlap``: vLLM V1's async
scheduling, on by default in recent releases, prepares step n + 1 while step n runs), the CPU
terms are hidden under the GPU time and an iteration costs
``max(gpu_time_scale x gpu_s, overhead_s + overhead_s_per_seq x S)`` instead of the sum. A fourth
term, ``overhead_s_per_request``, is outside the engine: the front end's latency
per request (HTTP round trip, tokenisation, detokenising and streaming the first token) that a
clock started at the client sees on its TTFT and E2E, never on its TPOT. It moves no iteration, so
the simulator never prices it; :func:`kvlab.validate.replay` adds it to runs timed from the client.

A *cost-model file* is a JSON object holding these terms with what they were fitted to (``kvlab
calibrate`` writes one, :mod:`kvlab.validate.calibrate`); every command that takes ``--cost-model``
and ``simulate(cost_model=...)`` accept its path, or the name of a shipped one:

* ``"vllm-v0"``: fitted to DistServe's vLLM (V0 era) OPT-13B runs on A100-80GB;
* ``"vllm-v1"``: fitted to LLMServingSim's vLLM 0.19.0 runs on RTX 4090 / RTX PRO 6000;
* ``"vllm-v1-sync"``: vLLM V1 scheduling in step (before 0.14.0, or ``--no-async-scheduling``), fitted to
  NVIDIA's measured vLLM points on H100, H200 and B200 (:mod:`kvlab.validate.points`);
* ``"sarathi-serve"``: the overheads of :mod:`kvlab.costmodel.fit` (Sarathi-Serve's batches).

Shipped files live in ``data/costmodels/<name>.json``; ``data/SOURCES.md`` says how to remake them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._paths import DATA_DIR
from .._validate import read_text_file, write_text_atomically
from .measured import KERNEL_ERAS

STACK_DIR = DATA_DIR / "costmodels"
#: The JSON key (and format version) that marks a kvlab cost-model file.
FORMAT_KEY = "kvlab_cost_model"
FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class StackTerms:
    """A serving stack's terms (seconds; the scale is a ratio) and what they rest on.

    ``base`` is the cost-model source the terms were fitted on top of (``None``: the default,
    measured where the GPU has measurements, else the roofline) and ``kernels`` the measured model's
    kernel era (:data:`kvlab.costmodel.measured.KERNEL_ERAS`; None: today's engines'), the one its runs'
    servers ran. ``meta`` keeps the fit's record (runs, held-out errors, the command that remakes it).
    """

    name: str
    overhead_s: float = 0.0
    overhead_s_per_seq: float = 0.0
    gpu_time_scale: float = 1.0
    overhead_s_per_request: float = 0.0
    overlap: bool = False
    base: str | None = None
    kernels: str | None = None
    label: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for f in ("overhead_s", "overhead_s_per_seq", "overhead_s_per_request"):
            if not float(getattr(self, f)) >= 0:
                raise ValueError(f"stack {self.name}: {f} must be >= 0 s, got {getattr(self, f)!r}")
        if not float(self.gpu_time_scale) > 0:
            raise ValueError(f"stack {self.name}: gpu_time_scale must be > 0, got {self.gpu_time_scale!r}")
        if self.base not in (None, "measured", "roofline"):
            raise ValueError(f"stack {self.name}: base must be measured, roofline or null, got {self.base!r}")
        if self.kernels is not None and self.kernels not in KERNEL_ERAS:
            raise ValueError(f"stack {self.name}: kernels must be null or one of {', '.join(KERNEL_ERAS)}, "
                             f"got {self.kernels!r}")

    def describe(self) -> str:
        """The terms in words, as results state them."""
        scale = "" if self.gpu_time_scale == 1.0 else f", GPU time x{self.gpu_time_scale:.3g}"
        ms = [round(x * 1e3, 4) for x in (self.overhead_s, self.overhead_s_per_seq, self.overhead_s_per_request)]
        front = f"; front end {ms[2]:.3g} ms/request (client clock)" if ms[2] else ""
        cpu = f"{ms[0]:.3g} ms/iteration + {ms[1]:.3g} ms/sequence"
        if self.overlap:
            gpu = "GPU time" + (f" x{self.gpu_time_scale:.3g}" if self.gpu_time_scale != 1.0 else "")
            return f"stack {self.name}: max({gpu}, CPU {cpu}) (CPU overlapped){front}"
        return f"stack {self.name}: {cpu}{scale}{front}"

    def to_dict(self) -> dict[str, Any]:
        """The cost-model file's JSON object."""
        return {FORMAT_KEY: FORMAT_VERSION, "name": self.name, "label": self.label, "base": self.base,
                **({"kernels": self.kernels} if self.kernels else {}),
                "stack": {"overhead_s": float(self.overhead_s), "overhead_s_per_seq": float(self.overhead_s_per_seq),
                          "gpu_time_scale": float(self.gpu_time_scale),
                          "overhead_s_per_request": float(self.overhead_s_per_request),
                          "overlap": bool(self.overlap)}, **dict(self.meta)}


def named_stacks() -> list[str]:
    """Names of the shipped stack files (``data/costmodels/*.json`` that are cost-model files)."""
    out = []
    for p in sorted(STACK_DIR.glob("*.json")):
        try:
            if FORMAT_KEY in json.loads(p.read_text(encoding="utf-8")):
                out.append(p.stem)
        except (OSError, json.JSONDecodeError):
            continue
    return out


def is_cost_model_file(text: str) -> bool:
    """True when ``text`` names a cost-model file: a path ending in ``.json`` or a shipped name."""
    return isinstance(text, str) and (text.endswith(".json") or text in named_stacks())


def named_file(cost_model: Any, stack: str | None) -> str | None:
    """The cost-model file a ``cost_model`` / ``stack`` pair names (the first that is one), or None."""
    return next((x for x in (cost_model, stack) if is_cost_model_file(x)), None)


def load(path_or_name: str | Path) -> StackTerms:
    """The :class:`StackTerms` of a cost-model file (a path, or the name of a shipped one)."""
    p = Path(path_or_name)
    if not str(path_or_name).endswith(".json"):
        p = STACK_DIR / f"{path_or_name}.json"
        if not p.is_file():
            raise ValueError(f"unknown stack {path_or_name!r}: known are none, sarathi-serve, "
                             f"{', '.join(named_stacks())} (or a cost-model file path ending in .json)")
    try:
        data = json.loads(read_text_file(p, "cost-model file"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"cost-model file {p} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or FORMAT_KEY not in data:
        raise ValueError(f"cost-model file {p} is not a kvlab cost-model file (no {FORMAT_KEY!r} key; "
                         "write one with kvlab calibrate)")
    st = data.get("stack")
    if not isinstance(st, dict):
        raise ValueError(f"cost-model file {p}: 'stack' must be an object of overhead_s, overhead_s_per_seq, "
                         "gpu_time_scale (and optionally overhead_s_per_request)")
    try:
        terms = {k: float(st.get(k, d)) for k, d in (("overhead_s", 0.0), ("overhead_s_per_seq", 0.0),
                                                     ("gpu_time_scale", 1.0), ("overhead_s_per_request", 0.0))}
    except (TypeError, ValueError):
        raise ValueError(f"cost-model file {p}: stack terms must be numbers, got {st!r}") from None
    overlap = st.get("overlap", False)
    if not isinstance(overlap, bool):
        raise ValueError(f"cost-model file {p}: stack overlap must be true or false, got {overlap!r}")
    meta = {k: v for k, v in data.items() if k not in (FORMAT_KEY, "name", "label", "base", "kernels", "stack")}
    try:
        return StackTerms(name=str(data.get("name") or p.stem), label=str(data.get("label") or ""),
                          base=data.get("base"), kernels=data.get("kernels"), meta=meta, overlap=overlap, **terms)
    except ValueError as exc:
        raise ValueError(f"cost-model file {p}: {exc}") from None


def save(terms: StackTerms, path: str | Path) -> Path:
    """Write ``terms`` as a cost-model file (JSON, renamed into place whole) and return its path."""
    return write_text_atomically(path, json.dumps(terms.to_dict(), indent=1, sort_keys=False) + "\n")


@dataclass(frozen=True, kw_only=True)
class StackedCostModel:
    """A base cost model with a stack's terms (any base with ``iteration_s``; a compiled form
    when the base has one, :mod:`.compiled`)."""

    base: Any
    terms: StackTerms
    label: str

    def iteration_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any = 1) -> Any:
        """``gpu_time_scale x base + overhead_s + overhead_s_per_seq x num_seqs`` (seconds); the larger
        of the two parts instead of their sum where the terms ``overlap``."""
        t = self.terms
        gpu = t.gpu_time_scale * self.base.iteration_s(num_tokens, attention_pairs, kv_tokens, num_seqs)
        cpu = t.overhead_s + t.overhead_s_per_seq * num_seqs
        return np.maximum(gpu, cpu) if t.overlap else gpu + cpu


def apply(cost: Any, terms: StackTerms) -> Any:
    """``cost`` (a stack-free base model) with ``terms`` added.

    A :class:`~kvlab.costmodel.measured.MeasuredCostModel` without overheads stays one (its own
    ``gpu_time_scale`` and overhead fields set) unless the terms ``overlap``; any other model, and
    every overlapping stack, is wrapped in a :class:`StackedCostModel`. Both have a compiled form
    (:mod:`.compiled`).
    """
    from .measured import MeasuredCostModel

    label = f"{getattr(cost, 'label', type(cost).__name__)} + {terms.describe()}"
    if not terms.overlap and type(cost) is MeasuredCostModel and cost.overhead_s == 0.0 and cost.overhead_s_per_seq == 0.0 \
            and cost.gpu_time_scale == 1.0:
        return replace(cost, label=label, gpu_time_scale=float(terms.gpu_time_scale),
                       overhead_s=float(terms.overhead_s), overhead_s_per_seq=float(terms.overhead_s_per_seq))
    return StackedCostModel(base=cost, terms=terms, label=label)
