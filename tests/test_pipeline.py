"""kvlab.costmodel.pipeline: the cycle of a micro-batch under pipeline parallelism, and its use in capacity trials."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.arrivals import arrival_times
from kvlab.capacity import ServingConfig, serve
from kvlab.costmodel import roofline
from kvlab.costmodel.pipeline import STAGE_LINKS, PipelineCostModel, cycle_s, expected_max_s, pipeline_cost, pipeline_schedule
from kvlab.reservation import pool_pages


def test_pp1_is_the_roofline_itself():
    assert pipeline_cost("Yi-34B", "A100-80GB-PCIe", tp=2) == roofline("Yi-34B", "A100-80GB-PCIe", tp=2)


def test_falcon_tp4_pp2_cycle_by_hand():
    # Two stages of 40 layers on 4 GPUs each; a micro-batch passes both stages and sends its
    # activations (14,848 hidden x 2 bytes per token) over the 300 GB/s link once per stage.
    c = pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2)
    assert isinstance(c, PipelineCostModel) and c.pp == 2
    assert c.stage.linear_flops_per_token == pytest.approx(2 * 178557088768 / 8)
    assert c.stage.weight_bytes == pytest.approx(2 * 178557088768 / 8)
    tokens, pairs, kv = 100, 5000, 5000
    send_s = 10e-6 + tokens * 14848 * 2 / 300e9
    stage_s = float(c.stage.iteration_s(tokens, pairs, kv))
    assert float(c.iteration_s(tokens, pairs, kv)) == pytest.approx(2 * (stage_s + send_s), rel=1e-12)
    # Across two nodes the send goes over the network instead: 80 Gb/s per 4-GPU VM = 2.5 GB/s
    # per GPU (the catalogue's internode link), 30 us per send.
    x = pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2, link="internode")
    assert float(x.send_s(tokens)) == pytest.approx(30e-6 + tokens * 14848 * 2 / 2.5e9)
    assert x.link == "internode" and "internode" in STAGE_LINKS
    # Memory-bound decode of one token: the stage reads its weights (45 GB at 0.8 x 1,935 GB/s).
    one = float(c.stage.iteration_s(1, 1, 1))
    assert one == pytest.approx(2 * 178557088768 / 8 / (0.8 * 1935e9) + 2 * 40 * 10e-6 + 0.002
                                + 2 * 40 * 1.5 * 14848 * 2 / 300e9, rel=1e-6)


def test_cycle_accepts_arrays_elementwise():
    c = pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2)
    n, p, k = np.array([1, 64, 512]), np.array([10, 4000, 200000]), np.array([10, 4000, 90000])
    np.testing.assert_allclose(c.iteration_s(n, p, k), [float(c.iteration_s(*x)) for x in zip(n, p, k)])


def test_a_pp_trial_runs_one_engine_at_qps_over_pp_with_its_share_of_the_pool():
    work = pd.DataFrame({"prompt_tokens": [300, 50, 80], "output_tokens": [3, 2, 2]})
    cfg = ServingConfig(model="Falcon-180B", gpu="A100-80GB-PCIe", tp=4, pp=2)
    res = serve(work, cfg, 2.0, seed=7, record_iterations=True)
    assert res.params["pool_pages"] == pool_pages("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2) // 2
    np.testing.assert_allclose(res.requests["arrival_s"], arrival_times(3, "poisson", qps=1.0, seed=7))
    # The first iteration prefills request 0 alone (it arrives first; the others come later).
    first = res.iterations.iloc[0]
    assert first["prefill_tokens"] == 300 and first["batch_size"] == 1
    c = cfg.cost()
    assert first["duration_s"] == pytest.approx(float(c.iteration_s(300, 300 * 301 // 2, 300)), rel=1e-12)


def test_bad_pipeline_input():
    with pytest.raises(ValueError, match="pp"):
        pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=0)
    with pytest.raises(ValueError, match="send_latency_s"):
        pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2, send_latency_s=-1.0)
    with pytest.raises(ValueError, match="link"):
        pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2, link="carrier-pigeon")
    with pytest.raises(ValueError, match="stage_s must hold pp = 2"):
        cycle_s([1.0], 2)
    with pytest.raises(ValueError, match="stage_times_s"):
        pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2).with_peers([])
    with pytest.raises(ValueError, match="exceeds the 32 layers"):
        pipeline_cost("Mistral-7B", "A100-80GB-PCIe", pp=33)


def test_uneven_micro_batches_cycle_at_pp_times_the_slowest_by_hand():
    # Two stages, micro-batch 0 takes 1 s per stage, micro-batch 1 takes 3 s. Stage 0 runs
    # mb0 [0,1], mb1 [1,4]; stage 1 mb0 [1,2], mb1 [4,7]. Round 1: mb0 re-enters stage 0 when it
    # is free (4), leaves it at 5, waits for stage 1 until 7 (mb1), leaves at 8; mb1 enters stage 0
    # at 7 (back from stage 1), ... From then on each micro-batch cycles every 6 s = 2 x 3 s:
    # micro-batch 0's bubble is 6 - 2 x 1 = 4 s per cycle.
    starts = pipeline_schedule([1.0, 3.0], 5)
    np.testing.assert_allclose(starts[:, 0], [0, 4, 10, 16, 22])
    np.testing.assert_allclose(starts[:, 1], [1, 7, 13, 19, 25])
    assert cycle_s([1.0, 3.0], 2) == 6.0
    assert np.diff(starts[2:], axis=0) == pytest.approx(np.full((2, 2), 6.0))
    # Equal micro-batches: no bubble, the cycle is pp x own time.
    assert np.diff(pipeline_schedule([2.0, 2.0, 2.0], 4), axis=0) == pytest.approx(np.full((3, 3), 6.0))
    assert cycle_s([2.0, 2.0, 2.0], 3) == 6.0


def test_expected_max_over_the_peers_by_hand():
    peers = np.array([3.0, 1.0])
    # one peer (pp = 2): E[max(1, X)] = (1 + 3) / 2; E[max(2, X)] = (2 + 3) / 2; above 3: itself
    assert expected_max_s(1.0, peers, 1) == pytest.approx(2.0)
    assert expected_max_s(2.0, peers, 1) == pytest.approx(2.5)
    assert expected_max_s(0.5, peers, 1) == pytest.approx(2.0)
    assert expected_max_s(4.0, peers, 1) == pytest.approx(4.0)
    # two peers (pp = 3): max of two draws is 1 w.p. 1/4, 3 w.p. 3/4
    assert expected_max_s(1.0, peers, 2) == pytest.approx(0.25 * 1 + 0.75 * 3)
    np.testing.assert_allclose(expected_max_s(np.array([1.0, 2.0, 4.0]), peers, 1), [2.0, 2.5, 4.0])
    # the peers always slower (the deterministic schedule above): pp x the slowest
    c = PipelineCostModel(stage=_Affine(), pp=2, activation_bytes_per_token=0.0, send_latency_s=0.0,
                          link_bytes_per_s=1.0).with_peers([3.0])
    assert float(c.iteration_s(0, 0, 0)) == pytest.approx(cycle_s([1.0, 3.0], 2))


class _Affine:
    """A stage that takes 1 s plus 10 ms per token computed."""

    def iteration_s(self, num_tokens, attention_pairs, kv_tokens, num_seqs=1):
        return 1.0 + 0.01 * num_tokens


def test_a_pp_trial_prices_the_bubbles_of_its_uneven_micro_batches_by_hand():
    # One request (prompt 100, 3 output tokens) on one of two engines. Without bubbles: the
    # prefill stage takes 1 + 0.01 x 100 = 2 s (cycle 4 s), each of the two decodes 1.01 s
    # (cycle 2.02 s). The peers are drawn from those three stage times {2, 1.01, 1.01} (no idle
    # time): the prefill is the slowest anyway (4 s); a decode waits for a prefill in flight
    # with probability 1/3: cycle 2 x (2/3 x 1.01 + 1/3 x 2) = 2.68 s. Bubble: 2 x 0.66 s.
    cost = PipelineCostModel(stage=_Affine(), pp=2, activation_bytes_per_token=0.0, send_latency_s=0.0,
                             link_bytes_per_s=1.0)
    work = pd.DataFrame({"prompt_tokens": [100], "output_tokens": [3]})
    cfg = ServingConfig(model="Llama-2-7B", gpu="A100-80GB-SXM", pp=2, cost_model=cost, max_new_tokens=8)
    flat = serve(work, ServingConfig(**{**cfg.__dict__, "pipeline_bubbles": False}), 1.0, record_iterations=True)
    np.testing.assert_allclose(flat.iterations["duration_s"], [4.0, 2.02, 2.02])
    bubbly = serve(work, cfg, 1.0, record_iterations=True)
    decode = 2 * (2 / 3 * 1.01 + 1 / 3 * 2.0)
    np.testing.assert_allclose(bubbly.iterations["duration_s"], [4.0, decode, decode])
    assert float(bubbly.requests["e2e_s"].iloc[0]) == pytest.approx(4.0 + 2 * decode)
