"""Claims tables: a published figure next to the value kvlab computed, with a verdict.

Every notebook ends with one. Verdicts are computed, never typed in: :func:`close` compares a
number with a relative tolerance, :func:`at_least` / :func:`at_most` check a threshold.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One row of a claims table."""

    claim: str
    source: str
    claimed: str
    kvlab_value: str
    verdict: str


def _fmt(x: float) -> str:
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def close(claim: str, source: str, claimed: float, value: float, *, rel_tol: float = 0.1,
          note: str = "") -> Claim:
    """``holds`` when ``value`` is within ``rel_tol`` of ``claimed``, else ``differs`` by how much."""
    rel = (value - claimed) / claimed if claimed else float("inf")
    verdict = "holds" if abs(rel) <= rel_tol else f"differs ({rel:+.0%})"
    return Claim(claim=claim, source=source, claimed=_fmt(claimed), kvlab_value=_fmt(value),
                 verdict=verdict + (f"; {note}" if note else ""))


def at_least(claim: str, source: str, threshold: float, value: float, *, note: str = "") -> Claim:
    """``holds`` when ``value >= threshold``."""
    verdict = "holds" if value >= threshold else f"differs ({_fmt(value)} < {_fmt(threshold)})"
    return Claim(claim=claim, source=source, claimed=f">= {_fmt(threshold)}", kvlab_value=_fmt(value),
                 verdict=verdict + (f"; {note}" if note else ""))


def at_most(claim: str, source: str, threshold: float, value: float, *, note: str = "") -> Claim:
    """``holds`` when ``value <= threshold``."""
    verdict = "holds" if value <= threshold else f"differs ({_fmt(value)} > {_fmt(threshold)})"
    return Claim(claim=claim, source=source, claimed=f"<= {_fmt(threshold)}", kvlab_value=_fmt(value),
                 verdict=verdict + (f"; {note}" if note else ""))


def table(claims: list[Claim]) -> pd.DataFrame:
    """The claims as a DataFrame (claim, source, claimed, kvlab_value, verdict)."""
    return pd.DataFrame([asdict(c) for c in claims])
