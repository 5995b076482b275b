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
from scipy import stats

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

    def to_theta(self, params: tuple[float, ...]) -> np.ndarray:
        return np.array([np.log(p) if pos else p for p, pos in zip(params, self.positive)])

    def from_theta(self, theta: np.ndarray) -> tuple[float, ...]:
        return tuple(float(np.exp(t)) if pos else float(t) for t, pos in zip(theta, self.positive))

    def frozen(self, params: dict[str, float] | tuple[float, ...]) -> Any:
        """The frozen distribution for ``params`` (a dict by name or a tuple in order)."""
        if isinstance(params, dict):
            missing = [n for n in self.param_names if n not in params]
            if missing:
                raise ValueError(f"family {self.name!r} needs parameters {self.param_names}, "
                                 f"missing {missing}")
            params = tuple(params[n] for n in self.param_names)
        return self.build(*params)


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
)}

#: The families :func:`kvlab.lengths.fit` tries by default (the issue's list).
DEFAULT_FAMILIES = ("log-t", "log-normal", "gamma", "weibull", "log-logistic", "exponential")


def family(name: str) -> Family:
    """The :class:`Family` called ``name``, or ``ValueError`` listing the known ones."""
    return FAMILIES[v.choice(name, "family", FAMILIES)]
