"""The swap price: KV pages to host memory and back (kvlab.swap), by hand."""
from __future__ import annotations

import pytest

from kvlab.swap import swap_model

# Llama-3-8B on H200, tp=1, written out from data/models.csv and data/gpus.csv.
LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2
LINK = 63e9


def test_swap_by_hand_each_copy_mode():
    s, bs, lat = 1000, 16, 5e-6
    pages = 63                                        # ceil(1000 / 16)
    page_bytes = bs * KV_BYTES_PER_TOKEN
    per_layer = swap_model("Llama-3-8B", "H200", copy_latency_s=lat, copy_mode="per_layer_page")
    per_page = swap_model("Llama-3-8B", "H200", copy_latency_s=lat, copy_mode="per_page")
    batched = swap_model("Llama-3-8B", "H200", copy_latency_s=lat, copy_mode="batched")
    moved = pages * page_bytes / LINK
    assert per_layer.swap_s(s, bs)[0] == pytest.approx(2 * (pages * 2 * LAYERS * lat + moved), rel=1e-12)
    assert per_page.swap_s(s, bs)[0] == pytest.approx(2 * (pages * lat + moved), rel=1e-12)
    assert batched.swap_s(s, bs)[0] == pytest.approx(2 * (lat + moved), rel=1e-12)
    assert per_layer.num_copies(s, bs)[0] == pages * 64
    assert per_layer.swap_bytes(s, bs)[0] == pages * page_bytes


def test_swap_under_tp_moves_each_gpus_share():
    one = swap_model("Llama-3-8B", "H200", tp=1)
    two = swap_model("Llama-3-8B", "H200", tp=2)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    # Llama-3-8B has 8 KV heads: beyond TP 8 each GPU keeps one head (replicated).
    assert swap_model("Llama-3-8B", "H200", tp=16).kv_bytes_per_token == one.kv_bytes_per_token / 8


def test_page_copy_s_is_one_full_page_one_way():
    sw = swap_model("Llama-3-8B", "H200", copy_latency_s=5e-6)
    assert sw.page_copy_s(16) == pytest.approx(5e-6 + 16 * KV_BYTES_PER_TOKEN / LINK, rel=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda: swap_model("Llama-3-8B", "H200", link_bytes_per_s=0), "link_bytes_per_s"),
    (lambda: swap_model("Llama-3-8B", "H200", copy_latency_s=-1e-6), "copy_latency_s"),
    (lambda: swap_model("Llama-3-8B", "H200", copy_mode="dma"), "copy_mode"),
    (lambda: swap_model("Llama-3-8B", "H200").swap_s([16, 0], 16), "seq_tokens.*element 1"),
])
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()
