"""The batched engine: many independent simulations advanced in lockstep on ``(S, n)`` arrays.

One array program steps S simulations (configurations, rates, seeds) together: simulation ``s``
is row ``s`` of every state array, its requests the columns (sorted by arrival, padded to the
longest workload). Each array step is one iteration of every unfinished simulation, under the
reference engine's rules (:mod:`kvlab.sim.reference`), so every simulation's tables equal the
reference's, integer for integer and time for time. It is written once against the array
module (:mod:`kvlab.backend`): NumPy on a CPU, CuPy on a GPU, the strict stand-in in CI.

Scope (:func:`why_not` says why a run is outside it; such runs go to the per-process engine)
-------------------------------------------------------------------------------------------
* the chunked scheduler (Sarathi-Serve, vLLM V1); not the other schedulers;
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
batch takes as many steps as its longest member has iterations; finished simulations leave the
arrays (every 32 steps, once half are done), so that tail costs what its live rows cost.

Does it pay? (measured 2026-12-02, ``bench/bench_sweep.py --parts batched``, 2-core machine
shared with other jobs, load 7-8; 200 seed-figures requests per simulation, Poisson 100/s)
----------------------------------------------------------------------------------------------
* On a CPU, no. The compiled loop on 2 processes ran the 1,000-configuration in-scope sweep at
  29-34 configurations/s (two runs); the batched engine on NumPy at 0.06-0.10x that for S = 1,
  0.32-0.42x for S = 8, 0.43-0.66x for S = 32, 0.21-0.23x for S = 128 and 0.27-0.31x for S =
  200. A batch is as long as its longest member: a reserve_max member on a small pool runs 8,144
  iterations where the mean is 1,235, so 15% of a 200-simulation batch's row-steps do work; the
  per-request fallback takes 0.5% of its iterations (vLLM members thrashing; 14% of one such
  member's own). A step is ~230 array operations: 190 us at S = 1, 22 us per simulation at S =
  32, 55 at 256 and 70 at 1,024 (memory-bound), against 4.6 us per iteration of the compiled
  loop (5.7 ms per simulation, tables included).
* On a GPU, not against the compiled loop per process, and in principle not: (1) a step is ~230
  kernel launches and 3-4 host syncs, about 0.5-1 ms on CuPy whatever S (estimated at 2-5 us a
  launch; not yet measured: no GPU was lent), and a batch takes as many steps as its longest
  member (8,144 here), so 1,000 simulations in one batch cost ~8 ms of steps each, more than one
  CPU core's compiled loop (5.7 ms), before the fallback steps (host Python and device copies);
  (2) each simulation still costs ~9 ms of host work the batch does not remove (``prepare`` 4.8
  ms, tables and summary 4.5 ms), a ceiling of ~110 simulations/s for the batched path against
  ~1,000/s estimated for the compiled loop on a 16-core machine's processes (15 ms per
  simulation per core, measured here). So :mod:`.choose` runs per process on every
  backend unless told ``batch="always"``; ``bench/gpu_check.sh batched_cupy`` measures CuPy
  against NumPy and the compiled loop on the 1,000-configuration sweep. A GPU design that could
  pay would drop lockstep: one GPU thread per simulation running the compiled loop, with
  vectorised summaries; not built.
"""
from __future__ import annotations

from .engine import BatchedEngine, BatchStats, run_batched, stats, why_not

__all__ = ["BatchStats", "BatchedEngine", "run_batched", "stats", "why_not"]
