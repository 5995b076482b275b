"""How a report shows numbers, tables and a notebook's set-up: the one place every page's formatting lives.

- :func:`format_number`: four significant digits, thousands separators (``1166.6605`` -> ``1,167``).
- :func:`column_label`: a column name in words with its unit (``capacity_lo_qps`` ->
  ``capacity lo (requests/s)``), read from kvlab's unit suffixes.
- :func:`display_frame`: a DataFrame as a reader gets it: no 0..N row index, no column that holds
  no value, mapping cells (fit parameters) spread into columns, every cell formatted as text.
- :func:`to_html`: that frame as an HTML table; :func:`install` makes it the kernel's display of
  every DataFrame and Series, so notebooks show tables with ``df`` alone and all pages agree.
- :func:`setup_items`: a sidecar's ``setup`` mapping as short ``(label, text)`` rows ("Rests on").
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

MAX_TABLE_ROWS = 1000
"""Tables with more rows than this are shown shortened (a notebook should not display them)."""

#: Unit suffixes of kvlab's column and key names, longest first: suffix -> unit in words.
UNITS = (("_s_per_token", "s/token"), ("_tokens_per_s", "tokens/s"), ("_requests_per_s", "requests/s"),
         ("_per_s", "/s"), ("_qps", "requests/s"), ("_ms", "ms"), ("_us", "µs"), ("_s", "s"),
         ("_tokens", "tokens"), ("_pages", "pages"), ("_bytes", "bytes"), ("_gib", "GiB"), ("_gbps", "GB/s"),
         ("_frac", "share"), ("_pct", "%"))

#: Names kept as written: server parameters a reader types (``max_new_tokens``), not words to translate.
VERBATIM = ("max_new_tokens", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size")

#: Cell texts that mean "no value".
EMPTY = ("", "nan", "NaN", "None", "<NA>", "NaT", "n/a", "–")


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


def column_label(name: Any) -> Any:
    """A column (or key) name in words with its unit in brackets; other names unchanged.

    >>> [column_label(n) for n in ("capacity_lo_qps", "p99_ttft_ms", "tokens_per_s", "copy_latency_s", "max_new_tokens")]
    ['capacity lo (requests/s)', 'p99 ttft (ms)', 'tokens/s', 'copy latency (s)', 'max_new_tokens']
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]+", name) or name in VERBATIM:
        return name
    for suffix, unit in UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)].replace("_", " ")
            return f"{stem}/s" if unit == "/s" else f"{stem} ({unit})"
    return name.replace("_", " ")


def cell_text(value: Any) -> str:
    """One table cell as text: numbers by :func:`format_number` (integers with separators), a
    mapping as ``key value`` pairs, a sequence joined by commas, no value as ``""``."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isnan(f):
            return ""
        return f"{int(f):,}" if f.is_integer() and abs(f) < 1e15 else format_number(f)
    if isinstance(value, Mapping):
        return ", ".join(f"{column_label(k)} {cell_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, np.ndarray)):
        return ", ".join(cell_text(v) for v in value)
    return str(value)


def _is_empty(col: pd.Series) -> bool:
    return all(cell_text(v).strip() in EMPTY for v in col)


def _spread_mappings(df: pd.DataFrame) -> pd.DataFrame:
    """Each column whose values are all mappings (or empty) becomes one column per key."""
    for col in list(df.columns):
        values = [v for v in df[col] if not (v is None or (isinstance(v, float) and math.isnan(v)))]
        if values and all(isinstance(v, Mapping) for v in values):
            keys = list(dict.fromkeys(k for v in values for k in v))
            spread = pd.DataFrame([{f"{col}_{k}": v.get(k) if isinstance(v, Mapping) else None for k in keys}
                                   for v in df[col]], index=df.index)
            at = list(df.columns).index(col)
            df = pd.concat([df.iloc[:, :at], spread, df.iloc[:, at + 1:]], axis=1)
    return df


def _trivial_index(index: pd.Index) -> bool:
    """The 0..N-1 row numbers pandas gives a table (which say nothing to a reader)."""
    if index.nlevels != 1 or index.name is not None:
        return False
    if isinstance(index, pd.RangeIndex):
        return True
    return pd.api.types.is_integer_dtype(index) and np.array_equal(np.asarray(index), np.arange(len(index)))


def display_frame(data: pd.DataFrame | pd.Series) -> pd.DataFrame:
    """``data`` as text cells ready to show: the row index kept only where it names the rows,
    mapping cells spread into columns, columns that hold no value dropped, names in words with
    units (:func:`column_label`), values by :func:`cell_text`."""
    df = data.to_frame() if isinstance(data, pd.Series) else data.copy()
    if len(df) > MAX_TABLE_ROWS:
        df = df.head(MAX_TABLE_ROWS)
    if not _trivial_index(df.index):
        names = [n if n is not None else "" for n in df.index.names]
        df = df.rename_axis(names).reset_index()  # unnamed row labels keep an empty header, not "index"
    if isinstance(df.columns, pd.MultiIndex):
        df.columns = [" ".join(str(c) for c in col if str(c)) for col in df.columns]
    df = _spread_mappings(df)
    df = df.loc[:, [not _is_empty(df.iloc[:, i]) for i in range(df.shape[1])]] if len(df) else df
    out = pd.DataFrame({i: [cell_text(v) for v in df.iloc[:, i]] for i in range(df.shape[1])}, index=range(len(df)))
    out.columns = [str(column_label(c)) for c in df.columns]
    return out


_NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+(e[-+]?\d+)?%?$")


def to_html(data: pd.DataFrame | pd.Series) -> str:
    """``data`` as an HTML table (:func:`display_frame`; no row index): a column of numbers
    right-aligned (class ``num``), text left-aligned."""
    import html as _html

    frame = display_frame(data)
    numeric = [bool(len(frame)) and all(not v or _NUMBER.match(v) for v in frame[c]) for c in frame.columns]
    cls = [' class="num"' if n else "" for n in numeric]
    head = "".join(f"<th{c}>{_html.escape(str(name))}</th>" for name, c in zip(frame.columns, cls))
    rows = "".join("<tr>" + "".join(f"<td{c}>{_html.escape(v)}</td>" for v, c in zip(row, cls)) + "</tr>"
                   for row in frame.itertuples(index=False, name=None))
    table = f'<table class="dataframe kvlab-table"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
    if len(data) > MAX_TABLE_ROWS:
        table += f"<p>(first {MAX_TABLE_ROWS:,} of {len(data):,} rows)</p>"
    return table


def install() -> None:
    """Make :func:`to_html` the kernel's HTML display of every DataFrame and Series (no-op
    outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    html = ip.display_formatter.formatters["text/html"]
    html.for_type(pd.DataFrame, to_html)
    html.for_type(pd.Series, to_html)


def _value_text(key: str, value: Any) -> str:
    """A set-up value in words: seconds and bytes scaled to a readable unit, other numbers by
    :func:`cell_text` with the unit the key's suffix names."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(float(value)):
        v = float(value)
        if key.endswith("_bytes_per_s"):
            return f"{format_number(v / 1e9)} GB/s"
        if key.endswith("_s") and not key.endswith("_per_s") and 0 < abs(v) < 1:
            return f"{format_number(v * 1e3)} ms" if abs(v) >= 1e-3 else f"{format_number(v * 1e6)} µs"
        for suffix, unit in UNITS:
            if key.endswith(suffix):
                return f"{cell_text(value)} {unit}"
    if isinstance(value, str):
        return value
    return cell_text(value)


def _key_words(key: str) -> str:
    for suffix, _ in (("_bytes_per_s", ""),) + UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ")


def setup_items(setup: Mapping[str, Any], skip: Iterable[str] = ()) -> list[tuple[str, str]]:
    """A sidecar's ``setup`` as ``(label, text)`` rows: keys in words, values with their units and
    four significant digits, a nested mapping as one row of its own ``key value`` pairs; keys
    without a value (None, ``""``) and those in ``skip`` left out.

    >>> setup_items({"copy_latency_s": 4.9999999999999996e-06, "link_bytes_per_s": 31.5e9, "tp": 1,
    ...              "load": {"duration_s": 1038.455005725461, "refused_requests": 0}, "chunk_tokens": None})
    [('copy latency', '5 µs'), ('link', '31.5 GB/s'), ('tp', '1'), ('load', 'duration 1,038 s, refused requests 0')]
    """
    rows = []
    for key, value in setup.items():
        if key in skip or value is None or (isinstance(value, str) and not value.strip()):
            continue
        if isinstance(value, Mapping):
            parts = [f"{_key_words(str(k))} {_value_text(str(k), v)}" for k, v in value.items()
                     if v is not None and not (isinstance(v, str) and not v.strip())
                     and not isinstance(v, (Mapping, list, tuple))]
            text = ", ".join(parts)
        else:
            text = _value_text(str(key), value)
        if text.strip():
            rows.append((_key_words(str(key)), text))
    return rows
