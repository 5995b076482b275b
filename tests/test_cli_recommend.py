"""``kvlab recommend`` on trace files of several formats prints what kvlab.recommend computes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvlab.cli import main
from kvlab.recommend import recommend
from kvlab.traces import load

ARGS = ["--model", "Llama-2-13B", "--gpu", "A100-40GB", "--slo-p99-tbt", "0.3", "--percentiles", "50", "95",
        "--modes", "recompute", "--max-new-tokens", "512"]


def _requests(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"prompt_tokens": rng.integers(20, 400, n),
                         "output_tokens": np.maximum(1, np.round(np.exp(rng.normal(3.5, 0.9, n)))).astype(int)})


def _write(fmt: str, path) -> None:
    w = _requests()
    if fmt == "csv":
        w.to_csv(path, index=False)
    elif fmt == "parquet":
        w.to_parquet(path)
    elif fmt == "azure":
        pd.DataFrame({"TIMESTAMP": pd.date_range("2023-11-16 18:00", periods=len(w), freq="250ms").astype(str),
                      "ContextTokens": w["prompt_tokens"], "GeneratedTokens": w["output_tokens"]}).to_csv(path, index=False)
    elif fmt == "mooncake":
        with open(path, "w") as f:
            for i, r in w.iterrows():
                f.write(json.dumps({"timestamp": 100 * i, "input_length": int(r.prompt_tokens),
                                    "output_length": int(r.output_tokens), "hash_ids": []}) + "\n")
    elif fmt == "vllm-bench":
        path.write_text(json.dumps({"input_lens": w["prompt_tokens"].tolist(), "output_lens": w["output_tokens"].tolist()}))
    elif fmt == "burstgpt":
        pd.DataFrame({"Timestamp": np.arange(len(w)) * 2, "Session ID": 1, "Elapsed time": 0.5, "Model": "ChatGPT",
                      "Request tokens": w["prompt_tokens"], "Response tokens": w["output_tokens"],
                      "Total tokens": w["prompt_tokens"] + w["output_tokens"],
                      "Log Type": "Conversation log"}).to_csv(path, index=False)
    elif fmt == "simulator-table":
        pd.DataFrame({"num_prefill_tokens": w["prompt_tokens"], "num_decode_tokens": w["output_tokens"],
                      "num_total_tokens": w["prompt_tokens"] + w["output_tokens"],
                      "pd_ratio": w["prompt_tokens"] / w["output_tokens"]}).to_csv(path, index=False)


@pytest.mark.parametrize("fmt,suffix", [("csv", "csv"), ("parquet", "parquet"), ("azure", "csv"),
                                        ("mooncake", "jsonl"), ("vllm-bench", "json"), ("burstgpt", "csv"),
                                        ("simulator-table", "csv")])
def test_recommend_prints_the_recommendation(tmp_path, capsys, fmt, suffix):
    path = tmp_path / f"trace.{suffix}"
    _write(fmt, path)
    assert main(["recommend", str(path), *ARGS]) == 0
    out = capsys.readouterr().out
    expected = recommend(load(path), model="Llama-2-13B", gpu="A100-40GB", slo_p99_tbt_s=0.3, percentiles=[50, 95],
                         modes=["recompute"], max_new_tokens=512)
    assert str(expected) in out
    for system in ("vLLM", "TGI", "TensorRT-LLM", "SGLang"):
        assert system in out
    assert out.count("recompute") >= 2  # table rows


def test_qps_gives_poisson_arrivals(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    _write("csv", path)
    assert main(["recommend", str(path), *ARGS, "--qps", "5"]) == 0
    expected = recommend(load(path), model="Llama-2-13B", gpu="A100-40GB", slo_p99_tbt_s=0.3, percentiles=[50, 95],
                         modes=["recompute"], max_new_tokens=512, arrivals="poisson", qps=5.0)
    assert str(expected) in capsys.readouterr().out


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["recommend", str(tmp_path / "missing.csv"), *ARGS]) == 2
    assert "missing.csv" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"prompt_tokens": [10, 20], "tokens_out": [3, 4]}).to_csv(bad, index=False)
    assert main(["recommend", str(bad), *ARGS]) == 2
    assert "cannot tell the trace format" in capsys.readouterr().err
    path = tmp_path / "trace.csv"
    _write("csv", path)
    assert main(["recommend", str(path), *ARGS[:-2], "--max-new-tokens", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err
    assert main(["recommend", str(path), "--model", "Llama-2-13B", "--gpu", "A100-40GB", "--slo-p99-tbt", "0.3",
                 "--modes", "drop"]) == 2
    assert "modes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["recommend", str(path), "--gpu", "A100-40GB", "--slo-p99-tbt", "0.3"])  # --model is required
