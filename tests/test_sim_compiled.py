"""The compiled loop of the fast engine: when it runs, that it equals the reference engine through
its hand-backs (row blocks, re-asked policy answers), and that its cost models price as theirs do."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

import kvlab.sim.fast as fast
from kvlab.costmodel import cost_model, roofline
from kvlab.costmodel.compiled import constants, iteration_s
from kvlab.lengths import profile
from kvlab.policies import Policy, create_policy, policy_class, policy_names

from test_policy_extension import SETUP, CountingRatio, FewestDecodedVictim, HalfHeadroom
from test_sim_fast_equivalence import COST, assert_same, run

MEASURED = [cost_model("Llama-2-7B", "A100-80GB-SXM", source="measured"),
            cost_model("Llama-2-70B", "A100-80GB-SXM", tp=2, source="measured"),
            cost_model("Llama-2-7B", "A100-80GB-SXM", source="measured", stack="sarathi-serve")]


@given(t=st.integers(1, 20_000), extra_pairs=st.integers(0, 10**9), kv=st.integers(0, 10**7), s=st.integers(1, 512))
def test_compiled_cost_equals_the_model(t, extra_pairs, kv, s):
    """The compiled ``iteration_s`` repeats each model's formula: the same float as the model's own."""
    pairs = t * (t + 1) // 2 + extra_pairs
    for model in [COST, roofline("Llama-2-70B", "H100-SXM", tp=4), *MEASURED]:
        kind, consts = constants(model)
        assert iteration_s(kind, consts, t, pairs, kv, s) == pytest.approx(
            float(model.iteration_s(t, pairs, kv, s)), rel=1e-13, abs=0)


def test_models_without_a_compiled_form_keep_the_array_engine():
    """A pipeline has a compiled form now (kvlab.costmodel.compiled); a user's own class does not."""
    pipe = cost_model("Llama-2-7B", "A100-80GB-SXM", pp=2)
    assert constants(pipe) is not None and fast.why_not(create_policy("vllm"), pipe, np) is None

    class Own:
        def iteration_s(self, num_tokens, attention_pairs, kv_tokens, num_seqs=1):
            return 0.01

    assert constants(Own()) is None
    assert "no compiled form" in fast.why_not(create_policy("vllm"), Own(), np)


def test_which_policies_take_the_compiled_loop():
    """Traits decide, and they follow the code: a registered policy runs compiled exactly when its
    class keeps Policy's own can_admit, end_schedule and choose_victim and its queue is FCFS; a test
    policy with its own victim rule or state does not."""
    for name in policy_names():
        cls, pol = policy_class(name), create_policy(name)
        own = [m for m in ("can_admit", "end_schedule", "choose_victim") if getattr(cls, m) is not getattr(Policy, m)]
        assert (fast.why_not(pol, COST, np) is None) == (not own and not pol.orders_queue), (name, own)
    assert fast.why_not(HalfHeadroom(), COST, np) is None
    assert "chooses its own victims" in fast.why_not(FewestDecodedVictim(), COST, np)
    assert "keeps per-iteration state" in fast.why_not(CountingRatio(), COST, np)
    assert fast.why_not(create_policy("vllm"), COST, np) is None
    assert fast.why_not(create_policy("sglang"), COST, np) == (
        "policy sglang admission reads the running requests, keeps per-iteration state: the array engine runs it")
    assert "orders the waiting queue" in fast.why_not(create_policy("predicted", queue_order="tie"), COST, np)


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_a_test_policy_runs_compiled_and_matches_vllm(scheduler, monkeypatch):
    """vLLM's rule retold in a test file takes the compiled loop (a spy) and gives vLLM's tables."""
    calls = []
    compiled = fast.run_compiled

    def spy(**kw):
        calls.append(kw["policy"].name)
        return compiled(**kw)

    monkeypatch.setattr(fast, "run_compiled", spy)
    w = profile("seed-figures").sample(300, seed=3)
    kw = dict(SETUP, scheduler=scheduler, pool_pages=120, arrivals="poisson", qps=20.0, seed=1)
    mine = simulate_fast(w, HalfHeadroom(), **kw)
    assert calls == ["test_half_headroom"]
    assert_same(simulate_fast(w, "vllm", watermark_frac=0.05, **kw), mine)
    assert (mine.requests["num_preemptions"] > 0).any()  # re-asked answers after preemption were needed


def simulate_fast(w, policy, **kw):
    from kvlab.sim import simulate

    return simulate(w, policy, engine="fast", **kw)


@pytest.mark.parametrize("mode", ["recompute", "swap", "reject"])
def test_small_row_buffer_and_reasked_answers_change_nothing(mode, monkeypatch):
    """A row buffer that starts at 7 iterations (doubled when full) and preemptions after tokens
    were generated (the policy asked again): the reference engine's tables."""
    monkeypatch.setattr(fast.compiled, "MIN_ROWS", 7)
    monkeypatch.setattr(fast.compiled, "ROWS_PER_REQUEST", 0)
    asked = []
    ask = fast.compiled._Facts.ask

    def counting(self, ids, gen):
        asked.append(int(np.count_nonzero(gen)))
        ask(self, ids, gen)

    monkeypatch.setattr(fast.compiled._Facts, "ask", counting)
    w = profile("seed-figures").sample(200, seed=5)
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 300)
    kw = {"block_size": 16, "cost_model": COST, "seed": 2, "pool_pages": 90, "arrivals": "poisson", "qps": 40.0,
          "preemption_mode": mode, "cpu_pool_pages": 60}
    for policy in ("vllm", "tgi"):
        ref, mine = run(w, policy, "reference", **kw), run(w, policy, "fast", **kw)
        assert_same(ref, mine)
        assert len(mine.iterations) > 2**7 * 7  # doubled at least 7 times
    if mode != "reject":
        assert sum(asked[1:]) > 0  # answers re-asked for requests that had generated tokens


def test_idle_gaps_between_arrivals():
    """The server idles after the first request until the next two arrive at 50 s (the clock jumps to them):
    the reference engine's tables."""
    w = pd.DataFrame({"prompt_tokens": [4, 9, 3], "output_tokens": [2, 5, 1], "arrival_s": [0.0, 50.0, 50.0]})
    kw = {"block_size": 4, "cost_model": COST, "pool_pages": 8}
    assert_same(run(w, "vllm", "reference", **kw), run(w, "vllm", "fast", **kw))


@pytest.mark.parametrize("block_size", [3, 12])
def test_block_sizes_that_are_not_powers_of_two(block_size):
    """Pages by ceiling division (the compiled loop shifts for powers of two): the reference's tables."""
    w = profile("seed-figures").sample(150, seed=6)
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 200)
    kw = {"block_size": block_size, "cost_model": COST, "seed": 2, "pool_pages": 1800 // block_size,
          "arrivals": "poisson", "qps": 30.0, "max_num_batched_tokens": 4 * block_size * 10, "max_new_tokens": 256}
    for policy in ("vllm", "reserve_max"):
        ref, mine = run(w, policy, "reference", **kw), run(w, policy, "fast", **kw)
        assert_same(ref, mine)
        assert (mine.requests["max_used_pages"] > 0).all()


def test_rows_out_of_arrival_order_are_served_in_arrival_order(fast_loop):
    """Issue 25's two-row case: the second row arrives first. Both loops give the reference's TTFTs
    (each request alone on an idle server: its own prefill, well under 20 ms)."""
    w = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [2, 16], "arrival_s": [0.29, 0.03]})
    kw = dict(model="Llama-3-8B", gpu="H100-SXM")
    from kvlab.sim import simulate
    fast_run = simulate(w, "vllm", **kw)
    ref = simulate(w, "vllm", engine="reference", **kw)
    fast_ttft = fast_run.requests["ttft_s"].to_numpy()
    np.testing.assert_allclose(fast_ttft, ref.requests["ttft_s"].to_numpy(), rtol=1e-12)
    assert (fast_ttft < 0.02).all()
