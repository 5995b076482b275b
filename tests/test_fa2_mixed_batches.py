"""vLLM's FlashAttention 2 path runs a mixed prefill/decode batch in one varlen call: the decodes' KV
read costs what the RTX cards measured, carried to every GPU vLLM runs FA2 on."""
from __future__ import annotations

import copy

import pytest

from kvlab.costmodel.measured import build, constants, measured, reference_gpu, runs_fa2, vllm_attention_backend
from kvlab.specs import gpu, gpu_from_file, model


@pytest.mark.parametrize("name, backend", [("A100-80GB-SXM", "FA2"), ("A40", "FA2"), ("L40S", "FA2"), ("L4", "FA2"),
                                           ("RTX4090", "FA2"), ("RTXPRO6000", "FA2"), ("H100-SXM", "FA3"),
                                           ("H200", "FA3"), ("B200", "FlashInfer"), ("MI300X", "")])
def test_vllms_attention_backend_by_compute_capability(name, backend):
    """vLLM 0.15.1: FA3 on 9.x, FlashInfer first on 10.x, FA2 on the other CUDA GPUs (8.x, 12.x); not a
    CUDA GPU (MI300X, capability 0): none. The engine tables' kernel is picked by the same rule."""
    assert vllm_attention_backend(gpu(name)) == backend and runs_fa2(gpu(name)) is (backend == "FA2")


def test_the_ratio_is_the_rtx_profiles_by_hand():
    """The carried ratio is the mean over the two RTX families of their extra seconds per mixed-batch decode
    KV byte over their seconds per decode KV byte."""
    c = constants()
    ratios = [f["attention"]["s_per_mixed_decode_kv_byte"] / f["attention"]["s_per_kv_byte"]
              for f in (c["families"]["rtx4090"], c["families"]["rtxpro6000"])]
    assert c["fa2_mixed_decode"]["ratio"] == pytest.approx(sum(ratios) / 2, rel=1e-4)
    assert 1.0 < c["fa2_mixed_decode"]["ratio"] < 2.0


def test_fa2_gpus_carry_it_and_the_others_do_not():
    """A100 and L40S (FA2, no mixed rows of their own) carry ratio x their decode KV term and say so; the
    H100, H200 (FA3) and B200 (FlashInfer) do not; the RTX cards keep their own measured term."""
    ratio = constants()["fa2_mixed_decode"]["ratio"]
    for name in ("A100-80GB-SXM", "L40S"):
        c = measured("Llama-3-8B", name)
        assert c.attention_s_per_mixed_decode_kv_token == pytest.approx(ratio * c.attention_s_per_kv_token, rel=1e-9)
        assert "FA2 mixed batches" in c.label
    for name in ("H100-SXM", "H200", "B200"):
        c = measured("Llama-3-8B", name)
        assert c.attention_s_per_mixed_decode_kv_token == 0.0 and "FA2" not in c.label
    rtx = constants()["families"]["rtx4090"]["attention"]
    c = measured("Llama-3-8B", "RTX4090")
    own = rtx["s_per_mixed_decode_kv_byte"] / rtx["s_per_kv_byte"]
    assert c.attention_s_per_mixed_decode_kv_token == pytest.approx(own * c.attention_s_per_kv_token, rel=1e-9)
    assert "FA2" not in c.label


def test_a_mixed_batch_on_the_a100_by_hand():
    """One 512-token chunk after nothing cached plus 31 decodes over 2,000 tokens each: the carried term
    adds ratio x (seconds per decode KV token) x the decodes' 31 x 2,001 tokens to one layer's attention,
    and nothing to a decode-only batch."""
    with_it = measured("Llama-3-8B", "A100-80GB-SXM")
    c = copy.deepcopy(constants())
    del c["fa2_mixed_decode"]
    without = build(model("Llama-3-8B"), "A100-80GB-SXM", constants=c)
    d, ctx, chunk = 31.0, 2000.0, 512.0
    mixed = (chunk + d, d * (ctx + 1) + chunk * (chunk + 1) / 2, d * (ctx + 1) + chunk, d + 1)
    extra = with_it.attention_layer_s(*mixed) - without.attention_layer_s(*mixed)
    assert extra == pytest.approx(with_it.attention_s_per_mixed_decode_kv_token * d * (ctx + 1), rel=1e-9)
    decode = (d, d * (ctx + 1), d * (ctx + 1), d)
    assert with_it.attention_layer_s(*decode) == without.attention_layer_s(*decode)


def test_a_gpu_spec_file_may_state_its_compute_capability(tmp_path):
    """``compute_capability`` is optional in a GPU spec file (0 when absent) and must be a positive number;
    a GPU that states none runs the kernels of the measured GPU it is extrapolated from (this card's
    nearest is the A40: FA2), one that states 9.0 runs FA3 (no carried penalty)."""
    base = ("name: my-gpu\nmemory_mib: 49152\nhbm_bandwidth_gbps: 864\nbf16_dense_tflops: 181\n"
            "host_link_gbps: 31.5\ninterconnect_gbps: 31.5\ninternode_gbps: 12.5\n")
    f = tmp_path / "g.yaml"
    f.write_text(base)
    assert gpu_from_file(f).compute_capability == 0.0
    f.write_text(base + "compute_capability: 8.9\n")
    assert gpu_from_file(f).compute_capability == 8.9 and runs_fa2(gpu_from_file(f))
    assert "FA2 mixed batches" in measured("Llama-3-8B", gpu_from_file(f)).label
    f.write_text(base + "compute_capability: 9.0\n")
    assert measured("Llama-3-8B", gpu_from_file(f)).attention_s_per_mixed_decode_kv_token == 0.0
    f.write_text(base)
    assert reference_gpu(gpu_from_file(f)) == "A40" and "FA2 mixed batches" in measured("Llama-3-8B", gpu_from_file(f)).label
    f.write_text(base + "compute_capability: -1\n")
    with pytest.raises(ValueError, match="compute_capability"):
        gpu_from_file(f)


def test_a_server_with_split_attention_pays_no_mixed_batch_term():
    """TensorRT-LLM runs a mixed step's context and generation attention as separate kernels: with
    ``split_attention`` the A100 (carried term) and the RTX PRO 6000 (its own measured term) price a mixed batch's
    decodes as in a decode-only batch, everything else equal, and say so; TensorRT-LLM's recommend configuration
    asks for it, vLLM's does not."""
    from dataclasses import replace

    from kvlab.costmodel import cost_model
    from kvlab.recommend.core import serving_config
    from kvlab.recommend.systems import settings

    for name in ("A100-80GB-SXM", "RTXPRO6000"):
        vllm, split = cost_model("Llama-3-8B", name), cost_model("Llama-3-8B", name, split_attention=True)
        assert vllm.attention_s_per_mixed_decode_kv_token > 0 == split.attention_s_per_mixed_decode_kv_token
        assert replace(split, label=vllm.label, attention_s_per_mixed_decode_kv_token=vllm.attention_s_per_mixed_decode_kv_token) == vllm
        assert "attention split by phase" in split.label and "attention split" not in vllm.label
        mixed = (64 + 448, 64 * 1024 + 448 * 449 / 2, 64 * 1024 + 448, 65)
        assert split.iteration_s(*mixed) < vllm.iteration_s(*mixed)
    kw = dict(model="Llama-3-8B", gpu="A100-80GB-SXM", tp=1, block_size=16, max_new_tokens=256)
    for system, split in (("tensorrt-llm", True), ("vllm", False), ("sglang", False)):
        s = settings(system, model="Llama-3-8B", gpu="A100-80GB-SXM")[0]
        config = serving_config(s, **kw)
        assert config.split_attention is split and ("attention split by phase" in config.cost_label()) is split
