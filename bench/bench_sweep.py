"""Sweep throughput: a 1,000-configuration ``kvlab.sweep``, in configurations per second.

One run measures, on the same grid:

* serial on NumPy, the baseline;
* a local process pool on NumPy (``executor="processes"``, every core), and its ratio to serial;
* serial on CuPy when a usable GPU is present, and its ratio to NumPy serial;
* whether the tables agree (they must be identical whatever the executor or backend);
* lockstep batching, would advancing many configurations together in one array program pay?
  Bounds for every policy (:func:`lockstep_analysis`: how often configurations' event
  iterations coincide), and a measurement: :func:`lockstep_reserve_max`, a prototype that
  runs a batch of ``reserve_max`` configurations in lockstep on NumPy or CuPy, checked against
  kvlab's engine integer for integer, timed against kvlab one configuration at a time.

Grid: 5 policies x 5 ``max_new_tokens`` x 4 pool sizes x 2 preemption modes x 5 seeds (each
seed draws its own seed-figures requests and Poisson arrivals). Threads are pinned to one
before NumPy loads, so ``processes`` is the only parallelism.

Measured on the 2-core development machine (shared: load average 4-5 from other jobs, so wall
times carry their load; CPU seconds do not), fast engine, 200 requests per configuration,
2026-11-30: 1,000 configurations in 67 s serial (14.9 configurations/s, 65 CPU-seconds); a
process pool of 2 only 1.15x faster in wall time, the cores being busy with other jobs. Bounds:
in random batches the configurations' event iterations coincide enough for lockstep to take
2.6x (8 configurations) to 5.5x (32) fewer steps. The prototype, which steps every iteration
over [batch, requests] arrays, measured 0.14x kvlab for 1 configuration, 0.7x for 8, 1.1x for
32 and 1.6x for 128 (a batch runs as long as its slowest member; array cost grows with width),
while covering one policy without preemption. So on a CPU lockstep does not pay enough to be a
second engine; processes and Dask scale instead. On a GPU, width is nearly free: the CuPy rows
of the prototype (bench/gpu_check.sh) measure whether it pays there.

Run: ``python bench/bench_sweep.py [--parts sweep bounds prototype] [--seeds 5] [--out DIR]``;
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
from kvlab.arrivals import arrival_times  # noqa: E402
from kvlab.costmodel import roofline  # noqa: E402
from kvlab.backend import ENV_VAR, cupy_usable, get_xp  # noqa: E402

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


def lockstep_reserve_max(xp, workloads: list[tuple[np.ndarray, np.ndarray, np.ndarray]], *,
                         max_new_tokens: list[int], pool_pages: list[int], block_size: int,
                         max_num_batched_tokens: int, max_num_seqs: int, cost) -> list[np.ndarray]:
    """A measurement prototype: B configurations advanced together, one iteration per array step.

    Restricted to what makes it short: ``reserve_max`` (TensorRT-LLM's reserve-to-max), chunked
    scheduling, FCFS, every request fitting the pool (so no preemption and no abort ever
    happens: the queue is admitted strictly in arrival order, and the waiting queue is a range
    of the arrival-sorted requests). Arrays are [B, n] on ``xp``; each step runs one iteration
    of every unfinished configuration with the reference engine's rules (see
    :mod:`kvlab.sim.reference`): decodes, then partial prefills, then the longest admissible
    prefix of the queue, each by a cumulative sum. It is not kvlab's engine and is checked
    against it in :func:`lockstep_measurement`.

    Parameters
    ----------
    workloads : list of (prompt_tokens, output_tokens, arrival_s)
        One host array triple per configuration, all of the same length n.

    Returns
    -------
    list of ndarray, each [B, n] in the workloads' row order
        admitted_iter, first_token_iter, finish_iter, finish_s, first_token_s.
    """
    b_n = len(workloads)
    order = [np.lexsort((np.arange(len(w[2])), w[2])) for w in workloads]     # arrival, then row
    P = xp.asarray(np.stack([w[0][o] for w, o in zip(workloads, order)]))
    out = np.stack([w[1][o] for w, o in zip(workloads, order)])
    arr = xp.asarray(np.stack([w[2][o] for w, o in zip(workloads, order)]))
    n = P.shape[1]
    mnt = xp.asarray(np.asarray(max_new_tokens, dtype=np.int64))[:, None]
    bs = int(block_size)
    T = xp.minimum(xp.asarray(out), mnt)
    R = -(-(P + mnt) // bs)                                   # reserve_max pages per request
    num_pages = xp.asarray(np.asarray(pool_pages, dtype=np.int64))
    if bool((R.max(axis=1) > num_pages).any()):
        raise ValueError("a request exceeds a pool: the prototype does not model exceeds_pool aborts")
    idx = xp.arange(n)[None, :]
    C = xp.zeros((b_n, n), dtype=xp.int64)
    G = xp.zeros_like(C)
    S = xp.zeros_like(C)                                      # 0 waiting/pending, 1 running, 2 finished
    A = xp.full((b_n, n), -1, dtype=xp.int64)
    F, Fi = A.copy(), A.copy()
    Fs = xp.full((b_n, n), np.nan)
    Ft = Fs.copy()
    now = xp.zeros(b_n)
    k = xp.zeros(b_n, dtype=xp.int64)
    nxt = xp.zeros(b_n, dtype=xp.int64)                     # next request to admit (FCFS, no preemption)
    budget0 = int(max_num_batched_tokens)
    while True:
        running = S == 1
        num_running = running.sum(axis=1)
        active = (nxt < n) | (num_running > 0)
        if not bool(active.any()):
            break
        arrived = (arr <= now[:, None]).sum(axis=1)
        idle = active & (num_running == 0) & (nxt == arrived)
        jump = xp.take_along_axis(arr, xp.minimum(nxt, n - 1)[:, None], axis=1)[:, 0]
        now = xp.where(idle, jump, now)
        arrived = (arr <= now[:, None]).sum(axis=1)
        # running: decodes first, then partial prefills, each in admission (= index) order
        remaining = P + G - C
        decoding = running & (G > 0) & (remaining == 1)
        prefilling = running & ~decoding
        dec_rank = xp.cumsum(decoding, axis=1)
        dec_chunk = (decoding & (dec_rank <= budget0)).astype(xp.int64)
        left = budget0 - dec_chunk.sum(axis=1)
        pre_rem = xp.where(prefilling, remaining, 0)
        before = xp.cumsum(pre_rem, axis=1) - pre_rem
        pre_chunk = xp.clip(left[:, None] - before, 0, pre_rem)
        left2 = left - pre_chunk.sum(axis=1)
        # admission: the longest FCFS prefix of the queue that passes every check
        waiting = (idx >= nxt[:, None]) & (idx < arrived[:, None])
        wp = xp.where(waiting, P, 0)
        p_before = xp.cumsum(wp, axis=1) - wp
        r_cum = xp.cumsum(xp.where(waiting, R, 0), axis=1)
        m = xp.cumsum(waiting, axis=1) - 1
        uncommitted = num_pages - xp.where(running, R, 0).sum(axis=1)
        admit = (waiting & (num_running[:, None] + m < max_num_seqs) & (left2[:, None] - p_before > 0)
                 & (r_cum <= uncommitted[:, None]) & active[:, None])
        adm_chunk = xp.where(admit, xp.minimum(P, left2[:, None] - p_before), 0)
        A = xp.where(admit, k[:, None], A)
        S = xp.where(admit, 1, S)
        nxt = nxt + admit.sum(axis=1)
        chunk = dec_chunk + pre_chunk + adm_chunk
        sched = chunk > 0
        num_tokens = chunk.sum(axis=1)
        pairs = (chunk * C + chunk * (chunk + 1) // 2).sum(axis=1)
        kv = xp.where(sched, C + chunk, 0).sum(axis=1)
        duration = cost.iteration_s(num_tokens, pairs, kv)
        end = now + duration
        C = C + chunk
        produced = sched & (P + G == C)
        G = G + produced
        first = produced & (G == 1)
        F = xp.where(first, k[:, None], F)
        Ft = xp.where(first, end[:, None], Ft)
        fin = produced & (G == T)
        Fi = xp.where(fin, k[:, None], Fi)
        Fs = xp.where(fin, end[:, None], Fs)
        S = xp.where(fin, 2, S)
        now = xp.where(active, end, now)
        k = k + active
    res = []
    for a in (A, F, Fi, Fs, Ft):
        h = a.get() if hasattr(a, "get") else np.asarray(a)
        un = np.empty_like(h)
        for b, o in enumerate(order):
            un[b, o] = h[b]
        res.append(un)
    return res


LOCKSTEP_GRID = {"max_new_tokens": [128, 256, 512, 1024], "pool_pages": [500, 1000, 2000, 4000], "seed": list(range(32))}
#: Configurations per lockstep batch timed on each backend (a GPU's width is nearly free).
LOCKSTEP_BATCHES = {"numpy": (1, 8, 32, 128), "cupy": (8, 32, 128, 512)}


def lockstep_measurement(num_requests: int, backends: list[str]) -> pd.DataFrame:
    """Time the lockstep prototype against kvlab's engine one configuration at a time.

    512 ``reserve_max`` configurations (4 caps x 4 pools x 32 seeds, Poisson 100 requests/s),
    batched in that order, kvlab.sweep's (:data:`LOCKSTEP_BATCHES` per backend): a batch of 32
    is one configuration's 32 seeds, the most alike a batch gets.
    Every configuration's admission, first-token and finish iterations must equal kvlab's
    (``simulate`` with its default engine; the first four also against ``engine="reference"``)
    and its finish times must be bit-identical, or this raises. kvlab's time per configuration
    includes building its request table and summary, which the prototype skips.
    """
    rows_cfg = [dict(zip(LOCKSTEP_GRID, c)) for c in itertools.product(*LOCKSTEP_GRID.values())]
    cost = roofline(FIXED["model"], FIXED["gpu"])
    kw = {"model": FIXED["model"], "gpu": FIXED["gpu"], "arrivals": "poisson", "qps": 100.0}
    samples = {s: kvlab.lengths.profile(PROFILE).sample(num_requests, seed=s) for s in LOCKSTEP_GRID["seed"]}
    host = {s: (w["prompt_tokens"].to_numpy(), w["output_tokens"].to_numpy(),
                arrival_times(num_requests, "poisson", qps=100.0, seed=s)) for s, w in samples.items()}
    os.environ[ENV_VAR] = "numpy"
    t0 = time.perf_counter()
    tables = [kvlab.simulate(samples[c["seed"]], "reserve_max", max_new_tokens=c["max_new_tokens"],
                             pool_pages=c["pool_pages"], seed=c["seed"], **kw).requests for c in rows_cfg]
    t_kvlab = (time.perf_counter() - t0) / len(rows_cfg)
    for c, table in zip(rows_cfg[:4], tables):
        ref = kvlab.simulate(samples[c["seed"]], "reserve_max", max_new_tokens=c["max_new_tokens"],
                             pool_pages=c["pool_pages"], seed=c["seed"], engine="reference", **kw).requests
        pd.testing.assert_frame_equal(table, ref, check_exact=True)

    def run(xp, cfgs: list[dict]) -> list[np.ndarray]:
        return lockstep_reserve_max(xp, [host[c["seed"]] for c in cfgs],
                                    max_new_tokens=[c["max_new_tokens"] for c in cfgs],
                                    pool_pages=[c["pool_pages"] for c in cfgs], block_size=16,
                                    max_num_batched_tokens=2048, max_num_seqs=256, cost=cost)

    columns = ("admitted_iter", "first_token_iter", "finish_iter", "finish_s", "first_token_s")
    out = [{"backend": "numpy", "engine": "kvlab one by one", "configs_per_batch": 1, "s_per_batch": t_kvlab,
            "ms_per_config": t_kvlab * 1e3, "vs_kvlab": 1.0}]
    for name in backends:
        if name not in LOCKSTEP_BATCHES or (name == "cupy" and not cupy_usable()):
            continue
        xp = get_xp(name)
        if name == "cupy":
            run(xp, rows_cfg[:2])  # compile the kernels outside the timing
        for b in LOCKSTEP_BATCHES[name]:
            cfgs = rows_cfg[:b]
            t0 = time.perf_counter()
            result = run(xp, cfgs)
            dt = time.perf_counter() - t0
            for i, table in enumerate(tables[:b]):
                for col, got in zip(columns, result):
                    want = table[col].to_numpy()
                    if not np.array_equal(got[i], want, equal_nan=True):
                        raise AssertionError(f"lockstep prototype on {name} differs from kvlab in {col}, "
                                             f"configuration {cfgs[i]}")
            out.append({"backend": name, "engine": "lockstep prototype", "configs_per_batch": b, "s_per_batch": dt,
                        "ms_per_config": dt / b * 1e3, "vs_kvlab": t_kvlab / (dt / b)})
    return pd.DataFrame(out)


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
    ap.add_argument("--parts", nargs="+", default=["sweep", "bounds", "prototype"],
                    choices=["sweep", "bounds", "prototype"], help="what to measure")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per configuration (5: 1,000 configurations)")
    ap.add_argument("--num-requests", type=int, default=200, help="requests per configuration")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the process pool")
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
             "prototype": lambda: lockstep_measurement(args.num_requests, args.backends)}
    tables = []
    for name in args.parts:
        table = parts[name]()
        if name == "prototype":
            print("lockstep prototype (reserve_max; same integers and finish times as kvlab's engine):")
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
