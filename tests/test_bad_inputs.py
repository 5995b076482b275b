"""Issue 15, class by class: each bad input is a file (or argument) written here, and each must
end in a clear ValueError naming the file / parameter / row, or in rows dropped and counted, or
(CLI) in one line on stderr and exit status 2 or 1. Never a wrapped number, a hang or a traceback.

Class 7 (interrupted reports) is in test_report_signals.py; the property test of class 9 in
test_traces_contract.py.
"""
import gzip
import json
import os
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from kvlab import _validate as v, simulate, traces
from kvlab.arrivals import arrival_times
from kvlab.capacity import ServingConfig
from kvlab.cli import main
from kvlab.lengths.profiles import profile
from kvlab.preemption_cost import crossover
from kvlab.reservation import pool_pages, reservation_table
from kvlab.trace_window import trace_window

SIM = "num_prefill_tokens,num_decode_tokens\n"
GOOD_ROWS = [(10 + i, 5 + i) for i in range(30)]  # 30 requests: enough not to warn
SIM_KW = dict(model="Llama-3-8B", gpu="H100-SXM", pool_pages=200)


def _csv(rows):
    return SIM + "".join(f"{p},{o}\n" for p, o in rows)


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


# ------------------------------------------------------------------ 1. numbers that wrap
@pytest.mark.parametrize("text, shown", [("99999999999999999999", "99999999999999999999"),
                                         ("9223372036854775808", "9223372036854775808"),
                                         ("1e300", r"1e\+300"), ("1e30", r"1e\+30"), ("-1e300", r"-1e\+300")])
def test_1_huge_csv_lengths_are_bad_rows_not_wrapped(tmp_path, text, shown):
    p = _write(tmp_path, "big.csv", _csv(GOOD_ROWS) + f"{text},5\n")
    with pytest.raises(ValueError, match=rf"big\.csv: row 31 \(line 32\): num_prefill_tokens={shown}, expected"):
        traces.load(p)
    df = traces.load(p, on_bad="drop")
    assert df.attrs["dropped_rows"] == 1
    assert df.prompt_tokens.tolist() == [r[0] for r in GOOD_ROWS]  # nothing negative, nothing wrapped


def test_1_thirty_digit_json_integer_is_a_bad_row(tmp_path):
    lines = [{"timestamp": i, "input_length": 10 + i, "output_length": 5 + i} for i in range(30)]
    text = "".join(json.dumps(r) + "\n" for r in lines)
    p = _write(tmp_path, "m.jsonl", text + '{"timestamp": 31, "input_length": 123456789012345678901234567890, '
                                          '"output_length": 3}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl: row 31 \(line 31\): input_length=123456789012345678901234567890"):
        traces.load(p)
    df = traces.load(p, on_bad="drop")
    assert df.attrs["dropped_rows"] == 1 and df.prompt_tokens.max() == 39


def test_1_uint64_parquet_is_a_bad_row(tmp_path):
    prompt = np.array([10 + i for i in range(30)] + [2**64 - 1], dtype=np.uint64)
    pd.DataFrame({"prompt_tokens": prompt, "output_tokens": 5}).to_parquet(tmp_path / "u.parquet")
    with pytest.raises(ValueError, match=r"u\.parquet: row 31 \(index 30\): prompt_tokens=18446744073709551615"):
        traces.load(tmp_path / "u.parquet")
    df = traces.load(tmp_path / "u.parquet", on_bad="drop")
    assert df.attrs["dropped_rows"] == 1 and (df.prompt_tokens > 0).all() and len(df) == 30


@pytest.mark.parametrize("value", [1e30, 2**63, 2**64 - 1, float("inf")])
def test_1_parameter_checks_do_not_wrap(value):
    with pytest.raises(ValueError, match="max_new_tokens must hold positive integers"):
        reservation_table(max_new_tokens=[value])
    with pytest.raises(ValueError, match="max_new_tokens"):
        simulate(pd.DataFrame({"prompt_tokens": [5], "output_tokens": [5]}), max_new_tokens=value, **SIM_KW)


def test_1_a_dataframe_with_a_huge_length_is_refused_naming_the_row():
    w = pd.DataFrame({"prompt_tokens": [5, 2**63], "output_tokens": [5, 5]})
    with pytest.raises(ValueError, match=r"workload: row 1: prompt_tokens=9223372036854775808, expected an integer"):
        simulate(w, **SIM_KW)


# ------------------------------------------------------------------ 2. absurd sizes
def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_2_a_billion_token_output_is_refused_before_allocating(tmp_path):
    w = pd.DataFrame({"prompt_tokens": [100, 100], "output_tokens": [100, 10**9]})

    def run():
        with pytest.raises(ValueError, match=r"row 1: output_tokens=1000000000, expected an integer token count in "
                                             r"\[1, 10,000,000\]"):
            simulate(w, max_new_tokens=2048, **SIM_KW)
    assert _peak_bytes(run) < 20 * 2**20  # the 7.45 GiB array of the issue is never asked for
    p = _write(tmp_path, "huge.csv", _csv(GOOD_ROWS + [(100, 10**9)]))
    with pytest.raises(ValueError, match=r"huge\.csv: row 31"):
        traces.load(p)


def test_2_absurd_caps_and_lengths_are_refused_before_allocating():
    def run():
        with pytest.raises(ValueError, match="max_seq_tokens must be at most 10,000,000"):
            crossover("Llama-3-8B", "H100-SXM", max_seq_tokens=10**8, allow_beyond_context=True)
        with pytest.raises(ValueError, match="max_seq_tokens must be at most"):
            crossover("Llama-3-8B", "H100-SXM", max_seq_tokens=10**10, allow_beyond_context=True)
        with pytest.raises(ValueError, match="max_new_tokens must be at most 10,000,000"):
            simulate(pd.DataFrame({"prompt_tokens": [5], "output_tokens": [5]}), max_new_tokens=10**9, **SIM_KW)
        with pytest.raises(ValueError, match="n must be at most 100,000,000"):
            profile("azure-2023-code").sample(10**12)
    assert _peak_bytes(run) < 20 * 2**20


# ------------------------------------------------------------------ 3. time columns
def test_3_datetime_and_timedelta_arrivals_are_seconds(tmp_path):
    day = pd.to_datetime(["2024-01-01 00:00:00", "2024-01-01 00:00:30", "2024-01-02 00:00:00"])
    base = {"prompt_tokens": [5, 6, 7], "output_tokens": [3, 4, 5]}
    pd.DataFrame({**base, "arrival_s": day}).to_parquet(tmp_path / "dt.parquet")
    pd.DataFrame({**base, "arrival_s": day.tz_localize("Europe/Paris")}).to_parquet(tmp_path / "tz.parquet")
    pd.DataFrame({**base, "arrival_s": pd.to_timedelta(["0s", "30s", "1D"])}).to_parquet(tmp_path / "td.parquet")
    for name in ("dt.parquet", "tz.parquet", "td.parquet"):
        df = traces.load(tmp_path / name)
        np.testing.assert_allclose(df.arrival_s, [0.0, 30.0, 86400.0])  # not 8.64e13 (nanoseconds)
    res = simulate(pd.DataFrame({**base, "arrival_s": day}), **SIM_KW)
    np.testing.assert_allclose(res.requests.sort_values("request_id").arrival_s, [0.0, 30.0, 86400.0])
    window = trace_window(pd.DataFrame({**base, "arrival_s": day}))
    np.testing.assert_allclose(window.requests.arrival_s, [0.0, 30.0, 86400.0])


def test_3_azure_time_zones_normalised_or_a_clear_error(tmp_path):
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    # 18:00+02:00 is 16:00 UTC; 17:30+01:00 is 16:30 UTC; 16:15Z is 16:15 UTC
    p = _write(tmp_path, "tz.csv", head + "2023-11-16 18:00:00+02:00,10,5\n2023-11-16 17:30:00+01:00,11,6\n"
                                          "2023-11-16 16:15:00Z,12,7\n")
    df = traces.load(p)  # rows come back in arrival order: 16:00, 16:15, 16:30 UTC
    np.testing.assert_allclose(df.arrival_s, [0.0, 900.0, 1800.0])
    assert df["prompt_tokens"].tolist() == [10, 12, 11]
    assert any("UTC" in n for n in df.attrs["notes"])
    mixed = _write(tmp_path, "mixed.csv", head + "2023-11-16 18:00:00,10,5\n2023-11-16 17:30:00+01:00,11,6\n")
    with pytest.raises(ValueError, match=r"mixed\.csv: row 2 \(line 3\): TIMESTAMP='2023-11-16 17:30:00\+01:00' "
                                         r"has a time zone but row 1"):
        traces.load(mixed)


# ------------------------------------------------------------------ 4. ignored parameters
def test_4_a_rate_without_a_rate_based_arrival_kind_is_refused():
    w = pd.DataFrame({"prompt_tokens": [5, 6], "output_tokens": [3, 4]})
    with pytest.raises(ValueError, match="qps=5.0 is used only with arrivals='poisson' or 'gamma', not 'auto'"):
        simulate(w, qps=5.0, **SIM_KW)
    with pytest.raises(ValueError, match="burst_cv=3.0 is used only with arrivals='gamma'"):
        simulate(w, burst_cv=3.0, **SIM_KW)
    with pytest.raises(ValueError, match="qps=2.0 is ignored by offline arrivals"):
        arrival_times(3, "offline", qps=2.0)
    with pytest.raises(ValueError, match="cv=2.0 is used only with gamma arrivals"):
        arrival_times(3, "poisson", qps=2.0, cv=2.0)
    # with the kind that uses it, the rate is used: 2 requests at 5/s do not both arrive at 0
    res = simulate(w, arrivals="poisson", qps=5.0, **SIM_KW)
    assert res.requests.arrival_s.max() > 0


def test_4_percentiles_are_on_one_scale():
    assert v.percentiles([50, 95, 99.9]) == [50.0, 95.0, 99.9]
    assert v.percentiles(95) == [95.0]  # a scalar is one percentile, not a TypeError
    with pytest.raises(ValueError, match=r"0-100 scale \(write 95 for the 95th percentile\)"):
        v.percentiles([0.95])
    for bad in ([100], [0], [float("nan")], ["95"], [True], "95", []):
        with pytest.raises(ValueError, match="percentiles"):
            v.percentiles(bad)



def test_4_and_8_recommend_takes_percentiles_on_one_scale_and_only_contract_traces():
    from kvlab.recommend import output_percentiles, recommend

    out = np.arange(1, 101)
    assert output_percentiles(out, 95) == {"p95": 96}  # a scalar is one percentile (ceil of 95.05)
    with pytest.raises(ValueError, match="0-100 scale"):
        output_percentiles(out, [0.95])
    bad = pd.DataFrame({"prompt_tokens": [10, 10], "output_tokens": [5, 1e300]})
    with pytest.raises(ValueError, match=r"trace: row 1: output_tokens=1e\+300"):
        recommend(bad, model="Llama-3-8B", gpu="H100-SXM")

def test_4_tp_that_does_not_divide_the_heads():
    # Llama-3-8B: 32 query heads, 8 KV heads
    with pytest.raises(ValueError, match="tp=3 does not divide the 32 attention heads of Llama-3-8B"):
        pool_pages("Llama-3-8B", "H100-SXM", tp=3)
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        simulate(pd.DataFrame({"prompt_tokens": [5], "output_tokens": [5]}), model="Llama-3-8B", gpu="H100-SXM",
                 tp=3)
    assert pool_pages("Llama-3-8B", "H100-SXM", tp=4) > 0  # 32 % 4 == 0 and 8 % 4 == 0


def test_4_a_model_that_does_not_fit_says_so_everywhere():
    # Llama-3.1-405B in 16-bit weights is ~810 GB; one 80 GB GPU cannot hold it
    with pytest.raises(ValueError, match="does not fit GPU"):
        ServingConfig(model="Llama-3.1-405B", gpu="H100-SXM")
    with pytest.raises(ValueError, match="does not fit GPU"):
        crossover("Llama-3.1-405B", "H100-SXM")
    with pytest.raises(ValueError, match="does not fit GPU"):
        simulate(pd.DataFrame({"prompt_tokens": [5], "output_tokens": [5]}), model="Llama-3.1-405B", gpu="H100-SXM")


# ------------------------------------------------------------------ 5. errors naming the file
def test_5_utf16_gzip_and_bom_files_load_like_plain_utf8(tmp_path):
    text = _csv(GOOD_ROWS)
    plain = traces.load(_write(tmp_path, "plain.csv", text))
    jsonl = "".join(json.dumps({"timestamp": i, "input_length": p, "output_length": o}) + "\n"
                    for i, (p, o) in enumerate(GOOD_ROWS))
    for name, data in [("u16.csv", text.encode("utf-16")), ("u16le.csv", text.encode("utf-16-le")),
                       ("u16be.csv", text.encode("utf-16-be")), ("gz.csv", gzip.compress(text.encode())),
                       ("named.csv.gz", gzip.compress(text.encode())), ("bom.csv", b"\xef\xbb\xbf" + text.encode())]:
        pd.testing.assert_frame_equal(traces.load(_write(tmp_path, name, data)), plain, check_like=True)
    bom = traces.load(_write(tmp_path, "bom.jsonl", b"\xef\xbb\xbf" + jsonl.encode()))
    assert bom.prompt_tokens.tolist() == [p for p, _ in GOOD_ROWS]


@pytest.mark.parametrize("name, data, match", [
    ("latin.csv", ("Model," + SIM + "caf\u00e9,10,5\n" * 30).encode("latin-1"),
     r"latin\.csv: not UTF-8 text \(byte 0xe9 at offset \d+\); it looks like Latin-1"),
    ("cp1252.csv", ("Model," + SIM + "\u201cq\u201d,10,5\n" * 30).encode("cp1252"),
     r"cp1252\.csv: not UTF-8 text .* Windows-1252"),
    ("zst.csv", b"\x28\xb5\x2f\xfd" + b"\x00" * 40, r"zst\.csv: "),  # no zstandard: says so; else corrupt
    ("zip.csv", b"PK\x03\x04" + b"\x00" * 40, r"zip\.csv: the file is a zip archive"),
    ("deep.json", "[" * 5000 + "]" * 5000, r"deep\.json: JSON nested too deeply"),
    ("deep.jsonl", "[" * 5000 + "]" * 5000 + "\n", r"deep\.jsonl: line 1 is not a JSON object \(nested too deeply"),
    ("dup.csv", "num_prefill_tokens,num_decode_tokens,num_decode_tokens\n1,2,3\n",
     r"dup\.csv: duplicate column name\(s\) 'num_decode_tokens'"),
    ("notgz.csv.gz", _csv(GOOD_ROWS), r"notgz\.csv\.gz: named \.gz but not compressed"),
    ("bin.csv", bytes(range(256)) * 4, r"bin\.csv: .*binary file"),
])
def test_5_unreadable_files_are_a_valueerror_naming_the_file(tmp_path, name, data, match):
    with pytest.raises(ValueError, match=match):
        traces.load(_write(tmp_path, name, data))


def test_5_duplicate_columns_in_a_dataframe_or_parquet(tmp_path):
    w = pd.DataFrame([[5, 3, 9]], columns=["prompt_tokens", "output_tokens", "output_tokens"])
    with pytest.raises(ValueError, match="workload has duplicate column name"):
        simulate(w, **SIM_KW)


def test_5_directories_and_non_files(tmp_path):
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(ValueError, match=r"d\.csv is a directory"):
        traces.load(tmp_path / "d.csv")
    os.mkfifo(tmp_path / "fifo.csv")  # reading it would block forever
    with pytest.raises(ValueError, match=r"fifo\.csv is not a regular file"):
        traces.load(tmp_path / "fifo.csv")


def test_5_other_user_files_name_the_file(tmp_path):
    from kvlab.cli import _load_params_file
    from kvlab.hf_config import load_config
    from kvlab.lengths.profiles import read_profile

    deep = _write(tmp_path, "config.json", "[" * 5000 + "]" * 5000)
    with pytest.raises(ValueError, match=r"config\.json is JSON nested too deeply"):
        load_config(deep)
    latin = _write(tmp_path, "p.yaml", "model: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"parameter file .*p\.yaml is not UTF-8 text \(byte 0xe9"):
        _load_params_file(str(latin))
    with pytest.raises(ValueError, match=r"profile file .*p\.yaml is not UTF-8 text"):
        read_profile(latin)
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ValueError, match=r"parameter file .*d\.yaml is a directory"):
        _load_params_file(str(tmp_path / "d.yaml"))
    u16 = _write(tmp_path, "u.yaml", "model: x\n".encode("utf-16"))
    assert _load_params_file(str(u16)) == {"model": "x"}


# ------------------------------------------------------------------ 6. the CLI
def _cli(capsys, *args):
    status = main(list(args))
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize("make, match", [
    (lambda d: (d / "dir.csv").mkdir() or d / "dir.csv", "is a directory"),
    (lambda d: os.mkfifo(d / "fifo.csv") or d / "fifo.csv", "is not a regular file"),
    (lambda d: _write(d, "latin.csv", ("Model," + SIM + "caf\u00e9,10,5\n").encode("latin-1")), "not UTF-8 text"),
    (lambda d: _write(d, "huge.csv", _csv(GOOD_ROWS + [(5, 10**20)])), "row 31"),
])
def test_6_a_bad_trace_is_one_line_and_exit_2(tmp_path, capsys, make, match):
    trace = make(tmp_path)
    status, err = _cli(capsys, "recommend", str(trace), "--model", "Llama-3-8B", "--gpu", "H100-SXM",
                       "--slo-p99-tbt", "0.1")
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("kvlab recommend: error: ") and match in err
    assert str(trace) in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_trace_is_a_valueerror_naming_it(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n1,2\n")
    p.chmod(0)
    try:
        with pytest.raises(ValueError, match=r"t\.csv: cannot be read as a trace \(PermissionError"):
            traces.load(p)
    finally:
        p.chmod(0o644)



def test_6_any_os_error_while_reading_a_trace_names_it(tmp_path, monkeypatch):
    """As root (CI) no mode makes a file unreadable: the reader itself is made to fail."""
    p = _write(tmp_path, "t.csv", _csv(GOOD_ROWS))

    def eio(*a, **k):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(traces, "_open_binary", eio)
    with pytest.raises(ValueError, match=r"t\.csv: cannot be read as a trace \(OSError: Input/output error\)"):
        traces.load(p)

def test_6_an_unexpected_failure_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    import kvlab.traces

    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(kvlab.traces, "load", broken)
    status, err = _cli(capsys, "recommend", "x.csv", "--model", "Llama-3-8B", "--gpu", "H100-SXM",
                       "--slo-p99-tbt", "0.1")
    assert status == 1 and err.count("\n") == 1 and "internal error: RuntimeError: boom" in err
    monkeypatch.setenv("KVLAB_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["recommend", "x.csv", "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--slo-p99-tbt", "0.1"])


def test_6_an_os_error_is_one_line_and_exit_1(capsys, monkeypatch):
    import kvlab.traces

    def full(*a, **k):
        raise OSError(28, "No space left on device", "/tmp/x")
    monkeypatch.setattr(kvlab.traces, "load", full)
    status, err = _cli(capsys, "recommend", "x.csv", "--model", "Llama-3-8B", "--gpu", "H100-SXM",
                       "--slo-p99-tbt", "0.1")
    assert (status, err) == (1, "kvlab recommend: error: /tmp/x: No space left on device\n")


# ------------------------------------------------------------------ 8. weak answers
def test_8_a_one_row_trace_warns(tmp_path):
    with pytest.warns(v.FewRequestsWarning, match=r"one\.csv holds only 1 request"):
        df = traces.load(_write(tmp_path, "one.csv", _csv([(5, 6)])))
    assert "only 1 request(s): too few for percentiles" in df.attrs["notes"]


def test_8_wrong_argument_types_name_the_parameter(tmp_path):
    p = _write(tmp_path, "g.csv", "a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns must be a mapping"):
        traces.load(p, columns=["a", "b"])
    with pytest.raises(ValueError, match="path must be a file path"):
        traces.load(3)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got 'a'"):
        profile("azure-2023-code").sample(10, seed="a")
    with pytest.raises(ValueError, match="n must be a positive integer, got '10'"):
        profile("azure-2023-code").sample("10")


def test_8_the_cli_prints_a_warning_in_one_line(tmp_path, capsys, monkeypatch):
    import warnings

    import kvlab.traces

    def warn_then_fail(*a, **k):
        warnings.warn("a weak answer\nover two lines", UserWarning, stacklevel=2)
        raise ValueError("stop here")
    monkeypatch.setattr(kvlab.traces, "load", warn_then_fail)
    status, err = _cli(capsys, "recommend", "x.csv", "--model", "Llama-3-8B", "--gpu", "H100-SXM",
                       "--slo-p99-tbt", "0.1")
    assert status == 2
    assert err == "kvlab recommend: warning: a weak answer over two lines\nkvlab recommend: error: stop here\n"


# ------------------------------------------------------------------ issue 25: inputs validated at the boundary
def _notebook(tmp_path):
    """A one-notebook report whose parameters are a bool, a str, an int and results_path."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell('quick = False  # small run\nmodel = "Llama-3-8B"  # model name\nblock_size = 16  # tokens\n'
                              'caps = [128, 512]  # tokens\nresults_path = "r.json"', metadata={"tags": ["parameters"]}),
                new_code_cell("import kvlab\nkvlab.report.write_results(results_path, {})")]
    path = tmp_path / "01_m.ipynb"
    nbformat.write(nb, str(path))
    return path


def _report(capsys, tmp_path, *args):
    status = main(["report", str(_notebook(tmp_path)), *args, "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything ran
    return status, err


def test_25_a_yaml_alias_bomb_is_refused_in_bounded_memory(tmp_path, capsys):
    # 9 levels of 10 aliases each: 10**9 strings from 700 bytes (exhausted memory before)
    lines = ['a0: &a0 ["lol"]'] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = _write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    assert bomb.stat().st_size < 1024

    def run():
        status, err = _report(capsys, tmp_path, "-f", str(bomb))
        assert status == 2 and "holds more than 100,000 values (YAML aliases expanded)" in err and "bomb.yaml" in err
    assert _peak_bytes(run) < 50 * 2**20


def test_25_deep_brackets_and_huge_files_are_refused(tmp_path, capsys):
    deep = _write(tmp_path, "deep.yaml", "model: " + "[" * 100_000 + "]" * 100_000 + "\n")
    status, err = _report(capsys, tmp_path, "-f", str(deep))
    assert status == 2 and f"parameter file {deep} nests lists or mappings more than 50 deep" in err
    assert "RecursionError" not in err
    status, err = _report(capsys, tmp_path, "-p", "model", "[" * 100_000 + "]" * 100_000)
    assert status == 2 and "parameter model given with -p nests lists or mappings more than 50 deep" in err
    big = _write(tmp_path, "big.yaml", "model: " + "x" * (2 << 20) + "\n")
    status, err = _report(capsys, tmp_path, "-f", str(big))
    assert status == 2 and f"parameter file {big} holds more than 1,048,576 bytes" in err


@pytest.mark.parametrize("name, value, match", [
    ("quick", "yes please", "parameter quick of notebook 01_m must be true or false (its default is False), "
                            "got 'yes please'"),
    ("quick", "1", "parameter quick of notebook 01_m must be true or false (its default is False), got 1"),
    ("block_size", "true", "parameter block_size of notebook 01_m must be an integer (its default is 16), got True"),
    ("block_size", "16.5", "parameter block_size of notebook 01_m must be an integer (its default is 16), got 16.5"),
    # a mapping for a declared parameter is a (wrong) value, never a notebook selector
    ("model", "{01: {quick: true}}", "parameter model of notebook 01_m must be a string"),
    ("results_path", "/tmp/elsewhere.json", "parameter results_path of notebook 01_m is set by kvlab"),
    ("caps", "{a: 1}", "parameter caps of notebook 01_m must be a list or one value"),
])
def test_25_report_parameters_are_checked_against_their_defaults(tmp_path, capsys, name, value, match):
    status, err = _report(capsys, tmp_path, "-p", name, value)
    assert status == 2 and match in err


def test_25_values_of_the_right_type_pass(tmp_path):
    from kvlab.report.notebooks import check_values

    nb = _notebook(tmp_path)
    check_values(nb, {"quick": True, "model": "OPT-13B", "block_size": 32, "caps": [256]})
    check_values(nb, {"caps": 2048})  # one value for a list parameter, as kvlab's functions take it


def test_25_a_huge_value_is_not_echoed_whole(tmp_path, capsys):
    status, err = _report(capsys, tmp_path, "-p", "quick", "y" * 1_000_000)
    assert status == 2 and "parameter quick of notebook 01_m must be true or false" in err
    assert len(err) < 1_200


def _rec(capsys, *args):
    status = main(["recommend", *args, "--model", "Llama-3-8B", "--gpu", "H100-SXM"])
    return status, capsys.readouterr().err


def test_25_outputs_never_overwrite_an_input_nor_an_existing_file(tmp_path, capsys, monkeypatch):
    trace = _write(tmp_path, "trace.csv", _csv(GOOD_ROWS))
    before = trace.read_bytes()
    monkeypatch.chdir(tmp_path)
    for target in (str(trace), "./sub/../trace.csv", "trace.csv"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        for force in ([], ["--force"]):
            status, err = _rec(capsys, str(trace), "--csv", "-o", target, *force)
            assert status == 2 and f"-o {target} is the input {trace}: kvlab never overwrites an input" in err
    assert trace.read_bytes() == before
    other = _write(tmp_path, "notes.txt", "keep me\n")
    status, err = _rec(capsys, str(trace), "--json", "-o", str(other))
    assert status == 2 and f"-o {other} already exists; pass --force to overwrite it" in err
    assert other.read_text() == "keep me\n"
    status, err = _rec(capsys, str(trace), "-o", str(tmp_path / "new.csv"))  # -o alone wrote nothing before
    assert status == 2 and "needs --csv or --json" in err
    status, err = _rec(capsys, str(trace), "--force")
    assert status == 2 and "--force is for -o FILE" in err


def test_25_ignored_and_unbounded_recommend_flags_are_errors(tmp_path, capsys):
    trace = _write(tmp_path, "trace.csv", _csv(GOOD_ROWS))
    status, err = _rec(capsys, str(trace), "--scrape-interval", "60")
    assert status == 2 and f"--scrape-interval is for two Prometheus scrapes; {trace} is a trace file" in err
    status, err = _rec(capsys, str(trace), "--windows", "100000")
    assert status == 2 and "--windows must be at most 100, got 100,000" in err
    status, err = _rec(capsys, str(trace), "--sample")
    assert status == 2 and "--sample needs --num-requests N" in err
    scrape = _write(tmp_path, "m.txt", "# TYPE vllm:request_prompt_tokens histogram\n"
                                       'vllm:request_prompt_tokens_bucket{le="+Inf"} 3\n')
    status, err = _rec(capsys, str(scrape), "--format", "azure")
    assert status == 2 and f"--format applies to trace files; {scrape} is a Prometheus scrape" in err


def test_25_a_csv_in_two_formats_is_refused_naming_both(tmp_path):
    p = _write(tmp_path, "two.csv", "ContextTokens,GeneratedTokens,num_prefill_tokens,num_decode_tokens\n"
                                    + "".join(f"{10 + i},{5 + i},{900 + i},{1 + i}\n" for i in range(30)))
    with pytest.raises(ValueError, match=r"two\.csv: the columns fit more than one trace format \(azure: "
                                         r"'ContextTokens', 'GeneratedTokens'; simulator: 'num_prefill_tokens', "
                                         r"'num_decode_tokens'\); pass format="):
        traces.load(p)
    assert traces.load(p, "simulator").prompt_tokens.iloc[0] == 900  # chosen explicitly, it loads


def test_25_max_new_tokens_above_the_context_reserves_no_more_than_the_context():
    w = pd.DataFrame({"prompt_tokens": [100 + i for i in range(30)], "output_tokens": [50 + i for i in range(30)]})
    kw = dict(model="Llama-3-8B", gpu="H100-SXM", pool_pages=2000)  # Llama-3-8B: 8,192-token context
    with pytest.warns(UserWarning, match="max_new_tokens 100,000 exceeds max_model_len 8,192"):
        huge = simulate(w, "reserve_max", max_new_tokens=100_000, **kw)
    at_context = simulate(w, "reserve_max", max_new_tokens=8192, **kw)
    assert huge.params["max_new_tokens"] == 8192
    pd.testing.assert_frame_equal(huge.requests, at_context.requests)  # reserved as if capped at the context


def test_25_fits_and_curves_at_absurd_sizes_are_refused():
    from kvlab.lengths import fit
    from kvlab.lengths.fit import fit_binned

    with pytest.raises(ValueError, match="x must hold non-negative integers at most 10,000,000; element 0 is "
                                         "1000000000000000000"):
        fit(np.array([10**18, 2 * 10**18] * 10))  # was a raw IndexError
    with pytest.raises(ValueError, match="counts must be >= 0"):
        fit_binned([10, 100, np.inf], [5, np.nan, 3])

    def run():
        with pytest.raises(ValueError, match="num_curve_points must be at most 100,000, got 1,000,000,000"):
            crossover("Llama-3-8B", "H100-SXM", num_curve_points=1e9)  # ran 90 s before
    assert _peak_bytes(run) < 20 * 2**20


def test_25_every_yaml_kvlab_reads_has_the_same_limits(tmp_path):
    from kvlab.lengths.profiles import read_profile

    lines = ['a0: &a0 ["lol"]'] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = _write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"profile file {bomb} \(at a\d(\[\d\])+\) holds more than 100,000 values"):
        read_profile(bomb)
    deep = _write(tmp_path, "deep.yaml", "source: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match=rf"profile file {deep} nests lists or mappings more than 50 deep"):
        read_profile(deep)
    rho = _write(tmp_path, "rho.yaml", "source: x\nprompt: {}\noutput: {}\ncopula_rho: [0.5]\n")
    with pytest.raises(ValueError, match=r"copula_rho must lie in \(-1, 1\), got \[0.5\]"):  # was a raw TypeError
        read_profile(rho)
