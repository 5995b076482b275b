"""One plotting style for every report, and figures saved as files next to a notebook's results.

Notebooks call :func:`style` once, draw with seaborn/matplotlib, and hand each figure to
:func:`save`, which writes ``<results stem>-<name>.png`` (and ``.svg``) beside the JSON sidecar
and returns the PNG's file name. The sidecar lists those names under ``"figures"``, the first
being the notebook's key figure (the report's summary page shows it as a thumbnail).

Helpers for what report figures keep getting wrong: :func:`legend_outside` (legends beside the
data, never over it), :func:`log_if_spans` (log scale where values span decades),
:func:`ticks_at` (ticks at the swept values, no crowded log minor ticks), :func:`mark_selected`
(the recommended / selected point marked and labelled) and
:func:`label_ties` (settings that give the same point named together instead of hidden under
one marker).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def style() -> None:
    """Apply kvlab's figure style (seaborn whitegrid, colour-blind palette, readable font sizes,
    tight bounding boxes)."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind")
    mpl.rcParams.update({"figure.figsize": (8.0, 4.5), "figure.dpi": 100, "savefig.dpi": 120,
                         "savefig.bbox": "tight", "axes.titlesize": 12, "legend.frameon": False})


def legend_outside(ax: Any, title: str | None = None) -> None:
    """Move ``ax``'s legend to the right of the plot area (no legend: nothing to do)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    old = ax.get_legend()
    if title is None and old is not None:
        title = old.get_title().get_text() or None
    ax.legend(handles, labels, title=title, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def log_if_spans(ax: Any, values: Any, axis: str = "y", decades: float = 2.0) -> bool:
    """Use a log scale on ``axis`` (``"x"`` or ``"y"``) when the positive ``values`` span at least
    ``decades`` powers of ten; return whether it did."""
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size < 2 or np.log10(v.max() / v.min()) < decades:
        return False
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    return True


def ticks_at(ax: Any, values: Sequence[float], axis: str = "x") -> None:
    """Put ``axis``'s ticks at the swept ``values`` only, labelled with thousands separators (a
    log axis's minor ticks and their labels removed, so they cannot collide)."""
    import matplotlib.ticker as mticker

    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    v = sorted({float(x) for x in values})
    which = ax.xaxis if axis == "x" else ax.yaxis
    which.set_major_locator(mticker.FixedLocator(v))
    which.set_minor_locator(mticker.NullLocator())
    which.set_major_formatter(mticker.FixedFormatter([f"{x:,.0f}" if x.is_integer() else f"{x:g}" for x in v]))


def mark_selected(ax: Any, x: float, y: float, label: str = "selected", *,
                  offset_points: tuple[float, float] = (10.0, 10.0)) -> None:
    """Mark the point ``(x, y)`` with a large outlined star and write ``label`` beside it.

    ``offset_points`` places the label relative to the point (points; negative = left / below),
    so that several marks on one figure do not write over each other.
    """
    ax.scatter([x], [y], s=320, marker="*", facecolor="gold", edgecolor="black", linewidth=1.2, zorder=10)
    ax.annotate(label, (x, y), xytext=offset_points, textcoords="offset points", fontsize=10, fontweight="bold",
                ha="right" if offset_points[0] < 0 else "left", zorder=11,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6", "alpha": 0.9})


def tie_groups(data: pd.DataFrame, x: str, y: str, label: str, *, rel_tol: float = 1e-9) -> pd.DataFrame:
    """Rows of ``data`` that share one ``(x, y)`` point (within ``rel_tol``), one row per point
    with two or more settings: ``x``, ``y``, ``count`` and ``labels`` (the ``label`` values
    joined by ``", "``)."""
    for col in (x, y, label):
        if col not in data.columns:
            raise ValueError(f"tie_groups: data has no column {col!r}; it has {', '.join(map(str, data.columns))}")
    keys = data[[x, y]].astype(float)
    scale = keys.abs().max().replace(0, 1.0)
    rounded = (keys / scale / rel_tol).round()
    groups = data.assign(_kx=rounded[x], _ky=rounded[y]).groupby(["_kx", "_ky"], sort=False)
    rows = [{x: g[x].iloc[0], y: g[y].iloc[0], "count": len(g), "labels": ", ".join(map(str, g[label]))}
            for _, g in groups if len(g) > 1]
    return pd.DataFrame(rows, columns=[x, y, "count", "labels"])


def label_ties(ax: Any, data: pd.DataFrame, x: str, y: str, label: str, *, rel_tol: float = 1e-9) -> pd.DataFrame:
    """Annotate every point of ``ax`` where several settings of ``data`` tie (same ``x`` and
    ``y``): a ring around the point and ``"n tie: a, b, c"`` beside it. Returns
    :func:`tie_groups`."""
    ties = tie_groups(data, x, y, label, rel_tol=rel_tol)
    for k, row in enumerate(ties.itertuples(index=False)):
        px, py = getattr(row, x), getattr(row, y)
        ax.scatter([px], [py], s=260, facecolor="none", edgecolor="black", linewidth=1.0, zorder=9)
        ax.annotate(f"{row.count} tie: {row.labels}", (px, py), xytext=(12, -14 - 12 * (k % 3)),
                    textcoords="offset points", fontsize=8, zorder=11,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.7", "alpha": 0.9})
    return ties


def save(fig: Any, results_path: str | os.PathLike, name: str, formats: Sequence[str] = ("png", "svg")) -> str:
    """Write ``fig`` as PNG and SVG beside ``results_path``; return the PNG's file name.

    Parameters
    ----------
    fig : matplotlib Figure (or anything with ``savefig``; an Axes is taken as its figure)
    results_path : path
        The notebook's JSON sidecar; figures go to its folder as ``<stem>-<name>.png``.
    name : str
        Short figure name: letters, digits, ``-`` and ``_`` only.
    formats : sequence of str
        File formats to write; the first is the one whose name is returned.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"figure name must be letters, digits, '-' or '_', got {name!r}")
    fig = getattr(fig, "figure", fig) if not hasattr(fig, "savefig") else fig
    path = Path(results_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    first = path.with_name(f"{path.stem}-{name}.{formats[0]}")
    for fmt in formats:
        target = first.with_suffix(f".{fmt}")
        tmp = target.with_name(f".{target.name}.tmp.{fmt}")
        fig.savefig(tmp)
        os.replace(tmp, target)
    return first.name
