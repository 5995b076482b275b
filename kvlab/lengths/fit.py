"""Percentiles, bootstrap intervals and integer-, censoring-aware maximum-likelihood fits.

Why the likelihood is hand-assembled rather than ``dist.fit(CensoredData(...))``: token counts
are integers, so each observed count ``k`` is the interval ``[k - 0.5, k + 0.5]`` of the
continuous law (``[0, 1.5]`` for ``k = 1``, since lengths are floored at 1), and an output that
hit its cap ``c`` is right-censored at ``c - 0.5`` (its true length is at least ``c``).
scipy.stats.CensoredData expresses exactly this, but ``rv_continuous.fit`` on it evaluates the
likelihood per observation with a generic optimiser: ~1,000,000 lengths take minutes per family
(``bench/bench_fit.py`` measures it). Counts repeat heavily (a million outputs hold a few
thousand distinct values), so we collapse to unique ``(value, censored)`` pairs with weights and
maximise the same weighted interval log-likelihood with ``scipy.optimize.minimize``, using
scipy.stats for every cdf. The two give the same maximum (tested).

A sample filtered to lengths ``<= u`` (a trace that kept only requests up to a length, rather
than capping them) is truncated, not censored: pass ``upper_tokens=u`` and each length's
likelihood is divided by the law's mass below ``u + 0.5``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import optimize, stats

from .. import _validate as v
from .._intmath import quantile_tokens, round_tokens
from .families import DEFAULT_FAMILIES, Family, family as _family

#: Fewest uncensored lengths a fit accepts.
MIN_FIT_SAMPLES = 10
_TINY = 1e-300


def lengths_array(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a 1-D int64 array of lengths in [1, ``MAX_TRACE_TOKENS``] (tokens), or ``ValueError``
    naming the element."""
    arr = v.nonnegative_int_array(x, name, maximum=v.MAX_TRACE_TOKENS)
    zeros = np.flatnonzero(arr == 0)
    if zeros.size:
        raise ValueError(f"{name} must hold lengths >= 1 token; element {int(zeros[0])} is 0")
    return arr


def percentiles(x: Any) -> pd.Series:
    """Summary of a length sample: p50, p90, p95, p99, max, mean (tokens) and tail ratios.

    Percentiles use NumPy's default linear interpolation. ``p90_over_p50`` and ``p99_over_p50``
    are the brief's "P90 about 4.6x the median" ratios.

    Examples
    --------
    >>> percentiles(np.arange(1, 101))[["p50", "max", "p90_over_p50"]].round(3).tolist()
    [50.5, 100.0, 1.784]
    """
    arr = lengths_array(x)
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
    return pd.Series({"n": float(arr.size), "p50": p50, "p90": p90, "p95": p95, "p99": p99,
                      "max": float(arr.max()), "mean": float(arr.mean()),
                      "p90_over_p50": p90 / p50, "p99_over_p50": p99 / p50})


def percentile_ci(x: Any, q: Sequence[float] = (50, 90, 95, 99), *, confidence: float = 0.95,
                  n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Bootstrap confidence intervals for percentiles of a length sample.

    Uses ``scipy.stats.bootstrap`` (percentile method) with ``numpy.random.default_rng(seed)``.

    Parameters
    ----------
    x : array of int
        Lengths (tokens).
    q : sequence of float
        Percentiles in (0, 100).
    confidence : float
        Confidence level in (0, 1).
    n_resamples : int
        Bootstrap resamples.
    seed : int
        Seed of the resampling generator.

    Returns
    -------
    DataFrame with ``percentile``, ``tokens`` (the sample percentile), ``low_tokens``,
    ``high_tokens``.
    """
    arr = lengths_array(x)
    qs = np.asarray(q, dtype=np.float64)
    if qs.ndim != 1 or qs.size == 0 or np.any(~np.isfinite(qs)) or np.any((qs <= 0) | (qs >= 100)):
        raise ValueError(f"q must hold percentiles in (0, 100), got {q!r}")
    confidence = v.fraction(confidence, "confidence", high_closed=False)
    n_resamples = v.positive_int(n_resamples, "n_resamples")
    res = stats.bootstrap((arr,), lambda s, axis: np.percentile(s, qs, axis=axis),
                          confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                          rng=np.random.default_rng(seed), batch=max(1, int(2e7 // arr.size)))
    return pd.DataFrame({"percentile": qs, "tokens": np.percentile(arr, qs),
                         "low_tokens": res.confidence_interval.low,
                         "high_tokens": res.confidence_interval.high})


@dataclass(frozen=True, kw_only=True)
class FittedLength:
    """A length distribution fitted to integer token counts.

    ``cdf``, ``ppf`` and ``sample`` speak integer lengths: the length is the continuous draw
    rounded to the nearest integer and floored at 1, the model the likelihood assumed.

    Attributes
    ----------
    family : str
        Family name.
    params : dict
        Maximum-likelihood parameters by name.
    loglik : float
        Log-likelihood at the maximum (natural log).
    n : int
        Lengths fitted.
    n_censored : int
        Of which right-censored.
    """

    family: str
    params: dict[str, float]
    loglik: float
    n: int
    n_censored: int

    @property
    def dist(self) -> Any:
        """The continuous frozen distribution (tokens)."""
        return _family(self.family).frozen(self.params)

    @property
    def aic(self) -> float:
        """Akaike information criterion ``2 k - 2 loglik``."""
        return 2.0 * len(self.params) - 2.0 * self.loglik

    def cdf(self, tokens: Any) -> np.ndarray:
        """P(length <= tokens) for integer lengths (tokens)."""
        return self.dist.cdf(np.asarray(tokens, dtype=np.float64) + 0.5)

    def ppf(self, q: Any) -> np.ndarray:
        """Smallest integer length (tokens) whose :meth:`cdf` reaches ``q``."""
        x = self.dist.ppf(np.asarray(q, dtype=np.float64))
        return quantile_tokens(x)

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` integer lengths (tokens) drawn with ``numpy.random.default_rng(seed)``."""
        n = v.positive_int(n, "n")
        u = np.random.default_rng(seed).random(n)
        return round_tokens(self.dist.ppf(u))

    def __str__(self) -> str:
        pars = ", ".join(f"{k}={val:.4g}" for k, val in self.params.items())
        return (f"FittedLength({self.family}: {pars}; loglik={self.loglik:.6g}, aic={self.aic:.6g}, "
                f"n={self.n}, n_censored={self.n_censored})")


@dataclass(frozen=True)
class _Collapsed:
    """Unique (value, censored) pairs with counts: what the likelihood needs.

    The interval bounds of all values are one sorted grid ``edges``; each uncensored value ``k``
    spans ``edges[lo_idx] .. edges[lo_idx + 1]`` and each censoring point is ``edges[cens_idx]``.
    Edges at or below ``split`` are evaluated with the cdf, those above with the sf, so interval
    masses far in the tail keep their precision (``cdf(hi) - cdf(lo)`` would round to 0).
    """

    edges: np.ndarray    # sorted interval bounds (tokens)
    split: int           # edges[:split] use the cdf, edges[split:] the sf
    lo_idx: np.ndarray   # index of each uncensored value's lower bound in edges
    w: np.ndarray        # count of each uncensored value
    cens_idx: np.ndarray  # index of each censoring point c - 0.5 in edges
    cens_w: np.ndarray   # count of each censoring point
    upper_edge: float | None = None  # truncation: no mass above this length (tokens), or None


def _collapse(x: np.ndarray, censored: np.ndarray, upper_tokens: int | None = None) -> _Collapsed:
    k, w = np.unique(x[~censored], return_counts=True)
    c, cw = np.unique(x[censored], return_counts=True)
    lo = np.where(k == 1, 0.0, k - 0.5)
    edges = np.unique(np.concatenate([lo, k + 0.5, c - 0.5]))
    split = int(np.searchsorted(edges, np.median(x), side="right"))
    return _Collapsed(edges=edges, split=split, lo_idx=np.searchsorted(edges, lo),
                      w=w.astype(np.float64), cens_idx=np.searchsorted(edges, c - 0.5),
                      cens_w=cw.astype(np.float64), upper_edge=None if upper_tokens is None else upper_tokens + 0.5)


def _loglik(dist: Any, d: _Collapsed) -> float:
    """Weighted interval (and right-censored) log-likelihood of ``dist`` (natural log)."""
    cdf_part = dist.cdf(d.edges[:d.split])
    sf_part = dist.sf(d.edges[d.split:])
    # F at every edge from the lower part, S at every edge from the upper part; an interval
    # straddling the split mixes them as (1 - S(hi)) - F(lo) = S(lo)... written out below.
    F = np.concatenate([cdf_part, 1.0 - sf_part])
    S = np.concatenate([1.0 - cdf_part, sf_part])
    lo, hi = d.lo_idx, d.lo_idx + 1
    mass = np.where(lo >= d.split, S[lo] - S[hi], F[hi] - F[lo])
    total = float(np.dot(d.w, np.log(np.maximum(mass, _TINY))))
    if d.cens_w.size:
        total += float(np.dot(d.cens_w, np.log(np.maximum(S[d.cens_idx], _TINY))))
    if d.upper_edge is not None:
        total -= float(d.w.sum() + d.cens_w.sum()) * float(np.log(max(float(dist.cdf(d.upper_edge)), _TINY)))
    return total


def _moments(x: np.ndarray, w: np.ndarray | None = None) -> tuple[float, float, float, float]:
    """Starting moments (mean and sd of log x, mean and variance of x), weighted by ``w``."""
    x = x.astype(np.float64)
    w = np.ones_like(x) if w is None else w / w.sum() * x.size
    logs = np.log(x)
    m = float(np.average(logs, weights=w))
    s = max(float(np.sqrt(np.average((logs - m) ** 2, weights=w))), 1e-3)
    mean = float(np.average(x, weights=w))
    return m, s, mean, max(float(np.average((x - mean) ** 2, weights=w)), 1e-6)


def _fit_collapsed(fam: Family, d: _Collapsed, start: tuple[float, float, float, float]
                   ) -> tuple[dict[str, float], float]:
    theta0 = fam.to_theta(fam.initial(*start))
    n = float(d.w.sum() + d.cens_w.sum())

    def nll(theta: np.ndarray) -> float:
        try:
            with np.errstate(all="ignore"):
                val = -_loglik(fam.frozen(fam.from_theta(theta)), d) / n
        except ValueError:  # parameters out of range (a scale that underflowed to 0)
            return 1e10
        return val if np.isfinite(val) else 1e10

    # Nelder-Mead, not a gradient method: interval masses are differences of cdfs, so the
    # objective carries ~1e-10 rounding noise that spoils finite-difference gradients (L-BFGS-B
    # stops early on it); the simplex needs only function values.
    res = optimize.minimize(nll, theta0, method="Nelder-Mead",
                            options={"xatol": 1e-6, "fatol": 1e-10, "maxfev": 2000 * theta0.size})
    params = fam.from_theta(res.x)
    return dict(zip(fam.param_names, params)), -res.fun * n


def _check_sample(x: Any, censored: Any) -> tuple[np.ndarray, np.ndarray]:
    arr = lengths_array(x)
    if censored is None:
        cens = np.zeros(arr.size, dtype=bool)
    else:
        cens = np.asarray(censored)
        if cens.shape != arr.shape or cens.dtype != bool:
            raise ValueError(f"censored must be a bool array of the same shape as x {arr.shape}, "
                             f"got dtype {cens.dtype} shape {cens.shape}")
    n_unc = int((~cens).sum())
    if n_unc < MIN_FIT_SAMPLES:
        raise ValueError(f"fit needs at least {MIN_FIT_SAMPLES} uncensored lengths, got {n_unc}")
    if np.all(arr == arr[0]):
        raise ValueError(f"fit needs lengths that vary: all {arr.size} are {int(arr[0])} tokens")
    return arr, cens


def _check_upper(upper_tokens: Any, arr: np.ndarray) -> int | None:
    if upper_tokens is None:
        return None
    upper_tokens = v.positive_int(upper_tokens, "upper_tokens")
    if arr.max() > upper_tokens:
        raise ValueError(f"upper_tokens {upper_tokens} is below the longest length {int(arr.max())}: a truncated "
                         f"sample holds no length above it")
    return upper_tokens


def fit_family(x: Any, family: str, *, censored: Any = None, upper_tokens: int | None = None) -> FittedLength:
    """Maximum-likelihood fit of one family to integer lengths, with right-censoring.

    Parameters
    ----------
    x : array of int
        Lengths (tokens, >= 1). For a censored entry, the cap it hit.
    family : str
        A name in :data:`kvlab.lengths.families.FAMILIES`.
    censored : array of bool, optional
        True where the output hit its cap (true length >= x).
    upper_tokens : int, optional
        The sample was filtered to lengths <= this (truncation, tokens).

    Returns
    -------
    FittedLength
    """
    fam = _family(family)
    arr, cens = _check_sample(x, censored)
    upper_tokens = _check_upper(upper_tokens, arr)
    params, ll = _fit_collapsed(fam, _collapse(arr, cens, upper_tokens), _moments(arr))
    return FittedLength(family=family, params=params, loglik=ll, n=arr.size, n_censored=int(cens.sum()))


def fit_binned(upper_tokens: Any, counts: Any, families: Iterable[str] = DEFAULT_FAMILIES) -> FittedLength:
    """The lowest-AIC fit of ``families`` to lengths known only by histogram bucket.

    Bucket ``i`` counts lengths in ``(upper_tokens[i - 1], upper_tokens[i]]`` (the first from 0);
    a last bound of ``inf`` counts lengths above the one before it (right-censored there). The
    likelihood is the same weighted interval likelihood as :func:`fit`'s, over bucket intervals.

    Parameters
    ----------
    upper_tokens : array of float, increasing
        Upper bound of each bucket (tokens), e.g. Prometheus ``le`` values.
    counts : array of int
        Lengths in each bucket (not cumulative).
    """
    upper = np.asarray(upper_tokens, dtype=np.float64)
    w = np.asarray(counts, dtype=np.float64)
    if upper.ndim != 1 or upper.shape != w.shape or upper.size == 0 or np.any(np.diff(upper) <= 0) \
            or upper[0] <= 0 or np.any(~np.isfinite(upper[:-1])):
        raise ValueError("upper_tokens must be increasing positive bucket bounds (only the last may be inf), "
                         "one per count")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() < 2:
        raise ValueError(f"counts must be >= 0 and hold at least 2 lengths, got {w.sum():g}")
    censored = not np.isfinite(upper[-1])
    finite = upper[:-1] if censored else upper
    edges = np.concatenate([[0.0], finite])
    keep = w[:finite.size] > 0
    lo_idx = np.flatnonzero(keep)
    cens_w = w[-1:] if censored and w[-1] > 0 else np.zeros(0)
    mid = np.sqrt(np.maximum(edges[:-1], 0.5) * edges[1:])
    if cens_w.size:
        mid = np.append(mid, 2.0 * edges[-1])
    wm = w[:mid.size]
    kept = wm > 0
    median = float(mid[kept][np.searchsorted(np.cumsum(wm[kept]), wm.sum() / 2)])
    d = _Collapsed(edges=edges, split=int(np.searchsorted(edges, median, side="right")), lo_idx=lo_idx,
                   w=w[:finite.size][keep], cens_idx=np.full(cens_w.size, edges.size - 1, dtype=np.int64),
                   cens_w=cens_w)
    start = _moments(mid[kept], wm[kept])
    n, n_cens = int(round(w.sum())), int(round(cens_w.sum()))
    best: FittedLength | None = None
    for name in ([families] if isinstance(families, str) else families):
        params, ll = _fit_collapsed(_family(name), d, start)
        f = FittedLength(family=_family(name).name, params=params, loglik=ll, n=n, n_censored=n_cens)
        if best is None or f.aic < best.aic:
            best = f
    if best is None:
        raise ValueError("families must name at least one family")
    return best


def ks_statistic(fitted: FittedLength, x: np.ndarray, censored: np.ndarray) -> float:
    """Largest gap (fraction) between the empirical and fitted CDFs of integer lengths.

    Evaluated at the distinct uncensored values below the smallest censoring point, where the
    empirical CDF is exact whatever the censoring.
    """
    limit = x[censored].min() if censored.any() else np.inf
    k, counts = np.unique(x, return_counts=True)
    ecdf = np.cumsum(counts) / x.size
    keep = k < limit
    return float(np.max(np.abs(ecdf[keep] - fitted.cdf(k[keep]))))


def fit(x: Any, families: Iterable[str] = DEFAULT_FAMILIES, *, censored: Any = None,
        upper_tokens: int | None = None) -> pd.DataFrame:
    """Fit several families to integer lengths and rank them by AIC.

    Parameters
    ----------
    x : array of int
        Lengths (tokens, >= 1); for a censored entry, the cap it hit.
    families : iterable of str
        Family names (default: log-t, log-normal, gamma, Weibull, log-logistic, exponential).
    censored : array of bool, optional
        True where the output hit its cap; those enter the likelihood as right-censored.
    upper_tokens : int, optional
        The sample was filtered to lengths <= this (truncation, tokens).

    Returns
    -------
    DataFrame, one row per family, best (lowest AIC) first: ``family``, ``params`` (dict),
    ``num_params``, ``loglik``, ``aic``, ``delta_aic``, ``ks``, ``p50``/``p90``/``p99`` fitted
    (tokens), ``p50_emp``/``p90_emp``/``p99_emp`` empirical (tokens; censored values counted at
    their cap), and ``fitted`` (the :class:`FittedLength`).

    Raises
    ------
    ValueError
        Bad lengths or censored flags, fewer than 10 uncensored lengths, or all lengths equal.
    """
    arr, cens = _check_sample(x, censored)
    names = [_family(f).name for f in ([families] if isinstance(families, str) else families)]
    if not names:
        raise ValueError("families must name at least one family")
    d = _collapse(arr, cens, _check_upper(upper_tokens, arr))
    start = _moments(arr)
    emp = np.percentile(arr, [50, 90, 99])
    rows = []
    for name in names:
        params, ll = _fit_collapsed(_family(name), d, start)
        f = FittedLength(family=name, params=params, loglik=ll, n=arr.size, n_censored=int(cens.sum()))
        p50, p90, p99 = f.ppf([0.5, 0.9, 0.99])
        rows.append({"family": name, "params": params, "num_params": len(params), "loglik": ll,
                     "aic": f.aic, "ks": ks_statistic(f, arr, cens),
                     "p50": int(p50), "p90": int(p90), "p99": int(p99),
                     "p50_emp": emp[0], "p90_emp": emp[1], "p99_emp": emp[2], "fitted": f})
    table = pd.DataFrame(rows).sort_values("aic", kind="stable").reset_index(drop=True)
    table.insert(table.columns.get_loc("aic") + 1, "delta_aic", table["aic"] - table["aic"].iloc[0])
    return table
