"""Claims tables: a published figure next to the value kvlab computed in the source's set-up, with a verdict.

Every notebook ends with one. A row names the source's set-up and the set-up kvlab ran (model,
GPU, TP/PP, workload, scheduler, metric, SLO: :class:`SetUp`), what kvlab's value rests on
against the source's inputs (:class:`Inputs`: the trace and whether it is the source's own, a
stand-in or a fitted profile; the trial size against the source's; the source's metric; where
kvlab's value was read), and kvlab's value under each cost model it ran (``roofline``,
``measured``). Verdicts are computed, never typed in, and each row carries its verdict's
``kind`` as a field (:data:`KINDS`), so pages count verdicts without parsing text.

The rules, by kind of claim:

* **arithmetic** (slot counts, pages, concurrency: :func:`exact`): the figure follows from the
  set-up by arithmetic, so it ``holds`` within 2% (:data:`ARITHMETIC_TOL`) or ``differs`` with
  its cause named (e.g. kvlab's activation reserve against the paper's);
* **simulated** (:func:`close`, :func:`in_range`, :func:`at_least`, :func:`at_most`): the source's
  own range, else +-30% (:data:`REL_TOL`), decided on the interval of kvlab's values over seeds
  (their range): inside the accepted region ``holds``, outside it ``differs``, across its edge
  ``inconclusive``;
* **stand-in** inputs: a row whose trace, trial size or set-up is not the source's says
  ``stand-in: <what differs>`` and gives no holds/differs, unless a sensitivity run (kvlab's value
  with the source's input in place, :attr:`Inputs.sensitivity`) gives the same verdict;
* :func:`not_reproducible` (``not reproducible here: <what is missing>``) and
  :func:`not_testable` (``not testable here: <what is unmeasured>``) when kvlab cannot run the
  source's set-up or lacks a measurement; :func:`reported` for a finding kvlab states as a
  distribution, with no verdict.

A value is a number, a sequence of numbers (one per seed: the interval is their range), or a
mapping ``{"roofline": x, "measured": y}`` of either (``None`` where that cost model could not
run, e.g. no measurements for the GPU).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .costmodel import unsupported as _measured_unsupported

#: The cost models a claim row reports, in column order.
COST_MODELS = ("roofline", "measured")
#: Default tolerance of a simulated claim: +-30% when the source gives no range of its own.
REL_TOL = 0.3
#: Tolerance of an arithmetic claim (slot counts, pages, concurrency).
ARITHMETIC_TOL = 0.02
#: What a row's trace is, against the source's.
TRACE_KINDS = ("source's own", "stand-in", "fitted profile", "stated in general", "no trace")
#: The kinds a verdict can have (the ``kind`` field of every row).
KINDS = ("holds", "differs", "inconclusive", "stand-in", "not reproducible", "not testable", "reported", "mixed",
         "not computed")
#: The columns a claims table shows on a page: for every row its trace, trial size, metric and verdict.
SHOWN = ("claim", "trace", "trial_size", "metric", "read_from", "claimed", "kvlab_value", "verdict")

Number = float | int
Samples = Number | Sequence[Number] | np.ndarray
Value = Samples | Mapping[str, Samples | None] | None


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


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What kvlab's value rests on, against the source's inputs.

    Attributes
    ----------
    trace : str
        The file or profile kvlab read ("" when no trace enters).
    trace_kind : str
        One of :data:`TRACE_KINDS`: the source's own trace, a stand-in for it (say what differs in
        ``differs``), a profile fitted to it (always a stand-in), the workload kvlab ran a claim
        the source states for serving in general on ("stated in general"), or no trace (arithmetic).
    num_requests, source_num_requests : int, optional
        Requests per trial (or per run) kvlab used and the source used; fewer than the source's
        makes the row a stand-in.
    metric : str
        The source's metric, in its words.
    read_from : str
        Where kvlab's value was read (which table, run, statistic).
    differs : tuple of str
        Everything else that is not the source's (e.g. "4k stand-in (paper: 16k)").
    sensitivity : value, optional
        kvlab's value with the source's input in place of the stand-in (a sensitivity run); when
        it gives the same verdict as the stand-in run, the verdict stands.
    sensitivity_run : str
        What the sensitivity run changed.
    """

    trace: str = ""
    trace_kind: str = "no trace"
    num_requests: int | None = None
    source_num_requests: int | None = None
    metric: str = ""
    read_from: str = ""
    differs: tuple[str, ...] = ()
    sensitivity: Value = None
    sensitivity_run: str = ""

    def __post_init__(self) -> None:
        if self.trace_kind not in TRACE_KINDS:
            raise ValueError(f"trace_kind {self.trace_kind!r} is not one of {TRACE_KINDS}")
        if self.trace_kind != "no trace" and not self.trace:
            raise ValueError(f"trace_kind {self.trace_kind!r} needs the trace kvlab read")
        if isinstance(self.differs, str):
            raise ValueError("differs must be a tuple of strings, not one string")
        for name in ("num_requests", "source_num_requests"):
            n = getattr(self, name)
            if n is not None and (not isinstance(n, (int, np.integer)) or n <= 0):
                raise ValueError(f"{name} must be a positive integer, got {n!r}")

    def trace_words(self) -> str:
        """The trace and what it is, e.g. ``"sarathi_sharegpt_8k_llama2.csv (source's own)"``; ``"none"`` without one."""
        return f"{self.trace} ({self.trace_kind})" if self.trace else "none"

    def trial_words(self) -> str:
        """kvlab's trial size against the source's, e.g. ``"200 requests (source: 2,048)"``."""
        if self.num_requests is None:
            return "n/a" if self.source_num_requests is None else f"n/a (source: {self.source_num_requests:,})"
        if self.trace_kind == "stated in general" and self.source_num_requests is None:
            return f"{self.num_requests:,} requests"
        src = "not stated" if self.source_num_requests is None else f"{self.source_num_requests:,}"
        return f"{self.num_requests:,} requests (source: {src})"

    def stand_in(self) -> str:
        """What differs from the source's inputs ("" when nothing does)."""
        out = []
        if self.trace_kind == "fitted profile":
            out.append(f"ran on the fitted profile {self.trace}, not the trace")
        out += list(self.differs)
        if self.trace_kind == "stand-in" and not self.differs:
            out.append(f"trace {self.trace} stands in for the source's")
        if self.num_requests is not None and self.source_num_requests is not None \
                and self.num_requests < self.source_num_requests:
            out.append(f"{self.num_requests:,} requests per trial (source: {self.source_num_requests:,})")
        return "; ".join(out)


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

    ``roofline`` and ``measured`` are kvlab's value under each cost model (the mean over seeds;
    NaN: not run or not applicable); ``kvlab_value`` says the same in words, with the interval.
    ``trace``, ``trial_size``, ``metric`` and ``read_from`` are :class:`Inputs` in words;
    ``kind`` is the verdict's kind (:data:`KINDS`), ``claim_type`` ``arithmetic``,
    ``simulated`` or ``data``.
    """

    claim: str
    source: str
    source_setup: str = ""
    kvlab_setup: str = ""
    trace: str = ""
    trial_size: str = ""
    metric: str = ""
    read_from: str = ""
    claimed: str
    kvlab_value: str
    roofline: float = float("nan")
    measured: float = float("nan")
    verdict: str
    kind: str = ""
    claim_type: str = ""


def _fmt(x: float) -> str:
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _samples(x: Samples | None, where: str) -> np.ndarray | None:
    if x is None:
        return None
    arr = np.atleast_1d(np.asarray(x, dtype=np.float64))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"claim value {where} must be a number or a non-empty sequence of numbers (one per seed)")
    arr = arr[np.isfinite(arr)]
    return arr if arr.size else None


def _values(value: Value) -> dict[str, np.ndarray | None]:
    """``{"": samples}`` for one value, ``{cost model: samples or None}`` for a mapping."""
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(COST_MODELS))
        if unknown:
            raise ValueError(f"claim value names unknown cost models {unknown}: expected {COST_MODELS}")
        out = {k: _samples(value.get(k), f"for {k}") for k in COST_MODELS if k in value}
        if not out:
            raise ValueError(f"claim value needs at least one of {COST_MODELS}")
        return out
    if value is None:
        raise ValueError("claim value is None: use not_reproducible() when kvlab has no value")
    return {"": _samples(value, "")}


def _value_words(vals: Mapping[str, np.ndarray | None], unit: str) -> str:
    def one(x: np.ndarray | None) -> str:
        if x is None:
            return "n/a"
        if x.size == 1:
            return _fmt(float(x[0])) + unit
        return f"{_fmt(float(x.mean()))}{unit} ({_fmt(float(x.min()))}-{_fmt(float(x.max()))}{unit} over {x.size} seeds)"
    if list(vals) == [""]:
        return one(vals[""])
    return ", ".join(f"{one(x)} ({k})" for k, x in vals.items())


@dataclass(frozen=True)
class _Test:
    """An accepted region ``[low, high]`` and how a value outside it is described."""

    low: float
    high: float
    claimed: str
    outside: object  # Callable[[float], str]: words for a mean outside the region

    def judge(self, x: np.ndarray) -> tuple[str, str]:
        lo, hi, mean = float(x.min()), float(x.max()), float(x.mean())
        tol = 1e-12 * max([1.0] + [abs(e) for e in (self.low, self.high) if np.isfinite(e)])
        if lo >= self.low - tol and hi <= self.high + tol:
            return "holds", "holds"
        if hi < self.low - tol or lo > self.high + tol:
            return "differs", f"differs ({self.outside(mean)})"
        cut = [e for e in (self.low, self.high) if np.isfinite(e) and lo < e < hi]
        return "inconclusive", (f"inconclusive ({_fmt(lo)}-{_fmt(hi)} over {x.size} seeds straddles "
                                f"{' and '.join(_fmt(e) for e in cut)})")


def _combine(judged: Mapping[str, tuple[str, str] | None]) -> tuple[str, str]:
    """One verdict from the verdicts per cost model (or the single ``""`` one)."""
    done = {k: j for k, j in judged.items() if j is not None}
    if not done:
        return "not computed", "not computed: no cost model gave a finite value"
    if list(judged) == [""]:
        return done[""]
    kinds = {kind for kind, _ in done.values()}
    texts = {text for _, text in done.values()}
    if len(texts) == 1 and len(done) == len(judged):
        return kinds.pop(), f"{texts.pop()} under {' and '.join(judged)}"
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    return kind, "; ".join(f"{k}: {done[k][1] if k in done else 'not run'}" for k in judged)


def _row(claim: str, source: str, value: Value, test: _Test, *, source_setup: SetUp | str,
         kvlab_setup: SetUp | str, note: str, unit: str, inputs: Inputs | None, claim_type: str) -> Claim:
    inputs = inputs or Inputs()
    vals = _values(value)
    judged = {k: None if x is None else test.judge(x) for k, x in vals.items()}
    kind, verdict = _combine(judged)
    stand_in = inputs.stand_in()
    if stand_in and kind != "not computed":
        check, same = "", False
        if inputs.sensitivity is not None:
            alt = _values(inputs.sensitivity)
            alt_judged = {k: None if x is None else test.judge(x) for k, x in alt.items()}
            # the same verdict: every cost model judged on both runs, to the same kind
            same = set(alt_judged) == set(judged) and all(
                (judged[k] is None) == (alt_judged[k] is None) and (judged[k] is None or judged[k][0] == alt_judged[k][0])
                for k in judged)
            check = (f"{inputs.sensitivity_run or 'the sensitivity run'} gives {_value_words(alt, unit)}"
                     f" ({'the same verdict' if same else _combine(alt_judged)[1]})")
        if same:
            verdict = f"{verdict}; stand-in ({stand_in}) does not change it: {check}"
        else:
            kind, verdict = "stand-in", (f"stand-in: {stand_in}" + (f"; {check}" if check else "")
                                         + f"; not judged (on these inputs it would read: {verdict})")
    nums = {k: (float("nan") if x is None else float(x.mean())) for k, x in vals.items() if k}
    return Claim(claim=claim, source=source, source_setup=_describe(source_setup), kvlab_setup=_describe(kvlab_setup),
                 trace=inputs.trace_words(), trial_size=inputs.trial_words(), metric=inputs.metric,
                 read_from=inputs.read_from, claimed=test.claimed, kvlab_value=_value_words(vals, unit),
                 verdict=verdict + (f"; {note}" if note else ""), kind=kind, claim_type=claim_type, **nums)


def close(claim: str, source: str, claimed: float, value: Value, *, rel_tol: float = REL_TOL, note: str = "",
          source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
          inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """A simulated figure: ``holds`` when every seed's value is within ``rel_tol`` of ``claimed`` (default +-30%),
    ``differs`` (by how much, from the mean) when none is, ``inconclusive`` when the seeds straddle the edge."""
    if claimed == 0:
        raise ValueError("close() needs a non-zero claimed figure (a relative tolerance of 0 is undefined)")
    edges = sorted((claimed * (1 - rel_tol), claimed * (1 + rel_tol)))
    return _row(claim, source, value, _Test(edges[0], edges[1], _fmt(claimed) + unit,
                                            lambda x: f"{(x - claimed) / claimed:+.0%}"),
                source_setup=source_setup, kvlab_setup=kvlab_setup, note=note, unit=unit, inputs=inputs,
                claim_type=claim_type)


def in_range(claim: str, source: str, low: float, high: float, value: Value, *, note: str = "",
             source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
             inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """``holds`` when every seed's value lies in ``[low, high]`` (the source's own range); ``differs (below/above)``
    when none does; ``inconclusive`` when they straddle an end."""
    if not low <= high:
        raise ValueError(f"in_range needs low <= high, got {low} and {high}")

    def outside(x: float) -> str:
        return f"{_fmt(x)}{unit} {'below' if x < low else 'above'} {_fmt(low)}-{_fmt(high)}{unit}"
    return _row(claim, source, value, _Test(low, high, f"{_fmt(low)}-{_fmt(high)}{unit}", outside),
                source_setup=source_setup, kvlab_setup=kvlab_setup, note=note, unit=unit, inputs=inputs,
                claim_type=claim_type)


def at_least(claim: str, source: str, threshold: float, value: Value, *, note: str = "",
             source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
             inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """``holds`` when every seed's value is ``>= threshold``, ``differs`` when none is, else ``inconclusive``."""
    return _row(claim, source, value, _Test(threshold, np.inf, f">= {_fmt(threshold)}{unit}",
                                            lambda x: f"{_fmt(x)} < {_fmt(threshold)}"),
                source_setup=source_setup, kvlab_setup=kvlab_setup, note=note, unit=unit, inputs=inputs,
                claim_type=claim_type)


def at_most(claim: str, source: str, threshold: float, value: Value, *, note: str = "",
            source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
            inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """``holds`` when every seed's value is ``<= threshold``, ``differs`` when none is, else ``inconclusive``."""
    return _row(claim, source, value, _Test(-np.inf, threshold, f"<= {_fmt(threshold)}{unit}",
                                            lambda x: f"{_fmt(x)} > {_fmt(threshold)}"),
                source_setup=source_setup, kvlab_setup=kvlab_setup, note=note, unit=unit, inputs=inputs,
                claim_type=claim_type)


def exact(claim: str, source: str, claimed: float, value: Value, *, cause: str, rel_tol: float = ARITHMETIC_TOL,
          note: str = "", source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
          inputs: Inputs | None = None) -> Claim:
    """An arithmetic figure (slots, pages, concurrency): ``holds`` within ``rel_tol`` (2%), else ``differs`` with
    ``cause``, what makes kvlab's arithmetic differ from the source's (e.g. its activation reserve)."""
    if not cause:
        raise ValueError("exact() needs `cause`: what separates kvlab's arithmetic from the source's when they differ")
    if not 0 <= rel_tol <= ARITHMETIC_TOL:
        raise ValueError(f"an arithmetic claim's rel_tol must be within 0-{ARITHMETIC_TOL:g}, got {rel_tol}")
    if claimed == 0:
        raise ValueError("exact() needs a non-zero claimed figure")
    lo, hi = sorted((claimed * (1 - rel_tol), claimed * (1 + rel_tol)))
    return _row(claim, source, value, _Test(lo, hi, _fmt(claimed) + unit,
                                            lambda x: f"{(x - claimed) / claimed:+.1%}: {cause}"),
                source_setup=source_setup, kvlab_setup=kvlab_setup, note=note, unit=unit, inputs=inputs,
                claim_type="arithmetic")


def _unjudged(claim: str, source: str, claimed: str, value: Value, *, kind: str, verdict: str,
              source_setup: SetUp | str, kvlab_setup: SetUp | str, unit: str, inputs: Inputs | None,
              label: str, claim_type: str) -> Claim:
    inputs = inputs or Inputs()
    if value is None:
        text, nums = "n/a", {}
    else:
        vals = _values(value)
        text = label + _value_words(vals, unit)
        nums = {k: (float("nan") if x is None else float(x.mean())) for k, x in vals.items() if k}
    return Claim(claim=claim, source=source, source_setup=_describe(source_setup), kvlab_setup=_describe(kvlab_setup),
                 trace=inputs.trace_words(), trial_size=inputs.trial_words(), metric=inputs.metric,
                 read_from=inputs.read_from, claimed=claimed, kvlab_value=text, verdict=verdict, kind=kind,
                 claim_type=claim_type, **nums)


def not_reproducible(claim: str, source: str, claimed: str, missing: str, *, value: Value = None,
                     source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
                     inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """A claim whose set-up kvlab cannot run: verdict ``not reproducible here: <missing>``.

    ``value``, if given, is kvlab's figure in the closest set-up it can run (``kvlab_setup``),
    shown as a stand-in and never judged against the claim.
    """
    if not missing:
        raise ValueError("not_reproducible needs `missing`: what kvlab lacks to run the source's set-up")
    return _unjudged(claim, source, claimed, value, kind="not reproducible", verdict=f"not reproducible here: {missing}",
                     source_setup=source_setup, kvlab_setup=kvlab_setup, unit=unit, inputs=inputs,
                     label="stand-in: ", claim_type=claim_type)


def not_testable(claim: str, source: str, claimed: str, unmeasured: str, *, value: Value = None,
                 source_setup: SetUp | str = "", kvlab_setup: SetUp | str = "", unit: str = "",
                 inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """A claim that rests on something kvlab has not measured: verdict ``not testable here: <unmeasured>``.

    ``value``, if given, is what kvlab's unmeasured model gives, shown and never judged.
    """
    if not unmeasured:
        raise ValueError("not_testable needs `unmeasured`: what kvlab would have to measure to test the claim")
    return _unjudged(claim, source, claimed, value, kind="not testable", verdict=f"not testable here: {unmeasured}",
                     source_setup=source_setup, kvlab_setup=kvlab_setup, unit=unit, inputs=inputs,
                     label="unmeasured model: ", claim_type=claim_type)


def reported(claim: str, source: str, claimed: str, finding: str, *, source_setup: SetUp | str = "",
             kvlab_setup: SetUp | str = "", inputs: Inputs | None = None, claim_type: str = "simulated") -> Claim:
    """A finding kvlab states as it is (a distribution, a comparison), with no holds/differs: verdict ``reported``."""
    if not finding:
        raise ValueError("reported needs `finding`: what kvlab found")
    inputs = inputs or Inputs()
    return Claim(claim=claim, source=source, source_setup=_describe(source_setup), kvlab_setup=_describe(kvlab_setup),
                 trace=inputs.trace_words(), trial_size=inputs.trial_words(), metric=inputs.metric,
                 read_from=inputs.read_from, claimed=claimed, kvlab_value=finding, verdict=f"reported: {finding}",
                 kind="reported", claim_type=claim_type)


def table(claims: list[Claim]) -> pd.DataFrame:
    """The claims as a DataFrame, one row per claim (the :class:`Claim` fields as columns)."""
    return pd.DataFrame([asdict(c) for c in claims], columns=list(Claim.__dataclass_fields__))
