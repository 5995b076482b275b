"""model_from_config on hand-written configs: parameter counts and KV bytes worked by hand."""
import json

import pandas as pd
import pytest

from kvlab import pool_pages, specs
from kvlab import costmodel as cm
from kvlab.costmodel import roofline
from kvlab.sim import simulate

DENSE = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_hidden_layers": 3, "intermediate_size": 160, "vocab_size": 1000, "max_position_embeddings": 512,
         "tie_word_embeddings": False}
MOE = {"model_type": "mixtral", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
       "num_hidden_layers": 2, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
       "vocab_size": 100, "max_position_embeddings": 256, "tie_word_embeddings": False}
MLA = {"model_type": "deepseek_v3", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
       "num_hidden_layers": 3, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 6, "qk_rope_head_dim": 2,
       "v_head_dim": 4, "intermediate_size": 48, "moe_intermediate_size": 8, "n_routed_experts": 4,
       "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
       "topk_method": "noaux_tc", "vocab_size": 50, "max_position_embeddings": 128, "tie_word_embeddings": False}


def test_dense_gqa_by_hand():
    m = specs.model_from_config(DENSE, name="dense")
    # head_dim = 64 / 8 = 8. Per layer: q 64*64 = 4096, k and v 2 * 64 * (2*8) = 2048, o 64*64 = 4096
    # -> attention 10,240; MLP 3 * 64 * 160 = 30,720; two RMSNorms 2 * 64 = 128 -> 41,088.
    # Three layers 123,264; embedding + untied head 2 * 1000 * 64 = 128,000; final norm 64.
    assert m.num_params == 123_264 + 128_000 + 64 == 251_328
    assert m.num_active_params == m.num_params
    # KV: 2 (K, V) x 3 layers x 2 KV heads x 8 dims x 2 bytes = 192 bytes/token.
    assert m.kv_bytes_per_token() == 192
    assert m.kv_bytes_per_token(tp=2) == 96  # one KV head per GPU
    assert (m.head_dim, m.max_context_tokens, m.is_moe, m.is_mla) == (8, 512, False, False)


def test_tied_embeddings_count_once():
    tied = specs.model_from_config({**DENSE, "tie_word_embeddings": True})
    assert specs.model_from_config(DENSE).num_params - tied.num_params == 1000 * 64


def test_moe_by_hand():
    m = specs.model_from_config(MOE, name="moe")
    # head_dim 32 / 4 = 8. Attention: q 32*32 = 1024, k+v 2 * 32 * 16 = 1024, o 1024 -> 3,072.
    # One expert 3 * 32 * 64 = 6,144; four experts 24,576; router 32 * 4 = 128; norms 64.
    # Per layer 3,072 + 24,576 + 128 + 64 = 27,840; two layers 55,680; embeddings 2 * 100 * 32 = 6,400;
    # final norm 32 -> 62,112.
    assert m.num_params == 62_112
    # Active: two experts per token: 3,072 + 2 * 6,144 + 128 + 64 = 15,552 per layer -> 31,104 + 6,432.
    assert m.num_active_params == 37_536
    assert (m.num_experts, m.experts_per_token) == (4, 2)
    assert m.kv_bytes_per_token() == 2 * 2 * 2 * 8 * 2 == 128
    # Weights use the total, FLOPs the active count.
    assert m.weight_bytes_per_gpu() == 62_112 * 2
    assert roofline(m, "H100-SXM").linear_flops_per_token == 2 * 37_536


def test_mla_moe_by_hand():
    m = specs.model_from_config(MLA, name="mla")
    # Attention per layer: q down 32 * 16 = 512, its norm 16, q up 16 * 4 * (6 + 2) = 512,
    # kv down (latent + rope key) 32 * (8 + 2) = 320, its norm 8, kv up 8 * 4 * (6 + 4) = 320,
    # o 4 * 4 * 32 = 512 -> 2,200; norms 2 * 32 = 64.
    # Layer 0 dense MLP 3 * 32 * 48 = 4,608. Layers 1-2: one expert 3 * 32 * 8 = 768;
    # 4 routed + 1 shared = 3,840, router 32 * 4 = 128 + 4 correction biases -> 3,972.
    # Layers: 3 * (2,200 + 64) = 6,792 + 4,608 + 2 * 3,972 = 19,344; embeddings 2 * 50 * 32 = 3,200;
    # final norm 32 -> 22,576.
    assert m.num_params == 22_576
    # Active: 2 routed + 1 shared = 2,304 + 132 = 2,436 per MoE layer -> 6,792 + 4,608 + 4,872 + 3,232.
    assert m.num_active_params == 19_504
    # KV: one latent (8) + rope key (2) per layer, 3 layers, 2 bytes = 60 bytes/token, on every TP GPU.
    assert m.kv_bytes_per_token() == 60
    assert m.kv_bytes_per_token(tp=4) == 60
    assert m.kv_bytes_per_token(pp=3) == 20
    # Attention FLOPs per pair and layer: 2 x 4 heads x (qk 8 + v 4) = 96.
    assert m.attention_flops_per_pair_per_layer == 96


def test_deepseek_v2_without_a_query_rank_by_hand():
    """DeepSeek-V2-Lite's layout (``q_lora_rank`` null, no ``noaux_tc`` router bias) on the toy MLA config."""
    v2 = {**{k: v for k, v in MLA.items() if k != "topk_method"}, "model_type": "deepseek_v2", "q_lora_rank": None}
    m = specs.model_from_config(v2, name="v2")
    # Attention: q 32 * 4 * (6 + 2) = 1,024 (no down-projection or its norm), kv down 320, its norm 8,
    # kv up 320, o 512 -> 2,184; norms 64. MoE layers: 5 experts 3,840 + router 128 (no bias) = 3,968.
    # Layers 3 * 2,248 = 6,744 + 4,608 + 2 * 3,968 = 19,288; embeddings 3,200; final norm 32 -> 22,520.
    assert m.num_params == 22_520
    assert m.num_active_params == 6_744 + 4_608 + 2 * (3 * 768 + 128) + 3_232 == 19_448
    assert (m.q_lora_rank, m.num_shared_experts, m.kv_bytes_per_token()) == (0, 1, 60)
    # the measured model's attention GEMMs are vLLM's q_proj and kv_a_proj_with_mqa, then kv_b_proj's halves, o_proj
    assert cm.measured(m, "H100-SXM").gemm_shapes[:5] == ((32, 32), (10, 32), (24, 8), (16, 8), (32, 16))


def test_reads_a_config_file_and_its_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**DENSE, "_name_or_path": "me/dense"}))
    assert specs.model_from_config(tmp_path / "config.json").name == "me/dense"
    assert specs.model_from_config(tmp_path).num_params == 251_328


def test_sliding_window_layers_from_the_config():
    gemma = specs.model_from_config({**DENSE, "model_type": "gemma2", "head_dim": 8, "sliding_window": 128})
    assert (gemma.sliding_window_tokens, gemma.num_sliding_layers) == (128, 2)  # layers 0 and 2 of 3
    mistral = specs.model_from_config({**DENSE, "model_type": "mistral", "sliding_window": 128})
    assert mistral.num_sliding_layers == 3
    qwen = specs.model_from_config({**DENSE, "model_type": "qwen2", "sliding_window": 128, "use_sliding_window": False})
    assert qwen.sliding_window_tokens is None


@pytest.mark.parametrize("cfg, match", [
    ({**DENSE, "model_type": "mamba"}, "model_type 'mamba' is not supported"),
    ({k: x for k, x in DENSE.items() if k != "vocab_size"}, "missing key vocab_size"),
    ({**DENSE, "num_hidden_layers": 2.5}, "num_hidden_layers must be a positive integer"),
    ({**DENSE, "num_key_value_heads": 3}, "not a multiple of 3 KV heads"),
    # issue 25: wrong types and absurd sizes name the key (were TypeError / OverflowError / "invalid literal")
    ({**DENSE, "hidden_size": float("inf")}, r"config: hidden_size must be a positive integer \(at most 1,048,576\), got inf"),
    ({**DENSE, "hidden_size": float("nan")}, "config: hidden_size must be a positive integer .*got nan"),
    ({**DENSE, "hidden_size": "4096"}, "config: hidden_size must be a positive integer .*got '4096'"),
    ({**DENSE, "num_hidden_layers": 10**30}, "config: num_hidden_layers must be a positive integer \\(at most 10,000\\)"),
    ({**DENSE, "vocab_size": "x" * 10_000}, r"vocab_size must be a positive integer .*got 'xxxx[x]*\.\.\.$"),
    ({**DENSE, "model_type": ["llama"]}, r"model_type \['llama'\] is not supported"),
    ({**MLA, "first_k_dense_replace": -5}, "first_k_dense_replace must be an integer >= 0"),  # was 758B params
    ({**MLA, "first_k_dense_replace": "1"}, "first_k_dense_replace must be an integer >= 0 .*got '1'"),
    ({**MLA, "first_k_dense_replace": 4}, "first_k_dense_replace 4 exceeds num_hidden_layers 3"),
    ({**MLA, "topk_method": ["noaux_tc"]}, "topk_method must be a string"),
    ({**MLA, "num_experts_per_tok": 5}, "num_experts_per_tok 5 exceeds the 4 experts"),
    # floored silently before: 65 / 8 heads is 8.125 dims
    ({**DENSE, "hidden_size": 65}, "hidden_size 65 is not divisible by num_attention_heads 8 and there is no head_dim"),
    ({"model_type": "gptj", "n_embd": 30, "n_head": 4, "n_layer": 2, "vocab_size": 10, "n_positions": 64},
     "n_embd 30 is not divisible by n_head 4"),
])
def test_bad_configs_name_the_key(cfg, match):
    with pytest.raises(ValueError, match=match):
        specs.model_from_config(cfg)


def test_a_bad_value_in_a_config_file_names_the_file_and_key(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**DENSE, "intermediate_size": 1e300}))
    with pytest.raises(ValueError, match=rf"config file {tmp_path}: intermediate_size must be a positive integer"):
        specs.model_from_config(tmp_path)


def test_a_head_dim_key_settles_an_uneven_split():
    m = specs.model_from_config({**DENSE, "hidden_size": 65, "head_dim": 8})
    assert m.head_dim == 8


def test_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        specs.model_from_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        specs.model_from_config(tmp_path / "bad.json")


def test_a_spec_from_a_config_works_where_a_model_name_does():
    cfg = {**DENSE, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
           "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192}
    m = specs.model_from_config(cfg, name="my-llama")
    assert pool_pages(m, "H100-SXM") == pool_pages("Llama-3-8B", "H100-SXM")
    assert roofline(m, "H100-SXM") == roofline("Llama-3-8B", "H100-SXM").__class__(
        **{**roofline("Llama-3-8B", "H100-SXM").__dict__, "model_name": "my-llama"})
    w = pd.DataFrame({"prompt_tokens": [100, 200], "output_tokens": [5, 7]})
    res = simulate(w, "vllm", model=m, gpu="H100-SXM")
    assert res.params["model"] == "my-llama"
    assert res.summary["num_completed"] == 2


# --- Qwen3 (dense and MoE): the configs published in the Qwen/Qwen3-* repositories -----------
QWEN3 = {"model_type": "qwen3", "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
         "attention_bias": False, "use_sliding_window": False, "sliding_window": None}


@pytest.mark.parametrize("shapes, total, non_embedding", [
    # Qwen3 model cards: 8.2B (6.95B non-embedding), 0.6B (0.44B, tied embeddings), 32.8B (31.2B)
    ({"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "tie_word_embeddings": False}, 8.2e9, 6.95e9),
    ({"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
      "num_key_value_heads": 8, "tie_word_embeddings": True}, 0.6e9, 0.44e9),
    ({"hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
      "num_key_value_heads": 8, "tie_word_embeddings": False}, 32.8e9, 31.2e9),
])
def test_qwen3_parameter_counts_match_the_model_cards(shapes, total, non_embedding):
    cfg = {**QWEN3, **shapes}
    m = specs.model_from_config(cfg, name="qwen3")
    embedding = cfg["vocab_size"] * cfg["hidden_size"] * (1 if cfg["tie_word_embeddings"] else 2)
    assert m.num_params == pytest.approx(total, rel=0.01)
    assert m.num_params - embedding == pytest.approx(non_embedding, rel=0.01)
    assert m.head_dim == 128 and m.num_kv_heads == 8 and m.sliding_window_tokens is None
    # by hand, per layer: attention, the two 128-wide q/k norms, gated MLP, two RMSNorms
    h, q, k, d, f = (cfg[x] for x in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                      "intermediate_size"))
    layer = 2 * h * q * d + 2 * h * k * d + 2 * d + 3 * h * f + 2 * h
    assert m.num_params == cfg["num_hidden_layers"] * layer + embedding + h


def test_qwen3_moe_counts_30b_total_3b_active():
    # Qwen/Qwen3-30B-A3B config.json; the model card: 30.5B total, 3.3B activated
    cfg = {**QWEN3, "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
           "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
           "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "tie_word_embeddings": False}
    m = specs.model_from_config(cfg, name="qwen3-moe")
    assert m.num_params == pytest.approx(30.5e9, rel=0.01) and m.num_active_params == pytest.approx(3.3e9, rel=0.02)
    assert m.is_moe and m.num_experts == 128 and m.experts_per_token == 8
    dense_first = specs.model_from_config({**cfg, "mlp_only_layers": [0]}, name="x")  # one dense layer of width 6144
    expert = 3 * 2048 * 768
    assert dense_first.num_params - m.num_params == 3 * 2048 * 6144 - (128 * expert + 2048 * 128)
    with pytest.raises(ValueError, match="mlp_only_layers"):
        specs.model_from_config({**cfg, "mlp_only_layers": "0"}, name="x")
