"""The compiled loop: every policy runs there, it equals the reference engine through its hand-backs
(row blocks, re-asked facts, rules and latencies asked of Python), and its cost models price as theirs do."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

import kvlab.sim.fast as fast
from kvlab.costmodel import cost_model, roofline
from kvlab.costmodel.compiled import constants, iteration_s
from kvlab.lengths import profile
from kvlab.policies import create_policy, policy_names

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


def test_a_pipeline_has_a_compiled_form():
    """A pipeline cost model is priced inside the loop (kvlab.costmodel.compiled), not asked."""
    pipe = cost_model("Llama-2-7B", "A100-80GB-SXM", pp=2)
    assert constants(pipe) is not None and fast.why_not(create_policy("vllm"), pipe) is None


class _TwiceAsSlow:
    """A user's cost model kvlab has no compiled form of: the roofline's latency, doubled."""

    def iteration_s(self, num_tokens, attention_pairs, kv_tokens, num_seqs):
        return 2.0 * float(COST.iteration_s(num_tokens, attention_pairs, kv_tokens, num_seqs))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_model_without_a_compiled_form_is_asked_per_iteration(mode):
    """A cost model with no compiled form: the loop asks its ``iteration_s``, and why_not says so."""
    slow = _TwiceAsSlow()
    assert constants(slow) is None
    assert fast.why_not(create_policy("vllm"), slow) == "no compiled form: iteration_s of _TwiceAsSlow asked per question"
    w = profile("seed-figures").sample(120, seed=7)
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 300)
    kw = {"block_size": 16, "cost_model": slow, "pool_pages": 90, "arrivals": "poisson", "qps": 20.0,
          "preemption_mode": mode, "cpu_pool_pages": 30}
    ref, mine = run(w, "vllm", "reference", **kw), run(w, "vllm", "fast", **kw)
    assert_same(ref, mine)
    assert (mine.requests["num_preemptions"] > 0).any()


def test_nothing_built_in_is_asked():
    """Every registered policy (with every queue order) and the default cost models run on compiled
    forms only; a test policy is asked exactly the rules it writes itself."""
    for name in policy_names():
        assert fast.why_not(create_policy(name), COST) is None, name
    for order in ("shortest_predicted", "tie"):
        assert fast.why_not(create_policy("predicted", queue_order=order), COST) is None
    for model in MEASURED:
        assert fast.why_not(create_policy("vllm"), model) is None
    assert fast.why_not(HalfHeadroom(), COST) is None
    assert fast.why_not(FewestDecodedVictim(), COST) == "no compiled form: choose_victim asked per question"
    assert fast.why_not(CountingRatio(), COST) == "no compiled form: can_admit, end_schedule asked per question"


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_every_policy_takes_the_compiled_loop(scheduler, monkeypatch):
    """A spy on the loop: every registered policy and the test-defined ones run through it, and equal the
    reference; SGLang with its compiled form asks Python nothing but its ratio after a preemption."""
    calls, asked = [], []
    run_loop, answer = fast.compiled.run_compiled, fast.compiled._Asker.answer

    def spy(**kw):
        calls.append(kw["policy"].name)
        return run_loop(**kw)

    def counting(self, event, S, F):
        asked.append((self.policy.name, event))
        return answer(self, event, S, F)

    monkeypatch.setattr(fast, "run_compiled", spy)
    monkeypatch.setattr(fast.compiled._Asker, "answer", counting)
    w = profile("seed-figures").sample(150, seed=3)
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 300)
    kw = dict(SETUP, scheduler=scheduler, pool_pages=120, arrivals="poisson", qps=20.0, seed=1)
    policies = [create_policy(n) for n in policy_names()] + [create_policy("predicted", queue_order="tie"),
                                                              HalfHeadroom(), FewestDecodedVictim(), CountingRatio()]
    for pol in policies:
        ref = simulate_fast(w, type(pol)() if pol.name != "predicted" else create_policy(
            "predicted", queue_order=pol.queue_order), engine="reference", **kw)
        assert_same(ref, simulate_fast(w, pol, **kw))
    assert calls == [p.name for p in policies]
    from kvlab.sim.fast import loop
    assert {e for name, e in asked if name == "sglang"} <= {loop.ASK_END_SCHEDULE}
    assert {name for name, _ in asked} <= {"sglang", "test_fewest_decoded", "test_counting_ratio"}
    assert {e for name, e in asked if name == "test_counting_ratio"} == {loop.ASK_ADMIT, loop.ASK_END_SCHEDULE}


def test_sglang_ratio_state_matches_the_reference():
    """After a run with preemptions, SGLang's ratio is the reference's (the compiled decay and the asked
    raise hand it back and forth exactly)."""
    w = profile("seed-figures").sample(200, seed=9)
    kw = dict(SETUP, pool_pages=60, max_new_tokens=256, seed=1)
    pols = [create_policy("sglang") for _ in range(2)]
    ref = simulate_fast(w, pols[0], engine="reference", **kw)
    mine = simulate_fast(w, pols[1], **kw)
    assert_same(ref, mine)
    assert (mine.requests["num_preemptions"] > 0).any()
    assert pols[0].ratio == pols[1].ratio


def simulate_fast(w, policy, engine="fast", **kw):
    from kvlab.sim import simulate

    return simulate(w, policy, engine=engine, **kw)


@pytest.mark.parametrize("mode", ["recompute", "swap", "reject"])
def test_small_row_buffer_and_reasked_answers_change_nothing(mode, monkeypatch):
    """A row buffer that starts at 7 iterations (doubled when full) and preemptions after tokens
    were generated (the policy asked again): the reference engine's tables."""
    monkeypatch.setattr(fast.compiled, "MIN_ROWS", 7)
    monkeypatch.setattr(fast.compiled, "ROWS_PER_REQUEST", 0)
    asked = []
    ask = fast.compiled._Asker.ask_facts

    def counting(self, ids):
        asked.append(int(np.count_nonzero(self.Q[ids, fast.loop.GEN])))
        ask(self, ids)

    monkeypatch.setattr(fast.compiled._Asker, "ask_facts", counting)
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


def test_sglang_fractions_too_large_for_int64_are_asked(monkeypatch):
    """SGLang with a ratio step of denominator ~5e8 and raises over 251-token caps: the compiled
    decay's products would overflow int64, so the loop hands those iterations to Python (more state
    questions than preempting iterations) and still gives the reference's tables."""
    from kvlab.sim.fast import loop

    events = []
    answer = fast.compiled._Asker.answer
    monkeypatch.setattr(fast.compiled._Asker, "answer",
                        lambda self, event, S, F: (events.append(event), answer(self, event, S, F))[1])
    w = profile("seed-figures").sample(150, seed=9)
    kw = dict(SETUP, pool_pages=60, max_new_tokens=251, seed=1, decay_steps=999_983, init_ratio=0.05)
    ref = simulate_fast(w, "sglang", engine="reference", **kw)
    mine = simulate_fast(w, "sglang", **kw)
    assert_same(ref, mine)
    preempting = int((mine.iterations["num_preempted"] > 0).sum())
    assert preempting > 0 and events.count(loop.ASK_END_SCHEDULE) > preempting
