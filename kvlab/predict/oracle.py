"""A predictor of chosen quality: synthetic requests with known (mu, sigma), seen through noise.

Prediction's value depends on how good the predictor is. Instead of training a model on prompt
text, :func:`synthetic_requests` draws requests whose true log-t parameters are known, and
:func:`oracle_predictive` returns what a predictor of a target quality would say about them:
for each parameter ``theta`` (``mu``, and ``log sigma``), it observes ``theta + e`` with Gaussian
noise ``e`` and reports the best linear estimate from that observation,

    theta_hat = m + R2 * (theta + e - m),   Var(e) = Var(theta) * (1 - R2) / R2,

``m`` the mean of ``theta`` over the requests. Then ``theta_hat`` is unbiased given itself
(``E[theta | theta_hat] = theta_hat``, like a fitted regression) and its coefficient of
determination ``1 - sum (theta - theta_hat)^2 / sum (theta - m)^2`` equals ``R2`` in expectation
(closed form: ``1 - [(1 - R2)^2 Var + R2^2 Var(e)] / Var = R2``). ``R2 = 0`` predicts ``m`` for
everyone; ``R2 = 1`` is the truth. Sigma's quality is set and measured on ``log sigma``, the
scale the regression models it on, where Gaussian noise keeps ``sigma`` positive.

Default targets 0.82 (mu) and 0.76 (sigma) are the TIE paper's (arXiv 2604.00499, via a
secondary source; brief section 5).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import _validate as v
from .._intmath import round_tokens
from .distribution import LogTPredictive


@dataclass(frozen=True, kw_only=True)
class SyntheticRequests:
    """Requests with known output-length distributions.

    Parameters
    ----------
    trace : DataFrame
        ``prompt_tokens`` (tokens), ``output_tokens`` (tokens, capped at ``max_new_tokens``) and
        ``censored`` (the draw reached the cap), one row per request.
    truth : LogTPredictive
        Each request's true distribution, the one its ``output_tokens`` was drawn from.
    """

    trace: pd.DataFrame
    truth: LogTPredictive


def synthetic_requests(num_requests: int, *, seed: int = 0, mu_mean: float = 3.3,
                       mu_sd: float = 0.8, log_sigma_mean: float = -0.5, log_sigma_sd: float = 0.3,
                       nu: float = 3.5, prompt_median_tokens: float = 256.0,
                       prompt_log_sd: float = 1.0, max_new_tokens: int | None = None
                       ) -> SyntheticRequests:
    """Draw requests whose per-request log-t output-length parameters are known.

    ``mu ~ Normal(mu_mean, mu_sd)``, ``log sigma ~ Normal(log_sigma_mean, log_sigma_sd)``
    independently, ``output = max(round(exp(mu + sigma T_nu)), 1)``; prompts are log-normal and
    independent of outputs (the oracle stands in for what a model reads from the prompt text).
    The defaults are illustrative (median output ~27 tokens), not a measured workload: use
    :mod:`kvlab.lengths` profiles for those.

    Parameters
    ----------
    num_requests : int
        Number of requests.
    seed : int
        Seed of the host ``numpy.random.Generator``.
    mu_mean, mu_sd : float
        Mean and spread of ``mu`` across requests (log tokens).
    log_sigma_mean, log_sigma_sd : float
        Mean and spread of ``log sigma`` across requests.
    nu : float
        Degrees of freedom of the t on log length (3.5 as in the TIE paper).
    prompt_median_tokens, prompt_log_sd : float
        Median prompt length (tokens) and spread of log prompt length.
    max_new_tokens : int, optional
        Cap outputs here and mark them ``censored``; ``None`` leaves them uncapped.

    Returns
    -------
    SyntheticRequests
    """
    num_requests = v.positive_int(num_requests, "num_requests")
    mu_sd = v.nonnegative_float(mu_sd, "mu_sd")
    log_sigma_sd = v.nonnegative_float(log_sigma_sd, "log_sigma_sd")
    prompt_median_tokens = v.positive_float(prompt_median_tokens, "prompt_median_tokens")
    prompt_log_sd = v.nonnegative_float(prompt_log_sd, "prompt_log_sd")
    for name, value in (("mu_mean", mu_mean), ("log_sigma_mean", log_sigma_mean)):
        if not np.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    rng = np.random.default_rng(seed)
    mu = rng.normal(mu_mean, mu_sd, num_requests)
    sigma = np.exp(rng.normal(log_sigma_mean, log_sigma_sd, num_requests))
    truth = LogTPredictive(mu=mu, sigma=sigma, nu=nu)
    output = truth.sample(rng)
    prompt = round_tokens(prompt_median_tokens * np.exp(rng.normal(0.0, prompt_log_sd, num_requests)))
    if max_new_tokens is None:
        censored = np.zeros(num_requests, dtype=bool)
    else:
        cap = v.positive_int(max_new_tokens, "max_new_tokens")
        censored = output >= cap
        output = np.minimum(output, cap)
    trace = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output, "censored": censored})
    return SyntheticRequests(trace=trace, truth=truth)


def _noisy_estimate(theta: np.ndarray, r2: float, rng: np.random.Generator) -> np.ndarray:
    center = theta.mean()
    if r2 == 0.0:
        return np.full_like(theta, center)
    if r2 == 1.0:
        return theta.copy()
    noise_sd = np.sqrt(theta.var() * (1.0 - r2) / r2)
    return center + r2 * (theta + rng.normal(0.0, noise_sd, theta.size) - center)


def oracle_predictive(truth: LogTPredictive, *, r2_mu: float = 0.82, r2_log_sigma: float = 0.76,
                      seed: int = 0) -> LogTPredictive:
    """What a predictor of quality ``(r2_mu, r2_log_sigma)`` predicts for requests ``truth``.

    Parameters
    ----------
    truth : LogTPredictive
        The requests' true distributions (from :func:`synthetic_requests`).
    r2_mu, r2_log_sigma : float
        Target coefficients of determination of predicted ``mu`` and ``log sigma``, in [0, 1].
    seed : int
        Seed of the noise draws.

    Returns
    -------
    LogTPredictive
        Predicted ``mu`` and ``sigma`` per request, with the true ``nu``.
    """
    if not isinstance(truth, LogTPredictive):
        raise ValueError(f"truth must be a LogTPredictive, got {type(truth).__name__}")
    r2_mu = v.fraction(r2_mu, "r2_mu", low_open=False)
    r2_log_sigma = v.fraction(r2_log_sigma, "r2_log_sigma", low_open=False)
    # a stream of its own: default_rng(seed) would replay synthetic_requests' draws of mu for the
    # same seed, making the noise proportional to the truth (and R^2 near 1 whatever the target)
    rng = np.random.default_rng([seed, 1])
    mu_hat = _noisy_estimate(np.asarray(truth.mu), r2_mu, rng)
    log_sigma_hat = _noisy_estimate(np.log(truth.sigma), r2_log_sigma, rng)
    return LogTPredictive(mu=mu_hat, sigma=np.exp(log_sigma_hat), nu=truth.nu)
