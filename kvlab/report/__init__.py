"""Run kvlab's notebooks as parameterised papermill reports a person can read.

``run_report`` executes the chosen notebooks, exports each to a clean HTML page, collects each
notebook's JSON sidecar (``write_results``) and figures (:mod:`kvlab.plots`) and writes a summary
page. Modules: :mod:`.notebooks` (finding notebooks, their parameters), :mod:`.execute` (one
papermill run), :mod:`.kernel_setup` (what the kernel runs first), :mod:`.tables` (how numbers,
tables and set-ups are shown), :mod:`.pages` (HTML), :mod:`.results` (the sidecar), :mod:`.run`
(the run folder).
"""
from .execute import NotebookError, execute_notebook
from .notebooks import (ParameterWarning, format_parameters, list_notebooks, notebook_parameters, parameters,
                        resolve_notebooks, split_parameters)
from .pages import export_html
from .results import read_results, verdict_counts, write_results
from .run import run_report

__all__ = ["NotebookError", "ParameterWarning", "execute_notebook", "export_html", "format_parameters",
           "list_notebooks", "notebook_parameters", "parameters", "read_results", "resolve_notebooks",
           "run_report", "split_parameters", "verdict_counts", "write_results"]
