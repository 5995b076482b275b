"""``kvlab recommend`` as a user runs it: expectations computed from the files, not from kvlab.recommend."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from kvlab.cli import main

MODEL, GPU = "Llama-2-7B", "A100-40GB"  # 4,096 tokens of context
FAST = ["--model", MODEL, "--gpu", GPU, "--windows", "2", "--window-requests", "150", "--no-progress",
        "--workers", "1"]
TINY = ["--model", MODEL, "--gpu", GPU, "--windows", "1", "--window-requests", "60", "--no-progress",
        "--workers", "1"]


def _azure(path, n: int = 400, rate_per_s: float = 4.0, seed: int = 0) -> pd.DataFrame:
    """An Azure-format trace at a known rate; three prompts do not fit a 4,096-token context."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(100, 1200, n)
    prompt[[5, n // 4, n - 10]] = [4096, 5000, 4500]
    output = np.maximum(1, np.round(np.exp(rng.normal(4.0, 0.7, n)))).astype(int)
    output[7] = 4000  # 4,000 + its prompt (>= 100) runs past the context
    t = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    stamps = pd.Timestamp("2023-11-16 18:00") + pd.to_timedelta(t, unit="s")
    df = pd.DataFrame({"TIMESTAMP": stamps.astype(str), "ContextTokens": prompt, "GeneratedTokens": output})
    df.to_csv(path, index=False)
    return df


def _run_json(capsys, *argv) -> dict:
    assert main(["recommend", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_gives_the_rate_the_capacities_and_clamped_flags(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    df = _azure(path)
    out = _run_json(capsys, str(path), *FAST, "--system", "vllm")
    fits = df["ContextTokens"] < 4096
    t = pd.to_datetime(df["TIMESTAMP"]).astype("int64").to_numpy()[fits] / 1e9
    assert out["load"]["rate_per_s"] == pytest.approx((fits.sum() - 1) / (t.max() - t.min()), rel=1e-6)
    assert out["load"]["num_requests"] == fits.sum() == 397
    assert out["context"]["prompts_over_context"] == 3
    too_long = fits & (df["ContextTokens"] + df["GeneratedTokens"] > 4096)
    assert out["context"]["outputs_over_context"] == int(too_long.sum()) >= 1
    assert any(w.startswith("3 of 400 requests (0.8%) are refused: their prompts do not fit") for w in out["warnings"])
    rows = out["table"]
    assert {r["system"] for r in rows} == {"vllm"} and len(rows) >= 4
    for r in rows:
        assert r["capacity_lo_qps"] <= r["capacity_qps"] <= r["capacity_hi_qps"]
        assert r["median_ttft_ms"] <= r["p99_ttft_ms"] and r["median_itl_ms"] <= r["p99_itl_ms"]
        assert len(out["capacities"][f"vllm: {r['setting']}"]) == 2
    cmd = out["flags"][0]["command"]
    max_len = int(re.search(r"--max-model-len (\d+)", cmd).group(1))
    assert max_len == 4096  # the model's context, not the trace's longest request
    assert out["flags"][0]["setting"] == out["chosen"].split(": ", 1)[1]  # the printed flags are the answer's
    # the offered rate is the trace's, refused requests included
    t_all = pd.to_datetime(df["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    assert out["load"]["offered_rate_per_s"] == pytest.approx(out["load"]["rate_per_s"] * 400 / 397)
    assert out["load"]["offered_rate_per_s"] == pytest.approx(399 / (t_all.max() - t_all.min()), rel=0.02)
    assert out["load"]["refused_requests"] == 3
    assert out["decision"] in ("recommend", "keep-default", "all-tie", "overloaded")
    assert out["setup"]["model"] == MODEL and out["setup"]["slo_p99_tbt_s"] == 0.1


def test_text_fits_100_columns_and_csv_holds_the_table(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path)
    table = tmp_path / "table.csv"
    assert main(["recommend", str(path), *TINY, "--system", "tgi", "--csv", "-o", str(table)]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "answer:" in text and "requests/s" in text and "text-generation-launcher" in text
    csv = pd.read_csv(table)
    for col in ("setting", "capacity_qps", "capacity_lo_qps", "capacity_hi_qps", "headroom", "replicas",
                "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "tie", "recommended"):
        assert col in csv.columns
    rate = 4.0
    for _, r in csv.iterrows():  # replicas carry the offered rate: ceil(rate / capacity)
        if r["capacity_qps"] > 0:
            assert r["replicas"] == math.ceil(r["offered_rate_per_s"] / r["capacity_qps"] - 1e-9)
            assert r["offered_rate_per_s"] == pytest.approx(rate, rel=0.15)


def test_rate_scale_and_qps(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path)
    small = [*TINY, "--system", "tgi", "--num-requests", "100"]
    base = _run_json(capsys, str(path), *small)
    twice = _run_json(capsys, str(path), *small, "--rate-scale", "2")
    fixed = _run_json(capsys, str(path), *small, "--qps", "9")
    assert twice["load"]["rate_per_s"] == pytest.approx(2 * base["load"]["rate_per_s"])
    # --qps is the rate offered to the server: 3 of the trace's 400 prompts are refused
    assert fixed["load"]["offered_rate_per_s"] == pytest.approx(9.0)
    assert fixed["load"]["rate_per_s"] == pytest.approx(9.0 * 397 / 400)


def test_on_bad_drop_counts_the_rows(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    df = _azure(path, n=200)
    df.loc[10, "GeneratedTokens"] = -1
    df.to_csv(path, index=False)
    assert main(["recommend", str(path), *FAST, "--system", "vllm"]) == 2
    assert "on_bad='drop'" in capsys.readouterr().err
    out = _run_json(capsys, str(path), *TINY, "--system", "tgi", "--on-bad", "drop")
    assert any(w.startswith("1 dropped rows") for w in out["warnings"])
    assert out["load"]["trace_requests"] == 200 - 1 - 3  # the bad row dropped, three prompts too long


def test_comparison_without_system(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path, n=200)
    out = _run_json(capsys, str(path), *TINY)
    assert [r["system"] for r in out["table"]] == ["vllm", "sglang", "tgi", "tensorrt-llm"]
    assert all(r["default"] for r in out["table"])
    assert {f["system"] for f in out["flags"]} == {"vllm", "sglang", "tgi", "tensorrt-llm"}


def test_prometheus_scrapes(tmp_path, capsys):
    def scrape(scale: float) -> str:
        lines = ["# TYPE vllm:request_prompt_tokens histogram"]
        for le, c in [("10", 0), ("100", 30), ("1000", 90), ("+Inf", 100)]:
            lines.append(f'vllm:request_prompt_tokens_bucket{{le="{le}",model_name="m"}} {c * scale}')
        for le, c in [("10", 10), ("100", 70), ("1000", 100), ("+Inf", 100)]:
            lines.append(f'vllm:request_generation_tokens_bucket{{le="{le}",model_name="m"}} {c * scale}')
        lines.append(f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {100 * scale}')
        return "\n".join(lines) + "\n"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(scrape(1))
    b.write_text(scrape(4))
    out = _run_json(capsys, str(a), str(b), "--scrape-interval", "60", *TINY, "--system", "tgi")
    assert out["load"]["rate_per_s"] == pytest.approx(300 / 60, rel=0.3)  # Poisson draws at 5 requests/s
    # 300 requests finished between the scrapes; draws from the open last bucket may not fit the context
    assert out["load"]["trace_requests"] + out["context"]["prompts_over_context"] == 300
    assert main(["recommend", str(a), *TINY, "--system", "tgi"]) == 0  # one scrape: capacity, no rate
    assert "offline" in capsys.readouterr().out


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["recommend", str(tmp_path / "missing.csv"), *FAST]) == 2
    assert "missing.csv" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"prompt_tokens": [10, 20], "tokens_out": [3, 4]}).to_csv(bad, index=False)
    assert main(["recommend", str(bad), *FAST]) == 2
    assert "cannot tell the trace format" in capsys.readouterr().err
    path = tmp_path / "azure.csv"
    _azure(path, n=50)
    assert main(["recommend", str(path), *FAST, "--max-new-tokens", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err
    assert main(["recommend", str(path), *FAST, "--rate-scale", "2", "--qps", "3"]) == 2
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["recommend", str(path), "--gpu", GPU])  # --model is required


def test_pinned_version_precision_and_saved_config_files(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path, n=200)
    old = _run_json(capsys, str(path), *TINY, "--system", "vllm==0.8")
    assert old["setup"]["version_family"].startswith("vLLM V0") and old["setup"]["server"]["overflow"].startswith(
        "recompute by default")
    assert any(r["overflow"] == "swap" for r in old["table"])  # V0 still swaps, and says so
    assert old["setup"]["default_flags"] == "--max-num-seqs 256 --max-num-batched-tokens 4096 " \
        "--gpu-memory-utilization 0.9"  # V0: max(max_model_len, 2048) tokens, the model's 4,096 context
    # TensorRT-LLM's scheduler policy and KV dtype live in a YAML file: --save-dir writes it where the command says
    saved = tmp_path / "cfg"
    trt = _run_json(capsys, str(path), "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--windows", "1",
                    "--window-requests", "60", "--no-progress", "--workers", "1", "--system", "tensorrt-llm",
                    "--kv-cache-dtype", "fp8", "--save-dir", str(saved))
    cmd = trt["flags"][0]["command"]
    yaml_path = re.search(r"--extra_llm_api_options (\S+)", cmd).group(1)
    assert yaml_path == str(saved / "extra_llm_api_options.yaml")
    text = (saved / "extra_llm_api_options.yaml").read_text()
    assert "capacity_scheduler_policy:" in text and "dtype: fp8" in text  # the KV dtype the run simulated
    assert trt["setup"]["kv_cache_dtype"] == "fp8" and "meta-llama/Meta-Llama-3-8B" in cmd


def test_flags_are_checked_against_the_release(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path, n=50)
    assert main(["recommend", str(path), *FAST, "--system", "vllm", "--block-size", "7"]) == 2
    err = capsys.readouterr().err
    assert "block_size 7" in err and "1, 8, 16, 32, 64, 128, 256" in err
    assert main(["recommend", str(path), *FAST, "--system", "vllm==0.4"]) == 2
    assert "no profile covers vllm 0.4" in capsys.readouterr().err
    assert main(["recommend", str(path), *FAST, "--system", "triton"]) == 2
    assert "known systems are vllm, sglang, tgi, tensorrt-llm" in capsys.readouterr().err


def test_a_shuffled_copy_of_a_trace_gets_the_same_answer(tmp_path, capsys):
    """Rows out of arrival order are the same requests: the same table, capacities and flags."""
    path, shuffled = tmp_path / "azure.csv", tmp_path / "shuffled.csv"
    df = _azure(path)
    df.sample(frac=1.0, random_state=3).to_csv(shuffled, index=False)
    a = _run_json(capsys, str(path), *TINY, "--system", "vllm")
    b = _run_json(capsys, str(shuffled), *TINY, "--system", "vllm")
    assert {**b["load"], "source": ""} == {**a["load"], "source": ""}
    assert b["table"] == a["table"] and b["flags"] == a["flags"] and b["capacities"] == a["capacities"]


def test_headline_names_the_refused_requests_and_the_traces_rate(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    df = _azure(path)
    assert main(["recommend", str(path), *TINY, "--system", "tgi"]) == 0
    text = capsys.readouterr().out
    t = pd.to_datetime(df["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    offered = 399 / (t.max() - t.min())
    head = " ".join(text.split("setting ")[0].split())  # the lines above the table, unwrapped
    assert f"offered: {offered:.3g} requests/s, the trace's own rate" in head
    assert "3 of 400 requests (0.8%) are refused" in head
    assert "--max-model-len 4,096 (Llama-2-7B's context)" in head
    assert "to within 5% (the search's grid)" in head
    assert "--max-total-tokens 4096" in text and "--max-input-tokens 4095" in text


def test_model_by_hugging_face_id_or_config_and_names_checked_before_the_trace(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path, n=120)
    by_name = _run_json(capsys, str(path), *TINY, "--system", "tgi")
    args = [a if a != MODEL else "meta-llama/Llama-2-7b-hf" for a in TINY]
    by_id = _run_json(capsys, str(path), *args, "--system", "tgi")
    assert by_id["capacities"] == by_name["capacities"] and by_id["setup"]["model"] == MODEL
    assert "--model-id meta-llama/Llama-2-7b-hf" in by_id["flags"][0]["command"]
    config = tmp_path / "config.json"  # Llama-2-7B's published config
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                                  "num_key_value_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008,
                                  "vocab_size": 32000, "max_position_embeddings": 4096,
                                  "_name_or_path": "my-llama"}))
    args = [a if a != MODEL else str(config) for a in TINY]
    by_file = _run_json(capsys, str(path), *args, "--system", "tgi")
    assert by_file["capacities"] == by_name["capacities"] and by_file["setup"]["model"] == "my-llama"
    # a wrong name is answered before the (here missing) trace is read, with the names it may mean
    missing = str(tmp_path / "missing.csv")
    assert main(["recommend", missing, "--model", MODEL, "--gpu", "h100"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'h100'; did you mean H100-SXM or H100-PCIe" in err and "missing.csv" not in err
    assert main(["recommend", missing, "--model", "llama3-8b", "--gpu", "A100-80GB"]) == 2
    assert "did you mean A100-80GB-SXM or A100-80GB-PCIe" in capsys.readouterr().err
    assert main(["recommend", missing, "--model", "Llama3", "--gpu", GPU]) == 2
    assert "unknown model 'Llama3'; did you mean Llama-3-8B" in capsys.readouterr().err
    assert main(["recommend", missing, "--model", "Qwen/Qwen9-1B", "--gpu", GPU]) == 2
    assert "pass its path" in capsys.readouterr().err
    assert main(["recommend", missing, "--model", MODEL, "--gpu", GPU, "--max-model-len", "5000"]) == 2
    assert "above Llama-2-7B's context of 4,096" in capsys.readouterr().err


def test_gpu_spec_file_is_a_gpu_of_ones_own_extrapolated_from_the_nearest_measured_gpu(tmp_path, capsys):
    """A spec file with A100-40GB's figures: nearest measured GPU A100-40GB, every spec ratio 1, so
    the same capacities as the catalogued GPU's measured model; the report says it is extrapolated."""
    path = tmp_path / "azure.csv"
    _azure(path, n=120)
    row = pd.read_csv("data/gpus.csv").set_index("name").loc[GPU]
    spec = tmp_path / "gpu.yaml"
    spec.write_text("name: my-a100\n" + "".join(f"{k}: {row[k]}\n" for k in (
        "memory_mib", "hbm_bandwidth_gbps", "bf16_dense_tflops", "host_link_gbps", "interconnect_gbps",
        "internode_gbps")))
    args = [a for a in TINY if a not in ("--gpu", GPU)]
    mine = _run_json(capsys, str(path), *args, "--gpu-spec", str(spec), "--system", "tgi")
    assert mine["setup"]["gpu"] == "my-a100" and not mine["setup"]["gpu_measured"]
    assert "extrapolated from A100-40GB" in mine["setup"]["cost_model"]
    catalogued = _run_json(capsys, str(path), *TINY, "--system", "tgi")
    assert mine["capacities"] == catalogued["capacities"]  # the same numbers, the same curves
    assert main(["recommend", str(path), *args, "--gpu-spec", str(spec), "--system", "tgi"]) == 0
    assert "GPU not measured: my-a100 extrapolated from the nearest measured GPU" in " ".join(
        capsys.readouterr().out.split())
    spec.write_text("name: x\nmemory_mib: -1\n")
    assert main(["recommend", str(path), *args, "--gpu-spec", str(spec)]) == 2
    assert "missing hbm_bandwidth_gbps" in capsys.readouterr().err


def test_ttft_bound_is_part_of_the_slo(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path, n=120)
    out = _run_json(capsys, str(path), *TINY, "--system", "tgi", "--slo-p99-ttft", "0.001")
    assert out["setup"]["slo_p99_ttft_s"] == 0.001 and "P99 TTFT <= 0.001 s" in out["setup"]["slo"]
    assert all(r["capacity_qps"] == 0 for r in out["table"])  # no prefill finishes in 1 ms


def test_a_qwen3_config_runs(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    _azure(path, n=120)
    config = tmp_path / "qwen3"  # a folder holding Qwen/Qwen3-0.6B's config.json
    config.mkdir()
    (config / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "tie_word_embeddings": True, "_name_or_path": "Qwen/Qwen3-0.6B"}))
    args = [a if a != MODEL else str(config) for a in TINY]
    out = _run_json(capsys, str(path), *args, "--system", "tgi")
    assert out["setup"]["model"] == "Qwen/Qwen3-0.6B" and out["context"]["max_model_len"] == 40960
    assert out["context"]["prompts_over_context"] == 0  # the 4,096-5,000-token prompts fit 40,960
    assert "--model-id Qwen/Qwen3-0.6B" in out["flags"][0]["command"]


def test_each_system_is_priced_with_its_familys_stack_and_says_so(tmp_path, capsys):
    """vLLM >= 0.11 runs on the vllm-v1 stack, the V0 family on vllm-v0, a system without a fitted stack
    on GPU time only; the JSON and the trust line name it (read from the shipped stack files)."""
    path = tmp_path / "trace.csv"
    _azure(path)
    for system, stack in (("vllm", "vllm-v1"), ("vllm==0.8", "vllm-v0"), ("sglang", "none")):
        out = _run_json(capsys, str(path), *TINY, "--system", system)
        setup = out["setup"]
        assert setup["stack"] == stack and setup["server"]["stack"] == stack
        assert f"stack {stack}" in setup["trust"]
        assert (f"+ stack {stack}:" in setup["cost_model"]) == (stack != "none")
        # NVIDIA's measured points of this server on this GPU family, where there are some (kvlab.validate.points)
        from kvlab.validate.trust_figures import point_trust
        line = point_trust([system.split("==")[0]], GPU)
        assert (line in setup["trust"]) if line else "NVIDIA's measured points" not in setup["trust"]


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, capsys):
    """Without --no-progress, a run whose stderr is a file or a pipe (here captured) draws no bar:
    a redrawn bar would leave carriage returns in the log."""
    path = tmp_path / "azure.csv"
    _azure(path, n=120)
    argv = [a for a in TINY if a != "--no-progress"]
    assert main(["recommend", str(path), *argv, "--system", "vllm"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "run/s" not in err
