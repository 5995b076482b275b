"""A serving system kvlab does not ship, written in this file: the compiled loop runs it (asking
Python the rules it writes itself) and equals the reference engine."""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import roofline
from kvlab.lengths import profile
from kvlab.policies import Policy, Requests, policy_names
from kvlab.sim import simulate

from test_sim_fast_equivalence import assert_same, random_case

COST = dataclasses.replace(roofline("Llama-2-7B", "A100-80GB-SXM"), iteration_overhead_s=0.01)
SETUP = {"model": "Llama-2-7B", "gpu": "A100-80GB-SXM", "cost_model": COST, "record_iterations": True}


class HalfHeadroom(Policy):
    """Reserve the context, keep 1/20 of the pool free at admission, grow on demand (vLLM's rule, retold)."""

    name = "test_half_headroom"
    on_demand = True

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + reqs.generated_tokens

    def admission_headroom_pages(self, reqs: Requests) -> Any:
        return self.num_pages // 20


class FewestDecodedVictim(HalfHeadroom):
    """As above, but preempt the running request that has generated the fewest tokens (newest on ties)."""

    name = "test_fewest_decoded"

    def choose_victim(self, running: Requests) -> int:
        g = np.asarray(running.generated_tokens)
        return int(g.size - 1 - np.argmin(g[::-1]))


class CountingRatio(Policy):
    """Admission charged like SGLang's with a ratio that halves after each preempting iteration."""

    name = "test_counting_ratio"
    on_demand = True

    def __init__(self) -> None:
        super().__init__()
        self.ratio = Fraction(1, 2)
        self.iterations = 0

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + reqs.generated_tokens

    def can_admit(self, reqs: Requests, *, free_pages: Any, running: Requests | None) -> Any:
        future = self.max_new_tokens - reqs.generated_tokens
        if running is not None and running.size:
            future = future + int(running.xp.sum(self.max_new_tokens - running.generated_tokens))
        charge = -(-future * self.ratio.numerator // self.ratio.denominator)
        return reqs.prompt_tokens + reqs.generated_tokens + charge <= free_pages * self.block_size

    def end_schedule(self, *, num_preempted: int, running: Requests, num_iterations: int = 1) -> None:
        self.iterations += num_iterations
        self.ratio = self.ratio / 2 if num_preempted else min(Fraction(1), self.ratio + Fraction(num_iterations, 64))


def test_test_policies_are_not_registered():
    assert not {"test_half_headroom", "test_fewest_decoded", "test_counting_ratio"} & set(policy_names())


@pytest.mark.parametrize("cls", [HalfHeadroom, FewestDecodedVictim, CountingRatio])
def test_new_policy_equals_reference_on_random_cases(cls, fast_loop):
    for seed in range(40):
        w, _, kw = random_case(seed)
        kw = {k: v for k, v in kw.items() if k not in ("max_model_len", "cap_tokens", "queue_order", "watermark_frac")}
        kw.pop("cost_model")
        out = []
        for engine in ("reference", "fast"):
            try:
                out.append(simulate(w, cls(), engine=engine, **SETUP, **kw))
            except RuntimeError as exc:
                out.append(f"RuntimeError: {str(exc).split(':')[0]}")
        assert_same(*out)


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_new_policy_runs_compiled_without_asking_and_matches_vllm(scheduler, monkeypatch):
    """The vLLM rule retold in this file (watermark 1/20 of the pool) gives vLLM's results with
    ``watermark_frac=0.05`` on 300 requests at load, and the compiled loop never asks Python a rule
    (a spy: only facts, asked again after preemptions)."""
    from kvlab.sim.fast import compiled

    asked = []
    monkeypatch.setattr(compiled._Asker, "answer", lambda self, event, S, F: asked.append(event))
    w = profile("seed-figures").sample(300, seed=3)
    kw = dict(SETUP, scheduler=scheduler, pool_pages=400, arrivals="poisson", qps=20.0, seed=1)
    mine = simulate(w, HalfHeadroom(), engine="fast", **kw)
    assert asked == []
    assert_same(simulate(w, "vllm", engine="fast", watermark_frac=0.05, **kw), mine)
    assert mine.params["policy"] == "test_half_headroom"


def test_policy_instance_with_parameters_is_a_value_error():
    w = pd.DataFrame({"prompt_tokens": [4], "output_tokens": [2]})
    with pytest.raises(ValueError, match="policy parameters"):
        simulate(w, HalfHeadroom(), model="Llama-2-7B", gpu="A100-80GB-SXM", watermark_frac=0.1)


def test_the_simulator_never_names_a_policy_class():
    """The engines ask the policy for its rules and traits; no source file under kvlab/sim names a
    registered policy class or imports a policy module other than the package itself."""
    import re
    from pathlib import Path

    import kvlab.sim
    from kvlab.policies import policy_class

    names = {policy_class(n).__name__ for n in policy_names()}
    for path in Path(kvlab.sim.__file__).parent.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"policies\.\w+ import", text), path
        assert not {n for n in names if re.search(rf"\b{n}\b", text)}, path
