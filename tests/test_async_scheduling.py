"""Async scheduling (vLLM V1's default since v0.14.0): hand-worked schedules on both engines, and
the fast engine against the reference on the equivalence suite's random cases with it on."""
import numpy as np
import pandas as pd
import pytest

from kvlab.sim import simulate

from test_sim_fast_equivalence import NUM_CASES, assert_same, random_case, run


class OneSecond:
    """Every iteration takes 1 s (so the schedule can be worked by hand)."""

    label = "1 s per iteration"

    def iteration_s(self, num_tokens, attention_pairs, kv_tokens, num_seqs=1):
        return 1.0


def _serve(w, engine, async_scheduling, **kw):
    return simulate(w, "vllm", model="Llama-2-7B", gpu="A100-80GB-SXM", engine=engine, cost_model=OneSecond(),
                    max_new_tokens=16, async_scheduling=async_scheduling, **kw).requests.set_index("request_id")


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_an_arrival_during_a_busy_iteration_waits_one_more(engine, fast_loop):
    # A (4 + 3 tokens) at 0 s; B (4 + 1) at 0.5 s, during A's prefill [0, 1).
    # Without async: B joins iteration 1 ([1, 2)): first token at 2 s, TTFT 1.5 s.
    # Async: iteration 1 was scheduled at 0 s, before B arrived; B joins iteration 2 ([2, 3)): TTFT 2.5 s.
    w = pd.DataFrame({"request_id": ["A", "B"], "arrival_s": [0.0, 0.5], "prompt_tokens": [4, 4],
                      "output_tokens": [3, 1]})
    sync, lag = _serve(w, engine, False), _serve(w, engine, True)
    assert sync.loc["B", "ttft_s"] == 1.5 and lag.loc["B", "ttft_s"] == 2.5
    assert sync.loc["A", "e2e_s"] == lag.loc["A", "e2e_s"] == 3.0  # A's own tokens stream as before


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_a_finished_request_holds_its_slot_through_the_next_schedule(engine, fast_loop):
    # max_num_seqs 2: A (4 + 2) and C (4 + 5) run, B (4 + 1) waits, all at 0 s. A's last token
    # ends iteration 1 at 2 s. Without async B takes A's slot in iteration 2 (token at 3 s); async,
    # iteration 2 was scheduled at 1 s with A still running, so B waits for iteration 3 (token at 4 s).
    w = pd.DataFrame({"request_id": ["A", "C", "B"], "arrival_s": [0.0, 0.0, 0.0], "prompt_tokens": [4, 4, 4],
                      "output_tokens": [2, 5, 1]})
    sync, lag = _serve(w, engine, False, max_num_seqs=2), _serve(w, engine, True, max_num_seqs=2)
    assert sync.loc["B", "ttft_s"] == 3.0 and lag.loc["B", "ttft_s"] == 4.0


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_an_idle_engine_schedules_at_once(engine, fast_loop):
    # Requests far apart: the engine is idle at each arrival, so async changes nothing; with one
    # slot, B waits for A (nothing else runs, so vLLM schedules B after A's outputs: no lag either).
    w = pd.DataFrame({"request_id": ["A", "B", "D"], "arrival_s": [0.0, 0.2, 50.0], "prompt_tokens": [4, 4, 4],
                      "output_tokens": [2, 2, 2]})
    sync, lag = _serve(w, engine, False, max_num_seqs=1), _serve(w, engine, True, max_num_seqs=1)
    pd.testing.assert_frame_equal(sync[["ttft_s", "e2e_s"]], lag[["ttft_s", "e2e_s"]])


@pytest.mark.parametrize("block", range(NUM_CASES // 40))
def test_fast_equals_reference_under_async_scheduling(block, fast_loop):
    for seed in range(block * 20, block * 20 + 20):
        w, policy, kw = random_case(seed)
        assert_same(run(w, policy, "reference", async_scheduling=True, **kw),
                    run(w, policy, "fast", async_scheduling=True, **kw))


def test_async_scheduling_must_be_a_bool():
    w = pd.DataFrame({"prompt_tokens": [4], "output_tokens": [2]})
    with pytest.raises(ValueError, match="async_scheduling must be True or False"):
        simulate(w, "vllm", model="Llama-2-7B", gpu="A100-80GB-SXM", async_scheduling="yes")
    assert np.isfinite(simulate(w, "vllm", model="Llama-2-7B", gpu="A100-80GB-SXM",
                                async_scheduling=True).requests["e2e_s"].iloc[0])
