"""Hypothesis invariants of the reference engine on random workloads and configurations."""
from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from kvlab.costmodel import roofline
from kvlab.policies import policy_names
from kvlab.reservation import pages_for
from kvlab.sim import RequestStatus, simulate
from kvlab.sim.config import SCHEDULERS
from kvlab.sim.reference import ReferenceEngine

COST = dataclasses.replace(roofline("Llama-2-7B", "A100-80GB-SXM"), iteration_overhead_s=0.01)
NEVER_PREEMPT = {"reserve_max", "orca_oracle", "orca_pow2", "orca_max"}

_execute = ReferenceEngine._execute


def _checked_execute(self, step):
    """Before and after each iteration: the pool agrees with the requests, and never overflows."""
    for phase in ("scheduled", "executed"):
        pool = self.pool
        pool.check()  # counters == page table, committed <= pool
        assert pool.num_used_pages <= pool.num_pages
        held = 0
        for r in self.requests:
            used = pool.used_pages(r.index)
            if r.status == RequestStatus.RUNNING:
                chunk = step.chunks.get(r, 0) if phase == "scheduled" else 0
                assert used == int(pages_for(r.computed_tokens + chunk, self.block_size)), r
            else:
                assert used == 0 and pool.reserved_pages(r.index) == 0, r
            held += used
        assert held == pool.num_used_pages  # pages conserved
        assert sum(r.cpu_pages for r in self.swapped) == self.cpu_pages_used <= self.swap_cfg.cpu_pool_pages
        if phase == "scheduled":
            assert sum(step.chunks.values()) <= self.cfg.max_num_batched_tokens
            assert len(self.running) <= self.cfg.max_num_seqs
            _execute(self, step)


configs = st.fixed_dictionaries({
    "policy": st.sampled_from(policy_names()),
    "preemption_mode": st.sampled_from(["recompute", "swap", "reject"]),
    "scheduler": st.sampled_from(SCHEDULERS),
    "block_size": st.sampled_from([1, 2, 4, 8]),
    "pool_pages": st.integers(1, 40),
    "max_new_tokens": st.integers(1, 48),
    "max_num_seqs": st.integers(1, 6),
    "budget_pages": st.integers(1, 8),
    "cpu_pool_pages": st.integers(0, 12),
    "seed": st.integers(0, 3),
})
workloads = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60), st.floats(0, 0.2)), min_size=1, max_size=10)


@settings(max_examples=200)
@given(configs, workloads)
def test_invariants_hold_on_random_cases(cfg, rows):
    cfg = dict(cfg)
    w = pd.DataFrame(rows, columns=["prompt_tokens", "output_tokens", "arrival_s"])
    policy = cfg.pop("policy")
    extra = {"max_model_len": 64} if policy == "orca_max" else {}
    if policy == "tgi":
        extra = {"cap_tokens": 8}
    budget = cfg.pop("budget_pages") * cfg["block_size"]
    # The per-iteration checks hook the reference engine (the fast one matches it exactly:
    # tests/test_sim_fast_equivalence.py); the spy proves they ran.
    with mock.patch.object(ReferenceEngine, "_execute", side_effect=_checked_execute, autospec=True) as spy:
        res = simulate(w, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=COST, engine="reference",
                       max_num_batched_tokens=budget, record_iterations=True, **cfg, **extra)
    assert spy.call_count == len(res.iterations) > 0
    t = res.requests
    done = t["outcome"] != "finished_aborted"
    # every request finishes, or is aborted with a reason
    assert t["outcome"].str.startswith("finished").all()
    assert (t.loc[~done, "abort_reason"] != "").all() and (t.loc[done, "abort_reason"] == "").all()
    # tokens generated equal the workload's output lengths, capped at max_new_tokens
    expected = np.minimum(w["output_tokens"], cfg["max_new_tokens"])
    if "max_model_len" in extra:  # it also caps each output at the context left after its prompt
        expected = np.minimum(expected, extra["max_model_len"] - w["prompt_tokens"])
    assert (t.loc[done, "generated_tokens"] == expected[done]).all()
    assert (t.loc[~done, "generated_tokens"] <= expected[~done]).all()
    # reservation policies that cover the whole request never preempt
    if policy in NEVER_PREEMPT:
        assert (t["num_preemptions"] == 0).all() and (res.iterations["num_preempted"] == 0).all()
        assert not (t["abort_reason"] == "preempted_rejected").any()
    if cfg["preemption_mode"] != "swap":
        assert (t["num_swaps"] == 0).all()
    # time only moves forward; events are ordered
    it = res.iterations
    assert (it["duration_s"] >= 0).all() and (np.diff(it["start_s"]) >= 0).all()
    ok = t[done]
    assert (ok["admitted_iter"] <= ok["first_token_iter"]).all()
    assert (ok["first_token_iter"] <= ok["finish_iter"]).all()
    assert (ok["first_token_s"] >= ok["arrival_s"]).all()
    assert (it["pages_used"] <= cfg["pool_pages"]).all() and (it["pages_reserved"] <= cfg["pool_pages"]).all()
