import pytest

from kvlab import specs


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
