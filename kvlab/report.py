"""Run kvlab's notebooks as parameterised papermill reports.

A run executes the chosen notebooks (all of ``notebooks/`` by default) with papermill, exports
each executed notebook to HTML, collects each notebook's JSON results (written by the notebook
to its ``results_path`` parameter) and writes an ``index.html`` linking them. The run is built in
a temporary folder beside its destination and moved into place only when every notebook
succeeded, so an interrupted or failed run never leaves a half-written report.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import html
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from ._paths import NOTEBOOK_DIR


class NotebookError(RuntimeError):
    """A notebook failed: names the notebook and the failing cell."""


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if hasattr(obj, "to_dict") and callable(obj.to_dict):  # pandas DataFrame / Series
        try:
            return _jsonable(obj.to_dict(orient="records"))
        except TypeError:
            return _jsonable(obj.to_dict())
    return obj


def write_results(path: str | os.PathLike, results: Mapping[str, Any]) -> Path:
    """Write a notebook's key numbers to the JSON sidecar ``path``, atomically.

    NumPy scalars and arrays, DataFrames (as records) and non-finite floats (as null) are
    converted. The file is written to a temporary name and renamed, so readers never see half
    a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_jsonable(dict(results)), fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_results(path: str | os.PathLike) -> dict:
    """Read a JSON sidecar written by :func:`write_results`."""
    with open(path) as fh:
        return json.load(fh)


def list_notebooks(notebook_dir: str | os.PathLike = NOTEBOOK_DIR) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``) in reading order."""
    return sorted(p for p in Path(notebook_dir).glob("[0-9][0-9]_*.ipynb"))


def resolve_notebooks(selectors: Iterable[str] | None = None,
                      notebook_dir: str | os.PathLike = NOTEBOOK_DIR) -> list[Path]:
    """Notebooks named by number (``01``, ``1``), full stem (``01_reservation_tables``), name
    without number (``reservation_tables``) or path; all of them when ``selectors`` is empty."""
    known = list_notebooks(notebook_dir)
    if not selectors:
        if not known:
            raise ValueError(f"no notebooks found in {notebook_dir}")
        return known
    chosen: list[Path] = []
    for sel in selectors:
        s = str(sel)
        p = Path(s)
        if p.suffix == ".ipynb" and p.exists():
            chosen.append(p)
            continue
        stem = p.stem if p.suffix == ".ipynb" else s
        hits = [k for k in known
                if stem in (k.stem, k.stem[:2], k.stem[3:]) or (stem.isdigit() and int(stem) == int(k.stem[:2]))]
        if len(hits) != 1:
            names = ", ".join(k.stem for k in known)
            raise ValueError(f"notebook {s!r} {'is ambiguous' if hits else 'is unknown'}: known notebooks are {names}")
        chosen.append(hits[0])
    return chosen


def notebook_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """The parameters a notebook declares in its ``parameters`` cell, with their defaults."""
    import papermill  # noqa: PLC0415  (slow import, only for reports)

    info = papermill.inspect_notebook(str(path))
    return {name: spec.get("default") for name, spec in info.items()}


@contextlib.contextmanager
def _inline_figures() -> Iterator[None]:
    """Figures go into the executed notebook even when the caller's environment chose a
    non-interactive matplotlib backend (``MPLBACKEND=Agg`` in CI would otherwise reach the kernel,
    which then draws nothing into its outputs)."""
    old = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = old


def execute_notebook(notebook: str | os.PathLike, output_path: str | os.PathLike,
                     parameters: Mapping[str, Any] | None = None, *, results_path: str | os.PathLike | None = None,
                     kernel_name: str | None = None, cwd: str | os.PathLike | None = None) -> dict:
    """Execute one notebook with papermill and return its JSON results.

    Parameters
    ----------
    notebook : path or selector
        A notebook path or a selector understood by :func:`resolve_notebooks`.
    output_path : path
        Where the executed notebook is written.
    parameters : mapping
        Values for the notebook's ``parameters`` cell. Names the notebook does not declare raise
        ``ValueError``.
    results_path : path, optional
        JSON sidecar path; defaults to ``output_path`` with a ``.json`` suffix.

    Raises
    ------
    NotebookError
        Naming the notebook and the failing cell (its index, first source line and the error).
    """
    import papermill  # noqa: PLC0415
    from papermill.exceptions import PapermillExecutionError  # noqa: PLC0415

    path = Path(notebook)
    if not (path.suffix == ".ipynb" and path.exists()):
        path = resolve_notebooks([str(notebook)])[0]
    output_path = Path(output_path)
    results_path = Path(results_path) if results_path is not None else output_path.with_suffix(".json")
    params = dict(parameters or {})
    declared = notebook_parameters(path)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ValueError(f"notebook {path.stem} has no parameter(s) {', '.join(unknown)}; "
                         f"its parameters are {', '.join(declared)}")
    if "results_path" in declared:
        params["results_path"] = str(results_path.resolve())
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _inline_figures():
            papermill.execute_notebook(str(path), str(output_path), parameters=params, kernel_name=kernel_name,
                                       progress_bar=False, cwd=str(cwd or path.parent), log_output=False)
    except PapermillExecutionError as exc:
        first = (exc.source or "").strip().splitlines()
        raise NotebookError(
            f"notebook {path.stem} failed in cell {exc.cell_index} (execution count {exc.exec_count}, "
            f"starting {first[0] if first else ''!r}): {exc.ename}: {exc.evalue}") from None
    if "results_path" not in declared:
        return {}
    if not results_path.exists():
        raise NotebookError(f"notebook {path.stem} ran but did not write its results to {results_path} "
                            "(call kvlab.report.write_results(results_path, ...) in its last cell)")
    return read_results(results_path)


def export_html(executed: str | os.PathLike, html_path: str | os.PathLike) -> Path:
    """Export an executed notebook to a standalone HTML page."""
    import nbformat  # noqa: PLC0415
    from nbconvert import HTMLExporter  # noqa: PLC0415

    nb = nbformat.read(str(executed), as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    Path(html_path).write_text(body, encoding="utf-8")
    return Path(html_path)


def _split_parameters(paths: list[Path], parameters: Mapping[str, Any]) -> dict[Path, dict[str, Any]]:
    """Give each notebook the parameters it declares; keys may also be notebook selectors
    mapping to a dict of that notebook's own parameters (as in a YAML file)."""
    declared = {p: notebook_parameters(p) for p in paths}
    per: dict[Path, dict[str, Any]] = {p: {} for p in paths}
    used: set[str] = set()
    for key, value in parameters.items():
        if isinstance(value, Mapping):
            target = resolve_notebooks([key])[0]
            if target not in per:
                raise ValueError(f"parameters are given for notebook {target.stem}, which is not in this run")
            per[target].update(value)
            used.add(key)
            continue
        for p in paths:
            if key in declared[p]:
                per[p][key] = value
                used.add(key)
    unused = sorted(set(parameters) - used)
    if unused:
        raise ValueError(f"parameter(s) {', '.join(unused)} are declared by none of the notebooks "
                         f"{', '.join(p.stem for p in paths)}")
    return per


def _index_html(run_name: str, rows: list[dict[str, str]]) -> str:
    items = "\n".join(
        f"<tr><td>{html.escape(r['notebook'])}</td><td><a href=\"{r['html']}\">report</a></td>"
        f"<td><a href=\"{r['ipynb']}\">notebook</a></td><td><a href=\"{r['json']}\">results</a></td>"
        f"<td>{html.escape(r['parameters'])}</td></tr>" for r in rows)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>kvlab report {html.escape(run_name)}</title>"
            "</head><body><h1>kvlab report</h1>"
            f"<p>Run {html.escape(run_name)}.</p><table border='1' cellpadding='4'>"
            "<tr><th>notebook</th><th>HTML</th><th>executed</th><th>JSON</th><th>parameters</th></tr>"
            f"{items}</table></body></html>\n")


def run_report(selectors: Iterable[str] | None = None, parameters: Mapping[str, Any] | None = None, *,
               out: str | os.PathLike | None = None, reports_dir: str | os.PathLike = "reports",
               progress: bool = True) -> Path:
    """Run notebooks into a complete report folder and return its path.

    Parameters
    ----------
    selectors : notebook selectors (see :func:`resolve_notebooks`); all notebooks when empty.
    parameters : mapping
        ``name -> value`` applied to every notebook that declares ``name``; or
        ``selector -> {name: value}`` for one notebook. A name no notebook declares raises.
    out : path, optional
        Destination folder (must not exist yet). Default ``reports/run-YYYYmmdd-HHMMSS``.

    The run is written to a temporary folder beside the destination and renamed into place only
    when every notebook succeeded; on failure the temporary folder is removed and
    :class:`NotebookError` names the notebook and cell.
    """
    from tqdm.auto import tqdm  # noqa: PLC0415

    paths = resolve_notebooks(list(selectors or []))
    per = _split_parameters(paths, dict(parameters or {}))
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    dest = Path(out) if out is not None else Path(reports_dir) / f"run-{stamp}"
    if dest.exists():
        raise ValueError(f"output folder {dest} already exists; choose another --out")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    rows = []
    try:
        for path in tqdm(paths, desc="notebooks", unit="nb", disable=not progress):
            stem = path.stem
            execute_notebook(path, tmp / f"{stem}.ipynb", per[path], results_path=tmp / f"{stem}.json")
            export_html(tmp / f"{stem}.ipynb", tmp / f"{stem}.html")
            rows.append({"notebook": stem, "html": f"{stem}.html", "ipynb": f"{stem}.ipynb", "json": f"{stem}.json",
                         "parameters": json.dumps(_jsonable(per[path]), sort_keys=True)})
        (tmp / "index.html").write_text(_index_html(dest.name, rows), encoding="utf-8")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
