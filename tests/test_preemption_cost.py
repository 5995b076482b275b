"""Recompute and swap costs of one preemption, their crossover and the catalogue table."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import kvlab
from kvlab import preemption_cost as pc
from kvlab.costmodel import roofline
from kvlab.reservation import pool_pages

# Llama-3-8B on H200, tp=1, written out from data/models.csv and data/gpus.csv.
PARAMS = 8030261248
LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 32, 32, 8, 128
FLOPS = 989e12 * 0.6            # default compute_efficiency
HBM = 4800e9 * 0.8              # default bandwidth_efficiency
OVERHEAD_S = 0.002
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2


def _iteration(tokens: int, pairs: int, kv_tokens: int) -> float:
    compute = (2 * PARAMS * tokens + 4 * LAYERS * Q_HEADS * HEAD_DIM * pairs) / FLOPS
    memory = (2 * PARAMS + KV_BYTES_PER_TOKEN * kv_tokens) / HBM
    return max(compute, memory) + OVERHEAD_S


def test_recompute_by_hand_one_iteration():
    cost = roofline("Llama-3-8B", "H200")
    expected = _iteration(1000, 1000 * 1001 // 2, 1000)
    assert pc.recompute_s(cost, 1000)[0] == pytest.approx(expected, rel=1e-12)
    # 1000 tokens: compute-bound, 2 x 8.03e9 x 1000 + attention over 593.4 TFLOP/s + 2 ms.
    assert expected == pytest.approx(0.029507, rel=1e-4)


def test_recompute_by_hand_chunked():
    cost = roofline("Llama-3-8B", "H200")
    # 1000 tokens in chunks of 512: 512 tokens from scratch, then 488 after 512 cached.
    expected = _iteration(512, 512 * 513 // 2, 512) + _iteration(488, 488 * 512 + 488 * 489 // 2, 1000)
    assert pc.recompute_s(cost, 1000, chunk_tokens=512)[0] == pytest.approx(expected, rel=1e-12)
    # A chunk at least as long as the sequence is one iteration.
    assert pc.recompute_s(cost, 1000, chunk_tokens=1000)[0] == pc.recompute_s(cost, 1000)[0]


@settings(max_examples=60)
@given(s=st.integers(1, 20000), chunk=st.integers(1, 4096))
def test_chunk_attention_pairs_sum_to_the_whole_prefill(s, chunk):
    """Whatever the chunking, the chunks attend to s (s + 1) / 2 pairs in all."""
    from kvlab.costmodel import prefill_attention_pairs
    starts = np.arange(0, s, chunk)
    sizes = np.minimum(chunk, s - starts)
    assert int(prefill_attention_pairs(sizes, starts).sum()) == s * (s + 1) // 2


@settings(max_examples=40)
@given(seq=st.lists(st.integers(1, 8192), min_size=1, max_size=30), chunk=st.integers(16, 2048))
def test_chunked_recompute_matches_a_loop_and_is_never_cheaper(seq, chunk):
    cost = roofline("Llama-3-8B", "H200")
    got = pc.recompute_s(cost, seq, chunk_tokens=chunk)
    for s, g in zip(seq, got):
        expected = sum(_iteration(min(chunk, s - k), min(chunk, s - k) * k + min(chunk, s - k) * (min(chunk, s - k) + 1) // 2,
                                  k + min(chunk, s - k)) for k in range(0, s, chunk))
        assert g == pytest.approx(expected, rel=1e-9)
    assert np.all(got >= pc.recompute_s(cost, seq) * (1 - 1e-12))


def test_costs_grow_with_length():
    costs = pc.preemption_costs("Llama-2-7B", "A100-80GB-SXM", np.arange(1, 4097), block_size=16)
    assert np.all(np.diff(costs["recompute_s"]) > 0)
    assert np.all(np.diff(costs["swap_s"]) >= 0)
    assert (costs["winner"] == np.where(costs["recompute_s"] <= costs["swap_s"], "recompute", "swap")).all()


@pytest.mark.parametrize("block_size", [8, 16, 64, 128])
@pytest.mark.parametrize("copy_mode", ["per_layer_page", "per_page", "batched"])
def test_crossover_is_where_the_curves_meet(block_size, copy_mode):
    swap = pc.swap_model("Llama-3-8B", "H200", copy_mode=copy_mode)
    c = pc.crossover("Llama-3-8B", "H200", block_size, swap=swap)
    full = pc.preemption_costs("Llama-3-8B", "H200", np.arange(1, c.max_seq_tokens + 1),
                               block_size=block_size, swap=swap)
    ratio = full["recompute_s"] / full["swap_s"]
    assert c.recompute_over_swap_min == pytest.approx(ratio.min())
    assert c.recompute_over_swap_max == pytest.approx(ratio.max())
    assert c.winner_below == full["winner"].iloc[0] and c.winner_above == full["winner"].iloc[-1]
    changes = np.flatnonzero(full["winner"].to_numpy()[1:] != full["winner"].to_numpy()[:-1])
    assert c.num_crossings == changes.size
    if c.crossover_tokens is None:
        assert (full["winner"] == c.winner_below).all()
    else:
        at = pc.preemption_costs("Llama-3-8B", "H200", [c.crossover_tokens - 1, c.crossover_tokens],
                                 block_size=block_size, swap=swap)
        assert at["winner"][0] == c.winner_below and at["winner"][1] == c.winner_above != c.winner_below
        assert (full["winner"][c.crossover_tokens - 1:] == c.winner_above).all()
        assert c.first_crossover_tokens == changes[0] + 2      # row i holds length i + 1


def test_crossover_by_hand_with_a_linear_swap():
    """Batched swap with no latency is a line through 0 (262 us/token); recompute has a floor
    (weights read + overhead, ~6 ms) and a smaller slope (~27 us/token): swap wins short
    lengths, recompute long ones, from the first length where recompute is no dearer."""
    swap = pc.swap_model("Llama-3-8B", "H200", copy_mode="batched", copy_latency_s=0.0, link_bytes_per_s=1e9)
    c = pc.crossover("Llama-3-8B", "H200", 1, swap=swap, cost_model=roofline("Llama-3-8B", "H200"))
    s = np.arange(1, 8193)
    swap_s = 2 * s * KV_BYTES_PER_TOKEN / 1e9
    rec = np.array([_iteration(int(x), int(x) * (int(x) + 1) // 2, int(x)) for x in s])
    first = int(s[np.argmax(rec <= swap_s)])
    assert c.winner_below == "swap" and c.winner_above == "recompute" and c.num_crossings == 1
    assert c.crossover_tokens == first


def test_crossing_tokens_interpolates_sparse_curves():
    seq = [100, 200, 400]
    rec = [1.0, 2.0, 3.0]
    swap = [1.5, 2.5, 2.0]          # difference -0.5, -0.5, +1.0: changes between 200 and 400
    at, n = pc.crossing_tokens(seq, rec, swap)
    assert n == 1 and at == pytest.approx(200 + 200 * 0.5 / 1.5)
    assert pc.crossing_tokens(seq, rec, [2.0, 3.0, 4.0]) == (None, 0)
    # Two changes (swap, recompute, swap): the last one, between 200 and 400, is reported.
    at, n = pc.crossing_tokens(seq, rec, [0.5, 2.5, 2.0])
    assert n == 2 and at == pytest.approx(200 + 200 * 0.5 / 1.5)


def test_attention_dominance_closed_form():
    cost = roofline("Llama-3-8B", "H200")
    s = pc.attention_dominance_tokens(cost)
    linear, attention = pc.recompute_flops(cost, [int(np.floor(s)), int(np.ceil(s))])
    assert linear[0] >= attention[0] and linear[1] <= attention[1]
    assert s == pytest.approx(PARAMS / (LAYERS * Q_HEADS * HEAD_DIM) - 1)


def test_smallest_tp_is_the_first_that_fits():
    tp = pc.smallest_tp("Llama-2-70B", "H100-SXM")
    assert tp == 2
    pool_pages("Llama-2-70B", "H100-SXM", tp=2)
    with pytest.raises(ValueError):
        pool_pages("Llama-2-70B", "H100-SXM", tp=1)
    assert pc.smallest_tp("Falcon-180B", "L4") is None


def test_crossover_table_covers_the_catalogue():
    table = pc.crossover_table(models=["Llama-3-8B", "Falcon-180B"], gpus=["H200", "L4"])
    pairs = set(zip(table["model"], table["gpu"]))
    assert pairs == {("Llama-3-8B", "H200"), ("Llama-3-8B", "L4"), ("Falcon-180B", "H200")}
    assert sorted(table["block_size"].unique()) == [8, 16, 32, 64, 128]
    # Each row's crossover, checked against the cost functions themselves: the winner differs on
    # either side of it; with none, the row's winner wins at every integer length.
    for _, row in table.iterrows():
        m, g, bs, tp = row["model"], row["gpu"], int(row["block_size"]), int(row["tp"])
        if pd.isna(row["crossover_tokens"]):
            seq = np.arange(1, kvlab.specs.model(m).max_context_tokens + 1)
            c = pc.preemption_costs(m, g, seq, block_size=bs, tp=tp)
            swap_wins = (c["swap_s"] < c["recompute_s"]).to_numpy()
            assert swap_wins.all() or (~swap_wins).all()
        else:
            s = int(row["crossover_tokens"])
            c = pc.preemption_costs(m, g, [s - 1, s], block_size=bs, tp=tp)
            below, at = (c["swap_s"] < c["recompute_s"]).tolist()
            assert below != at


@pytest.mark.parametrize("call, match", [
    (lambda: pc.preemption_costs("Llama-3-8B", "H200", [100, 0]), "seq_tokens.*element 1"),
    (lambda: pc.preemption_costs("Llama-3-8B", "H200", [100], block_size=0), "block_size"),
    (lambda: pc.preemption_costs("Llama-3-8B", "H200", [100], chunk_tokens=-5), "chunk_tokens"),
    (lambda: pc.preemption_costs("Llama-3-8B", "H200", [100, 9000]), "longer than the 8192-token context"),
    (lambda: pc.crossover("Llama-3-8B", "H200", 16, max_seq_tokens=10000), "allow_beyond_context"),
    (lambda: pc.crossover("Llama-3-8B", "H200", 16, cost_model=roofline("Llama-2-7B", "H200")), "cost_model"),
    (lambda: pc.crossing_tokens([1, 3, 2], [1, 2, 3], [1, 2, 3]), "increasing"),
])
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_beyond_context_with_the_flag():
    costs = pc.preemption_costs("Llama-3-8B", "H200", [9000], allow_beyond_context=True)
    assert costs["recompute_s"].iloc[0] > 0


def test_piggybacked_recompute_pays_its_flops_only():
    cost = pc.piggyback(roofline("Llama-3-8B", "H200"))
    # 1000 tokens: FLOPs over the effective rate; its KV bytes (131 MB at 3.84 TB/s) hide under them.
    expected = (2 * PARAMS * 1000 + 4 * LAYERS * Q_HEADS * HEAD_DIM * (1000 * 1001 // 2)) / FLOPS
    assert pc.recompute_s(cost, 1000)[0] == pytest.approx(expected, rel=1e-12)
    # Chunking no longer adds weight reads or overheads: the same FLOPs in any chunks.
    assert pc.recompute_s(cost, 1000, chunk_tokens=128)[0] == pytest.approx(expected, rel=1e-12)
    alone = pc.recompute_s(roofline("Llama-3-8B", "H200"), np.arange(1, 9000, 97))
    assert np.all(pc.recompute_s(cost, np.arange(1, 9000, 97)) < alone)


def test_catalogue_piggybacked_uses_the_marginal_model():
    """The catalogue's piggybacked rows price with the default model's marginal form (H200: the
    measured model extrapolated from H100-SXM), and with the roofline's when asked."""
    from kvlab.costmodel import cost_model
    table = pc.crossover_table(models=["Llama-3-8B"], gpus=["H200"], block_sizes=[16], piggybacked=True)
    c = pc.crossover("Llama-3-8B", "H200", 16, cost_model=pc.piggyback(cost_model("Llama-3-8B", "H200")))
    assert table["recompute_over_swap_max"].iloc[0] == pytest.approx(c.recompute_over_swap_max)
    assert table["winner_below"].iloc[0] == c.winner_below
    table = pc.crossover_table(models=["Llama-3-8B"], gpus=["H200"], block_sizes=[16], piggybacked=True,
                               cost_model="roofline")
    c = pc.crossover("Llama-3-8B", "H200", 16, cost_model=pc.piggyback(roofline("Llama-3-8B", "H200")))
    assert table["recompute_over_swap_max"].iloc[0] == pytest.approx(c.recompute_over_swap_max)
    assert table["winner_below"].iloc[0] == c.winner_below


@pytest.mark.notebook
def test_notebook_03_quick_with_a_measurement(run_notebook, tmp_path):
    """Notebook 03 on tables 'measured' from a known roofline and link: the notebook's catalogue,
    crossover and fits must be what kvlab computes, and the fits must recover the known values."""
    from kvlab import calibrate as cal
    true = roofline("Llama-3-8B", "H200", compute_efficiency=0.5, bandwidth_efficiency=0.7, iteration_overhead_s=1e-3)
    profile = pd.DataFrame({"phase": ["prefill"] * 5 + ["decode"] * 3, "tokens": [256, 1024, 2048, 4096, 8192, 1, 1, 1],
                            "context": [0] * 5 + [1024, 4096, 4096], "batch": [1] * 5 + [1, 16, 64]})
    profile["seconds"] = true.iteration_s(*cal.profile_work(profile))
    profile["model"] = "Llama-3-8B"
    size = 16 * 131072                          # one page of all layers at block 16 (bytes)
    layer_page = 16 * 8 * 128 * 2                # K (or V) of one layer of one page (bytes)
    copies = pd.DataFrame({"direction": ["d2h", "h2d"] * 3,
                           "copy_bytes": [size, size, 1 << 28, 1 << 28, layer_page, layer_page],
                           "num_copies": [512, 512, 1, 1, 4096, 4096]})
    copies["seconds"] = copies["num_copies"] * (4e-6 + copies["copy_bytes"] / 40e9)
    profile.to_csv(tmp_path / "profile.csv", index=False)
    copies.to_csv(tmp_path / "copies.csv", index=False)

    # vLLM's per-layer copies, where the two costs do cross (per-page copies: swap always wins).
    res = run_notebook("03_preemption_crossover", {
        "quick": True, "model": "Llama-3-8B", "gpu": "H200", "cost_model": "roofline", "block_sizes": [8, 16, 32, 64, 128],
        "copy_mode": "per_layer_page", "measured_profile_path": str(tmp_path / "profile.csv"),
        "measured_copies_path": str(tmp_path / "copies.csv")})

    expected = pc.crossover("Llama-3-8B", "H200", 16, cost_model="roofline",
                            swap=pc.swap_model("Llama-3-8B", "H200", copy_mode="per_layer_page"))
    assert expected.crossover_tokens is not None
    assert res["crossover_tokens"] == expected.crossover_tokens
    assert res["winner_below"] == expected.winner_below
    assert len(res["catalogue"]) == len(pc.crossover_table())
    assert len(res["claims"]) == 5 and res["figures"][0].endswith("recompute-vs-swap.png")
    assert res["answer"] and res["what_to_do"] and res["setup"]["cost_model"] == "roofline"
    # The Fig. 19 rows run the paper's set-up whatever this notebook's model: OPT-13B on the A100; the swap
    # side is not testable (copies unmeasured), and the ~4,000-token rule is a distribution over the catalogue.
    from kvlab.studies import preemption_claims as prc
    fig19, ratios = prc.fig19_claims(block_sizes=[8, 16, 32, 64, 128])
    assert [c["claim"] for c in res["claims"][:3]] == fig19["claim"].tolist()
    assert [c["kind"] for c in res["claims"]][:3] == ["not reproducible", "not testable", "not testable"]
    assert res["claims"][1]["roofline"] == pytest.approx(ratios.loc[ratios["cost_model"] == "roofline", "max_ratio"].max())
    assert res["claims"][0]["source_setup"].startswith("OPT-13B on 1 x A100-40GB")
    assert res["claims"][3]["kind"] == "reported" and sum(c["rows"] for c in res["crossings"]) == len(res["catalogue"])
    fit = res["calibration"]
    assert fit["compute_efficiency"] == pytest.approx(0.5, rel=1e-3)
    assert fit["link_bytes_per_s"] == pytest.approx(40e9, rel=1e-6)
    assert fit["copy_latency_s"] == pytest.approx(4e-6, rel=1e-6)
    calibrated = pc.crossover("Llama-3-8B", "H200", 16, cost_model=true,
                              swap=pc.swap_model("Llama-3-8B", "H200", link_bytes_per_s=40e9, copy_latency_s=4e-6,
                                                 copy_mode="per_layer_page"))
    assert fit["calibrated_crossover_tokens"] == calibrated.crossover_tokens
