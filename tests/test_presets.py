"""kvlab.presets: Sarathi-Serve's set-ups as the issue and the paper state them; gains and claims."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.presets import capacity_gains, paper_claims, preset, preset_names

# The paper's set-ups (Sarathi-Serve OSDI'24, issue 7): GPUs, TP, PP, strict/relaxed P99 TBT SLO, gain.
PAPER = {
    "mistral-7b-1xa100": ("Mistral-7B", 1, 1, 0.1, 0.5, 2.6),
    "yi-34b-2xa100-tp2": ("Yi-34B", 2, 1, 0.2, 1.0, 3.7),
    "falcon-180b-8xa100-tp4-pp2": ("Falcon-180B", 4, 2, 1.0, 5.0, 5.6),
}


def test_presets_hold_the_papers_setups():
    assert preset_names() == list(PAPER)
    for name, (model, tp, pp, strict, relaxed, gain) in PAPER.items():
        p = preset(name)
        assert (p.model, p.tp, p.pp, p.num_gpus, p.gpu) == (model, tp, pp, tp * pp, "A100-80GB-PCIe")
        assert (p.slo("strict").tbt_p99_s, p.slo("relaxed").tbt_p99_s) == (strict, relaxed)
        assert p.slo("strict").scheduling_delay_p50_s == 2.0
        assert p.paper_capacity_gain == gain and "Sarathi-Serve" in p.source
        # Falcon-180B spans two 4-GPU nodes (figure-5-6/README.md): its stages talk over the network
        assert p.config().stage_link == ("internode" if pp > 1 else "in-node")


def test_configs_sarathi_budget_per_slo_and_the_vllm_baseline():
    p = preset("yi-34b-2xa100-tp2")
    strict, relaxed = p.config("chunked", "strict"), p.config("chunked", "relaxed")
    assert (strict.max_num_batched_tokens, relaxed.max_num_batched_tokens) == (512, 2048)
    base = p.config("prefill_first", "strict")
    assert base.scheduler == "prefill_first" and base.max_num_seqs == 128 and base.policy == "vllm"
    assert base.max_num_batched_tokens is None  # the simulator's prefill-first default
    assert (base.tp, base.pp, base.model) == (2, 1, "Yi-34B")
    assert p.config("chunked", "strict", policy="reserve_max").policy == "reserve_max"


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="mistral-7b-1xa100, yi-34b-2xa100-tp2, falcon-180b-8xa100-tp4-pp2"):
        preset("llama-70b")
    with pytest.raises(ValueError, match="strict, relaxed"):
        preset("mistral-7b-1xa100").slo("lenient")
    with pytest.raises(ValueError, match="chunked, prefill_first"):
        preset("mistral-7b-1xa100").config("orca")


def _comparison(values):
    rows = []
    for (name, slo, sched), qps in values.items():
        rows.append({"preset": name, "slo": slo, "tbt_slo_s": 0.1, "scheduler": sched, "token_budget_tokens": 512,
                     "capacity_qps": qps, "num_trials": 3, "binding": f"{sched} limit"})
    return pd.DataFrame(rows)


def test_gains_and_claims_take_the_best_slo_and_compute_the_verdict():
    m, y = "mistral-7b-1xa100", "yi-34b-2xa100-tp2"
    table = _comparison({(m, "strict", "chunked"): 2.6, (m, "strict", "prefill_first"): 1.0,
                         (m, "relaxed", "chunked"): 3.0, (m, "relaxed", "prefill_first"): 2.0,
                         (y, "strict", "chunked"): 1.0, (y, "strict", "prefill_first"): 0.5,
                         (y, "relaxed", "chunked"): 1.0, (y, "relaxed", "prefill_first"): 0.0})
    gains = capacity_gains(table).set_index(["preset", "slo"])["gain"]
    assert gains[(m, "strict")] == pytest.approx(2.6) and gains[(m, "relaxed")] == pytest.approx(1.5)
    assert np.isnan(gains[(y, "relaxed")])  # prefill-first at 0: no finite ratio
    claims = paper_claims(table).set_index("kvlab_value")
    assert claims.loc["2.6", "verdict"].startswith("holds")  # 2.6 / 1.0 at the strict SLO
    assert "prefill-first is bound by prefill_first limit" in claims.loc["2.6", "verdict"]
    assert claims.loc["2", "verdict"].startswith("differs (-46%)")  # Yi: 2.0 against 3.7
