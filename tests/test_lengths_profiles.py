"""Workload profiles: calibration reproduces the targets, samples hit them, the YAML agrees."""
import numpy as np
import pytest
from scipy import stats

from kvlab.lengths import calibrate, list_profiles, profile
from kvlab.lengths.profiles import _percent_key

EXPECTED = {"brief-sharegpt", "azure-2023-conv", "azure-2023-code", "sarathi-sharegpt"}


def test_list_profiles_has_the_issue_profiles():
    assert EXPECTED <= set(list_profiles())


def test_calibrate_lognormal_matches_closed_form():
    # log-normal through (p50, p90): mu = log p50, sigma = log(p90 / p50) / z_0.9.
    p = calibrate({"p50": 100, "p90": 400}, "log-normal")
    assert p["mu"] == pytest.approx(np.log(100), rel=1e-6)
    assert p["sigma"] == pytest.approx(np.log(4) / stats.norm.ppf(0.9), rel=1e-6)


def test_calibrate_recovers_a_known_gengamma():
    true = stats.gengamma(2.0, 0.7, scale=30.0)
    targets = {f"p{int(q * 100)}": float(true.ppf(q)) for q in (0.5, 0.9, 0.99)}
    p = calibrate(targets, "gen-gamma")
    fitted = stats.gengamma(p["a"], p["c"], scale=p["scale_tokens"])
    np.testing.assert_allclose(fitted.ppf([0.5, 0.9, 0.99]), list(targets.values()), rtol=1e-4)


def test_calibrate_refuses_an_impossible_shape():
    # An exponential has p99/p50 = log(100)/log(2) = 6.64 whatever its scale: 10x cannot be matched.
    with pytest.raises(ValueError, match="cannot match"):
        calibrate({"p50": 10, "p99": 100}, "exponential")


@pytest.mark.parametrize("bad, match", [
    ({"p50": 10}, "at least two"),
    ({"p50": 10, "p90": 5}, "increase"),
    ({"p50": 10, "p90": -5}, "targets"),
    ({"p50": 10, "q90": 20}, "percentile key"),
])
def test_calibrate_bad_targets(bad, match):
    with pytest.raises(ValueError, match=match):
        calibrate(bad, "log-normal")


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="brief-sharegpt"):
        profile("no-such-profile")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_file_agrees_with_calibrate_and_samples_hit_targets(name):
    prof = profile(name)
    assert prof.source and prof.prompt.source and prof.output.source
    for marg in (prof.prompt, prof.output):
        again = calibrate(marg.targets, marg.family, upper_tokens=marg.upper_tokens)
        for k, val in again.items():
            assert marg.params[k] == pytest.approx(val, rel=1e-3, abs=1e-6)
    df = prof.sample(100_000, seed=3)
    assert list(df.columns[:2]) == ["prompt_tokens", "output_tokens"]
    assert df.prompt_tokens.dtype == np.int64 and df.output_tokens.dtype == np.int64
    assert (df.prompt_tokens >= 1).all() and (df.output_tokens >= 1).all()
    # The sarathi output is truncated per request at 8192 - prompt, which moves it by ~1.5%;
    # every other marginal is sampled exactly from its calibrated law (sampling error ~1-2%).
    for col, marg in (("prompt_tokens", prof.prompt), ("output_tokens", prof.output)):
        for key, target in marg.targets.items():
            got = np.percentile(df[col], 100 * _percent_key(key))
            assert got == pytest.approx(target, rel=0.04), (col, key)
    if prof.max_total_tokens is not None:
        assert (df.prompt_tokens + df.output_tokens).max() <= prof.max_total_tokens
    if prof.output.cap_tokens is not None:
        assert df.output_tokens.max() <= prof.output.cap_tokens
        assert (df.censored == (df.output_tokens == prof.output.cap_tokens)).all()


def test_brief_profile_is_labelled_and_ratios_match_the_claim():
    prof = profile("brief-sharegpt")
    assert "not measured data" in prof.source
    out = prof.sample(200_000, seed=0).output_tokens
    p50, p90, p99 = np.percentile(out, [50, 90, 99])
    assert p90 / p50 == pytest.approx(4.6, rel=0.05)
    assert p99 / p50 == pytest.approx(10.8, rel=0.05)


def test_sample_is_seeded():
    a = profile("azure-2023-code").sample(1000, seed=7)
    b = profile("azure-2023-code").sample(1000, seed=7)
    c = profile("azure-2023-code").sample(1000, seed=8)
    assert a.equals(b) and not a.equals(c)


def test_sample_rejects_bad_n():
    with pytest.raises(ValueError, match="n must be"):
        profile("brief-sharegpt").sample(0, seed=0)
