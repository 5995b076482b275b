"""The trace contract, as a property: whatever bytes or rows a file holds, ``traces.load``
returns a table that satisfies the contract or raises ValueError naming the file."""
import json
import re
import string

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kvlab import simulate, traces
from kvlab._validate import MAX_TRACE_TOKENS, request_table


def satisfies_contract(df: pd.DataFrame) -> None:
    """The contract, checked from its definition (not by calling the code under test)."""
    assert isinstance(df, pd.DataFrame) and len(df) >= 1
    assert not df.columns.duplicated().any()
    for col in ("prompt_tokens", "output_tokens"):
        assert df[col].dtype == np.int64
        assert ((df[col] >= 1) & (df[col] <= MAX_TRACE_TOKENS)).all()
    if "arrival_s" in df:
        t = df["arrival_s"].to_numpy()
        assert df["arrival_s"].dtype == np.float64 and np.isfinite(t).all() and (t >= 0).all()
    assert df["censored"].dtype == bool


def _load_or_valueerror(path, **kw):
    try:
        df = traces.load(path, **kw)
    except ValueError as exc:
        assert str(path) in str(exc), f"the error does not name the file: {exc}"
        return None
    satisfies_contract(df)
    return df


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SUFFIXES = [".csv", ".jsonl", ".json", ".parquet", ".txt", ".csv.gz"]


@SETTINGS
@given(data=st.binary(max_size=400), suffix=st.sampled_from(SUFFIXES),
       prefix=st.sampled_from([b"", b"\x1f\x8b", b"\xef\xbb\xbf", b"\xff\xfe", b"PAR1", b"\x28\xb5\x2f\xfd"]))
def test_random_bytes_load_or_name_the_file(tmp_path, data, suffix, prefix):
    path = tmp_path / f"t{suffix}"
    path.write_bytes(prefix + data)
    for on_bad in ("raise", "drop"):
        _load_or_valueerror(path, on_bad=on_bad)


# values a length or time cell may hold in a hostile file
_cell = st.one_of(
    st.integers(min_value=-3, max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "abc", "1e300", "99999999999999999999", "nan", "-0", "7.0", "2023-11-16 18:15:46",
                     "2023-11-16T18:15:46+02:00", "true", " 12 "]),
    st.booleans(), st.none())
_FORMATS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
    "simulator": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "generic": ("arrival_s", "prompt_tokens", "output_tokens"),
}


@SETTINGS
@given(fmt=st.sampled_from(sorted(_FORMATS)), kind=st.sampled_from(["csv", "jsonl"]),
       rows=st.lists(st.tuples(_cell, _cell, _cell), min_size=1, max_size=8),
       junk=st.text(alphabet=string.printable, max_size=30))
@example(fmt="generic", kind="csv", rows=[(0, 1, 1)], junk="0\r0")  # a lone \r ends a CSV line too
def test_random_rows_load_or_name_the_file(tmp_path, fmt, kind, rows, junk):
    cols = _FORMATS[fmt]
    path = tmp_path / f"t.{kind}"
    if kind == "csv":
        body = ",".join(cols) + "\n" + "".join(",".join("" if c is None else str(c) for c in r) + "\n" for r in rows)
        path.write_text(body + junk)
    else:
        def enc(c):
            return c if not isinstance(c, float) or np.isfinite(c) else str(c)
        path.write_text("".join(json.dumps(dict(zip(cols, map(enc, r)))) + "\n" for r in rows) + junk)
    for on_bad in ("raise", "drop"):
        df = _load_or_valueerror(path, on_bad=on_bad)
        if df is not None and on_bad == "drop":
            # every row either kept or counted: nothing vanishes unaccounted
            # the junk may add (partial) lines: the CSV parser ends a line at \r\n, \n or a lone \r
            lines = len(rows) + len(re.split(r"\r\n|\r|\n", junk))
            assert len(df) + df.attrs["dropped_rows"] + df.attrs["failed_requests"] <= lines
            assert df.attrs["dropped_rows"] >= 0


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(_cell, _cell), min_size=1, max_size=6))
def test_public_entries_take_only_contract_tables(rows):
    """``request_table`` (used by simulate and the other DataFrame entries) keeps exactly the
    rows whose lengths are integers in [1, MAX] and drops the rest, counting them."""
    table = pd.DataFrame({"prompt_tokens": pd.Series([r[0] for r in rows], dtype=object),
                          "output_tokens": pd.Series([r[1] for r in rows], dtype=object)})

    def good(x):  # the contract, from its words
        if isinstance(x, bool) or x is None:
            return False
        try:
            f = float(x)
        except (TypeError, ValueError, OverflowError):
            return False
        return bool(np.isfinite(f)) and f == int(f) and 1 <= f <= MAX_TRACE_TOKENS

    expected = [(int(float(p)), int(float(o))) for p, o in rows if good(p) and good(o)]
    if not expected:
        with pytest.raises(ValueError, match="workload"):
            request_table(table, "workload", on_bad="drop")
        return
    out = request_table(table, "workload", on_bad="drop")
    assert list(zip(out.prompt_tokens.tolist(), out.output_tokens.tolist())) == expected
    assert out.attrs.get("dropped_rows", 0) == len(rows) - len(expected)
    if len(expected) < len(rows):
        with pytest.raises(ValueError, match=r"workload: row \d+: "):
            request_table(table, "workload")


def test_simulate_enforces_the_contract():
    w = pd.DataFrame({"prompt_tokens": [10, 10], "output_tokens": [5, 5], "arrival_s": [0.0, 1.0]})
    w.columns = ["prompt_tokens", "output_tokens", "prompt_tokens"]
    with pytest.raises(ValueError, match="duplicate column name"):
        simulate(w, model="Llama-3-8B", gpu="H100-SXM", pool_pages=100)
