"""Execute one notebook with papermill: parameters checked, tables set up, kernel kept quiet.

The kernel is started with its own log at CRITICAL level, so Jupyter's transport notices ("Kernel is
running over TCP without encryption", ...) do not reach the user's terminal; what the notebook
prints to stderr (warnings, ``tqdm`` bars of long cells) is handed to ``on_stderr``.
"""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .kernel_setup import SETUP_SOURCE, SETUP_TAG
from .notebooks import check_values, notebook_parameters, resolve_notebooks
from .results import read_results

KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


class NotebookError(RuntimeError):
    """A notebook failed: names the notebook and the failing cell."""


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


class _Stream(io.TextIOBase):
    """A write-only text stream calling ``sink`` with each chunk."""

    def __init__(self, sink: Callable[[str], None]):
        super().__init__()
        self._sink = sink

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._sink(text)
        return len(text)


def _with_setup_cell(path: Path):
    """The notebook with the hidden :mod:`kvlab.report.kernel_setup` set-up cell first."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cell = nbformat.v4.new_code_cell(SETUP_SOURCE, metadata={"tags": [SETUP_TAG], "jupyter": {"source_hidden": True}})
    nb.cells.insert(0, cell)
    return nb


def _record_input_path(executed: Path, source: Path) -> None:
    """Name the source notebook in the executed one's papermill metadata (papermill was given the
    notebook with its set-up cell as an object, and records that object otherwise)."""
    import nbformat

    if executed.exists():
        nb = nbformat.read(str(executed), as_version=4)
        nb.metadata.setdefault("papermill", {})["input_path"] = str(source)
        nbformat.write(nb, str(executed))


def execute_notebook(notebook: str | os.PathLike, output_path: str | os.PathLike,
                     parameters: Mapping[str, Any] | None = None, *, results_path: str | os.PathLike | None = None,
                     kernel_name: str | None = None, cwd: str | os.PathLike | None = None,
                     on_stderr: Callable[[str], None] | None = None) -> dict:
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
    on_stderr : callable, optional
        Called with each chunk the notebook writes to stderr, as it arrives.

    Raises
    ------
    NotebookError
        Naming the notebook and the failing cell (its index, first source line and the error).
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

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
    check_values(path, params, declared)
    if "results_path" in declared:
        params["results_path"] = str(results_path.resolve())
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _inline_figures():
            papermill.execute_notebook(_with_setup_cell(path), str(output_path), parameters=params,
                                       kernel_name=kernel_name, progress_bar=False, cwd=str(cwd or path.parent),
                                       log_output=False, extra_arguments=KERNEL_ARGUMENTS,
                                       stderr_file=_Stream(on_stderr) if on_stderr else None)
    except PapermillExecutionError as exc:
        _record_input_path(output_path, path)
        first = (exc.source or "").strip().splitlines()
        raise NotebookError(
            f"notebook {path.stem} failed in cell {exc.cell_index} (execution count {exc.exec_count}, "
            f"starting {first[0] if first else ''!r}): {exc.ename}: {exc.evalue}") from None
    _record_input_path(output_path, path)
    if "results_path" not in declared:
        return {}
    if not results_path.exists():
        raise NotebookError(f"notebook {path.stem} ran but did not write its results to {results_path} "
                            "(call kvlab.report.write_results(results_path, ...) in its last cell)")
    return read_results(results_path)
