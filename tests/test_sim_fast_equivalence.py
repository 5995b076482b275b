"""The fast engine against the reference engine: the same integers, the same times.

Random seeded workloads and configurations (every policy, scheduler and preemption mode, tight
pools, CPU pools and token budgets so that preemption, swapping, aborts and head-of-line
blocking all happen), each run by both engines; the request tables must agree exactly on every
integer column and to 1e-9 relative on every time, and so must the per-iteration tables.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pandas as pd
import pytest

import kvlab.sim.fast as fast
from kvlab.costmodel import roofline
from kvlab.policies import create_policy, policy_names
from kvlab.sim import simulate
from kvlab.sim.config import SCHEDULERS, PoolConfig, PreemptionMode, SchedulerConfig, SchedulerKind, SwapConfig

COST = dataclasses.replace(roofline("Llama-2-7B", "A100-80GB-SXM"), iteration_overhead_s=0.01)
POLICIES = tuple(policy_names())
NUM_CASES = 240


def random_case(seed: int) -> tuple[pd.DataFrame, str, dict]:
    """A small workload and a configuration drawn from ``seed`` (half offline, half with arrivals)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    bs = int(rng.choice([1, 2, 4, 8, 16]))
    w = pd.DataFrame({"prompt_tokens": rng.integers(1, 60, n), "output_tokens": rng.integers(1, 80, n),
                      "arrival_s": np.round(rng.exponential(0.3, n).cumsum() * rng.integers(0, 2), 3)})
    policy = POLICIES[seed % len(POLICIES)]
    kw = dict(scheduler=str(rng.choice(SCHEDULERS)),
              preemption_mode=str(rng.choice(["recompute", "swap", "reject"])), block_size=bs,
              pool_pages=int(rng.integers(1, 60)), max_new_tokens=int(rng.integers(1, 100)),
              max_num_seqs=int(rng.integers(1, 10)), max_num_batched_tokens=bs * int(rng.integers(1, 10)),
              cpu_pool_pages=int(rng.integers(0, 20)), seed=int(rng.integers(0, 4)), cost_model=COST)
    extra = {"orca_max": {"max_model_len": 64}, "tgi": {"cap_tokens": int(rng.integers(1, 20))},
             "predicted": {"queue_order": str(rng.choice(["fcfs", "shortest_predicted", "tie"]))},
             "vllm": {"watermark_frac": float(rng.choice([0.0, 0.01, 0.1]))}}
    return w, policy, {**kw, **extra.get(policy, {})}


def run(w: pd.DataFrame, policy: str, engine: str, **kw):
    """The engine's result, or the RuntimeError text when it stops on a livelock."""
    try:
        return simulate(w, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", record_iterations=True, engine=engine,
                        **kw)
    except RuntimeError as exc:
        return f"RuntimeError: {str(exc).split(':')[0]}"


def assert_same_table(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert list(a.columns) == list(b.columns), what
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        assert x.dtype == y.dtype, f"{what}.{col}: {x.dtype} vs {y.dtype}"
        if x.dtype.kind == "f":
            np.testing.assert_allclose(y, x, rtol=1e-9, atol=0, equal_nan=True, err_msg=f"{what}.{col}")
        else:
            np.testing.assert_array_equal(y, x, err_msg=f"{what}.{col}")


def assert_same(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert_same_table(a.requests, b.requests, "requests")
    assert_same_table(a.iterations, b.iterations, "iterations")
    assert a.summary.keys() == b.summary.keys()
    np.testing.assert_allclose([b.summary[k] for k in a.summary], list(a.summary.values()), rtol=1e-9,
                               equal_nan=True)


@pytest.mark.parametrize("block", range(NUM_CASES // 20))
def test_fast_equals_reference_on_random_cases(block, fast_loop):
    for seed in range(block * 20, block * 20 + 20):
        w, policy, kw = random_case(seed)
        assert_same(run(w, policy, "reference", **kw), run(w, policy, "fast", **kw))


def test_random_cases_exercise_every_path(monkeypatch):
    """The cases above reach preemption, swapping and aborts, and, asking every question
    (``KVLAB_COMPILED_FORMS=0``), every hand-back of the compiled loop: admission, victims,
    per-iteration state, latencies and facts asked again after a preemption (a spy)."""
    from kvlab.sim.fast import compiled, loop

    monkeypatch.setenv("KVLAB_COMPILED_FORMS", "0")
    seen = {loop.ASK_ADMIT: 0, loop.ASK_VICTIM: 0, loop.ASK_END_SCHEDULE: 0, loop.ASK_COST: 0, "stale": 0}
    answer, ask_facts = compiled._Asker.answer, compiled._Asker.ask_facts

    def counting_answer(self, event, S, F):
        seen[event] = seen.get(event, 0) + 1
        return answer(self, event, S, F)

    def counting_facts(self, ids):
        seen["stale"] += len(ids) < self.Q.shape[0]
        return ask_facts(self, ids)

    monkeypatch.setattr(compiled._Asker, "answer", counting_answer)
    monkeypatch.setattr(compiled._Asker, "ask_facts", counting_facts)
    outcomes = []
    step = next(s for s in itertools.count(2) if math.gcd(s, len(POLICIES)) == 1)  # reaches every policy
    for seed in range(0, NUM_CASES, step):
        w, policy, kw = random_case(seed)
        res = run(w, policy, "fast", **kw)
        if not isinstance(res, str):
            outcomes.append(res.requests)
    t = pd.concat(outcomes)
    assert min(seen.values()) > 0, seen
    assert (t["num_swaps"] > 0).any() and (t["num_preemptions"] > t["num_swaps"]).any()
    assert set(t["abort_reason"]) >= {"", "exceeds_pool", "preempted_rejected"}


@pytest.mark.parametrize("policy, scheduler", [("sglang", "chunked"), ("sglang", "prefill_first_chunked"),
                                               ("vllm", "chunked"), ("vllm", "prefill_first"), ("vllm", "mixed_whole")])
def test_decode_run_is_hand_worked(policy, scheduler, fast_loop):
    """One request (prompt 4, output 10, 4-token pages, pool of 4 pages): a prefill, then nine decodes.
    Decode i caches context 4 + i, so it holds ceil((4 + i) / 4) pages: 2 from context 5, 3 from 9,
    4 from 13 (the whole pool); iteration i starts at the sum of the first i latencies.

    Both ways through the compiled loop: with the compiled forms, neither policy hands a question
    back to Python (a spy); asking every question, SGLang's state is asked after each of the ten
    iterations and every iteration's latency is asked (nothing else: one request never waits on
    another's admission)."""
    from kvlab.sim.fast import compiled, loop

    w = pd.DataFrame({"prompt_tokens": [4], "output_tokens": [10]})
    calls = []
    answer = compiled._Asker.answer

    def spy(self, event, S, F):
        calls.append(event)
        return answer(self, event, S, F)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiled._Asker, "answer", spy)
        res = simulate(w, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", block_size=4, pool_pages=4,
                       cost_model=COST, record_iterations=True, engine="fast", scheduler=scheduler,
                       **({"watermark_frac": 0.0} if policy == "vllm" else {}))
    asked = [loop.ASK_END_SCHEDULE, loop.ASK_COST] * 10 if policy == "sglang" else [loop.ASK_COST] * 10
    assert calls == (asked if fast_loop == "asks" else [])
    it = res.iterations
    assert it["iteration"].tolist() == list(range(10))
    assert it["pages_used"].tolist() == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4]
    assert it["decode_tokens"].tolist() == [0] + [1] * 9 and it["prefill_tokens"].tolist() == [4] + [0] * 9
    lat = [float(COST.iteration_s(4, 10, 4))] + [float(COST.iteration_s(1, 4 + i, 4 + i)) for i in range(1, 10)]
    np.testing.assert_allclose(it["duration_s"], lat, rtol=0, atol=0)
    np.testing.assert_allclose(it["start_s"], np.cumsum([0.0] + lat[:-1]), rtol=1e-15)
    r = res.requests.iloc[0]
    assert (r["first_token_iter"], r["finish_iter"], r["max_used_pages"]) == (0, 9, 4)
    assert r["finish_s"] == pytest.approx(sum(lat), rel=1e-15)
    assert r["max_tbt_s"] == max(np.diff(np.cumsum(lat)))


def test_unknown_engine_is_a_value_error():
    w = pd.DataFrame({"prompt_tokens": [4], "output_tokens": [2]})
    with pytest.raises(ValueError, match="engine"):
        simulate(w, "vllm", model="Llama-2-7B", gpu="A100-80GB-SXM", engine="turbo")


def test_device_and_numpy_runs_are_identical(device_xp):
    """Same seeded inputs on the device (CuPy, or the strict stand-in for its rules) and NumPy:
    identical tables (integers and times)."""
    policy_keys = ("max_model_len", "cap_tokens", "queue_order", "watermark_frac")
    for seed in range(48):
        w, policy, kw = random_case(seed)
        out = w["output_tokens"].to_numpy()
        tables = []
        for xp in (np, device_xp):
            pol = create_policy(policy, **{k: v for k, v in kw.items() if k in policy_keys})
            pol.bind(output_tokens=out, max_new_tokens=kw["max_new_tokens"], block_size=kw["block_size"],
                     num_pages=kw["pool_pages"], seed=kw["seed"])
            tables.append(fast.run_fast(
                prompt_tokens=w["prompt_tokens"].to_numpy(), output_tokens=out, arrival_s=w["arrival_s"].to_numpy(),
                request_ids=np.arange(len(w)), max_new_tokens=kw["max_new_tokens"], policy=pol,
                pool=PoolConfig(num_pages=kw["pool_pages"], block_size=kw["block_size"]),
                scheduler=SchedulerConfig(kind=SchedulerKind(kw["scheduler"]), max_num_seqs=kw["max_num_seqs"],
                                          max_num_batched_tokens=kw["max_num_batched_tokens"],
                                          preemption_mode=PreemptionMode(kw["preemption_mode"])),
                swap=SwapConfig(cpu_pool_pages=kw["cpu_pool_pages"], page_copy_s=1e-4), cost_model=COST, xp=xp))
        for a, b, what in zip(tables[0], tables[1], ("requests", "iterations")):
            pd.testing.assert_frame_equal(a, b, check_exact=True, obj=f"{what} (seed {seed})")


@pytest.mark.parametrize("policy, kw", [
    ("vllm", {"pool_pages": 120, "arrivals": "poisson", "qps": 30.0}),  # pool pressure: preemptions, facts asked again
    ("vllm", {"pool_pages": 60, "max_num_seqs": 24, "preemption_mode": "swap", "cpu_pool_pages": 40}),
    ("orca_pow2", {"pool_pages": 300, "arrivals": "poisson", "qps": 60.0, "max_num_batched_tokens": 256}),
    ("sglang", {"pool_pages": 60, "max_new_tokens": 256}),
])
def test_fast_equals_reference_on_longer_runs(policy, kw, fast_loop):
    """Hundreds of requests from the seed-figures profile: long runs, many page phases, hand-backs."""
    from kvlab.lengths import profile

    w = profile("seed-figures").sample(300, seed=1)
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 400)
    args = {"block_size": 16, "cost_model": COST, "seed": 2, **kw}
    assert_same(run(w, policy, "reference", **args), run(w, policy, "fast", **args))


def test_idle_server_then_a_request_that_cannot_fit():
    """The server idles until t = 10 s, when a request too large for the pool arrives: it is aborted
    in the iteration that starts at its arrival (finish time 10 s), by both engines."""
    w = pd.DataFrame({"prompt_tokens": [4, 100, 4], "output_tokens": [2, 5, 3], "arrival_s": [0.0, 10.0, 10.0]})
    kw = {"block_size": 4, "pool_pages": 3, "watermark_frac": 0.0, "cost_model": COST}
    ref, fst = run(w, "vllm", "reference", **kw), run(w, "vllm", "fast", **kw)
    assert_same(ref, fst)
    big = fst.requests.iloc[1]
    assert (big["abort_reason"], big["finish_s"], big["finish_iter"]) == ("exceeds_pool", 10.0, 2)
    assert fst.iterations["start_s"].iloc[2] == 10.0
