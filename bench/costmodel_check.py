"""The cost models against kvlab's own forward passes measured on this machine's GPU.

    PYTHONPATH=. python bench/costmodel_check.py --out gpu_results [--gpu H200] [--quick] [--models Llama-3-8B]

Reads ``<out>/profile.csv`` when the crossover stage wrote it, else measures one with
:func:`kvlab.measure.measure_forward`; then prints and writes (``costmodel_check.json``) each
cost model's MAPE and worst error per phase (:func:`kvlab.calibrate.profile_errors`):

* ``roofline``: the spec-sheet roofline of ``--gpu``;
* ``measured``: the measured curves, GPU time only (``stack="none"``: kvlab.measure runs bare
  kernels, no serving stack), of ``--gpu`` when it has measurements, else of the closest measured
  GPU (``--stand-in``, default H100-SXM), labelled as a stand-in;
* ``roofline fitted``: the roofline with its efficiencies fitted to this profile (in-sample).

kvlab.measure's forward pass is plain CuPy (unfused attention, no norms): the errors say how
well each model tracks this GPU's GEMMs and memory, not a serving engine's batch times.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from standalone import kvlab_module  # bench/ is on sys.path when a script here runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_results")
    ap.add_argument("--models", nargs="+", default=["Llama-3-8B", "Llama-2-7B"])
    ap.add_argument("--gpu", default="H200", help="catalogue GPU this machine is")
    ap.add_argument("--stand-in", default="H100-SXM", help="measured GPU used when --gpu has no measurements")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import pandas as pd

    calibrate = kvlab_module("kvlab.calibrate")
    cm = kvlab_module("kvlab.costmodel")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "profile.csv"
    if saved.is_file():
        profiles = pd.read_csv(saved)
        print(f"profile from {saved}")
    else:
        measure = kvlab_module("kvlab.measure")
        profiles = pd.concat([measure.measure_forward(
            m, seq_tokens=(256, 1024, 4096) if args.quick else (256, 512, 1024, 2048, 4096, 8192),
            decode_batches=(1, 16) if args.quick else (1, 16, 64, 128),
            decode_contexts=(1024,) if args.quick else (1024, 4096)).assign(model=m) for m in args.models])
        profiles.to_csv(out / "costmodel_profile.csv", index=False)
    results = {}
    for name in args.models:
        prof = calibrate.select_model(profiles, name)
        on = args.gpu if cm.unsupported(name, args.gpu) is None else args.stand_in
        models = {"roofline": cm.roofline(name, args.gpu),
                  "measured": cm.measured(name, on, stack="none"),
                  "roofline fitted": calibrate.fit_roofline(prof, name, args.gpu).cost_model}
        if on != args.gpu:
            models["measured"] = replace(models["measured"],
                                         label=f"{models['measured'].label}, {on} curves as a stand-in for {args.gpu}")
        table = calibrate.profile_errors(prof, models)
        print(f"\n{name} on {args.gpu}:")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        results[name] = table.to_dict(orient="records")
    (out / "costmodel_check.json").write_text(json.dumps(results, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
