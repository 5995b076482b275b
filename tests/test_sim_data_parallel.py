"""Data-parallel ranks (:mod:`kvlab.sim.data_parallel`): hand-worked groups in lockstep and independent,
the routing and padding rules, one independent rank against one engine, and the compiled loop
against the reference engine on random groups of both kinds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import roofline
from kvlab.sim import simulate
from kvlab.sim import finish, prepare
from kvlab.sim.data_parallel import group_duration_s, route, serve
from test_sim_fast_equivalence import POLICIES, assert_same, assert_same_table, random_case

MOE, DENSE = "Qwen3-30B-A3B", "Llama-2-7B"
COST = dataclasses.replace(roofline(MOE, "H100-SXM"), iteration_overhead_s=0.01)


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


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_a_request_the_context_rejects_has_no_rank(engine):
    w = pd.DataFrame({"prompt_tokens": [50, 5000, 40], "output_tokens": [3, 3, 2], "arrival_s": [0.0, 0.0, 0.0]})
    res = simulate(w, model=DENSE, gpu="H100-SXM", cost_model=Linear(), data_parallel=2, max_model_len=4096,
                   max_new_tokens=8, engine=engine)
    assert res.requests["rank"].tolist() == [0, -1, 1]  # r2 goes to the rank r0 does not load
    assert res.requests["abort_reason"].iloc[1] != ""


def test_a_dense_models_ranks_run_on_their_own_clocks():
    """r1, routed at its arrival (1 ms) to idle rank 1 (rank 0 runs r0: score 1 against 0), starts
    at once: first token at 1 + 11 ms, where in lockstep it would wait for rank 0's iteration end."""
    w = pd.DataFrame({"prompt_tokens": [10, 10], "output_tokens": [3, 3], "arrival_s": [0.0, 0.001]})
    for engine in ("reference", "fast"):
        res = simulate(w, "vllm", model=DENSE, gpu="H100-SXM", cost_model=Linear(), data_parallel=2, max_num_seqs=8,
                       pool_pages=100, engine=engine, record_iterations=True)
        q = res.requests
        assert q["rank"].tolist() == [0, 1] and not res.params["dp_lockstep"]
        np.testing.assert_allclose(q["first_token_s"], [0.011, 0.012], rtol=1e-12)
        np.testing.assert_allclose(q["finish_s"], [0.011 + 2 * 0.0101, 0.012 + 2 * 0.0101], rtol=1e-12)
    moe = simulate(w, "vllm", model=MOE, gpu="H100-SXM", cost_model=Linear(), data_parallel=2, max_num_seqs=8,
                   pool_pages=100)
    assert moe.params["dp_lockstep"] and moe.requests["first_token_s"].iloc[1] == pytest.approx(0.022)


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_one_independent_rank_is_one_engine(engine):
    """Routing every request to one rank at its arrival and pricing its iterations itself gives the
    single engine's tables exactly (arrivals, idle gaps, async scheduling, preemptions)."""
    rng = np.random.default_rng(3)
    w = pd.DataFrame({"prompt_tokens": rng.integers(5, 200, 80), "output_tokens": rng.integers(1, 60, 80),
                      "arrival_s": np.sort(rng.uniform(0, 3, 80))})
    kw = dict(model=DENSE, gpu="H100-SXM", cost_model=COST, max_num_seqs=6, pool_pages=40, block_size=8,
              max_num_batched_tokens=64, async_scheduling=True, engine=engine, record_iterations=True)
    one = simulate(w, "vllm_v1", **kw)
    run = prepare(w, "vllm_v1", **{k: x for k, x in kw.items() if k != "record_iterations"})
    req, it = serve(prompt=run.prompt, output=run.output, arrival_s=run.arrival_s, ids=run.ids,
                    max_new_tokens=run.max_new_tokens, policy=run.policy, pool=run.pool, scheduler=run.scheduler,
                    swap=run.swap, cost_model=run.cost, blocks=None, engine=engine, data_parallel=1, lockstep=False,
                    cudagraph_max_tokens=1)
    ranked = finish(run, req.drop(columns="rank"), it.drop(columns="rank"), record_iterations=True)
    assert (one.requests["num_preemptions"] > 0).any()
    assert_same_table(one.requests, ranked.requests, "requests")
    assert_same_table(one.iterations, ranked.iterations, "iterations")


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
                runs.append(simulate(w, policy, model=(MOE, DENSE)[seed % 4 < 2], gpu="H100-SXM",
                                     record_iterations=True, engine=engine, **kw))
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


def test_a_sweep_over_data_parallel_runs_the_group_never_one_engine():
    """The batched engine runs one engine per simulation: a data-parallel run goes to the group."""
    import kvlab

    w = pd.DataFrame({"prompt_tokens": [40] * 16, "output_tokens": [30] * 16, "arrival_s": np.linspace(0, 0.2, 16)})
    kw = dict(model=MOE, gpu="H100-SXM", cost_model=COST, max_num_seqs=4, pool_pages=40)
    rows = kvlab.sweep(w, {"data_parallel": [1, 2]}, fixed=kw, batch="always", progress=False)
    for dp, row in zip([1, 2], rows.itertuples()):
        want = simulate(w, data_parallel=dp, **kw).summary
        assert row.data_parallel == dp and row.e2e_p50_s == pytest.approx(want["e2e_p50_s"], rel=1e-12)
    assert rows["e2e_p50_s"].iloc[1] < rows["e2e_p50_s"].iloc[0]  # two ranks serve the queue faster
