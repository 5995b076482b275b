"""Capacity search speed: how long one ``kvlab.capacity`` search of a Sarathi-Serve preset takes.

One run measures, for a preset (default Mistral-7B on one A100, strict SLO) and both schedulers:

* one trial of ``--num-requests`` requests (2048, the paper's) on the reference and the fast
  engine, and their ratio (the two must give the same SLO figures);
* one search in the notebook's quick mode (64 requests per trial, rel_tol 0.2), fast engine,
  against the 60 s target of issue 7;
* one full search (2048 requests, rel_tol 0.05) per scheduler;
* the preset's whole comparison (both SLOs x both schedulers, four full searches) serial and
  on four processes with ``kvlab.capacities``, and the speed-up (the tables must be equal).

Measured on the 2-core development machine, shared (load average 5-6 from other jobs, so wall
times carry their load), Mistral-7B, strict SLO, fast engine: quick searches 0.3-0.5 s (target
< 60 s met); full searches 4.6 s (chunked, 7 trials) and 16 s (prefill-first, 7 trials); one
2048-request trial 67x (chunked) and 14x (prefill-first) faster on the fast engine than on the
reference, with identical SLO figures; four full searches on 4 processes 0.92x of serial
there (two busy cores: nothing to gain), identical tables. An earlier k-section variant (4
rates per round) ran 13 trials where bisection ran 7, and was dropped.

Run: ``python bench/bench_capacity.py [--preset NAME] [--slo strict] [--num-requests 2048]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import kvlab
from kvlab.capacity import capacity, serve, slo_metrics, trial_requests


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="mistral-7b-1xa100", choices=kvlab.preset_names())
    ap.add_argument("--slo", default="strict", choices=["strict", "relaxed"])
    ap.add_argument("--num-requests", type=int, default=2048)
    ap.add_argument("--workload", default="sarathi-sharegpt")
    args = ap.parse_args()
    p = kvlab.preset(args.preset)
    slo = p.slo(args.slo)
    work = trial_requests(args.workload, args.num_requests, 0)
    print(f"preset {p.name}: {p.model} on {p.num_gpus} x {p.gpu} (TP{p.tp}-PP{p.pp}), {args.slo} SLO "
          f"(P99 TBT {slo.tbt_p99_s} s), workload {args.workload}")
    for sched in kvlab.presets.SCHEDULERS:
        print(f"\n== {sched}")
        quick, quick_s = timed(lambda sched=sched: capacity(args.workload, p.config(sched, args.slo, engine="fast"), slo,
                                                num_requests=64, rel_tol=0.2))
        print(f"quick search (64 requests, rel_tol 0.2): {quick_s:.2f} s for {len(quick.trials)} trials "
              f"-> {quick.capacity_qps:.3g} requests/s (target < 60 s: {'met' if quick_s < 60 else 'MISSED'})")
        serial, serial_s = timed(lambda sched=sched: capacity(work, p.config(sched, args.slo, engine="fast"), slo,
                                                  num_requests=args.num_requests, rel_tol=0.05))
        print(f"full search ({args.num_requests} requests, rel_tol 0.05), serial: {serial_s:.2f} s for "
              f"{len(serial.trials)} trials -> {serial.capacity_qps:.4g} requests/s")
        qps = serial.capacity_qps or 0.5
        fast, fast_s = timed(lambda sched=sched, qps=qps: serve(work, p.config(sched, args.slo, engine="fast"), qps))
        ref, ref_s = timed(lambda sched=sched, qps=qps: serve(work, p.config(sched, args.slo, engine="reference"), qps))
        mf, mr = slo_metrics(fast), slo_metrics(ref)
        same = all(np.isclose(mf[k], mr[k], rtol=1e-9) for k in ("tbt_p99_s", "scheduling_delay_p50_s"))
        print(f"one trial at {qps:.4g} requests/s: reference {ref_s:.2f} s, fast {fast_s:.2f} s, "
              f"ratio {ref_s / fast_s:.1f}x; same SLO figures: {same}")
    print("\n== the preset's comparison: 2 SLOs x 2 schedulers")
    cases = {(kind, sched): (p.config(sched, kind, engine="fast"), p.slo(kind))
             for kind in ("strict", "relaxed") for sched in kvlab.presets.SCHEDULERS}
    kw = dict(num_requests=args.num_requests, rel_tol=0.05)
    serial, serial_s = timed(lambda: kvlab.capacities(work, cases, **kw))
    par, par_s = timed(lambda: kvlab.capacities(work, cases, max_workers=4, **kw))
    equal = all(serial[k].trials.equals(par[k].trials) for k in cases)
    print(f"serial {serial_s:.2f} s, 4 processes {par_s:.2f} s, speed-up {serial_s / par_s:.2f}x; "
          f"identical trials: {equal}")
    for k, r in serial.items():
        print(f"  {k[0]:8s} {k[1]:14s} {r.capacity_qps:.4g} requests/s ({len(r.trials)} trials; {r.binding()})")


if __name__ == "__main__":
    main()
