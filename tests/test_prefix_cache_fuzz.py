"""Differential fuzz of prefix caching: the compiled loop's prefix cache against the reference engine's.

Hypothesis draws workloads whose requests share prefixes (a few prompt templates, each request
keeping a drawn number of a template's leading hash blocks, the rest its own), with hash blocks
of one to three pages, pools of a few pages (so cached blocks are evicted and requests preempted
and readmitted onto their own cached blocks), block sizes that are not powers of two, every
registered policy, chunked and prefill-first scheduling, recompute preemption (the only mode
caching allows). Both paths through the compiled loop (compiled forms, and
``KVLAB_COMPILED_FORMS=0``) must give the reference engine's request *and* iteration tables,
prefix columns included (``prefix_hit_tokens``, ``saved_prefill_tokens``, ``pages_cached``,
``pages_shared_saved``), and the same refusal where the reference refuses.
"""
from __future__ import annotations

import dataclasses
import os

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvlab.costmodel import roofline
from kvlab.policies import policy_names
from kvlab.sim import simulate
from kvlab.sim.config import SCHEDULERS

from test_differential_fuzz import FAST_PATHS, _assert_same as assert_same_columns

COST = dataclasses.replace(roofline("Llama-2-7B", "A100-80GB-SXM"), iteration_overhead_s=0.002)
POLICY_PARAMS = {
    "vllm": lambda: st.fixed_dictionaries({"watermark_frac": st.sampled_from([0.0, 0.01, 0.2])}),
    "tgi": lambda: st.fixed_dictionaries({"cap_tokens": st.integers(1, 40)}),
    "predicted": lambda: st.fixed_dictionaries({"queue_order": st.sampled_from(["fcfs", "shortest_predicted", "tie"])}),
}
EXAMPLES = int(os.environ.get("KVLAB_PREFIX_FUZZ_EXAMPLES", "300"))


@st.composite
def cases(draw):
    """A workload with shared prefixes (``hash_ids``) and a configuration that stresses the pool."""
    n = draw(st.integers(1, 20))
    bs = draw(st.sampled_from([1, 3, 4, 5, 8, 16]))
    hash_tokens = bs * draw(st.integers(1, 3))
    prompt = draw(st.lists(st.integers(1, 90), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    arrival = draw(st.lists(st.integers(0, 10).map(lambda t: t * 0.02), min_size=n, max_size=n))
    hash_ids, fresh = [], 1000
    for p in prompt:
        blocks = -(-p // hash_tokens)
        template, keep = draw(st.integers(0, 2)), draw(st.integers(0, blocks))
        own = list(range(fresh, fresh + blocks - keep))
        fresh += blocks - keep
        hash_ids.append([100 * template + j for j in range(keep)] + own)
    policy = draw(st.sampled_from(sorted(policy_names())))
    kw = dict(block_size=bs, hash_block_tokens=hash_tokens, pool_pages=draw(st.integers(1, 60)),
              scheduler=draw(st.sampled_from(SCHEDULERS)),
              max_new_tokens=draw(st.integers(1, 80)),
              max_num_seqs=draw(st.integers(1, 10)), max_num_batched_tokens=bs * draw(st.integers(1, 12)),
              seed=draw(st.integers(0, 3)))
    if draw(st.booleans()):
        kw["max_model_len"] = draw(st.integers(2, 160))
    kw["async_scheduling"] = draw(st.booleans())  # vLLM V1's default: finished requests hold their pages longer
    params = draw(POLICY_PARAMS[policy]()) if policy in POLICY_PARAMS else {}
    work = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output, "arrival_s": arrival,
                         "hash_ids": hash_ids})
    return work, policy, {**kw, **params}


def _run(work: pd.DataFrame, policy: str, engine: str, kw: dict):
    """The result, or the error's type and first clause where the engine refuses."""
    try:
        return simulate(work, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", engine=engine, cost_model=COST,
                        prefix_caching=True, record_iterations=True, **kw)
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc).split(':')[0]}"


def _assert_same_table(ref: pd.DataFrame, got: pd.DataFrame, what: str) -> None:
    """The differential fuzz's comparison of one table, and the same dtypes column by column."""
    assert [ref[c].dtype for c in ref.columns] == [got[c].dtype for c in got.columns], what
    assert_same_columns(ref, got, what)


def _assert_same(ref, got, what: str) -> None:
    if isinstance(ref, str) or isinstance(got, str):
        assert ref == got, what
        return
    assert got.params["engine"] == "fast" and ref.params["engine"] == "reference", what
    _assert_same_table(ref.requests, got.requests, f"requests, {what}")
    _assert_same_table(ref.iterations, got.iterations, f"iterations, {what}")


@pytest.mark.filterwarnings("ignore:max_new_tokens .* exceeds max_model_len")
@pytest.mark.parametrize("path", sorted(FAST_PATHS))
def test_compiled_prefix_cache_equals_the_reference(path, monkeypatch):
    for var, value in FAST_PATHS[path].items():
        monkeypatch.setenv(var, value)

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None)
    @given(case=cases())
    def check(case):
        work, policy, kw = case
        what = f"{path} loop, {policy}, {kw}, workload {work.to_dict(orient='list')}"
        _assert_same(_run(work, policy, "reference", kw), _run(work, policy, "fast", kw), what)

    check()


@pytest.mark.filterwarnings("ignore:max_new_tokens .* exceeds max_model_len")
def test_the_fuzz_reaches_hits_evictions_and_preemptions():
    """Within the budget the cases hit the cache, evict cached blocks (a hit lost), preempt and
    readmit onto cached blocks (saved > first hit), share pages, and use non-power-of-two blocks."""
    seen = dict(ran=0, hit=0, readmitted_hit=0, shared=0, cached_free=0, odd_block=0, prefill_first=0,
                prefill_first_chunked=0)

    @settings(max_examples=min(EXAMPLES, 120), derandomize=True, deadline=None, database=None)
    @given(case=cases())
    def record(case):
        work, policy, kw = case
        res = _run(work, policy, "reference", kw)
        seen["odd_block"] += kw["block_size"] & (kw["block_size"] - 1) != 0
        seen["prefill_first"] += kw["scheduler"] == "prefill_first"
        seen["prefill_first_chunked"] += kw["scheduler"] == "prefill_first_chunked"
        if isinstance(res, str):
            return
        r, it = res.requests, res.iterations
        seen["ran"] += 1
        seen["hit"] += int((r["prefix_hit_tokens"] > 0).any())
        seen["readmitted_hit"] += int((r["saved_prefill_tokens"] > r["prefix_hit_tokens"]).any())
        seen["shared"] += int((it["pages_shared_saved"] > 0).any())
        seen["cached_free"] += int((it["pages_cached"] > 0).any())

    record()
    assert min(seen.values()) > 0 and seen["ran"] > 0.8 * min(EXAMPLES, 120), seen
