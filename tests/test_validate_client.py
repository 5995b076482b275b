"""kvlab.validate: a client that caps requests in flight, appended bench results, server defaults,
the generic shared-dataset reader, and catalogue lookups by Hugging Face id and nvidia-smi name."""
import json

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab import specs
from kvlab.validate import RunRecord, SetUp, compare, read_bench_results, read_shared, replay
from kvlab.validate.readers import read_dataset, setup_keys, with_server_defaults
from kvlab.validate.replay import client_send_times

MODEL, GPU = "Llama-2-7B", "A100-80GB-SXM"


def _brute_force_sends(arrival, service, cap):
    """Sends of a FIFO client with ``cap`` in flight and requests that take ``service`` s once sent:
    the k-th waits until fewer than ``cap`` earlier ones are unfinished (scanning candidate times)."""
    sent, fin = [], []
    for k, a in enumerate(arrival):
        t = max(a, sent[-1] if sent else a)
        for c in sorted([t] + [f for f in fin if f > t]):  # the moments the count can drop
            if sum(f > c for f in fin) < cap:
                t = c
                break
        sent.append(t)
        fin.append(t + service[k])
    return np.array(sent), np.array(fin)


def test_client_send_times_hand_worked():
    # four requests at 0 s, cap 2: #2 goes when #1 finishes (3 s), #3 when #2 finishes (4 s)
    got = client_send_times(np.zeros(4), np.array([5.0, 3.0, 4.0, 10.0]), 2)
    assert got.tolist() == [0.0, 0.0, 3.0, 4.0]
    assert client_send_times(np.zeros(4), np.array([5.0, 3.0, 4.0, 10.0]), None).tolist() == [0.0] * 4


@pytest.mark.parametrize("seed", range(5))
def test_client_send_times_match_a_brute_force_client(seed):
    rng = np.random.default_rng(seed)
    n, cap = 60, int(rng.integers(1, 6))
    arrival = np.cumsum(rng.exponential(0.3, n))
    sent, fin = _brute_force_sends(arrival, rng.exponential(2.0, n), cap)
    assert np.allclose(client_send_times(arrival, fin, cap), sent)


def _server_record(n=80, rate=30.0, cap=None, seed=0, **setup):
    """A record whose 'measurements' are kvlab's own replay of it (so errors are 0 by construction)."""
    rng = np.random.default_rng(seed)
    req = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                        "prompt_tokens": rng.integers(50, 600, n), "output_tokens": rng.integers(20, 200, n),
                        "ttft_s": 0.0, "tpot_s": 0.0, "e2e_s": 0.0})
    rec = RunRecord(SetUp(name=f"cap-{cap}", dataset="hand-made", model=MODEL, gpu=GPU, max_num_seqs=64,
                          max_concurrency=cap, **setup), req)
    p = replay(rec).predicted
    meas = req.assign(ttft_s=p["ttft_s"], tpot_s=p["tpot_s"], e2e_s=p["e2e_s"], client_queue_s=p["client_queue_s"])
    return RunRecord(rec.setup, meas)


def test_capped_replay_is_the_schedule_of_its_send_times():
    # Independent route: serve the predicted send times as plain arrivals on a server with a large
    # max_num_seqs and no cap (the client never has more than the cap in flight, so the server sees
    # the same requests at the same moments): TTFT and E2E from the send must be the same.
    rec = _server_record(cap=6)
    pred = replay(rec).predicted
    sent = rec.requests["arrival_s"] + pred["client_queue_s"]
    assert pred["client_queue_s"].max() > 1.0  # the cap binds at 30 req/s
    # sent a nanosecond early: a send is a finish time, the start of the next iteration, and the
    # arrival + queue sum may round above it
    w = rec.workload().assign(arrival_s=np.maximum(sent - 1e-9, 0.0))
    res = kvlab.simulate(w, "vllm", model=MODEL, gpu=GPU, max_num_seqs=256, max_num_batched_tokens=2048,
                         gpu_memory_utilization=0.92, max_new_tokens=int(w["output_tokens"].max()),
                         async_scheduling=rec.setup.schedules_async)
    assert np.allclose(res.requests["ttft_s"], pred["ttft_s"], atol=1e-8)
    assert np.allclose(res.requests["e2e_s"], pred["e2e_s"], atol=1e-8)


def test_a_cap_hides_overload_from_ttft_but_not_from_the_overload_call():
    free, capped = replay(_server_record(n=200, rate=150.0)), replay(_server_record(n=200, rate=150.0, cap=6))
    row_free, row_cap = compare(free), compare(capped)
    assert row_free["overload_pred"]  # 150 req/s is past this server's capacity
    assert row_cap["ttft_mean_pred"] < row_free["ttft_mean_pred"] / 3  # the client holds the queue
    assert row_cap["client_queue_mean_pred"] > 1.0 and row_free["client_queue_mean_pred"] == 0.0
    assert row_cap["overload_pred"] and row_cap["overload_meas"]  # the client's queue grows: overload
    assert abs(row_cap["ttft_mean_err"]) < 1e-9 and abs(row_cap["e2e_mean_err"]) < 1e-9


def _bench_json(rec: RunRecord, rate: float, cap: int | None) -> dict:
    r = rec.requests
    sent = r["arrival_s"] + r["client_queue_s"]
    return {"request_rate": rate, "burstiness": 1.0, "max_concurrency": cap,
            "input_lens": r["prompt_tokens"].tolist(), "output_lens": r["output_tokens"].tolist(),
            "ttfts": r["ttft_s"].tolist(), "itls": [[t] * (int(n) - 1) for t, n in zip(r["tpot_s"], r["output_tokens"])],
            "start_times": (100.0 + sent).tolist(), "queue_times": r["client_queue_s"].tolist(),
            "errors": [""] * len(r)}


def test_appended_results_are_stages_with_the_cap_and_queue_times(tmp_path):
    a, b = _server_record(cap=6, rate=30.0), _server_record(cap=None, rate=5.0, seed=1)
    path = tmp_path / "stages.json"
    path.write_text(json.dumps(_bench_json(a, 30.0, 6)) + "\n" + json.dumps(_bench_json(b, 5.0, None)) + "\n")
    (tmp_path / "s.yaml").write_text(f"name: h\nmodel: {specs.model(MODEL).hf_id}\ngpu: NVIDIA A100-SXM4-80GB\n"
                                     "server_version: 0.15.1\nmax_num_seqs: 64\n")
    got = read_bench_results(path, tmp_path / "s.yaml")
    assert [g.name for g in got] == ["h-1", "h-2"]
    assert got[0].setup.max_concurrency == 6 and got[1].setup.max_concurrency is None
    assert np.allclose(got[0].requests["arrival_s"], a.requests["arrival_s"] - a.requests["arrival_s"].iloc[0])
    assert np.allclose(got[0].requests["client_queue_s"], a.requests["client_queue_s"])
    row = compare(replay(got[0]))
    assert abs(row["ttft_mean_err"]) < 1e-6 and row["overload_right"]
    (tmp_path / "bad.json").write_text(json.dumps(_bench_json(a, 30.0, 6)) + "\n{not json\n")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        read_bench_results(tmp_path / "bad.json", tmp_path / "s.yaml")


def test_missing_flags_are_the_servers_defaults_for_its_version_and_gpu():
    notes: list[str] = []
    h100 = with_server_defaults({"name": "x", "model": "Llama-2-7B", "gpu": "H100-SXM", "server_version": "0.15.1"},
                                notes)
    # vLLM >= 0.11 on a >= 70 GiB GPU that is not an A100: 1024 sequences, 8192 tokens, prefix caching
    assert (h100["max_num_seqs"], h100["max_num_batched_tokens"], h100["prefix_caching"]) == (1024, 8192, True)
    assert h100["engine"] == "vllm-v1" and h100["scheduler"] == "chunked" and "max_num_seqs=1024" in notes[0]
    a100 = with_server_defaults({"name": "x", "model": "Llama-2-7B", "gpu": "A100-80GB-SXM", "max_num_seqs": 64}, [])
    assert (a100["max_num_seqs"], a100["max_num_batched_tokens"]) == (64, 2048)  # given value kept
    v0 = with_server_defaults({"name": "x", "model": "OPT-13B", "gpu": "A100-80GB-SXM", "server_version": "0.6.3"}, [])
    assert v0["engine"] == "vllm-v0" and v0["scheduler"] == "prefill_first" and not v0["prefix_caching"]


def test_a_new_dataset_in_the_shared_layout_is_read(tmp_path):
    recs = [_server_record(cap=None, rate=r, seed=s) for r, s in ((4.0, 2), (9.0, 3))]
    summ = pd.DataFrame({"run": [f"r{i}" for i in range(2)], "model": specs.model(MODEL).hf_id,
                         "gpu": "NVIDIA A100-SXM4-80GB (datasheet)", "tp": 1, "vllm_version": "0.15.1",
                         "max_num_seqs": 64, "num_gpu_blocks": [np.nan, 5000], "enable_prefix_caching": "False"})
    req = pd.concat([r.requests.drop(columns="client_queue_s").assign(run=f"r{i}") for i, r in enumerate(recs)])
    summ.to_csv(tmp_path / "h100_vllm_summary.csv", index=False)
    req.rename(columns={"prompt_tokens": "input_tokens"}).to_csv(tmp_path / "h100_vllm_requests.csv", index=False)
    got = read_shared(tmp_path)
    assert [g.setup.dataset for g in got] == ["h100-vllm"] * 2
    assert got[0].setup.gpu == GPU and got[0].setup.model == MODEL and got[1].setup.pool_pages == 5000
    assert got[0].setup.max_num_batched_tokens == 2048 and not got[0].setup.prefix_caching
    assert np.allclose(got[0].requests["e2e_s"], recs[0].requests["e2e_s"])
    assert abs(compare(replay(got[0]))["e2e_mean_err"]) < 1e-9
    pd.DataFrame({"run": ["r0"], "model": [MODEL]}).to_csv(tmp_path / "bad_summary.csv", index=False)
    req.to_csv(tmp_path / "bad_requests.csv", index=False)
    with pytest.raises(ValueError, match="bad_summary.csv: lacks column.*gpu"):
        read_dataset(tmp_path / "bad_summary.csv", tmp_path / "bad_requests.csv")
    # the servers' own flag names as columns are the same keys (tensor_parallel_size is TP, not a column dropped)
    summ.assign(tensor_parallel_size=2, kv_cache_dtype="fp8_e5m2", quantization="fp8").drop(columns="tp").to_csv(
        tmp_path / "flags_summary.csv", index=False)
    flags = read_dataset(tmp_path / "flags_summary.csv", tmp_path / "h100_vllm_requests.csv")[0].setup
    assert (flags.tp, flags.kv_cache_dtype, flags.weight_dtype) == (2, "fp8", "fp8")


def test_catalogue_answers_to_hugging_face_ids_and_nvidia_smi_names():
    assert specs.model("meta-llama/Llama-2-70b-hf").name == "Llama-2-70B"
    assert specs.model("CODELLAMA/codellama-34b-hf").name == "CodeLlama-34B"
    assert with_server_defaults({"model": "codellama/CodeLlama-34b-Instruct-hf", "gpu": "H100-SXM", "tp": 2},
                                [])["model"] == "CodeLlama-34B"
    assert specs.gpu("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert specs.gpu("NVIDIA GeForce RTX 4090").name == "RTX4090"
    with pytest.raises(ValueError, match="unknown GPU 'NVIDIA H100 NVL'"):
        specs.gpu("NVIDIA H100 NVL")
    # nvidia-smi's names without "NVIDIA", and the form factor as clouds write it; a bare "H100" or "A100 80GB"
    # (PCIe or SXM: up to 2x apart in bandwidth) stays a question
    assert [specs.gpu(g).name for g in ("H100 80GB HBM3", "H100-SXM5-80GB", "A100-SXM4-80GB", "H200 SXM",
                                        "GeForce RTX 4090")] == ["H100-SXM", "H100-SXM", "A100-80GB-SXM", "H200",
                                                                 "RTX4090"]
    for ambiguous in ("H100", "A100 80GB"):
        with pytest.raises(ValueError, match=f"unknown GPU '{ambiguous}'; did you mean"):
            specs.gpu(ambiguous)


def test_a_set_up_may_name_the_servers_own_flags():
    """Flags copied from a vllm serve or sglang.launch_server command line read as kvlab's set-up keys."""
    vllm = setup_keys({"model": MODEL, "--tensor-parallel-size": 4, "data-parallel-size": 2, "enable_expert_parallel": True,
                       "no-enable-prefix-caching": True, "kv-cache-dtype": "fp8_e4m3", "quantization": "fp8",
                       "num_gpu_blocks_override": 2588, "no_async_scheduling": True}, "s.yaml")
    assert vllm == {"model": MODEL, "tp": 4, "dp": 2, "expert_parallel": 8, "prefix_caching": False,
                    "kv_cache_dtype": "fp8", "weight_dtype": "fp8", "pool_pages": 2588, "async_scheduling": False}
    sgl = setup_keys({"tp-size": 2, "max-running-requests": 64, "chunked-prefill-size": 4096, "page-size": 1,
                      "mem-fraction-static": 0.8, "disable-radix-cache": False, "context-length": 8192}, "s.yaml")
    assert sgl == {"tp": 2, "max_num_seqs": 64, "max_num_batched_tokens": 4096, "block_size": 1,
                   "gpu_memory_utilization": 0.8, "prefix_caching": True, "max_model_len": 8192}
    with pytest.raises(ValueError, match=r"s.yaml: tp is given twice \(2 and 4, as tensor_parallel_size\)"):
        setup_keys({"tp": 2, "tensor_parallel_size": 4}, "s.yaml")
    assert setup_keys({"quantization": None, "kv_cache_dtype": "auto"}, "s.yaml") == {"weight_dtype": "bf16",
                                                                                     "kv_cache_dtype": "auto"}
    # --dtype is the weights' width unless quantization names theirs; vLLM's logged block count is the pool
    assert setup_keys({"dtype": "float16", "num_gpu_blocks": 9000}, "s") == {"weight_dtype": "bf16", "pool_pages": 9000}
    assert setup_keys({"dtype": "bfloat16", "quantization": "fp8"}, "s") == {"weight_dtype": "fp8"}


def test_fp8_kv_set_up_doubles_the_replayed_pool():
    rec = _server_record(cap=None, rate=4.0)
    fp8 = RunRecord(SetUp(name="f", dataset="d", model=MODEL, gpu=GPU, max_num_seqs=64, kv_cache_dtype="fp8"),
                    rec.requests)
    auto, eight = replay(rec).pool_pages, replay(fp8).pool_pages
    assert eight == pytest.approx(2 * auto, rel=0.01)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        SetUp(name="f", dataset="d", model=MODEL, gpu=GPU, kv_cache_dtype="int4")
    # FP8 weights free the weight bytes they save for KV: the pool grows by those bytes over a page's
    w8 = RunRecord(SetUp(name="w", dataset="d", model=MODEL, gpu=GPU, max_num_seqs=64, weight_dtype="fp8"),
                   rec.requests)
    m = specs.model(MODEL)
    page = m.kv_bytes_per_token() * 16
    saved = m.weight_bytes_per_gpu() - specs.with_precision(m, weights="fp8").weight_bytes_per_gpu()
    assert saved > 0.45 * m.weight_bytes_per_gpu()
    assert replay(w8).pool_pages - auto == pytest.approx(saved / page, abs=1)


def test_fp8_weights_are_priced_at_one_byte_a_weight_in_the_replay_and_the_calibration():
    # The replay and calibration had built their cost model from the model's name (BF16 weights) while the
    # pool took the FP8 weights: an FP8 run replayed 1.7x slower at decode. Independent route: the same
    # requests served with a cost model built by hand from the FP8 model.
    from kvlab.costmodel import cost_model
    from kvlab.validate.calibrate import replay_with
    from kvlab.costmodel.stacks import StackTerms

    rec = _server_record(n=40, cap=None, rate=4.0)
    w8 = RunRecord(SetUp(name="w", dataset="d", model=MODEL, gpu="H100-SXM", max_num_seqs=64, weight_dtype="fp8"),
                   rec.requests)
    by_hand = cost_model(specs.with_precision(specs.model(MODEL), weights="fp8"), "H100-SXM")
    expect = replay(w8, cost_model=by_hand).predicted
    got = replay(w8).predicted
    assert np.allclose(got["tpot_s"], expect["tpot_s"], rtol=1e-12)
    assert "FP8 weights" in replay(w8).cost_model
    bf16 = replay(w8.with_setup(weight_dtype="bf16")).predicted
    assert float(got["tpot_s"].mean()) < 0.7 * float(bf16["tpot_s"].mean())  # decode reads half the weight bytes
    none = StackTerms(name="none", overhead_s=0.0, overhead_s_per_seq=0.0)
    assert np.allclose(replay_with(w8, none).predicted["tpot_s"], expect["tpot_s"], rtol=1e-12)


def test_overlapped_cpu_terms_hidden_behind_the_gpu_are_reported_not_identified(tmp_path):
    from kvlab.costmodel.stacks import StackTerms, save
    from kvlab.validate import calibrate as C
    from kvlab.validate import trust_figures as T

    runs = [_server_record(n=60, rate=r, seed=s, engine="vllm-v1") for r, s in ((3.0, 4), (8.0, 5), (14.0, 6))]
    terms = C.calibrate(runs, name="gpu-only", holdout=False)
    assert terms.overlap and terms.overhead_s == 0 and terms.overhead_s_per_seq == 0
    # independently: the 10th percentile of the iteration times of the runs replayed with those terms
    zero = StackTerms(name="z", overlap=True, gpu_time_scale=terms.gpu_time_scale)
    dur = np.concatenate([it["duration_s"].to_numpy() for r in runs for it in C.replay_with(r, zero).iterations])
    assert terms.meta["cpu_not_identified_below_s"] == pytest.approx(np.percentile(dur[dur > 0], 10))
    path = save(terms, tmp_path / "gpu-only.json")
    line = T.trust(str(path), gpu="H100-SXM")
    assert "CPU time per iteration is not identified" in line
    assert f"{terms.meta['cpu_not_identified_below_s'] * 1e3:.3g} ms" in line
    # a stack whose CPU terms were fitted states no such caveat
    assert C.hidden_cpu_bound_s(runs, StackTerms(name="f", overlap=True, overhead_s=0.004)) is None


def test_a_capped_result_without_send_times_is_a_closed_loop(tmp_path):
    # --request-rate inf --max-concurrency 4 saved without start_times: every request offered at 0 s,
    # at most 4 in flight; the replay's sends are the brute-force client's
    rec = _server_record(n=40, rate=1e6, cap=4)
    data = _bench_json(rec, float("inf"), 4)
    data["request_rate"] = "inf"
    for k in ("start_times", "queue_times"):
        del data[k]
    (tmp_path / "c.json").write_text(json.dumps(data))
    (tmp_path / "s.yaml").write_text(f"name: c\nmodel: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\n")
    (got,) = read_bench_results(tmp_path / "c.json", tmp_path / "s.yaml")
    rep = replay(got)
    pred = rep.predicted
    sent, _ = _brute_force_sends(np.zeros(40), (pred["e2e_s"]).to_numpy(), 4)
    assert np.allclose(pred["client_queue_s"], sent, atol=1e-9)
    row = compare(rep)
    assert row["overload_right"] and abs(row["e2e_mean_err"]) < 1e-3  # arrivals 0 instead of microseconds apart
    assert any("not recorded" in a for a in got.setup.assumptions)


def test_async_scheduling_follows_the_version_and_moves_the_replay():
    base = dict(name="a", dataset="d", model=MODEL, gpu=GPU)
    assert SetUp(**base, engine="vllm-v1", server_version="0.15.1").schedules_async
    assert not SetUp(**base, engine="vllm-v1", server_version="0.13.0").schedules_async  # on by default from 0.14
    assert SetUp(**base, engine="vllm-v1").schedules_async and not SetUp(**base, engine="vllm-v0").schedules_async
    assert not SetUp(**base, engine="vllm-v1", async_scheduling=False).schedules_async
    rec = _server_record(n=120, rate=20.0)  # a V1 run of unrecorded version: replayed with async scheduling
    sync = RunRecord(SetUp(**{**base, "max_num_seqs": 64}, engine="vllm-v1", async_scheduling=False), rec.requests)
    lag, now = replay(rec).predicted, replay(sync).predicted
    # a request arriving while the engine is busy waits about one more iteration for its first token
    assert 0 < (lag["ttft_s"] - now["ttft_s"]).mean() < 0.05


def test_a_run_held_out_on_another_gpu_gets_no_gpu_time_scale():
    from kvlab.validate import calibrate as C

    # two A100 runs whose server is 30% slower than kvlab's GPU time: a fit on them alone takes a scale
    slow = [_server_record(n=50, rate=r, seed=s) for r, s in ((4.0, 7), (10.0, 8))]
    runs = [RunRecord(r.setup, r.requests.assign(**{c: 1.3 * r.requests[c] for c in ("ttft_s", "tpot_s", "e2e_s")}))
            for r in slow]
    assert C.fit(runs).terms.gpu_time_scale > 1.1
    other = _server_record(n=50, rate=6.0, seed=9)
    other = RunRecord(SetUp(name="h100", dataset="hand-made", model=MODEL, gpu="H100-SXM", max_num_seqs=64),
                      other.requests)
    loo = C.leave_one_out([*runs, other])  # "auto": a scale is never carried to a GPU the fit did not see
    assert loo.set_index("run").loc["h100", "held_out_scale"] == 1.0


def test_a_stated_shared_prefix_is_served_from_the_prefix_cache():
    # 200 requests of 600-token prompts whose first 512 tokens are one system prompt: with the cache
    # on, every request after the first computes only its own ~88 tokens (plus the last block's remainder)
    rng = np.random.default_rng(3)
    n = 200
    req = pd.DataFrame({"arrival_s": np.arange(n) / 20.0, "prompt_tokens": rng.integers(590, 610, n),
                        "output_tokens": rng.integers(20, 60, n), "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 1.0})
    base = dict(name="p", dataset="d", model="Llama-2-70B", gpu="H100-SXM", tp=4, max_num_seqs=128,
                engine="vllm-v1", prefix_caching=True)
    plain = replay(RunRecord(SetUp(**base), req))
    shared = replay(RunRecord(SetUp(**base, shared_prefix_tokens=512), req))
    prefill = [float(r.iterations[0]["prefill_tokens"].sum()) for r in (plain, shared)]
    assert prefill[0] == req["prompt_tokens"].sum()  # no prefix known: every prompt token computed
    # the first request computes its whole prompt, each other one its tokens after the 32 cached blocks
    assert prefill[1] == req["prompt_tokens"].iloc[0] + (req["prompt_tokens"].iloc[1:] - 512).sum()
    assert shared.predicted["ttft_s"].mean() < plain.predicted["ttft_s"].mean()
    with pytest.raises(ValueError, match="shared_prefix_tokens must be"):
        SetUp(**base, shared_prefix_tokens=-1)
