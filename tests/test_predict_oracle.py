"""The quality-controlled oracle and the evaluation helpers."""
from __future__ import annotations

import numpy as np
import pytest

from kvlab.predict import (LogTPredictive, calibration_table, holdout_indices, oracle_predictive,
                           parameter_r2, r2_score, synthetic_requests)


@pytest.fixture(scope="module")
def requests():
    return synthetic_requests(10_000, seed=11, max_new_tokens=512)


@pytest.mark.parametrize("r2_mu, r2_log_sigma", [(0.82, 0.76), (0.5, 0.3), (0.95, 0.1)])
def test_oracle_hits_target_r2_within_003_on_10000_requests(requests, r2_mu, r2_log_sigma):
    pred = oracle_predictive(requests.truth, r2_mu=r2_mu, r2_log_sigma=r2_log_sigma, seed=2)
    r2 = parameter_r2(pred, requests.truth)
    assert abs(r2.mu_r2 - r2_mu) < 0.03
    assert abs(r2.log_sigma_r2 - r2_log_sigma) < 0.03


def test_oracle_defaults_are_the_tie_figures_and_endpoints_are_exact(requests):
    r2 = parameter_r2(oracle_predictive(requests.truth), requests.truth)
    assert abs(r2.mu_r2 - 0.82) < 0.03 and abs(r2.log_sigma_r2 - 0.76) < 0.03
    perfect = oracle_predictive(requests.truth, r2_mu=1.0, r2_log_sigma=1.0)
    np.testing.assert_array_equal(perfect.mu, requests.truth.mu)
    uninformed = parameter_r2(oracle_predictive(requests.truth, r2_mu=0.0, r2_log_sigma=0.0),
                              requests.truth)
    assert uninformed.mu_r2 == pytest.approx(0.0, abs=1e-12)
    assert uninformed.log_sigma_r2 == pytest.approx(0.0, abs=1e-12)


def test_oracle_estimate_is_unbiased_given_itself(requests):
    # E[mu | mu_hat] = mu_hat: regressing the truth on the prediction gives slope 1, intercept 0
    pred = oracle_predictive(requests.truth, r2_mu=0.6, seed=4)
    slope, intercept = np.polyfit(pred.mu, requests.truth.mu, 1)
    assert slope == pytest.approx(1.0, abs=0.05)
    assert intercept == pytest.approx(0.0, abs=0.2)


@pytest.mark.parametrize("name, kwargs", [("r2_mu", {"r2_mu": 1.2}), ("r2_mu", {"r2_mu": -0.1}),
                                          ("r2_log_sigma", {"r2_log_sigma": 1.01})])
def test_target_r2_outside_unit_interval_raises(requests, name, kwargs):
    with pytest.raises(ValueError, match=rf"{name} must be in \[0, 1\]"):
        oracle_predictive(requests.truth, **kwargs)


def test_synthetic_requests_censoring_and_truth_calibration(requests):
    tr = requests.trace
    assert len(tr) == len(requests.truth) == 10_000
    assert tr.output_tokens.max() <= 512
    np.testing.assert_array_equal(tr.censored, tr.output_tokens == 512)
    assert tr.censored.any()
    # the true distributions are calibrated on their own draws, also under a tight cap where
    # many outputs are censored
    assert np.all(np.abs(calibration_table(requests.truth, tr.output_tokens,
                                           max_new_tokens=512).gap_points) < 2.0)
    capped = np.minimum(tr.output_tokens, 40)
    table = calibration_table(requests.truth, capped, max_new_tokens=40)
    assert np.all(np.abs(table.gap_points) < 2.0)


def test_calibration_quantile_beyond_the_cap_always_fits():
    # median 300 tokens, cap 40: every quantile >= p50 reserves the cap, which always fits
    truth = LogTPredictive(mu=[np.log(300.0)] * 3, sigma=[0.5] * 3, nu=3.5)
    table = calibration_table(truth, [40, 40, 12], max_new_tokens=40, quantiles=[0.5, 0.9])
    assert table.predicted_frac.tolist() == [1.0, 1.0]
    assert table.observed_frac.tolist() == [1.0, 1.0]
    # uncapped, an output of 12 sits under the predicted median of 300 and 40 does too
    table = calibration_table(truth, [40, 40, 12], quantiles=[0.5])
    assert table.observed_frac.tolist() == [1.0]
    assert table.predicted_frac.iloc[0] == pytest.approx(truth.cdf(300)[0])


def test_r2_score_hand_worked():
    # residual sum of squares 1, total sum of squares 2
    assert r2_score([1, 2, 3], [1, 2, 4]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="constant"):
        r2_score([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="same number"):
        r2_score([1, 2, 3], [1, 2])


def test_calibration_bad_inputs(requests):
    truth, out = requests.truth, requests.trace.output_tokens
    with pytest.raises(ValueError, match=r"quantile must be in \(0, 1\)"):
        calibration_table(truth, out, quantiles=[0.5, 1.0])
    with pytest.raises(ValueError, match="exceeds max_new_tokens"):
        calibration_table(truth, out, max_new_tokens=100)
    with pytest.raises(ValueError, match="10000 predictions"):
        calibration_table(truth, out[:10])


def test_holdout_indices_partition():
    train, test = holdout_indices(1000, test_frac=0.2, seed=3)
    assert len(test) == 200 and len(train) == 800
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1000))
    with pytest.raises(ValueError, match="empty split"):
        holdout_indices(3, test_frac=0.01)
