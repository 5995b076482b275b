"""Lazy runs: rows packed into arrays mid-run give the same tables; the run reaches the packing."""
from __future__ import annotations

import numpy as np
import pytest

from kvlab.lengths import profile
from kvlab.sim.fast import lazy

from test_sim_fast_equivalence import COST, assert_same, run


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_packing_rows_mid_run_changes_nothing(scheduler, monkeypatch, array_loop):
    w = profile("seed-figures").sample(200, seed=4)
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 300)
    kw = {"block_size": 16, "cost_model": COST, "seed": 2, "pool_pages": 300, "arrivals": "poisson", "qps": 20.0,
          "scheduler": scheduler}
    packs = []
    pack = lazy.LazyRun._pack_rows

    def counting(self):
        packs.append(len(self.row_times))
        pack(self)

    monkeypatch.setattr(lazy, "ROWS_PER_BLOCK", 10)  # every 5 iterations
    monkeypatch.setattr(lazy.LazyRun, "_pack_rows", counting)
    assert_same(run(w, "vllm", "reference", **kw), run(w, "vllm", "fast", **kw))
    assert sum(n >= 10 for n in packs) > 10  # packed mid-run, many times
