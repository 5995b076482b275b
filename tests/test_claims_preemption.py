"""Notebook 03's claims: Fig. 19 in the paper's own terms, and the ~4,000-token rule as a distribution."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab import preemption_cost as pc
from kvlab.costmodel import roofline
from kvlab.studies import preemption_claims as prc


def test_fig19_swap_side_is_not_testable_and_shows_the_unmeasured_ratio_worked_from_the_cost_functions():
    # OPT-13B on the A100-40GB, vLLM v0 per-layer copies: 2 x 40 layers x pages copies of
    # block x 2 x 5120 x 2 bytes each, at 31.5 GB/s + 5 us; recompute alone by the roofline.
    claims, ratios = prc.fig19_claims(cost_models=["roofline"], block_sizes=[16, 64], min_seq_tokens=512)
    cost = roofline("OPT-13B", "A100-40GB")
    seq = np.arange(512, 2049)
    rec = pc.recompute_s(cost, seq)
    for bs in (16, 64):
        pages = -(-seq // bs)
        swap = 2 * pages * (2 * 40) * (5e-6 + bs * 5120 * 2 / 31.5e9)  # out and back in
        row = ratios[ratios["block_size"] == bs].iloc[0]
        assert row["max_ratio"] == pytest.approx(float((rec / swap).max()), rel=1e-9)
    never = claims.iloc[1]
    assert never["roofline"] == pytest.approx(float(ratios["max_ratio"].max()))
    assert never["kind"] == "not testable" and never["verdict"].startswith("not testable here: host-link copies")
    assert never["metric"].startswith("latency of recomputing vs swapping") and never["read_from"]
    # the recompute bars: the lengths where kvlab's recompute is within the figure's 20-30 ms, from recompute_s
    micro = claims.iloc[0]
    inside = seq[(rec >= 0.02) & (rec <= 0.03)]
    assert micro["kind"] == "not reproducible"
    assert (f"in the figure's 20-30 ms at {inside[0]:,}-{inside[-1]:,} tokens" if inside.size else "at no length") \
        in micro["verdict"]
    assert claims["source_setup"].iloc[0].startswith("OPT-13B on 1 x A100-40GB (TP1-PP1)")


def test_fig19_end_to_end_reads_the_largest_factor_between_the_modes_at_16_to_64():
    e2e = pd.DataFrame({"block_size": [16, 16, 64, 64, 128, 128],
                        "preemption_mode": ["recompute", "swap"] * 3,
                        "normalized_latency_s_per_token": [0.10, 0.12, 0.10, 0.09, 0.1, 1.0],
                        "preemptions_per_request": [0.1] * 6})
    claims, _ = prc.fig19_claims(cost_models=["roofline"], block_sizes=[16, 64, 128], end_to_end=e2e)
    row = claims.iloc[2]
    # 0.12 / 0.10 = 1.2 at 16, 0.10 / 0.09 = 1.11 at 64; block 128 is outside the claim
    assert row["kvlab_value"] == "unmeasured model: 1.2x" and row["kind"] == "not testable"


def test_crossings_fall_in_one_class_each_with_near_ties_apart():
    cat = pd.DataFrame({
        "num_crossings": [0, 0, 5, 1, 1, 1, 1],
        "winner_below": ["recompute", "swap", "recompute", "recompute", "recompute", "swap", "recompute"],
        "crossover_tokens": pd.array([None, None, 3000, 3500, 3900, 4000, 20000], dtype="Int64"),
        # row 3: recompute at best 3% cheaper anywhere -> a near-tie, though it crosses once at 3,500
        "recompute_over_swap_min": [0.5, 1.5, 0.99, 0.97, 0.6, 0.6, 0.6],
        "recompute_over_swap_max": [0.9, 2.0, 1.01, 1.5, 1.6, 1.6, 1.6]})
    got = prc.crossing_classes(cat).set_index("class")["rows"]
    assert got.tolist() == [1, 1, 2, 1, 2] and got.sum() == len(cat)
    assert got["recompute below, swap above, crossing at 2,000-8,000 tokens"] == 1   # row 4 only
    row = prc.preemption_claims("Llama-3-8B", "H200", catalogue=cat)
    assert row["kind"].tolist() == ["reported", "differs"]
    assert row["verdict"].iloc[0].startswith("reported: recompute faster at every length: 1 of 7")
    # Llama-3-8B's context (8,192) is far below where attention passes the linear layers.
    assert row["claim_type"].iloc[1] == "arithmetic"
