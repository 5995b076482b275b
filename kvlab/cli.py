"""The ``kvlab`` command.

``kvlab report [NOTEBOOK ...] [-p NAME VALUE ...] [-f PARAMS.yaml] [--out DIR] [--show-code]`` runs
notebooks as papermill reports (see :mod:`kvlab.report`); ``kvlab report --list-params [NOTEBOOK ...]``
lists their parameters.

``kvlab recommend TRACE --model M --gpu G [--system vllm]`` prints which server setting meets a
latency SLO at the trace's real load, each setting's capacity with its interval, and the
server's flags (see :mod:`kvlab.recommend`). ``--model`` takes a catalogue name, a catalogued
Hugging Face id or a ``config.json``; ``--gpu-spec gpu.yaml`` describes a GPU of one's own. The
model, GPU and SLO are checked before the trace is read.

``kvlab validate [RESULTS ...]`` replays measured real-server runs and prints the errors;
``kvlab calibrate RESULTS ... -o my-h100.json`` fits a serving stack to them (:mod:`kvlab.validate.cli`).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Sequence

#: Largest parameter file read (bytes).
MAX_PARAMS_FILE_BYTES = 1 << 20


def _parse_value(text: str, name: str = "given with -p"):
    """A command-line parameter value typed as YAML would type it (``32`` -> int,
    ``[128, 512]`` -> list, ``true`` -> bool); anything else, dates included, stays a string.
    Limited as every YAML kvlab reads (:func:`kvlab._validate.yaml_data`)."""
    from ._validate import yaml_data

    return yaml_data(text, f"parameter {name}", invalid_as_text=True)


def _load_params_file(path: str) -> dict:
    from ._validate import read_text_file, yaml_data

    data = yaml_data(read_text_file(path, "parameter file", max_bytes=MAX_PARAMS_FILE_BYTES),
                     f"parameter file {path}") or {}
    if not isinstance(data, dict):
        raise ValueError(f"parameter file {path} must hold a mapping of name: value "
                         f"(or notebook: {{name: value}}), got {type(data).__name__}")
    return data


def _cmd_report(args: argparse.Namespace) -> int:
    import warnings

    from .report import ParameterWarning, format_parameters, resolve_notebooks, run_report

    if args.list_params:
        print(format_parameters(resolve_notebooks(args.notebooks)))
        return 0
    params: dict = {}
    for f in args.params_file or []:
        params.update(_load_params_file(f))
    for name, value in args.param or []:
        params[name] = _parse_value(value, f"{name[:40]} given with -p")
    with warnings.catch_warnings():  # main() prints each warning as one line, as it happens
        warnings.simplefilter("always", ParameterWarning)
        dest = run_report(args.notebooks, params, out=args.out, progress=_show_progress(args),
                          show_code=args.show_code)
    print(f"report written to {dest}")
    print(f"open {dest / 'index.html'}")
    return 0


def _load_recommend_trace(args: argparse.Namespace):
    """The trace file (any kvlab.traces format), or one or two Prometheus scrapes of a vLLM server."""
    from .prometheus import is_exposition, from_prometheus
    from .traces import load

    paths = args.trace
    if len(paths) > 2:
        raise ValueError(f"give one trace file, or two Prometheus scrapes; got {len(paths)} files")
    if is_exposition(paths[0]):
        ignored = [flag for flag, given in (("--format", args.format != "auto"), ("--on-bad", args.on_bad != "raise"))
                   if given]
        if ignored:
            raise ValueError(f"{' and '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} to trace "
                             f"files; {paths[0]} is a Prometheus scrape")
        return from_prometheus(paths[0], paths[1] if len(paths) == 2 else None,
                               interval_s=args.scrape_interval, seed=args.seed)
    if len(paths) == 2:
        raise ValueError(f"{paths[1]}: a second file is only for a second Prometheus scrape; "
                         f"{paths[0]} is a trace")
    if args.scrape_interval is not None:
        raise ValueError(f"--scrape-interval is for two Prometheus scrapes; {paths[0]} is a trace file")
    return load(paths[0], args.format, on_bad=args.on_bad)


#: Most capacity windows ``kvlab recommend --windows`` runs (each is a capacity search per setting).
MAX_WINDOWS = 100


def _check_recommend_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work, an ``-o`` that would be ignored, overwrite an input trace, or
    overwrite any existing file without ``--force``; a ``--windows`` beyond :data:`MAX_WINDOWS`;
    and ``--sample`` without ``--num-requests`` (a sample of the whole trace is the trace)."""
    from ._validate import output_file, positive_int

    positive_int(args.windows, "--windows", maximum=MAX_WINDOWS)
    if args.sample and args.num_requests is None:
        raise ValueError("--sample needs --num-requests N (a random sample of N requests); without it the whole "
                         "trace is served")
    if args.output is None:
        if args.force:
            raise ValueError("--force is for -o FILE (overwrite it); no -o was given")
        return
    if not (args.csv or args.json):
        raise ValueError(f"-o {args.output} needs --csv or --json (what to write there); the summary is printed")
    output_file(args.output, inputs=args.trace, force=args.force)


def _cmd_recommend(args: argparse.Namespace) -> int:
    import json
    import os
    from dataclasses import replace

    from .capacity import SLO
    from .recommend import recommend
    from .recommend.servers import resolve
    from .specs import resolve_gpu, resolve_model, with_precision

    # what a user types is checked before the trace loads (a large trace takes seconds to read)
    _check_recommend_flags(args)
    if args.system is not None:
        resolve(args.system)
    model = resolve_model(args.model)
    gpu = resolve_gpu(args.gpu, args.gpu_spec)
    if args.no_p2p:
        gpu = replace(gpu, p2p=False)
    model.check_tp(args.tp)
    slo = SLO(tbt_p99_s=args.slo_p99_tbt, scheduling_delay_p50_s=args.slo_delay_p50 or None,
              ttft_p99_s=args.slo_p99_ttft)
    if args.max_model_len is not None and args.max_model_len > model.max_context_tokens:
        raise ValueError(f"--max-model-len {args.max_model_len:,} is above {model.name}'s context of "
                         f"{model.max_context_tokens:,} tokens")
    if args.weights != "bf16" or args.kv_cache_dtype != "auto":
        model = with_precision(model, kv_cache_dtype=args.kv_cache_dtype, weights=args.weights)
    trace = _load_recommend_trace(args)
    workers = args.workers if args.workers is not None else min(2, os.cpu_count() or 1)
    rec = recommend(trace, model=model, gpu=gpu, system=args.system, slo=slo, tp=args.tp,
                    block_size=args.block_size, max_new_tokens=args.max_new_tokens,
                    max_model_len=args.max_model_len, arrivals=args.arrivals,
                    num_requests=args.num_requests, how="sample" if args.sample else "window",
                    rate_scale=args.rate_scale, qps=args.qps, num_windows=args.windows,
                    window_requests=args.window_requests, percentiles=args.percentiles,
                    max_unserved_frac=args.max_unserved_frac, seed=args.seed, cost_model=args.cost_model,
                    max_workers=workers, save_dir=args.save_dir,
                    progress=_show_progress(args) and not args.json)
    if args.csv:
        if args.output:
            rec.table.to_csv(args.output, index=False)
        else:
            sys.stdout.write(rec.table.to_csv(index=False))
    if args.json:
        text = json.dumps(rec.to_dict(), indent=1, default=str)
        if args.output and not args.csv:
            Path(args.output).write_text(text + "\n")
        else:
            print(text)
    if not args.json and not (args.csv and not args.output):
        print(rec)
        if args.output:
            print(f"table written to {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvlab", description="KV-cache reservation analysis for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="run notebooks as papermill reports into reports/")
    rep.add_argument("notebooks", nargs="*", help="notebook numbers or names (default: all)")
    rep.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                     help="set a notebook parameter (value parsed as YAML: 32, 0.9, [128, 512], true)")
    rep.add_argument("-f", "--params-file", action="append", metavar="YAML",
                     help="YAML file of parameters (name: value, or notebook: {name: value})")
    rep.add_argument("--out", help="output folder (default reports/run-<timestamp>); must not exist")
    rep.add_argument("--no-progress", action="store_true", help="hide the progress bar (shown only on a terminal)")
    rep.add_argument("--show-code", action="store_true", help="keep code cells in the HTML pages")
    rep.add_argument("--list-params", action="store_true",
                     help="print each selected notebook's parameters (type, default, help) and exit")
    rep.set_defaults(func=_cmd_report)
    rec = sub.add_parser(
        "recommend", help="which server setting meets a latency SLO at a trace's real load, and its capacity",
        description="Simulate the trace at its own rate on each setting the server lets you change, find each "
                    "setting's capacity (highest rate within the SLO, the trace's own arrivals time-compressed, "
                    "Poisson beside it) with an interval over windows of the trace, and print one answer: the "
                    "setting, the replicas it needs and its flags. Default SLO: P99 time between tokens <= 0.1 s "
                    "and median scheduling delay <= 2 s, no TTFT bound.")
    rec.add_argument("trace", nargs="+", help="trace file (.csv, .jsonl, .json, .parquet: any format "
                                              "kvlab.traces.load reads), or one or two Prometheus scrapes "
                                              "of a vLLM server's /metrics")
    rec.add_argument("--model", required=True,
                     help="model: a name of kvlab.specs.models(), a Hugging Face id of its hf_id column "
                          "(meta-llama/Meta-Llama-3-8B), or a config.json (or its folder)")
    gpu = rec.add_mutually_exclusive_group(required=True)
    gpu.add_argument("--gpu", help="GPU name (kvlab.specs.gpus())")
    gpu.add_argument("--gpu-spec", metavar="GPU.yaml",
                     help="your own GPU: a YAML file with the columns of data/gpus.csv (name, memory_mib, "
                          "hbm_bandwidth_gbps, bf16_dense_tflops, host_link_gbps, interconnect_gbps, "
                          "internode_gbps; fp8_dense_tflops optional); priced by the spec-sheet (roofline) "
                          "cost model")
    rec.add_argument("--no-p2p", action="store_true",
                     help="the host blocks GPU peer-to-peer (PCIe ACS or an IOMMU on, many VMs; nvidia-smi topo -p2p r "
                          "shows it): collectives go through host memory (NCCL, about half its peer-to-peer speed on "
                          "the measured RTX PRO 6000 pair) and vLLM's custom all-reduce is off")
    rec.add_argument("--system", metavar="SYSTEM[==VERSION]",
                     help="the server you run: a system of kvlab's server profiles (kvlab.recommend.servers; an "
                          "unknown name lists them), its newest release family, or e.g. vllm==0.8 (the family "
                          "holding that version), or reservation (the brief's recipe): "
                          "search its settings and print its flags (default: compare the systems at their "
                          "defaults)")
    rec.add_argument("--weights", choices=["bf16", "fp8", "int4"], default="bf16",
                     help="weight precision of the served checkpoint (default bf16)")
    rec.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                     help="KV-cache storage the server runs with (default auto: the model's 16-bit dtype; "
                          "the search also offers fp8 where the system and GPU support it)")
    rec.add_argument("--save-dir", metavar="DIR",
                     help="write the config files the printed commands need (TensorRT-LLM's extra LLM API "
                          "YAML) into DIR; the commands name them there")
    rec.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica (default 1)")
    rec.add_argument("--slo-p99-tbt", type=float, default=0.1, metavar="SECONDS",
                     help="SLO: 99th percentile of the time between output tokens (default 0.1 s)")
    rec.add_argument("--slo-delay-p50", type=float, default=2.0, metavar="SECONDS",
                     help="SLO: median delay from arrival to admission (default 2 s; 0: no bound)")
    rec.add_argument("--slo-p99-ttft", type=float, metavar="SECONDS",
                     help="SLO: 99th percentile of the time to first token (default: no bound)")
    rec.add_argument("--max-model-len", type=int, metavar="TOKENS",
                     help="the server's context, prompt + output (default the model's context); longer prompts "
                          "are refused")
    rec.add_argument("--arrivals", choices=["replay", "gamma", "poisson"], default="replay",
                     help="arrival process capacity is searched under: the trace's own times time-compressed "
                          "(default), a Gamma renewal with their gap CV, or Poisson")
    rec.add_argument("--max-new-tokens", type=int,
                     help="output cap (tokens; default the trace's detected cap, else its longest output)")
    rec.add_argument("--num-requests", type=int, help="serve N requests of the trace (default all)")
    rec.add_argument("--sample", action="store_true",
                     help="N requests as a random sample rescaled to the trace's rate (default a window)")
    rec.add_argument("--rate-scale", type=float, default=1.0, help="serve at this multiple of the trace's rate")
    rec.add_argument("--qps", type=float, help="offer this rate (requests/s, refused requests included): the "
                                               "trace's times rescaled, or Poisson when it has none")
    rec.add_argument("--windows", type=int, default=5, help="capacity windows (default 5)")
    rec.add_argument("--window-requests", type=int, default=2048, help="requests per window (default 2048)")
    rec.add_argument("--percentiles", type=float, nargs="+", default=[50, 90, 95, 99],
                     help="output-length percentiles to report (default 50 90 95 99)")
    rec.add_argument("--max-unserved-frac", type=float, default=0.0,
                     help="share of requests a setting may reject or truncate (default 0)")
    rec.add_argument("--block-size", type=int, default=16,
                     help="tokens per KV page (default 16; checked against the values the system accepts)")
    rec.add_argument("--cost-model", help="iteration-time model: measured, roofline, a shipped stack (vllm-v0, "
                                          "vllm-v1) or a cost-model file from kvlab calibrate (default: measured "
                                          "where the GPU has measurements, else roofline)")
    rec.add_argument("--format", default="auto", help="trace format (default: detected from the columns)")
    rec.add_argument("--on-bad", choices=["raise", "drop"], default="raise",
                     help="bad or failed rows: stop with an error (default) or drop and count them")
    rec.add_argument("--scrape-interval", type=float, metavar="SECONDS",
                     help="seconds between two Prometheus scrapes (when their samples carry no timestamps)")
    rec.add_argument("--seed", type=int, default=0, help="seed of samples and Poisson arrivals")
    rec.add_argument("--workers", type=int, help="processes (default: up to 2)")
    rec.add_argument("--json", action="store_true", help="print the decision and full table as JSON")
    rec.add_argument("--csv", action="store_true", help="write the full table as CSV (to -o FILE or stdout)")
    rec.add_argument("-o", "--output", help="file for --csv (or --json); never an input, nor an existing file "
                                            "without --force")
    rec.add_argument("--force", action="store_true", help="let -o overwrite an existing file (never an input)")
    rec.add_argument("--no-progress", action="store_true", help="hide the progress bar (shown only on a terminal)")
    rec.set_defaults(func=_cmd_recommend)
    from .validate.cli import add_commands as _add_validate_commands  # kvlab validate, kvlab calibrate
    _add_validate_commands(sub)
    return parser


#: Longest message printed on stderr (characters): a huge value a message quotes is cut, not echoed whole.
MAX_MESSAGE_CHARS = 1000


def _capped(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}... ({len(text):,} characters in all)"


def _one_line(exc: BaseException) -> str:
    """An exception as one line: an ``OSError`` names its file and reason, never its errno."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _show_progress(args: argparse.Namespace) -> bool:
    """A progress bar unless ``--no-progress``, and only when stderr is a terminal: redrawn into a
    file or a pipe, a bar leaves a line of carriage returns per update in the log."""
    return not args.no_progress and sys.stderr.isatty()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvlab`` command; return its exit status.

    Every anticipated failure is one line on stderr, and so is every warning: exit status 2 for bad input (``ValueError``:
    a parameter, trace or output folder), 1 for a run that failed (a notebook, the file system,
    memory), 128 + the signal number for a run stopped by SIGINT, SIGTERM or SIGHUP (what a shell
    reports for a process the signal ended). Anything else is a bug in kvlab: it is reported in
    one line too, and ``KVLAB_TRACEBACK=1`` shows where it happened.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._staging import Interrupted, raising_on_signals
    from .report import NotebookError

    def fail(message: str, status: int) -> int:
        print(f"kvlab {args.command}: {_capped(message)}", file=sys.stderr)
        return status

    def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"kvlab {args.command}: warning: {_capped(' '.join(str(message).split()))}", file=sys.stderr)

    try:
        with warnings.catch_warnings(), raising_on_signals():  # SIGTERM / SIGHUP unwind: workers are killed
            warnings.showwarning = one_line_warning  # restored on leaving the block
            return args.func(args)
    except Interrupted as exc:
        return fail(f"{exc}; nothing was written", 128 + exc.signum)
    except KeyboardInterrupt:
        return fail("interrupted", 128 + signal.SIGINT)
    except ValueError as exc:
        return fail(f"error: {_one_line(exc)}", 2)
    except NotebookError as exc:
        return fail(f"error: {_one_line(exc)}", 1)
    except OSError as exc:
        return fail(f"error: {_one_line(exc)}", 1)
    except MemoryError:
        return fail("error: ran out of memory; try a smaller --num-requests or trace", 1)
    except Exception as exc:  # a bug: still one line, the traceback on request
        if os.environ.get("KVLAB_TRACEBACK"):
            raise
        return fail(f"internal error: {type(exc).__name__}: {_one_line(exc)} "
                    "(a bug in kvlab; set KVLAB_TRACEBACK=1 to see where)", 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
