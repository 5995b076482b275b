"""Sweep throughput: a 1,000-configuration ``kvlab.sweep``, in configurations per second.

One run measures, on the same grid:

* serial on NumPy, the baseline;
* a local process pool on NumPy (``executor="processes"``, every core), and its ratio to serial;
* serial on CuPy when a usable GPU is present, and its ratio to NumPy serial;
* whether the tables agree (they must be identical whatever the executor or backend);
* lockstep batching: bounds for every policy (:func:`kvlab.sim.batched.bounds.lockstep_analysis`:
  how often configurations' event iterations coincide), and the batched engine
  (:mod:`kvlab.sim.batched`, ``--parts batched``) against the compiled loop per process on the
  same in-scope sweep (``BATCHED_GRID``, roofline): configurations per second each way at
  several batch sizes S, the ratio, and the tables checked equal.

Grid: 5 policies x 5 ``max_new_tokens`` x 4 pool sizes x 2 preemption modes x 5 seeds (each
seed draws its own seed-figures requests and Poisson arrivals). Threads are pinned to one
before NumPy loads, so ``processes`` is the only parallelism.

Measured on the 2-core development machine (shared: load average 4-5 from other jobs, so wall
times carry their load; CPU seconds do not), fast engine, 200 requests per configuration,
2026-11-30: 1,000 configurations in 67 s serial (14.9 configurations/s, 65 CPU-seconds); a
process pool of 2 only 1.15x faster in wall time, the cores being busy with other jobs. Bounds:
in random batches the configurations' event iterations coincide enough for lockstep to take
2.6x (8 configurations) to 5.5x (32) fewer steps. The batched engine's measurement is in
``kvlab/sim/batched/choose.py`` and the README (``--parts batched``).

Run: ``python bench/bench_sweep.py [--parts sweep bounds batched] [--seeds 5] [--out DIR]``;
with ``--out`` it writes ``sweep_<part>.csv`` and ``sweep_bench.md`` there.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import itertools  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import kvlab  # noqa: E402
from kvlab.backend import ENV_VAR, cupy_usable  # noqa: E402
from kvlab.sim.batched import stats as batched_stats  # noqa: E402
from kvlab.sim.batched.bounds import lockstep_analysis  # noqa: E402

GRID = {"policy": ["vllm", "reserve_max", "tgi", "sglang", "orca_oracle"],
        "max_new_tokens": [128, 256, 512, 1024, 2048],
        "pool_pages": [125, 250, 500, 1000],
        "preemption_mode": ["recompute", "swap"]}
FIXED = {"model": "Llama-3-8B", "gpu": "H100-SXM", "arrivals": "poisson", "qps": 100.0}
PROFILE = "seed-figures"


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


#: The batched engine's comparison grid: every policy within its scope, both modes within it, the roofline
#: (the measured model is outside it). 5 policies x 5 caps x 4 pools x 2 modes = 200 configurations per seed.
BATCHED_GRID = {"policy": ["vllm", "reserve_max", "tgi", "orca_oracle", "orca_pow2"],
                "max_new_tokens": [128, 256, 512, 1024, 2048], "pool_pages": [125, 250, 500, 1000],
                "preemption_mode": ["recompute", "reject"]}
BATCHED_FIXED = {**FIXED, "cost_model": "roofline"}


def _batched_configs() -> list[dict]:
    return [dict(zip(BATCHED_GRID, combo)) for combo in itertools.product(*BATCHED_GRID.values())]


def batched_timing(args: argparse.Namespace) -> pd.DataFrame:
    """The batched engine against the compiled loop per process, on the same sweep.

    Per process: the whole ``BATCHED_GRID`` sweep (``--seeds`` seeds, 1,000 configurations by
    default) with ``batch="never"`` on ``--workers`` processes (the compiled loop). Batched: the
    first S configurations of seed 0 for each S of ``--batch-sizes`` as one ``batch="always"``
    sweep (one batch: prepare, the array program, summaries), on NumPy and, when usable, CuPy
    (there also the whole sweep in one batch). Each batched table must equal the per-process
    table's rows, or this raises.
    """
    seeds = list(range(args.seeds))
    configs = _batched_configs()
    common = {"num_requests": args.num_requests, "fixed": BATCHED_FIXED, "progress": False}
    print(f"batched engine vs compiled loop per process: {len(configs) * len(seeds):,} configurations x "
          f"{args.num_requests} {PROFILE} requests, load average {os.getloadavg()[0]:.1f}")
    os.environ[ENV_VAR] = "numpy"
    t0 = time.perf_counter()
    base = kvlab.sweep(PROFILE, BATCHED_GRID, seeds=seeds, batch="never", executor="processes",
                       max_workers=args.workers, **common)
    t_proc = time.perf_counter() - t0
    rate_proc = len(base) / t_proc
    rows = [{"engine": f"compiled loop, {args.workers} processes", "backend": "numpy", "configs": len(base),
             "wall_s": t_proc, "configs_per_s": rate_proc, "vs_per_process": 1.0, "steps": np.nan,
             "lockstep_use": np.nan, "fallback_share": np.nan, "table": "baseline"}]
    print(f"{rows[-1]['engine']:32s} {len(base):5d} configs {t_proc:8.2f} s {rate_proc:8.1f} configs/s")
    backends = [b for b in args.backends if b == "numpy" or (b == "cupy" and cupy_usable())]
    for name in backends:
        os.environ[ENV_VAR] = name
        sizes = [b for b in args.batch_sizes if b <= len(configs) and (name != "numpy" or b <= args.numpy_max_batch)]
        if name == "cupy":
            sizes = sorted(set(sizes) | {len(configs) * len(seeds)})
            kvlab.sweep(PROFILE, [{k: [x] for k, x in c.items()} for c in configs[:2]], seeds=[0], batch="always",
                        **common)  # CuPy's kernels compile outside the timing
        for size in sizes:
            if size <= len(configs):
                grid, run_seeds, want = [{k: [x] for k, x in c.items()} for c in configs[:size]], [0], \
                    base[base["seed"] == 0].head(size).reset_index(drop=True)
            else:
                grid, run_seeds, want = BATCHED_GRID, seeds, base
            stats = batched_stats.reset()
            t0 = time.perf_counter()
            got = kvlab.sweep(PROFILE, grid, seeds=run_seeds, batch="always", **common)
            dt = time.perf_counter() - t0
            rows.append({"engine": f"batched, S={size}", "backend": name, "configs": size, "wall_s": dt,
                         "configs_per_s": size / dt, "vs_per_process": size / dt / rate_proc,
                         "steps": stats.steps, "lockstep_use": stats.iterations / max(stats.steps * size, 1),
                         "fallback_share": stats.fallback_rows / max(stats.iterations, 1),
                         "table": _same(got, want)})
            r = rows[-1]
            print(f"{r['engine']:22s} {name:9s} {size:5d} configs {dt:8.2f} s {r['configs_per_s']:8.2f} configs/s "
                  f"{r['vs_per_process']:7.3f}x per-process  {r['steps']} steps, lockstep use "
                  f"{r['lockstep_use']:.2f}, fallback {r['fallback_share']:.3f} of iterations  table {r['table']}")
    return pd.DataFrame(rows)


def sweep_timing(args: argparse.Namespace) -> pd.DataFrame:
    """The 1,000-configuration sweep: NumPy serial, NumPy processes, CuPy serial (a prefix)."""
    seeds = list(range(args.seeds))
    n_configs = int(np.prod([len(x) for x in GRID.values()])) * len(seeds)
    common = {"num_requests": args.num_requests, "seeds": seeds}
    print(f"{n_configs:,} configurations x {args.num_requests} {PROFILE} requests, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    rows = []

    def record(backend: str, executor: str, n: int, wall_s: float, cpu_s: float, table: str) -> None:
        rows.append({"backend": backend, "executor": executor, "configs": n, "wall_s": wall_s, "cpu_s": cpu_s,
                     "configs_per_s": n / wall_s, "vs_numpy_serial": (n / wall_s) / (n_configs / t_serial),
                     "table": table})
        print(f"{backend:6s} {executor:13s} {n:5d} configs {wall_s:8.2f} s wall {cpu_s:8.2f} s CPU "
              f"{n / wall_s:8.1f} configs/s {rows[-1]['vs_numpy_serial']:6.2f}x numpy serial  table {table}")

    base, t_serial, c_serial = _timed_sweep("numpy", **common)
    record("numpy", "serial", n_configs, t_serial, c_serial, "baseline")
    procs, t_procs, c_procs = _timed_sweep("numpy", executor="processes", max_workers=args.workers, **common)
    record("numpy", f"processes x{args.workers}", n_configs, t_procs, c_procs, _same(procs, base))
    if "cupy" in args.backends and cupy_usable():
        # The first --cupy-configs configurations (seed 0), one grid each, against the same rows
        # of the NumPy table; configurations per second compare across the two sizes.
        configs = _configs()[:args.cupy_configs]
        os.environ[ENV_VAR] = "cupy"
        cpu0, t0 = _cpu_s(), time.perf_counter()
        gpu = kvlab.sweep(PROFILE, [{k: [x] for k, x in c.items()} for c in configs], fixed=FIXED,
                          num_requests=args.num_requests, seeds=[0], progress=False)
        t_gpu, c_gpu = time.perf_counter() - t0, _cpu_s() - cpu0
        host = base[base["seed"] == 0].head(len(configs)).reset_index(drop=True)
        record("cupy", "serial", len(configs), t_gpu, c_gpu, _same(gpu, host))
    elif "cupy" in args.backends:
        print("cupy: not measured (no CuPy with a usable CUDA device here)")
    return pd.DataFrame(rows)


def lockstep_bounds(args: argparse.Namespace, engine: str) -> pd.DataFrame:
    """:func:`lockstep_analysis` over the seed-0 configurations of the grid, in grid order."""
    os.environ[ENV_VAR] = "numpy"
    requests = kvlab.lengths.profile(PROFILE).sample(args.num_requests, seed=0)
    configs = _configs()[:args.lockstep_sample]
    t0 = time.perf_counter()
    tables = [kvlab.simulate(requests, seed=0, record_iterations=True, **FIXED, **c).iterations for c in configs]
    t_one = (time.perf_counter() - t0) / len(configs)
    bounds = lockstep_analysis(tables, [b for b in (8, 32, 128) if b <= len(tables)])
    step_s = t_one / bounds["event_steps_per_config"].iloc[0]
    print(f"one by one: {t_one * 1e3:.1f} ms per configuration with iteration tables, "
          f"{step_s * 1e6:.0f} us per event step ({engine} engine)")
    print(f"lockstep bounds over {len(tables)} configurations (seed 0): max gain = one-by-one steps / batched steps, "
          "if a batched step cost no more than one configuration's")
    print(bounds.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    return bounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["sweep", "bounds", "batched"],
                    choices=["sweep", "bounds", "batched"], help="what to measure")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per configuration (5: 1,000 configurations)")
    ap.add_argument("--num-requests", type=int, default=200, help="requests per configuration")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the process pool")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128],
                    help="simulations per batch timed for the batched engine (seed 0; CuPy adds the whole sweep)")
    ap.add_argument("--numpy-max-batch", type=int, default=10**9, help="largest batch timed on NumPy")
    ap.add_argument("--backends", nargs="+", default=["numpy", "cupy"], help="backends to time (cupy: if usable)")
    ap.add_argument("--cupy-configs", type=int, default=200,
                    help="configurations timed on CuPy (seed 0, grid order; the first of the NumPy sweep)")
    ap.add_argument("--lockstep-sample", type=int, default=128,
                    help="configurations (seed 0, grid order) run with iteration tables for the bounds")
    ap.add_argument("--engine", default=None, help="simulate engine (default: simulate's own default)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the CSV and markdown results")
    args = ap.parse_args()

    if args.engine is not None:
        FIXED["engine"] = args.engine
    os.environ[ENV_VAR] = "numpy"
    engine = kvlab.sweep(PROFILE, {"max_new_tokens": [128]}, fixed=FIXED, num_requests=2, progress=False)["engine"][0]
    print(f"engine {engine!r}")
    parts = {"sweep": lambda: sweep_timing(args), "bounds": lambda: lockstep_bounds(args, engine),
             "batched": lambda: batched_timing(args)}
    tables = []
    for name in args.parts:
        table = parts[name]()
        if name == "batched":
            print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        tables.append(table)
        if args.out is not None:  # each part as soon as it is done: a timeout keeps what finished
            args.out.mkdir(parents=True, exist_ok=True)
            table.to_csv(args.out / f"sweep_{name}.csv", index=False)
            (args.out / "sweep_bench.md").write_text("\n\n".join(_markdown(t) for t in tables) + "\n")


def _markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, floatfmt=".3g") if _has_tabulate() else df.to_string(index=False)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
