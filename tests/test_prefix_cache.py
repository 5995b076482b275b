"""Prefix caching: hand-worked cases, the pool's rules, and properties over random workloads."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import kvlab.sim as sim
from kvlab._paths import SHARED_DATA_DIR
from kvlab.prefix_blocks import PrefixModel, block_ids, shared_keys
from kvlab.prefix_cache import NONE, PrefixPool
from kvlab.sim import simulate
from kvlab.sim.reference import ReferenceEngine
from kvlab.traces import load

BS = 16
RUN = dict(model="Llama-3-8B", gpu="H100-SXM", block_size=BS, hash_block_tokens=BS, engine="reference",
           record_iterations=True)


def _two(arrival_b: float = 0.0) -> pd.DataFrame:
    """A: 64 prompt tokens = 4 full blocks (ids 0-3); B: 60 tokens, its 3 full blocks = A's first 3."""
    return pd.DataFrame({"prompt_tokens": [64, 60], "output_tokens": [2, 2], "arrival_s": [0.0, arrival_b],
                         "hash_ids": [[0, 1, 2, 3], [0, 1, 2, 9]]})


def test_two_requests_sharing_three_blocks_use_three_fewer_pages_and_skip_their_prefill():
    off = simulate(_two(), "vllm", pool_pages=100, watermark_frac=0.0, **RUN)
    on = simulate(_two(), "vllm", pool_pages=100, watermark_frac=0.0, prefix_caching=True, **RUN)
    # Both admitted in iteration 0: A schedules (and caches) its 4 blocks first, B hits 3 of them
    # (at most (60 - 1) // 16 = 3 blocks) and computes its last 12 tokens.
    # Without caching: 64 + 60 prefill tokens, then 5 + 4 pages (A's first decode is token 65).
    assert off.iterations["prefill_tokens"].tolist() == [124, 0]
    assert off.iterations["pages_used"].tolist() == [4 + 4, 5 + 4]
    assert on.iterations["prefill_tokens"].tolist() == [64 + 12, 0]
    assert on.iterations["pages_used"].tolist() == [8 - 3, 9 - 3]
    assert on.iterations["pages_shared_saved"].tolist() == [3, 3]
    assert on.requests["prefix_hit_tokens"].tolist() == [0, 48]
    assert on.requests["saved_prefill_tokens"].tolist() == [0, 48]
    assert on.summary["prefix_hit_rate"] == pytest.approx(48 / 124)
    assert on.summary["saved_prefill_tokens"] == 48
    # each request still holds its whole context: the shared pages count toward both
    assert on.requests["max_used_pages"].tolist() == off.requests["max_used_pages"].tolist() == [5, 4]
    assert on.params["prefix_caching"] and on.params["prefix_blocks"] == "hash_ids"
    assert off.summary["prefix_hit_rate"] == 0.0 and "prefix_hit_tokens" not in off.requests.columns


def test_a_finished_requests_blocks_stay_cached_and_count_toward_the_hitter():
    on = simulate(_two(arrival_b=10.0), "vllm", pool_pages=100, watermark_frac=0.0, prefix_caching=True, **RUN)
    it = on.iterations.set_index("iteration")
    b_iter = int(on.requests["admitted_iter"].iloc[1])
    # A freed 5 pages, 4 of them holding blocks 0-3; B takes 3 of them back from the free queue
    # and one new page (the queue's head, which caches nothing), leaving block 3's page cached.
    assert it.loc[b_iter, "prefill_tokens"] == 12
    assert it.loc[b_iter, "pages_used"] == 4
    assert it.loc[b_iter, "pages_cached"] == 1
    assert it.loc[b_iter, "pages_shared_saved"] == 0
    assert it.loc[b_iter - 1, "pages_cached"] == 0  # A's last iteration: its blocks are still held


def test_a_hit_leaves_at_least_one_token_to_compute():
    wl = pd.DataFrame({"prompt_tokens": [64, 48], "output_tokens": [1, 1], "arrival_s": [0.0, 5.0],
                       "hash_ids": [[0, 1, 2, 3], [0, 1, 2]]})
    on = simulate(wl, "vllm", pool_pages=100, watermark_frac=0.0, prefix_caching=True, **RUN)
    # B's 3 blocks are all cached, but it must compute its last token: (48 - 1) // 16 = 2 blocks hit
    assert on.requests["prefix_hit_tokens"].tolist() == [0, 32]
    assert on.iterations["prefill_tokens"].tolist() == [64, 16]


def test_fast_engine_simulates_prefix_caching_compiled():
    res = simulate(_two(), "vllm", model="Llama-3-8B", gpu="H100-SXM", pool_pages=100, block_size=BS,
                   hash_block_tokens=BS, prefix_caching=True, watermark_frac=0.0, record_iterations=True)
    assert res.params["engine"] == "fast"
    # the hand-worked case of the first test, on the compiled loop
    assert res.iterations["prefill_tokens"].tolist() == [64 + 12, 0]
    assert res.iterations["pages_used"].tolist() == [8 - 3, 9 - 3]
    assert res.iterations["pages_shared_saved"].tolist() == [3, 3]
    assert res.requests["prefix_hit_tokens"].tolist() == [0, 48]
    plain = simulate(_two(), "vllm", model="Llama-3-8B", gpu="H100-SXM", pool_pages=100, block_size=BS)
    assert plain.params["engine"] == "fast" and not plain.params["prefix_caching"]
    with pytest.raises(ValueError, match="recompute only"):
        simulate(_two(), "vllm", model="Llama-3-8B", gpu="H100-SXM", prefix_caching=True, preemption_mode="swap")


def test_free_queue_is_lru_and_frees_tail_blocks_first():
    keys = [np.array([10, 11, 12]), np.array([10, 11, 12])]
    pool = PrefixPool(num_pages=4, blocks=block_ids(keys, np.array([3, 3])))
    assert pool.allocate([0], [3]).tolist() == [0, 1, 2]
    pool.cache_blocks(0, 3)
    pool.release(0)  # last block first: 2, 1, 0 go to the queue's tail after the untouched page 3
    assert pool.free_queue().tolist() == [3, 2, 1, 0]
    assert pool.num_cached_free_pages == 3 and pool.num_free_pages == 4
    assert pool.match(1, 3) == (3, 0)
    # two new pages: the never-used page 3, then page 2, evicting block 12 (A's tail)
    assert pool.allocate([1], [2]).tolist() == [3, 2]
    assert pool.match(0, 3) == (2, 0)
    assert pool.num_cached_free_pages == 2
    pool.check()


def test_shared_page_is_freed_only_by_its_last_referencer():
    keys = [np.array([5, 6]), np.array([5, 6])]
    pool = PrefixPool(num_pages=6, blocks=block_ids(keys, np.array([3, 3])))
    pool.allocate([0], [3])
    pool.cache_blocks(0, 2)
    hit, shared = pool.match(1, 2)
    assert (hit, shared) == (2, 2)
    pool.take_hits(1, 2)
    assert pool.block_table(1).tolist() == [0, 1] and pool.ref[:3].tolist() == [2, 2, 1]
    assert pool.num_used_pages == 3 and pool.num_shared_saved_pages == 2
    pool.release(0)
    assert pool.free_queue().tolist() == [3, 4, 5, 2]  # only A's own page is freed
    assert pool.ref[:2].tolist() == [1, 1]
    pool.check()
    pool.release(1)
    assert pool.free_queue().tolist() == [3, 4, 5, 2, 1, 0] and pool.num_cached_free_pages == 2
    pool.check()


def test_mooncake_hash_ids_are_reblocked_to_the_servers_block_size():
    wl = pd.DataFrame({"prompt_tokens": [1100, 530], "output_tokens": [1, 1], "hash_ids": [[7, 8, 9], [7, 4]]})
    keys, source = shared_keys(wl, block_size=256, hash_block_tokens=512)
    assert source == "hash_ids"
    # 1100 tokens fill 4 blocks of 256: (7,0) (7,1) (8,0) (8,1); 530 fill 2: (7,0) (7,1);
    # the ids 4 7 8 9 are made dense first (7 -> 1, 8 -> 2): keys 2 x 1 + sub-block, 2 x 2 + sub-block
    assert keys[0].tolist() == [2, 3, 4, 5] and keys[1].tolist() == [2, 3]
    ids = block_ids(keys, np.array([5, 3]))
    assert ids.of(0)[:2].tolist() == ids.of(1)[:2].tolist()
    assert len(set(ids.of(0).tolist()) | set(ids.of(1).tolist())) == 5 + 1  # only the two shared
    with pytest.raises(ValueError, match="does not divide"):
        shared_keys(wl, block_size=48, hash_block_tokens=512)


def test_prefix_model_shares_the_system_prompt_blocks():
    wl = pd.DataFrame({"prompt_tokens": [100, 40, 100], "output_tokens": [1, 1, 1]})
    keys, source = shared_keys(wl, block_size=16, model=PrefixModel(system_prompt_tokens=64, system_prompt_share=1.0))
    assert source == "prefix model"
    assert [k.tolist() for k in keys] == [[0, 1, 2, 3], [0, 1], [0, 1, 2, 3]]
    assert shared_keys(wl, block_size=16)[1] == "none"


# ----------------------------------------------------------------------------- properties
class _Checked(ReferenceEngine):
    """The reference engine, with the pool checked after every iteration."""

    def _execute(self, step) -> None:
        super()._execute(step)
        pool = self.pool
        pool.check()  # refs == block-table counts, no referenced page in the free queue, conservation
        cached_free = int(((pool.ref == 0) & (pool.block_of != NONE)).sum())
        plain_free = int(((pool.ref == 0) & (pool.block_of == NONE)).sum())
        owned = int((pool.ref > 0).sum())
        assert plain_free + cached_free + owned == pool.num_pages
        for req in self.running:
            table = pool.block_table(req.index)
            ids = pool.blocks.of(req.index)[:table.size]
            held = pool.block_of[table]
            # a page that caches a block holds the block this request reads there
            assert ((held == NONE) | (held == ids)).all()
            assert table.size * self.block_size >= req.computed_tokens


_trees = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=6), min_size=2, max_size=12)


@settings(max_examples=40, deadline=None)
@given(paths=_trees, data=st.data())
def test_no_shared_page_is_freed_while_referenced_and_pages_are_conserved(paths, data):
    n = len(paths)
    # hash ids as paths in a small tree: equal prefixes of paths are equal block prefixes
    node: dict[tuple, int] = {}
    ids = [[node.setdefault(tuple(p[:j + 1]), len(node)) for j in range(len(p))] for p in paths]
    prompt = [max(1, len(p) * BS + data.draw(st.integers(-BS + 1, BS))) for p in paths]
    wl = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": data.draw(st.lists(st.integers(1, 160), min_size=n,
                                                                                    max_size=n)),
                       "arrival_s": np.sort(data.draw(st.lists(st.floats(0, 0.05), min_size=n, max_size=n))),
                       "hash_ids": ids})
    pool_pages = data.draw(st.integers(6, 16))
    policy = data.draw(st.sampled_from(["vllm", "vllm", "tgi", "reserve_max", "sglang"]))
    scheduler = data.draw(st.sampled_from(["chunked", "prefill_first"]))
    budget = data.draw(st.sampled_from([16, 48, 256]))
    original = sim.ReferenceEngine
    sim.ReferenceEngine = _Checked
    try:
        res = simulate(wl, policy, pool_pages=pool_pages, scheduler=scheduler, max_num_batched_tokens=budget,
                       prefix_caching=True, max_new_tokens=160, **RUN)
    finally:
        sim.ReferenceEngine = original
    rq = res.requests
    assert (rq["prefix_hit_tokens"] <= np.maximum(rq["prompt_tokens"] - 1, 0)).all()
    assert (rq["prefix_hit_tokens"] % BS == 0).all() and (rq["saved_prefill_tokens"] >= rq["prefix_hit_tokens"]).all()
    it = res.iterations
    assert (it["pages_used"] + it["pages_cached"] <= pool_pages).all()


@settings(max_examples=25, deadline=None)
@given(prompt=st.lists(st.integers(1, 200), min_size=1, max_size=10), data=st.data())
def test_caching_without_shared_blocks_or_preemption_changes_nothing(prompt, data):
    n = len(prompt)
    wl = pd.DataFrame({"prompt_tokens": prompt,
                       "output_tokens": data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)),
                       "arrival_s": np.sort(data.draw(st.lists(st.floats(0, 0.1), min_size=n, max_size=n)))})
    kw = dict(RUN, pool_pages=10_000, max_num_batched_tokens=data.draw(st.sampled_from([16, 64, 512])))
    off = simulate(wl, "vllm", **kw)
    on = simulate(wl, "vllm", prefix_caching=True, **kw)
    assert on.summary["prefix_hit_rate"] == 0.0
    pd.testing.assert_frame_equal(on.requests.drop(columns=["prefix_hit_tokens", "saved_prefill_tokens"]),
                                  off.requests)
    pd.testing.assert_frame_equal(on.iterations.drop(columns=["pages_cached", "pages_shared_saved"]),
                                  off.iterations)


@settings(max_examples=25, deadline=None)
@given(paths=_trees, data=st.data())
def test_sequential_requests_hit_their_longest_previously_seen_prefix(paths, data):
    """Requests that never overlap, in a pool that never evicts: each hits the longest run of its
    leading full prompt blocks that an earlier request's prompt filled (a second, set-based
    implementation), at most (prompt - 1) // block_size blocks."""
    node: dict[tuple, int] = {}
    ids = [[node.setdefault(tuple(p[:j + 1]), len(node)) for j in range(len(p))] for p in paths]
    prompt = [max(1, len(p) * BS + data.draw(st.integers(-BS + 1, BS))) for p in paths]
    n = len(paths)
    wl = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": [1] * n, "arrival_s": np.arange(n) * 100.0,
                       "hash_ids": ids})
    res = simulate(wl, "vllm", pool_pages=10_000, prefix_caching=True, watermark_frac=0.0, **RUN)
    seen: set[int] = set()
    expected = []
    for p, h in zip(prompt, ids):
        full = h[:p // BS]
        hit = 0
        while hit < min(len(full), (p - 1) // BS) and full[hit] in seen:
            hit += 1
        expected.append(hit * BS)
        seen.update(full)
    assert res.requests["prefix_hit_tokens"].tolist() == expected
    assert res.summary["prefix_hit_rate"] == pytest.approx(sum(expected) / sum(prompt))


def test_recommend_simulates_the_servers_prefix_cache_on_a_trace_with_hash_ids():
    from kvlab.recommend import recommend, settings
    from kvlab.recommend.core import render_text

    rng = np.random.default_rng(1)
    n = 120
    prompt = rng.integers(2100, 2600, n)
    # every prompt starts with the same 4 Mooncake blocks (2,048 tokens); the rest is its own
    own = np.cumsum([0, *[p // 512 + 1 - 4 for p in prompt[:-1]]]) + 4
    hash_ids = [[0, 1, 2, 3, *range(o, o + int(p) // 512 + 1 - 4)] for o, p in zip(own, prompt)]
    trace = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": rng.integers(5, 40, n),
                          "arrival_s": np.arange(n) * 2.0 + rng.uniform(0, 0.5, n), "hash_ids": hash_ids})
    kw = dict(model="Llama-2-7B", gpu="A100-40GB", num_windows=1, window_requests=n)
    base = settings("vllm", model="Llama-2-7B", gpu="A100-40GB")[:1]
    assert base[0].prefix_caching  # vLLM V1 runs its prefix cache by default
    rec = recommend(trace, candidates=base, **kw)
    row = rec.table.iloc[0]
    assert row["prefix_caching"]
    # requests 2 s apart never miss the shared 2,048 tokens after the first (no eviction: the
    # pool holds 2,873 pages, a request at most 170)
    assert row["prefix_hit_rate"] == pytest.approx((n - 1) * 2048 / prompt.sum())
    assert row["hit_pages"] == (n - 1) * 2048 // 16
    text = " ".join(render_text(rec).split())
    assert f"{(n - 1) * 2048 / prompt.sum():.1%} of prompt tokens hit" in text
    plain = recommend(trace.drop(columns="hash_ids"), candidates=base, **kw)
    assert not plain.table.iloc[0]["prefix_caching"] and plain.table.iloc[0]["prefix_hit_rate"] == 0.0
    assert "prompt tokens hit" not in " ".join(render_text(plain).split())
    assert any("no block identities" in w for w in plain.warnings)
    assert "simulated from the trace's hash_ids" in text and not any("no block identities" in w for w in rec.warnings)


def test_prefix_model_sessions_extend_one_stream_and_a_cut_history_starts_a_new_one():
    # session "a": turn 2's prompt (80) extends turn 1's context (32 + 16); turn 3's (40) is shorter than
    # turn 2's context (80 + 8): its history was cut, so it starts a new stream. "b" is its own.
    wl = pd.DataFrame({"prompt_tokens": [32, 80, 40, 64], "output_tokens": [16, 8, 4, 4],
                       "arrival_s": [0.0, 5.0, 9.0, 1.0], "session": ["a", "a", "a", "b"]})
    keys, _ = shared_keys(wl, block_size=16, model=PrefixModel(session_column="session"))
    assert keys[1][:2].tolist() == keys[0].tolist() and keys[1].size == 5
    assert not set(keys[2].tolist()) & set(keys[1].tolist())
    assert not set(keys[3].tolist()) & (set(keys[0].tolist()) | set(keys[1].tolist()) | set(keys[2].tolist()))
    res = simulate(wl, "vllm", pool_pages=100, prefix_caching=True, prefix_model=PrefixModel(session_column="session"),
                   **RUN)
    # turn 2 finds turn 1's two prompt blocks; nobody else hits
    assert res.requests["prefix_hit_tokens"].tolist() == [0, 32, 0, 0]


MOONCAKE = SHARED_DATA_DIR / "traces" / "mooncake_synthetic.jsonl"


@pytest.mark.skipif(not MOONCAKE.exists(), reason="needs ../shared/data/traces/mooncake_synthetic.jsonl")
def test_mooncake_trace_in_a_pool_that_never_evicts_hits_every_previously_seen_prefix():
    """FAST'25 synthetic trace on Llama-3-8B (prompts of 8,192 tokens or more refused): with 256,000
    pages nothing is evicted, so each request's hit is the longest run of its re-blocked
    (hash id, sub-block) keys that an earlier admitted request's prompt filled."""
    trace = load(MOONCAKE)
    res = simulate(trace, "vllm", model="Llama-3-8B", gpu="H100-SXM", prefix_caching=True, pool_pages=256_000,
                   max_num_batched_tokens=8192, max_num_seqs=1024, watermark_frac=0.0)
    admitted = (res.requests["admitted_iter"] >= 0).to_numpy()
    seen: set[tuple[int, int]] = set()
    expected = np.zeros(len(trace), dtype=np.int64)
    for i, (p, h) in enumerate(zip(trace["prompt_tokens"], trace["hash_ids"])):
        if not admitted[i]:
            continue
        keys = [(h[k // 32], k % 32) for k in range(min(p // 16, len(h) * 32))]
        j = 0
        while j < min(len(keys), (p - 1) // 16) and keys[j] in seen:
            j += 1
        expected[i] = j * 16
        seen.update(keys)
    assert (res.requests["prefix_hit_tokens"].to_numpy() == expected).all()
    assert res.summary["prefix_hit_rate"] == pytest.approx(expected.sum() / trace["prompt_tokens"][admitted].sum())


def test_recommend_does_not_compare_a_setting_stripped_of_its_prefix_cache():
    """vLLM's host tier is priced as a swap, which the prefix cache cannot run with: on a trace
    with hash_ids that row would be simulated without the cache the server keeps, so it is left
    out and said so; without hash_ids nobody caches and it is searched as before."""
    from kvlab.recommend import recommend, settings

    rng = np.random.default_rng(2)
    n = 60
    prompt = rng.integers(600, 1000, n)
    trace = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": rng.integers(5, 30, n),
                          "arrival_s": np.arange(n) * 1.0 + rng.uniform(0, 0.5, n),
                          "hash_ids": [[0, *range(1 + 2 * k, 3 + 2 * k)] for k in range(n)]})
    every = settings("vllm", model="Llama-2-7B", gpu="A100-40GB")
    offload = [s for s in every if s.knob == "kv_offloading_size"]
    assert offload and offload[0].preemption_mode != "recompute"
    candidates = [every[0], offload[0]]
    kw = dict(model="Llama-2-7B", gpu="A100-40GB", num_windows=1, window_requests=n)
    rec = recommend(trace, candidates=candidates, **kw)
    assert list(rec.table["setting"]) == [every[0].label]
    assert any(w.startswith(f"not searched: {offload[0].label}") for w in rec.warnings)
    plain = recommend(trace.drop(columns="hash_ids"), candidates=candidates, **kw)
    assert list(plain.table["setting"]) == [every[0].label, offload[0].label]
