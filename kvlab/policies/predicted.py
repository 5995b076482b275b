"""Prediction-based reservation and scheduling: reserve a quantile of each request's predicted
output length, and optionally order the waiting queue by the prediction."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _validate as v
from ..predict import LogTPredictive, oracle_predictive
from .base import Policy, Requests, register

#: Waiting-queue orders: first come first served, shortest predicted median first, the TIE
#: score (smallest ``E[C] + beta x CVaR_0.9[C]`` first), and a learning-to-rank score (lowest first).
QUEUE_ORDERS = ("fcfs", "shortest_predicted", "tie", "ltr")

#: Smallest predictive scale (log tokens) of :func:`realized_length_predictive` (at R^2 = 1).
_MIN_SIGMA = 1e-6


def realized_length_predictive(output_tokens: Any, *, r2_mu: float = 0.82, nu: float = 3.5,
                               seed: int = 0) -> LogTPredictive:
    """What a predictor of quality ``r2_mu`` says about requests known only by their lengths.

    A workload that holds only realized lengths has no true per-request ``(mu, sigma)``; here
    the realized log length stands in as each request's true location and
    :func:`kvlab.predict.oracle_predictive` sees it through noise tuned to ``r2_mu``. The
    predictive scale is the spread that noise leaves, ``Var(log K - mu_hat) = (1 - r2_mu)
    Var(log K)``, matched to the variance of a t with ``nu`` degrees of freedom
    (``sigma^2 nu / (nu - 2)``), so the predictor knows its own uncertainty (the same for every
    request). ``r2_mu = 0`` predicts the workload's own length distribution for everyone,
    ``r2_mu = 1`` the exact lengths.

    Parameters
    ----------
    output_tokens : array_like of int, shape (n,)
        Realized output lengths (tokens, >= 1).
    r2_mu : float
        Coefficient of determination of the predicted log length, in [0, 1]; default 0.82 (the
        TIE paper's, brief section 5).
    nu : float
        Degrees of freedom of the predictive log-t, > 2; default 3.5.
    seed : int
        Seed of the predictor's noise.

    Returns
    -------
    LogTPredictive
    """
    out = v.positive_int_array(output_tokens, "output_tokens")
    r2_mu = v.fraction(r2_mu, "r2_mu", low_open=False)
    nu = v.positive_float(nu, "nu")
    if nu <= 2:
        raise ValueError(f"nu must be > 2 (a finite-variance t), got {nu}")
    log_k = np.log(out.astype(np.float64))
    sigma = max(float(np.sqrt((1.0 - r2_mu) * log_k.var() * (nu - 2.0) / nu)), _MIN_SIGMA)
    truth = LogTPredictive(mu=log_k, sigma=sigma, nu=nu)
    return oracle_predictive(truth, r2_mu=r2_mu, r2_log_sigma=1.0, seed=seed)


@register
class PredictedPolicy(Policy):
    """Reserve prompt + the ``quantile`` of a per-request predicted output length; grow on demand.

    The reservation idea of S3 (Jin et al., 2023) and of uncertainty-aware schedulers
    (arXiv 2604.00499, log-t predicted lengths): each request reserves a chosen quantile of
    its own predicted distribution (capped at max_new_tokens). A request that outgrows it
    allocates pages on demand and, when the pool is full, the most recently admitted running
    request is preempted, as in vLLM.

    The waiting queue (``queue_order``) is FCFS, or ordered by a score fixed per request before
    it runs: ``shortest_predicted`` (the predicted median, a point predictor's shortest-job-first,
    standing in for the learning-to-rank and SSJF schedulers) or ``tie`` (TIE's tail-inflated
    expectation ``E[C] + beta x CVaR_0.9[C]``, ``C`` the length capped at max_new_tokens) or
    ``ltr`` (a learning-to-rank score, ``prediction.rank_score()``, e.g. a
    :class:`kvlab.predict.RankedPrediction`).
    Ordered queues give each request a distinct integer rank (score, then row) and the
    simulator keeps waiting requests sorted by it, preempted ones included.

    Parameters
    ----------
    quantile : float
        Quantile of the predicted length to reserve, in (0, 1); default 0.9.
    prediction : object with ``ppf(q) -> array of shape (n,)``, optional
        Predicted output-length distributions, one per request in workload order, e.g. a
        :class:`kvlab.predict.LogTPredictive` (``tie`` needs one, or an object with
        ``tail_inflated_expectation(beta, max_new_tokens)``). Default:
        :func:`realized_length_predictive` with ``r2_mu`` and the run's seed.
    queue_order : {"fcfs", "shortest_predicted", "tie", "ltr"}
        Order of the waiting queue; default FCFS.
    tie_beta : float
        Weight of the tail term in the TIE score, >= 0; default 1.0.
    r2_mu : float
        Quality of the default predictor, in [0, 1]; default 0.82.
    """

    name = "predicted"
    on_demand = True

    def __init__(self, *, quantile: float = 0.9, prediction: Any = None, queue_order: str = "fcfs",
                 tie_beta: float = 1.0, r2_mu: float = 0.82) -> None:
        super().__init__()
        self.quantile = v.fraction(quantile, "quantile", high_closed=False)
        if prediction is not None and not callable(getattr(prediction, "ppf", None)):
            raise ValueError(f"prediction must have a ppf(q) method, got {type(prediction).__name__}")
        self.queue_order = v.choice(queue_order, "queue_order", QUEUE_ORDERS)
        if (self.queue_order == "tie" and prediction is not None
                and not callable(getattr(prediction, "tail_inflated_expectation", None))):
            raise ValueError(f"queue_order='tie' needs a prediction with tail_inflated_expectation(beta, "
                             f"max_new_tokens) (a kvlab.predict.LogTPredictive), got {type(prediction).__name__}")
        if self.queue_order == "ltr" and not callable(getattr(prediction, "rank_score", None)):
            raise ValueError(f"queue_order='ltr' needs a prediction with rank_score() (a kvlab.predict.RankedPrediction), "
                             f"got {type(prediction).__name__}")
        self.prediction = prediction
        self.tie_beta = v.nonnegative_float(tie_beta, "tie_beta")
        self.r2_mu = v.fraction(r2_mu, "r2_mu", low_open=False)
        self.predicted_tokens = np.zeros(0, dtype=np.int64)
        self.ranks = np.zeros(0, dtype=np.int64)

    @property
    def orders_queue(self) -> bool:
        return self.queue_order != "fcfs"

    def bind(self, *, output_tokens: np.ndarray, max_new_tokens: int, block_size: int, num_pages: int,
             seed: int) -> None:
        super().bind(output_tokens=output_tokens, max_new_tokens=max_new_tokens, block_size=block_size,
                     num_pages=num_pages, seed=seed)
        dist = self.prediction if self.prediction is not None else \
            realized_length_predictive(output_tokens, r2_mu=self.r2_mu, seed=seed)
        q = self._per_request(dist.ppf(self.quantile), f"prediction.ppf({self.quantile})", output_tokens.size)
        self.predicted_tokens = np.clip(np.ceil(np.nan_to_num(q, posinf=max_new_tokens)), 1,
                                        max_new_tokens).astype(np.int64)
        if self.queue_order == "fcfs":
            self.ranks = np.arange(output_tokens.size, dtype=np.int64)
            return
        if self.queue_order == "shortest_predicted":
            score = self._per_request(dist.ppf(0.5), "prediction.ppf(0.5)", output_tokens.size)
        elif self.queue_order == "ltr":
            score = self._per_request(dist.rank_score(), "prediction.rank_score()", output_tokens.size)
        else:
            score = self._per_request(dist.tail_inflated_expectation(self.tie_beta, max_new_tokens),
                                      "prediction.tail_inflated_expectation", output_tokens.size)
        self.ranks = np.empty(output_tokens.size, dtype=np.int64)
        self.ranks[np.lexsort((np.arange(output_tokens.size), score))] = np.arange(output_tokens.size)

    @staticmethod
    def _per_request(values: Any, what: str, n: int) -> np.ndarray:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size not in (1, n):
            raise ValueError(f"{what} returned {arr.size} values for {n} requests")
        arr = np.broadcast_to(arr.reshape(-1) if arr.size == n else arr.reshape(()), (n,))
        if np.isnan(arr).any():
            raise ValueError(f"{what} returned NaN for request {int(np.flatnonzero(np.isnan(arr))[0])}")
        return arr

    def reservation_tokens(self, reqs: Requests) -> Any:
        predicted = self.per_request("predicted_tokens", reqs.xp)[reqs.index]
        return reqs.prompt_tokens + reqs.xp.maximum(predicted, reqs.generated_tokens)

    def queue_rank(self, reqs: Requests) -> Any:
        return self.per_request("ranks", reqs.xp)[reqs.index]
