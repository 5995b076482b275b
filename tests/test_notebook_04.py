"""Notebook 04 runs with quick parameters; its numbers obey what must hold whatever the workload."""
from __future__ import annotations

import pytest


@pytest.mark.notebook
def test_notebook_04_quick(run_notebook):
    r = run_notebook("04_reservation_policies", {"quick": True})
    assert r["num_requests"] == 120
    tps, running = r["tokens_per_s_at_max_cap"], r["max_running_at_max_cap"]
    assert set(tps) == {"reserve_max", "orca_oracle", "orca_pow2", "orca_max", "tgi", "vllm", "sglang", "predicted"}
    # Reserving 2048 tokens per request admits fewer requests than reserving the true length,
    # which admits no more than on-demand allocation.
    assert running["reserve_max"] <= running["orca_pow2"] <= running["orca_oracle"] <= running["vllm"]
    assert tps["reserve_max"] < tps["vllm"]
    assert r["capacity_qps"]["orca_max"] < r["capacity_qps"]["vllm"]
    ov = r["overflow"]
    rec = next(v for k, v in ov.items() if k.endswith("recompute"))
    rej = next(v for k, v in ov.items() if k.endswith("reject"))
    assert rec["num_aborted"] == 0 and rej["num_aborted"] > 0
    assert 0 < rec["preempted_request_frac"] <= 0.1  # about the 5% above the p95
    assert [c["claim"][:10] for c in r["claims"]] == ["Throughput", "A large ma", "Preemption",
                                                      "vLLM susta", "vLLM susta"]
