import numpy as np
import pytest

import kvlab
from kvlab.specs import GIB, MIB


def test_brief_reference_table():
    t = kvlab.reservation_table(max_new_tokens=[128, 512, 2048], pool_pages=1000, block_size=16)
    assert t["pages_per_request"].tolist() == [8, 32, 128]
    assert t["max_concurrent_requests"].tolist() == [125, 31, 7]


def test_prompt_pages_share_the_last_page():
    # prompt 512 + output: ceil(640/16)=40, ceil(1024/16)=64, ceil(2560/16)=160 pages.
    t = kvlab.reservation_table([128, 512, 2048], pool_pages=1000, block_size=16, prompt_tokens=512)
    assert t["pages_per_request"].tolist() == [40, 64, 160]
    assert t["prompt_pages"].tolist() == [32, 32, 32]
    assert t["decode_pages"].tolist() == [8, 32, 128]
    assert t["max_concurrent_requests"].tolist() == [25, 15, 6]
    # A prompt of 10 and 100 new tokens fit in ceil(110/16) = 7 pages, not 1 + 7.
    t = kvlab.reservation_table([100], pool_pages=70, block_size=16, prompt_tokens=10)
    assert t["pages_per_request"].tolist() == [7] and t["max_concurrent_requests"].tolist() == [10]


def test_pool_pages_hand_computed():
    # Llama-3-8B on H100 SXM at 0.9: (81559 MiB x 0.9 - 2 x 8,030,261,248 B - 1 GiB) / (16 x 131,072 B)
    expected = int((81559 * MIB * 0.9 - 2 * 8_030_261_248 - 1 * GIB) // (16 * 131_072))
    assert expected == 28531
    assert kvlab.pool_pages("Llama-3-8B", "H100-SXM", block_size=16, gpu_memory_utilization=0.9) == expected
    # Tensor parallelism halves weights and KV per GPU.
    tp2 = int((81559 * MIB * 0.9 - 8_030_261_248 - 1 * GIB) // (16 * 65_536))
    assert kvlab.pool_pages("Llama-3-8B", "H100-SXM", tp=2) == tp2


def test_real_pool_table_uses_the_pool():
    t = kvlab.real_pool_table("Llama-3-8B", "H100-SXM", [128, 2048])
    pool = kvlab.pool_pages("Llama-3-8B", "H100-SXM")
    assert t["max_concurrent_requests"].tolist() == [pool // 8, pool // 128]


def test_waste_hand_worked():
    w = kvlab.reservation_waste([1, 10, 100, 1000], [100], block_size=16).iloc[0]
    # used tokens 1, 10, 100, 100 -> pages 1, 1, 7, 7; reserved 7 pages each.
    assert w["kv_used_frac"] == pytest.approx(16 / 28)
    assert w["share_under_low_use"] == 0.25          # only 1 < 5% of 100
    assert w["share_overreserved"] == 0.5            # 100 > 9 x 1 and 100 > 9 x 10
    assert w["share_capped"] == 0.5
    assert w["overreservation_at_p99"] == pytest.approx(100 / np.percentile([1, 10, 100, 1000], 99))


def test_waste_with_prompt_pages():
    w = kvlab.reservation_waste([16], [32], block_size=16, prompt_tokens=[16]).iloc[0]
    # used 32 tokens = 2 pages of 3 reserved (48 tokens)
    assert w["kv_used_frac"] == pytest.approx(2 / 3)
    assert bool(w["with_prompt"])


@pytest.mark.parametrize("kw, name", [
    ({"block_size": 0}, "block_size"), ({"block_size": -16}, "block_size"), ({"block_size": 1.5}, "block_size"),
    ({"block_size": True}, "block_size"), ({"max_new_tokens": [128, 0]}, "max_new_tokens"),
    ({"max_new_tokens": [128, 2.5]}, "max_new_tokens"), ({"pool_pages": 0}, "pool_pages"),
    ({"pool_pages": -5}, "pool_pages"), ({"prompt_tokens": -1}, "prompt_tokens"),
])
def test_reservation_table_bad_input(kw, name):
    args = {"max_new_tokens": [128], "pool_pages": 1000, "block_size": 16} | kw
    with pytest.raises(ValueError, match=name):
        kvlab.reservation_table(**args)


@pytest.mark.parametrize("util", [0, -0.1, 1.01, float("nan")])
def test_pool_bad_utilisation(util):
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        kvlab.pool_pages("Llama-3-8B", "H100-SXM", gpu_memory_utilization=util)


def test_pool_unknown_names_and_model_not_fitting():
    with pytest.raises(ValueError, match="known models are"):
        kvlab.pool_pages("Llama-9-1T", "H100-SXM")
    with pytest.raises(ValueError, match="known GPUs are"):
        kvlab.pool_pages("Llama-3-8B", "Voodoo2")
    with pytest.raises(ValueError, match=r"does not fit GPU L4.*weights 131\.4 GiB"):
        kvlab.pool_pages("Llama-3-70B", "L4")


def test_waste_bad_input():
    with pytest.raises(ValueError, match="output_tokens"):
        kvlab.reservation_waste([10, 0], [128])
    with pytest.raises(ValueError, match="low_use_frac"):
        kvlab.reservation_waste([10], [128], low_use_frac=0)
