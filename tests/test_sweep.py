"""kvlab.sweep: grid expansion, rows equal to direct simulate runs, executors agree, bad input."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab.lengths import profiles
from kvlab.sweep import sweep_keys

FIXED = {"model": "Llama-3-8B", "gpu": "H100-SXM", "pool_pages": 300}
GRID = {"policy": ["vllm", "reserve_max"], "max_new_tokens": [64, 256]}


@pytest.fixture(scope="module")
def workload() -> pd.DataFrame:
    return profiles.profile("seed-figures").sample(40, seed=7)


@pytest.fixture(scope="module")
def serial_table(workload) -> pd.DataFrame:
    grid = {**GRID, "arrivals": ["poisson"], "qps": [20.0]}
    return kvlab.sweep(workload, grid, fixed=FIXED, seeds=[0, 3], progress=False)


def test_rows_are_the_direct_simulations_in_grid_order(serial_table, workload):
    # Second implementation: the same runs through kvlab.simulate, in itertools.product order
    # written out by hand (first key slowest, seeds fastest).
    expected = []
    for policy in ("vllm", "reserve_max"):
        for cap in (64, 256):
            for seed in (0, 3):
                res = kvlab.simulate(workload, policy, max_new_tokens=cap, arrivals="poisson", qps=20.0,
                                     seed=seed, **FIXED)
                expected.append({"policy": policy, "max_new_tokens": cap, "seed": seed, **res.params,
                                 **res.summary})
    assert len(serial_table) == 8
    for row, exp in zip(serial_table.to_dict("records"), expected):
        for key, value in exp.items():
            got = row[key]
            assert got == value or (isinstance(value, float) and math.isnan(value) and math.isnan(got)), key


def test_leading_columns_are_the_configuration_then_seed(serial_table):
    assert list(serial_table.columns[:7]) == ["policy", "max_new_tokens", "arrivals", "qps", "model", "gpu",
                                              "pool_pages"]
    assert serial_table.columns[7] == "seed"
    assert {"tokens_per_s", "ttft_p99_s", "mean_kv_used_frac", "engine", "block_size"} <= set(serial_table.columns)


def test_processes_return_the_same_table(serial_table, workload):
    grid = {**GRID, "arrivals": ["poisson"], "qps": [20.0]}
    table = kvlab.sweep(workload, grid, fixed=FIXED, seeds=[0, 3], executor="processes", max_workers=2,
                        progress=False)
    pd.testing.assert_frame_equal(table, serial_table)


def test_dask_local_cluster_returns_the_same_table(serial_table, workload):
    distributed = pytest.importorskip("distributed")
    grid = {**GRID, "arrivals": ["poisson"], "qps": [20.0]}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) \
            as cluster, distributed.Client(cluster) as client:
        table = kvlab.sweep(workload, grid, fixed=FIXED, seeds=[0, 3], executor=client, progress=False)
        by_address = kvlab.sweep(workload, grid, fixed=FIXED, seeds=[0, 3], executor=cluster.scheduler_address,
                                 progress=False)
    pd.testing.assert_frame_equal(table, serial_table)
    pd.testing.assert_frame_equal(by_address, serial_table)


def test_seed_reaches_arrivals_but_not_offline_runs(workload):
    # Offline arrivals and unseeded policies: the seed changes nothing. Poisson arrivals: it does.
    table = kvlab.sweep(workload, {"arrivals": ["offline", "poisson"]}, fixed={**FIXED, "qps": 10.0},
                        seeds=[1, 2], progress=False)
    offline, poisson = table[table.arrivals == "offline"], table[table.arrivals == "poisson"]
    assert offline["makespan_s"].nunique() == 1
    assert poisson["makespan_s"].nunique() == 2


def test_profile_workload_is_sampled_with_each_seed():
    table = kvlab.sweep("azure-2023-code", {"max_new_tokens": [128]}, num_requests=30, fixed=FIXED, seeds=[4, 5],
                        progress=False)
    for seed, row in zip((4, 5), table.itertuples()):
        requests = profiles.profile("azure-2023-code").sample(30, seed=seed)
        res = kvlab.simulate(requests, max_new_tokens=128, seed=seed, **FIXED)
        assert row.seed == seed
        assert row.tokens_per_s == res.summary["tokens_per_s"]
        assert row.num_requests == 30


def test_num_requests_of_a_table_are_its_first_rows_at_their_rate():
    # 30 requests arriving 0.1 s apart (10 requests/s); num_requests=12 serves rows 0-11 as they arrived.
    table = pd.DataFrame({"prompt_tokens": np.arange(1, 31) * 7, "output_tokens": np.arange(1, 31) % 9 + 1,
                          "arrival_s": np.arange(30) / 10.0})
    row = kvlab.sweep(table, {"max_new_tokens": [16]}, num_requests=12, fixed=FIXED, progress=False).iloc[0]
    direct = kvlab.simulate(table.iloc[:12], max_new_tokens=16, **FIXED).summary
    assert row.num_requests == 12 and row.makespan_s == direct["makespan_s"]


def test_list_of_grids_sweeps_policy_parameters(workload):
    grid = [{"policy": ["vllm"], "watermark_frac": [0.0, 0.5]}, {"policy": ["tgi"], "cap_tokens": [16, 64]}]
    table = kvlab.sweep(workload, grid, fixed={**FIXED, "max_new_tokens": 256}, progress=False)
    assert table[["policy", "watermark_frac", "cap_tokens"]].fillna(-1).values.tolist() == [
        ["vllm", 0.0, -1], ["vllm", 0.5, -1], ["tgi", -1, 16], ["tgi", -1, 64]]
    direct = kvlab.simulate(workload, "tgi", max_new_tokens=256, cap_tokens=16, **FIXED).summary
    assert table.loc[2, "preemptions_per_request"] == direct["preemptions_per_request"]
    # A 16-token reservation on a 256-token cap must preempt the longer outputs; 64 preempts fewer.
    assert table.loc[2, "preemptions_per_request"] >= table.loc[3, "preemptions_per_request"]
    assert table.loc[2, "preemptions_per_request"] > 0


def test_progress_bar_counts_configurations(workload, capsys):
    pytest.importorskip("tqdm")
    kvlab.sweep(workload, {"max_new_tokens": [32, 64, 128]}, fixed=FIXED, seeds=[0], progress=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "config" in err


def test_unknown_grid_key_lists_the_valid_ones(workload):
    with pytest.raises(ValueError, match="max_tokens") as info:
        kvlab.sweep(workload, {"max_tokens": [64]}, fixed=FIXED)
    for key in ("max_new_tokens", "block_size", "qps", "preemption_mode", "cap_tokens", "watermark_frac"):
        assert key in str(info.value)
    assert "workload" not in sweep_keys() and "seed" not in sweep_keys()


@pytest.mark.parametrize("kwargs, match", [
    ({"grid": {"seed": [0, 1]}}, "seeds="),
    ({"grid": {"policy": "vllm"}}, r"grid\['policy'\] must be a list"),
    ({"grid": {"block_size": []}}, r"grid\['block_size'\] is empty"),
    ({"grid": {"block_size": [16]}, "fixed": {**FIXED, "block_size": 32}}, "both set"),
    ({"grid": {"policy": ["vllm", "tgi"], "cap_tokens": [64]}}, "policy 'vllm' takes no parameter"),
    ({"grid": {"policy": ["nope"]}}, "policy 'nope' is unknown"),
    ({"grid": {"block_size": [16]}, "fixed": {"gpu": "H100-SXM"}}, "needs 'model'"),
    ({"grid": {"block_size": [16]}, "seeds": [1, 1]}, "seeds must not repeat"),
    ({"grid": {"block_size": [16]}, "seeds": [-1]}, "seeds must be a non-negative integer"),
    ({"grid": {"block_size": [16]}, "executor": "proceses"}, "executor 'proceses' is unknown"),
    ({"grid": {"block_size": [16]}, "num_requests": 41}, "more than the trace's 40 requests"),
    ({"grid": []}, "grid is empty"),
])
def test_bad_sweep_arguments(workload, kwargs, match):
    kwargs = {"fixed": FIXED, **kwargs}
    with pytest.raises(ValueError, match=match):
        kvlab.sweep(workload, progress=False, **kwargs)


def test_profile_needs_num_requests_and_a_known_name():
    with pytest.raises(ValueError, match="num_requests must be given"):
        kvlab.sweep("seed-figures", {"block_size": [16]}, fixed=FIXED)
    with pytest.raises(ValueError, match="workload profile 'sharegpt' is unknown"):
        kvlab.sweep("sharegpt", {"block_size": [16]}, num_requests=5, fixed=FIXED)


def test_a_configuration_simulate_rejects_is_named(workload):
    with pytest.raises(ValueError, match=r"configuration \{'block_size': 0.*block_size must be a positive"):
        kvlab.sweep(workload, {"block_size": [16, 0]}, fixed=FIXED, progress=False)


def test_numpy_grid_values_are_plain_python(workload):
    table = kvlab.sweep(workload, {"max_new_tokens": np.array([64, 128])}, fixed=FIXED, progress=False)
    assert table["max_new_tokens"].tolist() == [64, 128]
    assert table["max_new_tokens"].dtype == np.int64


@pytest.mark.gpu
def test_cupy_sweep_equals_numpy_serial_and_in_processes(workload, monkeypatch):
    grid = {"policy": ["vllm", "tgi"], "preemption_mode": ["recompute", "swap"]}
    monkeypatch.setenv("KVLAB_BACKEND", "numpy")
    host = kvlab.sweep(workload, grid, fixed=FIXED, progress=False)
    monkeypatch.setenv("KVLAB_BACKEND", "cupy")
    device = kvlab.sweep(workload, grid, fixed=FIXED, progress=False)
    # Worker processes on CuPy are spawned (a forked child cannot use its parent's CUDA context).
    device_procs = kvlab.sweep(workload, grid, fixed=FIXED, executor="processes", max_workers=2, progress=False)
    pd.testing.assert_frame_equal(device, host)
    pd.testing.assert_frame_equal(device_procs, host)


@pytest.mark.slow
def test_dask_local_executor_starts_and_closes_its_own_cluster(workload):
    pytest.importorskip("distributed")
    grid = {"max_new_tokens": [64, 256]}
    table = kvlab.sweep(workload, grid, fixed=FIXED, executor="dask-local", max_workers=1, progress=False)
    pd.testing.assert_frame_equal(table, kvlab.sweep(workload, grid, fixed=FIXED, progress=False))
