"""Speed of the simulator on real traffic: Azure conversation lengths, Llama-2-70B TP2 on A100-80GB-SXM.

Set-up (issue #16; the one Vidur's event loop was measured on, 370-700 simulated requests/s):

* Requests: the prompt/output lengths of the Azure LLM inference trace 2023, conversation
  (``../shared/data/traces/azure2023_conv.csv`` beside the repository, or under
  ``$KVLAB_SHARED_DATA``, when present, else the shipped ``azure-2023-conv`` profile fitted to
  it), resampled with replacement to the size asked (seed 0), each request's total clipped to 4,096 tokens by shortening its prompt (Vidur's
  ``max_tokens`` rule; the output is clipped to 4,095 first so a prompt keeps one token).
* Serving: Llama-2-70B with TP 2 on A100-80GB-SXM, pool from 90% of memory, the DEFAULT cost
  model (what users run: measured where the GPU has measurements), ``max_new_tokens`` 4,096,
  ``max_num_seqs`` 256; two schedulers: vLLM-style ``prefill_first`` (4,096-token budget) and
  Sarathi-style ``chunked`` with a 512-token budget. Policies: ``vllm``, ``sglang`` (admission
  reads the running batch, per-iteration ratio: compiled forms) and ``predicted`` with the
  ``shortest_predicted`` queue order (an ordered queue: a rank per request).
* Load: Poisson arrivals at 90% of the configuration's capacity and at twice it; capacity is
  vLLM's offline throughput (requests/s, all arrive at 0) on the same requests, measured here.

Printed, in one run: the first-run build of the loop in a fresh process with an empty cache
(compiled ahead of time, ``kvlab.sim.fast.aot``; announced on its stderr, its CPU seconds
measured); the fixed cost of a whole process (interpreter, imports, a 10-request simulation that
loads the built loop: CPU seconds of the child, least and median of ``--repeats`` runs, target
< 0.5), and the same with Numba's cached JIT loop (``KVLAB_AOT=0``) beside it; per configuration
and policy the simulated requests per CPU second on ``N`` requests (target >= 50,000 for vLLM;
every policy within 3x of vLLM's), the reference engine's on the first ``N_REF`` (results
checked identical); vLLM's rule written as a policy class in this script against the built-in
``vllm``; then each configuration on 1,000,000 requests in its own process: time inside the
process and the whole process's CPU seconds (target < 15 s) and peak resident memory (target
< 4 GiB). Times are CPU seconds, so that a shared machine does not inflate them; wall seconds
are printed beside them.

Run: ``python bench/bench_real_traffic.py [N] [N_REF] [N_BIG] [--trace PATH] [--skip-big] [--skip-compile]
[--fixed-cost-only] [--repeats R]`` (defaults 10,000, 2,000, 1,000,000, 5; ``--fixed-cost-only``: only
the first-run build and the fixed costs). Threads are pinned to one; the array module is NumPy.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("KVLAB_BACKEND", "numpy")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kvlab import traces  # noqa: E402
from kvlab._paths import SHARED_DATA_DIR  # noqa: E402
from kvlab.policies import Policy, Requests  # noqa: E402
from kvlab.sim import simulate  # noqa: E402

TRACE = SHARED_DATA_DIR / "traces" / "azure2023_conv.csv"
PROFILE = "azure-2023-conv"
MAX_TOTAL_TOKENS = 4096
TARGET_RATE, TARGET_S, TARGET_GIB = 50_000.0, 15.0, 4.0
SETUP = {"model": "Llama-2-70B", "gpu": "A100-80GB-SXM", "tp": 2, "max_new_tokens": 4096, "max_num_seqs": 256}
POLICIES = {"vllm": {}, "sglang": {}, "predicted-sjf": {"queue_order": "shortest_predicted"}}
TARGET_VS_VLLM, TARGET_FIXED_S = 3.0, 0.5
CONFIGS = {"prefill_first": {"scheduler": "prefill_first", "max_num_batched_tokens": 4096},
           "chunked-512": {"scheduler": "chunked", "max_num_batched_tokens": 512}}
LOADS = {"90%": 0.9, "200%": 2.0}


def requests(n: int, trace: Path | None) -> tuple[pd.DataFrame, str]:
    """``n`` requests (prompt, output tokens) resampled from the trace's lengths, clipped to 4,096 in total."""
    rng = np.random.default_rng(0)
    if trace is not None and trace.exists():
        lengths = traces.load(trace)
        pick = rng.integers(0, len(lengths), n)
        prompt = lengths["prompt_tokens"].to_numpy()[pick]
        output = lengths["output_tokens"].to_numpy()[pick]
        source = f"trace {trace.name} ({len(lengths):,} requests, resampled)"
    else:  # the fitted profile needs SciPy: imported only here, so a process that reads the trace never loads it
        from kvlab.lengths import profile

        w = profile(PROFILE).sample(n, seed=0)
        prompt, output = w["prompt_tokens"].to_numpy(), w["output_tokens"].to_numpy()
        source = f"profile {PROFILE} (trace not found)"
    output = np.minimum(output, MAX_TOTAL_TOKENS - 1)
    prompt = np.minimum(prompt, MAX_TOTAL_TOKENS - output)
    return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output}), source


class RetoldVLLM(Policy):
    """vLLM's rule written outside kvlab (context reserved, 1% of the pool kept free, pages on demand)."""

    name = "bench_retold_vllm"
    on_demand = True

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + reqs.generated_tokens

    def admission_headroom_pages(self, reqs: Requests) -> Any:
        return int(0.01 * self.num_pages)


def _run(w: pd.DataFrame, config: str, qps: float | None, engine: str = "fast", record_iterations: bool = False,
         policy: str | Policy = "vllm"):
    """One simulation; returns (result, CPU seconds of this process, wall seconds)."""
    arrivals = {"arrivals": "offline"} if qps is None else {"arrivals": "poisson", "qps": qps}
    params = {}
    if isinstance(policy, str):
        policy, params = policy.split("-")[0], POLICIES[policy]
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(w, policy, engine=engine, record_iterations=record_iterations, **SETUP, **CONFIGS[config],
                   **arrivals, **params)
    return res, time.process_time() - c0, time.perf_counter() - t0


def _whole_cpu_s(argv: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``argv`` as a fresh process: its completed run and its whole CPU seconds (user + system).
    Bytecode is cached as an installed package has it (``PYTHONDONTWRITEBYTECODE`` is dropped: with
    it, every process compiled kvlab's modules from source again, ~0.06 CPU s that users never pay)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env={**child, **(env or {})})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _child(args: list[str], env: dict | None = None) -> tuple[dict, float, str]:
    """Run this script with ``args`` in a fresh process: its JSON line, its whole CPU seconds, its stderr."""
    out, cpu_s = _whole_cpu_s([sys.executable, __file__, *args], env)
    return json.loads(out.stdout.splitlines()[-1]), cpu_s, out.stderr


#: What every such process pays before kvlab's own code, each measured alone as a whole process:
#: the interpreter and the imports kvlab cannot do without (its results are pandas tables).
FLOORS = {"interpreter": "pass", "+ import numpy, pandas": "import numpy, pandas"}


def _cpu_stats(argv: list[str], env: dict | None = None, runs: int = 5) -> tuple[float, float]:
    """The least and the median whole-process CPU seconds of ``runs`` runs of ``argv`` (the machine may be shared)."""
    times = [_whole_cpu_s(argv, env)[1] for _ in range(runs)]
    return min(times), float(np.median(times))


def process_costs(trace: Path, compile_too: bool, runs: int = 5) -> None:
    """The first-run build (empty Numba cache: the loop compiled ahead of time), the fixed cost of a
    process that loads the built loop (and of one that loads Numba's cached JIT loop instead,
    ``KVLAB_AOT=0``), and what of it every process pays before kvlab's own code (:data:`FLOORS`)."""
    import tempfile

    one_run = [sys.executable, __file__, "--trace", str(trace), "--one", "10", "chunked-512", "1.0"]
    if compile_too:
        with tempfile.TemporaryDirectory() as cache:
            _, cpu_s, err = _child(one_run[2:], {"NUMBA_CACHE_DIR": cache})
        said = [line for line in err.splitlines() if line.startswith("kvlab:")]
        print(f"first run after installing (empty cache): whole process {cpu_s:.1f} CPU s; it said: "
              + " / ".join(said))
    least = {}
    for aot, label in (("1", "the ahead-of-time loop"), ("0", "Numba's cached JIT loop instead (KVLAB_AOT=0)")):
        _child(one_run[2:], {"KVLAB_AOT": aot})  # built or cached
        least[aot], median = _cpu_stats(one_run, {"KVLAB_AOT": aot}, runs)
        target = f" (target < {TARGET_FIXED_S}: {'met' if least[aot] < TARGET_FIXED_S else 'MISSED'})"
        print(f"fixed cost of a process (interpreter, imports, {label}, 10 requests): {least[aot]:.2f} CPU s least, "
              f"{median:.2f} median of {runs}" + (target if aot == "1" else ""))
    floors = {label: _cpu_stats([sys.executable, "-c", code], None, runs)[0] for label, code in FLOORS.items()}
    print("  of it, what any such process pays (each alone, cumulative, least): "
          + ", ".join(f"{label} {s:.2f}" for label, s in floors.items())
          + f" CPU s; kvlab's own share (its imports, the trace, setting up, loading the loop, 10 requests, "
            f"tables): {least['1'] - floors['+ import numpy, pandas']:.2f} CPU s")


def one(n: int, config: str, qps: float, trace: Path | None) -> None:
    """Child process: one fast run on ``n`` requests; print wall time and peak memory as JSON."""
    w, _ = requests(n, trace)
    res, cpu_s, wall_s = _run(w, config, qps)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # ru_maxrss is KiB on Linux
    print(json.dumps({"cpu_s": cpu_s, "wall_s": wall_s, "peak_gib": peak_gib,
                      "iterations": res.summary["num_iterations"],
                      "preemptions_per_request": res.summary["preemptions_per_request"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=10_000)
    ap.add_argument("n_ref", nargs="?", type=int, default=2_000)
    ap.add_argument("n_big", nargs="?", type=int, default=1_000_000)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--fixed-cost-only", action="store_true", help="only the first-run build and the fixed cost")
    ap.add_argument("--repeats", type=int, default=5, help="runs per fixed-cost figure (least and median)")
    ap.add_argument("--one", nargs=3, metavar=("N", "CONFIG", "QPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(int(args.one[0]), args.one[1], float(args.one[2]), args.trace)
        return
    if args.fixed_cost_only:
        process_costs(args.trace, not args.skip_compile, args.repeats)
        return
    from bench_engine import same_results  # the same check (bench/ is on sys.path when run); here, not at the
    # top, so that the child processes, whose whole CPU time is measured, import only what a user's process does

    w, source = requests(args.n, args.trace)
    print(f"{source}; {SETUP['model']} TP{SETUP['tp']} on {SETUP['gpu']}, default cost model, "
          f"policies {', '.join(POLICIES)}, NumPy backend, {os.cpu_count()} CPUs")
    print("Times are CPU seconds (the machine may be shared); wall seconds beside them.")
    process_costs(args.trace, not args.skip_compile, args.repeats)
    _run(w.iloc[:50], "chunked-512", None)  # the loop loaded in this process
    rows, capacity = [], {}
    for config in CONFIGS:
        offline, _, _ = _run(w, config, None)
        capacity[config] = offline.summary["requests_per_s"]
        for load, share in LOADS.items():
            qps = share * capacity[config]
            row = {"config": config, "load": load, "qps": qps, "requests": args.n}
            for name in POLICIES:
                res, t_cpu, t_wall = _run(w, config, qps, record_iterations=True, policy=name)
                row[f"{name} req/s"] = args.n / t_cpu
                row[f"{name} wall_s"] = t_wall
                row[f"{name} preempt/req"] = res.summary["preemptions_per_request"]
                if args.n_ref:
                    w_ref = w.iloc[:args.n_ref]
                    ref, _, _ = _run(w_ref, config, qps, engine="reference", record_iterations=True, policy=name)
                    mine = res if args.n_ref == args.n else _run(w_ref, config, qps, record_iterations=True,
                                                                 policy=name)[0]
                    row["identical"] = row.get("identical", True) and same_results(ref, mine)
            rows.append(row)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
    worst = float(table["vllm req/s"].min())
    print(f"vllm on {args.n:,} requests: {worst:,.0f} simulated requests per CPU second at worst "
          f"(target >= {TARGET_RATE:,.0f}: {'met' if worst >= TARGET_RATE else 'MISSED'})"
          + (f"; results identical to the reference: {bool(table['identical'].all())}" if args.n_ref else ""))
    for name in list(POLICIES)[1:]:
        slow = float((table["vllm req/s"] / table[f"{name} req/s"]).max())
        print(f"{name}: at worst {slow:.2f}x vllm's time in the same run (target <= {TARGET_VS_VLLM:.0f}x: "
              f"{'met' if slow <= TARGET_VS_VLLM else 'MISSED'})")
    config, qps = "chunked-512", LOADS["90%"] * capacity["chunked-512"]
    built_in, t_built_in, _ = _run(w, config, qps, record_iterations=True)
    retold, t_retold, _ = _run(w, config, qps, record_iterations=True, policy=RetoldVLLM())
    print(f"vLLM's rule as a policy class written in this script vs the built-in vllm ({config}, 90%): "
          f"{t_retold:.2f} s vs {t_built_in:.2f} s, ratio {t_retold / t_built_in:.2f} "
          f"(issue #16 measured 50x before); results identical: {same_results(built_in, retold)}")
    if args.skip_big:
        return
    for config in CONFIGS:
        for load, share in LOADS.items():
            qps = share * capacity[config]
            r, whole_s, _ = _child(["--trace", str(args.trace), "--one", str(args.n_big), config, str(qps)])
            print(f"{args.n_big:,} requests, {config:13s} at {load:>4s} of capacity: {r['cpu_s']:6.2f} CPU s "
                  f"in the simulation, {whole_s:6.2f} CPU s the whole process (wall {r['wall_s']:.2f} s; target "
                  f"< {TARGET_S:.0f} s: {'met' if whole_s < TARGET_S else 'MISSED'}), "
                  f"peak RSS {r['peak_gib']:.2f} GiB (target < {TARGET_GIB:.0f}: "
                  f"{'met' if r['peak_gib'] < TARGET_GIB else 'MISSED'}), {r['iterations']:,.0f} iterations, "
                  f"{r['preemptions_per_request']:.3f} preemptions/request")


if __name__ == "__main__":
    main()
