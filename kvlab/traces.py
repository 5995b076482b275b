"""Load request logs into one table of prompt and output lengths.

Every loader returns a table satisfying the trace contract (:func:`kvlab._validate.request_table`,
enforced at the end of every loader and at the public entries that take a DataFrame): int64
``prompt_tokens`` and ``output_tokens`` in [1, ``MAX_TRACE_TOKENS``] (10M tokens), float64
``arrival_s`` (finite seconds from the first request, >= 0; only when the source has times;
datetime and timedelta columns are converted, never read as nanoseconds) and bool ``censored``
(the output hit its cap, so its true length is at least ``output_tokens``); no duplicate columns.
``df.attrs`` carries load notes: ``source``, ``format``, ``dropped_rows``, ``failed_requests``,
``detected_cap_tokens`` and ``notes`` (a list of sentences).

Formats (each reader's docstring gives its layout; a vLLM ``/metrics`` scrape is read by
:func:`kvlab.prometheus.from_prometheus`), detected from their columns or chosen by name:

=============  =================================================================
``azure``      Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens
``burstgpt``   BurstGPT CSV: Timestamp, Model, Request tokens, Response tokens, ...
``mooncake``   Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (kept as a
               ``hash_ids`` column of lists, for prefix caching: :mod:`kvlab.prefix_blocks`)
``simulator``  Vidur / Sarathi-Serve length table CSV: num_prefill_tokens, num_decode_tokens
               [, arrived_at (s)]
``vllm-bench`` vLLM benchmark_serving.py result JSON: input_lens, output_lens lists
``generic``    CSV / JSONL / Parquet with a ``columns=`` mapping (or already in kvlab's names)
=============  =================================================================

Bad rows (missing, non-numeric, NaN, non-integer, zero, negative or too-large lengths,
unparsable times or JSON lines) raise ``ValueError`` naming the file and the first bad row, or
with ``on_bad="drop"`` are dropped and counted in ``attrs["dropped_rows"]``.

Files are read whatever their compression (gzip, bz2, xz, and zstd when ``zstandard`` is
installed; recognised by their first bytes, not their name) and text encoding (UTF-8 with or
without a byte-order mark, UTF-16 and UTF-32); anything else is a ``ValueError`` naming the file
and the encoding it looks like. :func:`load` raises nothing but ``ValueError`` naming the file.
A trace of fewer than 20 requests loads with a :class:`kvlab._validate.FewRequestsWarning`.
"""
from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import io
import json
import lzma
import warnings
from pathlib import Path
from typing import IO, Any, Iterable, Mapping

import numpy as np
import pandas as pd

from . import _validate as v
from .prefix_blocks import HASH_IDS, MOONCAKE_HASH_BLOCK_TOKENS

FORMATS = ("auto", "azure", "burstgpt", "mooncake", "simulator", "vllm-bench", "generic")
ON_BAD = ("raise", "drop")

#: Columns that identify each format, and which source column feeds which output column.
_SIGNATURES: dict[str, dict[str, str]] = {
    "azure": {"prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens", "time": "TIMESTAMP"},
    "burstgpt": {"prompt_tokens": "Request tokens", "output_tokens": "Response tokens", "time": "Timestamp"},
    "mooncake": {"prompt_tokens": "input_length", "output_tokens": "output_length", "time": "timestamp"},
    "simulator": {"prompt_tokens": "num_prefill_tokens", "output_tokens": "num_decode_tokens"},
    "vllm-bench": {"prompt_tokens": "input_lens", "output_tokens": "output_lens"},
}
_CANONICAL = {"prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"}

#: Pile-up detection: the count at the maximum output must be at least this many requests ...
CAP_MIN_COUNT = 5
#: ... and this many times the count expected there from the density just below the maximum.
CAP_EXCESS_FACTOR = 20.0


# ----------------------------------------------------------------------------------- reading
#: Leading bytes of the compressed and binary containers a trace may come in.
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"),
          (b"PK\x03\x04", "zip"), (b"PAR1", "parquet"))
_COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".bz2", ".xz")
_HEAD_BYTES = 1 << 16


def _container(path: Path) -> str | None:
    """The compression or binary container named by the file's leading bytes, if any."""
    with path.open("rb") as fh:
        head = fh.read(8)
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def _open_binary(path: Path, compression: str | None) -> IO[bytes]:
    if compression is None:
        return path.open("rb")
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "bz2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    if compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ValueError(f"{path}: the file is zstd-compressed and the 'zstandard' package is not installed; "
                             f"decompress it (zstd -d) or pip install zstandard") from None
        return zstandard.open(path, "rb")
    raise ValueError(f"{path}: the file is a {compression} archive, not a trace; extract the trace from it first")


def _guess_8bit(data: bytes) -> str:
    high = [b for b in data if b >= 0x80]
    return "Windows-1252" if any(0x80 <= b < 0xA0 for b in high) else "Latin-1 (ISO-8859-1)"


def _encoding(path: Path, head: bytes) -> str:
    """The text encoding of a file from its first bytes: UTF-8 (with or without a byte-order
    mark) or UTF-16/32 (with a byte-order mark, or UTF-16 by its zero bytes); anything else is a
    ``ValueError`` naming the file and the encoding it looks like."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    if head.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    sample = head[:4096]
    if b"\x00" in sample:
        even, odd = sample[0::2].count(0), sample[1::2].count(0)
        half = len(sample) // 2
        if odd > 0.3 * half and even < 0.05 * half:
            return "utf-16-le"
        if even > 0.3 * half and odd < 0.05 * half:
            return "utf-16-be"
        raise ValueError(f"{path}: holds zero bytes at no UTF-16 pattern: a binary file, not a text trace")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{head[exc.start]:02x} at offset {exc.start}); it looks "
                         f"like {_guess_8bit(head)}: save it as UTF-8") from None
    return "utf-8-sig"  # strips a byte-order mark if one is there, reads plain UTF-8 otherwise


def _text(path: Path, compression: str | None) -> tuple[IO[str], str]:
    """The file as a text stream (decompressed, decoded) and the encoding it was read with."""
    with _open_binary(path, compression) as fh:
        head = fh.read(_HEAD_BYTES)
    enc = _encoding(path, head)
    return io.TextIOWrapper(_open_binary(path, compression), encoding=enc, newline=""), enc


def _json_record(line: str) -> dict:
    rec = json.loads(line)  # nesting too deep for the parser is a RecursionError, caught by the caller
    if not isinstance(rec, dict):
        raise ValueError("not an object")
    return rec


def _read_jsonl(path: Path, compression: str | None, on_bad: str) -> tuple[pd.DataFrame, int]:
    """Rows of a JSON-lines file; returns the table and the number of unparsable lines dropped."""
    fh, _ = _text(path, compression)
    with fh:
        try:
            return pd.read_json(fh, lines=True, dtype=False), 0
        except (ValueError, RecursionError):
            pass  # locate the bad line below
    records, dropped = [], 0
    fh, _ = _text(path, compression)
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = _json_record(line)
            except (ValueError, RecursionError) as exc:
                exc = "nested too deeply" if isinstance(exc, RecursionError) else exc
                if on_bad == "raise":
                    raise ValueError(f"{path}: line {lineno} is not a JSON object ({exc}; truncated or corrupt?): "
                                     f"{line.strip()[:80]!r}") from None
                dropped += 1
                continue
            records.append(rec)
    return pd.DataFrame.from_records(records), dropped


def _read_csv(path: Path, compression: str | None) -> pd.DataFrame:
    fh, enc = _text(path, compression)
    with fh:
        header = next(csv.reader([fh.readline()], skipinitialspace=True), [])
        names = [h.strip() for h in header]
        dup = sorted({h for h in names if names.count(h) > 1})
        if dup:
            raise ValueError(f"{path}: duplicate column name(s) {', '.join(map(repr, dup))} in the header: "
                             "which one holds the values is ambiguous")
    source: Any = path if compression is None else _open_binary(path, compression)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)  # mixed columns: the contract checks them
            return pd.read_csv(source, skipinitialspace=True, encoding=enc, encoding_errors="strict")
    finally:
        if source is not path:
            source.close()


def _read_table(path: Path, on_bad: str) -> tuple[pd.DataFrame, int, str]:
    """The file as a DataFrame, the unparsable lines dropped, and the row-label style."""
    if not path.exists():
        raise ValueError(f"trace file {path} does not exist")
    if path.is_dir():
        raise ValueError(f"trace file {path} is a directory, not a file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise ValueError(f"trace file {path} is not a regular file")
    if path.stat().st_size == 0:
        raise ValueError(f"trace file {path} is empty")
    container = _container(path)
    compression = container if container not in (None, "parquet") else None
    name = path.name.lower()
    for ext in _COMPRESSED_SUFFIXES:
        if name.endswith(ext):
            if compression is None and container != "parquet":
                raise ValueError(f"{path}: named {ext} but not compressed that way (its first bytes say "
                                 f"{container or 'plain data'})")
            name = name[: -len(ext)]
    suffix = Path(name).suffix
    if container == "parquet" or suffix == ".parquet":
        if container != "parquet":
            raise ValueError(f"{path}: not a Parquet file (no PAR1 header)")
        raw = pd.read_parquet(path)
        v.no_duplicate_columns(raw, str(path))
        return raw, 0, "index"
    if suffix == ".json":
        fh, _ = _text(path, compression)
        with fh:
            text = fh.read()
        try:
            obj = json.loads(text)
        except RecursionError:
            raise ValueError(f"{path}: JSON nested too deeply to be a trace") from None
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict) or not all(k in obj for k in ("input_lens", "output_lens")):
            raise ValueError(f"{path}: a .json trace must be a vLLM benchmark result with "
                             f"'input_lens' and 'output_lens' lists")
        ins, outs = obj["input_lens"], obj["output_lens"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError(f"{path}: 'input_lens' and 'output_lens' must be lists of equal length")
        return pd.DataFrame({"input_lens": ins, "output_lens": outs}, dtype=object), 0, "index"
    if suffix in (".jsonl", ".ndjson"):
        df, dropped = _read_jsonl(path, compression, on_bad)
        return df, dropped, "line1"
    if suffix in (".csv", ".txt"):
        try:
            return _read_csv(path, compression), 0, "line2"
        except pd.errors.EmptyDataError:
            raise ValueError(f"trace file {path} is empty") from None
        except pd.errors.ParserError as exc:
            raise ValueError(f"{path}: not a well-formed CSV ({' '.join(str(exc).split())})") from None
    raise ValueError(f"{path}: unknown file type {suffix!r}; expected .csv, .jsonl, .json or .parquet "
                     f"(optionally compressed: {', '.join(_COMPRESSED_SUFFIXES)})")


def _detect(columns: Iterable[str], path: Path) -> str:
    cols = set(columns)
    matches = [fmt for fmt, sig in _SIGNATURES.items() if {sig["prompt_tokens"], sig["output_tokens"]} <= cols]
    if set(_CANONICAL) <= cols:
        matches.append("generic")
    if len(matches) > 1:  # which pair of columns holds the lengths is the user's call, not the first match's
        both = "; ".join(f"{f}: {_SIGNATURES[f]['prompt_tokens']!r}, {_SIGNATURES[f]['output_tokens']!r}" if f != "generic"
                         else "generic: 'prompt_tokens', 'output_tokens'" for f in matches)
        raise ValueError(f"{path}: the columns fit more than one trace format ({both}); pass format= "
                         f"(--format on the command line) to say which one the lengths are in")
    if matches:
        return matches[0]
    known = "; ".join(f"{f}: {sig['prompt_tokens']!r}, {sig['output_tokens']!r}" for f, sig in _SIGNATURES.items())
    raise ValueError(f"{path}: cannot tell the trace format from columns {sorted(cols)}; known formats "
                     f"need ({known}); or pass format='generic' with columns={{'prompt_tokens': ..., "
                     f"'output_tokens': ...}}")


# ------------------------------------------------------------------------------- validation
def _row_label(i: int, style: str) -> str:
    if style == "line2":
        return f"row {i + 1} (line {i + 2})"
    if style == "line1":
        return f"row {i + 1} (line {i + 1})"
    return f"row {i + 1} (index {i})"


_LENGTH = f"an integer token count in [1, {v.MAX_TRACE_TOKENS:,}]"


def _first_bad(path: Path, style: str, i: int, column: str, value: Any, expected: str) -> ValueError:
    if isinstance(value, np.generic):
        value = value.item()
    return ValueError(f"{path}: {_row_label(i, style)}: {column}={value!r}, expected {expected} "
                      f"(pass on_bad='drop' to drop such rows)")


def _detect_cap(output: np.ndarray) -> int | None:
    """The maximum output if requests pile up there (a generation cap), else None.

    A smooth length distribution puts about as many requests on its maximum value as the density
    just below it predicts (usually 1). Flag a cap when the count at the maximum is at least
    ``CAP_MIN_COUNT`` and ``CAP_EXCESS_FACTOR`` times the average count per token value over the
    10% of the range below the maximum.
    """
    top = int(output.max())
    at_top = int(np.count_nonzero(output == top))
    width = max(1, top // 10)
    below = np.count_nonzero((output >= top - width) & (output < top))
    expected = below / width
    if at_top >= CAP_MIN_COUNT and at_top >= CAP_EXCESS_FACTOR * max(expected, 0.05):
        return top
    return None


def _finish(path: Path | str, fmt: str, prompt_raw: pd.Series, output_raw: pd.Series, *,
            arrival_s: np.ndarray | None, censored: np.ndarray | None, style: str, on_bad: str,
            censored_raw: pd.Series | None = None,
            time_raw: pd.Series | None = None,
            names: tuple[str, str], max_new_tokens: int | None, dropped: int = 0,
            failed: int = 0, notes: list[str] | None = None,
            carry: Mapping[str, pd.Series] | None = None) -> pd.DataFrame:
    """Validate lengths and times, apply ``on_bad``, mark censoring, build the table (with the
    ``carry`` columns kept as they are, row for row)."""
    notes = list(notes or [])
    p, bad_p = v.token_counts(prompt_raw)
    o, bad_o = v.token_counts(output_raw)
    bad_t = np.zeros(p.size, dtype=bool) if arrival_s is None else ~np.isfinite(arrival_s)
    bad_c = np.zeros(p.size, dtype=bool)
    if censored_raw is not None:
        censored, bad_c = v.booleans(censored_raw)
    bad = bad_p | bad_o | bad_t | bad_c
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        if on_bad == "raise":
            if bad_p[i]:
                raise _first_bad(path, style, i, names[0], prompt_raw.iloc[i], _LENGTH)
            if bad_o[i]:
                raise _first_bad(path, style, i, names[1], output_raw.iloc[i], _LENGTH)
            if bad_c[i]:
                raise _first_bad(path, style, i, str(censored_raw.name), censored_raw.iloc[i], "a boolean")
            value = None if time_raw is None else time_raw.iloc[i]
            name = "time" if time_raw is None else str(time_raw.name)
            raise _first_bad(path, style, i, name, value, "a valid timestamp")
        dropped += int(bad.sum())
    keep = ~bad
    if not keep.any():
        raise ValueError(f"{path}: no valid rows left (dropped {dropped})")
    if dropped:
        notes.append(f"dropped {dropped} bad row(s)")
    out = o[keep].astype(np.int64)
    table = {"prompt_tokens": p[keep].astype(np.int64), "output_tokens": out}
    for name, col in (carry or {}).items():
        table[name] = col.to_numpy()[keep]
    cens = np.zeros(out.size, dtype=bool) if censored is None else censored[keep].astype(bool)
    if arrival_s is not None:
        t = arrival_s[keep]
        table["arrival_s"] = t - t.min()
        if (np.diff(t) < 0).any():  # rows in arrival order, ties in file order: every window is a span of time
            order = np.argsort(t, kind="stable")
            table = {name: col[order] for name, col in table.items()}
            out, cens = out[order], cens[order]
            notes.append(f"rows were not in arrival order: sorted by arrival time ({int((np.diff(t) < 0).sum()):,} "
                         "out of order; ties keep the file's order)")
    detected = None
    if max_new_tokens is not None:
        over = np.flatnonzero(out > max_new_tokens)
        if over.size:
            raise ValueError(f"{path}: {over.size} output(s) exceed max_new_tokens={max_new_tokens} "
                             f"(first: {int(out[over[0]])} tokens), so it cannot be this trace's cap")
        cens |= out >= max_new_tokens
    else:
        detected = _detect_cap(out)
        if detected is not None:
            n_top = int(np.count_nonzero(out == detected))
            cens |= out == detected
            notes.append(f"{n_top} requests pile up at the maximum output {detected} tokens: treated as "
                         f"a generation cap and marked censored (pass max_new_tokens to set it explicitly)")
    table["censored"] = cens
    df = pd.DataFrame(table)
    df.attrs.update({"source": str(path), "format": fmt, "dropped_rows": dropped, "failed_requests": failed,
                     "detected_cap_tokens": detected, "notes": notes})
    if len(df) < v.FEW_REQUESTS:
        notes.append(f"only {len(df)} request(s): too few for percentiles")
        v.warn_if_few_requests(len(df), f"trace {path}", "any percentile or recommendation from it", stacklevel=5)
    return v.request_table(df, str(path))  # the one trace contract, enforced on every loader's result


# -------------------------------------------------------------------------------- loaders
def _require(df: pd.DataFrame, cols: Iterable[str], path: Path, fmt: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: format {fmt!r} needs columns {missing}, found {list(df.columns)}")


_TZ = r"(?:Z|[+-]\d\d:?\d\d)\s*$"


def _timestamps_s(raw: pd.Series, path: Path, style: str, notes: list[str]) -> np.ndarray:
    """ISO 8601 timestamps as seconds since the earliest; NaN where unparsable.

    Timestamps that all carry a time zone are compared in UTC, whatever their offsets. Some with
    a time zone and some without cannot be put on one clock: ``ValueError`` naming the first row
    that differs from the first row.
    """
    try:  # one clock (all naive, or all at one offset): pandas parses it as is
        return v.seconds(pd.to_datetime(raw, format="ISO8601", errors="coerce"))[0]
    except (ValueError, TypeError):
        pass  # mixed offsets, or time zones on some rows only: find out which below
    text = raw.astype("string")
    aware = text.str.contains(_TZ, regex=True).fillna(False).to_numpy(dtype=bool)
    if aware.any() and not aware.all():
        i = int(np.flatnonzero(aware != aware[0])[0])
        raise ValueError(f"{path}: {_row_label(i, style)}: {raw.name}={raw.iloc[i]!r} has "
                         f"{'a' if aware[i] else 'no'} time zone but row 1 ({raw.iloc[0]!r}) has "
                         f"{'one' if aware[0] else 'none'}: give every timestamp a time zone, or none")
    stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=bool(aware.any()))
    if aware.any() and text.str.extract(f"({_TZ})", expand=False).nunique() > 1:
        notes.append("timestamps carry different time-zone offsets: compared in UTC")
    return v.seconds(stamps)[0]


def load(path: str | Path, format: str = "auto", *, columns: Mapping[str, str] | None = None,
         model: str | None = None, max_new_tokens: int | None = None, on_bad: str = "raise") -> pd.DataFrame:
    """Load a request trace as kvlab's length table.

    Parameters
    ----------
    path : str or Path
        A .csv, .jsonl, .json (vLLM benchmark result) or .parquet file.
    format : str
        One of :data:`FORMATS`; ``"auto"`` detects it from the columns.
    columns : mapping, optional
        For ``generic``: kvlab column -> source column, for ``prompt_tokens``, ``output_tokens``
        and optionally ``arrival_s`` (seconds) and ``censored`` (bool).
    model : str, optional
        BurstGPT only: keep requests to this model (``Model`` column).
    max_new_tokens : int, optional
        The generation cap the trace was recorded with (tokens): outputs at it are marked
        censored. Without it, a pile-up of requests at the maximum output is detected, marked
        censored and reported in ``attrs["notes"]``.
    on_bad : {"raise", "drop"}
        Raise on the first bad row (naming file and row), or drop bad rows and count them.

    Returns
    -------
    DataFrame
        ``prompt_tokens``, ``output_tokens`` (int64), ``arrival_s`` (float64 s, when the source
        has times), ``censored`` (bool); ``attrs`` as in the module docstring.
    """
    if not isinstance(path, (str, Path)) and not hasattr(path, "__fspath__"):
        raise ValueError(f"path must be a file path (str or Path), got {type(path).__name__}")
    path = Path(path)
    v.choice(format, "format", FORMATS)
    v.choice(on_bad, "on_bad", ON_BAD)
    if max_new_tokens is not None:
        max_new_tokens = v.positive_int(max_new_tokens, "max_new_tokens", maximum=v.MAX_TRACE_TOKENS)
    if columns is not None and (not isinstance(columns, Mapping)
                                or not all(isinstance(k, str) and isinstance(c, str) for k, c in columns.items())):
        raise ValueError(f"columns must be a mapping of kvlab column name to source column name (str to str), "
                         f"got {columns!r}")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a str (a BurstGPT Model value), got {type(model).__name__}")
    try:
        return _load(path, format, columns=columns, model=model, max_new_tokens=max_new_tokens, on_bad=on_bad)
    except ValueError as exc:
        if str(path) in str(exc):
            raise
        raise ValueError(f"{path}: {exc}") from None
    except Exception as exc:  # the file decides what a reader meets: every failure names it
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else " ".join(str(exc).split())
        raise ValueError(f"{path}: cannot be read as a trace ({type(exc).__name__}: {reason[:300]})") from exc


def _load(path: Path, format: str, *, columns: Mapping[str, str] | None, model: str | None,
          max_new_tokens: int | None, on_bad: str) -> pd.DataFrame:
    raw, dropped, style = _read_table(path, on_bad)
    if raw.empty:
        raise ValueError(f"trace file {path} has no data rows" + (f" (dropped {dropped} bad line(s))" if dropped else ""))
    if columns is not None and format not in ("auto", "generic"):
        raise ValueError(f"columns= applies to format 'generic' only, not {format!r}")
    if format != "auto":
        fmt = format
    else:
        fmt = "generic" if columns is not None else _detect(raw.columns, path)
    common = dict(style=style, on_bad=on_bad, max_new_tokens=max_new_tokens, dropped=dropped)
    if model is not None and fmt != "burstgpt":
        raise ValueError(f"model= filters BurstGPT traces only; {path} is format {fmt!r}")
    if fmt == "generic":
        if columns is None:  # already kvlab's names (a table kvlab wrote)
            columns = {c: c for c in ("prompt_tokens", "output_tokens", "arrival_s", "censored")
                       if c in raw.columns}
        mapping = dict(columns)
        unknown = set(mapping) - {"prompt_tokens", "output_tokens", "arrival_s", "censored"}
        if unknown or not {"prompt_tokens", "output_tokens"} <= set(mapping):
            raise ValueError(f"columns must map 'prompt_tokens' and 'output_tokens' (and optionally "
                             f"'arrival_s', 'censored') to source columns, got {dict(mapping)!r}")
        _require(raw, mapping.values(), path, fmt)
        time_raw = raw[mapping["arrival_s"]] if "arrival_s" in mapping else None
        arrival = None if time_raw is None else v.seconds(time_raw)[0]
        return _finish(path, fmt, raw[mapping["prompt_tokens"]], raw[mapping["output_tokens"]],
                       arrival_s=arrival, censored=None,
                       censored_raw=raw[mapping["censored"]] if "censored" in mapping else None,
                       time_raw=time_raw, names=(mapping["prompt_tokens"], mapping["output_tokens"]), **common)
    sig = _SIGNATURES[fmt]
    _require(raw, [c for k, c in sig.items()], path, fmt)
    names = (sig["prompt_tokens"], sig["output_tokens"])
    notes: list[str] = []
    failed = 0
    if fmt == "burstgpt":
        if model is not None:
            models = sorted(map(str, raw["Model"].dropna().unique())) if "Model" in raw else []
            if model not in models:
                raise ValueError(f"{path}: model {model!r} not in the trace; it holds {models}")
            raw = raw[raw["Model"] == model].reset_index(drop=True)
            notes.append(f"kept model {model!r}: {len(raw)} requests")
        # BurstGPT logs failed requests with zero response tokens: not a length, excluded.
        failed_mask = v.real_values(raw[sig["output_tokens"]]) == 0
        failed = int(failed_mask.sum())
        if failed:
            raw = raw[~failed_mask].reset_index(drop=True)
            notes.append(f"excluded {failed} failed request(s) (Response tokens = 0)")
    if fmt == "azure":
        arrival = _timestamps_s(raw[sig["time"]], path, style, notes)
    elif fmt == "burstgpt":
        arrival = v.seconds(raw[sig["time"]])[0]
    elif fmt == "mooncake":
        arrival = v.seconds(raw[sig["time"]], scale=1e-3)[0]
    elif fmt == "simulator" and "arrived_at" in raw.columns:
        arrival = v.seconds(raw["arrived_at"])[0]
    else:
        arrival = None
    time_raw = raw[sig["time"]] if "time" in sig else raw.get("arrived_at")
    carry = {}
    if fmt == "mooncake" and HASH_IDS in raw.columns:  # block identities for the prefix cache (kvlab.prefix_blocks)
        carry[HASH_IDS] = raw[HASH_IDS]
        notes.append(f"hash_ids kept: {MOONCAKE_HASH_BLOCK_TOKENS}-token block identities for prefix caching")
    return _finish(path, fmt, raw[names[0]], raw[names[1]], arrival_s=arrival, censored=None,
                   time_raw=time_raw, names=names, failed=failed, notes=notes, carry=carry, **common)


def from_vllm_outputs(outputs: Iterable[Any]) -> pd.DataFrame:
    """The length table of a list of vLLM ``RequestOutput`` objects (duck-typed).

    Prompt length is ``len(r.prompt_token_ids)``, output length ``len(r.outputs[0].token_ids)``,
    and an output is censored when ``r.outputs[0].finish_reason == "length"``. ``arrival_s`` is
    added when every request carries ``r.metrics.arrival_time`` (seconds).
    """
    prompt, output, cens, arrival = [], [], [], []
    for i, r in enumerate(outputs):
        try:
            first = r.outputs[0]
            prompt.append(len(r.prompt_token_ids))
            output.append(len(first.token_ids))
            cens.append(getattr(first, "finish_reason", None) == "length")
        except (AttributeError, IndexError, TypeError):
            raise ValueError(f"outputs[{i}] is not a vLLM RequestOutput: needs prompt_token_ids and "
                             f"outputs[0].token_ids") from None
        arrival.append(getattr(getattr(r, "metrics", None), "arrival_time", None))
    if not prompt:
        raise ValueError("outputs is empty")
    times = None
    if all(isinstance(t, (int, float)) for t in arrival):
        times = np.asarray(arrival, dtype=np.float64)
    return _finish("vllm outputs", "vllm-outputs", pd.Series(prompt), pd.Series(output), arrival_s=times,
                   censored=np.asarray(cens), style="index", on_bad="raise",
                   names=("prompt_token_ids", "outputs[0].token_ids"), max_new_tokens=None)
