import dataclasses

import pytest
import yaml

import kvlab
from kvlab import specs
from kvlab._paths import DATA_DIR


@pytest.mark.parametrize("name, expected", [
    ("Llama-3-8B", 131_072), ("Llama-2-7B", 524_288), ("Yi-34B", 245_760), ("Falcon-180B", 163_840),
])
def test_kv_bytes_per_token_check_values(name, expected):
    assert specs.model(name).kv_bytes_per_token() == expected


def test_kv_bytes_split_under_tensor_and_pipeline_parallelism():
    m = specs.model("Llama-3-8B")  # 32 layers, 8 KV heads, head dim 128
    assert m.kv_bytes_per_token(tp=2) == 2 * 32 * 4 * 128 * 2
    assert m.kv_bytes_per_token(pp=2) == 2 * 16 * 8 * 128 * 2
    assert m.kv_bytes_per_token(tp=2, pp=4) == 2 * 8 * 4 * 128 * 2
    # More GPUs than KV heads: heads are replicated, one per GPU.
    assert m.kv_bytes_per_token(tp=16) == 2 * 32 * 1 * 128 * 2
    assert m.kv_bytes_per_token(dtype_bytes=1) == 65_536  # FP8 cache


@pytest.mark.parametrize("alias, canonical", [
    ("llama3_8b", "Llama-3-8B"), ("LLAMA 3 8B", "Llama-3-8B"), ("falcon_180b", "Falcon-180B"),
])
def test_model_names_ignore_case_spaces_hyphens_underscores(alias, canonical):
    assert specs.model(alias).name == canonical


@pytest.mark.parametrize("alias, canonical", [("h100-sxm", "H100-SXM"), ("H100 SXM", "H100-SXM"),
                                              ("a100_80gb_pcie", "A100-80GB-PCIe")])
def test_gpu_names_ignore_case_spaces_hyphens_underscores(alias, canonical):
    assert specs.gpu(alias).name == canonical


def test_catalogue_has_required_rows_each_with_a_source():
    models, gpus = specs.models(), specs.gpus()
    for name in ["Llama-2-7B", "Llama-3-8B", "Llama-3-70B", "Mistral-7B", "Yi-34B", "Falcon-180B"]:
        assert name in set(models["name"])
    for name in ["A100-40GB", "A100-80GB-SXM", "A100-80GB-PCIe", "H100-SXM", "H100-PCIe", "H200", "L4", "L40S"]:
        assert name in set(gpus["name"])
    assert models["source"].str.len().min() > 10
    assert gpus["source"].str.len().min() > 10


def test_gpu_units_converted():
    g = specs.gpu("H100-SXM")
    assert g.memory_bytes == 81559 * 2**20
    assert g.hbm_bandwidth_bytes_per_s == 3.35e12
    assert g.bf16_flops_per_s == 989e12
    assert g.host_link_bytes_per_s == 63e9


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'.*Llama-3-8B"):
        specs.model("gpt-5")
    with pytest.raises(ValueError, match=r"unknown GPU 'B300'.*H100-SXM"):
        specs.gpu("B300")


@pytest.mark.parametrize("kw", [{"tp": 0}, {"pp": -1}, {"tp": 1.5}, {"dtype_bytes": 0}])
def test_bad_parallelism_raises_naming_parameter(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        specs.model("Llama-3-8B").kv_bytes_per_token(**kw)


def test_pipeline_stages_beyond_layers_raise():
    with pytest.raises(ValueError, match="pp=64 exceeds the 32 layers"):
        specs.model("Llama-3-8B").kv_bytes_per_token(pp=64)


# --- catalogue rows against their configs and published parameter counts ---------------------

def test_every_catalogue_row_is_its_config_through_model_from_config():
    configs = yaml.safe_load((DATA_DIR / "model_configs.yaml").read_text())
    table = specs.models()
    assert set(table["name"]) == set(configs)
    for name, entry in configs.items():
        want = specs.model_from_config(entry["config"], name=name)
        got = specs.model(name)
        assert dataclasses.replace(got, source="", hf_id="") == dataclasses.replace(want, source=""), name
        assert got.source == entry["source"]
        # the Hugging Face id a printed command loads is the repository whose config.json the row is
        repo = entry["source"].split(" config.json")[0] if " config.json" in entry["source"] else ""
        assert got.hf_id == repo, name


def test_fine_tunes_of_a_catalogued_architecture_are_that_model_under_their_own_id():
    """A chat or instruct model named by its Hugging Face id (with or without its owner) is its base's row, its
    ``hf_id`` (the repository a printed command loads) the one named; no variant id names two rows."""
    table = specs.models()
    seen = {specs._key(x) for x in (*table["name"], *table["hf_id"].dropna())}
    variants = [(row["name"], v) for _, row in table.iterrows() for v in specs._variant_ids(row["variant_ids"])]
    assert len(variants) >= 20
    for name, v in variants:
        assert specs._key(v) not in seen, v
        seen.add(specs._key(v))
        base = specs.model(name)
        for typed in (v, v.upper(), v.rpartition("/")[2]):
            got = specs.resolve_model(typed)
            assert dataclasses.replace(got, hf_id=base.hf_id) == base and got.hf_id == v, typed
    with pytest.raises(ValueError, match=r"not in kvlab's catalogue \(did you mean meta-llama/Llama-2-7b-chat-hf"):
        specs.resolve_model("meta-llama/Llama-2-7b-chat")


@pytest.mark.parametrize("name, published, rtol", [
    # Exact counts from the checkpoints' safetensors metadata / model cards.
    ("Llama-2-7B", 6_738_415_616, 0), ("Llama-3-8B", 8_030_261_248, 0), ("Mistral-7B", 7_241_732_096, 0),
    ("Mixtral-8x7B", 46_702_792_704, 0), ("OPT-13B", 12_853_473_280, 0),
    # GPT-J model card: 6,053,381,344 (its count differs by 0.04%: the card's figure includes
    # something the config's shapes do not show).
    ("GPT-J-6B", 6_053_381_344, 5e-4),
    # Rounded figures of papers and model cards, to their rounding.
    ("Qwen2.5-7B", 7.61e9, 1e-3), ("Qwen2.5-72B", 72.7e9, 1e-3), ("Llama-3.1-405B", 405e9, 3e-3),
    ("DeepSeek-V3", 671e9, 1e-3), ("OPT-175B", 175e9, 3e-3), ("Gemma-2-9B", 9.24e9, 1e-3),
    ("Phi-3-mini-4k", 3.8e9, 1e-2), ("Falcon-180B", 180e9, 1e-2),
    # Qwen3 technical report (arXiv 2505.09388) Tables 1-2: 32.8B; 30.5B total.
    ("Qwen3-32B", 32.8e9, 2e-3), ("Qwen3-30B-A3B", 30.5e9, 2e-3),
])
def test_parameter_counts_match_published_figures(name, published, rtol):
    assert specs.model(name).num_params == pytest.approx(published, rel=rtol, abs=0)


def test_active_parameters_of_the_mixtures_of_experts():
    assert specs.model("Mixtral-8x7B").num_active_params == pytest.approx(12.9e9, rel=2e-3)  # Mixtral paper: 12.9B
    assert specs.model("DeepSeek-V3").num_active_params == pytest.approx(37e9, rel=2e-2)    # DeepSeek-V3: 37B
    assert specs.model("Qwen3-30B-A3B").num_active_params == pytest.approx(3.3e9, rel=2e-2)  # Qwen3 report: 3.3B
    assert specs.model("Llama-3-8B").num_active_params == specs.model("Llama-3-8B").num_params


@pytest.mark.parametrize("name, expected", [
    ("OPT-13B", 2 * 40 * 5120 * 2),            # 800 KB per token, as the vLLM paper states
    ("GPT-J-6B", 2 * 28 * 16 * 256 * 2),
    ("Qwen2.5-7B", 2 * 28 * 4 * 128 * 2),
    ("Gemma-2-9B", 2 * 42 * 8 * 256 * 2),
    ("DeepSeek-V3", 61 * (512 + 64) * 2),      # MLA: latent + rope key per layer, no head axis
])
def test_kv_bytes_per_token_of_new_rows(name, expected):
    assert specs.model(name).kv_bytes_per_token() == expected


def test_mla_latent_is_replicated_under_tensor_parallelism_and_split_by_pipeline():
    m = specs.model("DeepSeek-V3")
    assert m.kv_bytes_per_token(tp=8) == 61 * 576 * 2
    assert m.kv_bytes_per_token(pp=2) == 31 * 576 * 2
    assert m.kv_tensors_per_layer == 1 and specs.model("Llama-3-8B").kv_tensors_per_layer == 2


def test_sliding_window_bytes_keep_the_window_only_in_windowed_layers():
    g = specs.model("Gemma-2-9B")  # 42 layers, 21 of them windowed at 4096; 8,192 bytes per token per layer
    per_layer = 2 * 8 * 256 * 2
    assert g.kv_bytes(1000) == 42 * 1000 * per_layer == 1000 * g.kv_bytes_per_token()
    assert g.kv_bytes(8192) == (21 * 8192 + 21 * 4096) * per_layer
    # Two stages of 21 layers: the worst stage holds the 21 global layers.
    assert g.kv_bytes(8192, pp=2) == 21 * 8192 * per_layer
    assert specs.model("Llama-3-8B").kv_bytes(5000) == 5000 * 131_072


def test_new_gpu_rows_and_links():
    for name in ["A40", "A100-40GB-PCIe", "B200", "A10G", "MI300X"]:
        assert specs.gpu(name).source
    a100 = specs.gpu("A100-80GB-SXM")
    assert a100.internode_bytes_per_s == 25e9  # 200 Gb/s HDR InfiniBand per GPU
    assert a100.internode_bytes_per_s < a100.interconnect_bytes_per_s
    assert specs.gpu("B200").bf16_flops_per_s == 36e15 / 8 / 2  # HGX B200: 36 PFLOP/s sparse for 8 GPUs


# --- precision: FP8 / INT4 weights and FP8 KV ------------------------------------------------

def test_fp8_kv_halves_the_page_and_doubles_the_pool_by_hand():
    # Llama-3-8B on one H100 SXM at 0.9: 81,559 MiB x 0.9 - 8,030,261,248 x 2 bytes of BF16 weights - 1 GiB
    free = 81559 * 2**20 * 0.9 - 8_030_261_248 * 2 - 2**30
    bf16_page = 16 * 32 * 2 * 8 * 128 * 2  # tokens x layers x (K, V) x KV heads x head dim x 2 bytes
    assert bf16_page == 2_097_152
    fp8 = specs.with_precision("Llama-3-8B", kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token() * 16 == bf16_page // 2
    assert kvlab.pool_pages("Llama-3-8B", "H100-SXM") == int(free // bf16_page) == 28_531
    assert kvlab.pool_pages(fp8, "H100-SXM") == int(free // (bf16_page // 2)) == 57_062  # twice the pages
    assert fp8.weight_bytes_per_gpu() == specs.model("Llama-3-8B").weight_bytes_per_gpu()  # KV only


def test_quantized_weights_keep_embedding_and_head_in_bf16_by_hand():
    n, embed = 8_030_261_248, 2 * 128_256 * 4096  # Llama-3-8B: untied embedding and LM head
    fp8 = specs.with_precision("Llama-3-8B", weights="fp8")
    int4 = specs.with_precision("Llama-3-8B", weights="int4")
    assert fp8.weight_bytes_per_gpu() == (n - embed) * 1 + embed * 2
    assert int4.weight_bytes_per_gpu(tp=2) == ((n - embed) * (0.5 + 2 / 128) + embed * 2) / 2
    assert fp8.kv_bytes_per_token() == specs.model("Llama-3-8B").kv_bytes_per_token()  # weights only
    # lighter weights leave more of the same memory to KV
    assert kvlab.pool_pages(int4, "L4") > kvlab.pool_pages(fp8, "L4") > kvlab.pool_pages("Llama-3-8B", "L4")


def test_fp8_gemm_peak_only_where_the_gpu_has_fp8():
    from kvlab.costmodel import roofline
    h100, a100 = specs.gpu("H100-SXM"), specs.gpu("A100-80GB-SXM")
    assert h100.has_fp8 and not a100.has_fp8
    assert h100.gemm_flops_per_s("fp8") == 1979e12 and h100.gemm_flops_per_s("int4") == 989e12
    assert a100.gemm_flops_per_s("fp8") == a100.bf16_flops_per_s == 312e12
    fp8 = specs.with_precision("Llama-3-8B", weights="fp8")
    assert roofline(fp8, h100).effective_flops_per_s == 1979e12 * 0.6
    assert roofline(fp8, a100).effective_flops_per_s == 312e12 * 0.6
    assert roofline(fp8, h100).weight_bytes == fp8.weight_bytes_per_gpu()


def test_precision_names_are_checked():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        specs.with_precision("Llama-3-8B", kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match="weights"):
        specs.with_precision("Llama-3-8B", weights="int8")
