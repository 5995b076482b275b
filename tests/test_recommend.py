"""The recipe: percentiles by hand, a workload whose overruns are known, the pick, flags, bad input."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import roofline
from kvlab.recommend import OVERFLOW_MODES, output_percentiles, recipe_claims, recommend, server_flags

ONE_SECOND = dataclasses.replace(
    roofline("Llama-2-7B", "A100-80GB-SXM"), linear_flops_per_token=0.0, attention_flops_per_pair=0.0,
    weight_bytes=0.0, kv_bytes_per_token=0.0, allreduce_bytes_per_token=0.0,
    allreduce_latency_s_per_iteration=0.0, iteration_overhead_s=1.0)

# 90 requests of 8 output tokens and 10 of 40, prompts of 4 tokens, pages of 4 tokens.
# p50 = 8: reserving 4 + 8 = 12 tokens = 3 pages holds the 11-token context that produces the
# 8th token, so exactly the 10 long requests overrun. p95 = 40: nobody overruns.
TRACE = pd.DataFrame({"prompt_tokens": 4, "output_tokens": [8] * 90 + [40] * 10})
SIM = dict(model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=ONE_SECOND, block_size=4, pool_pages=40,
           max_num_batched_tokens=64)


def rec(**kw):
    kw.setdefault("slo_p99_tbt_s", 1e9)
    return recommend(TRACE, percentiles=(50, 95), max_new_tokens=64, **SIM, **kw)


def test_output_percentiles_by_hand():
    # numpy's linear percentile of 1..100: p50 = 50.5, p90 = 90.1, p99 = 99.01; rounded up
    assert output_percentiles(np.arange(1, 101), (50, 90, 99)) == {"p50": 51, "p90": 91, "p99": 100}
    assert output_percentiles(TRACE["output_tokens"], (50, 95)) == {"p50": 8, "p95": 40}


def test_table_counts_the_overruns():
    r = rec()
    t = r.table.set_index(["setting", "overflow"])
    assert len(t) == 1 + 2 * len(OVERFLOW_MODES)
    assert t.loc[("max_new_tokens", "none"), "reserve_tokens"] == 64
    assert t.loc[("p50", "recompute"), "reserve_tokens"] == 8
    for mode in OVERFLOW_MODES:
        assert t.loc[("p50", mode), "preempted_request_frac"] == pytest.approx(0.10)
        assert t.loc[("p95", mode), "preempted_request_frac"] == 0.0
    assert t.loc[("p50", "reject"), "rejected_frac"] == pytest.approx(0.10)
    assert t.loc[("p50", "recompute"), "rejected_frac"] == 0.0
    # the reject row rejects 10% of the requests, more than max_rejected_frac = 0 allows
    assert not t.loc[("p50", "reject"), "meets_slo"]


def test_pick_is_the_best_goodput_that_meets_the_slo():
    r = rec()
    ok = r.table[r.table["meets_slo"]]
    assert r.meets_slo and (ok["rejected_frac"] == 0).all() and len(ok) == len(r.table) - 1  # all but p50 reject
    best = ok["goodput_tokens_per_s"].max()
    chosen = r.table[(r.table["setting"] == r.setting) & (r.table["overflow"] == r.overflow)].iloc[0]
    assert chosen["goodput_tokens_per_s"] == best
    assert r.reserve_tokens == chosen["reserve_tokens"]
    # rejecting 10% is allowed when the SLO allows it
    loose = rec(max_rejected_frac=0.1)
    assert loose.table.set_index(["setting", "overflow"]).loc[("p50", "reject"), "meets_slo"]


def test_no_setting_meets_an_impossible_slo():
    r = rec(slo_p99_tbt_s=1e-9)
    assert not r.meets_slo
    chosen = r.table[(r.table["setting"] == r.setting) & (r.table["overflow"] == r.overflow)].iloc[0]
    assert chosen["tbt_p99_s"] == r.table["tbt_p99_s"].min()
    assert "MISSES" in str(r)


def test_sample_keeps_trace_order_and_size():
    r = recommend(TRACE, slo_p99_tbt_s=1e9, percentiles=(50, 99), modes=("recompute",), max_new_tokens=64,
                  num_requests=50, seed=1, **SIM)
    assert len(r.table) == 3
    assert set(r.percentiles) == {"p50", "p99"}


def test_server_flags():
    f = server_flags(120, "swap", max_new_tokens=200, max_prompt_tokens=100).set_index("system")
    assert list(f.index) == ["vLLM", "TGI", "TensorRT-LLM", "SGLang"]
    assert "--preemption-mode swap" in f.loc["vLLM", "flags"] and f.loc["vLLM", "supported"] == "partly"
    assert "--max-total-tokens 300" in f.loc["TGI", "flags"]  # prompt 100 + cap 200
    assert '"max_new_tokens": 200' in f.loc["vLLM", "flags"]
    assert f.loc["TGI", "supported"] == "no" and f.loc["SGLang", "supported"] == "no"
    rej = server_flags(120, "reject", max_new_tokens=200, max_prompt_tokens=100)
    assert (rej["supported"] == "no").all()
    assert rej["note"].str.contains("max_new_tokens = 120").all()
    none = server_flags(200, "none", max_new_tokens=200, max_prompt_tokens=100).set_index("system")
    assert none.loc["TensorRT-LLM", "supported"] == "yes" and "GUARANTEED_NO_EVICT" in none.loc["TensorRT-LLM", "flags"]


def test_recipe_claims_need_a_lighter_light_workload():
    r = rec()
    with pytest.raises(ValueError, match="percentiles 50 and 99"):
        recipe_claims(r, r, r)
    full = recommend(TRACE, slo_p99_tbt_s=1e9, percentiles=(50, 95, 99), modes=("recompute",), max_new_tokens=64, **SIM)
    with pytest.raises(ValueError, match="must be lighter"):
        recipe_claims(full, full, full)


def test_recipe_claims_values():
    full = recommend(TRACE, slo_p99_tbt_s=1e9, percentiles=(50, 95, 99), modes=("recompute",), max_new_tokens=64, **SIM)
    light_trace = pd.DataFrame({"prompt_tokens": 4, "output_tokens": [8] * 50 + [10] * 50})
    light = recommend(light_trace, slo_p99_tbt_s=1e9, percentiles=(50, 95, 99), modes=("recompute",),
                      max_new_tokens=64, **SIM)
    claims = recipe_claims(full, light, full)
    assert len(claims) == 3
    # at p95 nobody overruns in TRACE: the 5% claim differs by -100%
    assert claims.iloc[2]["kvlab_value"] == "0" and claims.iloc[2]["verdict"].startswith("differs (-100%)")
    assert claims.iloc[0]["kvlab_value"].startswith(light.setting)


def test_bad_input():
    with pytest.raises(ValueError, match="output_tokens"):
        recommend(TRACE.drop(columns="output_tokens"), slo_p99_tbt_s=0.1, **SIM)
    with pytest.raises(ValueError, match="slo_p99_tbt_s"):
        recommend(TRACE, slo_p99_tbt_s=0.0, **SIM)
    with pytest.raises(ValueError, match="percentiles must be in"):
        recommend(TRACE, slo_p99_tbt_s=0.1, percentiles=(50, 100), **SIM)
    with pytest.raises(ValueError, match="modes"):
        recommend(TRACE, slo_p99_tbt_s=0.1, modes=("drop",), **SIM)
    with pytest.raises(ValueError, match="preemption_mode is chosen by recommend"):
        recommend(TRACE, slo_p99_tbt_s=0.1, preemption_mode="swap", **SIM)
    with pytest.raises(ValueError, match="max_rejected_frac"):
        recommend(TRACE, slo_p99_tbt_s=0.1, max_rejected_frac=2.0, **SIM)
    with pytest.raises(ValueError, match="trace must be a pandas DataFrame"):
        recommend([1, 2], slo_p99_tbt_s=0.1, **SIM)
    with pytest.raises(ValueError, match="overflow"):
        server_flags(10, "drop", max_new_tokens=20, max_prompt_tokens=5)
