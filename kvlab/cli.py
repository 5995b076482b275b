"""The ``kvlab`` command.

``kvlab report [NOTEBOOK ...] [-p NAME VALUE ...] [-f PARAMS.yaml] [--out DIR]`` runs notebooks
as papermill reports (see :mod:`kvlab.report`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import yaml


def _parse_value(text: str):
    """A command-line parameter value typed as YAML would type it (``32`` -> int,
    ``[128, 512]`` -> list, ``true`` -> bool); anything else stays a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _load_params_file(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"parameter file {path} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"parameter file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"parameter file {path} must hold a mapping of name: value "
                         f"(or notebook: {{name: value}}), got {type(data).__name__}")
    return data


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import run_report  # noqa: PLC0415

    params: dict = {}
    for f in args.params_file or []:
        params.update(_load_params_file(f))
    for name, value in args.param or []:
        params[name] = _parse_value(value)
    dest = run_report(args.notebooks, params, out=args.out, progress=not args.no_progress)
    print(f"report written to {dest}")
    print(f"open {dest / 'index.html'}")
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
    rep.set_defaults(func=_cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .report import NotebookError  # noqa: PLC0415

    try:
        return args.func(args)
    except (ValueError, NotebookError) as exc:
        print(f"kvlab {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
