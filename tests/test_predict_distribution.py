"""LogTPredictive: quantiles, capped mean, CVaR and the TIE score against independent computations."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from kvlab.predict import LogTPredictive

NU = 3.5


def _pred():
    return LogTPredictive(mu=[np.log(20.0), 4.0, 5.5, 2.5], sigma=[0.5, 0.8, 1.1, 0.3], nu=NU)


def test_ppf_hand_worked_median_and_p90():
    p = LogTPredictive(mu=[np.log(20.0)], sigma=[0.5], nu=NU)
    # median of T is 0: X median = 20, K = round(20) = 20
    assert p.ppf(0.5).tolist() == [20]
    x90 = 20.0 * np.exp(0.5 * stats.t.ppf(0.9, NU))       # 43.9... tokens on the continuous scale
    assert p.ppf(0.9).tolist() == [int(np.ceil(x90 - 0.5))]
    assert p.ppf(0.9).dtype == np.int64


@settings(max_examples=60)
@given(mu=st.floats(0.0, 7.0), sigma=st.floats(0.05, 2.0), nu=st.floats(1.5, 30.0),
       q=st.floats(0.01, 0.995))
def test_ppf_is_the_smallest_integer_reaching_q(mu, sigma, nu, q):
    p = LogTPredictive(mu=[mu], sigma=[sigma], nu=nu)
    k = int(p.ppf(q)[0])
    def cdf(j: int) -> float:   # P(K <= j) for j >= 1
        return stats.t.cdf((np.log(j + 0.5) - mu) / sigma, nu)
    assert k >= 1 and cdf(k) >= q - 1e-12
    assert k == 1 or cdf(k - 1) < q + 1e-12


def _exact_capped_mean(mu, sigma, nu, cap):
    # E[min(K, c)] = sum_{k<c} P(K > k) with P(K > 0) = 1 and P(K > k) = P(X >= k + 0.5)
    k = np.arange(1, cap)
    return np.array([1.0 + stats.t.sf((np.log(k + 0.5) - m) / s, nu).sum() for m, s in zip(mu, sigma)])


@pytest.mark.parametrize("cap", [2, 16, 512, 4096])
def test_capped_mean_matches_exact_integer_sum(cap):
    # realistic spreads plus lengths known to within a token (1.1 +- 0.1, 37 +- 2 tokens)
    p = LogTPredictive(mu=[*_pred().mu, 0.1, np.log(37.0)], sigma=[*_pred().sigma, 0.1, 0.05], nu=NU)
    exact = _exact_capped_mean(p.mu, p.sigma, NU, cap)
    np.testing.assert_allclose(p.mean(cap), exact, atol=2e-3)


def test_mean_cvar_and_tie_agree_with_monte_carlo():
    p = _pred()
    cap, n_draws = 512, 400_000
    rng = np.random.default_rng(7)
    # independent sampler: scipy's t, rounded to whole tokens, at least one
    x = np.exp(p.mu[:, None] + p.sigma[:, None] * stats.t.rvs(NU, size=(len(p), n_draws), random_state=rng))
    draws = np.minimum(np.maximum(np.floor(x + 0.5), 1), cap)
    mc_mean = draws.mean(axis=1)
    se_mean = draws.std(axis=1) / np.sqrt(n_draws)
    assert np.all(np.abs(p.mean(cap) - mc_mean) < 5 * se_mean + 1e-9)
    tail = np.sort(draws, axis=1)[:, int(0.9 * n_draws):]
    mc_cvar = tail.mean(axis=1)
    se_cvar = tail.std(axis=1) / np.sqrt(tail.shape[1]) + 0.05
    assert np.all(np.abs(p.cvar(0.9, cap) - mc_cvar) < 5 * se_cvar)
    beta = 0.7
    np.testing.assert_allclose(p.tail_inflated_expectation(beta, cap),
                               p.mean(cap) + beta * p.cvar(0.9, cap))
    mc_tie = mc_mean + beta * mc_cvar
    assert np.all(np.abs(p.tail_inflated_expectation(beta, cap) - mc_tie) < 5 * (se_mean + beta * se_cvar))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_cvar_equals_quantile_integral(q):
    # second implementation: (1/(1-q)) int_q^1 ppf_C(u) du by the midpoint rule in u
    p, cap = _pred(), 2048
    u = q + (np.arange(200_000) + 0.5) * (1 - q) / 200_000
    z = stats.t.ppf(u, NU)
    ppf_k = np.maximum(np.ceil(np.exp(p.mu[:, None] + p.sigma[:, None] * z[None, :]) - 0.5), 1)
    ppf_c = np.minimum(ppf_k, cap)
    np.testing.assert_allclose(p.cvar(q, cap), ppf_c.mean(axis=1), rtol=2e-3)


def test_cvar_is_the_cap_when_more_than_the_tail_overruns():
    p = LogTPredictive(mu=[np.log(300.0)], sigma=[1.0], nu=NU)   # P(K >= 64) is about 0.9
    assert p.cvar(0.9, 64).tolist() == [64.0]
    assert p.mean(64)[0] < 64.0


@settings(max_examples=40)
@given(mu=st.floats(0.0, 8.0), sigma=st.floats(0.1, 2.0), cap=st.integers(1, 8192),
       beta=st.floats(0.0, 3.0))
def test_order_mean_le_cvar_le_cap(mu, sigma, cap, beta):
    p = LogTPredictive(mu=[mu], sigma=[sigma], nu=NU)
    m, c = p.mean(cap)[0], p.cvar(0.9, cap)[0]
    assert 0.0 <= m <= c + 1e-6 <= cap + 1e-6
    assert p.tail_inflated_expectation(beta, cap)[0] <= (1 + beta) * cap + 1e-6
    assert p.mean(cap + 1)[0] >= m - 1e-9


def test_every_request_generates_at_least_one_token():
    # median 0.05 tokens: all mass rounds to the minimum count of 1
    p = LogTPredictive(mu=[np.log(0.05)], sigma=[0.2], nu=NU)
    assert p.ppf(0.99).tolist() == [1]
    assert p.cdf(0).tolist() == [0.0] and p.cdf(1)[0] > 0.999
    # 1 plus the heavy tail's small chance of a longer output
    assert p.mean(512)[0] == pytest.approx(_exact_capped_mean(p.mu, p.sigma, NU, 512)[0], abs=1e-3)
    assert 1.0 <= p.mean(512)[0] < 1.01
    assert p.sample(np.random.default_rng(0)).tolist() == [1]


def test_subsetting_and_len():
    p = _pred()
    assert len(p) == 4
    sub = p[[2, 0]]
    assert len(sub) == 2 and sub.mu.tolist() == [p.mu[2], p.mu[0]]
    np.testing.assert_array_equal(p[np.array([True, False, True, False])].ppf(0.9), p.ppf(0.9)[[0, 2]])
    assert len(p[1]) == 1 and p[1].ppf(0.5)[0] == p.ppf(0.5)[1]
    np.testing.assert_allclose(p[1:3].mean(512), p.mean(512)[1:3])
    with pytest.raises(ValueError, match="selects no requests"):
        p[np.zeros(4, dtype=bool)]
    with pytest.raises(ValueError):   # read-only: a predictive cannot be edited in place
        p.mu[0] = 1.0
    same = LogTPredictive(mu=p.mu, sigma=0.5, nu=NU)   # scalar sigma applies to every request
    assert same.sigma.tolist() == [0.5] * 4


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_quantile_outside_open_unit_interval_raises(q):
    with pytest.raises(ValueError, match=r"q must be in \(0, 1\)"):
        _pred().ppf(q)


def test_bad_inputs_name_the_parameter():
    p = _pred()
    with pytest.raises(ValueError, match="max_new_tokens is required"):
        p.mean()
    with pytest.raises(ValueError, match="max_new_tokens"):
        p.mean(0)
    with pytest.raises(ValueError, match="beta"):
        p.tail_inflated_expectation(-1.0, 512)
    with pytest.raises(ValueError, match="sigma must be finite and > 0; request 1"):
        LogTPredictive(mu=[1.0, 2.0], sigma=[0.5, 0.0], nu=NU)
    with pytest.raises(ValueError, match="mu must be finite; request 0"):
        LogTPredictive(mu=[np.nan], sigma=[0.5], nu=NU)
    with pytest.raises(ValueError, match="nu"):
        LogTPredictive(mu=[1.0], sigma=[0.5], nu=-2.0)
