"""Data-parallel ranks in lockstep (:mod:`kvlab.sim.lockstep`): a hand-worked group, the routing and
padding rules, and the compiled loop against the reference engine on random groups."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import roofline
from kvlab.sim import simulate
from kvlab.sim.lockstep import group_duration_s, route
from test_sim_fast_equivalence import POLICIES, assert_same, random_case

MOE = "Qwen3-30B-A3B"


@dataclasses.dataclass(frozen=True)
class Linear:
    """10 ms per iteration plus 0.1 ms per token: durations worked by hand."""

    def iteration_s(self, num_tokens, attention_pairs, kv_tokens, num_seqs=1):
        return 0.01 + 1e-4 * num_tokens


def test_route_is_the_least_loaded_rank_counting_waiting_four_times():
    assert route([(0, 3), (1, 0)]) == 0  # scores 3 and 4
    assert route([(1, 0), (0, 3)]) == 1
    assert route([(0, 2), (0, 2), (0, 1)]) == 2
    assert route([(0, 2), (0, 2)]) == 0  # a tie: the lowest rank


def test_ranks_are_padded_to_the_largest_only_under_the_capture_size():
    work = [(40, 0, 0, 2, 0), (10, 0, 0, 10, 0)]  # (tokens, pairs, kv, seqs, pages swapped)
    assert group_duration_s(work, Linear(), 0.0, cudagraph_max_tokens=64) == pytest.approx(0.014)  # both at 40
    assert group_duration_s(work, Linear(), 0.0, cudagraph_max_tokens=32) == pytest.approx(0.014)  # the 40 is longest
    swapped = [(40, 0, 0, 2, 0), (0, 0, 0, 0, 30)]  # a rank that only swaps pays its copy time
    assert group_duration_s(swapped, Linear(), 1e-3, cudagraph_max_tokens=32) == pytest.approx(0.03)
    assert group_duration_s([(10, 0, 0, 1, 0), (50, 0, 0, 1, 0)], Linear(), 0.0, 32) == pytest.approx(0.015)


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_a_two_rank_group_is_hand_worked(engine):
    """r0 (100-token prompt, 2 tokens) and r1 (10, 3) arrive at 0, r2 (50, 1) at 25 ms.

    Routing: r0 to rank 0 (a tie), r1 to rank 1 (rank 0's score is 4); r2, routed at 30.1 ms
    when both ranks run one request, to rank 0 (a tie). Iterations (cost 10 ms + 0.1 ms/token):
    1. prefills of 100 and 10 tokens, above the 64-token capture size: 20 ms (rank 0's);
    2. two decodes, padded at 1 token: 10.1 ms; r0 finishes at 30.1 ms;
    3. r2's 50-token prefill and r1's decode, both under 64 tokens: padded to 50, 15 ms.
    One engine alone would have run r1's last decode in 10.1 ms (finishing at 40.2 ms, not 45.1).
    """
    w = pd.DataFrame({"prompt_tokens": [100, 10, 50], "output_tokens": [2, 3, 1], "arrival_s": [0.0, 0.0, 0.025]})
    res = simulate(w, "vllm", model=MOE, gpu="H100-SXM", cost_model=Linear(), data_parallel=2,
                   cudagraph_max_tokens=64, max_num_seqs=8, pool_pages=100, engine=engine, record_iterations=True)
    q = res.requests
    assert q["rank"].tolist() == [0, 1, 0]
    np.testing.assert_allclose(q["ttft_s"], [0.02, 0.02, 0.0451 - 0.025], rtol=1e-12)
    np.testing.assert_allclose(q["e2e_s"], [0.0301, 0.0451, 0.0451 - 0.025], rtol=1e-12)
    np.testing.assert_allclose(q["mean_tbt_s"].iloc[1], (0.0451 - 0.02) / 2, rtol=1e-12)
    it = res.iterations
    assert it["rank"].tolist() == [0, 1, 0, 1, 0, 1]
    np.testing.assert_allclose(it["duration_s"], [0.02, 0.02, 0.0101, 0.0101, 0.015, 0.015], rtol=1e-12)
    assert res.params["data_parallel"] == 2


def test_an_idle_rank_waits_for_the_group_and_the_clock_jumps_when_all_are_idle():
    """One long request keeps rank 0 busy; a request routed to idle rank 1 mid-iteration starts at
    the group's next iteration, not at its arrival; after both finish the clock jumps to 5 s."""
    w = pd.DataFrame({"prompt_tokens": [10, 10, 10], "output_tokens": [5, 1, 1], "arrival_s": [0.0, 0.005, 5.0]})
    res = simulate(w, "vllm", model=MOE, gpu="H100-SXM", cost_model=Linear(), data_parallel=2, max_num_seqs=8,
                   pool_pages=100, engine="reference", record_iterations=True)
    q = res.requests
    assert q["rank"].tolist() == [0, 1, 0]
    # iteration 1: 10 tokens, 11 ms; r1 (routed at 11 ms) prefills in iteration 2, padded to 10 tokens: 11 ms
    np.testing.assert_allclose(q["first_token_s"], [0.011, 0.022, 5.011], rtol=1e-12)
    assert res.iterations["start_s"].iloc[-1] == 5.0


def test_a_dense_model_is_refused():
    w = pd.DataFrame({"prompt_tokens": [10], "output_tokens": [2]})
    with pytest.raises(ValueError, match="dense model.*independent engines"):
        simulate(w, model="Llama-3-8B", gpu="H100-SXM", data_parallel=2)


COST = dataclasses.replace(roofline(MOE, "H100-SXM"), iteration_overhead_s=0.01)


def random_group(seed: int) -> tuple[pd.DataFrame, str, dict]:
    """:func:`random_case`'s workload and configuration over 2-3 ranks, each with a share of its pool."""
    w, policy, kw = random_case(seed)
    dp = int(np.random.default_rng(seed).integers(2, 4))
    kw.update(cost_model=COST, data_parallel=dp, pool_pages=max(1, kw["pool_pages"] // dp))
    return w, policy, kw


@pytest.mark.filterwarnings("ignore:max_new_tokens")
@pytest.mark.parametrize("block", range(3))
def test_fast_equals_reference_in_lockstep_on_random_groups(block, fast_loop):
    for seed in range(block * 12, block * 12 + 12):
        w, policy, kw = random_group(seed)
        kw.update(async_scheduling=bool(seed % 2), cudagraph_max_tokens=int(np.random.default_rng(seed).integers(1, 40)))
        if seed % 3 == 0 and kw["preemption_mode"] == "recompute":
            kw["prefix_caching"] = True
        runs = []
        for engine in ("reference", "fast"):
            try:
                runs.append(simulate(w, policy, model=MOE, gpu="H100-SXM", record_iterations=True, engine=engine,
                                     **kw))
            except RuntimeError as exc:
                runs.append(f"RuntimeError: {str(exc).split(':')[0]}")
        assert_same(*runs)


@pytest.mark.filterwarnings("ignore:max_new_tokens")
def test_the_random_groups_reach_every_policy_rank_and_preemption_path():
    policies, t = set(), []
    for seed in range(36):
        w, policy, kw = random_group(seed)
        policies.add(policy)
        try:
            t.append(simulate(w, policy, model=MOE, gpu="H100-SXM", **kw).requests)
        except RuntimeError:
            continue
    t = pd.concat(t)
    assert policies == set(POLICIES) and set(t["rank"]) == {0, 1, 2}
    assert (t["num_swaps"] > 0).any() and (t["num_preemptions"] > t["num_swaps"]).any()
