"""kvlab.measure: the pure parts on the CPU, the CuPy measurements on a GPU (marked ``gpu``)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvlab import measure
from kvlab.calibrate import fit_host_link
from kvlab.specs import ModelSpec

TINY = ModelSpec(name="tiny", num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                 intermediate_size=96, gated_mlp=True, num_params=200_000, vocab_size=256, max_context_tokens=1024)


def _reference_attention(q, k, v):
    """Dense causal attention, one head at a time, straight from the definition."""
    kv_heads, group, s, _ = q.shape
    out = np.empty_like(q)
    for h in range(kv_heads):
        for j in range(group):
            scores = q[h, j] @ k[h].T
            scores[np.triu_indices(s, 1)] = -np.inf
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[h, j] = (p / p.sum(axis=1, keepdims=True)) @ v[h]
    return out


@pytest.mark.parametrize("s, tile", [(37, 8), (64, 64), (50, 1000), (96, 32)])
def test_tiled_causal_attention_matches_the_definition(s, tile):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, s, 8))
    k, v = rng.standard_normal((2, s, 8)), rng.standard_normal((2, s, 8))
    got = measure.causal_attention(q, k, v, tile_tokens=tile)
    np.testing.assert_allclose(got, _reference_attention(q, k, v), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gated", [True, False])
def test_layer_shapes_on_numpy(gated):
    """The layer code is written against the array module: run it on NumPy to check its shapes."""
    m = ModelSpec(**{**TINY.__dict__, "gated_mlp": gated})
    sh = measure._Shapes.of(m, 1)
    rng = np.random.default_rng(0)
    w = {"qkv": measure._random(np, (64, (4 + 2 * 2) * 16), np.float32, rng),
         "o": measure._random(np, (64, 64), np.float32, rng),
         "mlp_in": measure._random(np, (64, sh.mlp_cols), np.float32, rng),
         "mlp_out": measure._random(np, (96, 64), np.float32, rng)}
    prefill = measure._layer(np, w, measure._random(np, (40, 64), np.float32, rng), sh, None, 16)
    assert prefill.shape == (40, 64) and np.isfinite(prefill).all()
    kv = (measure._random(np, (3, 2, 16, 50), np.float32, rng), measure._random(np, (3, 2, 50, 16), np.float32, rng))
    decode = measure._layer(np, w, measure._random(np, (3, 64), np.float32, rng), sh, kv, 16)
    assert decode.shape == (3, 64) and np.isfinite(decode).all()


def test_copy_sizes_by_hand():
    # Llama-3-8B: 8 KV heads x 128 dims x 2 bytes x 16 tokens per layer page; 32 layers, K and V.
    assert measure.page_copy_bytes("Llama-3-8B", 16, "per_layer_page") == 16 * 8 * 128 * 2
    assert measure.page_copy_bytes("Llama-3-8B", 16, "per_page") == 16 * 8 * 128 * 2 * 64
    assert measure.page_copy_bytes("Llama-3-8B", 16, "per_layer_page", tp=2) == 16 * 4 * 128 * 2


def _tables():
    seq = np.array([256, 1024, 4096, 8192])
    profile = pd.DataFrame({"phase": "prefill", "tokens": seq, "context": 0, "batch": 1,
                            "seconds": 0.005 + 1e-5 * seq})
    size = measure.page_copy_bytes("Llama-3-8B", 16, "per_layer_page")
    copies = pd.DataFrame({"direction": ["d2h", "h2d", "d2h", "h2d"], "copy_mode": ["per_layer_page"] * 2 + ["batched"] * 2,
                           "block_size": [16, 16, 0, 0], "copy_bytes": [size, size, 1 << 28, 1 << 28],
                           "num_copies": [100, 100, 1, 1], "seconds": [100 * 3e-6, 100 * 2e-6, 0.006, 0.0055]})
    return seq, profile, copies


def test_measured_crossover_by_hand():
    seq, profile, copies = _tables()
    got = measure.measured_crossover(profile, copies, "Llama-3-8B", block_size=16, copy_mode="per_layer_page")
    swap = np.ceil(seq / 16) * 64 * (3e-6 + 2e-6)          # pages x 2 x 32 layers x (d2h + h2d)
    np.testing.assert_allclose(got.curves["swap_s"], swap)
    np.testing.assert_allclose(got.curves["recompute_s"], 0.005 + 1e-5 * seq)
    # Between 256 and 1024 tokens both curves are straight lines (whole pages): they meet where
    # 0.005 + 1e-5 s = 2e-5 s, at s = 500.
    assert got.crossover_tokens == pytest.approx(500) and got.num_crossings == 1
    # Swap (20 us/token) starts below recompute (5 ms + 10 us/token) and passes it near 500 tokens.
    assert got.curves["recompute_over_swap"].iloc[0] > 1 > got.curves["recompute_over_swap"].iloc[-1]


def test_measured_crossover_batched_uses_the_link_fit():
    seq, profile, copies = _tables()
    got = measure.measured_crossover(profile, copies, "Llama-3-8B", block_size=16, copy_mode="batched")
    link = fit_host_link(copies)
    nbytes = np.ceil(seq / 16) * 16 * 131072
    np.testing.assert_allclose(got.curves["swap_s"], 2 * (link.copy_latency_s + nbytes / link.link_bytes_per_s))


def test_measured_crossover_bad_tables():
    seq, profile, copies = _tables()
    with pytest.raises(ValueError, match="no d2h and h2d rows"):
        measure.measured_crossover(profile, copies, "Llama-3-8B", block_size=32, copy_mode="per_layer_page")
    with pytest.raises(ValueError, match="two or more lengths"):
        measure.measured_crossover(profile.iloc[:1], copies, "Llama-3-8B")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) 'context'"):
        measure.measured_crossover(profile.drop(columns=["context"]), copies, "Llama-3-8B")


# ---- on a GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cupy_attention_matches_numpy():
    import cupy as cp
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 2, 300, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 300, 16)).astype(np.float32) for _ in range(2))
    got = measure.causal_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), tile_tokens=128).get()
    np.testing.assert_allclose(got, _reference_attention(q.astype(np.float64), k.astype(np.float64),
                                                         v.astype(np.float64)), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_measure_copies_fit_a_plausible_link():
    copies = measure.measure_copies("Llama-3-8B", block_sizes=(16,), num_copies=64, batched_bytes=(1 << 24, 1 << 27))
    assert set(copies["direction"]) == {"d2h", "h2d"} and (copies["seconds"] > 0).all()
    link = fit_host_link(copies)
    assert 1e9 < link.link_bytes_per_s < 1e12 and link.copy_latency_s < 1e-3


@pytest.mark.gpu
def test_measure_forward_tiny_model():
    prof = measure.measure_forward(TINY, seq_tokens=(128, 512), decode_batches=(1, 4), decode_contexts=(256,),
                                   repeats=2)
    assert prof["phase"].tolist() == ["prefill", "prefill", "decode", "decode"]
    np.testing.assert_allclose(prof["seconds"], 2 * prof["layer_s"] + prof["lm_head_s"])
    assert (prof["seconds"] > 0).all()


@pytest.mark.gpu
def test_quick_run_writes_its_tables(tmp_path):
    summary = measure.run(("Llama-3-8B",), out_dir=tmp_path, quick=True)
    assert {p.name for p in tmp_path.iterdir()} >= {"profile.csv", "copies.csv", "summary.json"}
    assert json.loads((tmp_path / "summary.json").read_text())["models"].keys() == summary["models"].keys()
    entry = summary["models"]["Llama-3-8B"]
    assert 0 < entry["roofline_fit"]["compute_efficiency"] <= 1
