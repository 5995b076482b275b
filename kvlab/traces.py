"""Load request logs into one table of prompt and output lengths.

Every loader returns a DataFrame with int64 ``prompt_tokens`` and ``output_tokens`` (>= 1),
float64 ``arrival_s`` (seconds from the first request; only when the source has times) and bool
``censored`` (the output hit its cap, so its true length is at least ``output_tokens``).
``df.attrs`` carries load notes: ``source``, ``format``, ``dropped_rows``, ``failed_requests``,
``detected_cap_tokens`` and ``notes`` (a list of sentences).

Formats (layouts in ``docs/trace_formats.md``), detected from their columns or chosen by name:

=============  =================================================================
``azure``      Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens
``burstgpt``   BurstGPT CSV: Timestamp, Model, Request tokens, Response tokens, ...
``mooncake``   Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids
``simulator``  Vidur / Sarathi-Serve length table CSV: num_prefill_tokens, num_decode_tokens
               [, arrived_at (s)]
``vllm-bench`` vLLM benchmark_serving.py result JSON: input_lens, output_lens lists
``generic``    CSV / JSONL / Parquet with a ``columns=`` mapping (or already in kvlab's names)
=============  =================================================================

Bad rows (missing, non-numeric, NaN, non-integer, zero or negative lengths, unparsable times or
JSON lines) raise ``ValueError`` naming the file and the first bad row, or with ``on_bad="drop"``
are dropped and counted in ``attrs["dropped_rows"]``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from . import _validate as v

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
def _read_jsonl(path: Path, on_bad: str) -> tuple[pd.DataFrame, int]:
    """Rows of a JSON-lines file; returns the table and the number of unparsable lines dropped."""
    try:
        return pd.read_json(path, lines=True, dtype=False), 0
    except ValueError:
        pass  # locate the bad line below
    records, dropped = [], 0
    with path.open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not an object")
            except ValueError:
                if on_bad == "raise":
                    raise ValueError(f"{path}: line {lineno} is not a JSON object (truncated or corrupt): "
                                     f"{line.strip()[:80]!r}") from None
                dropped += 1
                continue
            records.append(rec)
    return pd.DataFrame.from_records(records), dropped


def _read_table(path: Path, on_bad: str) -> tuple[pd.DataFrame, int, str]:
    """The file as a DataFrame, the unparsable lines dropped, and the row-label style."""
    if not path.exists():
        raise ValueError(f"trace file {path} does not exist")
    if path.stat().st_size == 0:
        raise ValueError(f"trace file {path} is empty")
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            obj = json.loads(path.read_text())
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
        df, dropped = _read_jsonl(path, on_bad)
        return df, dropped, "line1"
    if suffix == ".parquet":
        return pd.read_parquet(path), 0, "index"
    if suffix in (".csv", ".txt"):
        try:
            return pd.read_csv(path, skipinitialspace=True), 0, "line2"
        except pd.errors.EmptyDataError:
            raise ValueError(f"trace file {path} is empty") from None
        except pd.errors.ParserError as exc:
            raise ValueError(f"{path}: not a well-formed CSV ({exc})") from None
    raise ValueError(f"{path}: unknown file type {suffix!r}; expected .csv, .jsonl, .json or .parquet")


def _detect(columns: Iterable[str], path: Path) -> str:
    cols = set(columns)
    for fmt, sig in _SIGNATURES.items():
        if {sig["prompt_tokens"], sig["output_tokens"]} <= cols:
            return fmt
    if set(_CANONICAL) <= cols:
        return "generic"
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


def _numbers(raw: pd.Series) -> np.ndarray:
    """Values as float64, NaN where not a number (booleans count as not a number)."""
    if raw.dtype == bool:
        return np.full(len(raw), np.nan)
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    if raw.dtype == object:  # mixed column (JSON): to_numeric would read True as 1
        num[raw.map(lambda x: isinstance(x, (bool, np.bool_))).to_numpy(dtype=bool)] = np.nan
    return num


def _lengths(raw: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 and a mask of entries that are not positive integers."""
    num = _numbers(raw)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(num) | (num <= 0) | (num != np.floor(num))
    return num, bad


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
            time_raw: pd.Series | None = None,
            names: tuple[str, str], max_new_tokens: int | None, dropped: int = 0,
            failed: int = 0, notes: list[str] | None = None) -> pd.DataFrame:
    """Validate lengths and times, apply ``on_bad``, mark censoring, build the table."""
    notes = list(notes or [])
    p, bad_p = _lengths(prompt_raw)
    o, bad_o = _lengths(output_raw)
    bad_t = np.zeros(p.size, dtype=bool) if arrival_s is None else ~np.isfinite(arrival_s)
    bad = bad_p | bad_o | bad_t
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        if on_bad == "raise":
            if bad_p[i]:
                raise _first_bad(path, style, i, names[0], prompt_raw.iloc[i], "a positive integer token count")
            if bad_o[i]:
                raise _first_bad(path, style, i, names[1], output_raw.iloc[i], "a positive integer token count")
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
    if arrival_s is not None:
        t = arrival_s[keep]
        table["arrival_s"] = t - t.min()
    cens = np.zeros(out.size, dtype=bool) if censored is None else censored[keep].astype(bool)
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
    return df


# -------------------------------------------------------------------------------- loaders
def _require(df: pd.DataFrame, cols: Iterable[str], path: Path, fmt: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: format {fmt!r} needs columns {missing}, found {list(df.columns)}")


def _seconds_from_numbers(raw: pd.Series, scale: float) -> np.ndarray:
    """Numeric times times ``scale`` (to seconds); NaN where not a number."""
    return _numbers(raw) * scale


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
    path = Path(path)
    v.choice(format, "format", FORMATS)
    v.choice(on_bad, "on_bad", ON_BAD)
    if max_new_tokens is not None:
        max_new_tokens = v.positive_int(max_new_tokens, "max_new_tokens")
    raw, dropped, style = _read_table(path, on_bad)
    if raw.empty:
        raise ValueError(f"trace file {path} has no data rows")
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
        arrival = (_seconds_from_numbers(raw[mapping["arrival_s"]], 1.0) if "arrival_s" in mapping else None)
        cens = None
        if "censored" in mapping:
            c = raw[mapping["censored"]]
            if c.dtype != bool:
                raise ValueError(f"{path}: column {mapping['censored']!r} must be boolean, got {c.dtype}")
            cens = c.to_numpy()
        return _finish(path, fmt, raw[mapping["prompt_tokens"]], raw[mapping["output_tokens"]],
                       arrival_s=arrival, censored=cens,
                       time_raw=raw[mapping["arrival_s"]] if "arrival_s" in mapping else None, names=(mapping["prompt_tokens"], mapping["output_tokens"]), **common)
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
        failed_mask = pd.to_numeric(raw[sig["output_tokens"]], errors="coerce").to_numpy() == 0
        failed = int(failed_mask.sum())
        if failed:
            raw = raw[~failed_mask].reset_index(drop=True)
            notes.append(f"excluded {failed} failed request(s) (Response tokens = 0)")
    if fmt == "azure":
        stamps = pd.to_datetime(raw[sig["time"]], format="ISO8601", errors="coerce")
        arrival = (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
    elif fmt == "burstgpt":
        arrival = _seconds_from_numbers(raw[sig["time"]], 1.0)
    elif fmt == "mooncake":
        arrival = _seconds_from_numbers(raw[sig["time"]], 1e-3)
    elif fmt == "simulator" and "arrived_at" in raw.columns:
        arrival = _seconds_from_numbers(raw["arrived_at"], 1.0)
    else:
        arrival = None
    time_raw = raw[sig["time"]] if "time" in sig else raw.get("arrived_at")
    return _finish(path, fmt, raw[names[0]], raw[names[1]], arrival_s=arrival, censored=None,
                   time_raw=time_raw, names=names, failed=failed, notes=notes, **common)


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
