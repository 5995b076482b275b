"""Claims tables: a published figure next to the value kvlab computed in the source's set-up, with a verdict.

Every notebook ends with one. A row names the source's set-up and the set-up kvlab ran (model,
GPU, TP/PP, workload, scheduler, metric, SLO: :class:`SetUp`), and gives kvlab's value under
each cost model it ran (``roofline``, ``measured``). Verdicts are computed, never typed in:

* :func:`close` (within ``rel_tol`` of the claimed figure, +-30% unless the source says more),
  :func:`in_range` (inside the source's own range), :func:`at_least` / :func:`at_most`
  (thresholds) give ``holds`` or ``differs (...)`` per cost model;
* :func:`not_reproducible` gives ``not reproducible here: <what is missing>`` when kvlab cannot
  run the source's set-up; any value it shows is then a stand-in, labelled as such.

A value is a number (one cost model, or a figure no cost model enters: lengths, counts) or a
mapping ``{"roofline": x, "measured": y}`` (``None`` where that cost model could not run, e.g.
no measurements for the GPU).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from .costmodel import unsupported as _measured_unsupported

#: The cost models a claim row reports, in column order.
COST_MODELS = ("roofline", "measured")
#: Default tolerance of :func:`close`: +-30% when the source gives no range of its own.
REL_TOL = 0.3

Value = float | Mapping[str, float | None] | None


@dataclass(frozen=True, kw_only=True)
class SetUp:
    """What a figure rests on. Empty fields are left out of :meth:`describe`.

    Attributes
    ----------
    model, gpu : str
    tp, pp : int
        Tensor-parallel GPUs per stage, pipeline stages.
    workload : str
        Trace or length profile (and the request rate or load where it matters).
    scheduler : str
        Scheduler and its limits (e.g. "prefill-first, 2,560 tokens per iteration").
    metric : str
        What is measured (e.g. "capacity at a normalized-latency SLO").
    slo : str
        The latency bound, if any.
    """

    model: str = ""
    gpu: str = ""
    tp: int = 1
    pp: int = 1
    workload: str = ""
    scheduler: str = ""
    metric: str = ""
    slo: str = ""

    def describe(self) -> str:
        """One line: ``model on N x gpu (TPt-PPp); workload; scheduler; metric; SLO``."""
        parts = []
        if self.model or self.gpu:
            n = self.tp * self.pp
            parts.append(f"{self.model} on {n} x {self.gpu} (TP{self.tp}-PP{self.pp})" if self.gpu else self.model)
        parts += [self.workload, self.scheduler, f"metric: {self.metric}" if self.metric else "",
                  f"SLO: {self.slo}" if self.slo else ""]
        return "; ".join(p for p in parts if p)


def cost_models_for(model: str, gpu: str, *, tp: int = 1,
                    cost_models: tuple[str, ...] | list[str] = COST_MODELS) -> dict[str, str | None]:
    """Each of ``cost_models`` -> None when it can run ``model`` on ``tp`` x ``gpu``, else why not.

    The roofline runs everywhere; the measured model only where :func:`kvlab.costmodel.unsupported`
    finds nothing missing (GPU measurements, a dense model, a measured all-reduce at this TP).
    """
    return {cm: (_measured_unsupported(model, gpu, tp=tp) if cm == "measured" else None) for cm in cost_models}


def cost_model_ran(cost_model: str | None, model: str, gpu: str, *, tp: int = 1) -> str:
    """The name of the model a ``cost_model=`` argument runs: ``"measured"`` or ``"roofline"``."""
    if cost_model == "roofline":
        return "roofline"
    return "measured" if _measured_unsupported(model, gpu, tp=tp) is None else "roofline"


def not_run_note(reasons: Mapping[str, str | None]) -> str:
    """``"<cost model> cost model not run: <why>"`` for each that could not run ("" if all ran)."""
    return "; ".join(f"{cm} cost model not run: {why}" for cm, why in reasons.items() if why)


def _describe(setup: SetUp | str) -> str:
    return setup.describe() if isinstance(setup, SetUp) else str(setup)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One row of a claims table.

    ``roofline`` and ``measured`` are kvlab's value under each cost model (NaN: not run or not
    applicable); ``kvlab_value`` says the same in words.
    """

    claim: str
    source: str
    source_setup: str = ""
    kvlab_setup: str = ""
    claimed: str
    kvlab_value: str
    roofline: float = float("nan")
    measured: float = float("nan")
    verdict: str


def _fmt(x: float) -> str:
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _values(value: Value) -> dict[str, float | None]:
    """``{"": x}`` for one number, ``{cost model: x or None}`` for a mapping."""
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(COST_MODELS))
        if unknown:
            raise ValueError(f"claim value names unknown cost models {unknown}: expected {COST_MODELS}")
        out = {k: (None if value.get(k) is None else float(value[k])) for k in COST_MODELS if k in value}
        if not out:
            raise ValueError(f"claim value needs at least one of {COST_MODELS}")
        return out
    if value is None:
        raise ValueError("claim value is None: use not_reproducible() when kvlab has no value")
    return {"": float(value)}


def _row(claim: str, source: str, claimed: str, value: Value, judge: Callable[[float], str], *,
         source_setup: SetUp | str, kvlab_setup: SetUp | str, note: str, unit: str) -> Claim:
    vals = _values(value)
    verdicts = {k: judge(x) for k, x in vals.items() if x is not None and np.isfinite(x)}
    if not verdicts:
        verdict = "not computed: no cost model gave a finite value"
    elif list(vals) == [""]:
        verdict = verdicts[""]
    elif len(set(verdicts.values())) == 1 and len(verdicts) == len(vals):
        verdict = f"{next(iter(verdicts.values()))} under {' and '.join(vals)}"
    else:
        verdict = "; ".join(f"{k}: {verdicts.get(k, 'not run')}" for k in vals)
    words = [_fmt(x) + unit if x is not None and np.isfinite(x) else "n/a" for x in vals.values()]
    text = words[0] if list(vals) == [""] else ", ".join(f"{w} ({k})" for k, w in zip(vals, words))
    nums = {k: (float("nan") if x is None else x) for k, x in vals.items() if k}
    return Claim(claim=claim, source=source, source_setup=_describe(source_setup), kvlab_setup=_describe(kvlab_setup),
                 claimed=claimed, kvlab_value=text, verdict=verdict + (f"; {note}" if note else ""), **nums)


def close(claim: str, source: str, claimed: float, value: Value, *, rel_tol: float = REL_TOL, note: str = "",
          source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "") -> Claim:
    """``holds`` when ``value`` is within ``rel_tol`` of ``claimed`` (default +-30%), else ``differs`` by how much."""
    def judge(x: float) -> str:
        rel = (x - claimed) / claimed if claimed else float("inf")
        return "holds" if abs(rel) <= rel_tol + 1e-12 else f"differs ({rel:+.0%})"
    return _row(claim, source, _fmt(claimed) + unit, value, judge, source_setup=source_setup,
                kvlab_setup=kvlab_setup, note=note, unit=unit)


def in_range(claim: str, source: str, low: float, high: float, value: Value, *, note: str = "",
             source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "") -> Claim:
    """``holds`` when ``low <= value <= high`` (the source's own range), else ``differs (below/above)``."""
    if not low <= high:
        raise ValueError(f"in_range needs low <= high, got {low} and {high}")

    def judge(x: float) -> str:
        if low <= x <= high:
            return "holds"
        return f"differs ({_fmt(x)}{unit} {'below' if x < low else 'above'} {_fmt(low)}-{_fmt(high)}{unit})"
    return _row(claim, source, f"{_fmt(low)}-{_fmt(high)}{unit}", value, judge, source_setup=source_setup,
                kvlab_setup=kvlab_setup, note=note, unit=unit)


def at_least(claim: str, source: str, threshold: float, value: Value, *, note: str = "",
             source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "") -> Claim:
    """``holds`` when ``value >= threshold``."""
    def judge(x: float) -> str:
        return "holds" if x >= threshold else f"differs ({_fmt(x)} < {_fmt(threshold)})"
    return _row(claim, source, f">= {_fmt(threshold)}{unit}", value, judge, source_setup=source_setup,
                kvlab_setup=kvlab_setup, note=note, unit=unit)


def at_most(claim: str, source: str, threshold: float, value: Value, *, note: str = "",
            source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "") -> Claim:
    """``holds`` when ``value <= threshold``."""
    def judge(x: float) -> str:
        return "holds" if x <= threshold else f"differs ({_fmt(x)} > {_fmt(threshold)})"
    return _row(claim, source, f"<= {_fmt(threshold)}{unit}", value, judge, source_setup=source_setup,
                kvlab_setup=kvlab_setup, note=note, unit=unit)


def not_reproducible(claim: str, source: str, claimed: str, missing: str, *, value: Value = None,
                     source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "") -> Claim:
    """A claim whose set-up kvlab cannot run: verdict ``not reproducible here: <missing>``.

    ``value``, if given, is kvlab's figure in the closest set-up it can run (``kvlab_setup``),
    shown as a stand-in and never judged against the claim.
    """
    if not missing:
        raise ValueError("not_reproducible needs `missing`: what kvlab lacks to run the source's set-up")
    if value is None:
        text, nums = "n/a", {}
    else:
        vals = _values(value)
        words = [_fmt(x) + unit if x is not None and np.isfinite(x) else "n/a" for x in vals.values()]
        text = "stand-in: " + (words[0] if list(vals) == [""] else ", ".join(f"{w} ({k})" for k, w in zip(vals, words)))
        nums = {k: (float("nan") if x is None else x) for k, x in vals.items() if k}
    return Claim(claim=claim, source=source, source_setup=_describe(source_setup), kvlab_setup=_describe(kvlab_setup),
                 claimed=claimed, kvlab_value=text, verdict=f"not reproducible here: {missing}", **nums)


def table(claims: list[Claim]) -> pd.DataFrame:
    """The claims as a DataFrame, one row per claim (the :class:`Claim` fields as columns)."""
    return pd.DataFrame([asdict(c) for c in claims], columns=list(Claim.__dataclass_fields__))
