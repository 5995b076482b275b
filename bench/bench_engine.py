"""Speed of the simulator engines (kvlab.sim): the fast engine on 1,000,000 requests, and fast vs reference.

1. 1,000,000 requests of the seed-figures profile through the ``vllm`` policy (Llama-3-8B on
   H100-SXM, chunked prefill, default limits), offline and at a Poisson rate of 80% of the
   offline throughput measured in the same run: wall time (target < 10 s on a 2-core machine)
   and peak resident memory of the process (target < 4 GiB). Each case runs in its own process
   so that its peak memory is its own.
2. Fast vs reference engine on 10,000 requests of the same profile, offline and Poisson: wall
   times and the ratio (target >= 50x), with the results checked equal; the fast engine's
   one-off load of its compiled loop is timed and printed apart (section 1 includes it).
3. The fast engine with the measured cost model next to the spec-sheet roofline, on the same
   200,000 requests offline and at Poisson arrivals, in one run: wall time of each (best of two)
   and the ratio of time per iteration (target: the measured model costs at most 1.5x).

Run: ``python bench/bench_engine.py [num_requests] [num_requests_vs_reference] [num_requests_cost_models]``.
Threads are pinned to one before NumPy loads; the array module is NumPy (``KVLAB_BACKEND=numpy``);
sections 1 and 2 run the default cost model (the measured one on H100-SXM).
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("KVLAB_BACKEND", "numpy")

import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kvlab import _validate  # noqa: E402
from kvlab.costmodel import cost_model  # noqa: E402
from kvlab.lengths import profile  # noqa: E402
from kvlab.sim import simulate  # noqa: E402

TARGET_S, TARGET_GIB, TARGET_RATIO, TARGET_COST_RATIO = 10.0, 4.0, 50.0, 1.5
SETUP = {"model": "Llama-3-8B", "gpu": "H100-SXM"}
PROFILE, POLICY, QPS_SHARE = "seed-figures", "vllm", 0.8


def _run(n: int, engine: str, qps: float | None, record_iterations: bool = False,
         cost_model: str | None = None) -> tuple[object, float]:
    w = profile(PROFILE).sample(n, seed=0)
    arrivals = {} if qps is None else {"arrivals": "poisson", "qps": qps}
    t0 = time.perf_counter()
    res = simulate(w, POLICY, engine=engine, record_iterations=record_iterations, cost_model=cost_model, **SETUP,
                   **arrivals)
    return res, time.perf_counter() - t0


def one(n: int, qps: float | None) -> None:
    """Child process: one fast run; print its figures as JSON."""
    res, wall_s = _run(n, "fast", qps)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # ru_maxrss is KiB on Linux
    w = profile(PROFILE).sample(n, seed=0)
    t0 = time.perf_counter()
    for col in ("prompt_tokens", "output_tokens"):  # simulate()'s input check, timed alone
        _validate.positive_int_array(w[col].to_numpy(), col)
    check_s = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall_s, "check_s": check_s, "peak_gib": peak_gib,
                      "iterations": res.summary["num_iterations"],
                      "requests_per_s": res.summary["requests_per_s"], "mean_batch": res.summary["mean_batch_size"],
                      "preemptions_per_request": res.summary["preemptions_per_request"]}))


def _child(n: int, qps: float | None) -> dict:
    args = [sys.executable, __file__, "--one", str(n)] + ([] if qps is None else [str(qps)])
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def same_results(a, b) -> bool:
    """Whether two SimResults hold the same per-request and per-iteration tables (floats to 1e-9)."""
    for x, y in ((a.requests, b.requests), (a.iterations, b.iterations)):
        for col in x.columns:
            u, v = x[col].to_numpy(), y[col].to_numpy()
            if u.dtype.kind == "f":
                if not np.allclose(u, v, rtol=1e-9, atol=0, equal_nan=True):
                    return False
            elif not (u == v).all():
                return False
    return True


def main(n: int = 1_000_000, n_ref: int = 10_000, n_cost: int = 200_000) -> None:
    print(f"{PROFILE} profile, policy {POLICY}, {SETUP['model']} on {SETUP['gpu']}, chunked prefill, "
          f"NumPy backend, {os.cpu_count()} CPUs; cost model {cost_model(**SETUP).label}")
    offline = _child(n, None)
    qps = QPS_SHARE * offline["requests_per_s"]
    poisson = _child(n, qps)
    for name, r in ((f"{n:,} requests offline", offline), (f"{n:,} requests Poisson {qps:.1f}/s", poisson)):
        print(f"fast engine, {name:34s} {r['wall_s']:6.2f} s (target < {TARGET_S:.0f} s: "
              f"{'met' if r['wall_s'] < TARGET_S else 'MISSED'}; of which {r['check_s']:.2f} s checking the "
              f"workload's integer columns), peak RSS {r['peak_gib']:.2f} GiB "
              f"(target < {TARGET_GIB:.0f}: {'met' if r['peak_gib'] < TARGET_GIB else 'MISSED'}); "
              f"{r['iterations']:,.0f} iterations, {r['iterations'] / r['wall_s']:,.0f} iterations/s, "
              f"mean batch {r['mean_batch']:.1f}, {r['requests_per_s']:.1f} requests/s served")
    _, t_warm = _run(50, "fast", None)  # the compiled loop loads (or compiles) once per process: not timed below
    print(f"compiled loop ready in {t_warm:.2f} s (first use in this process)")
    rows = []
    for label, rate in (("offline", None), ("poisson", qps)):
        ref, t_ref = _run(n_ref, "reference", rate, record_iterations=True)
        fst, t_fast = _run(n_ref, "fast", rate, record_iterations=True)
        rows.append({"arrivals": label, "requests": n_ref, "reference_s": t_ref, "fast_s": t_fast,
                     "ratio": t_ref / t_fast, "identical": same_results(ref, fst),
                     "iterations": int(ref.summary["num_iterations"])})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    worst = float(table["ratio"].min())
    print(f"fast vs reference on {n_ref:,} requests: {worst:.1f}x at worst (target >= {TARGET_RATIO:.0f}x: "
          f"{'met' if worst >= TARGET_RATIO else 'MISSED'}); results identical: {bool(table['identical'].all())}")
    cost_model_ratio(n_cost)


def cost_model_ratio(n: int) -> None:
    """Section 3: the fast engine under the measured cost model vs the roofline, best of two each.

    Offline both models run the same iterations; under Poisson arrivals each model runs at 80%
    of its own offline throughput (the models differ 8x in speed, so one rate would load them
    differently), and the iterations differ: the ratio is of time per iteration.
    """
    rows = []
    rate: dict[str, float] = {}
    for label in ("offline", "poisson"):
        best: dict[str, tuple[float, int]] = {}
        for _ in range(2):
            for cm in ("roofline", "measured"):
                res, wall_s = _run(n, "fast", rate.get(cm) if label == "poisson" else None, cost_model=cm)
                if label == "offline":
                    rate[cm] = QPS_SHARE * res.summary["requests_per_s"]
                if wall_s < best.get(cm, (float("inf"), 0))[0]:
                    best[cm] = (wall_s, int(res.summary["num_iterations"]))
        (r_s, r_it), (m_s, m_it) = best["roofline"], best["measured"]
        rows.append({"arrivals": label, "requests": n, "roofline_s": r_s, "roofline_iterations": r_it,
                     "measured_s": m_s, "measured_iterations": m_it,
                     "ratio_per_iteration": (m_s / m_it) / (r_s / r_it)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    worst = float(table["ratio_per_iteration"].max())
    print(f"measured vs roofline cost model on {n:,} requests: {worst:.2f}x the time per iteration at worst "
          f"(target <= {TARGET_COST_RATIO}x: {'met' if worst <= TARGET_COST_RATIO else 'MISSED'})")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)
    else:
        main(*(int(a) for a in sys.argv[1:4]))
