"""Bounds on lockstep batching from iteration tables: how many array steps a batch of simulations needs.

A batch advanced one iteration per array step runs as long as its longest member; an engine that
skipped decode-only stretches would stop at the union of its members' event iterations. These
pure functions measure both from per-simulation iteration tables (``bench/bench_sweep.py
--parts bounds``), the most lockstep can gain before the cost of a step is counted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def event_iterations(iterations: pd.DataFrame) -> np.ndarray:
    """Iterations at which an engine that skips decode-only stretches must stop and step.

    An iteration is an event when it prefills, preempts or swaps, or when the running batch,
    the waiting queue or the swapped queue changed size since the previous iteration (a finish,
    an admission, an arrival). Between events every running request just decodes one token per
    iteration, which such an engine advances in one array step. A lower bound on its steps.
    """
    def changed(col: str) -> np.ndarray:
        return np.diff(iterations[col].to_numpy(), prepend=-1) != 0

    event = ((iterations["prefill_tokens"].to_numpy() > 0) | (iterations["num_preempted"].to_numpy() > 0)
             | (iterations["swap_pages_moved"].to_numpy() > 0) | changed("batch_size") | changed("num_waiting")
             | changed("num_swapped"))
    return iterations["iteration"].to_numpy()[event]


def lockstep_analysis(iteration_tables: list[pd.DataFrame], batch_sizes: list[int], *, seed: int = 0) -> pd.DataFrame:
    """How many array steps lockstep batching of configurations could save, per batch size.

    Configurations advanced together in one array program share each step, but the program must
    stop wherever any of them has work: at every iteration (an engine that steps each
    iteration: ``max K`` steps for the batch instead of ``sum K``), or at the union of their
    event iterations (an engine that skips decode stretches: ``|union E|`` instead of
    ``sum |E|``). The ratio of one-by-one steps to batched steps is the most batching can gain
    (each batched step also processes B times as many requests, which only lowers it). Batches
    are formed two ways: consecutive configurations in grid order (the most alike: a best case)
    and a seeded random order (a sweep batched without regard to likeness).
    """
    events = [event_iterations(t) for t in iteration_tables]
    iters = np.array([len(t) for t in iteration_tables])
    orders = {"grid": np.arange(len(events)), "random": np.random.default_rng(seed).permutation(len(events))}
    rows = []
    for name, order in orders.items():
        for b in batch_sizes:
            groups = [order[i:i + b] for i in range(0, len(order) - b + 1, b)]
            step_share = [iters[g].sum() / iters[g].max() for g in groups]
            event_share = [sum(len(events[i]) for i in g) / len(np.unique(np.concatenate([events[i] for i in g])))
                           for g in groups]
            rows.append({"batch_order": name, "configs_per_batch": b, "num_batches": len(groups),
                         "iterations_per_config": float(iters.mean()),
                         "event_steps_per_config": float(np.mean([len(e) for e in events])),
                         "per_iteration_engine_max_gain": float(np.mean(step_share)),
                         "skipping_engine_max_gain": float(np.mean(event_share))})
    return pd.DataFrame(rows)


__all__ = ["event_iterations", "lockstep_analysis"]
