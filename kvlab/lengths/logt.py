"""The log-t distribution: Student t on log length, written once for all of kvlab.

scipy.stats has no log-t (it has ``lognorm`` and ``t`` but not the composition), so it is written
here: functions over arrays of per-request parameters (``mu``, ``sigma`` broadcast against the
lengths), used by the per-request predictive (:class:`kvlab.predict.LogTPredictive`) and its
regression fit, and :class:`LogT`, a frozen distribution with one ``(mu, sigma, nu)`` and the
``cdf``/``sf``/``ppf``/``logpdf`` surface of a frozen scipy distribution, used by the length fits.
The uncertainty-aware length predictor of brief section 5 models output length this way:
``log(length) = mu + sigma * T`` with ``T ~ t(nu)``.

Everything here is continuous (lengths in tokens as real numbers); integer token counts are
:func:`kvlab._intmath.round_tokens` of these lengths.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .. import _validate as v


def _special() -> ModuleType:
    """:mod:`scipy.special`, imported on first use.

    Every simulation imports this module (through the prediction-based policy), and importing
    SciPy costs more than simulating a small workload; only the log-t computations need it.
    """
    import scipy.special
    return scipy.special


def t_logpdf(z: Any, nu: float) -> np.ndarray:
    """Log density of the standard Student t with ``nu`` degrees of freedom at ``z``.

    ``-log(sqrt(nu) B(1/2, nu/2)) - (nu + 1)/2 log(1 + z^2 / nu)``; ``betaln`` keeps the
    normaliser accurate for large ``nu`` (where the t tends to the normal).
    """
    z = np.asarray(z, dtype=np.float64)
    return -_special().betaln(0.5, 0.5 * nu) - 0.5 * np.log(nu) - 0.5 * (nu + 1.0) * np.log1p(z * z / nu)


def standardize(tokens: Any, mu: Any, sigma: Any) -> np.ndarray:
    """``(log(tokens) - mu) / sigma``: lengths (tokens) on the standard t scale (-inf at 0)."""
    with np.errstate(divide="ignore"):
        return (np.log(np.asarray(tokens, dtype=np.float64)) - mu) / sigma


def cdf(tokens: Any, mu: Any, sigma: Any, nu: float) -> np.ndarray:
    """``P(X <= tokens)`` of ``X = exp(mu + sigma T)``, ``T ~ t(nu)``; 0 for tokens <= 0."""
    return _special().stdtr(nu, standardize(tokens, mu, sigma))


def sf(tokens: Any, mu: Any, sigma: Any, nu: float) -> np.ndarray:
    """``P(X > tokens)``, computed on the upper tail (no ``1 - cdf`` cancellation)."""
    return _special().stdtr(nu, -standardize(tokens, mu, sigma))


def ppf(q: Any, mu: Any, sigma: Any, nu: float) -> np.ndarray:
    """Length (tokens, continuous) below which a fraction ``q`` of the mass lies."""
    return np.exp(mu + sigma * _special().stdtrit(nu, q))


def logpdf(tokens: Any, mu: Any, sigma: Any, nu: float) -> np.ndarray:
    """Log density of the length at ``tokens`` (log of 1/tokens); -inf at 0."""
    x = np.asarray(tokens, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return t_logpdf(standardize(x, mu, sigma), nu) - np.log(sigma) - np.log(x)


def draw(rng: np.random.Generator, mu: Any, sigma: Any, nu: float, size: int) -> np.ndarray:
    """``size`` continuous lengths (tokens) ``exp(mu + sigma T)`` drawn from ``rng``."""
    return np.exp(mu + sigma * rng.standard_t(nu, size=size))


@dataclass(frozen=True, kw_only=True)
class LogT:
    """Log-t distribution of a length: ``log(x) = mu + sigma * T``, ``T ~ Student t(nu)``.

    Parameters
    ----------
    mu : float
        Location of ``log(x)`` (log tokens); ``exp(mu)`` is the median (tokens).
    sigma : float
        Scale of ``log(x)`` (> 0, log tokens).
    nu : float
        Degrees of freedom (> 0); ``nu -> inf`` is the log-normal.

    Examples
    --------
    >>> d = LogT(mu=np.log(21.0), sigma=1.0, nu=4.0)
    >>> round(float(d.ppf(0.5)), 6)
    21.0
    """

    mu: float
    sigma: float
    nu: float

    def __post_init__(self) -> None:
        if not np.isfinite(self.mu):
            raise ValueError(f"mu must be finite, got {self.mu!r}")
        v.positive_float(self.sigma, "sigma")
        v.positive_float(self.nu, "nu")

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        """P(X <= x) for lengths ``x`` (tokens); 0 for x <= 0."""
        return cdf(x, self.mu, self.sigma, self.nu)

    def sf(self, x: np.ndarray | float) -> np.ndarray:
        """P(X > x) for lengths ``x`` (tokens)."""
        return sf(x, self.mu, self.sigma, self.nu)

    def ppf(self, q: np.ndarray | float) -> np.ndarray:
        """Length (tokens) below which a fraction ``q`` of the mass lies."""
        return ppf(q, self.mu, self.sigma, self.nu)

    def logpdf(self, x: np.ndarray | float) -> np.ndarray:
        """Log density at lengths ``x`` (log of 1/tokens)."""
        return logpdf(x, self.mu, self.sigma, self.nu)

    def rvs(self, size: int, random_state: np.random.Generator) -> np.ndarray:
        """``size`` continuous draws (tokens) from ``random_state``."""
        return draw(random_state, self.mu, self.sigma, self.nu, size)


__all__ = ["LogT", "cdf", "draw", "logpdf", "ppf", "sf", "standardize", "t_logpdf"]
