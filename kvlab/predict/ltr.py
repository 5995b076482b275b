"""A learning-to-rank baseline with its own ranking error: the TIE paper's strongest baseline.

Learning to rank (Fu et al., NeurIPS 2024, "Efficient LLM Scheduling by Learning to Rank")
predicts no length, only an order: a small model scores each prompt and the scheduler serves
the lowest score first. How good the order is, is measured by Kendall's tau between the scores
and the true output lengths. kvlab cannot run the ranker (no prompt text, no model), so
:func:`ranking_scores` draws scores whose Kendall tau with the realized lengths is a chosen
``kendall_tau``: the normal scores of the lengths' ranks ``z``, mixed with independent noise,

    score = rho z + sqrt(1 - rho^2) e,   rho = sin(pi tau / 2),

because a bivariate normal pair with correlation ``rho`` has Kendall tau ``(2 / pi) arcsin
rho`` (Greiner's relation) and Kendall tau is unchanged by the monotone map from lengths to
their normal scores. Tied lengths lower the achieved tau a little; :func:`ranking_scores`
returns the tau it reached (``scipy.stats.kendalltau``, tau-b).

:class:`RankedPrediction` pairs those scores with the predictive distribution the server
reserves by, so that the ``ltr`` queue order of :class:`kvlab.policies.predicted.PredictedPolicy`
changes only the order, not the reservation, when compared with TIE or FCFS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special, stats

from .. import _validate as v


def ranking_scores(output_tokens: Any, kendall_tau: float, *, seed: int = 0) -> tuple[np.ndarray, float]:
    """Scores of a ranker whose Kendall tau with ``output_tokens`` is ``kendall_tau`` (lowest = shortest).

    Parameters
    ----------
    output_tokens : array_like of int, shape (n,)
        The requests' true output lengths (tokens, >= 1), n >= 2.
    kendall_tau : float
        Target Kendall tau in [0, 1]; 1 ranks exactly (ties broken at random), 0 at random.
    seed : int
        Seed of the noise.

    Returns
    -------
    (ndarray of float, float)
        The scores and the Kendall tau-b they reached against ``output_tokens``.
    """
    out = v.positive_int_array(output_tokens, "output_tokens")
    if out.size < 2:
        raise ValueError(f"output_tokens must hold at least 2 requests to rank, got {out.size}")
    tau = v.fraction(kendall_tau, "kendall_tau", low_open=False)
    rng = np.random.default_rng(v.nonnegative_int(seed, "seed"))
    z = special.ndtri((stats.rankdata(out) - 0.5) / out.size)        # normal scores of the ranks
    rho = float(np.sin(np.pi * tau / 2.0))
    scores = rho * z + np.sqrt(max(1.0 - rho * rho, 0.0)) * rng.standard_normal(out.size)
    if tau == 1.0:
        scores = scores + 1e-9 * rng.standard_normal(out.size)        # break ties at random
    got = float(stats.kendalltau(scores, out).statistic)
    return scores, got


@dataclass(frozen=True, kw_only=True, eq=False)
class RankedPrediction:
    """A ranker's scores, and the predictive distribution the server reserves by.

    Parameters
    ----------
    reserve : object with ``ppf(q)``
        Per-request predicted length distributions for the reservation (e.g. a
        :class:`kvlab.predict.LogTPredictive`).
    scores : array of float, shape (n,)
        Ranking scores, lowest served first (:func:`ranking_scores`).
    kendall_tau : float
        Kendall tau of ``scores`` against the true lengths (reported, not used).
    """

    reserve: Any
    scores: np.ndarray
    kendall_tau: float = float("nan")

    def __post_init__(self) -> None:
        if not callable(getattr(self.reserve, "ppf", None)):
            raise ValueError(f"reserve must have a ppf(q) method, got {type(self.reserve).__name__}")
        s = np.asarray(self.scores, dtype=np.float64)
        if s.ndim != 1 or not np.all(np.isfinite(s)):
            raise ValueError("scores must be a 1-D array of finite ranking scores")
        object.__setattr__(self, "scores", s)

    def ppf(self, q: float) -> np.ndarray:
        """The reservation distribution's ``q``-quantile (tokens)."""
        return self.reserve.ppf(q)

    def rank_score(self) -> np.ndarray:
        """The ranking score of each request (lowest first)."""
        return self.scores

    def __len__(self) -> int:
        return int(self.scores.size)
