"""Run notebooks into a report folder: executed notebooks, HTML pages, JSON results, figures and
a summary page (``index.html``).

The run is built in a temporary folder beside its destination and moved into place only when
every notebook succeeded, so an interrupted or failed run never leaves a half-written report.
Folders and files are readable by others as the umask allows (0755 / 0644 under umask 022).
"""
from __future__ import annotations

import ast
import datetime as _dt
import json
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from .._paths import ROOT
from .._staging import staged_folder
from ._files import public_dir
from .execute import execute_notebook
from .notebooks import notebook_parameters, resolve_notebooks, split_parameters
from .pages import export_html, index_html, notebook_title
from .results import _jsonable, read_results, verdict_counts

RUN_INPUTS = ("trace", "profile", "model", "gpu", "tp", "pp", "cost_model", "num_requests", "seed", "quick")
"""Parameters the summary page lists as the run's inputs (where a selected notebook declares them)."""


class _Progress:
    """One line: the running notebook, its elapsed time, notebooks done, and the last progress
    text the notebook printed to stderr (a long cell's tqdm bar)."""

    def __init__(self, total: int, enabled: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="nb", disable=not enabled, dynamic_ncols=True,
                        bar_format="{desc} |{bar:12}| {n_fmt}/{total_fmt} notebooks [{elapsed}]{postfix}")
        self.enabled = enabled
        self.stem, self.started, self.inner = "", time.monotonic(), ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True) if enabled else None
        if self._thread:
            self._thread.start()

    def _show(self) -> None:
        elapsed = int(time.monotonic() - self.started)
        self.bar.set_description_str(f"{self.stem} {elapsed // 60}:{elapsed % 60:02d}", refresh=False)
        self.bar.set_postfix_str(self.inner, refresh=True)

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._show()

    def start(self, stem: str) -> None:
        self.stem, self.started, self.inner = stem, time.monotonic(), ""
        if self.enabled:
            self._show()

    def stderr(self, text: str) -> None:
        """Keep the last line the notebook wrote to stderr (``\\r`` starts a line, as in a terminal)."""
        segments = [s.strip() for s in text.replace("\r", "\n").split("\n") if s.strip()]
        if segments:
            self.inner = segments[-1][:60]

    def done(self) -> None:
        self.inner = ""
        self.bar.update(1)

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.bar.close()


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _inputs(paths: list[Path], declared: Mapping[Path, Mapping[str, str]],
            per: Mapping[Path, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Rows ``(name, text)`` of :data:`RUN_INPUTS`: each value with the notebooks that run with
    it (no list when every notebook declaring the name uses the same value)."""
    rows = []
    for name in RUN_INPUTS:
        users: dict[str, list[str]] = {}
        for p in paths:
            if name in declared[p]:
                value = per[p][name] if name in per[p] else _literal(declared[p][name])
                if value == "" or (value is None and name != "num_requests"):
                    continue  # "" (a trace not given) and None (a default chosen inside) say nothing here
                text = "default (all of a trace)" if value is None and name == "num_requests" else str(value)
                users.setdefault(text, []).append(p.stem[:2])
        if not users:
            continue
        if len(users) == 1:
            rows.append((name, next(iter(users))))
        else:
            rows.append((name, "; ".join(f"{v} ({', '.join(s)})" for v, s in users.items())))
    return rows


def _version() -> str:
    from .. import __version__

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__} ({commit})" if commit else __version__


def _command(paths: list[Path], given: Mapping[str, Any], all_selected: bool) -> str:
    words = ["kvlab", "report"] + ([] if all_selected else [p.stem[:2] for p in paths])
    for name, value in given.items():
        if isinstance(value, Mapping):
            words += ["-f", "PARAMS.yaml"]
            continue
        words += ["-p", name, value if isinstance(value, str) else json.dumps(_jsonable(value))]
    return " ".join(shlex.quote(w) for w in words)


def run_report(selectors: Iterable[str] | None = None, parameters: Mapping[str, Any] | None = None, *,
               out: str | os.PathLike | None = None, reports_dir: str | os.PathLike = "reports",
               progress: bool = True, show_code: bool = False) -> Path:
    """Run notebooks into a complete report folder and return its path.

    Parameters
    ----------
    selectors : notebook selectors (see :func:`resolve_notebooks`); all notebooks when empty.
    parameters : mapping
        ``name -> value`` applied to every notebook that declares ``name`` (a name only some
        declare warns, one none declares raises); or ``selector -> {name: value}`` for one notebook.
    out : path, optional
        Destination folder (must not exist yet). Default ``reports/run-YYYYmmdd-HHMMSS``.
    progress : bool
        Show a progress line naming the running notebook and its elapsed time.
    show_code : bool
        Keep code cells in the HTML pages (default: prose, tables and figures only).

    The run is written to a temporary folder beside the destination and renamed into place only
    when every notebook succeeded; on failure the temporary folder is removed and
    :class:`NotebookError` names the notebook and cell. A lock on ``out`` makes a second
    concurrent run into it fail at once (``ValueError``); SIGINT and SIGTERM remove the
    temporary folder and the notebook kernels and raise :class:`kvlab._staging.Interrupted`.
    """
    selectors = list(selectors or [])
    paths = resolve_notebooks(selectors)
    given = dict(parameters or {})
    per = split_parameters(paths, given)
    declared = {p: notebook_parameters(p) for p in paths}
    started = _dt.datetime.now(_dt.timezone.utc)
    dest = Path(out) if out is not None else Path(reports_dir) / f"run-{started.astimezone():%Y%m%d-%H%M%S}"
    entries = []
    from ..sim.fast import load_loop

    load_loop()  # compiled here (announced on the terminal) on a cold cache; the kernels then load it
    bar = _Progress(len(paths), progress)
    t_run = time.monotonic()
    try:
        with staged_folder(dest) as tmp:  # locked; removed on failure, SIGINT or SIGTERM
            public_dir(tmp)
            for path in paths:
                stem = path.stem
                bar.start(stem)
                t0 = time.monotonic()
                execute_notebook(path, tmp / f"{stem}.ipynb", per[path], results_path=tmp / f"{stem}.json",
                                 on_stderr=bar.stderr)
                effective = {k: per[path].get(k, _literal(v)) for k, v in declared[path].items()
                             if k != "results_path"}
                export_html(tmp / f"{stem}.ipynb", tmp / f"{stem}.html", show_code=show_code, parameters=effective)
                results = read_results(tmp / f"{stem}.json") if (tmp / f"{stem}.json").exists() else {}
                title, question = notebook_title(tmp / f"{stem}.ipynb")
                entries.append({"stem": stem, "title": title, "question": question, "html": f"{stem}.html",
                                "ipynb": f"{stem}.ipynb", "json": f"{stem}.json", "results": results,
                                "verdicts": verdict_counts(results.get("claims")),
                                "runtime_s": time.monotonic() - t0})
                bar.done()
            run = {"name": dest.name, "date": f"{started:%Y-%m-%d %H:%M} UTC",
                   "runtime_s": time.monotonic() - t_run, "version": _version(),
                   "inputs": _inputs(paths, declared, per), "command": _command(paths, given, not selectors)}
            (tmp / "index.html").write_text(index_html(run, entries), encoding="utf-8")
    finally:
        bar.close()
    return dest
