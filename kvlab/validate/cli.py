"""The ``kvlab validate`` and ``kvlab calibrate`` commands (registered by :mod:`kvlab.cli`).

RESULTS are ``vllm bench serve --save-result`` JSON files (one result each, or stages appended with
``--append-result``), ``sglang.bench_serving --output-details`` JSONL files (a run per line), aiperf's
``profile_export.jsonl`` (one run), inference-perf's report folder (a run per load stage) or GuideLLM's JSON
report (a run per benchmark), each with a ``--set-up`` YAML (one for all, or one per file in order), or
``shared:<dataset>`` for a dataset of ``../shared/data/serving``
(``shared:distserve-vllm-opt13b``, ``shared:llmservingsim-vllm-0.19``; ``shared`` alone: both).
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from .._validate import output_file, write_text_atomically


def load_runs(results: list[str], setups: list[str] | None) -> list:
    """Run records of the RESULTS arguments (see the module note)."""
    from .readers import read_bench_results, read_shared

    files = [r for r in results if not r.startswith("shared")]
    setups = setups or []
    if files and not setups:
        raise ValueError(f"{files[0]}: a benchmark result needs --set-up YAML (model, gpu, tp, engine flags: "
                         "the keys of kvlab.validate.SetUp)")
    if files and len(setups) not in (1, len(files)):
        raise ValueError(f"give one --set-up for all {len(files)} result files, or one per file; got {len(setups)}")
    runs, k = [], 0
    for r in results:
        if r.startswith("shared"):
            shared = read_shared()
            if not shared:
                raise ValueError("../shared/data/serving is absent: no shared runs to read")
            want = r.partition(":")[2]
            picked = [x for x in shared if not want or x.setup.dataset == want]
            if not picked:
                raise ValueError(f"{r}: no such shared dataset; known: "
                                 f"{', '.join(sorted({x.setup.dataset for x in shared}))}")
            runs += picked
        else:
            runs += read_bench_results(r, setups[k] if len(setups) > 1 else setups[0])
            k += 1
    return runs


def _fmt_table(df: pd.DataFrame) -> str:
    show = df.copy()
    for c in show.columns:
        if c.endswith("_abs_err"):
            show[c] = show[c].map("{:.1%}".format)
        elif c.endswith("_err"):
            show[c] = show[c].map("{:+.1%}".format)
    return show.to_string(index=False)


def _fitted_runs(stack: str | None) -> set[tuple[str, str]]:
    """(dataset, run) pairs a stack's cost-model file was fitted to (empty for none / sarathi-serve)."""
    from ..costmodel.stacks import is_cost_model_file, load

    if not stack or not is_cost_model_file(stack):
        return set()
    return {(f.get("dataset", ""), f.get("run", "")) for f in load(stack).meta.get("fitted_to", [])}


def _held_out_line(stack: str) -> str:
    """The leave-one-run-out medians a cost-model file records, as one line."""
    from ..costmodel.stacks import load

    ho = load(stack).meta.get("held_out")
    if not ho:
        return "no held-out figures recorded (fewer than 3 runs)"
    m = ho["median_abs_err"]
    line = f"median |error| mean TTFT {m['ttft']:.1%}, mean E2E {m['e2e']:.1%}, TPOT {m['tpot']:.1%}"
    if ho.get("overload_right") is None:  # fixed-concurrency points: a closed loop makes no overload call
        return f"{line} on {len(ho['runs'])} points ({ho['method'].split(':')[0]})"
    return f"{line}; overload right on {ho['overload_right']} of {len(ho['runs'])}"


def engine_stack(engine: str, schedules_async: bool = True) -> str:
    """The shipped stack fitted to ``engine``'s real servers (``vllm-v0``, ``vllm-v1``; ``vllm-v1-sync`` for a V1
    engine that schedules in step), else ``none``."""
    from ..costmodel.stacks import named_stacks

    name = engine if schedules_async or engine != "vllm-v1" else "vllm-v1-sync"
    return name if name in named_stacks() else "none"


def _print_setups(setups: list) -> None:
    """Each distinct set-up the runs were replayed in, with what had to be assumed (once per set-up)."""
    seen: dict[str, list[str]] = {}
    for s in setups:
        key = s.describe() + "\n" + "\n".join(s.assumptions)
        seen.setdefault(key, []).append(s.name)
    for key, names in seen.items():
        desc, *assumed = key.split("\n")
        print(f"set-up of {', '.join(names) if len(names) <= 3 else f'{len(names)} runs ({names[0]}, ...)'}: {desc}")
        for a in filter(None, assumed):
            print(f"  assumed: {a}")


def _validate_points(args: argparse.Namespace) -> int:
    """``kvlab validate --points [FILE]``: fixed-concurrency points (:mod:`.points`) replayed and compared."""
    from ..costmodel.stacks import named_file
    from . import points as P

    if args.results:
        raise ValueError("kvlab validate: give result files or --points, not both")
    path = args.points or P.PATH
    if args.csv:
        output_file(args.csv, inputs=[str(path)], force=args.force, flag="--csv")
    pts = P.read_points(path)
    df = pd.DataFrame([P.replay_point(p, cost_model=args.cost_model, stack=args.stack)[0] for p in pts])
    df["set_up"] = [p.setup.describe() for p in pts]
    df["assumptions"] = [" | ".join(p.setup.assumptions) for p in pts]
    print(f"{len(pts)} fixed-concurrency points from {path} (mean TTFT and TPOT each), replayed in their set-ups; "
          "each point's set-up, what it assumed and its cost model: --csv")
    print(f"cost model: {args.cost_model or 'default'} per GPU{f', stack {args.stack}' if args.stack else ''}; "
          "assumed for every point: " + pts[0].setup.assumptions[0].split(":")[0] + ", the server's flags as "
          "the benchmark's generator sets them")
    print(_fmt_table(df[["dataset", "gpu", "model", "tp", "concurrency", "prompt_tokens", "output_tokens",
                         "ttft_mean_err", "e2e_mean_err", "tpot_mean_err"]]))
    print()
    print(_fmt_table(P.point_table(df)))
    named = named_file(args.cost_model, args.stack)
    fitted = _fitted_runs(named)
    df["fitted_to_it"] = [(d, n) in fitted for d, n in zip(df["dataset"], df["point"])]
    if df["fitted_to_it"].any():
        print(f"note: {int(df['fitted_to_it'].sum())} point(s) were in {named}'s own fit (fitted_to_it in --csv): "
              f"their error is in-sample, not a validation; held out: {_held_out_line(named)}")
    if args.csv:
        write_text_atomically(args.csv, df.to_csv(index=False))
        print(f"per-point table written to {args.csv}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from ..costmodel.stacks import is_cost_model_file
    from .replay import compare, error_table, replay

    if args.points is not None:
        return _validate_points(args)
    if args.csv:
        output_file(args.csv, inputs=[*args.results, *(args.set_up or [])], force=args.force, flag="--csv")
    runs = load_runs(args.results or ["shared"], args.set_up)
    chosen = args.cost_model is not None or args.stack is not None
    kinds = {(r.setup.engine, r.setup.schedules_async) for r in runs}
    by_engine = {k: engine_stack(*k) for k in kinds}  # each stack file read once
    stacks = [args.stack if chosen else by_engine[r.setup.engine, r.setup.schedules_async] for r in runs]
    rows = [compare(replay(r, cost_model=args.cost_model, stack=st)) for r, st in zip(runs, stacks)]
    df = pd.DataFrame(rows)
    named = args.cost_model if is_cost_model_file(args.cost_model or "") else None
    fitted = {st: _fitted_runs(named or st) for st in set(stacks)}
    df["fitted_to_it"] = [(d, r) in fitted[st] for d, r, st in zip(df["dataset"], df["run"], stacks)]
    cols = ["dataset", "run", "ttft_mean_err", "e2e_mean_err", "tpot_mean_err", "overload_pred", "overload_meas",
            "fitted_to_it"]
    print(f"cost model: {'; '.join(sorted(set(df['cost_model'])))}")
    print(f"stack: {'; '.join(sorted(set(df['stack'])))}")
    _print_setups([r.setup for r in runs])
    print(_fmt_table(df[cols]))
    if df["fitted_to_it"].any():
        print(f"note: {int(df['fitted_to_it'].sum())} run(s) were in the stack's own fit (fitted_to_it): their error "
              "is in-sample, not a validation; each held out (fitted to the others):")
        for st in sorted({named or st for st, flagged in zip(stacks, df["fitted_to_it"]) if flagged}):
            print(f"  {st}: {_held_out_line(st)}")
    print()
    print(_fmt_table(error_table(rows)))
    if args.csv:
        write_text_atomically(args.csv, df.to_csv(index=False))
        print(f"per-run table written to {args.csv}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..costmodel.stacks import save
    from .calibrate import calibrate, folds_disagree

    output_file(args.output, inputs=[*args.results, *(args.set_up or [])], force=args.force)
    runs = load_runs(args.results, args.set_up)
    name = args.name or args.output.rsplit("/", 1)[-1].removesuffix(".json")
    command = args.command_line or ("kvlab calibrate " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"]
                                    else "kvlab calibrate " + " ".join(args.results) + f" -o {args.output}")
    terms = calibrate(runs, name=name, label=args.label or "", command=command,
                      fit_scale={"auto": "auto", "yes": True, "no": False}[args.fit_scale], base=args.base)
    path = save(terms, args.output)
    print(f"{terms.describe()} (fitted to {len(runs)} runs; {terms.meta['fit']['steps']} fixed-point steps)")
    ho = terms.meta.get("held_out")
    if ho:
        print("held-out error (leave-one-run-out: each run predicted by terms fitted to the others, fold_cpu_ms: "
              "their CPU time per iteration + per sequence):")
        folds = pd.DataFrame(ho["runs"])
        folds["fold_cpu_ms"] = [f"{a * 1e3:.3g} + {b * 1e3:.3g}/seq" for a, b in
                                zip(folds["held_out_overhead_s"], folds["held_out_overhead_s_per_seq"])]
        print(_fmt_table(folds[["run", "ttft_mean_err", "e2e_mean_err", "tpot_mean_err", "overload_right",
                                "fold_cpu_ms"]]))
        print(_held_out_line(path))
        note = folds_disagree(folds)
        if note:
            print(f"note: {note}")
    else:
        print("held-out error: needs at least 3 runs")
    print(f"cost model written to {path} (use it with --cost-model {path})")
    return 0


#: What RESULTS and --set-up take (both commands).
RESULTS_HELP = ("measured runs: vllm bench serve or sglang.bench_serving result files (one result or several "
                "appended), aiperf's profile_export.jsonl, a GuideLLM JSON report, an inference-perf report folder, "
                "or shared[:DATASET]")
SETUP_HELP = ("set-up of the result files: model, gpu, tp, server_version and engine flags (kvlab.validate.SetUp's "
              "keys, or the server's own flags such as tensor-parallel-size); one for all, or one per file")


def add_commands(sub) -> None:
    """Add ``validate`` and ``calibrate`` to the ``kvlab`` command's subparsers."""
    val = sub.add_parser("validate", help="replay measured real-server runs in their set-up and compare",
                         description="Replay measured runs (default: every run of ../shared/data/serving) in "
                                     "their own set-up and print predicted vs measured errors per run and the "
                                     "error table per dataset.")
    val.add_argument("results", nargs="*", help=RESULTS_HELP)
    val.add_argument("--set-up", action="append", metavar="YAML", help=SETUP_HELP)
    val.add_argument("--cost-model", help="measured, roofline, a shipped stack (vllm-v0, vllm-v1, vllm-v1-sync) or a "
                                          "cost-model file (.json, from kvlab calibrate)")
    val.add_argument("--stack", help="serving stack added to the cost model (none, sarathi-serve, vllm-v0, vllm-v1, "
                                     "vllm-v1-sync; default with no --cost-model either: each run's engine's "
                                     "shipped stack, vllm-v0, vllm-v1 or, for V1 scheduling in step, vllm-v1-sync, "
                                     "else none)")
    val.add_argument("--points", nargs="?", const="", metavar="CSV",
                     help="replay fixed-concurrency benchmark points instead (mean TTFT and TPOT per point; "
                          "default: NVIDIA aiconfigurator's measured vLLM, SGLang and TensorRT-LLM points)")
    val.add_argument("--csv", help="write the per-run comparison table here (never an input)")
    val.add_argument("--force", action="store_true", help="let --csv overwrite an existing file")
    val.set_defaults(func=cmd_validate)
    cal = sub.add_parser("calibrate", help="fit a serving stack's overheads to measured runs; write a cost model",
                         description="Fit per-iteration and per-sequence overheads (and a GPU-time scale where "
                                     "the data support it) to measured runs, print leave-one-run-out held-out "
                                     "error, and write a cost-model file every command accepts (--cost-model).")
    cal.add_argument("results", nargs="+", help=RESULTS_HELP)
    cal.add_argument("-o", "--output", required=True, help="cost-model file to write (.json; never an input)")
    cal.add_argument("--force", action="store_true", help="let -o overwrite an existing file")
    cal.add_argument("--set-up", action="append", metavar="YAML", help=SETUP_HELP)
    cal.add_argument("--name", help="the stack's name (default: the file's)")
    cal.add_argument("--label", help="words for the stack in results")
    cal.add_argument("--fit-scale", choices=["auto", "yes", "no"], default="auto",
                     help="fit a GPU-time scale (auto: where it lowers the residual by 10%%)")
    cal.add_argument("--base", choices=["measured", "roofline"], help="base cost model (default: measured "
                                                                      "where the GPU has measurements)")
    cal.add_argument("--command-line", help=argparse.SUPPRESS)  # what the file says remakes it
    cal.set_defaults(func=cmd_calibrate)
