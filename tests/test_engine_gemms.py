"""Engines' own GEMM times (NVIDIA aiconfigurator's tables): reading, and the H100 curve fitted to them."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import data, engine_gemms as E, fit, validate
from kvlab.costmodel.measured import measured

needs_shared = pytest.mark.skipif(not data.available(), reason="needs ../shared/data/measured")


def write_table(root, device="NVIDIA H100 80GB HBM3", latency=0.01):
    d = root / "h100_sxm" / "gemm" / "vllm" / "0.14.0"
    d.mkdir(parents=True)
    rows = [("VLLM", "0.14.0", device, "gemm", "vllm_default", dt, m, n, k, latency * m)
            for dt in ("bfloat16", "fp8") for m in (1, 64) for n, k in ((512, 4096), (4096, 4096), (8192, 65536))]
    pd.DataFrame(rows, columns=["framework", "version", "device", "op_name", "kernel_source", "gemm_dtype", "m", "n",
                                "k", "latency"]).to_parquet(d / "gemm_perf.parquet")
    return d / "gemm_perf.parquet"


def test_a_table_is_reduced_to_bf16_llm_shapes_in_seconds(tmp_path):
    write_table(tmp_path)
    t = E.read_table(tmp_path, "h100_sxm", "vllm", "0.14.0")
    assert list(t.columns) == list(E.COLUMNS)
    assert set(t["gpu"]) == {"H100-SXM"} and len(t) == 2  # one BF16 shape with both dims in [1,024, 16,384], 2 m
    assert sorted(t["time_s"]) == pytest.approx([1e-5, 64e-5])  # milliseconds to seconds


def test_a_bad_table_is_named(tmp_path):
    with pytest.raises(ValueError, match="gemm_perf.parquet.*is missing"):
        E.read_table(tmp_path, "h100_sxm", "vllm", "0.14.0")
    path = write_table(tmp_path, device="NVIDIA Imaginary 9000")
    with pytest.raises(ValueError, match="Imaginary") as err:
        E.read_table(tmp_path, "h100_sxm", "vllm", "0.14.0")
    assert str(path) in str(err.value)


def test_the_h100_is_priced_from_the_engines_gemms():
    """The H100-SXM's GEMM curve against NVIDIA's measured vLLM 0.14.0 GEMMs (aiconfigurator 095f58a):
    within 8% median and 20% at the 90th percentile; the label names the table."""
    r = E.rows()
    assert {"H100-SXM", "H200", "B200", "L40S"} <= set(r["gpu"])
    r = r[r["gpu"] == "H100-SXM"]
    assert len(r) > 1500
    c = measured("Llama-2-7B", "H100-SXM")
    assert "aiconfigurator" in c.label and "vllm 0.14.0" in c.label
    rel = np.abs(c.gemm.time_s(*(r[x].to_numpy(float) for x in ("m", "n", "k"))) / r["time_s"].to_numpy() - 1)
    assert np.median(rel) < 0.08 and np.percentile(rel, 90) < 0.20


@needs_shared
def test_todays_vllm_runs_h100_gemms_faster_than_the_2024_profiles():
    """The measured fact the engine table carries: fitted to it, the H100's curve prices Vidur's own
    H100 GEMMs (2024 PyTorch) 15-30% faster at 65-1,024 tokens, and within 5% at decode sizes."""
    lin = data.vidur_linear()
    rows = fit.gemm_rows(lin[lin["gpu"] == "h100"])
    curve = measured("Llama-2-7B", "H100-SXM").gemm
    ratio = curve.time_s(*(rows[x].to_numpy(float) for x in ("m", "n", "k"))) / rows["time_s"].to_numpy()
    mid, small = rows["m"].between(65, 1024).to_numpy(), (rows["m"] <= 16).to_numpy()
    assert 0.70 < np.median(ratio[mid]) < 0.85
    assert abs(np.median(ratio[small]) - 1) < 0.05


def test_the_check_against_tables_never_fitted_to():
    """Every checked table appears once, priced from its GPU's own measurements; today's H100 (vLLM
    0.19.0) within 10% MAPE of the curve fitted to 0.14.0, and the H200's 0.19.0 within 15%."""
    t = validate.engine_gemm_check()
    assert set(t["gpu"]) == {"H100-SXM", "H200", "B200", "L40S", "A100-80GB-SXM", "RTXPRO6000"}
    assert not t.duplicated(["gpu", "measured"]).any() and set(t["engine"]) == {"vllm", "sglang", "trtllm"}
    assert not t["priced from"].str.startswith("extrapolated").any()
    v = t[t["engine"] == "vllm"].set_index("gpu")
    assert v.loc["H100-SXM", "mape"] < 0.10 and v.loc["H200", "mape"] < 0.15


def test_other_engines_gemms_are_vllms_on_the_hopper_gpus():
    """kvlab prices every server's GEMMs from vLLM's: on the H100 and H200, SGLang's and TensorRT-LLM's own
    linear layers (NVIDIA's tables, never fitted to) are within 15% MAPE of that curve with little bias (median
    within 8%), within 3 points of vLLM's own later release; one row recomputed from the shipped grid by hand."""
    t = validate.engine_gemm_check()
    hopper = t[t["gpu"].isin(["H100-SXM", "H200"]) & (t["engine"] != "vllm")]
    assert set(hopper["engine"]) == {"sglang", "trtllm"} and len(hopper) == 8
    assert (hopper["mape"] < 0.15).all() and (hopper["median_err"].abs() < 0.08).all()
    later_vllm = t[t["engine"] == "vllm"].set_index("gpu")["mape"]
    assert (hopper["mape"] <= hopper["gpu"].map(later_vllm) + 0.03).all()
    grid = E.checks()
    g = grid[(grid["gpu"] == "H100-SXM") & (grid["framework"] == "trtllm") & (grid["version"] == "1.3.0rc20")]
    curve = measured("Llama-2-7B", "H100-SXM").gemm
    rel = curve.time_s(*(g[x].to_numpy(float) for x in ("m", "n", "k"))) / g["time_s"].to_numpy() - 1
    row = t[(t["gpu"] == "H100-SXM") & (t["measured"] == "trtllm 1.3.0rc20")].iloc[0]
    assert row["rows"] == len(g) == 175 and row["mape"] == pytest.approx(np.mean(np.abs(rel)), rel=1e-9)


def test_leave_one_gpu_out_on_todays_stack():
    """Each fitted GPU once as a target with one nearest source; the H200-from-H100 row by hand (the
    H100's curve fitted to its own rows, bandwidth x4,800/3,350, the same 989 TFLOP/s peak, H200's floors)."""
    from dataclasses import replace
    t = validate.engine_leave_one_gpu_out()
    assert t.groupby("target")["nearest"].sum().eq(1).all() and set(t["target"]) == {"A100-80GB-SXM", "H100-SXM", "H200", "B200",
                                                                                                  "L40S"}
    r = E.rows()
    h100 = fit.fit_gemm(fit.engine_gemm_rows(r[r["gpu"] == "H100-SXM"]))
    curve = replace(h100, bytes_per_s=h100.bytes_per_s * 4800 / 3350, peak_bytes_per_s=4.8e12, peak_flops_per_s=989e12)
    h200 = r[r["gpu"] == "H200"]
    rel = curve.time_s(*(h200[x].to_numpy(float) for x in ("m", "n", "k"))) / h200["time_s"].to_numpy() - 1
    row = t[(t["target"] == "H200") & (t["from"] == "H100-SXM")].iloc[0]
    assert row["nearest"] and row["mape"] == pytest.approx(np.mean(np.abs(rel)), rel=1e-9) and row["mape"] < 0.15


#: A model whose every dense GEMM is a weight shape the tables measured (6,144 x 4,096, 4,096 x 4,096,
#: 16,384 x 4,096, 4,096 x 8,192).
ON_GRID = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 2, "intermediate_size": 8192, "vocab_size": 32000, "max_position_embeddings": 8192}


def _split_bounded(t: pd.DataFrame) -> np.ndarray:
    """A shape's measured times in token order, each at most the one before it scaled by the token ratio."""
    t = t.sort_values("m")
    m, s = t["m"].to_numpy(float), t["time_s"].to_numpy(float).copy()
    for i in range(1, len(s)):
        s[i] = min(s[i], s[i - 1] * m[i] / m[i - 1])
    return s


@pytest.mark.parametrize("gpu", ["H100-SXM", "B200", "A100-80GB-SXM"])
def test_a_layer_on_the_tables_grid_costs_what_the_table_measured(gpu):
    """Independent route: from the shipped rows, the layer's dense GEMMs at each measured token count are the
    sum of its shapes' measured times (split-bounded), non-decreasing; kvlab's dense term equals it there
    (the table's ratios are stored to 4 digits)."""
    from kvlab.specs import model_from_config

    m = model_from_config(ON_GRID, name="on-grid")
    c = measured(m, gpu)
    assert c.gemm_shapes == ((6144, 4096), (4096, 4096), (16384, 4096), (4096, 8192))
    r = E.rows()
    r = r[r["gpu"] == gpu]
    want = np.maximum.accumulate(sum(_split_bounded(r[(r["n"] == n) & (r["k"] == k)]) for n, k in c.gemm_shapes))
    tokens = np.sort(r["m"].unique()).astype(float)
    got = np.array([c.layer_linear_s(float(x)) for x in tokens])
    assert got == pytest.approx(want, rel=2e-4)
    # between the grid's counts: linear in tokens; beyond the last: the curve, continuous at the last
    mid = 0.5 * (tokens[-2] + tokens[-1])
    assert c.layer_linear_s(mid) == pytest.approx(0.5 * (got[-2] + got[-1]), rel=1e-9)
    assert c.layer_linear_s(tokens[-1] * (1 + 1e-9)) == pytest.approx(got[-1], rel=1e-6)


def test_the_tables_correct_the_curves_bias_on_wide_layers():
    """Llama-2-70B at TP4 on an H100 (weights up to 14,336 x 8,192): the fitted curve alone runs the
    widest GEMMs over the measured table at 1,024 tokens (the curve is fitted over 1k-16k weights
    and tilts toward the small ones); with the table the layer costs at least 3% less."""
    c = measured("Llama-2-70B", "H100-SXM", tp=4)
    curve_only = sum(c.gemm.time_s(1024.0, n, k) for n, k in c.gemm_shapes)
    r = E.rows()
    r = r[(r["gpu"] == "H100-SXM") & (r["m"] == 1024)]
    # the nearest measured shapes bracket the model's: 12,288 and 16,384 x 8,192 (the gate-up's 14,336 x 8,192)
    lo, hi = (float(r[(r["n"] == n) & (r["k"] == 8192)]["time_s"].iloc[0]) for n in (12288, 16384))
    gate_up = c.gemm.time_s(1024.0, 14336, 8192)
    assert gate_up > 1.05 * (lo + hi) / 2  # the curve's bias on the widest GEMM
    assert c.layer_linear_s(1024.0) < 0.97 * curve_only


def test_the_tables_bilinear_interpolation_is_scipys():
    """The hand-written interpolation (SciPy stays out of a cost model's build) against
    ``scipy.interpolate.RegularGridInterpolator`` at random points, edges held."""
    from scipy.interpolate import RegularGridInterpolator

    from kvlab.costmodel.measured import _bilinear

    rng = np.random.default_rng(3)
    xs, ys = np.log([1024.0, 2048, 4096, 8192]), np.log([1024.0, 3072, 16384])
    values = rng.uniform(0.5, 1.5, (5, len(xs), len(ys)))
    ref = RegularGridInterpolator((np.arange(5.0), xs, ys), values)
    for _ in range(50):
        x, y = rng.uniform(6.0, 10.5), rng.uniform(6.0, 10.5)  # some beyond the grid on either side
        cx, cy = np.clip(x, xs[0], xs[-1]), np.clip(y, ys[0], ys[-1])
        want = ref(np.column_stack([np.arange(5.0), np.full(5, cx), np.full(5, cy)]))
        assert _bilinear(xs, ys, values, x, y) == pytest.approx(want, rel=1e-12)
