"""Notebook 07 runs with quick parameters; its recommendation is the one its own table supports."""
from __future__ import annotations

import pytest


@pytest.mark.notebook
def test_notebook_07_quick(run_notebook):
    res = run_notebook("07_tune_max_new_tokens", {"quick": True, "slo_p99_tbt_s": 0.1})
    table = res["table"]
    assert res["num_requests"] == 120
    # one reserve-to-max row plus every percentile x overflow mode
    assert len(table) == 1 + 4 * 3
    assert res["percentiles"]["p50"] <= res["percentiles"]["p95"] <= res["percentiles"]["p99"]
    ok = [r for r in table if r["meets_slo"]]
    chosen = next(r for r in table if r["setting"] == res["setting"] and r["overflow"] == res["overflow"])
    if ok:  # the best goodput among the settings that meet the SLO
        assert res["meets_slo"] and chosen["goodput_tokens_per_s"] == max(r["goodput_tokens_per_s"] for r in ok)
        assert chosen["tbt_p99_s"] <= 0.1 and chosen["rejected_frac"] == 0.0
    else:  # none meets it: the closest to the SLO, and the result says so
        assert not res["meets_slo"] and chosen["tbt_p99_s"] == min(r["tbt_p99_s"] for r in table)
    assert {f["system"] for f in res["flags"]} == {"vLLM", "TGI", "TensorRT-LLM", "SGLang"}
    # the light profile's tail is lighter than the heavy one's, as the recipe check requires
    light, heavy = res["light"]["percentiles"], res["heavy"]["percentiles"]
    assert light["p99"] / light["p50"] < heavy["p99"] / heavy["p50"]
    assert len(res["claims"]) == 3
