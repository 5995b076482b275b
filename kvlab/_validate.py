"""Checks of user input at kvlab's public boundary.

Each raises ``ValueError`` naming the parameter and the bad value, so a wrong argument never
surfaces as a traceback from deep inside NumPy. Hot loops receive already-checked values.
"""
from __future__ import annotations

import contextlib
import datetime
import numbers
import warnings
from typing import Any, Iterable

import numpy as np

#: The largest integer a parameter may hold unless its check states a tighter bound: the
#: largest ``int64``, so no parameter wraps when it reaches NumPy.
MAX_INT = 2**63 - 1

#: The stated maximum of a request's prompt or output length in a trace (tokens): ten million,
#: the longest context window of any released model (Llama 4 Scout, 10M tokens). A longer value
#: is a broken row, not a request.
MAX_TRACE_TOKENS = 10_000_000

#: The most requests kvlab draws or simulates at once: 100 million (a week of the largest public
#: trace, Azure 2024 conversation, holds 27.3 million); each costs tens of bytes per array.
MAX_REQUESTS = 100_000_000

#: Below this many requests a trace's percentiles rest on too few values to recommend from
#: (a p95 needs 20 values before it is anything but the maximum).
FEW_REQUESTS = 20


class FewRequestsWarning(UserWarning):
    """A trace or workload holds fewer than :data:`FEW_REQUESTS` requests."""


def _bounded_int(value: Any, name: str, minimum: int, maximum: int, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and np.isfinite(value) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be {what}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {value:,}")
    return value


def positive_int(value: Any, name: str, *, maximum: int = MAX_INT) -> int:
    """``value`` as a Python ``int`` in [1, ``maximum``], or ``ValueError`` naming ``name``."""
    return _bounded_int(value, name, 1, maximum, "a positive integer")


def nonnegative_int(value: Any, name: str, *, maximum: int = MAX_INT) -> int:
    """``value`` as a Python ``int`` in [0, ``maximum``], or ``ValueError`` naming ``name``."""
    return _bounded_int(value, name, 0, maximum, "a non-negative integer")


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


def _int_in(v: Any, minimum: int, maximum: int) -> bool:
    """``v`` is an integer (or an integral float) in [minimum, maximum], compared exactly."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return False
    if not isinstance(v, numbers.Integral):
        if not np.isfinite(v) or not float(v).is_integer():
            return False
    return minimum <= int(v) <= maximum


def _int_array(values: Any, name: str, minimum: int, what: str, maximum: int) -> np.ndarray:
    """A 1-D ``int64`` array of integers in [``minimum``, ``maximum``], or ``ValueError`` naming
    the first bad element. Vectorised for numeric arrays (a million-element check costs
    milliseconds); object arrays (mixed types) are checked element by element. Values are compared
    before the cast, so nothing wraps."""
    try:
        arr = np.atleast_1d(np.asarray(values))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of {what}: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < minimum) | (arr > maximum))
    elif arr.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~np.isfinite(arr) | (arr < minimum) | (arr > maximum) | (arr != np.floor(arr)))
    else:
        bad = np.array([i for i, v in enumerate(arr.tolist()) if not _int_in(v, minimum, maximum)], dtype=np.int64)
    if bad.size:
        i = int(bad[0])
        value = arr[i].item() if hasattr(arr[i], "item") else arr[i]
        bound = f" at most {maximum:,}" if maximum < MAX_INT else " that fit in 64 bits"
        raise ValueError(f"{name} must hold {what}{bound}; element {i} is {value!r}")
    return arr.astype(np.int64)


def positive_int_array(values: Any, name: str, *, maximum: int = MAX_INT) -> np.ndarray:
    """A 1-D ``int64`` array of integers in [1, ``maximum``] (scalar accepted), or ``ValueError``
    naming the parameter and the first bad position and value."""
    return _int_array(values, name, 1, "positive integers", maximum)


def nonnegative_int_array(values: Any, name: str, *, maximum: int = MAX_INT) -> np.ndarray:
    """A 1-D ``int64`` array of integers in [0, ``maximum``] (scalar accepted), or ``ValueError``."""
    return _int_array(values, name, 0, "non-negative integers", maximum)


def require_columns(table: Any, columns: Iterable[str], name: str, *, needed_by: str = "") -> None:
    """``ValueError`` unless ``table`` is a DataFrame holding every one of ``columns``; the message
    names the table, the missing columns (all of them), what needs them and what it has."""
    import pandas as pd

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


# ------------------------------------------------------------------ the trace contract
def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


def real_values(raw: Any) -> np.ndarray:
    """Values as float64, NaN where not a real number (booleans and strings are not numbers).
    Integers too large for float64 become inf, never a wrapped integer."""
    import pandas as pd

    s = raw if isinstance(raw, pd.Series) else pd.Series(np.asarray(raw, dtype=object))
    kind = s.dtype.kind
    if kind in "iuf":
        return s.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    if kind == "b" or kind in "mM" or isinstance(s.dtype, pd.DatetimeTZDtype):
        return np.full(len(s), np.nan)

    def one(x: Any) -> float:
        if _is_bool(x) or not isinstance(x, (numbers.Real, str)):
            return np.nan
        try:
            return float(x)
        except (OverflowError, ValueError):
            return np.inf if isinstance(x, numbers.Integral) else np.nan

    if isinstance(s.dtype, pd.StringDtype):  # text only: vectorised, and no booleans to refuse
        return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return np.fromiter((one(x) for x in s.tolist()), dtype=np.float64, count=len(s))


def token_counts(raw: Any, *, maximum: int = MAX_TRACE_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """A column of token counts as ``int64`` and the mask of entries that are not integers in
    [1, ``maximum``] (those hold 0). Every comparison is made before the cast: nothing wraps."""
    num = real_values(raw)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(num) | (num < 1) | (num > maximum) | (num != np.floor(num))
    out = np.where(bad, 0.0, num).astype(np.int64)
    return out, bad


def seconds(raw: Any, *, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A column of times as float64 seconds and the mask of entries that are not finite.

    Numbers are multiplied by ``scale`` (e.g. 1e-3 for milliseconds). Datetimes (naive, or
    time-zone aware: compared in UTC) become seconds since the earliest; timedeltas become their
    seconds. Neither is ever read as a count of nanoseconds.
    """
    import pandas as pd

    s = raw if isinstance(raw, pd.Series) else pd.Series(raw)
    if s.dtype == object and len(s):
        sample = s.dropna()
        first = sample.iloc[0] if len(sample) else None
        if isinstance(first, (datetime.date, np.datetime64)):  # pandas Timestamps are datetimes
            s = pd.to_datetime(s, errors="coerce", utc=True)
        elif isinstance(first, (datetime.timedelta, np.timedelta64)):
            s = pd.to_timedelta(s, errors="coerce")
    if s.dtype.kind == "M" or isinstance(s.dtype, pd.DatetimeTZDtype):
        t = (s - s.min()).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
    elif s.dtype.kind == "m":
        t = s.dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        t = real_values(s) * scale
    return t, ~np.isfinite(t)


def booleans(raw: Any) -> tuple[np.ndarray, np.ndarray]:
    """A column of flags as bool and the mask of entries that are not booleans (or 0 / 1)."""
    import pandas as pd

    s = raw if isinstance(raw, pd.Series) else pd.Series(raw)
    if s.dtype == bool:
        return s.to_numpy(), np.zeros(len(s), dtype=bool)
    vals = s.tolist()
    ok = np.array([_is_bool(x) or (isinstance(x, numbers.Real) and x in (0, 1)) for x in vals], dtype=bool)
    flags = np.array([bool(x) if good else False for x, good in zip(vals, ok)], dtype=bool)
    return flags, ~ok


def no_duplicate_columns(table: Any, name: str) -> None:
    """``ValueError`` naming the duplicated column names of a DataFrame."""
    dup = list(dict.fromkeys(map(str, table.columns[table.columns.duplicated()])))
    if dup:
        raise ValueError(f"{name} has duplicate column name(s) {', '.join(map(repr, dup))}: "
                         "which one holds the values is ambiguous; rename or drop the copies")


def request_table(table: Any, name: str = "workload", *, on_bad: str = "raise",
                  max_tokens: int = MAX_TRACE_TOKENS) -> Any:
    """The request table ``table`` checked against kvlab's trace contract.

    The contract: a DataFrame without duplicate column names and with at least one row;
    ``prompt_tokens`` and ``output_tokens`` integers in [1, ``max_tokens``] (returned as
    ``int64``); ``arrival_s``, when present, finite seconds >= 0 (returned as ``float64``; a
    datetime column becomes seconds since its earliest entry, a timedelta column its seconds);
    ``censored``, when present, booleans. Other columns are kept.

    Parameters
    ----------
    table : DataFrame
    name : str
        What the table is called in error messages (the parameter name).
    on_bad : {"raise", "drop"}
        Raise ``ValueError`` naming the first breaking row, its column, value and what was
        expected; or drop every breaking row and add their count to ``attrs["dropped_rows"]``.
    max_tokens : int
        The stated maximum of a length (tokens), :data:`MAX_TRACE_TOKENS` by default.
    """
    import pandas as pd

    on_bad = choice(on_bad, "on_bad", ("raise", "drop"))
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"{name} must be a pandas DataFrame, got {type(table).__name__}")
    no_duplicate_columns(table, name)
    require_columns(table, ("prompt_tokens", "output_tokens"), name)
    if len(table) == 0:
        raise ValueError(f"{name} is empty: it needs at least one request")
    checks = []  # (column, values, bad mask, expected)
    for col in ("prompt_tokens", "output_tokens"):
        vals, bad = token_counts(table[col], maximum=max_tokens)
        checks.append((col, vals, bad, f"an integer token count in [1, {max_tokens:,}]"))
    if "arrival_s" in table.columns:
        t, bad = seconds(table["arrival_s"])
        with np.errstate(invalid="ignore"):
            bad |= t < 0
        checks.append(("arrival_s", t, bad, "finite seconds >= 0"))
    if "censored" in table.columns:
        flags, bad = booleans(table["censored"])
        checks.append(("censored", flags, bad, "a boolean"))
    bad_any = np.zeros(len(table), dtype=bool)
    for _, _, bad, _ in checks:
        bad_any |= bad
    if bad_any.any() and on_bad == "raise":
        i = int(np.flatnonzero(bad_any)[0])
        col, _, _, expected = next(c for c in checks if c[2][i])
        value = table[col].iloc[i]
        value = value.item() if isinstance(value, np.generic) else value
        raise ValueError(f"{name}: row {table.index[i]!r}: {col}={value!r}, expected {expected}")
    keep = ~bad_any
    if not keep.any():
        raise ValueError(f"{name}: every one of its {len(table)} rows breaks the trace contract")
    dropped = int(bad_any.sum())
    if not dropped and all(table[col].dtype == vals.dtype for col, vals, _, _ in checks):
        return table  # already in the contract's types: no copy
    out = table.loc[keep].copy() if dropped else table.copy()
    for col, vals, _, _ in checks:
        out[col] = vals[keep]
    out.attrs = dict(table.attrs)
    if dropped:
        out.attrs["dropped_rows"] = int(table.attrs.get("dropped_rows", 0) or 0) + dropped
    return out


def warn_if_few_requests(num_requests: int, name: str, what: str, *, stacklevel: int = 3) -> None:
    """Warn (:class:`FewRequestsWarning`) when ``num_requests`` is below :data:`FEW_REQUESTS`:
    ``what`` rests on too few values."""
    if num_requests < FEW_REQUESTS:
        warnings.warn(f"{name} holds only {num_requests} request(s): {what} rests on too few values to be "
                      f"trusted (a percentile needs at least {FEW_REQUESTS})", FewRequestsWarning,
                      stacklevel=stacklevel)


def percentiles(values: Any, name: str = "percentiles") -> list[float]:
    """Percentiles on the 0-100 scale, as floats in (0, 100).

    A value in (0, 1) is refused rather than guessed at: 0.95 could mean the 95th percentile or
    the 0.95th, so the message asks for the 0-100 scale (95). The fraction-scale twin of this
    parameter elsewhere in kvlab is called ``quantile``/``*_frac``.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        if isinstance(values, numbers.Real) and not _is_bool(values):
            values = [values]
        else:
            raise ValueError(f"{name} must be a sequence of percentiles in (0, 100), got {values!r}")
    out = []
    for i, p in enumerate(values):
        if _is_bool(p) or not isinstance(p, numbers.Real) or not np.isfinite(p) or not 0 < p < 100:
            raise ValueError(f"{name} must hold percentiles in (0, 100); element {i} is {p!r}")
        if p < 1:
            raise ValueError(f"{name}: element {i} is {p!r}; percentiles are on the 0-100 scale "
                             f"(write {p * 100:g} for the {p * 100:g}th percentile)")
        out.append(float(p))
    if not out:
        raise ValueError(f"{name} must name at least one percentile")
    return out


def read_text_file(path: Any, what: str, *, max_bytes: int = 1 << 28) -> str:
    """A text file the user names (a config, parameter, profile or scrape file) as ``str``.

    Gzip-compressed or not (recognised by its first bytes); UTF-8 with or without a byte-order
    mark, or UTF-16/32 with one. Anything else (zero bytes in the text: UTF-16 without a mark or
    a binary file), a file over ``max_bytes`` (256 MiB; decompressed), a folder, a missing or
    unreadable file is a ``ValueError`` naming ``what`` and the file.
    """
    import codecs
    import os
    import zlib

    try:
        if os.path.isdir(path):
            raise ValueError(f"{what} {path} is a directory, not a file")
        chunks, size = [], 0
        with open(path, "rb") as fh:  # in chunks: read(max_bytes + 1) would allocate max_bytes at once
            while size <= max_bytes and (chunk := fh.read(1 << 20)):
                chunks.append(chunk)
                size += len(chunk)
        data = b"".join(chunks)
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if data.startswith(b"\x1f\x8b"):  # gzip: inflate at most max_bytes + 1
        try:
            inflater = zlib.decompressobj(wbits=31)
            data = inflater.decompress(data, max_bytes + 1)
        except zlib.error as exc:
            raise ValueError(f"{what} {path} is a damaged gzip file ({exc})") from None
        if not inflater.eof and len(data) <= max_bytes:
            raise ValueError(f"{what} {path} is a truncated gzip file")
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} holds more than {max_bytes:,} bytes: too large for a {what}")
    boms = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
            (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
    enc = next((name for bom, name in boms if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(enc)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path} is not {enc.upper()} text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8") from None
    if "\x00" in text:
        raise ValueError(f"{what} {path} holds zero bytes: UTF-16 without a byte-order mark, or not a text file; "
                         "save it as UTF-8")
    return text


#: Limits on YAML a user gives (parameter and profile files, ``-p`` values): the values it may
#: expand to (an alias repeats a node without copying it, so 1 kB of aliases can stand for 10**9
#: values) and how deeply lists and mappings may nest (deeper raises RecursionError in the parser).
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 50
_YAML_PLAIN = (str, int, float, bool, type(None))
_yaml_loader = None


def _loader() -> Any:
    """PyYAML's safe loader without the timestamp rule (``2024-01-01`` stays a string)."""
    global _yaml_loader
    if _yaml_loader is None:
        import yaml

        class Loader(yaml.SafeLoader):
            pass
        Loader.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        _yaml_loader = Loader
    return _yaml_loader


def _plain_data(value: Any, where: str, path: str, budget: list[int], depth: int) -> Any:
    at = f"{where} (at {path})" if path else where
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"{at} holds more than {MAX_YAML_VALUES:,} values (YAML aliases expanded)")
    if depth > MAX_YAML_DEPTH:
        raise ValueError(f"{at} nests lists or mappings more than {MAX_YAML_DEPTH} deep")
    if isinstance(value, _YAML_PLAIN):
        return value
    if isinstance(value, list):
        return [_plain_data(x, where, f"{path}[{i}]", budget, depth + 1) for i, x in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _plain_data(x, where, f"{path}.{str(k)[:40]}" if path else str(k)[:40], budget, depth + 1)
                for k, x in value.items()}
    raise ValueError(f"{at} is a YAML {type(value).__name__}; it must be a string, number, boolean, null, list "
                     "or mapping")


def yaml_data(text: str, where: str, *, invalid_as_text: bool = False) -> Any:
    """YAML ``text`` as plain data: strings, numbers, booleans, null, lists and mappings with
    string keys (timestamps stay strings), within :data:`MAX_YAML_VALUES` and :data:`MAX_YAML_DEPTH`.

    ``ValueError`` naming ``where`` for text that is not YAML (or, with ``invalid_as_text``, the
    text itself returned), nests too deeply, expands past the limit or holds other types.
    """
    import yaml

    try:
        data = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as exc:
        if invalid_as_text:
            return text
        raise ValueError(f"{where} is not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise ValueError(f"{where} nests lists or mappings more than {MAX_YAML_DEPTH} deep") from None
    return _plain_data(data, where, "", [MAX_YAML_VALUES], 0)


def output_file(output: Any, *, inputs: Iterable[Any] = (), force: bool = False, flag: str = "-o") -> Any:
    """``output`` as a ``Path`` a command may write, or ``ValueError`` naming ``flag``.

    An output never overwrites one of ``inputs`` (not even with ``force``), is not a folder, and
    overwrites any other existing file only with ``force``.
    """
    import os
    from pathlib import Path

    out = Path(output)
    for src in inputs:
        src_path = Path(src)
        same = out.exists() and src_path.exists() and os.path.samefile(out, src_path)
        if same or out.resolve() == src_path.resolve():
            raise ValueError(f"{flag} {output} is the input {src}: kvlab never overwrites an input")
    if out.is_dir():
        raise ValueError(f"{flag} {output} is a directory; give a file name")
    if out.exists() and not force:
        raise ValueError(f"{flag} {output} already exists; pass --force to overwrite it")
    return out


def write_text_atomically(path: Any, text: str) -> Any:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed into place (never half-written)."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
