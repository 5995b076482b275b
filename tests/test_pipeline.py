"""kvlab.pipeline: the cycle of a micro-batch under pipeline parallelism, and its use in capacity trials."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.arrivals import arrival_times
from kvlab.capacity import ServingConfig, serve
from kvlab.costmodel import roofline
from kvlab.pipeline import PipelineCostModel, pipeline_cost
from kvlab.reservation import pool_pages


def test_pp1_is_the_roofline_itself():
    assert pipeline_cost("Yi-34B", "A100-80GB-PCIe", tp=2) == roofline("Yi-34B", "A100-80GB-PCIe", tp=2)


def test_falcon_tp4_pp2_cycle_by_hand():
    # Two stages of 40 layers on 4 GPUs each; a micro-batch passes both stages and sends its
    # activations (14,848 hidden x 2 bytes per token) over the 300 GB/s link once per stage.
    c = pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2)
    assert isinstance(c, PipelineCostModel) and c.pp == 2
    assert c.stage.linear_flops_per_token == pytest.approx(2 * 179522683904 / 8)
    assert c.stage.weight_bytes == pytest.approx(2 * 179522683904 / 8)
    tokens, pairs, kv = 100, 5000, 5000
    send_s = 10e-6 + tokens * 14848 * 2 / 300e9
    stage_s = float(c.stage.iteration_s(tokens, pairs, kv))
    assert float(c.iteration_s(tokens, pairs, kv)) == pytest.approx(2 * (stage_s + send_s), rel=1e-12)
    # Memory-bound decode of one token: the stage reads its weights (45 GB at 0.8 x 1,935 GB/s).
    one = float(c.stage.iteration_s(1, 1, 1))
    assert one == pytest.approx(2 * 179522683904 / 8 / (0.8 * 1935e9) + 2 * 40 * 10e-6 + 0.002
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
    with pytest.raises(ValueError, match="exceeds the 32 layers"):
        pipeline_cost("Mistral-7B", "A100-80GB-PCIe", pp=33)
