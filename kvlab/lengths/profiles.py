"""Workload profiles: prompt and output length distributions calibrated to published percentiles.

A profile is a small YAML file in ``data/profiles/`` with a ``source:`` line, the target
percentiles of each marginal, the family calibrated to them and its fitted parameters.
:func:`calibrate` computes those parameters from the targets (least squares on log quantiles),
so a test can re-derive them and check that sampled percentiles hit the targets.

Sampling model (stated, not hidden): prompt and output lengths are independent; each is a
continuous draw rounded to the nearest integer and floored at 1 token. A marginal may be
truncated (``upper_tokens``: no mass above it, the quantiles are those of the truncated law) or
capped (``cap_tokens``: draws above it are clipped to it and flagged ``censored``, as a trace
with a generation cap records them). ``max_total_tokens`` truncates each output at
``max_total_tokens - prompt_tokens``, as a trace filtered to a context length is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
import pandas as pd
import yaml
from scipy import optimize, stats

from .. import _validate as v
from .._intmath import round_tokens
from .._paths import DATA_DIR
from .families import family as _family

PROFILE_DIR = DATA_DIR / "profiles"
#: Largest relative error of a calibrated quantile before :func:`calibrate` refuses the fit.
CALIBRATION_RTOL = 0.01


def _percent_key(key: Any) -> float:
    """``"p90"`` or ``90`` -> 0.9."""
    text = str(key).strip().lower().removeprefix("p")
    try:
        q = float(text) / 100.0
    except ValueError:
        raise ValueError(f"percentile key {key!r} is not of the form p50, p90, p99") from None
    if not 0.0 < q < 1.0:
        raise ValueError(f"percentile key {key!r} must lie strictly between p0 and p100")
    return q


def _quantiles(dist: Any, q: np.ndarray, upper_tokens: float | None) -> np.ndarray:
    """Quantiles (tokens) of ``dist`` truncated above at ``upper_tokens`` (None: untruncated)."""
    if upper_tokens is None:
        return dist.ppf(q)
    return dist.ppf(q * dist.cdf(upper_tokens))


def calibrate(targets: Mapping[Any, float], family: str = "gen-gamma", *,
              upper_tokens: float | None = None) -> dict[str, float]:
    """Parameters of ``family`` whose percentiles equal ``targets``.

    Parameters
    ----------
    targets : mapping
        Percentile (``"p50"``, ``"p90"``, ... or 50, 90) -> length at that percentile (tokens).
        At least as many targets as the family has parameters for an exact match; more are
        fitted in the least-squares sense.
    family : str
        A name in :data:`kvlab.lengths.families.FAMILIES` (default the three-parameter
        generalised gamma, which can match any p50 < p90 < p99).
    upper_tokens : float, optional
        Truncate the distribution above this length (tokens); targets are then quantiles of
        the truncated law.

    Returns
    -------
    dict
        Parameter name -> value.

    Raises
    ------
    ValueError
        Bad targets, or no parameters reproduce every target within 1% (the family's shape
        cannot match them).

    Examples
    --------
    >>> p = calibrate({"p50": 100, "p90": 400}, "log-normal")
    >>> round(float(np.exp(p["mu"])), 6)
    100.0
    """
    fam = _family(family)
    if len(targets) < 2:
        raise ValueError(f"targets needs at least two percentiles, got {dict(targets)!r}")
    q = np.array([_percent_key(k) for k in targets])
    x = np.array([v.positive_float(val, f"targets[{k!r}]") for k, val in targets.items()])
    order = np.argsort(q)
    q, x = q[order], x[order]
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"targets must increase with the percentile, got {dict(targets)!r}")
    if upper_tokens is not None and upper_tokens <= x[-1]:
        raise ValueError(f"upper_tokens {upper_tokens} must exceed the largest target {x[-1]}")
    log_x = np.log(x)

    def residuals(theta: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            r = np.log(_quantiles(fam.frozen(fam.from_theta(theta)), q, upper_tokens)) - log_x
        return np.where(np.isfinite(r), r, 1e3)

    # Start from moment-style guesses of a log-normal through the extreme targets, then each
    # signed parameter with its sign flipped (gen-gamma's c < 0 gives tails heavier than the
    # log-normal's), then each positive one scaled by e^-1 and e: a 3-parameter least-squares
    # surface has local minima, and a start that cannot converge is cut off at 50 evaluations
    # per parameter.
    i50 = int(np.argmin(np.abs(q - 0.5)))
    m = log_x[i50]
    s = max((log_x[-1] - log_x[0]) / (stats.norm.ppf(q[-1]) - stats.norm.ppf(q[0])), 1e-3)
    mean, var = np.exp(m + s * s / 2), np.exp(2 * m + s * s) * (np.exp(s * s) - 1)
    base = fam.to_theta(fam.initial(m, s, mean, var))
    eye = np.eye(base.size)
    starts = [base]
    starts += [base * (1 - 2 * eye[i]) for i, pos in enumerate(fam.positive) if not pos]
    starts += [base + d * eye[i] for i, pos in enumerate(fam.positive) if pos for d in (-1.0, 1.0)]
    best = None
    for theta0 in starts:
        res = optimize.least_squares(residuals, theta0, method="trf", max_nfev=50 * theta0.size)
        if best is None or res.cost < best.cost:
            best = res
        if best.cost < 1e-16:  # exact to ~1e-8 in log quantile: no better start exists
            break
    params = fam.from_theta(best.x)
    got = _quantiles(fam.frozen(params), q, upper_tokens)
    rel = np.abs(got / x - 1.0)
    if not np.all(rel <= CALIBRATION_RTOL):
        raise ValueError(f"family {family!r} cannot match targets {dict(targets)!r}: best quantiles "
                         f"{np.round(got, 1).tolist()} (worst relative error {rel.max():.1%})")
    return dict(zip(fam.param_names, params))


@dataclass(frozen=True, kw_only=True)
class Marginal:
    """One length distribution of a profile (prompt or output).

    Parameters
    ----------
    family : str
        Family name (see :mod:`kvlab.lengths.families`).
    params : dict
        Fitted parameters by name.
    targets : dict
        The percentiles the parameters were calibrated to (``"p50"`` -> tokens).
    source : str
        Where the targets come from, or that they are an assumption.
    upper_tokens : int, optional
        Truncation: no draw above this length (tokens).
    cap_tokens : int, optional
        Cap: draws above it are clipped to it and flagged censored (tokens).
    """

    family: str
    params: dict[str, float]
    targets: dict[str, float]
    source: str
    upper_tokens: int | None = None
    cap_tokens: int | None = None

    @property
    def dist(self) -> Any:
        """The frozen continuous distribution (lengths in tokens)."""
        return _family(self.family).frozen(self.params)

    def draw(self, u: np.ndarray, upper_tokens: np.ndarray | float | None = None) -> np.ndarray:
        """Integer lengths (tokens, >= 1) from uniforms ``u`` by inverse CDF.

        ``upper_tokens`` (per draw or scalar) overrides the marginal's own truncation.
        """
        upper = self.upper_tokens if upper_tokens is None else upper_tokens
        x = _quantiles(self.dist, u, upper)
        tokens = round_tokens(x)
        if upper is not None:
            tokens = np.minimum(tokens, np.floor(upper)).astype(np.int64)
        return tokens


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A workload: prompt and output length distributions and where they come from.

    Use :meth:`sample` to draw requests; see the module docstring for the sampling model.
    """

    name: str
    source: str
    prompt: Marginal
    output: Marginal
    max_total_tokens: int | None = None
    note: str = field(default="")

    def sample(self, n: int, seed: int = 0) -> pd.DataFrame:
        """Draw ``n`` requests on the host with ``numpy.random.default_rng(seed)``.

        Returns
        -------
        DataFrame with int64 ``prompt_tokens`` and ``output_tokens`` (>= 1) and bool
        ``censored`` (output clipped at the profile's ``cap_tokens``).

        Examples
        --------
        >>> df = profile("brief-sharegpt").sample(5, seed=0)
        >>> list(df.columns), str(df.output_tokens.dtype)
        (['prompt_tokens', 'output_tokens', 'censored'], 'int64')
        """
        n = v.positive_int(n, "n")
        rng = np.random.default_rng(seed)
        u = rng.random((2, n))
        prompt = self.prompt.draw(u[0])
        upper = None if self.max_total_tokens is None else self.max_total_tokens - prompt
        output = self.output.draw(u[1], upper)
        cap = self.output.cap_tokens
        censored = np.zeros(n, dtype=bool) if cap is None else output >= cap
        if cap is not None:
            output = np.minimum(output, cap)
        return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output, "censored": censored})


def _marginal(raw: Mapping[str, Any], where: str) -> Marginal:
    need = ("family", "params", "targets", "source")
    missing = [k for k in need if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing keys {missing} (expected {list(need)})")
    return Marginal(family=raw["family"], params={k: float(x) for k, x in raw["params"].items()},
                    targets={str(k): float(x) for k, x in raw["targets"].items()},
                    source=str(raw["source"]), upper_tokens=raw.get("upper_tokens"),
                    cap_tokens=raw.get("cap_tokens"))


def list_profiles() -> list[str]:
    """Names of the shipped profiles (files ``data/profiles/<name>.yaml``)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


@lru_cache(maxsize=None)
def profile(name: str) -> Profile:
    """The shipped workload profile ``name`` (see :func:`list_profiles`).

    Examples
    --------
    >>> profile("azure-2023-code").output.targets["p50"]
    13.0
    """
    v.choice(name, "profile", list_profiles())
    path = PROFILE_DIR / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    for key in ("source", "prompt", "output"):
        if key not in raw:
            raise ValueError(f"profile file {path}: missing key {key!r}")
    return Profile(name=name, source=str(raw["source"]), note=str(raw.get("note", "")),
                   prompt=_marginal(raw["prompt"], f"{path} prompt"),
                   output=_marginal(raw["output"], f"{path} output"),
                   max_total_tokens=raw.get("max_total_tokens"))
