"""Bad input to simulate() and the arrival generators: clear ValueErrors, never a hang."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.arrivals import arrival_times
from kvlab.sim import simulate

W = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [5, 7]})
KW = dict(model="Llama-2-7B", gpu="A100-80GB-SXM", pool_pages=100)


@pytest.mark.parametrize("kwargs,match", [
    ({"policy": "fifo"}, "policy 'fifo' is unknown: expected one of orca_oracle"),
    ({"preemption_mode": "evict"}, "preemption_mode 'evict' is unknown: expected one of recompute, swap, reject"),
    ({"scheduler": "fast"}, "scheduler 'fast' is unknown"),
    ({"engine": "gpu"}, "engine 'gpu' is unknown"),
    ({"arrivals": "poisson", "qps": 0.0}, "qps must be a positive"),
    ({"arrivals": "poisson", "qps": -2.0}, "qps must be a positive"),
    ({"arrivals": "poisson"}, "qps must be given"),
    ({"arrivals": "trace"}, "arrival_s column"),
    ({"max_num_batched_tokens": 8}, r"at least one page \(block_size = 16"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
    ({"pool_pages": -1}, "pool_pages must be a positive integer"),
    ({"watermark_frac": 2.0}, "watermark_frac"),
    ({"seed": 1.5}, "seed must be a non-negative integer"),
    ({"seed": -1}, "seed must be a non-negative integer"),
    ({"cost_model": "rooflin"}, "cost_model must be one of measured, roofline"),
    ({"cost_model": 3}, "cost_model must be 'measured', 'roofline', None or a kvlab.costmodel model"),
])
def test_bad_arguments(kwargs, match):
    args = {**KW, **kwargs}
    policy = args.pop("policy", "vllm")
    with pytest.raises(ValueError, match=match):
        simulate(W, policy, **args)


@pytest.mark.parametrize("workload,match", [
    (W.iloc[:0], "workload is empty"),
    (W.drop(columns="output_tokens"), "lacks the column\\(s\\) 'output_tokens'"),
    (W.assign(output_tokens=[5, -1]), r"workload: row 1: output_tokens=-1, expected an integer token count in \[1, "),
    (W.assign(prompt_tokens=[1.5, 2]), r"workload: row 0: prompt_tokens=1.5, expected an integer token count"),
    (W.assign(arrival_s=[0.0, np.nan]), "row 1: arrival_s=nan, expected finite seconds >= 0"),
    ([1, 2], "must be a pandas DataFrame"),
    (W.assign(arrival_s=["a", "b"]), "row 0: arrival_s='a', expected finite seconds >= 0"),
])
def test_bad_workloads(workload, match):
    with pytest.raises(ValueError, match=match):
        simulate(workload, "vllm", **KW)


def test_prompt_larger_than_the_pool_is_rejected_with_a_reason():
    w = pd.DataFrame({"prompt_tokens": [10, 5000, 10], "output_tokens": [5, 5, 5]})
    for policy in ("vllm", "reserve_max", "sglang", "tgi"):
        # 100 pages x 16 = 1600 tokens; a context of 8,192 lets the 5,000-token prompt reach the pool
        res = simulate(w, policy, max_new_tokens=16, max_model_len=8192, **KW)
        assert res.requests["abort_reason"].tolist() == ["", "exceeds_pool", ""]


def test_arrival_generators():
    assert arrival_times(4).tolist() == [0.0] * 4
    t = arrival_times(20000, "poisson", qps=4.0, seed=3)
    gaps = np.diff(t)
    assert (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    g = np.diff(arrival_times(20000, "gamma", qps=4.0, cv=3.0, seed=3))
    assert g.mean() == pytest.approx(0.25, rel=0.08) and g.std() / g.mean() == pytest.approx(3.0, rel=0.1)
    with pytest.raises(ValueError, match="cv"):
        arrival_times(3, "gamma", qps=1.0, cv=0.0)
    with pytest.raises(ValueError, match="num_requests"):
        arrival_times(0)


def test_poisson_arrivals_through_simulate_are_seeded():
    a = simulate(W, "vllm", arrivals="poisson", qps=2.0, seed=5, **KW).requests["arrival_s"]
    assert a.tolist() == arrival_times(2, "poisson", qps=2.0, seed=5).tolist()


def test_docstring_examples():
    import doctest

    import kvlab.arrivals

    result = doctest.testmod(kvlab.arrivals)
    assert result.attempted > 0 and result.failed == 0
