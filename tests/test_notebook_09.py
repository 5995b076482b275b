"""Notebook 09 runs quick with the shared serving runs, and without them says so and gives no numbers."""
from __future__ import annotations

import pytest

from kvlab.validate.readers import SHARED_SERVING


@pytest.mark.notebook
def test_notebook_09_without_data(run_notebook, tmp_path):
    res = run_notebook("09_real_servers", {"quick": True, "serving_dir": str(tmp_path / "none")})
    assert res["have_data"] is False
    assert "no numbers" in res["answer"] and "tables" not in res
    # section 6 runs on built-in data: the points' scatter is the one figure
    assert len(res["figures"]) == 1 and "points" in res["figures"][0]
    _check_points(res)


@pytest.mark.notebook
@pytest.mark.skipif(not SHARED_SERVING.is_dir(), reason="needs ../shared/data/serving (CI has it)")
def test_notebook_09_quick(run_notebook):
    res = run_notebook("09_real_servers", {"quick": True})
    assert res["have_data"] is True
    tables = res["tables"]
    assert {t["dataset"] for t in tables} == {"distserve-vllm-opt13b", "llmservingsim-vllm-0.19"}
    assert {t["cost model"] for t in tables} == {"default model (stack none)", "stack held out"}
    held = [r for r in res["held_out_runs"]]
    assert len(held) == 6 and {r["stack"] for r in held} == {"vllm-v0", "vllm-v1"}
    # every table row is the median of its runs' |errors| (computed here again)
    import statistics
    for t in tables:
        rows = res["held_out_runs"] if t["cost model"] == "stack held out" else res["default_runs"]
        errs = [abs(r["tpot_mean_err"]) for r in rows if r["dataset"] == t["dataset"]]
        assert t["tpot_mean_abs_err"] == pytest.approx(statistics.median(errs))
    assert len(res["figures"]) == 3
    _check_points(res)
    assert all(m["why"] for m in res["misses"])
    # section 2b: each multi-GPU PCIe run both ways, the set-up's choice (no peer-to-peer) marked once and equal
    # to the default table's row; the expert-parallel run's gathers run on NCCL, slower through host memory
    both = res["p2p_both_ways"]
    runs = {r["run"] for r in both}
    assert runs == {"RTXPRO6000/Qwen3-32B", "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507"}
    default = {r["run"]: r for r in res["default_runs"]}
    for run in runs:
        on, off = (next(r for r in both if r["run"] == run and r["p2p"] is p) for p in (True, False))
        assert off["as set up"] and not on["as set up"]
        assert off["tpot_mean_err"] == pytest.approx(default[run]["tpot_mean_err"])
        if "A3B" in run:
            assert off["tpot_mean_err"] > on["tpot_mean_err"]


def _check_points(res):
    """Section 6: each server's row is the median of its points' |errors| (computed here again), and the findings
    state their numbers."""
    import statistics
    table = res["points_table"]
    assert {t["dataset"] for t in table} == {"aiconfigurator-vllm", "aiconfigurator-sglang", "aiconfigurator-tensorrt-llm"}
    for t in table:
        rows = [r for r in res["points"] if r["dataset"] == t["dataset"]]
        assert t["points"] == len(rows) > 0
        for m in ("ttft", "e2e", "tpot"):
            assert t[f"{m}_mean_abs_err"] == pytest.approx(statistics.median(abs(r[f"{m}_mean_err"]) for r in rows))
    assert res["points_findings"] and all(any(ch.isdigit() for ch in f) for f in res["points_findings"])
    # 6b: the vLLM points both ways, every row a model and an output share with points
    assert res["points_vllm_both_ways"] and all(r["points"] > 0 for r in res["points_vllm_both_ways"])
    # 6c: held out by GPU (SGLang by TP), each server's table the median of its held-out points' |errors|
    held = res["points_held_out"]
    assert {h["held_out"].split()[0] for h in held if h["dataset"] == "aiconfigurator-sglang"} <= {"tp"}
    assert {h["held_out"].split()[0] for h in held if h["dataset"] != "aiconfigurator-sglang"} <= {"gpu"}
    for t in res["points_held_out_table"]:
        rows = [h for h in held if h["dataset"] == t["dataset"]]
        assert t["tpot_mean_abs_err"] == pytest.approx(statistics.median(abs(r["tpot_mean_err"]) for r in rows))
