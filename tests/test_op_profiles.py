"""Engines' operator profiles (LLMServingSim's bundles): reading, fitting, and the shipped families."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from kvlab.costmodel import fit, op_profiles as op, validate
from kvlab.costmodel.measured import measured
from kvlab.costmodel.measured import GemmCurve
from kvlab.specs import model as spec

GPU = "RTXPRO6000"
CURVE = GemmCurve(launch_s=4e-6, bytes_per_s=1.5e12, flops_per_s=4e14, half_tokens=16.0, sharpness=2.0)
POINTWISE = {"launch_s": 3e-6, "per_hidden_s": 2e-12, "per_sharded_s": 5e-12}  # per op call
ATTENTION = {"launch_s": 9e-6, "s_per_seq": 4e-7, "s_per_token": 2e-8, "s_per_kv_byte": 7e-13, "s_per_flop": 3e-15,
             "s_per_mixed_decode_kv_byte": 1e-12}


def _shapes(tp: int) -> dict[str, tuple[int, int]]:
    """Llama-3.1-8B's per-GPU GEMMs at ``tp``, by hand (hidden 4096, 32 x 128 query and 8 x 128 KV
    widths, MLP 14,336, vocabulary 128,256)."""
    return {"qkv_proj": ((4096 + 2 * 1024) // tp, 4096), "o_proj": (4096, 4096 // tp),
            "gate_up_proj": (2 * 14336 // tp, 4096), "down_proj": (4096, 14336 // tp), "lm_head": (128256 // tp, 4096)}


def _attention_s(pc, kp, nd, kd, tp):
    """The attention time by hand: KV bytes 2 x 8/tp heads x 128 x 2 per token, FLOPs 4 x 32/tp x
    128 per pair; decodes attend their context plus themselves, and pay more per KV byte beside a
    prefill chunk."""
    kv_tokens = nd * (kd + 1) + (kp + pc if pc else 0)
    pairs = nd * (kd + 1) + pc * kp + pc * (pc + 1) // 2
    a = ATTENTION
    return (a["launch_s"] + a["s_per_seq"] * (nd + (pc > 0)) + a["s_per_token"] * (pc + nd)
            + a["s_per_kv_byte"] * 4096 / tp * kv_tokens + a["s_per_flop"] * 16384 / tp * pairs
            + (a["s_per_mixed_decode_kv_byte"] * 4096 / tp * nd * (kd + 1) if pc else 0.0))


def write_bundle(root, tps=(1, 2), gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition", dense_time=None):
    """A bundle of Llama-3.1-8B whose every time comes from the known terms above."""
    d = root / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16"
    meta = {"vllm_version": "0.19.0", "gpu": gpu, "model": "meta-llama/Llama-3.1-8B", "tp_degrees": list(tps)}
    for tp in tps:
        (d / f"tp{tp}").mkdir(parents=True)
        rows = []
        for t in op.TOKENS:
            for name, (n, k) in _shapes(tp).items():
                if name != "lm_head":
                    rows.append((name, t, float(CURVE.time_s(t, n, k)) * 1e6))
            q, kv, ff = 4096 / tp, 1024 / tp, 14336 / tp
            widths = {"layernorm": 0, "rotary_emb": q + kv, "act_fn": ff}
            for name, w in widths.items():
                per = POINTWISE["per_hidden_s"] * 4096 if name == "layernorm" else POINTWISE["per_sharded_s"] * w
                rows.append((name, t, (POINTWISE["launch_s"] + per * t) * 1e6))
        dense = pd.DataFrame(rows, columns=["layer", "tokens", "time_us"])
        if dense_time is not None:
            dense.loc[3, "time_us"] = dense_time
        dense.to_csv(d / f"tp{tp}" / "dense.csv", index=False)
        n, k = _shapes(tp)["lm_head"]
        pd.DataFrame([("lm_head", s, float(CURVE.time_s(s, n, k)) * 1e6) for s in op.TOKENS] +
                     [("sampler", s, 20.0) for s in op.TOKENS],
                     columns=["layer", "sequences", "time_us"]).to_csv(d / f"tp{tp}" / "per_sequence.csv", index=False)
        grid = [(pc, kp, nd, kd) for pc in (0, 16, 128, 512, 2048) for kp in (0, 1024, 4096) for nd in (0, 1, 16, 256)
                for kd in (0, 256, 4096) if (pc or nd) and (pc or not kp) and (nd or not kd) and (not nd or kd)]
        pd.DataFrame([(*g, _attention_s(*g, tp) * 1e6) for g in grid],
                     columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"]).to_csv(
            d / f"tp{tp}" / "attention.csv", index=False)
    (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    return d


def test_a_bundle_is_read_and_its_terms_fitted_back(tmp_path):
    """Times made from known terms: the fits give those terms back (GEMM times, pointwise and
    attention coefficients), through the same reduction the shipped tables went through."""
    bundle = write_bundle(tmp_path)
    assert op.find_bundles([tmp_path]) == [bundle]
    layers, att, experts = op.read_bundle(bundle)
    assert experts.empty  # a dense model has no expert block
    layers, att = op.reduce(layers, att)
    assert set(layers["gpu"]) == {GPU} and set(layers["model"]) == {"Llama-3.1-8B"} and set(layers["tp"]) == {1, 2}
    assert "sampler" in set(layers["op"])
    fam = fit.profile_families(layers, att)["rtxpro6000"]
    got = GemmCurve(**fam["gemm"])
    rows = fit.profile_gemm_rows(layers)
    assert len(rows) == 2 * 5 * len(op.TOKENS)
    ratio = got.time_s(rows["m"].to_numpy(float), rows["n"].to_numpy(float), rows["k"].to_numpy(float)) / rows["time_s"]
    assert np.abs(np.log(ratio)).max() < 0.01
    # pointwise per layer: 2 x layernorm (hidden) + rotary (q + kv) + activation (ff): 4 launches
    pw = fam["pointwise"]
    assert pw["launch_s"] == pytest.approx(4 * POINTWISE["launch_s"], rel=1e-6)
    assert pw["s_per_element"] == pytest.approx(2 * POINTWISE["per_hidden_s"], rel=1e-6)
    assert pw["s_per_sharded_element"] == pytest.approx(POINTWISE["per_sharded_s"], rel=1e-6)
    for key, val in ATTENTION.items():
        assert fam["attention"][key] == pytest.approx(val, rel=1e-6), key
    assert fam["attention"]["gpu"] == GPU and "vLLM 0.19.0" in fam["label"]


@pytest.mark.parametrize("edit, words", [
    (lambda d: (d / "meta.yaml").write_text(yaml.safe_dump({"gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                                            "model": "meta-llama/Llama-3.1-8B"})), "tp_degrees"),
    (lambda d: (d / "meta.yaml").write_text(yaml.safe_dump({"gpu": "NVIDIA Imaginary 9000", "tp_degrees": [1],
                                                            "model": "meta-llama/Llama-3.1-8B"})), "Imaginary"),
    (lambda d: (d / "tp1" / "attention.csv").unlink(), "attention.csv"),
])
def test_a_bad_bundle_is_named(tmp_path, edit, words):
    bundle = write_bundle(tmp_path, tps=(1,))
    edit(bundle)
    with pytest.raises(ValueError, match=words) as err:
        op.read_bundle(bundle)
    assert str(bundle) in str(err.value)


def test_a_non_positive_time_names_its_row(tmp_path):
    bundle = write_bundle(tmp_path, tps=(1,), dense_time=-1.0)
    with pytest.raises(ValueError, match=r"dense.csv, row 5: time_us must be a positive number"):
        op.read_bundle(bundle)
    with pytest.raises(ValueError, match="no profile bundle"):
        op.find_bundles([tmp_path / "tp1"])


def _layer_sums(layers: pd.DataFrame) -> pd.DataFrame:
    gemm = layers[layers["op"].isin(op.GEMM_OPS)].pivot_table(index=["model", "tp", "tokens"], columns="op",
                                                              values="time_s")
    return gemm.dropna().sum(axis=1).rename("measured_s").reset_index()


@pytest.mark.parametrize("gpu", ["RTX4090", "RTXPRO6000"])
def test_a_profiled_gpu_is_priced_from_its_own_profiles(gpu):
    """The shipped model of each profiled GPU against its published operator times (LLMServingSim
    5daddb2): a layer's four GEMMs within 20% everywhere (median 6%), decode attention within 30%
    (median 15%), and the label names the profiles, not an extrapolation."""
    layers = op.layers()
    mine = _layer_sums(layers[layers["gpu"] == gpu])
    assert len(mine) >= 50
    err = []
    for (model, tp), g in mine.groupby(["model", "tp"]):
        c = measured(model, gpu, tp=int(tp))
        assert "operator profiles" in c.label and "extrapolated" not in c.label
        err.append(np.asarray(c.layer_linear_s(g["tokens"].to_numpy(float))) / g["measured_s"].to_numpy() - 1)
    err = np.abs(np.concatenate(err))
    assert np.median(err) < 0.06 and err.max() < 0.20
    att = op.attention()
    dec = att[(att["gpu"] == gpu) & (att["prefill_chunk"] == 0) & (att["n_decode"] >= 16)]
    rel = []
    for (model, tp), g in dec.groupby(["model", "tp"]):
        c = measured(model, gpu, tp=int(tp))
        nd, kd = g["n_decode"].to_numpy(float), g["kv_decode"].to_numpy(float)
        rel.append(np.asarray(c.attention_layer_s(nd, nd * (kd + 1), nd * (kd + 1), nd)) / g["time_s"].to_numpy() - 1)
    rel = np.abs(np.concatenate(rel))
    assert np.median(rel) < 0.15 and rel.max() < 0.30


def test_a_left_out_model_on_a_profiled_gpu():
    """The RTX PRO 6000's curve fitted without one model predicts that model's layers within 12% MAPE."""
    layers = op.layers()
    rows = fit.profile_gemm_rows(layers[layers["gpu"] == GPU])
    for model in ("Llama-3.1-8B", "Qwen3-32B"):
        curve = fit.fit_gemm(rows[rows["model"] != model])
        errors = validate._layer_errors(curve, rows[rows["model"] == model])
        assert len(errors) >= 100 and np.mean(np.abs(errors)) < 0.12, model


def test_shapes_follow_the_model_spec():
    """The profiled GEMMs' shapes as vLLM fuses them: Qwen3-32B's query width (64 x 128) is not its hidden size."""
    assert fit._layer_shapes("Llama-3.1-8B", 2) == {k: tuple(map(float, v)) for k, v in _shapes(2).items()}
    q3 = fit._layer_shapes("Qwen3-32B", 2)
    assert q3["qkv_proj"] == ((64 * 128 + 2 * 8 * 128) / 2, 5120) and q3["o_proj"] == (5120, 64 * 128 / 2)
    assert spec("Qwen3-32B").hidden_size == 5120


@pytest.mark.parametrize("pc, kp, nd, kd", [(512, 0, 128, 2048), (16, 4096, 1, 256), (2048, 1024, 3, 7)])
def test_the_decodes_beside_a_chunk_are_found_from_the_aggregates(pc, kp, nd, kd):
    """One chunk of pc tokens after kp cached plus nd decodes of kd context: the aggregates the
    simulator passes give back the decodes' nd (kd + 1) context tokens, in both forms."""
    from kvlab.costmodel import compiled
    from kvlab.costmodel.measured import mixed_decode_kv_tokens
    t, s = pc + nd, nd + 1
    pairs, kv = nd * (kd + 1) + pc * kp + pc * (pc + 1) // 2, nd * (kd + 1) + kp + pc
    assert mixed_decode_kv_tokens(t, pairs, kv, s) == nd * (kd + 1)
    assert compiled._mixed_decode_kv.py_func(float(t), float(pairs), float(kv), float(s)) == nd * (kd + 1)
    got = mixed_decode_kv_tokens(np.array([t, nd, pc]), np.array([pairs, nd * (kd + 1), pc * (pc + 1) // 2]),
                                 np.array([kv, nd * (kd + 1), pc]), np.array([s, nd, 1]))
    assert got.tolist() == [nd * (kd + 1), 0, 0]  # decode-only and prefill-only batches: none


def test_a_batch_of_whole_prompts_has_no_decodes():
    """Three prompts of 100, 200 and 300 tokens prefilled whole (vLLM V0's prefill-first batches): nothing
    was cached (KV tokens = tokens), so no sequence decodes, in both forms; a batch that read anything
    cached still finds its decodes (one 64-token chunk after nothing plus 2 decodes of 10 context: 22)."""
    from kvlab.costmodel import compiled
    from kvlab.costmodel.measured import mixed_decode_kv_tokens
    c = np.array([100, 200, 300])
    t, pairs, kv, s = float(c.sum()), float((c * (c + 1) // 2).sum()), float(c.sum()), 3.0
    assert mixed_decode_kv_tokens(t, pairs, kv, s) == 0.0
    assert compiled._mixed_decode_kv.py_func(t, pairs, kv, s) == 0.0
    mixed = (66.0, 2 * 11 + 64 * 65 / 2, 2 * 11 + 64.0, 3.0)
    got = mixed_decode_kv_tokens(np.array([t, mixed[0]]), np.array([pairs, mixed[1]]), np.array([kv, mixed[2]]),
                                 np.array([s, mixed[3]]))
    assert got.tolist() == [0.0, 22.0] and mixed_decode_kv_tokens(*mixed) == 22.0


def test_mixed_batches_cost_more_on_a_profiled_gpu():
    """In LLMServingSim's RTX PRO 6000 profile a decode beside a prefill chunk reads its context
    slower than in a decode-only batch; the fitted model prices that (Qwen3-32B TP2, 64 decodes of
    16k context plus a 512-token chunk: 4.9 ms measured against 1.5 ms for the decodes alone)."""
    att = op.attention()
    q = att[(att["gpu"] == GPU) & (att["model"] == "Qwen3-32B") & (att["tp"] == 2) & (att["n_decode"] == 64)
            & (att["kv_decode"] == 16384) & (att["kv_prefill"] == 0)].set_index("prefill_chunk")["time_s"]
    assert q[512] > 3 * q[0]
    c = measured("Qwen3-32B", GPU, tp=2)
    alone = c.attention_layer_s(64, 64 * 16385, 64 * 16385, 64)
    mixed = c.attention_layer_s(576, 64 * 16385 + 512 * 513 // 2, 64 * 16385 + 512, 65)
    assert mixed > 2 * alone and abs(mixed / q[512] - 1) < 0.35 and abs(alone / q[0] - 1) < 0.35


def test_experts_are_priced_from_the_gemm_curve_at_tokens_per_expert():
    """LLMServingSim's measured expert block of Qwen3-30B-A3B on the RTX PRO 6000 (1-2,048 tokens
    spread over 8-128 of its 128 experts, 8 per token), against kvlab's pricing on the GPU's GEMM
    curve, which was fitted without any expert: each of the two expert GEMMs one launch plus every
    touched expert at tokens x 8 / touched tokens (module note of kvlab.costmodel.measured), plus the
    router GEMM (128 x 2,048) on every token; within 10% median and 25% worst."""
    rows = op.moe()
    assert len(rows) >= 40 and set(rows["model"]) == {"Qwen3-30B-A3B"}
    c = measured("Qwen3-30B-A3B", GPU)
    assert c.expert_shapes == ((2 * 768.0, 2048), (2048, 768.0)) and (128.0, 2048) in c.gemm_shapes
    g = c.gemm
    rel = []
    for t, touched, want in rows[["tokens", "activated_experts", "time_s"]].itertuples(index=False):
        per = t * 8 / touched
        got = sum(g.launch_s + touched * g.time_s(per, n, k, 0.0) for n, k in c.expert_shapes) + g.time_s(t, 128, 2048)
        rel.append(got / want - 1)
    rel = np.abs(rel)
    assert np.median(rel) < 0.10 and rel.max() < 0.25
