"""kvlab.recommend: the real load, capacity per setting, ties, the context clamp, overload, flags."""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab.capacity import SLO, ServingConfig, capacity, serve, slo_verdict
from kvlab.recommend import (DEFAULT_SLO, LATENCY_COLUMNS, RESERVATION, command_line, fit_to_context,
                             output_percentiles, recipe_claims, recommend, settings)

MODEL, GPU = "Llama-2-7B", "A100-40GB"  # a small KV pool (2,873 pages): windows of 400 requests fill it


def _trace(n: int, rate_per_s: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"prompt_tokens": rng.integers(200, 1500, n),
                         "output_tokens": np.maximum(1, np.round(np.exp(rng.normal(4.5, 0.8, n)))).astype(int),
                         "arrival_s": np.cumsum(rng.exponential(1.0 / rate_per_s, n))})


@pytest.fixture(scope="module")
def at_20():
    trace = _trace(1500, 20.0)
    vllm = settings("vllm", model=MODEL, gpu=GPU)[:2]  # default and max_num_seqs=128
    return trace, recommend(trace, model=MODEL, gpu=GPU, candidates=vllm, num_requests=600, num_windows=2,
                            window_requests=400, seed=3)


def test_offered_rate_is_the_traces(at_20):
    trace, rec = at_20
    t = trace["arrival_s"].to_numpy()[:600]
    assert rec.load["rate_per_s"] == pytest.approx(599 / (t[-1] - t[0]))
    # what the simulator was offered, read back from its own request table
    for rate in rec.table["offered_rate_per_s"]:
        assert rate == pytest.approx(20.0, rel=0.05)
    assert rec.load["num_requests"] == 600 and rec.load["how"] == "window"
    assert set(LATENCY_COLUMNS) <= set(rec.table.columns)


def test_capacity_is_a_direct_capacity_call(at_20):
    trace, rec = at_20
    # the default vLLM V1 setting written out by hand, on the second window (rows 1100-1499): an A100
    # gets 256 sequences and 2,048 tokens (get_batch_defaults), 0.92 of its memory (vllm/config/cache.py),
    # and schedules asynchronously (the default from vLLM 0.14)
    config = ServingConfig(model=MODEL, gpu=GPU, policy="vllm", policy_params={"watermark_frac": 0.0},
                           max_num_seqs=256, max_num_batched_tokens=2048, scheduler="chunked",
                           max_new_tokens=int(trace["output_tokens"].max()), block_size=16,
                           pool_pages=kvlab.pool_pages(MODEL, GPU, gpu_memory_utilization=0.92),
                           async_scheduling=True)
    window = trace.iloc[1100:1500].reset_index(drop=True)  # with its own arrival times
    # the grid starts at the power of two nearest the offered ~20 requests/s, whatever the load
    direct = capacity(window, config, SLO(tbt_p99_s=0.1, scheduling_delay_p50_s=2.0), num_requests=400, seed=4,
                      qps_start=16.0, rel_tol=0.05, arrivals="replay")
    assert rec.setup["capacity_arrivals"] == "replay" and rec.setup["capacity_grid_start_qps"] == 16.0
    assert rec.capacities["vllm: default"][1] == direct.capacity_qps
    row = rec.row("vllm: default")
    caps = rec.capacities["vllm: default"]
    assert row["capacity_lo_qps"] == min(caps) and row["capacity_hi_qps"] == max(caps)


def test_overloaded_names_replicas_of_the_printed_setting_and_one_share_agrees(at_20):
    trace, rec = at_20
    best = rec.table.loc[rec.table["capacity_qps"].idxmax()]
    assert best["capacity_qps"] < 20.0 * 0.95  # this GPU cannot carry 20 requests/s
    assert rec.decision == "overloaded" and rec.chosen is not None
    row = rec.row(rec.chosen)
    assert row["recommended"] and int(rec.table["recommended"].sum()) == 1
    # the printed flags are the chosen setting's, and its capacity sizes the replicas
    assert list(rec.flags["setting"]) == [row["setting"]]
    n = int(row["replicas"])
    rate = rec.load["rate_per_s"]
    assert n == math.ceil(rate / row["capacity_qps"] - 1e-9) and n * row["capacity_qps"] >= rate
    assert f"run {n} replicas of it" in rec.answer and rec.chosen in rec.answer
    assert f"--rate-scale {1 / n:.4g}" in rec.what_to_do
    assert rec.check["replicas"] == n and rec.check["rate_per_s"] == pytest.approx(rate / n)
    # one replica's share: the same setting, now on one replica, with the same capacities
    vllm = settings("vllm", model=MODEL, gpu=GPU)[:2]
    share = recommend(trace, model=MODEL, gpu=GPU, candidates=vllm, num_requests=600, num_windows=2,
                      window_requests=400, seed=3, rate_scale=1 / n)
    assert share.load["rate_per_s"] == pytest.approx(rate / n)
    assert share.chosen == rec.chosen and share.decision != "overloaded"
    assert int(share.row(share.chosen)["replicas"]) == 1
    assert share.capacities == rec.capacities
    assert list(share.flags["command"]) == list(rec.flags["command"])


def test_an_overloaded_comparison_of_defaults_points_to_the_search_of_a_system(at_20):
    """N replicas of a system's default are no answer to buy GPUs on: the comparison's advice says
    to search that system's settings first; one system's search (already searched) does not."""
    _, rec = at_20
    n, system = int(rec.row(rec.chosen)["replicas"]), rec.row(rec.chosen)["system"]
    assert n > 1 and rec.setup["system"] == "vllm" and "--system" not in rec.what_to_do
    compared = dataclasses.replace(rec, setup={**rec.setup, "system": "comparison"})
    assert compared.what_to_do.startswith(rec.what_to_do)
    assert f"before launching {n} replicas, re-run with --system {system}" in compared.what_to_do


def test_identical_settings_tie_and_all_ties_keep_the_default():
    trace = _trace(600, 0.3, seed=1)
    base = settings("vllm", model=MODEL, gpu=GPU)[0]
    twin = dataclasses.replace(base, label="twin", knob="max_num_seqs")  # the same server under another name
    starved = dataclasses.replace(base, label="max_num_seqs=2", knob="max_num_seqs", max_num_seqs=2)
    kw = dict(model=MODEL, gpu=GPU, num_requests=150, num_windows=2, window_requests=150)
    rec = recommend(trace, candidates=[twin, base, starved], **kw)
    t = rec.table.set_index("setting")
    assert t.loc["twin", "capacity_qps"] == t.loc["default", "capacity_qps"]
    assert t.loc["twin", "tie"] and t.loc["default", "tie"] and not t.loc["max_num_seqs=2", "tie"]
    assert rec.decision == "keep-default" and rec.chosen == "vllm: default"
    both = recommend(trace, candidates=[twin, base], **kw)
    assert both.decision == "all-tie" and both.chosen == "vllm: default"
    assert "not the bottleneck" in both.answer and "keep the server default" in both.answer


def test_context_clamp_counts_what_does_not_fit():
    # Llama-3-8B: 8,192 tokens of context
    trace = pd.DataFrame({"prompt_tokens": [100, 8191, 8192, 9000, 5000, 300],
                          "output_tokens": [50, 10, 5, 5, 4000, 900]})
    served, fit = fit_to_context(trace, model="Llama-3-8B", max_new_tokens=None)
    assert fit.max_context_tokens == 8192
    assert fit.prompts_over_context == 2  # 8192 and 9000 leave no room for a token
    assert fit.outputs_over_context == 2  # 8191 + 10 and 5000 + 4000 run past 8192
    assert served["output_tokens"].tolist() == [50, 1, 3192, 900]
    assert fit.max_new_tokens == 4000 and fit.max_model_len == 8192
    for s in ("vllm", "sglang", "tgi", "tensorrt-llm"):
        cmd = command_line(settings(s, model="Llama-3-8B", gpu="H100-SXM")[0], model="Llama-3-8B",
                           max_model_len=fit.max_model_len, max_prompt_tokens=fit.max_model_len - 1,
                           max_new_tokens=fit.max_new_tokens)
        lens = [int(x) for x in re.findall(r"(?:max-model-len|context-length|max-total-tokens|max_seq_len) (\d+)",
                                           cmd)]
        assert lens and max(lens) <= 8192, cmd
    _, capped = fit_to_context(trace, model="Llama-3-8B", max_new_tokens=20000)
    assert capped.max_new_tokens == 8191 and "clamped" in " ".join(capped.warnings())
    # the user's own context: prompts of 4,096 tokens or more are refused, outputs cut at 4,096
    served, mine = fit_to_context(trace, model="Llama-3-8B", max_new_tokens=None, max_model_len=4096)
    assert mine.max_model_len == 4096 and mine.max_context_tokens == 8192
    assert mine.prompts_over_context == 4 and served["output_tokens"].tolist() == [50, 900]
    assert mine.refused().startswith("4 of 6 requests (66.7%) are refused") and mine.served_frac == 2 / 6
    with pytest.raises(ValueError, match="above Llama-3-8B's context of 8,192"):
        fit_to_context(trace, model="Llama-3-8B", max_new_tokens=None, max_model_len=9000)


def test_default_cap_is_the_traces_detected_cap():
    trace = pd.DataFrame({"prompt_tokens": [10, 20, 30], "output_tokens": [5, 7, 9]})
    trace.attrs["detected_cap_tokens"] = 1000
    _, fit = fit_to_context(trace, model="Llama-3-8B", max_new_tokens=None)
    assert fit.max_new_tokens == 1000 and fit.cap_source == "the trace's detected cap"


def test_small_trace_warns_with_the_number_needed():
    rec = recommend(_trace(300, 1.0), model=MODEL, gpu=GPU, candidates=settings("vllm", model=MODEL, gpu=GPU)[:1],
                    num_windows=3, window_requests=200)
    assert any("needs at least 600" in w for w in rec.warnings)
    assert len(rec.capacities["vllm: default"]) == 3


def test_systems_offer_only_what_they_can_set():
    vllm = settings("vllm", model="Llama-3-8B", gpu="H100-SXM")
    assert {s.policy for s in vllm} == {"vllm_v1"}
    # V1 recomputes; the one host tier is --kv-offloading-size, labelled CPU offload, never "swap"
    assert {s.overflow for s in vllm} == {"recompute", "cpu offload"}
    offload = [s for s in vllm if s.overflow == "cpu offload"]
    assert len(offload) == 1 and offload[0].flags["--kv-offloading-size"] == 16 and offload[0].host_pool_gib == 16
    assert not any("--preemption-mode" in s.flags or "--swap-space" in s.flags for s in vllm)
    assert vllm[0].is_default and sum(s.is_default for s in vllm) == 1
    v0 = settings("vllm==0.8", model="Llama-3-8B", gpu="H100-SXM")  # the V0 engine still swaps, labelled so
    assert [s.overflow for s in v0 if s.preemption_mode == "swap"] == ["swap"]
    trt = {s.label: s for s in settings("tensorrt-llm", model="Llama-3-8B", gpu="H100-SXM",
                                        percentiles={"p99": 600}, max_new_tokens=1000)}
    assert trt["default"].policy == "reserve_max" and trt["max_tokens=600"].output_cap_tokens == 600
    tgi = settings("tgi", model="Llama-3-8B", gpu="H100-SXM")
    assert all(s.policy_params["cap_tokens"] == 1024 for s in tgi)  # TGI's cap is not a flag
    assert not any("--max-batch-size" in s.flags for s in tgi)  # ignored with prefill chunking (backend.rs)
    pct = {"p50": 10, "p95": 40, "p99": 80}
    recipe = settings(RESERVATION, model="Llama-3-8B", gpu="H100-SXM", percentiles=pct, max_new_tokens=64)
    # p99 = 80 >= the 64-token cap reserves everything anyway: not offered
    assert [s.label for s in recipe] == ["reserve max_new_tokens", "reserve p50, recompute", "reserve p50, swap",
                                         "reserve p50, reject", "reserve p95, recompute", "reserve p95, swap",
                                         "reserve p95, reject"]


def test_output_percentiles_by_hand():
    # numpy's linear percentile of 1..100: p50 = 50.5, p90 = 90.1, p99 = 99.01; rounded up
    assert output_percentiles(np.arange(1, 101), (50, 90, 99)) == {"p50": 51, "p90": 91, "p99": 100}


def test_recipe_claims_read_the_reservation_search():
    trace = pd.DataFrame({"prompt_tokens": 64, "output_tokens": [8] * 90 + [40] * 10,
                          "arrival_s": np.arange(100) * 0.05})
    few = settings(RESERVATION, model=MODEL, gpu=GPU, percentiles={"p50": 8}, max_new_tokens=64)[:2]
    main = recommend(trace, model=MODEL, gpu=GPU, candidates=few, percentiles=(50, 99), num_windows=1,
                     window_requests=100, max_new_tokens=64)
    with pytest.raises(ValueError, match="must be lighter"):
        recipe_claims(main, main)
    vllm = recommend(trace, model=MODEL, gpu=GPU, candidates=settings("vllm", model=MODEL, gpu=GPU)[:1],
                     num_windows=1, window_requests=100)
    with pytest.raises(ValueError, match="reservation"):
        recipe_claims(vllm, main)


def test_bad_input():
    trace = _trace(50, 1.0)
    with pytest.raises(ValueError, match="output_tokens"):
        recommend(trace.drop(columns="output_tokens"), model=MODEL, gpu=GPU)
    with pytest.raises(ValueError, match="system 'triton' is unknown"):
        recommend(trace, model=MODEL, gpu=GPU, system="triton")
    with pytest.raises(ValueError, match="slo must be a kvlab.capacity.SLO"):
        recommend(trace, model=MODEL, gpu=GPU, slo=0.1)
    with pytest.raises(ValueError, match="max_unserved_frac"):
        recommend(trace, model=MODEL, gpu=GPU, max_unserved_frac=2.0)
    with pytest.raises(ValueError, match="candidates"):
        recommend(trace, model=MODEL, gpu=GPU, candidates=[])
    with pytest.raises(ValueError, match="no prompt of the trace fits"):
        recommend(pd.DataFrame({"prompt_tokens": [5000], "output_tokens": [3]}), model=MODEL, gpu=GPU)
    assert DEFAULT_SLO.tbt_p99_s == 0.1 and DEFAULT_SLO.scheduling_delay_p50_s == 2.0


def test_serve_at_the_workloads_own_times_is_simulate_with_them():
    trace = _trace(120, 3.0, seed=2)
    config = ServingConfig(model=MODEL, gpu=GPU, policy="vllm", max_num_seqs=64, max_new_tokens=400)
    got = serve(trace, config, None, seed=1).summary
    direct = kvlab.simulate(trace, "vllm", model=MODEL, gpu=GPU, max_num_seqs=64, max_new_tokens=400, seed=1,
                            pool_pages=config.engine_pool_pages(), cost_model=config.cost()).summary
    assert got["makespan_s"] == direct["makespan_s"] and got["tbt_p99_s"] == direct["tbt_p99_s"]
    assert slo_verdict(serve(trace, config, None), SLO(tbt_p99_s=1e-6)) \
        .startswith("P99 TBT")


def test_what_binds_is_named_without_its_numbers():
    from kvlab.recommend.core import _limit

    assert _limit("P99 TBT 0.1234 s > 0.1 s") == "P99 TBT"
    assert _limit("median scheduling delay 3.1 s > 2 s; P99 TBT 0.2 s > 0.1 s") == "median scheduling delay"
    assert _limit("P99 TTFT 5.2 s > 1 s") == "P99 TTFT"
    assert _limit("3 requests aborted") == "aborted requests"
    assert _limit("not sustained: 2.8% of the requests still wait when the last arrives (> 2.5%: the queue grows)") \
        == "a growing queue (requests still waiting when the last arrives)"
    assert _limit("converged: meets the SLO at 3 requests/s") == ""


def test_h200_and_h100_differ_where_their_specs_do_and_an_unmeasured_gpu_says_so():
    rng = np.random.default_rng(0)
    n = 300  # short prompts, long outputs: decode reads weights and KV, so HBM bandwidth binds
    trace = pd.DataFrame({"prompt_tokens": rng.integers(100, 400, n), "output_tokens": rng.integers(200, 600, n),
                          "arrival_s": np.cumsum(rng.exponential(0.1, n))})
    kw = dict(model="Llama-3-8B", num_windows=1, window_requests=n, cost_model="roofline", rel_tol=0.05,
              slo=SLO(tbt_p99_s=0.015, scheduling_delay_p50_s=2.0))
    caps = {}
    for gpu in ("H100-SXM", "H200", "MI300X"):  # MI300X has no measurements (the H200 has NVIDIA's vLLM GEMMs)
        rec = recommend(trace, gpu=gpu, candidates=settings("vllm", model="Llama-3-8B", gpu=gpu)[:1], **kw)
        caps[gpu] = rec.table["capacity_qps"].iloc[0]
        assert rec.setup["gpu_measured"] == (gpu != "MI300X")
        assert ("GPU not measured: spec-sheet estimate for MI300X" in " ".join(str(rec).split())) == (gpu == "MI300X")
    # 4.8 vs 3.35 TB/s: more than the search's 5% apart (the same FLOP/s would not separate them)
    assert caps["H200"] > caps["H100-SXM"] * 1.05 ** 2


# --- KV precision and what binds ----------------------------------------------------------------

def _long_prompts(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"prompt_tokens": rng.integers(2500, 3500, n), "output_tokens": rng.integers(300, 600, n)})


def test_fp8_kv_doubles_the_pool_and_moves_capacity_where_kv_binds():
    # Llama-3-8B on an L4: ~2,400 pages of 16 tokens hold 11 of these 3,000-token requests; FP8 holds twice as many
    from kvlab.recommend import serving_config
    work = _long_prompts()
    by = {s.label: s for s in settings("vllm", model="Llama-3-8B", gpu="L4")}
    slo = SLO(tbt_p99_s=2.0, scheduling_delay_p50_s=2.0)
    res = {}
    for label in ("default", "kv_cache_dtype=fp8"):
        config = serving_config(by[label], model="Llama-3-8B", gpu="L4", tp=1, block_size=16, max_new_tokens=600)
        res[label] = (config.pool_pages, capacity(work, config, slo, num_requests=200, seed=0))
    (bf16_pages, bf16), (fp8_pages, fp8) = res["default"], res["kv_cache_dtype=fp8"]
    assert fp8_pages in (2 * bf16_pages, 2 * bf16_pages + 1)
    assert (bf16.trials["num_preempted_requests"] > 0).any()  # KV binds: the pool preempts at these loads
    assert fp8.capacity_qps >= 1.5 * bf16.capacity_qps > 0


def _row(setting, knob, cap, lo, hi, *, default=False, binding="median scheduling delay 2.5 s > 2 s",
         kv_at=float("nan"), tried=40.0, policy="vllm"):
    return {"system": "vllm", "setting": setting, "knob": knob, "default": default, "capacity_qps": cap,
            "capacity_lo_qps": lo, "capacity_hi_qps": hi, "binding": binding, "kv_binds_at_qps": kv_at,
            "max_tried_qps": tried, "policy": policy}


def test_what_binds_by_hand():
    """Per-window capacities (requests/s, 3 windows), compared window by window at a 5% grid."""
    from kvlab.recommend import what_binds
    table = pd.DataFrame([_row("default", "default", 11.8, 11.0, 12.5, default=True, kv_at=30.0),
                          _row("gpu_memory_utilization=0.95", "gpu_memory_utilization", 12.0, 11.2, 12.9),
                          _row("kv_cache_dtype=fp8", "kv_cache_dtype", 11.5, 10.9, 12.2),
                          _row("max_num_batched_tokens=2048", "max_num_batched_tokens", 24.2, 23.0, 25.1)])
    # gpu_memory_utilization is higher in every window, but within the grid's 5%: no move
    windows = np.array([[11.0, 11.8, 12.5], [11.2, 12.0, 12.9], [10.9, 11.5, 12.2], [23.0, 24.2, 25.1]])
    kv = table["knob"].isin(["gpu_memory_utilization", "kv_cache_dtype"])
    text = what_binds(table, kv, windows, 0.05)
    assert text.startswith("KV memory does not bind at this load: what binds at the default is median scheduling "
                           "delay")
    assert "the knob that moves it is max_num_batched_tokens (max_num_batched_tokens=2048: 24.2" in text
    assert "at the default KV starts to bind at 30 requests/s" in text
    # a KV knob higher in every window by more than the grid: KV binds, nothing to say
    moved = windows.copy()
    moved[2] = [12.0, 12.5, 13.5]  # 9%, 6% and 8% above the default's windows
    assert what_binds(table, kv, moved, 0.05) == ""
    # the same knob higher in two windows and level in one: a tie, as before
    level = moved.copy()
    level[2, 1] = 11.8
    assert what_binds(table, kv, level, 0.05) == text
    # no preemption anywhere in the search: said so, with the highest rate it tried
    quiet = table.copy()
    quiet.loc[0, "kv_binds_at_qps"] = float("nan")
    assert "at the default no request was preempted for pages at any rate the capacity search tried (up to 40" in \
        what_binds(quiet, kv, windows, 0.05)
    # capacity's backlog rule read as what it means, not as its numbers
    queue = table.copy()
    queue.loc[0, "binding"] = "not sustained: 3.5% of the requests still wait when the last arrives (> 2.5%: ...)"
    assert "what binds at the default is a growing queue (requests still waiting" in what_binds(queue, kv, windows, 0.05)


def test_recommend_says_what_binds_when_kv_knobs_tie():
    trace = _trace(400, 2.0, seed=5)  # short requests on an H100: the pool is never the limit
    by = {s.label: s for s in settings("vllm", model="Llama-3-8B", gpu="H100-SXM")}
    picks = [by[k] for k in ("default", "kv_cache_dtype=fp8", "gpu_memory_utilization=0.95")]
    rec = recommend(trace, model="Llama-3-8B", gpu="H100-SXM", candidates=picks, num_windows=2,
                    window_requests=150, rel_tol=0.2)
    assert rec.decision in ("keep-default", "all-tie")
    assert "KV memory does not bind at this load: what binds at the default is" in rec.answer
    t = rec.table.set_index("setting")
    assert t.loc["kv_cache_dtype=fp8", "pool_pages"] in (2 * t.loc["default", "pool_pages"],
                                                         2 * t.loc["default", "pool_pages"] + 1)


def test_cpu_offload_is_a_host_pool_priced_by_the_host_link():
    from kvlab.recommend import serving_config
    from kvlab.swap import swap_model
    kw = dict(model="Llama-3-8B", gpu="H100-SXM", tp=1, block_size=16, max_new_tokens=1000)
    vllm = {s.label: s for s in settings("vllm", model="Llama-3-8B", gpu="H100-SXM")}
    off = serving_config(vllm["kv_offloading_size=16"], **kw)
    # --kv-offloading-size 16 (GiB) holds 16 GiB / (16 tokens x 131,072 bytes) = 8,192 pages
    assert (off.preemption_mode, off.cpu_pool_pages) == ("swap", 16 * 2**30 // (16 * 131_072)) == ("swap", 8192)
    assert serving_config(vllm["default"], **kw).cpu_pool_pages is None
    # each page moves at the GPU's host link (PCIe Gen5 x16, 63 GB/s) plus one copy's latency
    page_s = swap_model("Llama-3-8B", "H100-SXM").page_copy_s(16)
    assert page_s == pytest.approx(5e-6 + 16 * 131_072 / 63e9)
    # SGLang's hierarchical cache: a host pool of hicache_ratio (2) x the device pool
    sg = {s.label: s for s in settings("sglang", model="Llama-3-8B", gpu="H100-SXM")}
    host = serving_config(sg["hierarchical_cache=on"], **kw)
    device = serving_config(sg["default"], **kw).pool_pages
    assert host.preemption_mode == "swap" and abs(host.cpu_pool_pages - 2 * device) <= 2


def test_quantized_weights_shrink_memory_and_say_what_the_measured_model_cannot_price():
    from kvlab.specs import with_precision
    fp8 = with_precision("Llama-3-8B", weights="fp8")
    trace = _trace(120, 1.0, seed=4)
    rec = recommend(trace, model=fp8, gpu="H100-SXM", candidates=settings("vllm", model=fp8, gpu="H100-SXM")[:1],
                    num_windows=1, window_requests=100, rel_tol=0.3)
    assert rec.setup["model"] == "Llama-3-8B" and rec.setup["weights"] == "fp8"
    assert any("priced, not measured: one byte a weight at the GPU's FP8/BF16 dense-peak ratio" in w
               for w in rec.warnings)
    assert "FP8 weights: BF16 curve scaled by peak ratio" in rec.setup["cost_model"]  # as the warning says
    assert "--quantization fp8" in rec.flags["command"].iloc[0]
    plain = kvlab.pool_pages("Llama-3-8B", "H100-SXM", gpu_memory_utilization=0.92)
    assert rec.table["pool_pages"].iloc[0] > plain  # 7 GB fewer weight bytes hold more pages


def test_ties_are_paired_by_window_not_by_overlapping_intervals():
    """The same windows for every setting: a setting the best beats in every window does not tie
    it even when the two intervals overlap (the SGLang case on the Azure conversation trace:
    default [5.5-18] against [18-25]); one window where it does as well is a tie."""
    from kvlab.recommend.core import _ties

    best = [20.0, 19.0, 25.0, 18.0, 21.0]
    beaten = [10.0, 12.0, 18.0, 9.0, 11.0]  # its interval [9, 18] reaches the best's [18, 25]
    level = [10.0, 19.0, 11.0, 9.0, 12.0]  # as good as the best in window 2
    table = pd.DataFrame({"capacity_qps": [np.median(r) for r in (beaten, best, level)],
                          "capacity_lo_qps": [min(r) for r in (beaten, best, level)],
                          "default": [True, False, False]})
    windows = np.array([beaten, best, level])
    idx, tie = _ties(table, pd.Series(True, index=table.index), windows, 0.05)
    assert idx == 1
    assert list(tie) == [False, True, True]
    # an ineligible row never ties, and an eligible best always ties itself
    idx, tie = _ties(table, pd.Series([True, True, False]), windows, 0.05)
    assert idx == 1 and list(tie) == [False, True, False]
    # higher in every window but within the search's resolution: a tie
    close = np.array([[19.5, 18.5, 24.0, 17.5, 20.5], best, level])
    assert list(_ties(table, pd.Series(True, index=table.index), close, 0.05)[1]) == [True, True, True]


def test_workers_inherit_the_loop_the_parent_loaded(monkeypatch):
    """Before a worker pool forks, recommend runs the compiled loop once in the parent, so the
    workers inherit it: the ahead-of-time module loaded in the parent (kvlab.sim.fast.aot), or,
    with ``KVLAB_AOT=0``, Numba's compiled code (Numba records a signature on the dispatcher when
    it compiles or loads one)."""
    from kvlab.sim.fast import aot, load_loop, loop

    monkeypatch.setattr(aot, "_loaded", {})
    load_loop()
    folder, name = aot.cache_folder(), aot.module_name()
    if aot.c_compiler() is not None:  # else no module can be built: only the JIT's half below holds
        assert list(aot._loaded) == [aot.module_path(folder, name)]
    monkeypatch.setenv("KVLAB_AOT", "0")
    load_loop()
    assert loop.run_loop.signatures
