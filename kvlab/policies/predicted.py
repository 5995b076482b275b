"""Prediction-based reservation: reserve a quantile of each request's predicted output length."""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from .. import _validate as v
from .base import Policy, PolicyName, RequestView, register


def noisy_oracle(output_tokens: np.ndarray, *, sigma: float = 0.5, seed: int = 0) -> Any:
    """A per-request predicted output-length distribution built from the true lengths.

    Log-normal with shape ``sigma`` whose median is the true length times ``exp(N(0, sigma))``:
    a predictor whose log-error has standard deviation ``sigma`` and that knows its own
    uncertainty. Stands in for a trained predictor (``kvlab.predict``).

    Returns a frozen ``scipy.stats.lognorm`` with one scale per request (``.ppf(q)`` has shape
    ``(n,)``).
    """
    out = v.positive_int_array(output_tokens, "output_tokens")
    sigma = v.positive_float(sigma, "sigma")
    rng = np.random.default_rng(seed)
    return stats.lognorm(s=sigma, scale=out * np.exp(rng.normal(0.0, sigma, out.size)))


@register
class PredictedPolicy(Policy):
    """Reserve prompt + the ``quantile`` of a per-request predicted output length; grow on demand.

    The reservation idea of S3 (Jin et al., 2023) and of uncertainty-aware schedulers
    (arXiv 2604.00499, log-t predicted lengths): each request reserves a chosen quantile of
    its own predicted distribution (capped at max_new_tokens). A request that outgrows it
    allocates pages on demand and, when the pool is full, the most recently admitted running
    request is preempted, as in vLLM.

    Parameters
    ----------
    quantile : float
        Quantile of the predicted length to reserve, in (0, 1); default 0.9.
    prediction : object with ``ppf(q) -> array of shape (n,)``, optional
        Predicted output-length distributions, one per request in workload order (e.g. a frozen
        scipy distribution with array parameters). Default: :func:`noisy_oracle` with
        ``noise_sigma`` and the run's seed.
    noise_sigma : float
        Log-error of the default noisy oracle; default 0.5.
    """

    name = PolicyName.PREDICTED
    on_demand = True

    def __init__(self, *, quantile: float = 0.9, prediction: Any = None, noise_sigma: float = 0.5) -> None:
        super().__init__()
        self.quantile = v.fraction(quantile, "quantile", high_closed=False)
        if prediction is not None and not callable(getattr(prediction, "ppf", None)):
            raise ValueError(f"prediction must have a ppf(q) method, got {type(prediction).__name__}")
        self.prediction = prediction
        self.noise_sigma = v.positive_float(noise_sigma, "noise_sigma")
        self.predicted_tokens = np.zeros(0, dtype=np.int64)

    def bind(self, *, output_tokens: np.ndarray, max_new_tokens: int, block_size: int, num_pages: int,
             seed: int) -> None:
        super().bind(output_tokens=output_tokens, max_new_tokens=max_new_tokens, block_size=block_size,
                     num_pages=num_pages, seed=seed)
        dist = self.prediction if self.prediction is not None else \
            noisy_oracle(output_tokens, sigma=self.noise_sigma, seed=seed)
        q = np.broadcast_to(np.asarray(dist.ppf(self.quantile), dtype=np.float64), output_tokens.shape)
        if np.isnan(q).any():
            raise ValueError(f"prediction.ppf({self.quantile}) returned NaN for request "
                             f"{int(np.flatnonzero(np.isnan(q))[0])}")
        self.predicted_tokens = np.clip(np.ceil(np.nan_to_num(q, posinf=max_new_tokens)), 1,
                                        max_new_tokens).astype(np.int64)

    def reservation_tokens(self, req: RequestView) -> int:
        predicted = int(self.predicted_tokens[req.index])
        return req.prompt_tokens + max(predicted, req.generated_tokens)
