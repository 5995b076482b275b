"""Notebook 07 runs with quick parameters; its answer is the one its own table supports."""
from __future__ import annotations

import math

import pytest


@pytest.mark.notebook
def test_notebook_07_quick(run_notebook, tmp_path):
    res = run_notebook("07_tune_max_new_tokens", {"quick": True, "qps": 4.0})
    for key in ("question", "answer", "what_to_do", "setup", "figures", "claims"):
        assert res[key], key
    table = res["table"]
    load = res["setup"]["load"]
    assert load["num_requests"] == 200 and load["rate_per_s"] == pytest.approx(4.0, rel=0.2)
    assert res["setup"]["system"] == "vllm" and res["setup"]["cost_model"]
    # one answer: the recommended row ties the best capacity, its flags are printed, and its
    # capacity sizes the replicas (several when one replica cannot carry the load)
    chosen = [r for r in table if r["recommended"]]
    assert len(chosen) == 1 and chosen[0]["tie"]
    # a tie: the best does not beat it in every window by more than the search's resolution, so in
    # some window best <= chosen x (1 + rel_tol), and best's lowest window is under chosen's highest x that
    best = max((r for r in table if r["meets_slo_at_load"]), key=lambda r: r["capacity_qps"])
    tol = res["setup"]["capacity_rel_tol"]
    assert chosen[0]["capacity_hi_qps"] * (1 + tol) >= best["capacity_lo_qps"]
    assert f"{chosen[0]['system']}: {chosen[0]['setting']}" == res["chosen"]
    assert "--max-model-len" in res["what_to_do"]
    if res["decision"] == "overloaded":
        assert f"run {chosen[0]['replicas']} replicas of it" in res["answer"]
    else:
        assert chosen[0]["replicas"] == 1
    for r in table:  # ties are read off the intervals, and replicas off the capacity
        assert r["capacity_lo_qps"] <= r["capacity_qps"] <= r["capacity_hi_qps"]
        if r["capacity_qps"] > 0:
            assert r["replicas"] == math.ceil(load["rate_per_s"] / r["capacity_qps"] - 1e-9)
    assert set(res["ties"]) == {f"{r['system']}: {r['setting']}" for r in table if r["tie"]}
    assert res["figures"][0].endswith("-capacity.png") and (tmp_path / res["figures"][0]).exists()
    assert len(res["claims"]) == 3
    assert all(c["kind"] in ("holds", "differs") for c in res["claims"])  # structured, for the summary page
    # which question this page's max_new_tokens answers, against 01's and 02's (values of this run)
    cap, pct = res["context"]["max_new_tokens"], res["percentiles"]
    note = res["max_new_tokens_note"]
    assert note in res["what_to_do"] and f"max_new_tokens={cap:,}" in note
    assert f"({pct['p95']:,} and {pct['p99']:,} tokens on this workload)" in note
