"""The ``kvlab`` command.

``kvlab report [NOTEBOOK ...] [-p NAME VALUE ...] [-f PARAMS.yaml] [--out DIR] [--show-code]`` runs
notebooks as papermill reports (see :mod:`kvlab.report`); ``kvlab report --list-params [NOTEBOOK ...]``
lists their parameters.

``kvlab recommend TRACE --model M --gpu G --slo-p99-tbt SECONDS`` prints the output reservation,
overflow policy and server flags that meet a latency SLO on a trace (see :mod:`kvlab.recommend`).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from typing import Sequence

import yaml


class _Loader(yaml.SafeLoader):
    """YAML as kvlab reads parameters: no timestamps (``2024-01-01`` stays a string)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

_PLAIN = (str, int, float, bool, type(None))


def _plain(value, where: str):
    """``value`` if it is made of strings, numbers, booleans, null, lists and mappings (what a
    notebook parameter can hold), else ``ValueError`` naming ``where``."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    raise ValueError(f"parameter {where} is a YAML {type(value).__name__}; a notebook parameter "
                     "must be a string, number, boolean, null, list or mapping")


def _parse_value(text: str, name: str = "given with -p"):
    """A command-line parameter value typed as YAML would type it (``32`` -> int,
    ``[128, 512]`` -> list, ``true`` -> bool); anything else, dates included, stays a string."""
    try:
        value = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        return text
    return _plain(value, name)


def _load_params_file(path: str) -> dict:
    from ._validate import read_text_file  # noqa: PLC0415

    try:
        data = yaml.load(read_text_file(path, "parameter file"), Loader=_Loader) or {}  # noqa: S506
    except yaml.YAMLError as exc:
        raise ValueError(f"parameter file {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"parameter file {path} must hold a mapping of name: value "
                         f"(or notebook: {{name: value}}), got {type(data).__name__}")
    return {str(k): _plain(v, f"{k} in {path}") for k, v in data.items()}


def _cmd_report(args: argparse.Namespace) -> int:
    import warnings  # noqa: PLC0415

    from .report import ParameterWarning, format_parameters, resolve_notebooks, run_report  # noqa: PLC0415

    if args.list_params:
        print(format_parameters(resolve_notebooks(args.notebooks)))
        return 0
    params: dict = {}
    for f in args.params_file or []:
        params.update(_load_params_file(f))
    for name, value in args.param or []:
        params[name] = _parse_value(value)
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # one line, as it happens
        if issubclass(category, ParameterWarning):
            print(f"kvlab report: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", ParameterWarning)
        warnings.showwarning = show
        dest = run_report(args.notebooks, params, out=args.out, progress=not args.no_progress,
                          show_code=args.show_code)
    print(f"report written to {dest}")
    print(f"open {dest / 'index.html'}")
    return 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    import pandas as pd  # noqa: PLC0415

    from .recommend import recommend  # noqa: PLC0415
    from .traces import load  # noqa: PLC0415

    trace = load(args.trace, args.format)
    sim_kw = {"block_size": args.block_size}
    if args.qps is not None:
        sim_kw.update(arrivals="poisson", qps=args.qps)
    rec = recommend(trace, model=args.model, gpu=args.gpu, slo_p99_tbt_s=args.slo_p99_tbt,
                    percentiles=args.percentiles, modes=args.modes, max_new_tokens=args.max_new_tokens,
                    max_rejected_frac=args.max_rejected_frac, num_requests=args.num_requests or None,
                    seed=args.seed, **sim_kw)
    with pd.option_context("display.width", 200, "display.max_colwidth", 120):
        print(rec)
        print()
        print(rec.table.round(4).to_string(index=False))
        print()
        print(rec.flags.to_string(index=False))
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
    rep.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    rep.add_argument("--show-code", action="store_true", help="keep code cells in the HTML pages")
    rep.add_argument("--list-params", action="store_true",
                     help="print each selected notebook's parameters (type, default, help) and exit")
    rep.set_defaults(func=_cmd_report)
    rec = sub.add_parser("recommend", help="output reservation, overflow policy and server flags for a trace and SLO")
    rec.add_argument("trace", help="trace file (.csv, .jsonl, .json, .parquet; any format kvlab.traces.load reads)")
    rec.add_argument("--model", required=True, help="model name (kvlab.specs.models())")
    rec.add_argument("--gpu", required=True, help="GPU name (kvlab.specs.gpus())")
    rec.add_argument("--slo-p99-tbt", type=float, required=True, metavar="SECONDS",
                     help="SLO: 99th percentile of the time between output tokens, over every gap (seconds)")
    rec.add_argument("--percentiles", type=float, nargs="+", default=[50, 90, 95, 99],
                     help="output-length percentiles to try as the reservation (default 50 90 95 99)")
    rec.add_argument("--modes", nargs="+", default=["recompute", "swap", "reject"],
                     help="overflow modes to try (default recompute swap reject)")
    rec.add_argument("--max-new-tokens", type=int, default=2048,
                     help="server output cap (tokens; default 2048, as notebook 07)")
    rec.add_argument("--max-rejected-frac", type=float, default=0.0,
                     help="share of requests the SLO allows to be rejected (default 0)")
    rec.add_argument("--num-requests", type=int, default=1000,
                     help="simulate a seeded sample of this many requests (0: all; default 1000)")
    rec.add_argument("--qps", type=float, help="Poisson arrivals at this rate (requests/s); default the "
                                               "trace's arrival times, or all at once")
    rec.add_argument("--block-size", type=int, default=16, help="tokens per KV page (default 16)")
    rec.add_argument("--format", default="auto", help="trace format (default: detected from the columns)")
    rec.add_argument("--seed", type=int, default=0, help="seed of the sample and of arrivals")
    rec.set_defaults(func=_cmd_recommend)
    return parser


def _one_line(exc: BaseException) -> str:
    """An exception as one line: an ``OSError`` names its file and reason, never its errno."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvlab`` command; return its exit status.

    Every anticipated failure is one line on stderr, and so is every warning: exit status 2 for bad input (``ValueError``:
    a parameter, trace or output folder), 1 for a run that failed (a notebook, the file system,
    memory), 128 + the signal number for a run stopped by SIGINT or SIGTERM (what a shell
    reports for a process the signal ended). Anything else is a bug in kvlab: it is reported in
    one line too, and ``KVLAB_TRACEBACK=1`` shows where it happened.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._staging import Interrupted  # noqa: PLC0415
    from .report import NotebookError  # noqa: PLC0415

    def fail(message: str, status: int) -> int:
        print(f"kvlab {args.command}: {message}", file=sys.stderr)
        return status

    def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"kvlab {args.command}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
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
