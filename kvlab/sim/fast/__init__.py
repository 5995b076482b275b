"""The fast engine: the reference engine's rules (:mod:`kvlab.sim.reference`) compiled, one loop for everything.

Two codings of the rules, and only two: the specification (:mod:`kvlab.sim.reference`, plain
Python, one object per request) and the compiled loop (:mod:`.loop`, Numba, arrays of request
state), phase for phase under the same names; the equivalence tests compare them integer for
integer. The compiled loop runs every simulation: what it cannot decide itself (a policy rule or
a cost model with no compiled form) it asks Python, through :mod:`.compiled`, exactly as the
reference asks it, and resumes. A policy is asked, never named: a class kvlab does not ship runs
there too, at compiled speed for the rules it shares with :class:`kvlab.policies.Policy`
(see :meth:`kvlab.policies.Policy.compiled_form`).

It runs on the host. One simulation is a sequential loop of iterations, which a GPU does not
speed up; the backend's array module (``kvlab.backend``: CuPy, or the strict stand-in for its
rules) is where the policy's array rules are asked, once for all requests and again after a
preemption.

Modules: :mod:`.loop` (the compiled loop), :mod:`.prefix` (the prefix cache's pool rules,
compiled), :mod:`.aot` (the loop compiled ahead of time into an extension module, which a
process loads without importing Numba), :mod:`.layout` (the loop's slots, columns and codes, for
both sides), :mod:`.compiled` (its arrays and the answers to its questions), :mod:`.tables` (the
result tables), :mod:`.state` (status codes, the livelock error).
"""
from __future__ import annotations

from types import ModuleType

import numpy as np
import pandas as pd

from ...costmodel import CostModel
from ...policies import Policy
from ...prefix_cache import BlockIds
from ..config import PoolConfig, SchedulerConfig, SwapConfig
from ..request import RequestStatus
from .compiled import run_compiled, why_not

__all__ = ["load_loop", "request_frame", "run_compiled", "run_fast", "why_not"]


def load_loop() -> None:
    """Build (first run, announced on stderr) or load the compiled loop in this process with a
    two-request simulation (the ahead-of-time module, :mod:`.aot`, else Numba's JIT loop):
    before a worker pool forks, so the workers inherit it instead of each compiling or loading
    it (two workers compiling at once took ~200 s on a busy 2-core machine, one 41 s), and before
    ``kvlab report`` starts its kernels, so they load it from the cache instead of printing the
    compile into a page."""
    from .. import simulate

    simulate(pd.DataFrame({"prompt_tokens": [16, 32], "output_tokens": [2, 3]}), model="Llama-3-8B",
             gpu="H100-SXM", cost_model="roofline")


def run_fast(*, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray, request_ids: np.ndarray,
             max_new_tokens: int, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig, swap: SwapConfig,
             cost_model: CostModel, xp: ModuleType = np, blocks: BlockIds | None = None,
             every_column: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate with the compiled loop; return the request table and the iteration table.

    The tables are those of :func:`kvlab.sim.metrics.request_table` and
    :func:`kvlab.sim.metrics.iteration_table` for the reference engine, column for column
    (with the prefix-cache columns when ``blocks`` are given: a prefix cache is simulated);
    ``every_column=False`` keeps only the iteration columns the summary reads (:func:`run_compiled`).
    """
    requests, iterations = run_compiled(
        prompt_tokens=prompt_tokens, output_tokens=output_tokens, arrival_s=arrival_s,
        max_new_tokens=max_new_tokens, policy=policy, pool=pool, scheduler=scheduler, swap=swap,
        cost_model=cost_model, xp=xp, blocks=blocks, every_column=every_column)
    return request_frame(requests, request_ids), iterations


def request_frame(requests: pd.DataFrame, request_ids: np.ndarray) -> pd.DataFrame:
    """The compiled loop's request columns as :func:`kvlab.sim.metrics.request_table`'s (ids, TTFT, E2E)."""
    requests.insert(0, "request_id", request_ids)
    at = requests.columns.get_loc("mean_tbt_s")
    requests.insert(at, "ttft_s", requests["first_token_s"] - requests["arrival_s"])
    requests.insert(at + 1, "e2e_s", requests["finish_s"] - requests["arrival_s"])
    requests.loc[requests["outcome"] == RequestStatus.FINISHED_ABORTED.name.lower(), "e2e_s"] = np.nan
    return requests
