"""Which way many simulations run: batched arrays, or the per-process engine (compiled loop), and why.

:func:`choose` decides for a set of prepared runs on an array module and says why; the caller
shows the :class:`Choice` (``kvlab.sweep`` logs it and puts it in the table's ``attrs``). The rule
is the measurement in ``bench/bench_sweep.py`` (``--parts batched``):

* on NumPy the per-process engine: no crossover was measured. On the 1,000-configuration
  in-scope sweep (2 shared cores, 2026-12-02, two runs) the compiled loop on 2 processes ran
  29-34 configurations/s and the batched engine 0.06-0.10x that at S = 1, 0.32-0.42x at 8,
  0.43-0.66x at 32 and 0.21-0.31x at 128 and 200 (a batch is as long as its longest member);
  see :mod:`kvlab.sim.batched`;
* on CuPy also the per-process engine: the compiled loop runs on the host, and the estimate from
  the CPU measurement (about 230 array operations per lockstep step, each a kernel launch of
  some microseconds whatever S, and a batch as long as its longest member) puts a 1,000-run batch
  near 8 ms per simulation against 5.7 ms for the compiled loop on one core. No GPU has measured
  it yet: ``bench/gpu_check.sh batched_cupy`` does, and ``batch="always"`` runs it.

Runs outside the batched engine's scope (:func:`kvlab.sim.batched.why_not`) always go per
process, with their reasons counted in the choice.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

from ...backend import backend_name
from .engine import why_not

if TYPE_CHECKING:
    from .. import PreparedRun

#: Simulations per batch at most (the iteration rows of a batch are held until it ends).
MAX_BATCH = 1024
MODES = ("auto", "always", "never")


@dataclass(frozen=True, kw_only=True)
class Choice:
    """How a set of runs is executed.

    Attributes
    ----------
    batched : tuple of int
        Positions of the runs the batched engine runs.
    backend : str
        The array module's name (``numpy``, ``cupy``, ``strict``).
    reason : str
        Why, in one sentence.
    outside_scope : dict of str to int
        Reasons runs are outside the batched engine's scope, with their counts.
    """

    batched: tuple[int, ...]
    backend: str
    reason: str
    outside_scope: dict[str, int] = field(default_factory=dict)

    def describe(self, num_runs: int) -> str:
        """One line to show: how many runs go which way, and why."""
        outside = "; ".join(f"{n} x {why}" for why, n in self.outside_scope.items())
        return (f"{len(self.batched)} of {num_runs} simulations batched on {self.backend}, "
                f"{num_runs - len(self.batched)} per process: {self.reason}" + (f" (outside scope: {outside})"
                                                                               if outside else ""))


def choose(runs: Sequence[PreparedRun], xp: ModuleType, mode: str = "auto") -> Choice:
    """The :class:`Choice` for ``runs`` on ``xp``: ``mode`` ``always`` batches every run within
    scope, ``never`` none, ``auto`` follows the module's rule."""
    if mode not in MODES:
        raise ValueError(f"batch {mode!r} is unknown: expected one of {', '.join(MODES)}")
    reasons = [why_not(r) for r in runs] if mode != "never" else [None] * len(runs)
    inside = tuple(i for i, why in enumerate(reasons) if why is None)
    outside = dict(Counter(why for why in reasons if why is not None))
    name = backend_name(xp)
    if mode == "never":
        return Choice(batched=(), backend=name, reason="batch='never'")
    if mode == "always":
        return Choice(batched=inside, backend=name, reason="batch='always'", outside_scope=outside)
    if name == "numpy":
        return Choice(batched=(), backend=name, outside_scope=outside,
                      reason="on a CPU the compiled loop per process is faster at every batch size measured")
    return Choice(batched=(), backend=name, outside_scope=outside,
                  reason=f"on {name} the batched engine is not measured faster than the compiled loop per process "
                         "(bench/gpu_check.sh batched_cupy measures it; batch='always' runs it)")
