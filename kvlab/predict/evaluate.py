"""How good is a length predictor: R^2 of its parameters, and calibration of its quantiles.

* :func:`parameter_r2`: coefficient of determination of predicted ``mu`` and ``log sigma``
  against known true values (synthetic requests, where the truth exists).
* :func:`calibration_table`: on held-out requests, the share of outputs at or under the
  predicted ``q``-quantile, next to the share the predictor itself promises. For integer
  lengths the promise is ``mean_i P(K_i <= ppf_i(q))``, slightly above ``q`` (the quantile is
  rounded up to a whole token); under a cap both sides are of ``min(K, max_new_tokens)``, which
  is observed exactly even for censored outputs.
* :func:`holdout_indices`: a seeded train/test split of request positions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import _validate as v
from .distribution import LogTPredictive

#: Quantiles a reservation policy is likely to use (brief section 5).
DEFAULT_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99)


def r2_score(true: Any, predicted: Any) -> float:
    """Coefficient of determination ``1 - sum (true - predicted)^2 / sum (true - mean)^2``.

    Raises ``ValueError`` when the lengths differ, a value is not finite, or ``true`` is
    constant (R^2 is undefined).
    """
    t = np.asarray(true, dtype=np.float64).ravel()
    p = np.asarray(predicted, dtype=np.float64).ravel()
    if t.size != p.size or t.size < 2:
        raise ValueError(f"true and predicted must hold the same number (>= 2) of values, got "
                         f"{t.size} and {p.size}")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(p))):
        raise ValueError("true and predicted must be finite")
    total = np.sum((t - t.mean()) ** 2)
    if total == 0:
        raise ValueError("true values are constant: R^2 is undefined")
    return float(1.0 - np.sum((t - p) ** 2) / total)


@dataclass(frozen=True, kw_only=True)
class ParameterR2:
    """R^2 of a predictor's location ``mu`` and log scale ``log sigma`` against the truth."""

    mu_r2: float
    log_sigma_r2: float


def parameter_r2(predicted: LogTPredictive, truth: LogTPredictive) -> ParameterR2:
    """R^2 of ``predicted.mu`` vs ``truth.mu`` and of ``log predicted.sigma`` vs ``log truth.sigma``."""
    for name, obj in (("predicted", predicted), ("truth", truth)):
        if not isinstance(obj, LogTPredictive):
            raise ValueError(f"{name} must be a LogTPredictive, got {type(obj).__name__}")
    if len(predicted) != len(truth):
        raise ValueError(f"predicted covers {len(predicted)} requests, truth {len(truth)}")
    return ParameterR2(mu_r2=r2_score(truth.mu, predicted.mu),
                       log_sigma_r2=r2_score(np.log(truth.sigma), np.log(predicted.sigma)))


def calibration_table(predicted: LogTPredictive, output_tokens: Any, *,
                      max_new_tokens: int | None = None,
                      quantiles: Sequence[float] = DEFAULT_QUANTILES) -> pd.DataFrame:
    """Share of held-out outputs at or under the predicted quantile, per quantile.

    Parameters
    ----------
    predicted : LogTPredictive
        Predictions for the held-out requests.
    output_tokens : array_like of int, shape (n,)
        Their observed output lengths (tokens, >= 1).
    max_new_tokens : int, optional
        The cap the outputs were generated under (outputs equal to it are the censored ones);
        ``None`` when they were not capped.
    quantiles : sequence of float
        Quantiles to check, each in (0, 1).

    Returns
    -------
    DataFrame
        One row per quantile: ``q``; ``predicted_frac``, the share the predictor promises,
        ``mean_i P(C_i <= r_i)`` with ``r_i = min(ppf_i(q), max_new_tokens)``; ``observed_frac``,
        the share of outputs ``<= r_i``; ``gap_points = 100 * (observed - predicted)``.
    """
    if not isinstance(predicted, LogTPredictive):
        raise ValueError(f"predicted must be a LogTPredictive, got {type(predicted).__name__}")
    k = v.positive_int_array(output_tokens, "output_tokens")
    if k.size != len(predicted):
        raise ValueError(f"output_tokens holds {k.size} lengths for {len(predicted)} predictions")
    qs = [v.fraction(q, "quantile", high_closed=False) for q in np.atleast_1d(quantiles).tolist()]
    cap = None if max_new_tokens is None else v.positive_int(max_new_tokens, "max_new_tokens")
    if cap is not None and np.any(k > cap):
        i = int(np.flatnonzero(k > cap)[0])
        raise ValueError(f"output_tokens[{i}] = {k[i]} exceeds max_new_tokens = {cap}")
    rows = []
    for q in qs:
        reserved = predicted.ppf(q)
        promised = predicted.cdf(reserved)
        if cap is not None:
            promised = np.where(reserved >= cap, 1.0, promised)
            reserved = np.minimum(reserved, cap)
        observed = float(np.mean(k <= reserved))
        rows.append((q, float(promised.mean()), observed, 100.0 * (observed - promised.mean())))
    return pd.DataFrame(rows, columns=["q", "predicted_frac", "observed_frac", "gap_points"])


def holdout_indices(num_requests: int, *, test_frac: float = 0.25, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of positions ``0..num_requests-1`` into (train, test), each sorted."""
    num_requests = v.positive_int(num_requests, "num_requests")
    test_frac = v.fraction(test_frac, "test_frac", high_closed=False)
    num_test = int(round(test_frac * num_requests))
    if num_test == 0 or num_test == num_requests:
        raise ValueError(f"test_frac={test_frac} of {num_requests} requests leaves an empty split")
    perm = np.random.default_rng(seed).permutation(num_requests)
    return np.sort(perm[num_test:]), np.sort(perm[:num_test])
