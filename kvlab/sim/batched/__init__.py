"""The batched engine: many independent simulations advanced in lockstep on ``(S, n)`` arrays.

One array program steps S simulations (configurations, rates, seeds) together: simulation ``s``
is row ``s`` of every state array, its requests the columns (sorted by arrival, padded to the
longest workload). Each array step is one iteration of every unfinished simulation, under the
reference engine's rules (:mod:`kvlab.sim.reference`), so every simulation's tables equal the
reference's, integer for integer and time for time. It is written once against the array
module (:mod:`kvlab.backend`): NumPy on a CPU, CuPy on a GPU, the strict stand-in in CI.

Scope (:func:`why_not` says why a run is outside it; such runs go to the per-process engine)
-------------------------------------------------------------------------------------------
* the chunked scheduler (Sarathi-Serve, vLLM V1); not ``prefill_first``;
* recompute or reject preemption; not swap;
* a policy whose admission depends only on the request's own pages, which keeps no
  per-iteration state, keeps the queue FCFS and preempts the newest request (by its traits:
  ``vllm``, ``reserve_max``, ``tgi``, ``orca_oracle``, ``orca_pow2``, ``orca_max``, ``predicted``
  with its default traits); on-demand allocation and self-preemption (TGI's requeue) included;
* any cost model whose ``iteration_s`` takes arrays (the roofline and the measured model do:
  their formulas are element-wise), the same model for every simulation of a batch.

NOTE (how it stays equal to the reference)
------------------------------------------
Per step, for every simulation at once: arrivals join; an idle simulation's clock jumps to its
next arrival; running requests get ``min(remaining, budget left)`` tokens, decodes first (their
order cannot matter while the decodes fit the budget) and then the partial prefill; pages are
granted in one step when their sum fits the unpromised pages; the queue's longest admissible
prefix is admitted by cumulative sums of tokens and reserved pages. A simulation whose step is
not that common case (a preemption, a self-preemption, an abort, a preempted request in the
queue, two partial prefills sharing too small a budget, more decodes than the budget) has that
step scheduled by :mod:`.fallback`, a per-request port of the reference's phases on its row
that asks its own bound policy, and then joins the common execution. A policy's answers about
a new request (reservation, admission pages, whether it fits the pool) are asked once per
simulation, of its own bound policy, on arrays. Iteration latencies are one
``cost.iteration_s`` call on ``(S,)`` arrays per step; the clock is ``now + duration`` per row,
the reference's sum. Decode-only stretches are not skipped: each step is one iteration, so a
batch takes as many steps as its longest member has iterations.
"""
from __future__ import annotations

from .engine import BatchedEngine, BatchStats, run_batched, stats, why_not

__all__ = ["BatchStats", "BatchedEngine", "run_batched", "stats", "why_not"]
