"""Workload profiles: calibration reproduces the targets, samples hit them, the YAML agrees."""
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from kvlab._paths import SHARED_DATA_DIR
from kvlab.lengths import calibrate, list_profiles, profile
from kvlab.lengths.profile_fit import CHECK_PERCENTILES
from kvlab.lengths.profiles import _percent_key
from kvlab.traces import load

EXPECTED = {"seed-figures", "azure-2023-conv", "azure-2023-code", "sarathi-sharegpt", "arxiv-summarization",
            "vllm-sharegpt", "vllm-alpaca", "lmsys-chat-1m"}


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
    with pytest.raises(ValueError, match="seed-figures"):
        profile("no-such-profile")


CALIBRATED = sorted(n for n in list_profiles() if profile(n).output.method == "calibrated")
FITTED = sorted(n for n in list_profiles() if profile(n).output.method == "fitted")
MEAN_MATCHED = sorted(n for n in list_profiles() if profile(n).output.method == "mean-matched")


@pytest.mark.parametrize("name", CALIBRATED)
def test_calibrated_profile_agrees_with_calibrate_and_samples_hit_targets(name):
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
    # Each marginal is sampled exactly from its calibrated law (sampling error ~1-2%).
    for col, marg in (("prompt_tokens", prof.prompt), ("output_tokens", prof.output)):
        for key, target in marg.targets.items():
            got = np.percentile(df[col], 100 * _percent_key(key))
            assert got == pytest.approx(target, rel=0.04), (col, key)


@pytest.mark.parametrize("name", FITTED + MEAN_MATCHED)
def test_every_profile_respects_its_bounds(name):
    prof = profile(name)
    df = prof.sample(50_000, seed=5)
    assert (df.prompt_tokens >= 1).all() and (df.output_tokens >= 1).all()
    if prof.max_total_tokens is not None:
        assert (df.prompt_tokens + df.output_tokens).max() <= prof.max_total_tokens
    for col, marg in (("prompt_tokens", prof.prompt), ("output_tokens", prof.output)):
        for bound in (marg.upper_tokens, marg.cap_tokens):
            if bound is not None:
                assert df[col].max() <= bound
    if prof.output.cap_tokens is not None:
        assert (df.censored == (df.output_tokens == prof.output.cap_tokens)).all()


@pytest.mark.parametrize("name", MEAN_MATCHED)
def test_mean_matched_profiles_reproduce_the_published_means(name):
    prof = profile(name)
    df = prof.sample(200_000, seed=11)  # another seed than the one the means were solved on
    for col, marg in (("prompt_tokens", prof.prompt), ("output_tokens", prof.output)):
        assert df[col].mean() == pytest.approx(marg.mean_tokens, rel=0.01), col
        assert "assumed" in marg.source


def test_published_means_of_the_papers_profiles():
    # vLLM (SOSP'23): ShareGPT 161 in / 338 out, Alpaca 19.3 / 58.5 (8.4x and 5.8x shorter);
    # LMSYS-Chat-1M (arXiv 2309.11998, Table 1): 69.5 per prompt, 214.5 per response.
    want = {"vllm-sharegpt": (161, 338), "vllm-alpaca": (19.3, 58.5), "lmsys-chat-1m": (69.5, 214.5)}
    for name, (p, o) in want.items():
        assert (profile(name).prompt.mean_tokens, profile(name).output.mean_tokens) == (p, o)


#: A shipped trace fit's sampled p10/p50/p90/p99 lie within this relative distance of the trace's
#: own (the worst, Azure code's output p99, is 20% short: 201 vs 251 tokens), and its means within
#: MEAN_RTOL.
FIT_RTOL = 0.25
MEAN_RTOL = 0.06


@pytest.mark.parametrize("name", FITTED)
def test_fitted_profile_reproduces_its_trace(name):
    prof = profile(name)
    path = SHARED_DATA_DIR / "traces" / Path(prof.trace).name
    if not path.is_file():
        pytest.skip(f"trace {path} not present (../shared/data)")
    trace = load(path)
    df = prof.sample(200_000, seed=13)
    for col, marg in (("prompt_tokens", prof.prompt), ("output_tokens", prof.output)):
        emp = np.percentile(trace[col], CHECK_PERCENTILES)
        # The file's targets are the trace's percentiles (a prompt cap clamps the trace first).
        clamped = trace[col].clip(upper=marg.cap_tokens) if marg.cap_tokens else trace[col]
        np.testing.assert_allclose([marg.targets[f"p{q}"] for q in CHECK_PERCENTILES],
                                   np.percentile(clamped, CHECK_PERCENTILES), atol=0.05)
        got = np.percentile(df[col], CHECK_PERCENTILES)
        np.testing.assert_allclose(got, emp, rtol=FIT_RTOL, err_msg=f"{name} {col}")
        assert df[col].mean() == pytest.approx(trace[col].mean(), rel=MEAN_RTOL), (name, col)


def test_brief_profile_is_labelled_and_ratios_match_the_claim():
    prof = profile("seed-figures")
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
        profile("seed-figures").sample(0, seed=0)
