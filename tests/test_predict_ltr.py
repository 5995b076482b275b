"""The learning-to-rank baseline: scores of a chosen Kendall tau, and the queue served in their order."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvlab.predict import LogTPredictive, RankedPrediction, ranking_scores
from kvlab.sim import simulate


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.55, 0.8])
def test_scores_reach_the_target_kendall_tau(tau):
    # Distinct lengths: tau of a bivariate normal with rho = sin(pi tau / 2) is tau (Greiner);
    # with n = 4000 the sampling sd of tau is about 0.01.
    out = np.random.default_rng(1).permutation(np.arange(1, 4001))
    scores, got = ranking_scores(out, tau, seed=2)
    assert got == pytest.approx(float(stats.kendalltau(scores, out).statistic))
    assert got == pytest.approx(tau, abs=0.03)


def test_a_perfect_ranker_orders_exactly_and_bad_input_is_named():
    out = np.array([30, 5, 200, 17])
    scores, got = ranking_scores(out, 1.0)
    assert got == pytest.approx(1.0) and np.argsort(scores).tolist() == [1, 3, 0, 2]
    with pytest.raises(ValueError, match="kendall_tau"):
        ranking_scores(out, 1.5)
    with pytest.raises(ValueError, match="at least 2"):
        ranking_scores([3], 0.5)
    with pytest.raises(ValueError, match="ppf"):
        RankedPrediction(reserve=object(), scores=[0.0])


def test_the_ltr_order_serves_the_lowest_score_first_with_the_same_reservation():
    # Three requests at time 0, one running at a time: served in score order r2, r0, r1. Each
    # reserves prompt 4 + its median of the reservation predictive (8 tokens), whatever its score.
    work = pd.DataFrame({"prompt_tokens": [4, 4, 4], "output_tokens": [3, 2, 4]})
    reserve = LogTPredictive(mu=np.log([8.0, 8.0, 8.0]), sigma=0.5, nu=3.5)
    pred = RankedPrediction(reserve=reserve, scores=[0.2, 0.9, 0.1])
    res = simulate(work, "predicted", model="Llama-2-7B", gpu="A100-80GB-SXM", max_new_tokens=16, block_size=4,
                   max_num_seqs=1, queue_order="ltr", prediction=pred, quantile=0.5, record_iterations=True)
    admitted = res.requests["admitted_iter"].tolist()
    assert admitted[2] < admitted[0] < admitted[1]
    ref = simulate(work, "predicted", model="Llama-2-7B", gpu="A100-80GB-SXM", max_new_tokens=16, block_size=4,
                   max_num_seqs=1, queue_order="ltr", prediction=pred, quantile=0.5, engine="reference")
    assert ref.requests["admitted_iter"].tolist() == admitted
    assert res.requests["max_reserved_pages"].tolist() == [3, 3, 3]  # ceil((4 + 8) / 4)
    with pytest.raises(ValueError, match="rank_score"):
        simulate(work, "predicted", model="Llama-2-7B", gpu="A100-80GB-SXM", queue_order="ltr", prediction=reserve)
