"""Fitting the roofline and the host link to measured tables: recovery of known parameters."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvlab import calibrate as cal
from kvlab.costmodel import roofline


def _profile() -> pd.DataFrame:
    # Prefill rows (compute-bound past a few hundred tokens) and decode rows (memory-bound).
    return pd.DataFrame({
        "phase": ["prefill"] * 5 + ["decode"] * 4,
        "tokens": [128, 512, 2048, 4096, 8192, 1, 1, 1, 1],
        "context": [0, 0, 0, 0, 0, 512, 2048, 4096, 8000],
        "batch": [1, 1, 1, 1, 1, 1, 16, 64, 128],
    })


def test_profile_work_by_hand():
    prof = pd.DataFrame({"phase": ["prefill", "decode"], "tokens": [100, 1], "context": [50, 1000],
                         "batch": [2, 8], "seconds": [1.0, 1.0]})
    tokens, pairs, kv, seqs = cal.profile_work(prof)
    assert tokens.tolist() == [200, 8]
    assert pairs.tolist() == [2 * (100 * 50 + 100 * 101 // 2), 8 * 1001]
    assert kv.tolist() == [300, 8008]
    assert seqs.tolist() == [2, 8]


@settings(max_examples=15)
@given(ce=st.floats(0.2, 0.95), be=st.floats(0.3, 0.95), overhead=st.floats(1e-4, 5e-3))
def test_fit_recovers_the_parameters_that_made_the_profile(ce, be, overhead):
    true = roofline("Llama-3-8B", "H200", compute_efficiency=ce, bandwidth_efficiency=be,
                    iteration_overhead_s=overhead)
    prof = _profile()
    prof["seconds"] = true.iteration_s(*cal.profile_work(prof))
    fit = cal.fit_roofline(prof, "Llama-3-8B", "H200")
    assert fit.compute_efficiency == pytest.approx(ce, rel=1e-3)
    assert fit.bandwidth_efficiency == pytest.approx(be, rel=1e-3)
    assert fit.iteration_overhead_s == pytest.approx(overhead, rel=1e-2, abs=1e-6)
    assert fit.rel_rmse < 1e-4


def test_fit_error_reports_noise():
    true = roofline("Llama-2-7B", "A100-80GB-SXM", compute_efficiency=0.5, bandwidth_efficiency=0.75)
    prof = _profile()
    clean = true.iteration_s(*cal.profile_work(prof))
    noise = np.random.default_rng(0).choice([-0.05, 0.05], size=len(prof))
    prof["seconds"] = clean * (1 + noise)
    fit = cal.fit_roofline(prof, "Llama-2-7B", "A100-80GB-SXM")
    # +-5% multiplicative noise: no fit is exact, none should be off by much more than the noise.
    assert 0.01 < fit.rel_rmse < 0.06
    assert fit.table["predicted_s"].to_numpy() == pytest.approx(fit.cost_model.iteration_s(*cal.profile_work(prof)))
    assert fit.compute_efficiency == pytest.approx(0.5, rel=0.1)


def test_link_fit_recovers_latency_and_bandwidth():
    copies = pd.DataFrame({"direction": ["d2h", "h2d"] * 3, "copy_bytes": [16384, 16384, 2**20, 2**20, 2**28, 2**28],
                           "num_copies": [512, 512, 64, 64, 1, 1]})
    copies["seconds"] = copies["num_copies"] * (4e-6 + copies["copy_bytes"] / 50e9)
    fit = cal.fit_host_link(copies)
    assert fit.link_bytes_per_s == pytest.approx(50e9, rel=1e-9)
    assert fit.copy_latency_s == pytest.approx(4e-6, rel=1e-9)
    swap = fit.swap_model("Llama-3-8B", "H200", copy_mode="per_page")
    # 100 tokens at block 16: 7 pages of 16 x 131072 bytes, each way.
    assert swap.swap_s(100, 16)[0] == pytest.approx(2 * 7 * (4e-6 + 16 * 131072 / 50e9))


def test_profile_from_csv(tmp_path):
    true = roofline("Llama-3-8B", "H200")
    prof = _profile()
    prof["seconds"] = true.iteration_s(*cal.profile_work(prof))
    path = tmp_path / "profile.csv"
    prof.to_csv(path, index=False)
    assert cal.fit_roofline(path, "Llama-3-8B", "H200").compute_efficiency == pytest.approx(0.6, rel=1e-3)


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p.drop(columns=["batch", "seconds"]), "lacks the column\\(s\\) 'batch', 'seconds'"),
    (lambda p: p.assign(phase=["prefill"] * 8 + ["chunk"]), "row 8: phase 'chunk'"),
    (lambda p: p.assign(seconds=[1.0] * 3 + [-1.0] + [1.0] * 5), "row 3: seconds must be a positive"),
    (lambda p: p.assign(context=[0] * 5 + [-1, 0, 0, 0]), "row 5: context must be a non-negative"),
    (lambda p: p.assign(tokens=[128, 512, 2048, 4096, 8192, 1, 2, 1, 1]), "row 6: a decode row"),
    (lambda p: p.iloc[:0], "no rows"),
])
def test_malformed_profile(mutate, match):
    prof = _profile().assign(seconds=1.0)
    with pytest.raises(ValueError, match=match):
        cal.fit_roofline(mutate(prof), "Llama-3-8B", "H200")


def test_malformed_copy_tables(tmp_path):
    with pytest.raises(ValueError, match="lacks the column\\(s\\) 'num_copies'"):
        cal.fit_host_link(pd.DataFrame({"direction": ["d2h"], "copy_bytes": [10], "seconds": [1.0]}))
    with pytest.raises(ValueError, match="two copy sizes"):
        cal.fit_host_link(pd.DataFrame({"direction": ["d2h"], "copy_bytes": [10], "num_copies": [1], "seconds": [1.0]}))
    with pytest.raises(ValueError, match="direction 'up'"):
        cal.fit_host_link(pd.DataFrame({"direction": ["up"], "copy_bytes": [10], "num_copies": [1], "seconds": [1.0]}))
    with pytest.raises(ValueError, match="cannot be read"):
        cal.load_copies(tmp_path / "missing.csv")


def test_select_model_rows():
    table = pd.DataFrame({"model": ["Llama-3-8B", "Llama-2-7B"], "x": [1, 2]})
    assert cal.select_model(table, "llama3_8b")["x"].tolist() == [1]
    assert cal.select_model(table.drop(columns=["model"]), "Llama-3-8B")["x"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="no rows of model 'Mistral-7B'"):
        cal.select_model(table, "Mistral-7B")
