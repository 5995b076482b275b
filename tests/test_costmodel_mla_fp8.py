"""The measured cost model on MLA (DeepSeek's latent attention) and on FP8 weights and KV: priced from
the measured curves (no roofline fallback), the GEMM shapes and latent bytes as vLLM runs them,
worked by hand from the config, and never under the physical floor."""
from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from kvlab import costmodel as cm
from kvlab.specs import gpu, model as spec, with_precision

from test_costmodel_measured import gemm_floor_s, zero_constants

measured_mod = importlib.import_module("kvlab.costmodel.measured")

# DeepSeek-V3's config.json (data/model_configs.yaml): hidden 7168, 128 heads, q_lora_rank 1536,
# kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, 256 routed experts of 2048, 8 per token,
# 1 shared expert, 61 layers. Per GPU at TP8: 16 heads, experts 2048 / 8 = 256 wide.
H, RQ, RKV, ROPE, NOPE, V, LAYERS = 7168, 1536, 512, 64, 128, 128, 61
HEADS_TP8, FF_TP8 = 16, 256
LATENT_BYTES = (RKV + ROPE) * 2  # one BF16 latent + rope key per token and layer, every GPU holds all of it


def test_mla_gets_the_measured_model_and_says_so():
    for source in (None, "measured"):
        c = cm.cost_model("DeepSeek-V3", "H100-SXM", tp=8, source=source)
        assert isinstance(c, cm.MeasuredCostModel)
        assert c.label.startswith("measured (H100") and "MLA: latent cache, absorbed decode" in c.label
    assert cm.unsupported("DeepSeek-V3", "H100-SXM", tp=8) is None


def test_mla_gemm_shapes_are_vllms_projections():
    """DeepSeek-V3 at TP8: the replicated fused q/kv down-projection, q_b_proj, kv_b_proj's key and
    value halves, o_proj, the router and the shared expert; one routed expert's gate+up and down."""
    c = cm.measured("DeepSeek-V3", "H100-SXM", tp=8)
    q = HEADS_TP8 * (NOPE + ROPE)
    assert c.gemm_shapes == ((RQ + RKV + ROPE, H), (q, RQ), (HEADS_TP8 * NOPE, RKV), (HEADS_TP8 * V, RKV),
                             (H, HEADS_TP8 * V), (256, H), (2 * FF_TP8, H), (H, FF_TP8))
    assert c.expert_shapes == ((2 * FF_TP8, H), (H, FF_TP8))
    # without a query rank (DeepSeek-V2-Lite's layout): q_proj from the hidden state, kv_a_proj_with_mqa
    direct = replace(spec("DeepSeek-V3"), name="no-q-rank", q_lora_rank=0)
    d = cm.measured(direct, "H100-SXM", tp=8)
    assert d.gemm_shapes[:2] == ((q, H), (RKV + ROPE, H)) and d.gemm_shapes[2:] == c.gemm_shapes[2:]


def test_mla_decode_attention_reads_the_latent_and_runs_the_absorbed_flops():
    """Attention fitted to 1 ns per KV kB and 10 fs per FLOP (on A100, its profiled GPU: no scaling):
    a decode batch reads 1,152 bytes per token and layer and does 16 x (2 x 576 + 2 x 512) FLOPs
    per pair; a prefill chunk's surplus pairs run decompressed, 16 x (2 x 192 + 2 x 128)."""
    consts = zero_constants(attention={"s_per_kv_byte": 1e-12, "s_per_flop": 1e-14})  # under A100's 2 TB/s, 312 TF/s
    c = measured_mod.build("DeepSeek-V3", "A100-80GB-SXM", tp=8, constants=consts, stack="s")
    assert c.attention_kv_bytes_per_token == LATENT_BYTES
    decode_flops, prefill_flops = HEADS_TP8 * (2 * (RKV + ROPE) + 2 * RKV), HEADS_TP8 * (2 * (NOPE + ROPE) + 2 * V)
    b, ctx = 32, 4096
    want = b * ctx * (LATENT_BYTES * 1e-12 + decode_flops * 1e-14)
    assert c.attention_layer_s(b, b * ctx, b * ctx, b) == pytest.approx(want, rel=1e-12)
    chunk, cached = 2048, 3000  # one prefill chunk: kv = cached + chunk, pairs = chunk x cached + chunk (chunk + 1) / 2
    pairs, kv = chunk * cached + chunk * (chunk + 1) // 2, cached + chunk
    want = kv * (LATENT_BYTES * 1e-12 + decode_flops * 1e-14) + (pairs - kv) * prefill_flops * 1e-14
    assert c.attention_layer_s(chunk, pairs, kv, 1) == pytest.approx(want, rel=1e-12)
    # FP8 KV: one byte a latent element
    f = measured_mod.build(with_precision("DeepSeek-V3", kv_cache_dtype="fp8"), "A100-80GB-SXM", tp=8,
                           constants=consts, stack="s")
    assert f.attention_kv_bytes_per_token == (RKV + ROPE) * 1


def test_mla_decode_is_above_its_floor_and_scales_with_the_latent_bytes():
    """DeepSeek-V3 TP8 on H100, 32 decodes at 4k: at least its latent KV and attention-block weight
    bytes over HBM. Per context token, MLA's decode costs what a 61-layer GQA model's does (Llama-3-70B
    shapes, 1 KV head per GPU at TP8: 512 bytes) times a weighted mean of the byte ratio (1152 / 512)
    and the FLOP ratio (absorbed 16 x 2176 against 8 x 4 x 128): exactly the byte ratio when only
    bytes are priced."""
    b, ctx = 32, 4096
    c = cm.measured("DeepSeek-V3", "H100-SXM", tp=8)
    attention_weights = (RQ + RKV + ROPE) * H + HEADS_TP8 * (NOPE + ROPE) * RQ + 2 * HEADS_TP8 * NOPE * RKV \
        + HEADS_TP8 * V * H
    floor = LAYERS * (2 * attention_weights + LATENT_BYTES * b * ctx) / 3.35e12
    got = c.iteration_s(b, b * ctx, b * ctx, b)
    assert got >= floor
    assert LATENT_BYTES * b * ctx / c.attention_layer_s(b, b * ctx, b * ctx, b) <= 3.35e12  # under HBM bandwidth
    gqa = replace(spec("Llama-3-70B"), name="GQA-61", num_layers=LAYERS)

    def slope(cost):  # seconds per added context token of the whole batch, 4k -> 8k
        return (cost.iteration_s(b, b * 2 * ctx, b * 2 * ctx, b) - cost.iteration_s(b, b * ctx, b * ctx, b)) / (b * ctx)

    byte_ratio, flop_ratio = LATENT_BYTES / 512, HEADS_TP8 * (2 * 576 + 2 * 512) / (8 * 4 * 128)
    ratio = slope(c) / slope(cm.measured(gqa, "H100-SXM", tp=8))
    assert byte_ratio < ratio < flop_ratio
    bytes_only = zero_constants(attention={"s_per_kv_byte": 1e-12})
    mla, dense = (measured_mod.build(m, "A100-80GB-SXM", tp=8, constants=bytes_only, stack="s") for m in
                  ("DeepSeek-V3", gqa))
    assert slope(mla) / slope(dense) == pytest.approx(byte_ratio, rel=1e-9)


def test_fp8_weights_read_one_byte_and_scale_the_bf16_curve_by_the_peak_ratio():
    bf16, fp8 = cm.measured("Llama-3-8B", "H100-SXM"), cm.measured(with_precision("Llama-3-8B", weights="fp8"),
                                                                   "H100-SXM")
    assert "FP8 weights: BF16 curve scaled by peak ratio (x2.00)" in fp8.label
    assert (fp8.gemm.weight_bytes, bf16.gemm.weight_bytes, fp8.gemm.dtype_bytes) == (1.0, 2.0, 2)
    assert fp8.gemm.flops_per_s == pytest.approx(bf16.gemm.flops_per_s * 1979 / 989, rel=1e-12)  # H100 dense peaks
    assert fp8.gemm.peak_flops_per_s == 1979e12 and fp8.head_gemm == bf16.head_gemm  # the LM head stays BF16
    # a GPU without FP8 tensor cores (A100): one byte a weight, BF16 throughput
    a100 = cm.measured(with_precision("Llama-3-8B", weights="fp8"), "A100-80GB-SXM")
    assert a100.gemm.flops_per_s == cm.measured("Llama-3-8B", "A100-80GB-SXM").gemm.flops_per_s
    assert a100.gemm.weight_bytes == 1.0 and "(x1.00)" in a100.label
    # FP8 KV: attention reads half the bytes
    kv8 = cm.measured(with_precision("Llama-3-8B", kv_cache_dtype="fp8"), "H100-SXM")
    assert kv8.attention_kv_bytes_per_token == bf16.attention_kv_bytes_per_token / 2 == 2 * 8 * 128


def test_fp8_decode_at_batch_one_is_weight_bound_and_faster_by_at_most_the_byte_ratio():
    """Llama-3-8B, one decode at 1k on H100: FP8 weights (7.0 G at 1 byte; the LM head 0.53 G
    elements at 2) take at least their bytes over HBM; BF16 takes longer by at least 90% of the 7.0 GB
    it reads more over HBM bandwidth (weight-bound) and at most those bytes at the GEMM curve's
    bandwidth plus the half of its GEMMs' compute term that FP8's doubled peak saves, and its ratio
    to FP8 is under that of the bytes read."""
    m8 = with_precision("Llama-3-8B", weights="fp8")
    kv = spec("Llama-3-8B").kv_bytes_per_token() * 1000
    embed = 128256 * 4096  # the embedding is not read by a decode; the LM head is
    read8 = m8.weight_bytes_per_gpu() - 2 * embed + kv
    read16 = spec("Llama-3-8B").weight_bytes_per_gpu() - 2 * embed + kv
    t8 = cm.measured(m8, "H100-SXM").iteration_s(1, 1000, 1000, 1)
    t16 = cm.measured("Llama-3-8B", "H100-SXM").iteration_s(1, 1000, 1000, 1)
    assert t8 >= read8 / 3.35e12
    curve = cm.measured("Llama-3-8B", "H100-SXM").gemm
    compute16 = 2 * (read16 - kv) / 2 * (1 + curve.half_tokens) / curve.flops_per_s  # 2 FLOPs per weight
    # the extra bytes go at the curve's bandwidth, at most the spec's 3.35 TB/s
    assert 0.9 * (read16 - read8) / 3.35e12 <= t16 - t8 <= (read16 - read8) / curve.bytes_per_s + compute16 / 2
    assert 1.0 < t16 / t8 <= read16 / read8


def test_fp8_gemm_floor_is_its_bytes_at_one_byte_a_weight_or_its_flops_at_the_fp8_peak():
    """An infinitely fast curve: each GEMM costs its floor, FP8 weight bytes over HBM at one token,
    FLOPs over H100's 1,979 TFLOP/s FP8 peak at 8,192."""
    consts = zero_constants(gemm={"flops_per_s": 1e30})
    c = measured_mod.build(with_precision("Llama-2-7B", weights="fp8"), "A100-80GB-SXM", constants=consts, stack="s")
    n, k = 11008, 4096
    assert c.gemm.time_s(1, n, k) == pytest.approx((2 * (n + k) + n * k) / 2039e9, rel=1e-12)
    assert c.gemm.time_s(8192, n, k) == pytest.approx(gemm_floor_s(8192, n, k), rel=1e-12)  # A100: no FP8 peak
    h100 = measured_mod.build(with_precision("Llama-2-7B", weights="fp8"), "H100-SXM",
                              constants={**consts, "gpus": {"H100-SXM": consts["gpus"]["A100-80GB-SXM"]}}, stack="s")
    assert h100.gemm.time_s(8192, n, k) == pytest.approx(2 * 8192 * n * k / gpu("H100-SXM").fp8_flops_per_s, rel=1e-12)
