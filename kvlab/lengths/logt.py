"""The log-t distribution: Student t on log length.

scipy.stats has no log-t (it has ``lognorm`` and ``t`` but not the composition), so it is written
here as a small frozen class with the same ``cdf``/``sf``/``ppf``/``logpdf`` surface as a frozen
scipy distribution. The uncertainty-aware length predictor of brief section 5 models output
length this way: ``log(length) = mu + sigma * T`` with ``T ~ t(nu)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from .. import _validate as v


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

    def _z(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return (np.log(np.asarray(x, dtype=np.float64)) - self.mu) / self.sigma

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        """P(X <= x) for lengths ``x`` (tokens); 0 for x <= 0."""
        return stats.t.cdf(self._z(x), self.nu)

    def sf(self, x: np.ndarray | float) -> np.ndarray:
        """P(X > x) for lengths ``x`` (tokens)."""
        return stats.t.sf(self._z(x), self.nu)

    def ppf(self, q: np.ndarray | float) -> np.ndarray:
        """Length (tokens) below which a fraction ``q`` of the mass lies."""
        return np.exp(self.mu + self.sigma * stats.t.ppf(q, self.nu))

    def logpdf(self, x: np.ndarray | float) -> np.ndarray:
        """Log density at lengths ``x`` (log of 1/tokens)."""
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return stats.t.logpdf(self._z(x), self.nu) - np.log(self.sigma) - np.log(x)

    def rvs(self, size: int, random_state: np.random.Generator) -> np.ndarray:
        """``size`` continuous draws (tokens) from ``random_state``."""
        return np.exp(self.mu + self.sigma * random_state.standard_t(self.nu, size=size))
