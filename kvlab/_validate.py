"""Checks of user input at kvlab's public boundary.

Each raises ``ValueError`` naming the parameter and the bad value, so a wrong argument never
surfaces as a traceback from deep inside NumPy. Hot loops receive already-checked values.
"""
from __future__ import annotations

import numbers
from typing import Any, Iterable

import numpy as np


def positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` > 0, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and np.isfinite(value) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def nonnegative_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` >= 0, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and np.isfinite(value) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def positive_float(value: Any, name: str) -> float:
    """``value`` as a finite ``float`` > 0, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def nonnegative_float(value: Any, name: str) -> float:
    """``value`` as a finite ``float`` >= 0, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) \
            or value < 0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return float(value)


def fraction(value: Any, name: str, *, low_open: bool = True, high_closed: bool = True) -> float:
    """``value`` in (0, 1] (by default), or ``ValueError`` naming ``name`` and the interval."""
    lo, hi = ("(" if low_open else "["), ("]" if high_closed else ")")
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(value)
    if ok:
        v = float(value)
        ok = (v > 0 if low_open else v >= 0) and (v <= 1 if high_closed else v < 1)
    if not ok:
        raise ValueError(f"{name} must be in {lo}0, 1{hi}, got {value!r}")
    return float(value)


def _int_array(values: Any, name: str, minimum: int, what: str) -> np.ndarray:
    """A 1-D ``int64`` array of integers >= ``minimum``, or ``ValueError`` naming the first bad
    element. Vectorised for numeric arrays (a million-element check costs milliseconds); object
    arrays (mixed types) are checked element by element."""
    arr = np.atleast_1d(np.asarray(values))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if arr.dtype.kind in "iu":
        bad = np.flatnonzero(arr < minimum)
    elif arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < minimum) | (arr != np.floor(arr)))
    else:
        bad = np.array([i for i, v in enumerate(arr.tolist())
                        if not (isinstance(v, numbers.Real) and not isinstance(v, bool)
                                and float(v).is_integer() and v >= minimum)], dtype=np.int64)
    if bad.size:
        i = int(bad[0])
        value = arr[i].item() if hasattr(arr[i], "item") else arr[i]
        raise ValueError(f"{name} must hold {what}; element {i} is {value!r}")
    return arr.astype(np.int64)


def positive_int_array(values: Any, name: str) -> np.ndarray:
    """A 1-D ``int64`` array of integers > 0 (scalar accepted), or ``ValueError`` naming the
    parameter and the first bad position and value."""
    return _int_array(values, name, 1, "positive integers")


def nonnegative_int_array(values: Any, name: str) -> np.ndarray:
    """A 1-D ``int64`` array of integers >= 0 (scalar accepted), or ``ValueError``."""
    return _int_array(values, name, 0, "non-negative integers")


def require_columns(table: Any, columns: Iterable[str], name: str, *, needed_by: str = "") -> None:
    """``ValueError`` unless ``table`` is a DataFrame holding every one of ``columns``; the message
    names the table, the missing columns (all of them), what needs them and what it has."""
    import pandas as pd  # noqa: PLC0415  (pandas is only needed for this check)

    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"{name} must be a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        why = f" that {needed_by} needs" if needed_by else ""
        raise ValueError(f"{name} lacks the column(s) {', '.join(map(repr, missing))}{why}; "
                         f"it has {', '.join(map(str, table.columns))}")


def choice(value: Any, name: str, options: Iterable[str]) -> str:
    """``value`` if it is one of ``options``, else ``ValueError`` listing them."""
    options = list(options)
    if value not in options:
        raise ValueError(f"{name} {value!r} is unknown: expected one of {', '.join(map(str, options))}")
    return value
