"""What a report's kernel runs before a notebook's first cell: readable tables, warnings and progress bars.

The report runner inserts one hidden cell calling :func:`setup` (removed from the HTML page), so
every notebook gets the same display without each notebook setting it:

- every DataFrame and Series is shown by :func:`kvlab.report.tables.to_html` (no 0..N index, no
  empty column, numbers with four significant digits and thousands separators, names with
  units), and pandas' own text display is set to the same number format;
- a warning prints as ``CategoryWarning: message``, without the file path and source line of the
  machine that built the page;
- ``tqdm.auto`` bars inside long cells print plain text to the kernel's stderr, which the runner
  shows on its own progress line (and leaves out of the page) instead of a widget no one sees.

Doing this in the kernel rather than in an nbconvert template keeps the numbers in the executed
``.ipynb`` and the ``.html`` page the same; the page's CSS then only wraps long cells.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

from . import tables


def _warning_line(message: Any, category: type, filename: str, lineno: int, line: str | None = None) -> str:
    """A warning as a page shows it: its category and message, no path or source line."""
    return f"{category.__name__}: {message}\n"


def setup() -> None:
    """Set the kernel's table display, warnings and progress bars for a report run (see the module note)."""
    import pandas as pd

    pd.set_option("display.max_columns", None)
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_rows", tables.MAX_TABLE_ROWS)
    pd.set_option("display.width", None)
    pd.set_option("display.float_format", tables.format_number)
    tables.install()
    warnings.formatwarning = _warning_line

    with warnings.catch_warnings():  # tqdm warns that ipywidgets is missing: no widget is wanted here
        warnings.simplefilter("ignore")
        import tqdm.auto
    import tqdm.std

    os.environ.setdefault("TQDM_MININTERVAL", "1")
    tqdm.auto.tqdm, tqdm.auto.trange = tqdm.std.tqdm, tqdm.std.trange


SETUP_TAG = "kvlab-report-setup"
SETUP_SOURCE = "import kvlab.report.kernel_setup\nkvlab.report.kernel_setup.setup()"
