"""Log-t regression: recovers known coefficients, is calibrated on held-out data, rejects bad traces."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvlab.predict import calibration_table, fit_logt_regression, holdout_indices

MU_COEF = np.array([1.0, 3e-4, 0.35, 0.2])          # intercept, prompt, log prompt, f
LOG_SIGMA_COEF = np.array([np.log(0.6), 0.0, -0.05, 0.1])
NU_TRUE, CAP = 4.0, 300


def _trace(n: int, seed: int) -> pd.DataFrame:
    """Draw lengths from the model with scipy.stats.t (independent of kvlab's sampler)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(5, 4000, n)
    f = rng.normal(size=n)
    x = np.column_stack([np.ones(n), prompt, np.log(prompt), f])
    length = np.exp(x @ MU_COEF + np.exp(x @ LOG_SIGMA_COEF)
                    * stats.t.rvs(NU_TRUE, size=n, random_state=rng))
    k = np.maximum(np.floor(length + 0.5), 1)
    return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": np.minimum(k, CAP).astype(int),
                         "censored": k >= CAP, "f": f})


@pytest.fixture(scope="module")
def trace() -> pd.DataFrame:
    return _trace(16_000, seed=3)


@pytest.fixture(scope="module")
def split(trace):
    train, test = holdout_indices(len(trace), test_frac=0.25, seed=1)
    return fit_logt_regression(trace.iloc[train], extra_features=["f"]), trace.iloc[test]


def test_recovers_known_coefficients_within_four_standard_errors(split):
    fit, _ = split
    assert fit.converged and fit.num_censored > 0
    assert fit.feature_names == ("intercept", "prompt_tokens", "log_prompt_tokens", "f")
    for est, se, true in ((fit.mu_coef, fit.mu_stderr, MU_COEF),
                          (fit.log_sigma_coef, fit.log_sigma_stderr, LOG_SIGMA_COEF)):
        assert np.all(np.isfinite(se)) and np.all(se > 0)
        assert np.all(np.abs(est - true) < 4 * se), (est, se, true)
    assert abs(fit.nu - NU_TRUE) < 4 * fit.nu_stderr
    # the standard errors are informative, not inflated: the key slopes are pinned down
    assert fit.mu_stderr[3] < 0.01 and fit.log_sigma_stderr[3] < 0.02


def test_nll_is_the_independent_interval_censored_likelihood_at_its_minimum(trace, split):
    fit, _ = split
    train = trace.iloc[holdout_indices(len(trace), test_frac=0.25, seed=1)[0]]

    def nll(mu_coef, log_sigma_coef, nu):
        x = np.column_stack([np.ones(len(train)), train.prompt_tokens, np.log(train.prompt_tokens), train.f])
        mu, s = x @ mu_coef, np.exp(x @ log_sigma_coef)
        k = train.output_tokens.to_numpy()
        lo = np.where(k >= 2, stats.t.cdf((np.log(np.maximum(k, 2) - 0.5) - mu) / s, nu), 0.0)
        hi = np.where(train.censored, 1.0, stats.t.cdf((np.log(k + 0.5) - mu) / s, nu))
        return -np.sum(np.log(hi - lo))

    at_fit = nll(fit.mu_coef, fit.log_sigma_coef, fit.nu)
    assert at_fit == pytest.approx(fit.nll, rel=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(5):   # a maximum: every nearby point is worse
        d = rng.normal(size=8) * np.concatenate([fit.mu_stderr, fit.log_sigma_stderr])
        assert nll(fit.mu_coef + d[:4], fit.log_sigma_coef + d[4:], fit.nu) > at_fit


def test_held_out_quantiles_calibrated_within_two_points(split):
    fit, test = split
    table = calibration_table(fit.predict(test), test.output_tokens, max_new_tokens=CAP)
    assert table.q.tolist() == [0.5, 0.75, 0.9, 0.95, 0.99]
    assert np.all(np.abs(table.gap_points) < 2.0), table


def test_fixed_nu():
    tr = _trace(4000, seed=5)
    fit = fit_logt_regression(tr, extra_features=["f"], nu=3.5)
    assert fit.nu_fixed and fit.nu == 3.5 and np.isnan(fit.nu_stderr)
    assert set(fit.coef_table().parameter) == {"mu", "log_sigma", "nu"}
    assert "4000 requests" in str(fit)


def test_missing_feature_columns_are_all_named(trace):
    with pytest.raises(ValueError, match=r"'f', 'g'"):
        fit_logt_regression(trace.drop(columns="f"), extra_features=["f", "g"])
    fit = fit_logt_regression(trace.iloc[:2000], extra_features=["f"], nu=3.5)
    with pytest.raises(ValueError, match=r"lacks the column\(s\) 'f'"):
        fit.predict(trace.drop(columns="f"))
    with pytest.raises(ValueError, match="'output_tokens'"):
        fit_logt_regression(trace.drop(columns="output_tokens"))
    with pytest.raises(ValueError, match="'prompt_tokens'"):
        fit_logt_regression(trace.drop(columns="prompt_tokens"))


def test_bad_values_name_the_column_and_row(trace):
    bad = trace.iloc[:500].copy()
    bad.loc[bad.index[7], "f"] = np.nan
    with pytest.raises(ValueError, match=r"'f' must be finite; row 7"):
        fit_logt_regression(bad, extra_features=["f"])
    bad = trace.iloc[:500].copy()
    bad.loc[bad.index[3], "prompt_tokens"] = 0
    with pytest.raises(ValueError, match=r"prompt_tokens must be integers >= 1; row 3"):
        fit_logt_regression(bad)
    const = trace.iloc[:500].assign(g=1.0)
    with pytest.raises(ValueError, match="'g' is constant"):
        fit_logt_regression(const, extra_features=["g"])
    with pytest.raises(ValueError, match="output_tokens"):
        fit_logt_regression(trace.iloc[:500].assign(output_tokens=0))
    with pytest.raises(ValueError, match="censored"):
        fit_logt_regression(trace.iloc[:500].assign(censored="yes"))
    with pytest.raises(ValueError, match="rows"):
        fit_logt_regression(trace.iloc[:5])
    with pytest.raises(ValueError, match="sequence of column names"):
        fit_logt_regression(trace, extra_features="f")
    with pytest.raises(ValueError, match="distinct columns"):
        fit_logt_regression(trace, extra_features=["prompt_tokens"])
