"""Scheduling by prediction: queue orders worked out by hand, the default predictor, bad input."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import roofline
from kvlab.policies import create_policy, realized_length_predictive
from kvlab.predict import LogTPredictive, fit_logt_regression, oracle_predictive, parameter_r2, synthetic_requests
from kvlab.sim import simulate

ONE_SECOND = dataclasses.replace(
    roofline("Llama-2-7B", "A100-80GB-SXM"), linear_flops_per_token=0.0, attention_flops_per_pair=0.0,
    weight_bytes=0.0, kv_bytes_per_token=0.0, allreduce_bytes_per_token=0.0,
    allreduce_latency_s_per_iteration=0.0, iteration_overhead_s=1.0)

# Rows C, B, A, all arriving at 0 with 4-token prompts and 3 output tokens. Predicted medians 18,
# 12, 10 tokens; A's log-t is very wide (sigma 2), B's and C's narrow (sigma 0.01).
# Reserving the median: C 4 + 18 = 22 tokens = 6 pages, B 16 = 4 pages, A 14 = 4 pages, and the
# pool has 6 pages, so requests run one at a time, each for 3 iterations (prefill + 2 decodes).
# TIE scores (beta 1, cap 64): B ~ 12 + 12, C ~ 18 + 18, A >= its CVaR_0.9 near the cap of 64.
PRED = LogTPredictive(mu=np.log([18.0, 12.0, 10.0]), sigma=[0.01, 0.01, 2.0], nu=3.5)


def run(order: str, engine: str):
    w = pd.DataFrame({"prompt_tokens": [4, 4, 4], "output_tokens": [3, 3, 3]})
    return simulate(w, "predicted", model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=ONE_SECOND,
                    block_size=4, max_num_batched_tokens=16, pool_pages=6, max_new_tokens=64,
                    quantile=0.5, prediction=PRED, queue_order=order, tie_beta=1.0, engine=engine)


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("order,admitted", [
    ("fcfs", [0, 3, 6]),                 # C, B, A: row order
    ("shortest_predicted", [6, 3, 0]),   # A (10), B (12), C (18)
    ("tie", [3, 0, 6]),                  # B, C, then A whose tail is long
])
def test_queue_order_admits_in_hand_worked_order(order, admitted, engine):
    res = run(order, engine)
    assert res.requests["admitted_iter"].tolist() == admitted
    assert res.requests["max_reserved_pages"].tolist() == [6, 4, 4]
    assert res.requests["finish_iter"].tolist() == [a + 2 for a in admitted]


def test_ranks_are_a_permutation_following_the_score():
    p = create_policy("predicted", prediction=PRED, queue_order="shortest_predicted")
    p.bind(output_tokens=np.array([3, 3, 3]), max_new_tokens=64, block_size=4, num_pages=6, seed=0)
    assert p.orders_queue and p.ranks.tolist() == [2, 1, 0]
    tie = create_policy("predicted", prediction=PRED, queue_order="tie")
    tie.bind(output_tokens=np.array([3, 3, 3]), max_new_tokens=64, block_size=4, num_pages=6, seed=0)
    assert tie.ranks.tolist() == [1, 0, 2]
    assert not create_policy("predicted").orders_queue


def test_equal_scores_keep_row_order():
    same = LogTPredictive(mu=np.log([20.0, 20.0, 20.0]), sigma=0.3, nu=3.5)
    p = create_policy("predicted", prediction=same, queue_order="tie")
    p.bind(output_tokens=np.array([5, 5, 5]), max_new_tokens=64, block_size=4, num_pages=6, seed=0)
    assert p.ranks.tolist() == [0, 1, 2]


def test_ordered_queue_finishes_everything_with_preemptions():
    # many requests in a small pool: preempted requests rejoin the sorted queue and all finish
    syn = synthetic_requests(60, seed=3, max_new_tokens=256, mu_mean=4.0, prompt_median_tokens=32, prompt_log_sd=0.5)
    pred = oracle_predictive(syn.truth, seed=3)
    for order, engine in (("shortest_predicted", "reference"), ("tie", "reference"), ("tie", "fast")):
        res = simulate(syn.trace, "predicted", model="Llama-2-7B", gpu="A100-80GB-SXM", pool_pages=60,
                       max_new_tokens=256, quantile=0.5, prediction=pred, queue_order=order, engine=engine)
        t = res.requests
        assert (t["outcome"] != "finished_aborted").all()
        assert (t["generated_tokens"] == np.minimum(syn.trace["output_tokens"], 256)).all()
        assert t["num_preemptions"].sum() > 0


def test_realized_length_predictive_at_the_ends():
    out = np.array([5, 40, 300, 2000])
    exact = realized_length_predictive(out, r2_mu=1.0)
    assert exact.ppf(0.5).tolist() == out.tolist()
    flat = realized_length_predictive(out, r2_mu=0.0)
    assert np.allclose(flat.mu, np.log(out).mean())
    # scale: sqrt((1 - R2) Var(log K) (nu - 2) / nu)
    assert np.allclose(flat.sigma, np.sqrt(np.log(out).var() * 1.5 / 3.5))


def test_realized_length_predictive_quality_and_median_calibration():
    out = np.maximum(1, np.round(np.exp(np.random.default_rng(0).normal(3.5, 1.0, 5000)))).astype(int)
    pred = realized_length_predictive(out, r2_mu=0.6, seed=1)
    r2 = 1 - np.sum((np.log(out) - pred.mu) ** 2) / np.sum((np.log(out) - np.log(out).mean()) ** 2)
    assert r2 == pytest.approx(0.6, abs=0.03)
    assert np.mean(out <= pred.ppf(0.5)) == pytest.approx(0.5, abs=0.03)


def test_oracle_hits_its_target_with_the_requests_own_seed():
    syn = synthetic_requests(4000, seed=7)
    for target in (0.25, 0.75):
        got = parameter_r2(oracle_predictive(syn.truth, r2_mu=target, r2_log_sigma=target, seed=7), syn.truth)
        assert got.mu_r2 == pytest.approx(target, abs=0.05)
        assert got.log_sigma_r2 == pytest.approx(target, abs=0.05)


def test_bad_input():
    with pytest.raises(ValueError, match="queue_order"):
        create_policy("predicted", queue_order="sjf")
    class QuantilesOnly:
        def ppf(self, q):
            return np.ones(3)

    with pytest.raises(ValueError, match="tail_inflated_expectation"):
        create_policy("predicted", queue_order="tie", prediction=QuantilesOnly())
    for q in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="quantile"):
            create_policy("predicted", quantile=q)
    with pytest.raises(ValueError, match=r"r2_mu must be in \[0, 1\]"):
        create_policy("predicted", r2_mu=1.2)
    with pytest.raises(ValueError, match="r2_mu"):
        oracle_predictive(PRED, r2_mu=-0.1)
    with pytest.raises(ValueError, match="r2_log_sigma"):
        oracle_predictive(PRED, r2_log_sigma=1.5)
    with pytest.raises(ValueError, match="q must be in"):
        PRED.ppf(1.0)
    with pytest.raises(ValueError, match="tie_beta"):
        create_policy("predicted", tie_beta=-1.0)
    p = create_policy("predicted", prediction=PRED)
    with pytest.raises(ValueError, match="3 values for 2 requests"):
        p.bind(output_tokens=np.array([3, 3]), max_new_tokens=64, block_size=4, num_pages=6, seed=0)
    # a feature-based predictor on a trace without its feature columns names every missing one
    trace = pd.DataFrame({"prompt_tokens": [10, 20, 30], "output_tokens": [5, 6, 7]})
    with pytest.raises(ValueError, match="topic.*language|language.*topic"):
        fit_logt_regression(trace, extra_features=["topic", "language"])


def test_preemptions_at_equal_waste_interpolates_each_curve():
    from kvlab.studies.prediction_study import preemptions_at

    quality = pd.DataFrame({"r2_target": [0.0, 0.0, 1.0, 1.0], "mu_r2": [0.0, 0.0, 1.0, 1.0],
                            "over_reserved_frac": [0.3, 0.1, 0.25, 0.5],
                            "preemptions_per_request": [0.1, 0.3, 0.05, 0.01]})
    got = preemptions_at(quality, 0.2)
    assert got["r2_target"].tolist() == [0.0, 1.0]
    assert got["preemptions_per_request"].iloc[0] == pytest.approx(0.2)   # halfway from 0.3 to 0.1
    assert np.isnan(got["preemptions_per_request"].iloc[1])               # 0.2 is left of its curve
    with pytest.raises(ValueError, match="over_reserved_frac"):
        preemptions_at(quality, 1.5)
