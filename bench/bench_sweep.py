"""Sweep throughput: a 1,000-configuration ``kvlab.sweep``, in configurations per second.

One run measures, on the same grid:

* serial on NumPy, the baseline;
* a local process pool on NumPy (``executor="processes"``, every core), and its ratio to serial;
* serial on CuPy when a usable GPU is present, and its ratio to NumPy serial;
* whether the tables agree (they must be identical whatever the executor or backend);
* lockstep batching: would advancing many configurations together in one array program pay?
  See :func:`lockstep_analysis` for what is measured and how the answer is computed.

Grid: 5 policies x 5 ``max_new_tokens`` x 4 pool sizes x 2 preemption modes x 5 seeds (each
seed draws its own brief-sharegpt requests and Poisson arrivals). Threads are pinned to one
before NumPy loads, so ``processes`` is the only parallelism.

Measured on the 2-core development machine (shared, load average 3-5, so wall times carry
other jobs' load; CPU seconds do not), fast engine, 200 requests per configuration: about 10
configurations per CPU-second serial; the fast engine spends ~350 us per event step, of which
the step's array operations are ~10 us (one mix at 200 requests), so a step is Python control.
Lockstep bounds in random batches: at most 2.6x fewer steps for 8 configurations, 5.5x for 32,
and only if the control flow itself were batched; were array work to dominate, NumPy's cost
at 8-32x the width (3.9-8.8x) would turn that into 0.6-0.7x. Not built (see kvlab/sweep.py).

Run: ``python bench/bench_sweep.py [--seeds 5] [--num-requests 200] [--out DIR]``; with
``--out`` it also writes ``sweep_bench.csv`` and ``sweep_bench.md`` there.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import itertools  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import timeit  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import kvlab  # noqa: E402
from kvlab.backend import ENV_VAR, cupy_usable, get_xp  # noqa: E402

GRID = {"policy": ["vllm", "reserve_max", "tgi", "sglang", "orca_oracle"],
        "max_new_tokens": [128, 256, 512, 1024, 2048],
        "pool_pages": [125, 250, 500, 1000],
        "preemption_mode": ["recompute", "swap"]}
FIXED = {"model": "Llama-3-8B", "gpu": "H100-SXM", "arrivals": "poisson", "qps": 100.0}
PROFILE = "brief-sharegpt"


def _timed_sweep(backend: str, **kw) -> tuple[pd.DataFrame, float, float]:
    """A sweep with ``KVLAB_BACKEND=backend`` (inherited by worker processes).

    Returns (table, wall seconds, CPU seconds of this process and its finished children): the
    CPU figure does not move when other jobs share the machine, the wall figure does.
    """
    os.environ[ENV_VAR] = backend
    cpu0, t0 = _cpu_s(), time.perf_counter()
    table = kvlab.sweep(PROFILE, GRID, fixed=FIXED, progress=False, **kw)
    return table, time.perf_counter() - t0, _cpu_s() - cpu0


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _configs() -> list[dict]:
    """The grid's configurations in sweep order (first key slowest)."""
    return [dict(zip(GRID, combo)) for combo in itertools.product(*GRID.values())]


def _same(a: pd.DataFrame, b: pd.DataFrame) -> str:
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        return "identical"
    except AssertionError as exc:
        return f"DIFFER: {str(exc).splitlines()[0]}"


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


def step_width_cost(xp, widths: list[int], *, repeats: int = 200) -> dict[int, float]:
    """Seconds of one array step's operations at each width (requests across the batch).

    The mix stands for what an engine step does over its request arrays: a cumulative sum of
    tokens, an elementwise min and compare, a gather by index, a masked sum, a search of a
    sorted array, and one scalar read back to the host (a scheduling decision). Measured on
    the array module ``xp``; CuPy runs are synchronised by the host read.
    """
    rng = np.random.default_rng(0)
    out = {}
    for w in widths:
        a = xp.asarray(rng.integers(1, 500, w))
        b = xp.asarray(rng.integers(1, 500, w))
        idx = xp.asarray(rng.permutation(w))

        def mix() -> int:
            c = xp.cumsum(a)
            m = xp.minimum(a, b) > 16
            g = c[idx]
            s = xp.where(m, g, 0).sum()
            k = xp.searchsorted(c, c[-1] // 2)
            return int(s) + int(k)

        out[w] = min(timeit.repeat(mix, number=repeats, repeat=5)) / repeats  # min: least disturbed
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds per configuration (5: 1,000 configurations)")
    ap.add_argument("--num-requests", type=int, default=200, help="requests per configuration")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the process pool")
    ap.add_argument("--backends", nargs="+", default=["numpy", "cupy"], help="backends to time (cupy: if usable)")
    ap.add_argument("--cupy-configs", type=int, default=200,
                    help="configurations timed on CuPy (seed 0, grid order; the first of the NumPy sweep)")
    ap.add_argument("--lockstep-sample", type=int, default=128,
                    help="configurations (seed 0, grid order) run with iteration tables for the batching analysis")
    ap.add_argument("--engine", default=None, help="simulate engine (default: simulate's own default)")
    ap.add_argument("--out", type=Path, default=None, help="folder for sweep_bench.csv / .md")
    args = ap.parse_args()

    if args.engine is not None:
        FIXED["engine"] = args.engine
    seeds = list(range(args.seeds))
    n_configs = int(np.prod([len(x) for x in GRID.values()])) * len(seeds)
    common = {"num_requests": args.num_requests, "seeds": seeds}
    os.environ[ENV_VAR] = "numpy"
    probe = kvlab.sweep(PROFILE, {"max_new_tokens": [128]}, fixed=FIXED, num_requests=2, progress=False)
    print(f"{n_configs:,} configurations x {args.num_requests} {PROFILE} requests, engine {probe['engine'][0]!r}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")

    rows = []

    def record(backend: str, executor: str, wall_s: float, cpu_s: float, table: str) -> None:
        rows.append({"backend": backend, "executor": executor, "configs": n_configs, "wall_s": wall_s,
                     "cpu_s": cpu_s, "configs_per_s": n_configs / wall_s, "speedup": t_serial / wall_s,
                     "table": table})
        print(f"{backend:6s} {executor:13s} {wall_s:8.2f} s wall {cpu_s:8.2f} s CPU {n_configs / wall_s:8.1f} configs/s "
              f"{t_serial / wall_s:6.2f}x numpy serial  table {table}")

    base, t_serial, c_serial = _timed_sweep("numpy", **common)
    record("numpy", "serial", t_serial, c_serial, "baseline")
    procs, t_procs, c_procs = _timed_sweep("numpy", executor="processes", max_workers=args.workers, **common)
    record("numpy", f"processes x{args.workers}", t_procs, c_procs, _same(procs, base))
    if "cupy" in args.backends:
        if cupy_usable():
            # The first --cupy-configs configurations (seed 0), one grid each, against the same
            # rows of the NumPy table; configurations per second compare across the two sizes.
            configs = _configs()[:args.cupy_configs]
            os.environ[ENV_VAR] = "cupy"
            cpu0, t0 = _cpu_s(), time.perf_counter()
            gpu = kvlab.sweep(PROFILE, [{k: [x] for k, x in c.items()} for c in configs], fixed=FIXED,
                              num_requests=args.num_requests, seeds=[0], progress=False)
            t_gpu, c_gpu = time.perf_counter() - t0, _cpu_s() - cpu0
            host = base[base["seed"] == 0].head(len(configs)).reset_index(drop=True)
            n_gpu = len(configs)
            rows.append({"backend": "cupy", "executor": "serial", "configs": n_gpu, "wall_s": t_gpu, "cpu_s": c_gpu,
                         "configs_per_s": n_gpu / t_gpu, "speedup": (n_gpu / t_gpu) / (n_configs / t_serial),
                         "table": _same(gpu, host)})
            print(f"cupy   serial        {t_gpu:8.2f} s wall {c_gpu:8.2f} s CPU {n_gpu / t_gpu:8.1f} configs/s "
                  f"{rows[-1]['speedup']:6.2f}x numpy serial  table {rows[-1]['table']} ({n_gpu} configurations)")
        else:
            print("cupy: not measured (no CuPy with a usable CUDA device here)")

    # Lockstep batching: the seed-0 configurations in grid order, with their iteration tables.
    os.environ[ENV_VAR] = "numpy"
    requests = kvlab.lengths.profile(PROFILE).sample(args.num_requests, seed=0)
    configs = _configs()[:args.lockstep_sample]
    t0 = time.perf_counter()
    tables = [kvlab.simulate(requests, seed=0, record_iterations=True, **FIXED, **c).iterations for c in configs]
    t_one = (time.perf_counter() - t0) / len(configs)
    lockstep = lockstep_analysis(tables, [b for b in (8, 32, 128) if b <= len(tables)])
    step_s = t_one / lockstep["event_steps_per_config"].iloc[0]
    print(f"one by one: {t_one * 1e3:.1f} ms per configuration with iteration tables, "
          f"{step_s * 1e6:.0f} us per event step ({probe['engine'][0]} engine: Python control + array work)")
    widths = sorted({args.num_requests * b for b in [1] + list(lockstep["configs_per_batch"])})
    for name in ("numpy", "cupy"):
        if name in args.backends and (name == "numpy" or cupy_usable()):
            cost = step_width_cost(get_xp(name), widths)
            lockstep[f"{name}_step_cost_ratio"] = [cost[args.num_requests * b] / cost[args.num_requests]
                                                   for b in lockstep["configs_per_batch"]]
            lockstep[f"{name}_max_gain_if_arrays_dominate"] = (lockstep["skipping_engine_max_gain"]
                                                               / lockstep[f"{name}_step_cost_ratio"])
            print(f"{name}: one mix of step array operations at {args.num_requests} requests: "
                  f"{cost[args.num_requests] * 1e6:.1f} us")
    print(f"lockstep batching bounds over {len(tables)} configurations (seed 0): max gain = one-by-one steps / "
          "batched steps; 'if arrays dominate' divides it by how much wider arrays cost")
    print(lockstep.to_string(index=False, float_format=lambda x: f"{x:.2f}"))

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        timing = pd.DataFrame(rows)
        timing.to_csv(args.out / "sweep_bench.csv", index=False)
        lockstep.to_csv(args.out / "sweep_lockstep.csv", index=False)
        md = [_markdown(timing), "", _markdown(lockstep)]
        (args.out / "sweep_bench.md").write_text("\n".join(md) + "\n")


def _markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, floatfmt=".3g") if _has_tabulate() else df.to_string(index=False)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
