"""One plotting style for every report, and figures saved as files next to a notebook's results.

Notebooks call :func:`style` once, draw with seaborn/matplotlib, and hand each figure to
:func:`save`, which writes ``<results stem>-<name>.png`` (and ``.svg``) beside the JSON sidecar
and returns the PNG's file name. The sidecar lists those names under ``"figures"``, the first
being the notebook's key figure (the report's summary page shows it as a thumbnail).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def style() -> None:
    """Apply kvlab's figure style (seaborn whitegrid, readable font sizes, tight layout)."""
    import matplotlib as mpl  # noqa: PLC0415
    import seaborn as sns  # noqa: PLC0415

    sns.set_theme(style="whitegrid", context="notebook")
    mpl.rcParams.update({"figure.figsize": (8.0, 4.5), "figure.dpi": 100, "savefig.dpi": 120,
                         "savefig.bbox": "tight", "axes.titlesize": 12, "legend.frameon": False})


def save(fig: Any, results_path: str | os.PathLike, name: str) -> str:
    """Write ``fig`` as PNG and SVG beside ``results_path``; return the PNG's file name.

    Parameters
    ----------
    fig : matplotlib Figure (or anything with ``savefig``; an Axes is taken as its figure)
    results_path : path
        The notebook's JSON sidecar; figures go to its folder as ``<stem>-<name>.png``.
    name : str
        Short figure name: letters, digits, ``-`` and ``_`` only.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"figure name must be letters, digits, '-' or '_', got {name!r}")
    fig = getattr(fig, "figure", fig) if not hasattr(fig, "savefig") else fig
    path = Path(results_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_name(f"{path.stem}-{name}.png")
    for target in (png, png.with_suffix(".svg")):
        tmp = target.with_name(f".{target.name}.tmp{target.suffix}")
        fig.savefig(tmp)
        os.replace(tmp, target)
    return png.name
