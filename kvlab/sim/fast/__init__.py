"""The fast engine: the reference engine's rules (:mod:`kvlab.sim.reference`), compiled or on arrays.

Two loops, one contract (the reference engine's tables, integer for integer):

* the **compiled loop** (:mod:`.kernel`, driven by :mod:`.compiled`): the reference's rules one
  request at a time, compiled by Numba, on the host. It runs whenever it applies (NumPy; a
  policy whose answers concern one request, FCFS, no per-iteration state, newest-first
  preemption, by its traits; a cost model with a compiled form). It is several times faster than
  the array loop on real traffic (``bench/bench_real_traffic.py`` prints both), most of all
  under preemption, where the array loop falls back to per-request Python;
* the **array loop** (:mod:`.engine`, :mod:`.lazy`), below, for everything else: CuPy on a GPU,
  policies that read the running batch, keep state, order the queue or choose their own victims,
  and cost models without a compiled form.

NOTE (how it stays equal to the reference, integer for integer)
---------------------------------------------------------------
The rules are the reference engine's top-of-file note; nothing here adds or changes one. What
changes is how they are executed:

* Request state is a struct of arrays on the array module ``xp`` (NumPy, or CuPy on a GPU):
  computed/generated tokens, reserved/used pages, status, the outcome columns. The pool is
  counted, not paged: the reference's page ids never reach a result, only ``used`` and
  ``max(reserved, used)`` per request and their totals do.
* An iteration's phases are vectorised for the common case and fall back to a per-request
  port of the reference phase when the cheap check says the case is not common:
  ``_schedule_running`` hands every running request ``min(remaining, budget left)`` by a
  cumulative sum and grants its pages in one step when their sum fits the unpromised pages (no
  preemption), else it runs the per-request loop with victims; ``_admit_waiting`` admits the
  longest prefix of the queue that passes the loop's conditions (cumulative pages and tokens),
  else the per-request loop (aborts); swap-ins always run per request.
* A decode-only stretch is run as one step: when every running request is decoding, the batch
  fits the token budget, and the queue cannot admit anything (empty, or its head is blocked by
  ``max_num_seqs``, the budget, or a ``can_admit`` that stays false while pages are only taken),
  all running requests advance ``L`` iterations at once. ``L`` stops at the first finish, the
  first iteration whose page growth would preempt (on-demand policies: the cumulative new
  pages exceed the unpromised ones; reserving policies: the first page beyond a reservation),
  and the first arrival that could change the queue's head. The stretch's iteration latencies
  are one vector; its start times are a sequential cumulative sum on the host (bit-equal to
  the reference's ``now += duration``, which a parallel GPU scan would not be).
* A lazy run (:mod:`.lazy`) goes further while no preemption happens (a policy whose admission
  depends only on the request's own pages and which keeps no per-iteration state, FCFS; either
  scheduler; nothing swapped): a decoding request's state is affine in the number of decode
  iterations, so an
  iteration only touches the requests that are admitted, prefilling or finishing, plus a few
  totals (decoders, the sum of their contexts, decoders per page phase). Iteration latencies are computed as
  they run while arrivals remain (an arrival is compared with the clock), otherwise as one
  vector at the end; token times and gap maxima are written back in bulk. The run hands the
  state back to the arrays before any iteration whose page growth would preempt, whose
  decodes overflow the token budget, or whose admissions could reach a request to abort.
* Scheduling decisions read a few scalars per iteration (sums and flags) back to the host; no
  loop runs over requests except the fallbacks.

* The policy is asked, never named: every rule is the policy's own method called on arrays of
  requests (:class:`kvlab.policies.Requests`), and the paths above are chosen by its traits
  (``on_demand``, ``admits_on_own_pages``, ``keeps_state``, ``orders_queue``, and for the
  compiled loop ``preempts_newest``). A policy class kvlab does not ship takes the same paths at
  the same speed.

Modules: :mod:`.compiled` and :mod:`.kernel` (the compiled loop), :mod:`.tables` (the result
tables both loops build), :mod:`.state` (status codes, the policy asked about requests by id), :mod:`.queue`
(the waiting queue), :mod:`.engine` (the array engine and its stretches), :mod:`.lazy` (lazy
runs, which see the engine only through :class:`.lazy.LazyHost`: its clock, its running
requests, and the outcome columns they write).
"""
from __future__ import annotations

from types import ModuleType

import numpy as np
import pandas as pd

from ...costmodel import CostModel
from ...policies import Policy
from ..config import PoolConfig, SchedulerConfig, SwapConfig
from ..request import RequestStatus
from .compiled import run_compiled, why_not
from .engine import FastEngine
from .lazy import LazyRun

__all__ = ["FastEngine", "LazyRun", "run_fast"]


def run_fast(*, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray, request_ids: np.ndarray,
             max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig,
             cost_model: CostModel, xp: ModuleType) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate with the fast engine; return the request table and the iteration table.

    The tables are those of :func:`kvlab.sim.metrics.request_table` and
    :func:`kvlab.sim.metrics.iteration_table` for the reference engine, column for column.
    """
    if why_not(policy, cost_model, xp) is None:
        requests, iterations = run_compiled(
            prompt_tokens=prompt_tokens, output_tokens=output_tokens, arrival_s=arrival_s,
            max_new_tokens=max_new_tokens, policy=policy, pool=pool, scheduler=scheduler, swap=swap,
            cost_model=cost_model)
    else:
        requests, iterations = FastEngine(
            prompt_tokens=prompt_tokens, output_tokens=output_tokens, arrival_s=arrival_s,
            max_new_tokens=max_new_tokens, policy=policy, pool=pool, scheduler=scheduler, swap=swap,
            cost_model=cost_model, xp=xp).run_all()
    requests.insert(0, "request_id", request_ids)
    at = requests.columns.get_loc("mean_tbt_s")
    requests.insert(at, "ttft_s", requests["first_token_s"] - requests["arrival_s"])
    requests.insert(at + 1, "e2e_s", requests["finish_s"] - requests["arrival_s"])
    requests.loc[requests["outcome"] == RequestStatus.FINISHED_ABORTED.name.lower(), "e2e_s"] = np.nan
    return requests, iterations
