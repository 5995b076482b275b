"""Workload profiles: prompt and output length distributions, from published figures or traces.

A profile is a small YAML file in ``data/profiles/`` with a ``source:`` line and, per marginal,
its family, parameters and how they were obtained (``method``):

* ``calibrated``: :func:`calibrate` matches published percentiles (least squares on log
  quantiles), so a test can re-derive the parameters from the file's ``targets``;
* ``fitted``: maximum likelihood on a real trace (:func:`kvlab.lengths.profile_fit.fit_profile`),
  the trace's own percentiles kept as ``targets`` and the fit's record under ``fit``;
* ``mean-matched``: a stated shape with its location solved so the sampled mean equals a
  published mean (``mean_tokens``), for sources that publish only means.

Sampling model (stated, not hidden): each length is a continuous draw rounded to the nearest
integer and floored at 1 token. Prompt and output are independent unless ``copula_rho`` is set:
then their uniforms come from a Gaussian copula with that correlation of normal scores (fitted
to a trace's ranks). A marginal may be truncated (``upper_tokens``: no mass above it, the
quantiles are those of the truncated law) or capped (``cap_tokens``: draws above it are clipped
to it; a capped output is flagged ``censored``, as a trace with a generation cap records it).
``max_total_tokens`` drops every request whose prompt + output exceeds it and draws it again,
as a trace filtered to a context length was made (rejection: the pairs that pass keep the
copula's dependence).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from .. import _validate as v
from .._intmath import round_tokens
from .._paths import DATA_DIR
from .families import family as _family

PROFILE_DIR = DATA_DIR / "profiles"
#: Largest relative error of a calibrated quantile before :func:`calibrate` refuses the fit.
CALIBRATION_RTOL = 0.01
#: How a marginal's parameters were obtained (see the module docstring).
METHODS = ("calibrated", "fitted", "mean-matched")
#: Rounds of redrawing requests over ``max_total_tokens`` before :meth:`Profile.sample` gives up.
_MAX_REDRAWS = 100


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
        Percentiles (``"p50"`` -> tokens): those calibrated to (``calibrated``), or the trace's
        own (``fitted``); may be empty for ``mean-matched``.
    source : str
        Where the targets come from, or that they are an assumption.
    upper_tokens : int, optional
        Truncation: no draw above this length (tokens).
    cap_tokens : int, optional
        Cap: draws above it are clipped to it (tokens); a capped output is flagged censored.
    method : {"calibrated", "fitted", "mean-matched"}
        How ``params`` were obtained.
    mean_tokens : float, optional
        The published mean matched (``mean-matched``) or the trace's mean (``fitted``), tokens.
    fit : dict
        The fit's record (``fitted``): trace rows, censored rows, log-likelihood, the candidate
        families' percentile errors, the profile's own sampled percentiles.
    """

    family: str
    params: dict[str, float]
    targets: dict[str, float]
    source: str
    upper_tokens: int | None = None
    cap_tokens: int | None = None
    method: str = "calibrated"
    mean_tokens: float | None = None
    fit: dict[str, Any] = field(default_factory=dict)

    @property
    def dist(self) -> Any:
        """The frozen continuous distribution (lengths in tokens)."""
        return _family(self.family).frozen(self.params)

    def draw(self, u: np.ndarray) -> np.ndarray:
        """Integer lengths (tokens, >= 1) from uniforms ``u`` by inverse CDF of the truncated law,
        clipped at ``cap_tokens``."""
        tokens = round_tokens(_quantiles(self.dist, u, self.upper_tokens))
        if self.upper_tokens is not None:
            tokens = np.minimum(tokens, self.upper_tokens)
        if self.cap_tokens is not None:
            tokens = np.minimum(tokens, self.cap_tokens)
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
    copula_rho: float = 0.0
    trace: str = ""

    def _draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) pairs from the marginals joined by the copula (no total filter)."""
        if self.copula_rho == 0.0:
            u = rng.random((2, n))
        else:  # Gaussian copula: correlated normal scores, mapped to uniforms
            z = rng.standard_normal((2, n))
            z[1] = self.copula_rho * z[0] + np.sqrt(1.0 - self.copula_rho ** 2) * z[1]
            u = special.ndtr(z)
        return self.prompt.draw(u[0]), self.output.draw(u[1])

    def sample(self, n: int, seed: int = 0) -> pd.DataFrame:
        """Draw ``n`` requests on the host with ``numpy.random.default_rng(seed)``.

        Returns
        -------
        DataFrame with int64 ``prompt_tokens`` and ``output_tokens`` (>= 1) and bool
        ``censored`` (output clipped at the profile's ``cap_tokens``).

        Examples
        --------
        >>> df = profile("seed-figures").sample(5, seed=0)
        >>> list(df.columns), str(df.output_tokens.dtype)
        (['prompt_tokens', 'output_tokens', 'censored'], 'int64')
        """
        n = v.positive_int(n, "n", maximum=v.MAX_REQUESTS)  # bounded before the draw allocates
        rng = np.random.default_rng(v.nonnegative_int(seed, "seed"))
        prompt, output = self._draw(rng, n)
        if self.max_total_tokens is not None:  # a trace filtered to a context: redraw the requests over it
            for _ in range(_MAX_REDRAWS):
                over = np.flatnonzero(prompt + output > self.max_total_tokens)
                if over.size == 0:
                    break
                prompt[over], output[over] = self._draw(rng, over.size)
            else:
                raise ValueError(f"profile {self.name}: requests keep exceeding max_total_tokens "
                                 f"{self.max_total_tokens} after {_MAX_REDRAWS} redraws")
        cap = self.output.cap_tokens
        censored = np.zeros(n, dtype=bool) if cap is None else output >= cap
        return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output, "censored": censored})


def _marginal(raw: Mapping[str, Any], where: str) -> Marginal:
    need = ("family", "params", "source")
    missing = [k for k in need if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing keys {missing} (expected {list(need)})")
    method = raw.get("method", "calibrated")
    if method not in METHODS:
        raise ValueError(f"{where}: method {method!r} is unknown: expected one of {', '.join(METHODS)}")
    if method != "mean-matched" and not raw.get("targets"):
        raise ValueError(f"{where}: a {method} marginal needs its percentile targets")
    mean = raw.get("mean_tokens")
    return Marginal(family=raw["family"], params={k: float(x) for k, x in raw["params"].items()},
                    targets={str(k): float(x) for k, x in (raw.get("targets") or {}).items()},
                    source=str(raw["source"]), upper_tokens=raw.get("upper_tokens"),
                    cap_tokens=raw.get("cap_tokens"), method=method,
                    mean_tokens=None if mean is None else float(mean), fit=dict(raw.get("fit") or {}))


def list_profiles() -> list[str]:
    """Names of the shipped profiles (files ``data/profiles/<name>.yaml``)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def read_profile(path: str | Path, name: str | None = None) -> Profile:
    """A profile from a YAML file in the layout of ``data/profiles/*.yaml`` (e.g. one written by
    :func:`kvlab.lengths.profile_fit.profile_yaml`); ``name`` defaults to the file's stem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"profile file {path} does not exist")
    raw = v.yaml_data(v.read_text_file(path, "profile file", max_bytes=1 << 20), f"profile file {path}")
    if not isinstance(raw, dict):
        raise ValueError(f"profile file {path}: expected a mapping at the top level")
    for key in ("source", "prompt", "output"):
        if key not in raw:
            raise ValueError(f"profile file {path}: missing key {key!r}")
    rho = raw.get("copula_rho", 0.0)
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not -1.0 < rho < 1.0:
        raise ValueError(f"profile file {path}: copula_rho must lie in (-1, 1), got {rho}")
    return Profile(name=name or path.stem, source=str(raw["source"]), note=str(raw.get("note", "")),
                   prompt=_marginal(raw["prompt"], f"{path} prompt"),
                   output=_marginal(raw["output"], f"{path} output"),
                   max_total_tokens=raw.get("max_total_tokens"), copula_rho=rho, trace=str(raw.get("trace", "")))


@cache
def profile(name: str) -> Profile:
    """The shipped workload profile ``name`` (see :func:`list_profiles`).

    Examples
    --------
    >>> profile("vllm-sharegpt").prompt.mean_tokens
    161.0
    """
    v.choice(name, "profile", list_profiles())
    return read_profile(PROFILE_DIR / f"{name}.yaml", name)
