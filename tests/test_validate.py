"""kvlab.validate: run records, readers, replay, overload calls, stack calibration, trust."""
import json

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab.costmodel import cost_model
from kvlab.costmodel.stacks import StackTerms, StackedCostModel, apply, load, save
from kvlab.validate import RunRecord, SetUp, compare, error_table, overloaded, read_bench_results, replay
from kvlab.validate import calibrate as C
from kvlab.validate import trust_figures as T

MODEL, GPU = "Llama-2-7B", "A100-80GB-SXM"


def _workload(n, rate, seed):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(50, 600, n), "output_tokens": rng.integers(20, 200, n)})


def _measured(terms, rate, seed, n=60):
    """A hand-made 'server': kvlab itself with known stack terms; its times are the record's measurements."""
    w = _workload(n, rate, seed)
    # engine: the terms' kind (an additive stack is V0-like; an overlapping one V1's async scheduling), on the
    # kernels kvlab prices that engine's runs on (V0: 2024's)
    setup = SetUp(name=f"rate-{rate}-{seed}", dataset="hand-made", model=MODEL, gpu=GPU, max_num_seqs=64,
                  engine="vllm-v1" if terms.overlap else "vllm-v0")
    cost = apply(cost_model(MODEL, GPU, kernels=setup.kernels), terms)
    res = kvlab.simulate(w, "vllm", model=MODEL, gpu=GPU, cost_model=cost, max_num_seqs=64,
                         max_num_batched_tokens=2048, max_new_tokens=256, async_scheduling=setup.schedules_async)
    q = res.requests
    req = w.assign(ttft_s=q["ttft_s"].to_numpy(), tpot_s=q["mean_tbt_s"].to_numpy(), e2e_s=q["e2e_s"].to_numpy())
    return RunRecord(setup, req)


TRUE = StackTerms(name="truth", overhead_s=0.008, overhead_s_per_seq=0.0004, gpu_time_scale=1.3)


@pytest.fixture(scope="module")
def runs():
    return [_measured(TRUE, rate, seed) for rate, seed in ((2, 1), (6, 2), (12, 3), (25, 4))]


def test_stack_terms_price_scale_times_gpu_plus_overheads():
    base = cost_model(MODEL, GPU)
    rng = np.random.default_rng(0)
    t, s = rng.integers(1, 4000, 50), rng.integers(1, 128, 50)
    pairs, kv = t * rng.integers(1, 500, 50), s * rng.integers(10, 3000, 50)
    want = 1.3 * base.iteration_s(t, pairs, kv, s) + 0.008 + 0.0004 * s
    assert np.allclose(apply(base, TRUE).iteration_s(t, pairs, kv, s), want, rtol=1e-12)
    roof = cost_model(MODEL, GPU, source="roofline")
    stacked = apply(roof, TRUE)
    assert isinstance(stacked, StackedCostModel)
    assert np.allclose(stacked.iteration_s(t, pairs, kv, s), 1.3 * roof.iteration_s(t, pairs, kv, s) + 0.008
                       + 0.0004 * s)


def test_overlapping_terms_price_the_larger_of_gpu_and_cpu():
    base = cost_model(MODEL, GPU)
    rng = np.random.default_rng(1)
    t, s = rng.integers(1, 4000, 50), rng.integers(1, 128, 50)
    pairs, kv = t * rng.integers(1, 500, 50), s * rng.integers(10, 3000, 50)
    terms = StackTerms(name="o", overhead_s=0.08, overhead_s_per_seq=1e-3, gpu_time_scale=1.1, overlap=True)
    want = np.maximum(1.1 * base.iteration_s(t, pairs, kv, s), 0.08 + 1e-3 * s)
    assert np.allclose(apply(base, terms).iteration_s(t, pairs, kv, s), want, rtol=1e-12)
    assert (want > 0.08 + 1e-3 * s).any() and (want == 0.08 + 1e-3 * s).any()  # both regimes drawn


def test_calibrate_recovers_overlapped_cpu_terms():
    """A V1-like 'server' whose CPU work overlaps the GPU (40 ms + 0.05 ms/sequence binds the decode
    batches, about 3-4x their GPU time, not the long prefills): the fit (overlap taken from the
    engine) finds the CPU terms."""
    truth = StackTerms(name="t", overhead_s=0.040, overhead_s_per_seq=5e-5, overlap=True)
    rr = [_measured(truth, rate, seed, n=50) for rate, seed in ((2, 8), (8, 9), (20, 10))]
    f = C.fit(rr, name="fit", fit_scale=False)
    assert f.terms.overlap and f.terms.gpu_time_scale == 1.0
    assert f.terms.overhead_s == pytest.approx(0.040, rel=0.1)
    for r in rr:
        assert abs(C.errors_with(r, f.terms)["tpot_mean_err"]) < 0.03


@pytest.mark.parametrize("cpu_s", [0.014, 0.020])
def test_calibrate_finds_overlapped_cpu_that_binds_a_little_above_the_gpu(cpu_s):
    """CPU work of 1.2-2x the decode iterations' GPU time (a small model on a fast GPU): the additive fit's
    extra time stays under the GPU's there, so no iteration binds from its start and the CPU terms had no
    gradient (the fit returned 0 ms and put the time in the front end: TPOT 23-46% short on its own runs);
    the further starts find them."""
    truth = StackTerms(name="t", overhead_s=cpu_s, overhead_s_per_seq=5e-5, overlap=True)
    rr = [_measured(truth, rate, seed, n=50) for rate, seed in ((2, 8), (8, 9), (20, 10))]
    gpu_only = StackTerms(name="g", overlap=True)
    dur = np.concatenate([C.replay_with(r, gpu_only).iterations[0]["duration_s"].to_numpy() for r in rr])
    assert 1.2 < cpu_s / np.median(dur[dur > 0]) < 2.0  # the case the additive start cannot reach
    f = C.fit(rr, name="fit", fit_scale=False)
    assert f.terms.overhead_s == pytest.approx(cpu_s, rel=0.1)
    assert f.terms.overhead_s_per_request < 0.002  # not a front end standing in for it
    for r in rr:
        assert abs(C.errors_with(r, f.terms)["tpot_mean_err"]) < 0.03


def test_front_end_latency_is_fitted_for_client_clocks_only():
    """A client-clocked 'server' adding 25 ms per request to TTFT and E2E (not to TPOT): the fit finds
    it beside the engine's terms; the engine-side clock of the plain runs fits no front end at all."""
    truth = StackTerms(name="t", overhead_s=0.012, overhead_s_per_seq=0.0002)
    rr = [_measured(truth, rate, seed, n=50) for rate, seed in ((3, 5), (10, 6), (20, 7))]
    shifted = [RunRecord(r.setup, r.requests.assign(ttft_s=r.requests["ttft_s"] + 0.025,
                                                   e2e_s=r.requests["e2e_s"] + 0.025)) for r in rr]
    f = C.fit(shifted, name="fit", fit_scale=False)
    assert f.terms.overhead_s_per_request == pytest.approx(0.025, rel=0.1)
    assert f.terms.overhead_s == pytest.approx(0.012, rel=0.1)
    rep = C.replay_with(shifted[1], f.terms)
    assert rep.front_end_s == f.terms.overhead_s_per_request
    assert rep.predicted["tpot_s"].mean() == pytest.approx(C.replay_with(rr[1], f.terms).predicted["tpot_s"].mean())
    engine = C.fit([r.with_setup(clock_start="engine queue") for r in rr], name="fit", fit_scale=False)
    assert engine.terms.overhead_s_per_request == 0.0


def test_design_reproduces_the_replay_at_its_own_schedule(runs):
    # The linear model of a run's means, evaluated at the terms that made the schedule, is the replay itself.
    rep = C.replay_with(runs[2], TRUE)
    d = C.design(rep, TRUE)
    theta = np.array([TRUE.gpu_time_scale, TRUE.overhead_s, TRUE.overhead_s_per_seq])
    for col, name in C.TARGETS:
        assert d[name] @ theta == pytest.approx(rep.predicted[col].mean(), rel=1e-6)


def test_calibrate_recovers_known_overheads(runs):
    f = C.fit(runs, name="fit", fit_scale=True)
    assert f.terms.gpu_time_scale == pytest.approx(1.3, rel=0.05)
    assert f.terms.overhead_s == pytest.approx(0.008, rel=0.15)
    assert f.terms.overhead_s_per_seq == pytest.approx(0.0004, rel=0.15)
    # with the right terms the runs are reproduced exactly (the 'server' is kvlab)
    for r in runs:
        row = C.errors_with(r, f.terms)
        assert abs(row["e2e_mean_err"]) < 0.03


def test_calibrate_without_scale_recovers_cpu_terms():
    truth = StackTerms(name="t", overhead_s=0.012, overhead_s_per_seq=0.0002)
    rr = [_measured(truth, rate, seed, n=50) for rate, seed in ((3, 5), (10, 6), (20, 7))]
    f = C.fit(rr, name="fit", fit_scale=False)
    assert f.terms.gpu_time_scale == 1.0
    assert f.terms.overhead_s == pytest.approx(0.012, rel=0.1)
    assert f.terms.overhead_s_per_seq == pytest.approx(0.0002, rel=0.2)


def test_held_out_error_matches_an_independent_computation(runs):
    runs = runs[1:]
    loo = C.leave_one_out(runs, name="loo", fit_scale=True)
    for i, held in enumerate(runs):
        # second implementation: fit on the others, simulate the held-out run directly, errors by hand
        f = C.fit([r for j, r in enumerate(runs) if j != i], name="loo", fit_scale=True)
        assert f.terms.kernels == held.setup.kernels == "2024"  # V0 runs: the stack rests on, and states, 2024's
        cost = apply(cost_model(MODEL, GPU, kernels="2024"), f.terms)
        res = kvlab.simulate(held.workload(), "vllm", model=MODEL, gpu=GPU, cost_model=cost, max_num_seqs=64,
                             max_num_batched_tokens=2048, max_new_tokens=int(held.requests["output_tokens"].max()))
        meas = held.requests
        front = f.terms.overhead_s_per_request  # the runs are client-clocked: TTFT and E2E carry the front end
        assert loo.loc[i, "run"] == held.name
        assert loo.loc[i, "ttft_mean_err"] == pytest.approx(
            (res.requests["ttft_s"].mean() + front) / meas["ttft_s"].mean() - 1, abs=1e-9)
        assert loo.loc[i, "e2e_mean_err"] == pytest.approx(
            (res.requests["e2e_s"].mean() + front) / meas["e2e_s"].mean() - 1, abs=1e-9)
        assert loo.loc[i, "tpot_mean_err"] == pytest.approx(
            res.requests["mean_tbt_s"].mean() / meas["tpot_s"].mean() - 1, abs=1e-9)


def test_a_stack_states_the_kernel_era_it_rests_on(tmp_path, runs):
    """A cost-model file's ``kernels`` round-trips and picks its base: the shipped V0 stack (fitted to 2024-era
    servers) prices the A100 from Vidur's 2024 profiles, exactly the 2024-era model plus its terms; a file of
    today's kernels, today's measured vLLM kernels; an unknown era is refused naming the file; runs of two
    eras are not calibrated together."""
    from dataclasses import replace as _replace
    v0 = load("vllm-v0")
    assert v0.kernels == "2024"
    rng = np.random.default_rng(3)
    t, s = rng.integers(1, 4000, 40), rng.integers(1, 128, 40)
    pairs, kv = t * rng.integers(1, 500, 40), s * rng.integers(10, 3000, 40)
    shipped = cost_model(MODEL, GPU, stack="vllm-v0")
    assert "Vidur's a100 profiles" in shipped.label
    assert np.allclose(shipped.iteration_s(t, pairs, kv, s),
                       apply(cost_model(MODEL, GPU, kernels="2024"), v0).iteration_s(t, pairs, kv, s), rtol=1e-12)
    today = save(_replace(v0, name="today", kernels=None, meta={}), tmp_path / "today.json")
    assert load(today).kernels is None and "vllm 0.14.0" in cost_model(MODEL, GPU, stack=str(today)).label
    assert "kernels" not in json.loads(today.read_text())
    bad = tmp_path / "era.json"
    bad.write_text(json.dumps({**json.loads(today.read_text()), "kernels": "2019"}))
    with pytest.raises(ValueError, match=r"era\.json.*kernels must be null or one of 2024"):
        load(bad)
    with pytest.raises(ValueError, match="kernels must be None"):
        cost_model(MODEL, GPU, kernels="2019")
    v1 = RunRecord(_replace(runs[0].setup, name="v1-run", engine="vllm-v1", async_scheduling=False), runs[0].requests)
    with pytest.raises(ValueError, match="different kernel eras.*v1-run: vllm-v1"):
        C.fit([runs[0], v1], name="mixed", fit_scale=False)


def test_cost_model_file_round_trip_through_simulate(tmp_path, runs):
    path = save(StackTerms(name="mine", overhead_s=0.005, overhead_s_per_seq=0.0001, meta={"fitted_to": []}),
                tmp_path / "mine.json")
    assert load(path).overhead_s == 0.005
    w = runs[0].workload()
    a = kvlab.simulate(w, "vllm", model=MODEL, gpu=GPU, cost_model=str(path))
    b = kvlab.simulate(w, "vllm", model=MODEL, gpu=GPU, cost_model=apply(cost_model(MODEL, GPU), load(path)))
    assert a.params["stack"] == str(path) and "stack mine" in a.params["cost_model"]
    assert np.array_equal(a.requests["e2e_s"].to_numpy(), b.requests["e2e_s"].to_numpy())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="not a kvlab cost-model file"):
        kvlab.simulate(w, "vllm", model=MODEL, gpu=GPU, cost_model=str(bad))


def test_shipped_stacks_are_named_and_stated():
    w = _workload(20, 5, 0)
    r = kvlab.simulate(w, "vllm", model="OPT-13B", gpu=GPU, stack="vllm-v0")
    assert r.params["stack"] == "vllm-v0" and "stack vllm-v0" in r.params["cost_model"]
    assert kvlab.simulate(w, "vllm", model="OPT-13B", gpu=GPU).params["stack"] == "none"
    with pytest.raises(ValueError, match="unknown stack"):
        kvlab.simulate(w, "vllm", model="OPT-13B", gpu=GPU, stack="vllm-v9")


def test_overload_rule_hand_worked():
    # 400 arrivals, 1 s apart (the last at 399 s): a request still waits for its first token at
    # 399 s when arrival + TTFT > 399. The rule: more than 2.5% of requests (10) and more than 8.
    arr = np.arange(400, dtype=float)
    assert not overloaded(arr, np.full(400, 0.5))      # only the last one waits
    assert not overloaded(arr, np.full(400, 9.5))      # arrivals 390-399: 10 waiting, not > 10
    assert overloaded(arr, np.full(400, 10.5))         # 11 waiting
    assert overloaded(arr, 0.1 * arr)                  # TTFT grows: arrivals from 363 on wait (37)
    few = np.arange(100, dtype=float)
    assert not overloaded(few, np.full(100, 7.5))      # arrivals 92-99: 8 waiting, > 2.5% but not > 8
    assert overloaded(few, np.full(100, 8.5))          # 9 waiting


def test_bench_result_reader(tmp_path, runs):
    rec = runs[1].requests
    itls = [[t] * (int(n) - 1) for t, n in zip(rec["tpot_s"], rec["output_tokens"])]
    data = {"input_lens": rec["prompt_tokens"].tolist(), "output_lens": rec["output_tokens"].tolist(),
            "ttfts": rec["ttft_s"].tolist(), "itls": itls, "start_times": rec["arrival_s"].tolist(),
            "errors": [""] * len(rec)}
    (tmp_path / "r.json").write_text(json.dumps(data))
    # the hand-made server scheduled synchronously (its additive terms are V0-like)
    (tmp_path / "s.yaml").write_text(f"name: mine\nmodel: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\nasync_scheduling: false\n")
    (got,) = read_bench_results(tmp_path / "r.json", tmp_path / "s.yaml")
    assert got.setup.max_num_seqs == 64 and len(got.requests) == len(rec)
    assert np.allclose(got.requests["e2e_s"], rec["ttft_s"] + rec["tpot_s"] * (rec["output_tokens"] - 1))
    row = compare(replay(got, cost_model=apply(cost_model(MODEL, GPU, kernels="2024"), TRUE)))  # what made it
    assert abs(row["e2e_mean_err"]) < 1e-6 and abs(row["ttft_p99_err"]) < 1e-6
    assert compare(replay(got))["stack"] == "none"
    del data["itls"]
    (tmp_path / "r2.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="lacks itls"):
        read_bench_results(tmp_path / "r2.json", tmp_path / "s.yaml")
    (tmp_path / "s2.yaml").write_text("name: x\nmodel: Llama-2-7B\ngpu: A100-80GB-SXM\nmax_num_sqs: 3\n")
    with pytest.raises(ValueError, match="unknown set-up key.*max_num_sqs"):
        read_bench_results(tmp_path / "r.json", tmp_path / "s2.yaml")


def test_sglang_bench_serving_output_reads_as_runs(tmp_path, runs):
    """``python -m sglang.bench_serving --output-file F --output-details`` appends one object per run, in the keys
    its ``benchmark`` writes (sgl-project/sglang ``python/sglang/bench_serving.py``): two stages, one at an
    unlimited rate (``Infinity`` in the JSON), a failed request with output length 0 and an error; the runs replay
    on SGLang's rules."""
    rec = runs[1].requests.head(30)
    n = len(rec)

    def stage(rate):
        out = rec["output_tokens"].astype(int).tolist()
        out[3] = 0  # a failed request: SGLang writes output length 0 and its error
        return {"backend": "sglang", "dataset_name": "random", "request_rate": rate, "max_concurrency": None,
                "duration": 10.0, "completed": n - 1, "mean_ttft_ms": 1.0,
                "input_lens": rec["prompt_tokens"].astype(int).tolist(), "output_lens": out,
                "ttfts": rec["ttft_s"].tolist(),
                "itls": [[t] * (int(k) - 1) for t, k in zip(rec["tpot_s"], rec["output_tokens"])],
                "generated_texts": ["x"] * n, "errors": ["" if i != 3 else "Timeout" for i in range(n)]}

    path = tmp_path / "sglang_random.jsonl"
    path.write_text("\n".join(json.dumps(stage(r)) for r in (4.0, float("inf"))) + "\n")
    (tmp_path / "s.yaml").write_text(f"model: {MODEL}\ngpu: {GPU}\nserver: SGLang\nserver_version: 0.5.6\n")
    first, second = read_bench_results(path, tmp_path / "s.yaml")
    assert (first.name, second.name) == ("sglang_random-1", "sglang_random-2")
    assert first.setup.engine == "sglang" and len(first.requests) == n - 1
    keep = np.arange(n) != 3
    assert np.allclose(first.requests["ttft_s"], rec["ttft_s"].to_numpy()[keep])
    assert np.allclose(first.requests["e2e_s"], (rec["ttft_s"] + rec["tpot_s"] * (rec["output_tokens"] - 1))[keep])
    assert any("Poisson at 4 req/s" in a for a in first.setup.assumptions)
    assert any("request_rate inf" in a for a in second.setup.assumptions) and (second.requests["arrival_s"] == 0).all()
    assert compare(replay(first))["run"] == "sglang_random-1"


def test_aiperf_profile_export_reads_as_one_run(tmp_path, runs):
    """An aiperf ``profile_export.jsonl`` (ai-dynamo/aiperf's record format: metadata with the send time in epoch
    ns, metrics with values in ms and tokens, ``error``), written in completion order with a failed request: read
    as one run and replayed with the terms that made it, it reproduces its own times (send times as arrivals)."""
    rec = runs[1].requests
    base_ns = 1_759_813_207_532_900_363

    def record(i, r):
        return {"metadata": {"session_num": i, "request_start_ns": base_ns + int(round(r.arrival_s * 1e9)),
                             "benchmark_phase": "profiling", "was_cancelled": False},
                "metrics": {"input_sequence_length": {"value": int(r.prompt_tokens), "unit": "tokens"},
                            "output_sequence_length": {"value": int(r.output_tokens), "unit": "tokens"},
                            "time_to_first_token": {"value": r.ttft_s * 1e3, "unit": "ms"},
                            "request_latency": {"value": (r.ttft_s + r.tpot_s * (r.output_tokens - 1)) * 1e3,
                                                "unit": "ms"}},
                "error": None}

    recs = [record(i, r) for i, r in enumerate(rec.itertuples())]
    order = np.argsort((rec["arrival_s"] + rec["ttft_s"] + rec["tpot_s"] * (rec["output_tokens"] - 1)).to_numpy())
    failed = {"metadata": {"session_num": len(rec), "request_start_ns": base_ns, "benchmark_phase": "profiling"},
              "metrics": {"error_isl": {"value": 550, "unit": "tokens"}},
              "error": {"code": 500, "type": "ServerError", "message": "x"}}
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [failed, *(recs[i] for i in order)]) + "\n")
    (tmp_path / "s.yaml").write_text(f"name: mine\nmodel: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\n"
                                     "async_scheduling: false\nrequest_rate: 6\n")
    (got,) = read_bench_results(path, tmp_path / "s.yaml")
    assert got.name == "mine" and len(got.requests) == len(rec)
    assert np.allclose(got.requests["arrival_s"], rec["arrival_s"] - rec["arrival_s"].min(), atol=1e-9)
    row = compare(replay(got, cost_model=apply(cost_model(MODEL, GPU, kernels="2024"), TRUE)))  # what made it
    assert abs(row["e2e_mean_err"]) < 1e-6 and abs(row["ttft_p99_err"]) < 1e-6 and abs(row["tpot_mean_err"]) < 1e-6
    recs[0]["metrics"].pop("time_to_first_token")
    path.write_text("\n".join(json.dumps(o) for o in recs) + "\n")
    with pytest.raises(ValueError, match=r"profile_export.jsonl record 1: lacks time_to_first_token"):
        read_bench_results(path, tmp_path / "s.yaml")


def _inference_perf_item(r, t0, nested):
    """One request of inference-perf's per-request report (``reportgen/base.py``): send and end on the client's
    perf_counter, a time per content chunk, the request body; the flat ``info`` of its releases before 2026-05 or
    the nested one after, whose client-side output count is off (the reader takes max_tokens / the server's)."""
    start = t0 + r.arrival_s
    times = [start + r.ttft_s + j * r.tpot_s for j in range(int(r.output_tokens))]
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": int(r.output_tokens), "ignore_eos": True,
                       "stream": True})
    if nested:
        info = {"request_metrics": {"text": {"input_tokens": int(r.prompt_tokens)}}, "input_tokens": int(r.prompt_tokens),
                "response_metrics": {"output_tokens": int(r.output_tokens) + 3, "output_token_times": times,
                                     "server_usage": {"prompt_tokens": int(r.prompt_tokens),
                                                      "completion_tokens": int(r.output_tokens)}}}
    else:
        info = {"input_tokens": int(r.prompt_tokens), "output_tokens": int(r.output_tokens) - 2,
                "output_token_times": times}
    return {"start_time": start, "end_time": times[-1], "request": body, "response": "", "info": info, "error": None}


def test_inference_perf_report_reads_as_a_run_per_stage(tmp_path, runs):
    """An inference-perf report folder (two constant-rate stages of one server, the second sent after every
    request of the first ended; per-request records in completion order, one failed; a stage report each):
    read as two runs, each replayed with the terms that made it reproduces its own times."""
    first, second = runs[0].requests, runs[2].requests
    t0 = 81234.5  # perf_counter's origin is arbitrary
    t1 = t0 + float((first["arrival_s"] + first["ttft_s"] + first["tpot_s"] * (first["output_tokens"] - 1)).max()) + 2
    items = [_inference_perf_item(r, t0, False) for r in first.itertuples()]
    items += [_inference_perf_item(r, t1, True) for r in second.itertuples()]
    items.append({"start_time": t1 + 0.5, "end_time": t1 + 0.6, "request": "{}", "response": "error",
                  "info": None, "error": {"error_type": "ServerDisconnectedError", "error_msg": "x"}})
    items.sort(key=lambda o: o["end_time"])
    folder = tmp_path / "reports-20260211-101500"
    folder.mkdir()
    (folder / "per_request_lifecycle_metrics.json").write_text(json.dumps(items))
    for sid, (n, rate) in enumerate(((len(first), 2.0), (len(second) + 1, 12.0))):
        (folder / f"stage_{sid}_lifecycle_metrics.json").write_text(
            json.dumps({"load_summary": {"count": n, "requested_rate": rate}, "successes": {"count": n}}))
    (tmp_path / "s.yaml").write_text(f"model: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\nasync_scheduling: false\n")
    got = read_bench_results(folder, tmp_path / "s.yaml")
    assert [g.name for g in got] == ["reports-20260211-101500-stage0", "reports-20260211-101500-stage1"]
    cost = apply(cost_model(MODEL, GPU, kernels="2024"), TRUE)  # what made them
    for g, want in zip(got, (first, second)):
        assert len(g.requests) == len(want)
        assert np.allclose(g.requests["arrival_s"], want["arrival_s"] - want["arrival_s"].min(), atol=1e-9)
        assert (g.requests["output_tokens"].to_numpy() == want["output_tokens"].to_numpy()).all()
        row = compare(replay(g, cost_model=cost))
        assert abs(row["e2e_mean_err"]) < 1e-6 and abs(row["ttft_p99_err"]) < 1e-6 and abs(row["tpot_mean_err"]) < 1e-6
    assert any("stage 1 at 12 req/s" in a for a in got[1].setup.assumptions)
    assert any("1 failed or unstreamed requests not replayed" in a for a in got[1].setup.assumptions)
    assert not any("failed" in a for a in got[0].setup.assumptions)
    (folder / "stage_1_lifecycle_metrics.json").write_text(  # a concurrent stage: its clients are the cap
        json.dumps({"load_summary": {"count": len(second) + 1, "concurrency": 8}}))
    assert read_bench_results(folder, tmp_path / "s.yaml")[1].setup.max_concurrency == 8
    alone = tmp_path / "alone.json"  # the file without its stage reports: one run of both stages
    alone.write_text(json.dumps(items))
    (one,) = read_bench_results(alone, tmp_path / "s.yaml")
    assert len(one.requests) == len(first) + len(second)
    (folder / "stage_1_lifecycle_metrics.json").write_text(json.dumps({"load_summary": {"count": 3}}))
    with pytest.raises(ValueError, match=r"holds 121 requests, but its stage reports count 63"):
        read_bench_results(folder, tmp_path / "s.yaml")
    (folder / "per_request_lifecycle_metrics.json").unlink()
    with pytest.raises(ValueError, match=r"folder without per_request_lifecycle_metrics.json"):
        read_bench_results(folder, tmp_path / "s.yaml")


def test_guidellm_report_reads_as_a_run_per_benchmark(tmp_path, runs):
    """A GuideLLM JSON report of two constant-rate benchmarks, the first in its layout before 0.4 (``start_time``,
    ``args``, ``request_totals``), the second in the later one (``request_start_time``, ``config``), each request
    with its computed TTFT (ms) and latency (s): each benchmark a run that replays to its own times; a concurrent
    benchmark's streams are its cap; a sampled benchmark is refused."""
    def req(r, t0, key):
        e2e = r.ttft_s + r.tpot_s * (r.output_tokens - 1)
        return {key: t0 + r.arrival_s, "prompt_tokens": int(r.prompt_tokens), "output_tokens": int(r.output_tokens),
                "time_to_first_token_ms": r.ttft_s * 1e3, "request_latency": e2e}

    first, second = runs[0].requests, runs[2].requests
    t0 = 1_770_000_000.25  # epoch seconds
    b1 = {"args": {"strategy": {"type_": "constant", "rate": 2.0}}, "request_totals": {"successful": len(first)},
          "requests": {"successful": [req(r, t0, "start_time") for r in first.itertuples()][::-1],
                       "incomplete": [], "errored": [{"start_time": t0}]}}
    b2 = {"config": {"strategy": {"type_": "constant", "rate": 12.0, "max_concurrency": None}},
          "requests": {"successful": [req(r, t0 + 90, "request_start_time") for r in second.itertuples()]}}
    b3 = {"config": {"strategy": {"type_": "concurrent", "streams": 8}},
          "requests": {"successful": [req(r, t0 + 200, "request_start_time") for r in second.itertuples()]}}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps({"metadata": {"version": 2}, "benchmarks": [b1, b2, b3]}))
    (tmp_path / "s.yaml").write_text(f"name: g\nmodel: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\n"
                                     "async_scheduling: false\n")
    got = read_bench_results(path, tmp_path / "s.yaml")
    assert [g.name for g in got] == ["g-1", "g-2", "g-3"]
    cost = apply(cost_model(MODEL, GPU, kernels="2024"), TRUE)
    for g, want in zip(got[:2], (first, second)):
        assert np.allclose(g.requests["arrival_s"], want["arrival_s"] - want["arrival_s"].min(), atol=1e-6)
        row = compare(replay(g, cost_model=cost))
        assert abs(row["e2e_mean_err"]) < 1e-6 and abs(row["ttft_p99_err"]) < 1e-6 and abs(row["tpot_mean_err"]) < 1e-6
    assert got[0].setup.max_concurrency is None and got[2].setup.max_concurrency == 8
    assert any("1 incomplete or failed requests not replayed" in a for a in got[0].setup.assumptions)
    b1["request_totals"]["successful"] = len(first) + 40
    path.write_text(json.dumps({"benchmarks": [b1]}))
    with pytest.raises(ValueError, match=r"benchmark 1 of 1: holds 60 of its 100 successful requests \(sampled"):
        read_bench_results(path, tmp_path / "s.yaml")


def test_error_table_medians(runs):
    rows = [{"dataset": "d", "ttft_mean_err": e, "e2e_mean_err": -e, "tpot_mean_err": 2 * e, "overload_right": ok}
            for e, ok in ((0.1, True), (-0.3, True), (0.2, False))]
    t = error_table(rows)
    assert t.loc[0, "ttft_mean_abs_err"] == pytest.approx(0.2) and t.loc[0, "tpot_mean_abs_err"] == pytest.approx(0.4)
    assert t.loc[0, "overload_calls"] == "2 of 3 right"


def test_trust_reads_the_committed_figures(tmp_path, monkeypatch):
    df = pd.DataFrame({"dataset": "d", "run": ["a", "b", "c"], "gpu": ["A100-80GB-SXM", "A100-80GB-PCIe", "H100-SXM"],
                       "model": "m", "stack": "vllm-v0", "kernels": "2024", "held_out": True,
                       "ttft_mean_err": [0.1, -0.3, 0.9],
                       "e2e_mean_err": [0.05, 0.07, 0.0], "tpot_mean_err": [0.2, 0.2, 0.2],
                       "overload_right": [True, False, True], "cost_model": "x"})
    path = tmp_path / "e.csv"
    df.to_csv(path, index=False)
    monkeypatch.setattr(T, "ERRORS_PATH", path)
    line = T.trust(gpu="A100-80GB-SXM", stack="vllm-v0", family="vLLM V0")
    # medians of |error| over the two A100 runs, by hand: TTFT (0.1, 0.3) -> 20%, E2E (0.05, 0.07) -> 6%
    assert line.startswith("real servers (vLLM V0, stack vllm-v0)")
    assert "mean TTFT 20.0%, mean E2E 6.0%, TPOT 20.0%" in line and "2 measured vLLM runs on A100" in line
    assert "held out" in line and "1 of 2" in line
    assert "stack none = GPU time only, none fitted): no measured run validates it" in T.trust(gpu="A100-80GB-SXM")
    # a stack validated on other families only says so, with the errors where it is validated (all 3 runs)
    other = T.trust(gpu="L40S", stack="vllm-v0")
    assert "not validated on L40S" in other and "3 measured vLLM runs on A100, H100" in other
    assert "mean TTFT 30.0%" in other
    df.assign(cost_model=["measured (A100)", "roofline (spec sheet)", "measured (H100)"]).to_csv(path, index=False)
    assert "on 1 measured vLLM run on A100" in T.trust("roofline", gpu="A100-80GB-SXM", stack="vllm-v0")
    assert "peer-to-peer" not in line
    # runs replayed without GPU peer-to-peer (their label says so) are counted out loud
    df.assign(cost_model=["measured (A100; no GPU peer-to-peer: x)", "measured (A100)", "x"]).to_csv(path, index=False)
    assert "(held out; 1 of them replayed without GPU peer-to-peer" in T.trust(gpu="A100-80GB-SXM", stack="vllm-v0")
    # only runs priced on the answer's kernel era count: the same stack on today's kernels is not validated by them
    today = T.trust(str(save(StackTerms(name="vllm-v0", kernels=None), tmp_path / "v0-today.json")), gpu="A100-80GB-SXM")
    assert "no measured run validates it" in today
    assert T.kernels_of(None, "sarathi-serve") == T.kernels_of("vllm-v0") == "2024" and T.kernels_of(None) == "today"
    assert T.kernels_of(cost_model(MODEL, GPU, kernels="2024")) == "2024"
    # a stack's fixed-concurrency points make no overload call: counted as points, and no overload clause
    df.assign(overload_right=[None, None, None]).to_csv(path, index=False)
    pts = T.trust(gpu="A100-80GB-SXM", stack="vllm-v0")
    assert "2 measured vLLM points at fixed concurrency on A100" in pts and "overload" not in pts
    df.assign(overload_right=[True, None, None]).to_csv(path, index=False)
    both = T.trust(gpu="A100-80GB-SXM", stack="vllm-v0")
    assert "1 measured vLLM run and 1 measured vLLM point at fixed concurrency on A100" in both
    assert both.endswith("overload called right on 1 of 1")


def test_shipped_trust_line_says_which_rtx_pro_6000_runs_ran_without_p2p():
    """The RTX PRO 6000's real-server errors rest on two multi-GPU runs replayed without peer-to-peer
    (LLMServingSim's TP2 and DP2+EP2 runs): its trust line names them, the RTX 4090's (one GPU) does not."""
    line = T.trust(gpu="RTXPRO6000", stack="vllm-v1")
    assert "3 measured vLLM runs on RTXPRO6000 (held out; 2 of them replayed without GPU peer-to-peer" in line
    assert "peer-to-peer" not in T.trust(gpu="RTX4090", stack="vllm-v1")


def _bench_file(folder, rec, name):
    itls = [[t] * (int(n) - 1) for t, n in zip(rec["tpot_s"], rec["output_tokens"])]
    data = {"input_lens": rec["prompt_tokens"].tolist(), "output_lens": rec["output_tokens"].tolist(),
            "ttfts": rec["ttft_s"].tolist(), "itls": itls, "start_times": rec["arrival_s"].tolist()}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_cli_calibrate_and_validate(tmp_path, runs, capsys):
    from kvlab.cli import main

    files = [_bench_file(tmp_path, r.requests, f"run{i}") for i, r in enumerate(runs[:3])]
    setup = tmp_path / "setup.yaml"
    setup.write_text(f"model: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\nengine: vllm-v0\n")
    out = tmp_path / "mine.json"
    assert main(["calibrate", *files, "--set-up", str(setup), "-o", str(out), "--fit-scale", "yes"]) == 0
    text = capsys.readouterr().out
    assert "held-out error (leave-one-run-out" in text and f"written to {out}" in text
    terms = load(out)
    assert terms.gpu_time_scale == pytest.approx(1.3, rel=0.05)
    assert [r["run"] for r in terms.meta["held_out"]["runs"]] == ["run0", "run1", "run2"]
    for r in terms.meta["held_out"]["runs"]:  # each fold's terms (two runs each: scale and CPU trade off), printed
        assert f"{r['held_out_overhead_s'] * 1e3:.3g} + {r['held_out_overhead_s_per_seq'] * 1e3:.3g}/seq" in text
    assert ("do not share one CPU time" in text) == bool(C.folds_disagree(pd.DataFrame(terms.meta["held_out"]["runs"])))
    assert main(["validate", *files, "--set-up", str(setup), "--cost-model", str(out)]) == 0
    text = capsys.readouterr().out
    assert "stack: " + str(out) in text and "3 of 3 right" in text
    assert main(["calibrate", files[0], "-o", str(out.with_name("new.json"))]) == 2  # no set-up: one-line error
    assert "needs --set-up" in capsys.readouterr().err


def test_folds_that_fit_cpu_times_far_apart_are_named():
    """Hand-worked: folds of 0, 19 and 0 ms per iteration disagree (the LLMServingSim runs' folds); 8 and 10 ms, and
    0 and 0.5 ms (within 1 ms), agree."""
    def note(*cpu_s):
        return C.folds_disagree(pd.DataFrame({"held_out_overhead_s": cpu_s}))

    assert "the folds fitted 0-19 ms of CPU time per iteration" in note(0.0, 0.019, 0.0)
    assert note(0.008, 0.010) == "" and note(0.0, 0.0005) == "" and note(0.004, 0.0081) != ""


def test_bad_run_records_name_the_run_and_column(runs):
    req = runs[0].requests
    with pytest.raises(ValueError, match="run x: request table lacks column.*tpot_s"):
        RunRecord(SetUp(name="x", dataset="d", model=MODEL, gpu=GPU), req.drop(columns=["tpot_s"]))
    with pytest.raises(ValueError, match="run x: column ttft_s has 1 missing"):
        RunRecord(SetUp(name="x", dataset="d", model=MODEL, gpu=GPU), req.assign(ttft_s=[np.nan] + [0.1] * (len(req) - 1)))
    with pytest.raises(ValueError, match="run x: scheduler must be one of chunked, prefill_first"):
        SetUp(name="x", dataset="d", model=MODEL, gpu=GPU, scheduler="v0")
    with pytest.raises(ValueError, match="run x: max_num_seqs must be a positive integer"):
        SetUp(name="x", dataset="d", model=MODEL, gpu=GPU, max_num_seqs=0)


def test_calibrate_never_overwrites_an_input_and_asks_before_another_file(tmp_path, capsys):
    """`kvlab calibrate -o` is refused on one of its inputs (even with --force) and on an existing
    file without --force, before any fit runs; a written file is whole JSON."""
    from kvlab.cli import main

    result = tmp_path / "bench.json"
    result.write_text("{}")
    assert main(["calibrate", str(result), "--set-up", str(result), "-o", str(result), "--force"]) == 2
    assert "never overwrites an input" in capsys.readouterr().err and result.read_text() == "{}"
    other = tmp_path / "old.json"
    other.write_text("keep")
    assert main(["calibrate", str(result), "--set-up", str(result), "-o", str(other)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err and other.read_text() == "keep"


def test_cli_validate_defaults_to_each_runs_engine_stack(tmp_path, runs, capsys):
    """No --stack or --cost-model: a vLLM V0 run is replayed with the shipped vllm-v0 stack (the same
    errors as replaying it with stack="vllm-v0" by hand); an engine with no shipped stack gets none."""
    from kvlab.cli import main
    from kvlab.validate.cli import engine_stack, load_runs

    files = [_bench_file(tmp_path, runs[0].requests, "run0")]
    setup = tmp_path / "setup.yaml"
    setup.write_text(f"model: {MODEL}\ngpu: {GPU}\nmax_num_seqs: 64\nengine: vllm-v0\n")
    csv = tmp_path / "out.csv"
    assert main(["validate", *files, "--set-up", str(setup), "--csv", str(csv)]) == 0
    assert "stack: vllm-v0" in capsys.readouterr().out
    by_hand = compare(replay(load_runs(files, [str(setup)])[0], stack="vllm-v0"))
    got = pd.read_csv(csv).iloc[0]
    for col in ("ttft_mean_err", "e2e_mean_err", "tpot_mean_err"):
        assert got[col] == pytest.approx(by_hand[col], rel=1e-9)
    assert engine_stack("vllm-v1") == "vllm-v1" and engine_stack("sglang-0.5") == "none"
    assert engine_stack("vllm-v1", schedules_async=False) == "vllm-v1-sync"  # V1 before 0.14.0 schedules in step
    assert engine_stack("vllm-v0", schedules_async=False) == "vllm-v0"


def test_why_names_pcie_collectives_of_tp_and_of_expert_parallelism():
    """A PCIe-only GPU's collectives are named for TP all-reduces and for the EP all-gathers and
    reduce-scatters of data-parallel ranks alike (the LLMServingSim Qwen3 runs); TP2 + EP2 has no EP
    collective (one rank); an NVLinked GPU's TP, and a single GPU, get no such line."""
    from kvlab.validate.study import why

    row = {"ttft_growth_meas": 1.0, "overload_meas": False, "ttft_mean_err": 0.01, "tpot_mean_err": -0.16,
           "backlog_meas": 0, "pool_pages": 1000, "preemptions_pred": 0, "ttft_mean_meas": 0.1, "ttft_mean_pred": 0.1}

    def reason(**setup):
        rec = RunRecord(SetUp(name="r", dataset="d", **setup), runs_requests())
        return why(row, rec)

    def runs_requests():
        return pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [100, 100], "output_tokens": [10, 10],
                             "ttft_s": [0.1, 0.1], "tpot_s": [0.01, 0.01], "e2e_s": [0.2, 0.2]})

    tp2 = reason(model="Qwen3-32B", gpu="RTXPRO6000", tp=2)
    assert "TP2 all-reduces over PCIe" in tp2 and "EP" not in tp2
    ep2 = reason(model="Qwen3-30B-A3B", gpu="RTXPRO6000", dp=2, expert_parallel=2)
    assert "EP2 all-gathers and reduce-scatters of the 2 data-parallel ranks' tokens over PCIe" in ep2 \
        and "TP" not in ep2.split("over PCIe")[0]
    tp_ep = reason(model="Qwen3-30B-A3B", gpu="RTXPRO6000", tp=2, expert_parallel=2)
    assert "TP2 all-reduces over PCIe" in tp_ep and "EP2" not in tp_ep.split("over PCIe")[0]
    assert "lockstep" in ep2 and "lockstep" not in tp_ep  # DP ranks of an EP MoE pad to the largest rank
    assert "over PCIe" not in reason(model="Llama-2-70B", gpu="H100-SXM", tp=4)
    assert "over PCIe" not in reason(model="Qwen3-32B", gpu="RTXPRO6000")


def test_why_names_a_held_out_stacks_cpu_time_that_binds_where_the_run_was_not_cpu_bound():
    """A run predicted too slow by an overlapped stack whose CPU terms were fitted on the other runs: the reason
    names those terms; an additive stack's (a run scheduled in step), a fast prediction's and a stack without CPU
    terms' get none."""
    import dataclasses

    from kvlab.validate.study import why

    rec = RunRecord(SetUp(name="r", dataset="d", model="Llama-3.1-8B", gpu="RTXPRO6000"),
                    pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [100, 100], "output_tokens": [10, 10],
                                  "ttft_s": [0.1, 0.1], "tpot_s": [0.01, 0.01], "e2e_s": [0.2, 0.2]}))
    row = {"ttft_growth_meas": 1.0, "overload_meas": False, "ttft_mean_err": 0.8, "tpot_mean_err": 0.35,
           "backlog_meas": 0, "pool_pages": 1000, "preemptions_pred": 0, "ttft_mean_meas": 0.1, "ttft_mean_pred": 0.18,
           "held_out_overhead_s": 0.019, "held_out_overhead_s_per_seq": 1.66e-4,
           "cost_model": "measured (...) + stack vllm-v1: max(GPU time, CPU 19 ms/iteration + 0.166 ms/sequence) "
                         "(CPU overlapped)"}
    assert "CPU-bound at 19 ms + 0.166 ms per sequence" in why(row, rec)
    in_step = RunRecord(dataclasses.replace(rec.setup, server_version="0.13.0"), rec.requests)  # an additive stack
    assert not in_step.setup.schedules_async and "CPU-bound" not in why(row, in_step)
    assert "CPU-bound" not in why({**row, "tpot_mean_err": -0.35}, rec)
    assert "CPU-bound" not in why({**row, "held_out_overhead_s": 0.0, "held_out_overhead_s_per_seq": 0.0}, rec)


def test_calibrate_takes_the_runs_scheduling_and_refuses_a_mix(runs):
    """Overlapped or additive pricing follows the runs' own scheduling (vLLM V1 before v0.14.0
    schedules in step: additive), and runs of both kinds are refused, naming the in-step ones."""
    import dataclasses

    def as_v1(r, version):
        return RunRecord(dataclasses.replace(r.setup, engine="vllm-v1", server_version=version), r.requests)

    with pytest.raises(ValueError, match=r"runs rate-2-1, rate-6-2 schedule in step and the others asynchronously"):
        C.fit([*runs[:2], as_v1(runs[2], "0.15.1")], name="x")
    assert not C.runs_overlap([as_v1(r, "0.13.0") for r in runs[:2]]) and not C.runs_overlap(runs[:2])
    assert C.runs_overlap([as_v1(r, v) for r, v in zip(runs[:2], ("0.14.0", "0.19.1"))])


def test_runs_of_other_servers_replay_with_their_own_rules(tmp_path, runs):
    """A run of SGLang, TensorRT-LLM or TGI replays with its server profile's policy, default scheduler, overlap
    scheduler and attention (kvlab.recommend.servers), exactly as simulating those rules directly does; a set-up
    naming the server takes its flags' defaults from the profile; an unknown engine is refused."""
    from dataclasses import replace as _replace

    from kvlab.recommend.servers import Context, resolve
    from kvlab.specs import model as spec_model

    w = runs[1].requests
    for engine, policy, params, scheduler, split, overlap in (
            ("sglang", "sglang", {"init_ratio": 0.7}, "prefill_first_chunked", False, True),
            ("tensorrt-llm", "reserve_max", {}, "mixed_whole", True, True),
            ("tgi", "tgi", {"cap_tokens": 1024}, "chunked_alternating", False, False)):
        s = SetUp(name=f"{engine}-run", dataset="hand-made", engine=engine, model=MODEL, gpu=GPU, max_num_seqs=64)
        assert (s.scheduler, s.schedules_async, s.profile.split_attention) == (scheduler, overlap, split)
        assert (s.profile.policy, dict(s.profile.policy_params)) == (policy, params)
        rep = replay(RunRecord(s, w))
        direct = kvlab.simulate(w[["arrival_s", "prompt_tokens", "output_tokens"]], policy, **params, model=MODEL,
                                gpu=GPU, scheduler=scheduler, max_num_seqs=64, max_num_batched_tokens=2048,
                                gpu_memory_utilization=0.9, max_new_tokens=int(w["output_tokens"].max()),
                                async_scheduling=overlap, cost_model=cost_model(MODEL, GPU, split_attention=split))
        assert np.allclose(rep.predicted["e2e_s"].to_numpy(), direct.requests["e2e_s"].to_numpy(), rtol=1e-12)
        assert ("attention split by phase" in rep.cost_model) is split
        assert _replace(s, scheduler="chunked").scheduler == "chunked"  # a stated scheduler is kept
    (tmp_path / "s.yaml").write_text(f"name: sg\nserver: SGLang\nmodel: {MODEL}\ngpu: H100-SXM\n")
    data = {"input_lens": [100, 200], "output_lens": [3, 4], "ttfts": [0.1, 0.1], "itls": [[0.02] * 2, [0.02] * 3],
            "start_times": [0.0, 0.5], "errors": ["", ""]}
    (tmp_path / "r.json").write_text(json.dumps(data))
    (got,) = read_bench_results(tmp_path / "r.json", tmp_path / "s.yaml")
    base = resolve("sglang").settings(Context(model=spec_model(MODEL), gpu_name="H100-SXM"))[0]
    assert (got.setup.engine, got.setup.scheduler, got.setup.max_num_seqs, got.setup.max_num_batched_tokens) == \
        ("sglang", "prefill_first_chunked", base.max_num_seqs, base.max_num_batched_tokens)
    with pytest.raises(ValueError, match="run x: engine must be one of sglang, tensorrt-llm, tgi, vllm-v0, vllm-v1"):
        SetUp(name="x", dataset="d", engine="vllm_v1", model=MODEL, gpu=GPU)
