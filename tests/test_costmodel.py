"""Choosing a cost model: the resolver, the names results record, and num_seqs through the engines."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from kvlab import costmodel as cm
from kvlab.capacity import ServingConfig
from kvlab.costmodel.pipeline import PipelineCostModel
from kvlab.preemption_cost import crossover
from kvlab.sim import simulate

PATHS: set[str] = set()  # how iterations were priced: one at a time (scalar) or batched (stretch, deferred arrays)


@dataclass(frozen=True)
class PerSequenceCost:
    """Every iteration lasts 10 ms + 1 ms per sequence + 10 us per token (seconds)."""

    label: str = "per-sequence test model"

    def iteration_s(self, num_tokens, attention_pairs, kv_tokens, num_seqs=1):
        PATHS.add("deferred arrays" if np.ndim(num_seqs) else "stretch" if np.ndim(kv_tokens) else "scalar")
        return 0.01 + 0.001 * num_seqs + 1e-5 * num_tokens + 0.0 * kv_tokens  # shaped as the batch


def test_roofline_by_name_says_so():
    c = cm.cost_model("Llama-3-8B", "H200", source="roofline")
    assert c == cm.roofline("Llama-3-8B", "H200")
    assert c.label == "roofline (spec sheet)"


def test_unmeasured_gpu_is_extrapolated_from_the_nearest_measured_one_and_says_so():
    """MI300X (5.3 TB/s, 1,307.4 TFLOP/s dense BF16) is nearest to the measured H200 (4.8 TB/s, 989):
    its model is H200's with the byte terms scaled by 5.3 / 4.8 and the throughput terms by
    1,307.4 / 989, labelled; MLA too."""
    assert "MI300X" not in cm.measured_gpus() and "H200" in cm.measured_gpus()
    for source in (None, "measured"):
        c = cm.cost_model("Llama-3-8B", "MI300X", source=source)
        assert isinstance(c, cm.MeasuredCostModel)
        assert c.label.startswith("measured (extrapolated from H200 by spec ratios")
    h200, mi = cm.cost_model("Llama-3-8B", "H200"), cm.cost_model("Llama-3-8B", "MI300X")
    bw, fl = 5300 / 4800, 1307.4 / 989
    assert mi.gemm.bytes_per_s == pytest.approx(h200.gemm.bytes_per_s * bw, rel=1e-12)
    assert mi.gemm.flops_per_s == pytest.approx(h200.gemm.flops_per_s * fl, rel=1e-12)
    assert mi.attention_s_per_kv_token == pytest.approx(h200.attention_s_per_kv_token / bw, rel=1e-12)
    assert mi.iteration_s(64, 64 * 4000, 64 * 4000, 64) < h200.iteration_s(64, 64 * 4000, 64 * 4000, 64)
    # prefill is compute-bound: faster by about the peak ratio (within the byte terms' share)
    pre = (2048, 2048 * 2049 // 2, 2048, 1)
    assert h200.iteration_s(*pre) / mi.iteration_s(*pre) == pytest.approx(fl, rel=0.15)
    c = cm.cost_model("DeepSeek-V3", "MI300X", tp=8)  # MLA: measured too (tests/test_costmodel_mla_fp8.py)
    assert isinstance(c, cm.MeasuredCostModel) and "extrapolated from H200" in c.label and "MLA" in c.label


def test_resolve_passes_objects_and_rejects_bad_names():
    spy = PerSequenceCost()
    assert cm.resolve(spy, "Llama-3-8B", "H200") is spy
    with pytest.raises(ValueError, match="cost_model must be one of measured, roofline"):
        cm.resolve("spec", "Llama-3-8B", "H200")
    with pytest.raises(ValueError, match="cost_model must be 'measured', 'roofline', None"):
        cm.resolve(1.0, "Llama-3-8B", "H200")
    with pytest.raises(ValueError, match="source"):
        cm.cost_model("Llama-3-8B", "H200", source="guess")


def test_pipeline_wraps_the_stage_and_names_it():
    c = cm.cost_model("Falcon-180B", "H200", tp=4, pp=2, source="roofline")
    assert isinstance(c, PipelineCostModel) and c.pp == 2
    assert c.stage == cm.roofline("Falcon-180B", "H200", tp=4, pp=2)
    assert c.label == "roofline (spec sheet), PP2 pipeline (in-node)"
    # num_seqs reaches the stage: a stage that charges per sequence shows it twice (pp = 2).
    spy = PipelineCostModel(stage=PerSequenceCost(), pp=2, activation_bytes_per_token=0.0, send_latency_s=0.0,
                            link_bytes_per_s=1.0)
    assert spy.iteration_s(0, 0, 0, 5) - spy.iteration_s(0, 0, 0, 1) == pytest.approx(2 * 4 * 0.001)


def test_results_record_the_cost_model():
    w = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [3, 4]})
    kw = dict(model="Llama-3-8B", gpu="H200", pool_pages=100)
    assert simulate(w, **kw, cost_model="roofline").params["cost_model"] == "roofline (spec sheet)"
    assert simulate(w, **kw, cost_model=PerSequenceCost()).params["cost_model"] == "per-sequence test model"
    assert ServingConfig(model="Llama-3-8B", gpu="H200", cost_model="roofline").cost_label() == \
        "roofline (spec sheet)"
    assert crossover("Llama-3-8B", "H200", 16, cost_model="roofline").cost_model == "roofline (spec sheet)"


@pytest.mark.parametrize("seed", range(16))
def test_engines_pass_the_same_num_seqs(seed):
    """A cost charging per sequence: both engines give the same times, and each iteration's time
    is the per-sequence formula over its batch size (the iteration table's own count)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    w = pd.DataFrame({"prompt_tokens": rng.integers(1, 60, n), "output_tokens": rng.integers(1, 60, n),
                      "arrival_s": np.round(rng.exponential(0.05, n).cumsum() * (seed % 2), 3)})
    kw = dict(model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=PerSequenceCost(), record_iterations=True,
              block_size=4, pool_pages=int(rng.integers(20, 80)), max_num_seqs=int(rng.integers(1, 12)),
              max_num_batched_tokens=4 * int(rng.integers(2, 12)),
              scheduler=["chunked", "prefill_first"][seed % 2 if seed < 6 else (seed // 2) % 2])
    fast, ref = (simulate(w, "vllm", engine=e, **kw) for e in ("fast", "reference"))
    it = ref.iterations[ref.iterations["batch_size"] > 0]
    expected = 0.01 + 0.001 * it["batch_size"] + 1e-5 * (it["prefill_tokens"] + it["decode_tokens"])
    np.testing.assert_allclose(it["duration_s"], expected, rtol=1e-12)
    np.testing.assert_allclose(fast.iterations["duration_s"], ref.iterations["duration_s"], rtol=1e-9)
    np.testing.assert_allclose(fast.requests["finish_s"], ref.requests["finish_s"], rtol=1e-9)


def test_a_model_without_a_compiled_form_is_asked_one_iteration_at_a_time():
    """Both engines ask such a model per iteration with Python ints, as its ``iteration_s`` is written."""
    PATHS.clear()
    for seed in range(16):
        test_engines_pass_the_same_num_seqs(seed)
    assert PATHS == {"scalar"}
