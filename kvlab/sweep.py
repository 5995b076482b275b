"""Sweeps: one :func:`kvlab.simulate` run per configuration of a grid, as one tidy table.

A grid maps :func:`kvlab.simulate` parameters (and the parameters of the reservation policies,
e.g. ``cap_tokens`` for ``tgi``) to the values to try; a list of grids is their union, which
is how policy-specific parameters are swept (``[{"policy": ["vllm"], "watermark_frac": [0,
0.01]}, {"policy": ["tgi"], "cap_tokens": [512, 1024]}]``). Each configuration runs once per
seed. With a profile name as the workload, the seed also draws that configuration's requests,
so seeds are independent replicates; with a table, every seed serves the same requests and the
seed reaches only the arrival process and seeded policies.

Execution is one configuration at a time in this process (``"serial"``), spread over local
processes (``"processes"``), or on a Dask cluster (a ``distributed.Client``, a scheduler
address, or ``"dask-local"`` for a local cluster). Every executor runs the same function on
the same inputs and the rows are put back in configuration order, so the table is identical
whatever ran it.

Many configurations can instead be advanced together in one array program, the batched
engine (:mod:`kvlab.sim.batched`: equal to the reference on every simulation, within its scope).
``batch`` chooses (:func:`kvlab.sim.batched.choose.choose`): ``"auto"`` runs per process: on a CPU the
compiled loop per process is faster at every batch size measured (``bench/bench_sweep.py --parts
batched``), and no GPU has measured batching faster yet;
``"always"`` batches every run within scope, ``"never"`` none. The choice is logged (logger
``kvlab.sweep``), printed with the progress bar, and kept in the table's
``attrs["run_by"]``; the table itself does not depend on it.
"""
from __future__ import annotations

import importlib.util
import inspect
import itertools
import logging
import multiprocessing
import os
import sys
from concurrent.futures import as_completed
from dataclasses import dataclass
from functools import cache
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from ._workers import worker_pool
from ._intmath import ceil_div
from .backend import backend_name, get_xp
from .lengths.profiles import list_profiles, profile
from .policies import create_policy, policy_names
from .sim import finish, prepare, simulate
from .sim.batched import run_batched
from .sim.batched.choose import MAX_BATCH, MODES as BATCH_MODES, Choice, choose
from .trace_window import trace_window

_log = logging.getLogger(__name__)

#: simulate() parameters a sweep does not take: the workload is the sweep's own argument, seeds
#: come from ``seeds=`` (they may also draw the workload), and a sweep keeps summaries only.
_NOT_SWEPT = ("workload", "seed", "record_iterations")
_LOCAL_EXECUTORS = ("serial", "processes", "dask-local")


@cache
def _simulate_keys() -> tuple[str, ...]:
    sig = inspect.signature(simulate).parameters.values()
    return tuple(p.name for p in sig if p.kind is not p.VAR_KEYWORD and p.name not in _NOT_SWEPT)


@cache
def _policy_keys() -> dict[str, frozenset[str]]:
    """Policy name -> the keyword parameters its constructor takes."""
    return {name: frozenset(inspect.signature(type(create_policy(name))).parameters)
            for name in policy_names()}


def sweep_keys() -> list[str]:
    """The names a sweep grid or ``fixed`` may hold: simulate's parameters, then policy parameters."""
    policy_params = sorted(set().union(*_policy_keys().values()) - set(_simulate_keys()))
    return list(_simulate_keys()) + policy_params


@dataclass(frozen=True, kw_only=True)
class _Source:
    """Where a configuration's requests come from: a table, or a profile sampled with the seed."""

    table: pd.DataFrame | None = None
    profile_name: str | None = None
    num_requests: int = 0

    def requests(self, seed: int) -> pd.DataFrame:
        if self.table is not None:
            return self.table
        return profile(self.profile_name).sample(self.num_requests, seed=seed)


def _source(workload: pd.DataFrame | str, num_requests: int | None) -> _Source:
    if isinstance(workload, pd.DataFrame):
        return _Source(table=trace_window(workload, num_requests).requests)
    if isinstance(workload, str):
        v.choice(workload, "workload profile", list_profiles())
        if num_requests is None:
            raise ValueError(f"num_requests must be given with the profile workload {workload!r} "
                             "(requests sampled per seed)")
        return _Source(profile_name=workload, num_requests=v.positive_int(num_requests, "num_requests"))
    raise ValueError(f"workload must be a DataFrame or a profile name ({', '.join(list_profiles())}), "
                     f"got {type(workload).__name__}")


def _check_keys(keys: Iterable[str], where: str) -> None:
    valid = sweep_keys()
    for key in keys:
        if key == "seed":
            raise ValueError(f"{where} holds 'seed': pass seeds=[...] instead (a seed may also draw the workload)")
        if key not in valid:
            raise ValueError(f"{where} holds {key!r}, which is not a simulate or policy parameter; valid keys: "
                             f"{', '.join(valid)}")


def _grid_values(grid: Mapping[str, Any], where: str) -> dict[str, list[Any]]:
    if not isinstance(grid, Mapping):
        raise ValueError(f"{where} must be a mapping of parameter name to a list of values, got "
                         f"{type(grid).__name__}")
    _check_keys(grid, where)
    out = {}
    for key, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, pd.Index, range)):
            raise ValueError(f"{where}[{key!r}] must be a list of values to try, got {values!r}")
        values = list(values.tolist() if isinstance(values, (np.ndarray, pd.Index)) else values)
        if not values:
            raise ValueError(f"{where}[{key!r}] is empty: give at least one value")
        out[key] = values
    return out


def _configurations(grid: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                    fixed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every configuration (without the seed), in grid order: first key slowest."""
    grids = [grid] if isinstance(grid, Mapping) else list(grid)
    if not grids:
        raise ValueError("grid is empty: give a mapping of parameter name to values, or a list of them")
    if not isinstance(fixed, Mapping):
        raise ValueError(f"fixed must be a mapping of parameter name to value, got {type(fixed).__name__}")
    _check_keys(fixed, "fixed")
    configs = []
    for i, g in enumerate(grids):
        where = "grid" if len(grids) == 1 else f"grid[{i}]"
        values = _grid_values(g, where)
        both = sorted(set(values) & set(fixed))
        if both:
            raise ValueError(f"{where} and fixed both set {both}: each parameter goes in one of them")
        configs += [{**dict(zip(values, combo)), **fixed} for combo in itertools.product(*values.values())]
    for key in ("model", "gpu"):
        missing = [c for c in configs if key not in c]
        if missing:
            raise ValueError(f"every configuration needs {key!r} (simulate requires it): put it in fixed or the grid")
    policy_keys = _policy_keys()
    for c in configs:
        name = c.get("policy", "vllm")
        if name not in policy_keys:
            raise ValueError(f"policy {name!r} is unknown: expected one of {', '.join(policy_keys)}")
        extra = sorted(k for k in c if k not in _simulate_keys() and k not in policy_keys[name])
        if extra:
            raise ValueError(f"policy {name!r} takes no parameter {extra} (it takes {sorted(policy_keys[name])}); "
                             "sweep policy-specific parameters with a list of grids, one per policy")
    return configs


def _simulate_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration as simulate's keywords (offline arrivals take no rate: a grid may cross kinds)."""
    if config.get("arrivals") == "offline":
        return {k: x for k, x in config.items() if k not in ("qps", "burst_cv")}
    return dict(config)


def _row(config: Mapping[str, Any], seed: int, params: Mapping[str, Any], summary: Mapping[str, float]
         ) -> dict[str, Any]:
    config = _simulate_kwargs(config)
    resolved = {k: x for k, x in params.items() if k not in config}
    return {**config, "seed": seed, **resolved, **summary}


def _run_one(source: _Source, config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """One simulation's row: the configuration, its seed, the resolved parameters, the summary."""
    try:
        res = simulate(source.requests(seed), seed=seed, **_simulate_kwargs(config))
    except ValueError as exc:
        raise ValueError(f"configuration {dict(config)} with seed {seed}: {exc}") from None
    return _row(config, seed, res.params, res.summary)


def _prepare_one(source: _Source, config: Mapping[str, Any], seed: int) -> Any:
    try:
        return prepare(source.requests(seed), seed=seed, **_simulate_kwargs(config))
    except ValueError as exc:
        raise ValueError(f"configuration {dict(config)} with seed {seed}: {exc}") from None


def _choose(source: _Source, tasks: list, batch: str) -> tuple[Choice, list[Any]]:
    """How the tasks run (:func:`kvlab.sim.batched.choose.choose`) and their prepared runs (when batching may pay)."""
    xp = get_xp()
    if batch == "never" or (batch == "auto" and backend_name(xp) == "numpy"):
        return choose([], xp, batch), []
    runs = [_prepare_one(source, config, seed) for _, config, seed in tasks]
    return choose(runs, xp, batch), runs


def _batched(tasks: list, runs: list[Any], positions: tuple[int, ...]) -> Iterator[list]:
    """Rows of the tasks at ``positions``, run by the batched engine in batches of :data:`MAX_BATCH`."""
    for start in range(0, len(positions), MAX_BATCH):
        part = positions[start:start + MAX_BATCH]
        tables = run_batched([runs[p] for p in part], get_xp())
        yield [(tasks[p][0], _row(tasks[p][1], tasks[p][2], runs[p].params, finish(runs[p], req, it).summary))
               for p, (req, it) in zip(part, tables)]


def _run_chunk(source: _Source, tasks: list[tuple[int, dict[str, Any], int]]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, _run_one(source, config, seed)) for i, config, seed in tasks]


_WORKER_SOURCE: _Source | None = None


def _set_worker_source(source: _Source) -> None:
    """Process-pool initializer: ship the workload to each worker once, not with every task."""
    global _WORKER_SOURCE
    _WORKER_SOURCE = source


def _run_chunk_in_worker(tasks: list[tuple[int, dict[str, Any], int]]) -> list[tuple[int, dict[str, Any]]]:
    assert _WORKER_SOURCE is not None, "the process pool was started without its initializer"
    return _run_chunk(_WORKER_SOURCE, tasks)


def _chunks(tasks: list, num_workers: int) -> list[list]:
    """About four chunks per worker: few enough to amortise task overhead, enough to balance load."""
    size = max(1, ceil_div(len(tasks), 4 * num_workers))
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


def _serial(source: _Source, tasks: list) -> Iterator[list]:
    for task in tasks:
        yield _run_chunk(source, [task])


def _processes(source: _Source, tasks: list, max_workers: int) -> Iterator[list]:
    # A forked child cannot use a CUDA context its parent made: on CuPy, workers start fresh.
    context = multiprocessing.get_context("spawn") if backend_name(get_xp()) == "cupy" else None
    with worker_pool(max_workers, mp_context=context, initializer=_set_worker_source, initargs=(source,)) as pool:
        futures = [pool.submit(_run_chunk_in_worker, chunk) for chunk in _chunks(tasks, max_workers)]
        for fut in as_completed(futures):
            yield fut.result()


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError("a Dask executor needs dask.distributed: pip install -e \".[dist]\"") from exc
    return distributed


def _dask(source: _Source, tasks: list, client: Any) -> Iterator[list]:
    distributed = _import_distributed()
    num_workers = max(1, sum(client.nthreads().values()))
    remote_source = client.scatter(source, broadcast=True)
    futures = [client.submit(_run_chunk, remote_source, chunk, pure=False) for chunk in _chunks(tasks, num_workers)]
    try:
        for fut in distributed.as_completed(futures):
            yield fut.result()
    finally:
        client.cancel(futures + [remote_source])


def _dask_client(executor: Any, max_workers: int) -> tuple[Any, list[Any]]:
    """(client, what to close afterwards) for a Dask executor."""
    distributed = _import_distributed()
    if isinstance(executor, distributed.Client):
        return executor, []
    if executor == "dask-local":
        cluster = distributed.LocalCluster(n_workers=max_workers, threads_per_worker=1, dashboard_address=None)
        client = distributed.Client(cluster)
        return client, [client, cluster]
    client = distributed.Client(executor)
    return client, [client]


def _is_dask(executor: Any) -> bool:
    if isinstance(executor, str):
        if executor in _LOCAL_EXECUTORS:
            return executor == "dask-local"
        if "://" in executor:
            return True
        raise ValueError(f"executor {executor!r} is unknown: expected one of {', '.join(_LOCAL_EXECUTORS)}, a Dask "
                         "scheduler address such as 'tcp://host:8786', or a distributed.Client")
    if type(executor).__module__.split(".")[0] == "distributed":
        return True
    raise ValueError(f"executor must be a string or a distributed.Client, got {type(executor).__name__}")


def sweep(workload: pd.DataFrame | str, grid: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
          num_requests: int | None = None, fixed: Mapping[str, Any] | None = None, seeds: Sequence[int] = (0,),
          executor: Any = "serial", max_workers: int | None = None, progress: bool = True,
          batch: str = "auto") -> pd.DataFrame:
    """Simulate every configuration of ``grid`` (once per seed) and return one row per run.

    Parameters
    ----------
    workload : DataFrame or str
        A request table for :func:`kvlab.simulate` (served as it is by every configuration), or
        the name of a workload profile (:func:`kvlab.lengths.list_profiles`), sampled with each
        seed.
    grid : mapping or list of mappings
        Parameter name -> list of values; every combination is one configuration. Names are
        :func:`kvlab.simulate` parameters (``policy``, ``max_new_tokens``, ``block_size``,
        ``pool_pages``, ``qps``, ``arrivals``, ``scheduler``, ``preemption_mode``, ``engine``,
        ...) and policy parameters (``cap_tokens``, ``watermark_frac``, ``quantile``, ...); see
        :func:`sweep_keys`. A list of mappings is the union of their grids.
    num_requests : int, optional
        Requests sampled from a profile workload (required then), or taken from a table: its
        first ``num_requests`` rows at their own rate (:func:`kvlab.trace_window.trace_window`);
        None serves the whole table.
    fixed : mapping, optional
        Parameters shared by every configuration (``model`` and ``gpu`` usually go here).
    seeds : sequence of int
        Seeds run for each configuration (the innermost axis of the table).
    executor : {"serial", "processes", "dask-local"}, str address or distributed.Client
        Where the simulations run: this process, a local process pool, a new local Dask
        cluster, or an existing Dask cluster (its scheduler address, e.g. ``"tcp://host:8786"``,
        or a connected ``Client``). The table does not depend on it.
    max_workers : int, optional
        Processes for ``"processes"`` and ``"dask-local"`` (default: the CPU count).
    progress : bool
        Show a tqdm bar of configurations done (and print how the runs are executed).
    batch : {"auto", "always", "never"}
        Whether runs within the batched engine's scope are advanced together in one array
        program (:mod:`kvlab.sim.batched`, in this process) instead of one by one by
        ``executor``: ``auto`` when it is expected to be faster (a GPU and enough runs; never
        on a CPU). The table does not depend on it; ``table.attrs["run_by"]`` says what ran.

    Returns
    -------
    DataFrame
        One row per (configuration, seed) in grid order (the first grid key varies slowest,
        seeds fastest): the configuration's parameters, ``seed``, the parameters the simulator
        resolved (``pool_pages``, ``engine``, ...; see ``SimResult.params``) and every figure of
        :func:`kvlab.sim.metrics.summarize` (``tokens_per_s``, ``ttft_p50_s``, ...).

    Raises
    ------
    ValueError
        A grid or fixed key that is neither a simulate nor a policy parameter (the message lists
        the valid ones), a policy given a parameter it does not take, a missing ``model`` or
        ``gpu``, bad seeds, or a configuration that simulate rejects (the message names it).

    Examples
    --------
    >>> table = sweep("seed-figures", {"policy": ["vllm", "reserve_max"], "max_new_tokens": [128, 512]},
    ...               num_requests=50, fixed={"model": "Llama-3-8B", "gpu": "H100-SXM", "pool_pages": 500},
    ...               progress=False)
    >>> table[["policy", "max_new_tokens", "seed"]].values.tolist()
    [['vllm', 128, 0], ['vllm', 512, 0], ['reserve_max', 128, 0], ['reserve_max', 512, 0]]
    """
    source = _source(workload, num_requests)
    configs = _configurations(grid, {} if fixed is None else fixed)
    seed_list = _seeds(seeds)
    workers = (os.cpu_count() or 1) if max_workers is None else v.positive_int(max_workers, "max_workers")
    dask = _is_dask(executor)
    tasks = [(i, config, seed) for i, (config, seed) in enumerate(itertools.product(configs, seed_list))]
    v.choice(batch, "batch", BATCH_MODES)
    choice, runs = _choose(source, tasks, batch)
    run_by = choice.describe(len(tasks))
    _log.info("sweep: %s", run_by)
    if progress:
        print(f"kvlab.sweep: {run_by}", file=sys.stderr)
    batched = set(choice.batched)
    others = [t for p, t in enumerate(tasks) if p not in batched]

    rows: list[dict[str, Any] | None] = [None] * len(tasks)
    closers: list[Any] = []
    bar = _progress_bar(len(tasks)) if progress else None
    try:
        if not others:
            done: Iterator[list] = iter(())
        elif dask:
            client, closers = _dask_client(executor, workers)
            done = _dask(source, others, client)
        elif executor == "processes":
            done = _processes(source, others, workers)
        else:
            done = _serial(source, others)
        for chunk in itertools.chain(_batched(tasks, runs, choice.batched), done):
            for i, row in chunk:
                rows[i] = row
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        for obj in closers:
            obj.close()
    config_keys = dict.fromkeys(k for c in configs for k in c)
    table = _table(rows, [*config_keys, "seed"])
    table.attrs["run_by"] = run_by
    return table


def _seeds(seeds: Any) -> list[int]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise ValueError(f"seeds must be a list of non-negative integers, got {seeds!r}")
    out = [v.nonnegative_int(s, "seeds") for s in seeds]
    if not out:
        raise ValueError("seeds is empty: give at least one seed")
    if len(set(out)) != len(out):
        raise ValueError(f"seeds must not repeat, got {out}")
    return out


def _progress_bar(total: int) -> Any:
    # Imported here, not at the top: the GPU check machine runs sweeps with progress=False and
    # may lack tqdm (kvlab's other modules do not need it). tqdm.auto draws a widget in Jupyter
    # but only warns and falls back to text without ipywidgets, so go to text directly then.
    if importlib.util.find_spec("ipywidgets") is None:
        from tqdm import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm(total=total, desc="sweep", unit="config")


def _table(rows: list[dict[str, Any]], leading: list[str]) -> pd.DataFrame:
    """Rows as a DataFrame: the ``leading`` columns, then the others in first-seen order."""
    columns = dict.fromkeys(leading)
    for row in rows:
        columns.update(dict.fromkeys(row))
    return pd.DataFrame.from_records(rows, columns=list(columns))


__all__ = ["sweep", "sweep_keys"]
