"""Length-distribution families kvlab fits and samples, keyed by name.

Each family maps a parameter vector to a frozen distribution with ``cdf``/``sf``/``ppf``: scipy.stats
frozen distributions for everything scipy has, :class:`~kvlab.lengths.logt.LogT` for the log-t.
All are supported on lengths > 0 (location fixed at 0). Fitting works on an unconstrained vector
``theta`` (log of every positive parameter), so the optimiser needs no bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import special, stats

from .. import _validate as v
from .logt import LogT

#: sd of log(X) for a Weibull with shape 1 is pi / sqrt(6); for a log-logistic, pi / sqrt(3).
_SD_LOG_WEIBULL = np.pi / np.sqrt(6.0)
_SD_LOG_LOGLOGISTIC = np.pi / np.sqrt(3.0)
_EULER_GAMMA = 0.5772156649015329


@dataclass(frozen=True, kw_only=True)
class Family:
    """One distribution family: names of its parameters and how to build it.

    ``build(params)`` takes natural parameters in ``param_names`` order; ``to_theta`` /
    ``from_theta`` map them to and from the unconstrained optimiser vector; ``initial(log_mean,
    log_sd, mean_tokens, var_tokens)`` gives a moment-based starting point.
    """

    name: str
    param_names: tuple[str, ...]
    build: Callable[..., Any]
    positive: tuple[bool, ...]
    initial: Callable[[float, float, float, float], tuple[float, ...]]
    #: Parameters confined to (0, 1) (mixture weights), mapped to the optimiser by their logit.
    unit: tuple[bool, ...] = ()

    def _kind(self, i: int) -> str:
        return "unit" if self.unit and self.unit[i] else ("positive" if self.positive[i] else "free")

    def to_theta(self, params: tuple[float, ...]) -> np.ndarray:
        fwd = {"unit": special.logit, "positive": np.log, "free": float}
        return np.array([fwd[self._kind(i)](p) for i, p in enumerate(params)], dtype=np.float64)

    def from_theta(self, theta: np.ndarray) -> tuple[float, ...]:
        back = {"unit": special.expit, "positive": np.exp, "free": float}
        return tuple(float(back[self._kind(i)](t)) for i, t in enumerate(theta))

    def frozen(self, params: dict[str, float] | tuple[float, ...]) -> Any:
        """The frozen distribution for ``params`` (a dict by name or a tuple in order)."""
        if isinstance(params, dict):
            missing = [n for n in self.param_names if n not in params]
            if missing:
                raise ValueError(f"family {self.name!r} needs parameters {self.param_names}, "
                                 f"missing {missing}")
            params = tuple(params[n] for n in self.param_names)
        return self.build(*params)


class LogNormalMix2:
    """Two-component log-normal mixture: ``log X`` is ``N(mu1, sigma1)`` with probability
    ``1 - weight2`` and ``N(mu2, sigma2)`` with probability ``weight2`` (lengths in tokens).

    A frozen distribution with the ``cdf``/``sf``/``ppf`` surface kvlab's fits and profiles use.
    ``ppf`` inverts the cdf on a grid of log lengths and refines with two Newton steps.
    """

    def __init__(self, mu1: float, sigma1: float, mu2: float, sigma2: float, weight2: float) -> None:
        self.mu = np.array([mu1, mu2], dtype=np.float64)
        self.sigma = np.array([sigma1, sigma2], dtype=np.float64)
        self.weight = np.array([1.0 - weight2, weight2], dtype=np.float64)
        if np.any(self.sigma <= 0) or not 0.0 < weight2 < 1.0:
            raise ValueError(f"log-normal-mix2 needs sigma1, sigma2 > 0 and 0 < weight2 < 1, got "
                             f"sigma {self.sigma.tolist()}, weight2 {weight2}")

    def _z(self, x: Any) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return (np.log(np.asarray(x, dtype=np.float64))[..., None] - self.mu) / self.sigma

    def cdf(self, x: Any) -> np.ndarray:
        return special.ndtr(self._z(x)) @ self.weight

    def sf(self, x: Any) -> np.ndarray:
        return special.ndtr(-self._z(x)) @ self.weight

    def pdf(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        dens = np.exp(-0.5 * self._z(x) ** 2) / (self.sigma * np.sqrt(2 * np.pi))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(x > 0, (dens @ self.weight) / x, 0.0)

    def ppf(self, q: Any) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        lo = float(np.min(self.mu - 12 * self.sigma))
        hi = float(np.max(self.mu + 12 * self.sigma))
        grid = np.linspace(lo, hi, 8193)
        log_x = np.interp(q, self.cdf(np.exp(grid)), grid)
        for _ in range(2):  # Newton on log x: F(e^y) - q = 0, dF/dy = x f(x)
            x = np.exp(log_x)
            step = (self.cdf(x) - q) / np.maximum(x * self.pdf(x), 1e-300)
            log_x = np.clip(log_x - step, lo, hi)
        out = np.exp(log_x)
        return np.where(q <= 0, 0.0, np.where(q >= 1, np.inf, out))

    def mean(self) -> float:
        return float(self.weight @ np.exp(self.mu + self.sigma ** 2 / 2))


def _weibull_init(m: float, s: float, mean: float, var: float) -> tuple[float, ...]:
    c = _SD_LOG_WEIBULL / s
    return c, float(np.exp(m + _EULER_GAMMA / c))


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(name="log-t", param_names=("mu", "sigma", "nu"), positive=(False, True, True),
           build=lambda mu, sigma, nu: LogT(mu=mu, sigma=sigma, nu=nu),
           initial=lambda m, s, mean, var: (m, s, 5.0)),
    Family(name="log-normal", param_names=("mu", "sigma"), positive=(False, True),
           build=lambda mu, sigma: stats.lognorm(sigma, scale=np.exp(mu)),
           initial=lambda m, s, mean, var: (m, s)),
    Family(name="gamma", param_names=("shape", "scale_tokens"), positive=(True, True),
           build=lambda shape, scale: stats.gamma(shape, scale=scale),
           initial=lambda m, s, mean, var: (mean * mean / var, var / mean)),
    Family(name="weibull", param_names=("shape", "scale_tokens"), positive=(True, True),
           build=lambda shape, scale: stats.weibull_min(shape, scale=scale),
           initial=_weibull_init),
    Family(name="log-logistic", param_names=("shape", "scale_tokens"), positive=(True, True),
           build=lambda shape, scale: stats.fisk(shape, scale=scale),
           initial=lambda m, s, mean, var: (_SD_LOG_LOGLOGISTIC / s, float(np.exp(m)))),
    Family(name="exponential", param_names=("scale_tokens",), positive=(True,),
           build=lambda scale: stats.expon(scale=scale),
           initial=lambda m, s, mean, var: (mean,)),
    # Generalised gamma (scipy ``gengamma``, c signed): three parameters, so it can match three
    # percentiles whatever the tail shape; the profiles are calibrated with it.
    Family(name="gen-gamma", param_names=("a", "c", "scale_tokens"), positive=(True, False, True),
           build=lambda a, c, scale: stats.gengamma(a, c, scale=scale),
           initial=lambda m, s, mean, var: (1.0,) + _weibull_init(m, s, mean, var)),
    # Two log-normals: bimodal or kinked length laws (real traces mix short and long requests);
    # the start puts the components at the quartiles of log length.
    Family(name="log-normal-mix2", param_names=("mu1", "sigma1", "mu2", "sigma2", "weight2"),
           positive=(False, True, False, True, False), unit=(False, False, False, False, True),
           build=LogNormalMix2,
           initial=lambda m, s, mean, var: (m - 0.674 * s, s / 2, m + 0.674 * s, s / 2, 0.5)),
)}

#: The families :func:`kvlab.lengths.fit` tries by default (the issue's list).
DEFAULT_FAMILIES = ("log-t", "log-normal", "gamma", "weibull", "log-logistic", "exponential")


def family(name: str) -> Family:
    """The :class:`Family` called ``name``, or ``ValueError`` listing the known ones."""
    return FAMILIES[v.choice(name, "family", FAMILIES)]
