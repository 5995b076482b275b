"""Log-t regression: each request's output length is ``exp(mu + sigma T_nu)`` with ``mu`` and
``log sigma`` linear in its features (prompt tokens, log prompt tokens, named trace columns).

Fitted by maximum likelihood with :func:`scipy.optimize.minimize` (L-BFGS-B, analytic gradient
in the coefficients, a finite difference in ``log nu``). Output counts are integers >= 1, so an
uncensored count ``k`` contributes ``log P(k - 0.5 <= X < k + 0.5)`` (``log P(X < 1.5)`` for
``k = 1``, the count of every draw under 1.5, as in :class:`LogTPredictive`); an output that hit
``max_new_tokens`` (``censored``) only says the true length is at least its count ``c``, and
contributes the survival term ``log P(X >= c - 0.5)``, as the lengths module fits marginals.
The features are standardised inside the fit for conditioning; coefficients are reported on the
original scale, with standard errors from the inverse Hessian of the negative log-likelihood.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import optimize, special

from .. import _validate as v
from ..lengths import logt
from .distribution import LogTPredictive

#: Features every predictor uses, in this order after the intercept.
BASE_FEATURES = ("prompt_tokens", "log_prompt_tokens")
#: Range of nu when it is fitted (1/nu -> 0 is the log-normal limit).
NU_BOUNDS = (0.5, 200.0)


@dataclass(frozen=True, kw_only=True)
class LogTRegression:
    """A fitted log-t regression of output length on request features.

    Parameters
    ----------
    feature_names : tuple of str
        ``("intercept", "prompt_tokens", "log_prompt_tokens", *extra_features)``.
    extra_features : tuple of str
        The trace columns used beyond the base features.
    mu_coef, log_sigma_coef : ndarray of float64, shape (p,)
        Coefficients of ``mu`` and ``log sigma`` (log tokens per feature unit), original scale.
    mu_stderr, log_sigma_stderr : ndarray of float64, shape (p,)
        Their standard errors (NaN when the Hessian is not positive definite).
    nu : float
        Degrees of freedom of the t on log length.
    nu_stderr : float
        Standard error of ``nu`` (NaN when ``nu`` was fixed).
    nu_fixed : bool
        Whether ``nu`` was given rather than fitted.
    nll : float
        Negative log-likelihood at the optimum (nats).
    num_requests, num_censored : int
        Rows fitted, and how many of them were right-censored.
    converged : bool
        The optimiser's success flag.
    """

    feature_names: tuple[str, ...]
    extra_features: tuple[str, ...]
    mu_coef: np.ndarray
    log_sigma_coef: np.ndarray
    mu_stderr: np.ndarray
    log_sigma_stderr: np.ndarray
    nu: float
    nu_stderr: float
    nu_fixed: bool
    nll: float
    num_requests: int
    num_censored: int
    converged: bool

    def predict(self, trace: pd.DataFrame) -> LogTPredictive:
        """Per-request predictive distributions for the rows of ``trace``.

        ``trace`` needs ``prompt_tokens`` and the fit's extra feature columns (not outputs).
        """
        x = design_matrix(trace, self.extra_features)
        mu = x @ self.mu_coef
        sigma = np.exp(x @ self.log_sigma_coef)
        return LogTPredictive(mu=mu, sigma=sigma, nu=self.nu)

    def coef_table(self) -> pd.DataFrame:
        """Coefficients and standard errors, one row per (parameter, feature)."""
        rows = [("mu", f, c, s) for f, c, s in zip(self.feature_names, self.mu_coef, self.mu_stderr)]
        rows += [("log_sigma", f, c, s) for f, c, s in
                 zip(self.feature_names, self.log_sigma_coef, self.log_sigma_stderr)]
        rows.append(("nu", "", self.nu, self.nu_stderr))
        return pd.DataFrame(rows, columns=["parameter", "feature", "estimate", "stderr"])

    def __str__(self) -> str:
        head = (f"LogTRegression: {self.num_requests} requests ({self.num_censored} censored), "
                f"nu {'fixed' if self.nu_fixed else 'fitted'}, nll {self.nll:.1f} nats, "
                f"{'converged' if self.converged else 'NOT converged'}")
        return head + "\n" + self.coef_table().to_string(index=False)


def _finite_column(trace: pd.DataFrame, name: str) -> np.ndarray:
    col = trace[name]
    if not (pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)):
        raise ValueError(f"feature column {name!r} must be numeric, got dtype {col.dtype}")
    arr = col.to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"feature column {name!r} must be finite; row {trace.index[bad[0]]!r} "
                         f"holds {col.iloc[bad[0]]!r}")
    return arr


def design_matrix(trace: pd.DataFrame, extra_features: Sequence[str] = ()) -> np.ndarray:
    """Feature matrix ``[1, prompt_tokens, log(prompt_tokens), *extra_features]`` of ``trace``.

    Parameters
    ----------
    trace : DataFrame
        One row per request, with ``prompt_tokens`` (tokens, >= 1) and the ``extra_features``
        columns (numeric, finite).
    extra_features : sequence of str
        Further trace columns to use as features.

    Returns
    -------
    ndarray of float64, shape (n, 3 + len(extra_features))

    Raises
    ------
    ValueError
        Naming every missing column, or the first bad row of a column.
    """
    if isinstance(extra_features, str):
        raise ValueError(f"extra_features must be a sequence of column names, got the string "
                         f"{extra_features!r}")
    extra = tuple(extra_features)
    clash = [f for f in extra if f in BASE_FEATURES or f in ("intercept", "output_tokens", "censored")]
    if clash or len(set(extra)) != len(extra):
        raise ValueError(f"extra_features must be distinct columns other than the base features, "
                         f"output_tokens and censored; got {list(extra)}")
    v.require_columns(trace, ("prompt_tokens", *extra), "trace", needed_by="the length predictor")
    if len(trace) == 0:
        raise ValueError("trace has no rows")
    prompt = _finite_column(trace, "prompt_tokens")
    bad = np.flatnonzero((prompt < 1) | (prompt != np.floor(prompt)))
    if bad.size:
        raise ValueError(f"prompt_tokens must be integers >= 1; row {trace.index[bad[0]]!r} "
                         f"holds {trace['prompt_tokens'].iloc[bad[0]]!r}")
    cols = [np.ones(len(trace)), prompt, np.log(prompt)] + [_finite_column(trace, f) for f in extra]
    return np.column_stack(cols)


def _outputs(trace: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    v.require_columns(trace, ("output_tokens",), "trace", needed_by="fitting the length predictor")
    k = v.positive_int_array(trace["output_tokens"].to_numpy(), "output_tokens")
    if "censored" not in trace.columns:
        return k, np.zeros(k.size, dtype=bool)
    cens = trace["censored"]
    if not (pd.api.types.is_bool_dtype(cens) or cens.isin([0, 1]).all()):
        raise ValueError(f"column 'censored' must be boolean (True where the output hit "
                         f"max_new_tokens), got values {sorted(set(cens.tolist()))[:5]!r}")
    return k, cens.to_numpy().astype(bool)


class _Likelihood:
    """Interval-censored log-t negative log-likelihood over standardised features ``z``."""

    def __init__(self, z: np.ndarray, k: np.ndarray, censored: np.ndarray, nu_fixed: float | None):
        self.z, self.nu_fixed, self.p = z, nu_fixed, z.shape[1]
        self.log_lo = np.log(np.maximum(k, 2) - 0.5)
        self.log_lo[k <= 1] = -np.inf       # K = 1 collects every draw under 1.5
        self.log_hi = np.where(censored, np.inf, np.log(k + 0.5))

    def split(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        p = self.p
        nu = self.nu_fixed if self.nu_fixed is not None else float(np.exp(theta[2 * p]))
        return theta[:p], theta[p:2 * p], nu

    def _terms(self, theta: np.ndarray, nu: float):
        beta, gamma, _ = self.split(theta)
        mu, s = self.z @ beta, np.exp(self.z @ gamma)
        a, b = (self.log_lo - mu) / s, (self.log_hi - mu) / s
        upper = a > 0   # both ends in the upper tail: difference of survivals keeps precision
        prob = np.where(upper, special.stdtr(nu, -a) - special.stdtr(nu, -b),
                        special.stdtr(nu, b) - special.stdtr(nu, a))
        return prob, a, b, s

    def nll(self, theta: np.ndarray, nu: float | None = None) -> float:
        prob, *_ = self._terms(theta, self.split(theta)[2] if nu is None else nu)
        return float(-np.sum(np.log(np.maximum(prob, 1e-300))))

    def value_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        _, _, nu = self.split(theta)
        prob, a, b, s = self._terms(theta, nu)
        prob = np.maximum(prob, 1e-300)

        def pdf_and_zpdf(x):
            fin = np.isfinite(x)
            xf = np.where(fin, x, 0.0)
            f = np.where(fin, np.exp(logt.t_logpdf(xf, nu)), 0.0)
            return f, f * xf

        fa, afa = pdf_and_zpdf(a)
        fb, bfb = pdf_and_zpdf(b)
        d_mu = (fa - fb) / s / prob            # d log P / d mu
        d_ls = (afa - bfb) / prob              # d log P / d log sigma
        value = float(-np.sum(np.log(prob)))
        grad = [-(self.z.T @ d_mu), -(self.z.T @ d_ls)]
        if self.nu_fixed is None:
            h = 1e-6
            bumped = theta.copy()
            bumped[2 * self.p] += h
            grad.append(np.array([(self.nll(bumped) - value) / h]))
        return value, np.concatenate(grad)


def _hessian(lik: _Likelihood, theta: np.ndarray) -> np.ndarray:
    step = 1e-4 * np.maximum(1.0, np.abs(theta))
    cols = []
    for j in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up[j] += step[j]
        down[j] -= step[j]
        cols.append((lik.value_and_grad(up)[1] - lik.value_and_grad(down)[1]) / (2 * step[j]))
    hess = np.column_stack(cols)
    return 0.5 * (hess + hess.T)


def fit_logt_regression(trace: pd.DataFrame, *, extra_features: Sequence[str] = (),
                        nu: float | None = None) -> LogTRegression:
    """Fit ``mu`` and ``log sigma`` of a log-t output length, linear in request features.

    Parameters
    ----------
    trace : DataFrame
        One row per request: ``prompt_tokens`` (tokens, >= 1), ``output_tokens`` (tokens, >= 1),
        optional boolean ``censored`` (the output hit ``max_new_tokens``, so its true length is
        at least ``output_tokens``), and the ``extra_features`` columns.
    extra_features : sequence of str
        Trace columns used as features beyond prompt tokens and log prompt tokens.
    nu : float, optional
        Fix the degrees of freedom (the TIE paper uses 3.5); ``None`` fits it in
        ``NU_BOUNDS``.

    Returns
    -------
    LogTRegression

    Raises
    ------
    ValueError
        A missing column (all missing ones are named), a bad value (its row is named), a
        constant feature, or fewer rows than parameters.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> prompt = rng.integers(10, 2000, 4000)
    >>> x = np.exp(1.0 + 0.4 * np.log(prompt) + 0.5 * rng.standard_t(3.5, 4000))
    >>> trace = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": np.maximum(np.floor(x + 0.5), 1)})
    >>> fit = fit_logt_regression(trace, nu=3.5)
    >>> round(float(fit.mu_coef[2]), 1)
    0.4
    """
    x = design_matrix(trace, extra_features)
    extra = tuple(extra_features)
    k, censored = _outputs(trace)
    nu_fixed = None if nu is None else v.positive_float(nu, "nu")
    p = x.shape[1]
    num_params = 2 * p + (nu_fixed is None)
    if len(trace) <= num_params:
        raise ValueError(f"trace has {len(trace)} rows; fitting {num_params} parameters needs more")
    center, scale = x[:, 1:].mean(axis=0), x[:, 1:].std(axis=0)
    names = ("intercept", *BASE_FEATURES, *extra)
    flat = np.flatnonzero(scale == 0)
    if flat.size:
        raise ValueError(f"feature {names[1 + flat[0]]!r} is constant over the trace; it cannot "
                         f"be told apart from the intercept")
    z = np.column_stack([np.ones(len(trace)), (x[:, 1:] - center) / scale])
    lik = _Likelihood(z, k, censored, nu_fixed)

    y = np.log(k)
    beta0 = np.linalg.lstsq(z, y, rcond=None)[0]
    gamma0 = np.zeros(p)
    gamma0[0] = np.log(max(np.std(y - z @ beta0), 0.05))
    theta0 = np.concatenate([beta0, gamma0] + ([] if nu_fixed is not None else [[np.log(5.0)]]))
    bounds = [(None, None)] * (2 * p) + ([] if nu_fixed is not None else [tuple(np.log(NU_BOUNDS))])
    res = optimize.minimize(lik.value_and_grad, theta0, jac=True, method="L-BFGS-B", bounds=bounds,
                            options={"maxiter": 2000})

    # back to the original feature scale: coef = A @ coef_std, a linear map
    a = np.eye(p)
    a[1:, 1:] = np.diag(1.0 / scale)
    a[0, 1:] = -center / scale
    cov = np.full((res.x.size, res.x.size), np.nan)
    hess = _hessian(lik, res.x)
    if np.all(np.isfinite(hess)) and np.all(np.linalg.eigvalsh(hess) > 0):
        cov = np.linalg.inv(hess)
    beta, gamma, nu_hat = lik.split(res.x)
    blocks = [slice(0, p), slice(p, 2 * p)]
    stderr = [np.sqrt(np.diag(a @ cov[blk, blk] @ a.T)) for blk in blocks]
    nu_se = float("nan") if nu_fixed is not None else float(nu_hat * np.sqrt(cov[-1, -1]))
    return LogTRegression(
        feature_names=names, extra_features=extra,
        mu_coef=a @ beta, log_sigma_coef=a @ gamma,
        mu_stderr=stderr[0], log_sigma_stderr=stderr[1],
        nu=float(nu_hat), nu_stderr=nu_se, nu_fixed=nu_fixed is not None,
        nll=float(res.fun), num_requests=len(trace), num_censored=int(censored.sum()),
        converged=bool(res.success))
