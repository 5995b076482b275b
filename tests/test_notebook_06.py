"""Notebook 06 runs with quick parameters and its numbers agree with what they summarise."""
from __future__ import annotations

import pytest


@pytest.mark.notebook
def test_notebook_06_quick(run_notebook):
    res = run_notebook("06_length_prediction", {"quick": True})
    # the oracle reaches roughly its target quality on 150 requests
    assert res["mu_r2"] == pytest.approx(0.82, abs=0.1)
    assert res["log_sigma_r2"] == pytest.approx(0.76, abs=0.15)
    trade = res["tradeoff"]
    # a higher quantile reserves more: over-reservation rises and preemptions do not, p50 -> p99
    assert trade["predicted p99"]["over_reserved_frac"] > trade["predicted p50"]["over_reserved_frac"]
    assert trade["predicted p99"]["preemptions_per_request"] <= trade["predicted p50"]["preemptions_per_request"]
    # worst-case reservation never preempts and wastes the most
    assert trade["reserve_max"]["preemptions_per_request"] == 0
    assert trade["reserve_max"]["over_reserved_frac"] == max(r["over_reserved_frac"] for r in trade.values())
    # the quality sweep measured what it targeted at the ends of the grid
    quality = res["quality"]
    assert [(q["r2_target"], q["quantile"]) for q in quality] == [(r2, q) for r2 in (0.0, 1.0)
                                                                  for q in (0.5, 0.75, 0.9, 0.95, 0.99)]
    assert all(q["mu_r2"] == pytest.approx(q["r2_target"], abs=1e-9) for q in quality)
    # along one predictor's curve, reserving a higher quantile over-reserves more
    for r2 in (0.0, 1.0):
        curve = [q["over_reserved_frac"] for q in quality if q["r2_target"] == r2]
        assert curve[-1] > curve[0]
    assert [r["r2_target"] for r in res["preemptions_at_equal_waste"]] == [0.0, 1.0]
    # claims: the TIE ratios are the ones the order table gives
    orders, claims = res["orders"], {c["claim"]: c for c in res["claims"]}
    assert len(claims) == 4
    fcfs_ratio = orders["fcfs"]["normalized_latency_s_per_token"] / orders["tie"]["normalized_latency_s_per_token"]
    tie_fcfs = next(c for name, c in claims.items() if "against FCFS" in name and "latency" in name)
    assert float(tie_fcfs["kvlab_value"]) == pytest.approx(fcfs_ratio, rel=0.01)
