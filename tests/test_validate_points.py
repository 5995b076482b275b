"""kvlab.validate.points: fixed-concurrency benchmark points of real servers (aiconfigurator's silicon sample)."""
import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import cost_model
from kvlab.costmodel.stacks import StackTerms
from kvlab.validate import SetUp
from kvlab.validate import points as P


def _setup(**kw):
    base = dict(name="p", dataset="d", server="vLLM", server_version="0.12.0", model="Llama-3.1-8B", gpu="H100-SXM",
                max_num_seqs=1, max_num_batched_tokens=4096, max_concurrency=1)
    return SetUp(**{**base, **kw})


def test_one_client_is_served_one_request_at_a_time():
    """Hand-worked closed form: with one client (C = 1) each request runs alone on an idle server. Its TTFT is one
    prefill iteration of the whole prompt, its TPOT the mean of its decode iterations (context prompt + j for the
    j-th), on the cost model built by hand; vLLM 0.12 schedules synchronously."""
    isl, osl = 1000, 50
    point = P.ConcurrencyPoint(_setup(), prompt_tokens=isl, output_tokens=osl, ttft_mean_s=0.1, tpot_mean_s=0.01)
    row, _ = P.replay_point(point, rounds=3)
    cm = cost_model("Llama-3.1-8B", "H100-SXM")
    ttft = cm.iteration_s(isl, isl * (isl + 1) // 2, isl, 1)
    tpot = np.mean([cm.iteration_s(1, isl + j, isl + j, 1) for j in range(1, osl)])
    assert row["ttft_mean_pred"] == pytest.approx(ttft, rel=1e-9)
    assert row["tpot_mean_pred"] == pytest.approx(tpot, rel=1e-9)
    assert row["e2e_mean_pred"] == pytest.approx(ttft + (osl - 1) * tpot, rel=1e-9)
    assert row["ttft_mean_err"] == pytest.approx(ttft / 0.1 - 1)
    assert row["throughput_tok_s_pred"] == pytest.approx(osl / row["e2e_mean_pred"])
    assert row["queued_pred"] is False


def test_more_clients_than_the_server_runs_queue_in_the_server():
    """Eight clients, a server that runs two at a time: the others wait inside it in every steady iteration. By
    Little's law each request spends C / slots = 4 services from send to finish, three of them waiting, so its
    TTFT is about 1 - 2 / 8 = 75% of its E2E (the prefill is short beside the decodes)."""
    point = P.ConcurrencyPoint(_setup(max_num_seqs=2, max_concurrency=8), prompt_tokens=500, output_tokens=20,
                               ttft_mean_s=0.1, tpot_mean_s=0.01)
    row, _ = P.replay_point(point, rounds=4)
    assert row["queued_pred"] is True
    assert 0.70 < row["ttft_mean_pred"] / row["e2e_mean_pred"] < 0.80


def test_a_point_needs_a_concurrency_and_positive_means():
    with pytest.raises(ValueError, match="max_concurrency"):
        P.ConcurrencyPoint(_setup(max_concurrency=None), prompt_tokens=10, output_tokens=10, ttft_mean_s=0.1,
                           tpot_mean_s=0.01)
    with pytest.raises(ValueError, match="tpot_mean_s must be a positive"):
        P.ConcurrencyPoint(_setup(), prompt_tokens=10, output_tokens=10, ttft_mean_s=0.1, tpot_mean_s=0.0)


def _silicon(**over):
    row = {"id": "x", "silicon_data_source": "db; silicon_concurrency=16; measured=2026-01-05T00:00:00Z",
           "backend": "vllm", "backend_version": "0.12.0", "model_path": "meta-llama/Llama-3.1-70B",
           "system": "h200_sxm", "precision": "fp8", "mode": "agg", "isl": 1024, "osl": 512, "batch_size": 16.0,
           "tp_size": 4.0, "pp_size": 1.0, "attention_dp_size": 1.0, "moe_ep_size": 1.0, "silicon_ttft_ms": 120.0,
           "silicon_tpot_ms": 15.0}
    return {**row, **over}


def test_derive_keeps_aggregated_tp_points_of_catalogued_models_in_seconds():
    rows = [_silicon(id="keep"), _silicon(id="disagg", mode="disagg"), _silicon(id="moe", model_path="openai/gpt-oss-120b"),
            _silicon(id="fp4", precision="fp4"), _silicon(id="dp", attention_dp_size=4.0),
            _silicon(id="gb200", system="gb200"), _silicon(id="nover", backend_version=np.nan,
                                                          silicon_data_source="file.csv", batch_size=8.0)]
    out = P.derive(pd.DataFrame(rows))
    assert sorted(out["source_id"]) == ["keep", "nover"]
    keep = out[out["source_id"] == "keep"].iloc[0]
    assert (keep["server"], keep["model"], keep["gpu"], keep["tp"], keep["weight_dtype"]) == \
        ("vLLM", "Llama-3.1-70B", "H200", 4, "fp8")
    assert keep["concurrency"] == 16 and keep["measured"] == "2026-01-05"
    assert keep["ttft_mean_s"] == pytest.approx(0.12) and keep["tpot_mean_s"] == pytest.approx(0.015)
    nover = out[out["source_id"] == "nover"].iloc[0]
    assert nover["concurrency"] == 8 and nover["server_version"] == "" and nover["measured"] == ""


def test_the_shipped_points_run_with_the_benchmark_generators_flags(tmp_path):
    pts = P.read_points()
    assert len(pts) > 500 and {p.setup.dataset for p in pts} == {
        "aiconfigurator-vllm", "aiconfigurator-sglang", "aiconfigurator-tensorrt-llm"}
    for p in pts:
        s, c = p.setup, p.concurrency
        assert s.max_num_seqs == c and s.weight_dtype == "fp8" and any("aiconfigurator" in a for a in s.assumptions)
        if s.server == "vLLM":
            assert s.max_num_batched_tokens == c + p.prompt_tokens + 1500
            assert s.max_model_len == p.prompt_tokens + p.output_tokens + 1500
        elif s.server == "SGLang":
            assert s.scheduler == "chunked" and s.max_num_batched_tokens <= p.prompt_tokens + 1500
        else:
            assert s.scheduler == "mixed_whole" and not s.schedules_async and not s.prefix_caching
            assert s.max_num_batched_tokens % 32 == 0 and 0 <= s.max_num_batched_tokens - (c + p.prompt_tokens + 1500) < 32
    # a vLLM point measured before 0.14 without a recorded version schedules synchronously
    old = [p for p in pts if p.setup.server == "vLLM" and not p.setup.server_version]
    assert old and not any(p.setup.schedules_async for p in old)
    # a bad table names the file and the row
    bad = tmp_path / "points.csv"
    pd.read_csv(P.PATH).head(3).drop(columns="tp").to_csv(bad, index=False)
    with pytest.raises(ValueError, match=f"points table {bad} lacks the column"):
        P.read_points(bad)
    t = pd.read_csv(P.PATH).head(3)
    t.loc[1, "model"] = "Llama-9-1T"
    t.to_csv(bad, index=False)
    with pytest.raises(ValueError, match="row 3"):
        P.read_points(bad)


def test_point_table_takes_median_absolute_errors_per_server():
    rows = [{"dataset": "a", "ttft_mean_err": e, "e2e_mean_err": -e, "tpot_mean_err": 2 * e} for e in (-0.1, 0.2, 0.4)]
    t = P.point_table(rows + [{"dataset": "b", "ttft_mean_err": 0.5, "e2e_mean_err": 0.5, "tpot_mean_err": 0.5}])
    a = t[t["dataset"] == "a"].iloc[0]
    assert a["points"] == 3 and a["ttft_mean_abs_err"] == pytest.approx(0.2) and a["tpot_mean_abs_err"] == pytest.approx(0.4)


def test_held_out_stacks_recover_a_known_cpu_time_on_the_group_left_out(monkeypatch):
    """Points 'measured' as kvlab serves them with 2 ms of CPU time per iteration added (a synchronous server), on
    two GPUs: each GPU's points, predicted by the stack fitted on the other GPU's only, come back within 3%; the
    default model (no CPU time) runs them short."""
    from kvlab.costmodel.stacks import StackTerms

    truth = StackTerms(name="truth", overhead_s=0.002)
    pts = []
    for gpu in ("H100-SXM", "H200"):
        for c, isl, osl in ((2, 300, 40), (4, 600, 30), (8, 200, 60)):
            s = _setup(name=f"{gpu}-{c}", dataset="hand-made", gpu=gpu, max_num_seqs=c, max_concurrency=c,
                       max_num_batched_tokens=c + isl + 1500, clock_start="engine queue")
            probe = P.ConcurrencyPoint(s, prompt_tokens=isl, output_tokens=osl, ttft_mean_s=1.0, tpot_mean_s=1.0)
            row, _ = P.replay_point(probe, terms=truth)
            pts.append(P.ConcurrencyPoint(s, prompt_tokens=isl, output_tokens=osl, ttft_mean_s=row["ttft_mean_pred"],
                                          tpot_mean_s=row["tpot_mean_pred"]))
    fitted_on = {}
    real_fit = P.fit

    def spy(records, name, **kw):
        fitted_on[name] = {r.setup.gpu for r in records}
        return real_fit(records, name=name, **kw)

    monkeypatch.setattr(P, "fit", spy)
    h = P.held_out(pts, every=1)
    assert sorted(set(h["held_out"])) == ["gpu H100-SXM", "gpu H200"] and len(h) == len(pts)
    assert fitted_on == {"hand-made-without-gpu-H100-SXM": {"H200"}, "hand-made-without-gpu-H200": {"H100-SXM"}}
    assert h[["ttft_mean_err", "tpot_mean_err", "e2e_mean_err"]].abs().max().max() < 0.03
    default = pd.DataFrame([P.replay_point(p)[0] for p in pts])
    assert (default["tpot_mean_err"] < -0.1).all()


def test_cli_validates_a_points_file(tmp_path, capsys):
    """``kvlab validate --points FILE``: the per-point and per-server tables, the set-ups' assumptions, the CSV; a
    points file and result files together are refused in one line."""
    from kvlab.cli import main

    table = pd.read_csv(P.PATH)
    small = tmp_path / "points.csv"
    table[table["server"] == "vLLM"].head(2).to_csv(small, index=False)
    out = tmp_path / "errors.csv"
    assert main(["validate", "--points", str(small), "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "aiconfigurator-vllm" in text and "2 fixed-concurrency points" in text
    rows = pd.read_csv(out)
    assert rows["assumptions"].str.contains("engine flags not in the table").all()
    want = [P.replay_point(p)[0]["tpot_mean_err"] for p in P.read_points(small)]
    assert rows["tpot_mean_err"].to_numpy() == pytest.approx(want, rel=1e-9)
    assert main(["validate", "run.json", "--points", str(small)]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_reused_prompt_pool_is_served_from_the_prefix_cache():
    """One client, prefix cache on. A pool of one prompt: after the first request each finds its whole prompt
    cached but the last partial block, so its TTFT is an iteration of under one block (16 tokens), not the
    prompt's; a pool larger than the requests shares nothing and replays exactly as unique prompts."""
    from dataclasses import replace

    s = _setup(prefix_caching=True, max_num_batched_tokens=4096)
    unique = P.ConcurrencyPoint(s, prompt_tokens=1000, output_tokens=10, ttft_mean_s=0.1, tpot_mean_s=0.01)
    rec = replace(unique, prompt_pool=1).record(rounds=5)
    assert len(rec.workload()["hash_ids"].iloc[0]) == 2  # 1,000 tokens: two 512-token hash blocks
    base, _ = P.replay_point(unique, rounds=5)
    same, _ = P.replay_point(replace(unique, prompt_pool=1), rounds=5)
    many, _ = P.replay_point(replace(unique, prompt_pool=10 ** 6), rounds=5)
    assert many["ttft_mean_pred"] == base["ttft_mean_pred"] and many["tpot_mean_pred"] == base["tpot_mean_pred"]
    cm = cost_model("Llama-3.1-8B", "H100-SXM")
    tail = 1000 - 1000 // 16 * 16  # the last partial block, recomputed
    hit = cm.iteration_s(tail, 1000 * 1001 // 2 - 992 * 993 // 2, 1000, 1)
    assert same["ttft_mean_pred"] == pytest.approx((base["ttft_mean_pred"] + 4 * hit) / 5, rel=1e-6)
    with pytest.raises(ValueError, match="prompt_pool must be a positive integer"):
        replace(unique, prompt_pool=0)


def test_point_trust_reads_the_committed_point_errors_and_they_are_current():
    """The trust line's figures are the medians of the committed point errors, per server and GPU family; a
    server or GPU without points gives no line; a sample of the committed errors is what the points replay to
    now (``python -m kvlab.validate`` rewrites them when the physics changes)."""
    from kvlab.validate import trust_figures as T

    df = pd.read_csv(T.POINT_ERRORS_PATH)
    rows = df[(df["server"] == "vLLM") & (df["gpu"] == "H100-SXM")]
    line = T.point_trust(["vllm", "tensorrt-llm"], "H100-SXM")
    assert f"vLLM on H100: {len(rows)} points" in line and "TensorRT-LLM on H100" in line
    assert f"TPOT {rows['tpot_mean_err'].abs().median():.1%}" in line
    assert T.point_trust(["vllm"], "A100-80GB-SXM") == "" and T.point_trust(["tgi"], "H100-SXM") == ""
    from dataclasses import replace as _replace
    from kvlab.specs import gpu as _gpu
    assert T.point_trust(["vllm"], _gpu("H100-SXM")) == T.point_trust(["vllm"], "H100-SXM")  # a spec object
    assert T.point_trust(["vllm"], _replace(_gpu("A100-80GB-SXM"), name="my-a100")) == ""  # one's own GPU: none
    pts = {p.setup.name: p for p in P.read_points()}
    assert len(df) == len(pts)
    for _, r in df.sample(4, random_state=0).iterrows():
        got = P.replay_point(pts[r["point"]])[0]
        assert got["tpot_mean_err"] == pytest.approx(r["tpot_mean_err"], rel=1e-3, abs=1e-5)
        assert got["ttft_mean_err"] == pytest.approx(r["ttft_mean_err"], rel=1e-3, abs=1e-5)


def test_a_points_table_may_state_its_own_flags(tmp_path):
    """A user's points file with a max_num_batched_tokens and a kv_cache_dtype column: those flags hold for its
    rows (and no assumption claims them), the rest stay the benchmark generator's."""
    t = pd.read_csv(P.PATH)
    t = t[t["server"] == "vLLM"].head(2).copy()
    t["max_num_batched_tokens"] = [4096, np.nan]
    t["kv_cache_dtype"] = "fp8"
    path = tmp_path / "mine.csv"
    t.to_csv(path, index=False)
    a, b = P.read_points(path)
    assert a.setup.max_num_batched_tokens == 4096 and a.setup.kv_cache_dtype == "fp8"
    assert b.setup.max_num_batched_tokens == b.concurrency + b.prompt_tokens + 1500  # left empty: the generator's
    assert not any("max_num_batched_tokens" in x for x in a.setup.assumptions)
    assert not any("KV cache dtype" in x for x in a.setup.assumptions) and a.setup.source.startswith("mine.csv")


def test_the_shipped_in_step_vllm_stack_is_the_fit_of_its_points_and_its_held_out_errors_are_current():
    """``vllm-v1-sync`` (``python -m kvlab.validate``): its terms are the fit of the points it states (refitted
    here), and its leave-one-GPU-out errors are those of each point replayed with its fold's terms (three
    recomputed, one per GPU); ``kvlab validate`` replays a vLLM V1 run of a release before 0.14.0 with it."""
    from kvlab.costmodel.stacks import load
    from kvlab.validate.calibrate import fit
    from kvlab.validate.cli import engine_stack

    shipped = load("vllm-v1-sync")
    by_name = {p.setup.name: p for p in P.read_points()}
    used = [by_name[f["run"]] for f in shipped.meta["fitted_to"]]
    assert {p.setup.server for p in used} == {"vLLM"} and not any(p.setup.schedules_async for p in used)
    refit = fit([p.record(6) for p in used], name="vllm-v1-sync").terms
    for f in ("overhead_s", "overhead_s_per_seq", "overhead_s_per_request", "gpu_time_scale"):
        assert getattr(refit, f) == pytest.approx(getattr(shipped, f), rel=1e-6, abs=1e-9), f
    ho = shipped.meta["held_out"]
    assert len(ho["runs"]) == sum(p.setup.server == "vLLM" for p in by_name.values())
    assert ho["median_abs_err"]["tpot"] == pytest.approx(np.median(np.abs([r["tpot_mean_err"] for r in ho["runs"]])))
    for gpu in ("H100-SXM", "H200", "B200"):
        r = next(r for r in ho["runs"] if r["gpu"] == gpu)
        assert r["held_out"] == f"gpu {gpu}"  # predicted by the stack fitted to the other GPUs' points
        f = ho["folds"][r["held_out"]]
        fold = StackTerms(name="fold", gpu_time_scale=f["held_out_scale"], overhead_s=f["held_out_overhead_s"],
                          overhead_s_per_seq=f["held_out_overhead_s_per_seq"],
                          overhead_s_per_request=f["held_out_overhead_s_per_request"])
        row, _ = P.replay_point(by_name[r["run"]], terms=fold)
        for m in ("ttft", "e2e", "tpot"):
            assert row[f"{m}_mean_err"] == pytest.approx(r[f"{m}_mean_err"], rel=1e-6), (gpu, m)
    assert engine_stack("vllm-v1", schedules_async=False) == "vllm-v1-sync"

