"""fit_profile and its pieces on samples drawn from known laws: truncation, censoring, copula."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvlab.lengths import fit_family, fit_profile, read_profile
from kvlab.lengths.families import LogNormalMix2
from kvlab.lengths.profile_fit import mean_matched_profile, normal_scores_correlation, profile_yaml
from kvlab.lengths.profiles import Marginal, Profile


def _lognormal_lengths(n, mu, sigma, seed):
    return np.maximum(np.floor(np.exp(mu + sigma * np.random.default_rng(seed).standard_normal(n)) + 0.5), 1)


def test_truncated_fit_recovers_the_law_a_filter_cut():
    x = _lognormal_lengths(60_000, 5.0, 1.0, seed=1)
    x = x[x <= 300].astype(np.int64)  # a trace that kept only requests up to 300 tokens
    truncated = fit_family(x, "log-normal", upper_tokens=300)
    naive = fit_family(x, "log-normal")
    assert truncated.params["mu"] == pytest.approx(5.0, abs=0.05)
    assert truncated.params["sigma"] == pytest.approx(1.0, abs=0.05)
    assert abs(naive.params["mu"] - 5.0) > 0.3  # ignoring the filter biases the fit low


def test_censored_fit_recovers_the_law_a_cap_clipped():
    x = _lognormal_lengths(40_000, 5.0, 1.0, seed=2)
    censored = x >= 300
    fitted = fit_family(np.minimum(x, 300).astype(np.int64), "log-normal", censored=censored)
    assert fitted.params["mu"] == pytest.approx(5.0, abs=0.03)
    assert fitted.params["sigma"] == pytest.approx(1.0, abs=0.03)


def test_upper_below_the_data_is_refused():
    with pytest.raises(ValueError, match="upper_tokens 10 is below the longest length 50"):
        fit_family(np.arange(1, 51), "log-normal", upper_tokens=10)


def test_mixture_cdf_and_ppf_invert_each_other():
    d = LogNormalMix2(3.0, 0.5, 6.0, 1.0, 0.3)
    q = np.array([1e-6, 0.01, 0.3, 0.5, 0.7, 0.99, 1 - 1e-6])
    np.testing.assert_allclose(d.cdf(d.ppf(q)), q, rtol=1e-9, atol=1e-12)
    x = np.array([5.0, 50.0, 500.0])
    np.testing.assert_allclose(d.cdf(x) + d.sf(x), 1.0)
    # cdf is the weighted sum of the components' log-normal cdfs (closed form).
    want = 0.7 * stats.lognorm.cdf(x, 0.5, scale=np.exp(3.0)) + 0.3 * stats.lognorm.cdf(x, 1.0, scale=np.exp(6.0))
    np.testing.assert_allclose(d.cdf(x), want, rtol=1e-12)


def test_normal_scores_correlation_of_a_gaussian_copula_is_its_rho():
    z = np.random.default_rng(3).standard_normal((2, 50_000))
    z[1] = -0.6 * z[0] + np.sqrt(1 - 0.36) * z[1]
    a, b = np.exp(3 + z[0]), stats.gamma.ppf(stats.norm.cdf(z[1]), 2.0)  # any monotone marginals
    assert normal_scores_correlation(a, b) == pytest.approx(-0.6, abs=0.02)


def _known_profile(rho=0.5, cap=None):
    return Profile(name="known", source="test", copula_rho=rho,
                   prompt=Marginal(family="log-normal", params={"mu": 6.0, "sigma": 0.8}, targets={},
                                   source="test", method="mean-matched"),
                   output=Marginal(family="log-normal", params={"mu": 4.0, "sigma": 1.0}, targets={},
                                   source="test", method="mean-matched", cap_tokens=cap))


def test_fit_profile_recovers_a_known_profile():
    trace = _known_profile(rho=0.5, cap=400).sample(20_000, seed=4)
    assert trace.censored.any()
    prof = fit_profile(trace, name="t", source="synthetic", families=["log-normal", "gamma"], check_requests=20_000)
    assert prof.prompt.family == prof.output.family == "log-normal"
    assert prof.prompt.params["mu"] == pytest.approx(6.0, abs=0.03)
    assert prof.output.params["mu"] == pytest.approx(4.0, abs=0.03)
    assert prof.output.params["sigma"] == pytest.approx(1.0, abs=0.03)
    assert prof.output.cap_tokens == 400 and prof.output.fit["n_censored"] == int(trace.censored.sum())
    assert prof.copula_rho == pytest.approx(0.5, abs=0.03)
    assert prof.output.targets["p50"] == np.percentile(trace.output_tokens, 50)
    assert prof.output.fit["max_relative_error"] < 0.05


def test_fit_profile_with_a_total_filter_redraws_and_tunes_rho(tmp_path):
    raw = _known_profile(rho=-0.7).sample(40_000, seed=6)
    trace = raw[raw.prompt_tokens + raw.output_tokens <= 800].reset_index(drop=True)
    prof = fit_profile(trace, name="t", source="synthetic", families=["log-normal"], max_total_tokens=800,
                       check_requests=20_000)
    assert prof.prompt.upper_tokens == prof.output.upper_tokens == 799
    df = prof.sample(20_000, seed=1)
    assert (df.prompt_tokens + df.output_tokens).max() <= 800
    assert prof.copula_rho < 0
    # The YAML round trip gives the same profile.
    (tmp_path / "t.yaml").write_text(profile_yaml(prof))
    again = read_profile(tmp_path / "t.yaml")
    assert again.sample(500, seed=2).equals(prof.sample(500, seed=2))
    assert again.output.fit == prof.output.fit


def test_mean_matched_profile_hits_the_means():
    prof = mean_matched_profile(name="m", source="s", note="", prompt_mean_tokens=100.0, output_mean_tokens=50.0,
                                prompt_sigma=1.0, output_sigma=0.5, prompt_source="assumed", output_source="assumed",
                                max_total_tokens=400, check_requests=20_000)
    df = prof.sample(20_000, seed=0)  # the seed the means were solved on
    assert df.prompt_tokens.mean() == pytest.approx(100.0, rel=1e-3)
    assert df.output_tokens.mean() == pytest.approx(50.0, rel=1e-3)


@pytest.mark.parametrize("trace, kw, match", [
    (pd.DataFrame({"prompt_tokens": [1, 2]}), {}, "output_tokens"),
    (pd.DataFrame({"prompt_tokens": [10, 20] * 10, "output_tokens": [5, 9] * 10}), {"max_total_tokens": 20},
     "max_total_tokens 20 is below the trace's longest request \\(29 tokens\\)"),
])
def test_fit_profile_bad_input(trace, kw, match):
    with pytest.raises(ValueError, match=match):
        fit_profile(trace, name="x", source="s", families=["log-normal"], **kw)
