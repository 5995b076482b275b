"""The seed essay's practical recipe checked (notebook 07's claims): reserve about the p95 for
short, light-tailed workloads, the p99 or more for high-variance ones.

Each check reads a :class:`~kvlab.recommend.core.Recommendation` of the ``reservation``
system (:mod:`kvlab.recommend.systems`): reservations at output-length percentiles with each
overflow mode, next to reserving all of ``max_new_tokens``. The recipe holds when a setting it
names is the best or ties the best capacity. Capacity does not depend on the offered load
(:mod:`kvlab.recommend.core`), so the verdict holds whether one replica carries the load or
several do; it differs only when no setting meets the SLO at any rate.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from .. import claims as _claims
from .core import Recommendation
from .systems import RESERVATION

#: Where the recipe comes from (its figures are claims of the seed essay, not of a paper).
SOURCE = "the seed essay's practical recipe (section 3)"


def _check(rec: Recommendation, name: str) -> None:
    if rec.setup["system"] != RESERVATION:
        raise ValueError(f"the {name} recommendation must search the {RESERVATION!r} system, "
                         f"got {rec.setup['system']!r}")


def _tail_ratio(rec: Recommendation, name: str) -> float:
    _check(rec, name)
    if not {"p50", "p99"} <= set(rec.percentiles):
        raise ValueError(f"the {name} recommendation must include percentiles 50 and 99, got {list(rec.percentiles)}")
    return rec.percentiles["p99"] / rec.percentiles["p50"]


def _names(setting: str, expected: Sequence[str]) -> bool:
    """Whether a setting label reserves one of ``expected`` ("p95", "max_new_tokens")."""
    return any(setting == f"reserve {e}" or setting.startswith(f"reserve {e},") for e in expected)


def _recipe_claim(claim: str, rec: Recommendation, expected: Sequence[str], ratio: float) -> _claims.Claim:
    t = rec.table
    tied = t[t["tie"]]
    if rec.chosen is None or tied.empty:
        kind, verdict, got = "differs", "differs: no setting meets the SLO at any rate on this model and GPU", "none"
    else:
        best = tied.loc[tied["capacity_qps"].idxmax()]
        got = f"{best['setting']} ({best['capacity_qps']:.3g} requests/s)"
        named = [s for s in tied["setting"] if _names(s, expected)]
        if _names(str(best["setting"]), expected):
            kind, verdict = "holds", "holds"
        elif named:
            kind, verdict = "holds", f"holds as a tie: {', '.join(named)} ties the best ({best['setting']})"
        else:
            alts = t[[_names(s, expected) for s in t["setting"]]]
            top = float(alts["capacity_qps"].max()) if len(alts) else 0.0
            gain = best["capacity_qps"] / top - 1.0 if top > 0 else float("inf")
            kind, verdict = "differs", (f"differs: {best['setting']} sustains {gain:+.0%} more requests/s than the best of "
                       f"{'/'.join(expected)}")
    return _claims.Claim(claim=f"{claim} (p99/p50 = {ratio:.1f})", source=SOURCE,
                         claimed=" or ".join(expected), kvlab_value=got, verdict=verdict, kind=kind)


def recipe_claims(light: Recommendation, heavy: Recommendation) -> pd.DataFrame:
    """Notebook 07's claims table: the seed essay's recipe checked on a light- and a heavy-tailed workload.

    Parameters
    ----------
    light, heavy : Recommendation
        ``reservation`` searches on a short, light-tailed and a high-variance workload, each with
        percentiles 50 and 99 (``light`` also 95, for the share preempted at the offered load).
    """
    light_ratio, heavy_ratio = _tail_ratio(light, "light"), _tail_ratio(heavy, "heavy")
    if light_ratio >= heavy_ratio:
        raise ValueError(f"the light workload's tail (p99/p50 = {light_ratio:.1f}) must be lighter than the heavy "
                         f"one's ({heavy_ratio:.1f})")
    c1 = _recipe_claim("Short, light-tailed workload: reserve about the p95", light, ("p95",), light_ratio)
    c2 = _recipe_claim("High-variance workload: reserve the p99 or more", heavy, ("p99", "max_new_tokens"),
                       heavy_ratio)
    at_p95 = light.table[light.table["setting"] == "reserve p95, recompute"]
    if at_p95.empty:
        raise ValueError("the light recommendation must include the 95th percentile with recompute (below its "
                         "max_new_tokens)")
    share = float(at_p95["preempted_request_frac"].iloc[0])
    if share != share:  # NaN: no offered load
        raise ValueError("the light recommendation has no offered load (no arrival times): give qps")
    c3 = _claims.close("Reserving the p95, about 5% of requests overrun and are preempted", SOURCE,
                       0.05, share, rel_tol=0.2,
                       note="share of requests preempted at least once at the offered load (light workload); "
                            "a request is preempted when it outgrows its reservation or the pool runs dry, and "
                            "the reservation rounds up to whole pages")
    return _claims.table([c1, c2, c3])
