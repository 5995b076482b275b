"""Differential fuzz: every fast path of the simulator against the reference engine, request by request.

Hypothesis draws workloads and configurations the hand-picked equivalence cases do not: rows out of
arrival order, tied arrivals, every registered policy with its own parameters, block sizes that are
not powers of two, recompute / swap / reject, pools of a few pages, context caps that cut outputs or
refuse prompts, chunked and prefill-first scheduling. Both paths through the compiled loop (its
compiled forms of the policies' rules and the cost model, and ``KVLAB_COMPILED_FORMS=0``, which
asks Python every question) must give the reference engine's request table: the same integers,
the same times to 1e-9, and the same refusal where the reference refuses.

The normal run draws a fixed budget of cases per fast path (``KVLAB_FUZZ_EXAMPLES``, default 400,
derandomized so CI is repeatable); the ``nightly`` profile (``KVLAB_FUZZ_PROFILE=nightly``) draws
20,000 per path from a fresh seed. A new fast path joins by adding its switch to ``FAST_PATHS``.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvlab.costmodel import roofline
from kvlab.policies import policy_names
from kvlab.sim import simulate
from kvlab.sim.config import SCHEDULERS

COST = dataclasses.replace(roofline("Llama-2-7B", "A100-80GB-SXM"), iteration_overhead_s=0.002)
#: Fast paths by the environment that selects them (the compiled loop is the default where it applies).
FAST_PATHS = {"compiled": {"KVLAB_COMPILED_FORMS": "1"}, "asks": {"KVLAB_COMPILED_FORMS": "0"}}
#: Policy parameters drawn per policy (the registry's other policies take none).
POLICY_PARAMS = {
    "vllm": lambda: st.fixed_dictionaries({"watermark_frac": st.sampled_from([0.0, 0.01, 0.2])}),
    "tgi": lambda: st.fixed_dictionaries({"cap_tokens": st.integers(1, 40)}),
    "orca_max": lambda: st.fixed_dictionaries({}),
    "predicted": lambda: st.fixed_dictionaries({"queue_order": st.sampled_from(["fcfs", "shortest_predicted", "tie"])}),
}
EXAMPLES = int(os.environ.get("KVLAB_FUZZ_EXAMPLES", "400"))
settings.register_profile("fuzz-ci", max_examples=EXAMPLES, derandomize=True, deadline=None, database=None)
settings.register_profile("fuzz-nightly", max_examples=20_000, deadline=None)
PROFILE = "fuzz-nightly" if os.environ.get("KVLAB_FUZZ_PROFILE") == "nightly" else "fuzz-ci"


@st.composite
def cases(draw):
    """A workload (rows in any order, ties allowed) and a configuration that stresses the pool."""
    n = draw(st.integers(1, 24))
    prompt = draw(st.lists(st.integers(1, 90), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 90), min_size=n, max_size=n))
    # arrivals on a coarse grid (ties are common), in any row order
    arrival = draw(st.lists(st.integers(0, 12).map(lambda t: t * 0.025), min_size=n, max_size=n))
    policy = draw(st.sampled_from(sorted(policy_names())))
    bs = draw(st.sampled_from([1, 3, 4, 7, 8, 12, 16]))
    kw = dict(block_size=bs, pool_pages=draw(st.integers(1, 48)),
              scheduler=draw(st.sampled_from(SCHEDULERS)),
              preemption_mode=draw(st.sampled_from(["recompute", "swap", "reject"])),
              max_new_tokens=draw(st.integers(1, 120)), max_num_seqs=draw(st.integers(1, 12)),
              max_num_batched_tokens=bs * draw(st.integers(1, 12)), cpu_pool_pages=draw(st.integers(0, 24)),
              seed=draw(st.integers(0, 3)))
    if draw(st.booleans()):
        kw["max_model_len"] = draw(st.integers(2, 160))  # cuts outputs, refuses the longest prompts
    params = draw(POLICY_PARAMS[policy]()) if policy in POLICY_PARAMS else {}
    work = pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output, "arrival_s": arrival})
    return work, policy, {**kw, **params}


def _run(work: pd.DataFrame, policy: str, engine: str, kw: dict):
    """The request table, or the error's type and first clause where the engine refuses."""
    try:
        res = simulate(work, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", engine=engine, cost_model=COST, **kw)
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc).split(':')[0]}"
    return res.requests.sort_values("request_id", kind="stable").reset_index(drop=True)


def _assert_same(ref, got, what: str) -> None:
    if isinstance(ref, str) or isinstance(got, str):
        assert ref == got, what
        return
    assert list(ref.columns) == list(got.columns), what
    for col in ref.columns:
        x, y = ref[col].to_numpy(), got[col].to_numpy()
        if x.dtype.kind == "f":
            np.testing.assert_allclose(y, x, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=f"{what}: {col}")
        else:
            np.testing.assert_array_equal(y, x, err_msg=f"{what}: {col}")


@pytest.mark.parametrize("path", sorted(FAST_PATHS))
def test_every_fast_path_equals_the_reference(path, monkeypatch):
    for var, value in FAST_PATHS[path].items():
        monkeypatch.setenv(var, value)

    @settings(settings.get_profile(PROFILE))
    @given(case=cases())
    def check(case):
        work, policy, kw = case
        what = f"{path} loop, {policy}, {kw}, workload {work.to_dict(orient='list')}"
        _assert_same(_run(work, policy, "reference", kw), _run(work, policy, "fast", kw), what)

    check()


def test_the_fuzz_draws_what_it_promises():
    """The strategy reaches unsorted rows, ties, non-power-of-two pages, context caps and every
    policy and mode within the CI budget (so a path it claims to cover is really drawn)."""
    seen = {"unsorted": 0, "tied": 0, "odd_block": 0, "capped": 0, "policies": set(), "modes": set()}

    @settings(max_examples=min(EXAMPLES, 300), derandomize=True, deadline=None, database=None)
    @given(case=cases())
    def record(case):
        work, policy, kw = case
        a = work["arrival_s"].to_numpy()
        seen["unsorted"] += bool((np.diff(a) < 0).any())
        seen["tied"] += len(np.unique(a)) < len(a)
        seen["odd_block"] += kw["block_size"] & (kw["block_size"] - 1) != 0
        seen["capped"] += "max_model_len" in kw
        seen["policies"].add(policy)
        seen["modes"].add(kw["preemption_mode"])

    record()
    assert min(seen["unsorted"], seen["tied"], seen["odd_block"], seen["capped"]) > 0, seen
    assert seen["policies"] == set(policy_names()) and seen["modes"] == {"recompute", "swap", "reject"}
