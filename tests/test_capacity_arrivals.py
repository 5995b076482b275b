"""Capacity under the trace's own arrival process: a bursty trace sustains less than its Poisson twin."""
from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab.arrivals import arrival_times, gap_cv, time_compressed
from kvlab.capacity import SLO, ServingConfig, _verdict, capacity, serve, slo_metrics, slo_verdict

MODEL, GPU = "Llama-2-7B", "A100-40GB"
SLO_ = SLO(tbt_p99_s=0.1, scheduling_delay_p50_s=2.0)
N = 300


def _lengths(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"prompt_tokens": rng.integers(200, 1500, n),
                         "output_tokens": np.maximum(1, np.round(np.exp(rng.normal(4.5, 0.8, n)))).astype(int)})


@pytest.fixture(scope="module")
def bursty():
    work = _lengths(N).assign(arrival_s=arrival_times(N, "gamma", qps=1.0, cv=3.0, seed=1))
    config = ServingConfig(model=MODEL, gpu=GPU, max_new_tokens=int(work["output_tokens"].max()), max_num_seqs=256,
                           max_num_batched_tokens=2048)
    return work, config


def test_gap_cv_and_time_compression_by_hand():
    assert gap_cv(arrival_times(20_000, "poisson", qps=3.0, seed=2)) == pytest.approx(1.0, abs=0.03)
    assert gap_cv(arrival_times(20_000, "gamma", qps=3.0, cv=3.0, seed=2)) == pytest.approx(3.0, rel=0.1)
    gaps = np.array([1.0, 3.0])  # mean 2, population std 1
    assert gap_cv(np.concatenate([[0.0], np.cumsum(gaps)])) == pytest.approx(0.5)
    t = time_compressed([5.0, 6.0, 9.0, 13.0], qps=1.5)  # 3 gaps over 8 s -> over 2 s
    assert t.tolist() == pytest.approx([0.0, 0.25, 1.0, 2.0])
    with pytest.raises(ValueError, match="offline"):
        gap_cv([1.0, 1.0, 1.0])


def test_a_bursty_trace_sustains_less_than_its_poisson_twin_and_a_direct_run_agrees(bursty):
    work, config = bursty
    rel_tol = 0.05
    own = capacity(work, config, SLO_, num_requests=N, arrivals="replay", rel_tol=rel_tol)
    twin = capacity(work, config, SLO_, num_requests=N, arrivals="poisson", rel_tol=rel_tol)
    assert own.arrivals == "replay" and twin.arrivals == "poisson"
    assert 0 < own.capacity_qps < 0.5 * twin.capacity_qps  # CV 3 queues far more than Poisson
    # a direct simulation of the trace's own times scaled to the capacity meets the SLO, and one
    # grid step above it misses: the capacity is right to within the search's resolution
    failed = own.trials[~own.trials["passed"].astype(bool) & (own.trials["qps"] > own.capacity_qps)]
    above = float(failed["qps"].min())
    assert above / own.capacity_qps - 1 <= rel_tol

    defaults = inspect.signature(capacity).parameters  # the search's own steady-state rule

    def direct(qps: float) -> str:
        timed = work.assign(arrival_s=time_compressed(work["arrival_s"], qps))
        res = kvlab.simulate(timed, "vllm", model=MODEL, gpu=GPU, max_new_tokens=config.max_new_tokens,
                             max_num_seqs=256, max_num_batched_tokens=2048, pool_pages=config.engine_pool_pages(),
                             arrivals="trace", cost_model=config.cost())
        m = slo_metrics(res, warmup_frac=defaults["warmup_frac"].default)
        return _verdict(m, SLO_, defaults["max_backlog_frac"].default)

    assert direct(own.capacity_qps) == "meets the SLO"
    assert direct(above) != "meets the SLO"
    assert direct(twin.capacity_qps) != "meets the SLO"  # the Poisson capacity overstates this trace


def test_gamma_arrivals_use_the_measured_gap_cv(bursty):
    work, config = bursty
    got = capacity(work, config, SLO_, num_requests=N, arrivals="gamma", rel_tol=0.1)
    assert got.burst_cv == pytest.approx(gap_cv(work["arrival_s"]))
    poisson = capacity(work, config, SLO_, num_requests=N, arrivals="poisson", rel_tol=0.1)
    assert got.capacity_qps < poisson.capacity_qps
    with pytest.raises(ValueError, match="arrival_s"):
        capacity(work.drop(columns="arrival_s"), config, SLO_, num_requests=N, arrivals="replay")
    with pytest.raises(ValueError, match="burst_cv is used only"):
        capacity(work, config, SLO_, num_requests=N, arrivals="replay", burst_cv=2.0)


def test_a_ttft_bound_is_judged_and_lowers_capacity(bursty):
    work, config = bursty
    res = serve(work, config, 0.5, arrivals="replay")
    ttft = slo_metrics(res)["ttft_p99_s"]
    assert slo_verdict(res, SLO(tbt_p99_s=1.0, scheduling_delay_p50_s=None, ttft_p99_s=ttft * 1.01)) == "meets the SLO"
    miss = slo_verdict(res, SLO(tbt_p99_s=1.0, scheduling_delay_p50_s=None, ttft_p99_s=ttft * 0.99))
    assert miss.startswith("P99 TTFT") and f"{ttft:.4g} s" in miss
    loose = capacity(work, config, SLO_, num_requests=N, arrivals="replay", rel_tol=0.1)
    tight = capacity(work, config, SLO(tbt_p99_s=0.1, scheduling_delay_p50_s=2.0, ttft_p99_s=0.5), num_requests=N,
                     arrivals="replay", rel_tol=0.1)
    assert tight.capacity_qps <= loose.capacity_qps
    assert "P99 TTFT <= 0.5 s" in str(tight.slo)
