"""The model's context in the simulator: prompts that reach it are rejected, outputs are cut at it.

Hand-worked on the 1-second-per-iteration cost model of test_sim_scenarios: iteration k ends at
k + 1 seconds.
"""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab import specs
from kvlab.sim import simulate
from kvlab.sim.context import CONTEXT_REJECT_REASON

from test_sim_scenarios import ONE_SECOND

W = pd.DataFrame({"prompt_tokens": [4, 12, 8, 20], "output_tokens": [3, 5, 10, 2]})


def _run(engine="fast", **kw):
    kw.setdefault("model", "Llama-2-7B")
    return simulate(W, "vllm", gpu="A100-80GB-SXM", cost_model=ONE_SECOND, block_size=4, max_num_batched_tokens=16,
                    pool_pages=100, max_new_tokens=64, engine=engine, record_iterations=True, **kw)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_context_rejects_and_caps_by_hand(engine):
    # max_model_len 12: r0 (4 + 3 = 7) fits; r1's prompt of 12 leaves no room for a token and
    # r3's 20 exceeds it: both rejected on arrival; r2 (prompt 8) may generate 12 - 8 = 4 of
    # its 10 tokens. Iteration 0 prefills r0 (4) and r2 (8) = 12 <= 16 tokens and gives each its
    # first token; r0's 3rd token comes in iteration 2, r2's 4th in iteration 3.
    res = _run(engine, max_model_len=12)
    r = res.requests
    assert r["outcome"].tolist() == ["finished_stopped", "finished_aborted", "finished_length_capped",
                                     "finished_aborted"]
    assert r["finish_reason"].tolist() == ["stop", "abort", "length", "abort"]
    assert r["abort_reason"].tolist() == ["", CONTEXT_REJECT_REASON, "", CONTEXT_REJECT_REASON]
    assert r["generated_tokens"].tolist() == [3, 0, 4, 0]
    assert r["output_tokens"].tolist() == [3, 5, 10, 2]  # the true lengths stay in the table
    assert r["context_capped"].tolist() == [False, False, True, False]
    assert r["first_token_iter"].tolist() == [0, -1, 0, -1]
    assert r["finish_iter"].tolist() == [2, -1, 3, -1]
    np.testing.assert_array_equal(r["e2e_s"], [3.0, np.nan, 4.0, np.nan])
    s = res.summary
    assert (s["num_requests"], s["num_completed"], s["num_aborted"]) == (4, 2, 2)
    assert (s["num_rejected_context"], s["num_length_capped"], s["num_context_capped"]) == (2, 1, 1)
    assert s["tokens_per_s"] == pytest.approx(7 / 4)  # 3 + 4 tokens over 4 one-second iterations
    assert res.params["max_model_len"] == 12


def test_default_context_is_the_models_and_max_model_len_overrides_it():
    small = dataclasses.replace(specs.model("Llama-2-7B"), max_context_tokens=12)
    by_model = _run(model=small)
    assert by_model.requests.equals(_run(max_model_len=12).requests)
    # Llama-2-7B's own 4,096-token context holds every request: nothing rejected or cut.
    full = _run()
    assert full.params["max_model_len"] == 4096
    assert full.summary["num_rejected_context"] == 0 and full.summary["num_context_capped"] == 0
    assert full.requests["generated_tokens"].tolist() == [3, 5, 10, 2]
    # A longer max_model_len than the model's is the caller's to choose (Sarathi-Serve ran 8k).
    assert _run(model=small, max_model_len=64).summary["num_rejected_context"] == 0


def test_a_workload_that_cannot_fit_at_all_is_an_error():
    with pytest.raises(ValueError, match="every request's prompt reaches the model's context"):
        _run(max_model_len=4)
    with pytest.raises(ValueError, match="max_model_len must be a positive integer"):
        _run(max_model_len=0)


def test_orca_max_reserves_the_context_given_to_simulate():
    # Orca (Max) takes max_model_len: simulate passes it on, so the reservation is the context.
    res = simulate(W.iloc[[0]], "orca_max", model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=ONE_SECOND,
                   block_size=4, pool_pages=100, max_model_len=32)
    assert res.requests["max_reserved_pages"].tolist() == [32 // 4]


def test_sarathi_presets_serve_the_papers_8k_context():
    # Sarathi-Serve's chat runs set max_seq_len 8192 (figure-5-6/*.yml), above Falcon-180B's 2,048.
    from kvlab.presets import preset

    cfg = preset("falcon-180b-8xa100-tp4-pp2").config("chunked", "strict")
    assert cfg.max_model_len == 8192 and specs.model(cfg.model).max_context_tokens == 2048
