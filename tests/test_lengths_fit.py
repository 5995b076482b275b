"""Length fits: log-t, interval/censored likelihood, recovery, ranking, bootstrap, bad input."""
import numpy as np
import pytest
from scipy import stats

from kvlab.lengths import LogT
from kvlab.lengths.fit import FittedLength, fit, fit_family, percentile_ci, percentiles


def _round(x):
    return np.maximum(np.rint(x), 1).astype(np.int64)


def test_percentiles_hand_worked():
    s = percentiles(np.arange(1, 101))
    # numpy linear interpolation on 1..100: p = 1 + 0.99 q.
    assert s["p50"] == pytest.approx(50.5) and s["p90"] == pytest.approx(90.1)
    assert s["p99"] == pytest.approx(99.01) and s["max"] == 100 and s["mean"] == pytest.approx(50.5)
    assert s["p90_over_p50"] == pytest.approx(90.1 / 50.5)


def test_logt_matches_student_t_on_log_scale():
    d = LogT(mu=2.0, sigma=0.5, nu=3.0)
    x = np.array([1.0, 5.0, 20.0, 300.0])
    np.testing.assert_allclose(d.cdf(x), stats.t.cdf((np.log(x) - 2.0) / 0.5, 3.0))
    np.testing.assert_allclose(d.cdf(d.ppf([0.1, 0.5, 0.99])), [0.1, 0.5, 0.99])
    np.testing.assert_allclose(d.cdf(x) + d.sf(x), 1.0)
    # density integrates to the cdf
    from scipy.integrate import quad
    assert quad(lambda t: np.exp(d.logpdf(t)), 1.0, 20.0)[0] == pytest.approx(d.cdf(20.0) - d.cdf(1.0), rel=1e-6)
    # nu -> infinity is the log-normal
    big = LogT(mu=2.0, sigma=0.5, nu=1e7)
    np.testing.assert_allclose(big.cdf(x), stats.lognorm(0.5, scale=np.exp(2.0)).cdf(x), atol=1e-6)


def test_logt_rejects_bad_parameters():
    with pytest.raises(ValueError, match="sigma"):
        LogT(mu=1.0, sigma=0.0, nu=2.0)
    with pytest.raises(ValueError, match="nu"):
        LogT(mu=1.0, sigma=1.0, nu=-1.0)


def test_logt_recovered_from_its_own_sample():
    true = LogT(mu=np.log(21.0), sigma=0.9, nu=6.0)
    x = _round(true.rvs(200_000, np.random.default_rng(1)))
    f = fit_family(x, "log-t")
    assert f.params["mu"] == pytest.approx(np.log(21.0), abs=0.01)
    assert f.params["sigma"] == pytest.approx(0.9, rel=0.03)
    assert f.params["nu"] == pytest.approx(6.0, rel=0.2)


def test_censored_fit_recovers_naive_fit_is_biased():
    true = LogT(mu=np.log(60.0), sigma=0.8, nu=8.0)
    x = _round(true.rvs(100_000, np.random.default_rng(2)))
    cap = 120  # about 80% of requests finish below it
    capped = np.minimum(x, cap)
    cens = x >= cap
    assert 0.1 < cens.mean() < 0.3
    good = fit_family(capped, "log-t", censored=cens)
    naive = fit_family(capped, "log-t")
    assert good.n_censored == cens.sum() and naive.n_censored == 0
    assert good.params["mu"] == pytest.approx(np.log(60.0), abs=0.02)
    assert good.params["sigma"] == pytest.approx(0.8, rel=0.05)
    # The naive fit treats cap-hitters as finished at the cap: it shrinks the tail.
    assert naive.params["sigma"] < 0.8 * 0.9 or naive.params["nu"] < 8.0 * 0.5
    assert naive.ppf(0.99) < 0.8 * true.ppf(0.99) < good.ppf(0.99) * 1.2
    assert abs(good.ppf(0.99) / true.ppf(0.99) - 1) < 0.1


def test_same_maximum_as_scipy_censoreddata():
    # Second implementation: scipy's own fit on the same interval/right-censored data.
    rng = np.random.default_rng(3)
    x = _round(stats.lognorm(0.7, scale=40.0).rvs(400, random_state=rng))
    cap = 90
    cens = x >= cap
    x = np.minimum(x, cap)
    unc = x[~cens]
    lo = np.where(unc == 1, 0.0, unc - 0.5)
    data = stats.CensoredData(interval=np.column_stack([lo, unc + 0.5]), right=x[cens] - 0.5)
    s, _, scale = stats.lognorm.fit(data, floc=0)
    ours = fit_family(x, "log-normal", censored=cens)
    assert ours.params["sigma"] == pytest.approx(s, rel=2e-3)
    assert ours.params["mu"] == pytest.approx(np.log(scale), abs=2e-3)
    d = stats.lognorm(s, scale=scale)  # the log-likelihood written out per observation
    ll_scipy = np.log(d.cdf(unc + 0.5) - d.cdf(lo)).sum() + d.logsf(x[cens] - 0.5).sum()
    assert ours.loglik == pytest.approx(ll_scipy, abs=1e-3)
    assert ours.loglik >= ll_scipy - 1e-6


def test_fit_table_ranks_by_aic_and_reports_consistent_columns():
    x = _round(stats.lognorm(1.0, scale=30.0).rvs(20_000, random_state=np.random.default_rng(4)))
    table = fit(x)
    assert set(table.family) == {"log-t", "log-normal", "gamma", "weibull", "log-logistic", "exponential"}
    assert table.aic.is_monotonic_increasing and table.delta_aic.iloc[0] == 0
    assert table.family.iloc[0] in {"log-normal", "log-t"}  # the true family (or its superset) wins
    np.testing.assert_allclose(table.aic, 2 * table.num_params - 2 * table.loglik)
    row = table.set_index("family").loc["log-normal"]
    assert row.p50_emp == np.percentile(x, 50)
    assert row.ks < 0.01 < table.set_index("family").loc["exponential"].ks
    assert isinstance(row.fitted, FittedLength) and row.fitted.loglik == row.loglik


def test_fitted_cdf_ppf_sample_agree():
    f = fit_family(_round(stats.gamma(2.0, scale=20).rvs(5000, random_state=np.random.default_rng(5))), "gamma")
    k = np.arange(1, 400)
    q = f.cdf(k)
    assert np.all(np.diff(q) >= 0)
    # ppf is the smallest k with cdf(k) >= q
    np.testing.assert_array_equal(f.ppf(q[5:300] - 1e-12), k[5:300])
    draws = f.sample(200_000, seed=0)
    assert draws.dtype == np.int64 and draws.min() >= 1
    assert np.mean(draws <= 50) == pytest.approx(float(f.cdf(50)), abs=0.005)
    np.testing.assert_array_equal(draws, f.sample(200_000, seed=0))
    assert "gamma" in str(f) and "loglik" in str(f)


def test_percentile_ci_brackets_truth():
    true = stats.lognorm(1.0, scale=50.0)
    x = _round(true.rvs(5000, random_state=np.random.default_rng(6)))
    ci = percentile_ci(x, q=(50, 90), n_resamples=400, seed=1)
    assert list(ci.percentile) == [50, 90]
    assert np.all(ci.low_tokens <= ci.tokens) and np.all(ci.tokens <= ci.high_tokens)
    for q, lo, hi in zip((0.5, 0.9), ci.low_tokens, ci.high_tokens):
        assert lo - 1 <= true.ppf(q) <= hi + 1
    with pytest.raises(ValueError, match="q must"):
        percentile_ci(x, q=(0, 50))


@pytest.mark.parametrize("x, censored, match", [
    (np.arange(1, 10), None, "at least 10"),
    (np.full(50, 7), None, "vary"),
    (np.r_[np.arange(1, 20), 0], None, "element 19 is 0"),
    (np.r_[np.arange(1, 20), -3], None, "element 19"),
    (np.r_[np.arange(1, 20.0), np.nan], None, "element 19"),
    (np.arange(1, 30), np.zeros(5, dtype=bool), "censored must"),
    (np.arange(1, 30), np.r_[np.zeros(20, bool), np.ones(9, bool)] * 1, "censored must"),
    (np.arange(1, 30), np.r_[np.zeros(5, bool), np.ones(24, bool)], "at least 10 uncensored"),
])
def test_fit_bad_input(x, censored, match):
    with pytest.raises(ValueError, match=match):
        fit(x, censored=censored)


def test_fit_unknown_family():
    with pytest.raises(ValueError, match="log-t"):
        fit(np.arange(1, 50), families=["pareto"])
    # one family named as a plain string is that family, not its letters
    assert fit(np.arange(1, 50), families="gamma")["family"].tolist() == ["gamma"]


def test_ks_statistic_hand_worked():
    from kvlab.lengths.fit import ks_statistic
    # Exponential with scale 2: F(k + 0.5) = 1 - exp(-(k + 0.5) / 2).
    f = FittedLength(family="exponential", params={"scale_tokens": 2.0}, loglik=0.0, n=4, n_censored=0)
    x = np.array([1, 1, 2, 5])
    ecdf = {1: 0.5, 2: 0.75, 5: 1.0}
    want = max(abs(e - (1 - np.exp(-(k + 0.5) / 2))) for k, e in ecdf.items())
    assert ks_statistic(f, x, np.zeros(4, bool)) == pytest.approx(want)
    # Censoring at 5: only values below 5 are compared.
    want_c = max(abs(e - (1 - np.exp(-(k + 0.5) / 2))) for k, e in ecdf.items() if k < 5)
    assert ks_statistic(f, x, x >= 5) == pytest.approx(want_c)
