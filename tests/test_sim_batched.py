"""The batched engine (kvlab.sim.batched) against the reference engine, on every simulation of a random sweep.

Run also with KVLAB_BACKEND=strict (CI), where the batch's arrays follow CuPy's rules.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.backend import get_xp
from kvlab.sim import finish, prepare, simulate
from kvlab.sim.batched import BatchedEngine, run_batched, why_not

IN_SCOPE = ["vllm", "reserve_max", "tgi", "orca_oracle", "orca_pow2", "orca_max"]


def _random_sweep(seed: int, num: int) -> list[tuple[pd.DataFrame, dict]]:
    """Seeded random configurations within scope: policies, pools, block sizes (non-powers of two
    included), budgets, caps, rates; workloads of different lengths (a ragged batch)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num):
        n = int(rng.integers(3, 50))
        w = pd.DataFrame({"prompt_tokens": rng.integers(1, 400, n), "output_tokens": rng.integers(1, 300, n)})
        c = dict(policy=str(rng.choice(IN_SCOPE)), max_new_tokens=int(rng.choice([50, 128, 200, 512])),
                 block_size=int(rng.choice([1, 3, 7, 16, 24])), pool_pages=int(rng.integers(15, 400)),
                 preemption_mode=str(rng.choice(["recompute", "reject"])),
                 max_num_seqs=int(rng.choice([3, 16, 256])), max_num_batched_tokens=int(rng.choice([48, 100, 2048])),
                 arrivals="poisson", qps=float(rng.choice([5.0, 50.0, 500.0])), seed=i,
                 model="Llama-3-8B", gpu="H100-SXM", cost_model="roofline")
        if c["policy"] == "tgi":
            c["cap_tokens"] = int(rng.choice([16, 100, 1024]))
        out.append((w, c))
    return out


def test_every_simulation_of_a_random_sweep_equals_the_reference() -> None:
    sweep = _random_sweep(7, 40)
    runs = [prepare(w, **c) for w, c in sweep]
    assert all(why_not(r) is None for r in runs)
    engine = BatchedEngine(runs, get_xp())
    tables = engine.run()
    # both paths ran: the common array step, and the per-request fallback (preemptions, aborts)
    assert 0 < engine.num_fallback_rows < sum(len(t[1]) for t in tables)
    assert engine.ids.size < len(runs)  # finished simulations left the arrays (compaction ran)
    outcomes = set()
    for (w, c), run, (req, it) in zip(sweep, runs, tables):
        ref = simulate(w, engine="reference", record_iterations=True, **c)
        got = finish(run, req, it, record_iterations=True)
        pd.testing.assert_frame_equal(got.requests, ref.requests, check_exact=True)  # TTFT, finishes, preemptions
        pd.testing.assert_frame_equal(got.iterations, ref.iterations, check_exact=True)
        assert got.summary == pytest.approx(ref.summary, nan_ok=True, rel=0, abs=0)
        outcomes |= set(ref.requests["outcome"]) | {"preempted" if ref.requests["num_preemptions"].any() else ""}
    # the sweep reaches preemption, aborts and both finish kinds, so the comparison covers them
    assert {"preempted", "finished_aborted", "finished_stopped", "finished_length_capped"} <= outcomes


def test_run_batched_groups_runs_by_cost_model() -> None:
    sweep = _random_sweep(3, 4)
    sweep[1][1]["gpu"] = "A100-80GB-SXM"  # another roofline: a batch of its own
    runs = [prepare(w, **c) for w, c in sweep]
    for (w, c), run, (req, it) in zip(sweep, runs, run_batched(runs, get_xp())):
        pd.testing.assert_frame_equal(finish(run, req, it).requests, simulate(w, engine="reference", **c).requests,
                                      check_exact=True)


@pytest.mark.parametrize(("change", "reason"), [
    ({"scheduler": "prefill_first"}, "scheduler prefill_first"),
    ({"preemption_mode": "swap"}, "swap preemption"),
    ({"policy": "sglang"}, "keeps per-iteration state"),
    ({"cost_model": "measured"}, "other bits on arrays"),
])
def test_runs_outside_the_scope_are_refused_with_the_reason(change: dict, reason: str) -> None:
    w = pd.DataFrame({"prompt_tokens": [5, 9], "output_tokens": [3, 4]})
    base = {"model": "Llama-3-8B", "gpu": "H100-SXM", "cost_model": "roofline"}
    run = prepare(w, **{**base, **change})
    assert reason in why_not(run)
    with pytest.raises(ValueError, match="outside the batched engine's scope"):
        BatchedEngine([run], get_xp())


def test_sweep_table_is_the_same_batched_or_not_and_says_what_ran() -> None:
    from kvlab import sweep

    grid = [{"policy": ["vllm", "tgi"], "pool_pages": [60, 400], "block_size": [5, 16]},
            {"policy": ["sglang"], "pool_pages": [60]},                      # outside scope: per process
            {"policy": ["reserve_max"], "preemption_mode": ["swap"]}]        # outside scope: per process
    fixed = {"model": "Llama-3-8B", "gpu": "H100-SXM", "cost_model": "roofline", "max_new_tokens": 256,
             "arrivals": "poisson", "qps": 50.0}
    kw = {"num_requests": 30, "fixed": fixed, "seeds": [0, 1], "progress": False}
    batched = sweep("seed-figures", grid, batch="always", **kw)
    one_by_one = sweep("seed-figures", grid, batch="never", **kw)
    pd.testing.assert_frame_equal(batched, one_by_one, check_exact=True)
    assert batched.attrs["run_by"].startswith("16 of 20 simulations batched")
    assert "2 x policy sglang admission reads the running requests, keeps per-iteration state" in batched.attrs["run_by"]
    assert "2 x swap preemption" in batched.attrs["run_by"]
    assert one_by_one.attrs["run_by"].startswith("0 of 20 simulations batched")


def test_the_chooser_runs_per_process_unless_told_and_says_why() -> None:
    """No device has measured the batched engine faster than the compiled loop per process, so
    ``auto`` keeps every run per process, on NumPy and on a device module alike; ``always`` batches."""
    from kvlab.sim.batched.choose import choose

    w = pd.DataFrame({"prompt_tokens": [5, 9], "output_tokens": [3, 4]})
    runs = [prepare(w, model="Llama-3-8B", gpu="H100-SXM", cost_model="roofline", seed=s) for s in range(8)]
    strict = get_xp("strict")
    assert choose(runs, np).batched == () and "faster at every batch size measured" in choose(runs, np).reason
    assert choose(runs, strict).batched == () and "not measured faster" in choose(runs, strict).reason
    assert choose(runs[:3], np, "always").batched == (0, 1, 2)
    assert choose(runs[:3], strict, "always").batched == (0, 1, 2)
    with pytest.raises(ValueError, match="batch 'sometimes' is unknown"):
        choose(runs, np, "sometimes")


def test_capacities_in_batched_rounds_find_what_searches_one_by_one_find() -> None:
    from kvlab.capacity import SLO, ServingConfig, capacities

    slo = SLO(tbt_p99_s=0.05)
    cases = {(pol, pages): (ServingConfig(model="Llama-3-8B", gpu="H100-SXM", policy=pol, pool_pages=pages,
                                          max_new_tokens=256, cost_model="roofline", max_num_seqs=32), slo)
             for pol in ("vllm", "reserve_max") for pages in (80, 400)}
    kw = {"num_requests": 40, "rel_tol": 0.2, "qps_start": 4.0, "window_check": False}
    rounds = capacities("seed-figures", cases, batch="always", **kw)
    alone = capacities("seed-figures", cases, batch="never", **kw)
    for key in cases:
        assert rounds[key].capacity_qps == alone[key].capacity_qps
        assert rounds[key].reason == alone[key].reason
        pd.testing.assert_frame_equal(rounds[key].trials, alone[key].trials, check_exact=True)
        assert alone[key].run_by == "per process"
        num_trials = sum(len(r.trials) for r in alone.values())
        assert rounds[key].run_by.startswith(f"{num_trials} of {num_trials} trials batched")
