"""Measure recompute vs swap on this machine's GPU and compare with kvlab's roofline crossover.

    PYTHONPATH=. python bench/measure_crossover.py --out gpu_results [--quick] [--models Llama-3-8B Llama-2-7B]

Writes profile.csv, copies.csv and summary.json (kvlab.measure.run) and prints, per model, the
fitted efficiencies and link, and the crossover measured, from the calibrated roofline, and from
the catalogue specs, measured in the same run. Needs CuPy with a CUDA device.
"""
from __future__ import annotations

import argparse
import sys
import time

from standalone import kvlab_module  # bench/ is on sys.path when a script here runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_results")
    ap.add_argument("--models", nargs="+", default=["Llama-3-8B", "Llama-2-7B"])
    ap.add_argument("--gpu", default="H200", help="catalogue GPU whose peaks the fit starts from")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    measure = kvlab_module("kvlab.measure")
    t0 = time.perf_counter()
    summary = measure.run(args.models, gpu=args.gpu, out_dir=args.out, quick=args.quick)
    print(f"device: {summary['device']} (specs of {summary['gpu_spec']}), {time.perf_counter() - t0:.1f} s in all")
    for name, entry in summary["models"].items():
        r, link = entry["roofline_fit"], entry["link_fit"]
        print(f"\n{name} ({entry['dtype']}, measured in {entry['seconds_to_measure']:.1f} s)")
        print(f"  roofline fit: compute_efficiency {r['compute_efficiency']:.3f}, bandwidth_efficiency "
              f"{r['bandwidth_efficiency']:.3f}, overhead {r['iteration_overhead_s'] * 1e3:.3f} ms, "
              f"rel RMSE {r['rel_rmse']:.1%} (max {r['max_abs_rel_error']:.1%})")
        print(f"  link fit: {link['link_bytes_per_s'] / 1e9:.1f} GB/s, {link['copy_latency_s'] * 1e6:.2f} us per copy, "
              f"rel RMSE {link['rel_rmse']:.1%}")
        print(f"  {'block':>5} {'copy_mode':>15} {'measured':>10} {'calibrated':>10} {'spec':>10}  (crossover, tokens)")
        for c in entry["crossovers"]:
            fmt = lambda x: "none" if x is None else f"{x:,.0f}"  # noqa: E731
            print(f"  {c['block_size']:>5} {c['copy_mode']:>15} {fmt(c['measured_crossover_tokens']):>10} "
                  f"{fmt(c['calibrated_crossover_tokens']):>10} {fmt(c['spec_crossover_tokens']):>10}")
            print(f"        measured recompute/swap at {c['measured_seq_tokens']}: {c['measured_recompute_over_swap']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
