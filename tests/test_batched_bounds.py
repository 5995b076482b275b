"""kvlab.sim.batched.bounds on hand-made iteration tables."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.sim.batched.bounds import event_iterations, lockstep_analysis


def _table(prefill: list[int], batch: list[int]) -> pd.DataFrame:
    n = len(prefill)
    zeros = np.zeros(n, dtype=np.int64)
    return pd.DataFrame({"iteration": np.arange(n), "prefill_tokens": prefill, "num_preempted": zeros,
                         "swap_pages_moved": zeros, "batch_size": batch, "num_waiting": zeros, "num_swapped": zeros})


def test_events_are_prefills_and_changes_of_the_batch() -> None:
    # iteration 0 prefills, 1 only decodes, 2 grows the batch, 3 only decodes
    assert event_iterations(_table([10, 0, 0, 0], [1, 1, 2, 2])).tolist() == [0, 2]


def test_lockstep_gains_of_two_simulations_worked_by_hand() -> None:
    a = _table([10, 0, 0, 0], [1, 1, 2, 2])   # 4 iterations, events {0, 2}
    b = _table([5, 5, 0], [1, 1, 1])          # 3 iterations, events {0, 1}
    out = lockstep_analysis([a, b], [2])
    # one by one 4 + 3 iterations, batched max(4, 3) steps; events 2 + 2, batched |{0, 1, 2}| = 3 steps
    assert out["per_iteration_engine_max_gain"].tolist() == pytest.approx([7 / 4, 7 / 4])
    assert out["skipping_engine_max_gain"].tolist() == pytest.approx([4 / 3, 4 / 3])
    assert out["batch_order"].tolist() == ["grid", "random"]
