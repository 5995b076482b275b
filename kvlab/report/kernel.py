"""What a report's kernel runs before a notebook's first cell: readable tables, quiet progress bars.

The report runner inserts one hidden cell calling :func:`setup` (removed from the HTML page), so
every notebook gets the same table display without each notebook setting it:

- pandas shows tables whole (no ``...`` columns, rows or cell text) and formats floats with four
  significant digits and thousands separators (``1166.6605`` -> ``1,167``, ``0.012345`` ->
  ``0.01235``);
- ``tqdm.auto`` bars inside long cells print plain text to the kernel's stderr, which the runner
  shows on its own progress line (and leaves out of the page) instead of a widget no one sees.

Doing this in the kernel rather than in an nbconvert template keeps the numbers in the executed
``.ipynb`` and the ``.html`` page the same; the page's CSS then only wraps long cells.
"""
from __future__ import annotations

import math
import os

MAX_TABLE_ROWS = 1000
"""Tables with more rows than this are shown shortened (a notebook should not display them)."""


def format_number(x: float) -> str:
    """A float as a reader wants it in a table: four significant digits, thousands separators,
    no trailing zeros; scientific notation below 0.001 and from 1e12.

    >>> [format_number(v) for v in (1166.6605, 0.5, 2048.0, 0.012345, 3.2e-05, 0.0)]
    ['1,167', '0.5', '2,048', '0.01235', '3.2e-05', '0']
    """
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if mag < -3 or mag >= 12:
        return f"{x:.3g}"
    text = f"{x:,.{max(0, 3 - mag)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def setup() -> None:
    """Set the kernel's table display and progress bars for a report run (see the module note)."""
    import pandas as pd

    pd.set_option("display.max_columns", None)
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_rows", MAX_TABLE_ROWS)
    pd.set_option("display.width", None)
    pd.set_option("display.float_format", format_number)

    import warnings

    with warnings.catch_warnings():  # tqdm warns that ipywidgets is missing: no widget is wanted here
        warnings.simplefilter("ignore")
        import tqdm.auto
    import tqdm.std

    os.environ.setdefault("TQDM_MININTERVAL", "1")
    tqdm.auto.tqdm, tqdm.auto.trange = tqdm.std.tqdm, tqdm.std.trange


SETUP_TAG = "kvlab-report-setup"
SETUP_SOURCE = "import kvlab.report.kernel\nkvlab.report.kernel.setup()"
