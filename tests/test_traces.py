"""Trace loaders: every format from a small fixture, auto-detection, censoring, bad input."""
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kvlab import traces
from kvlab._validate import MAX_TRACE_TOKENS

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:16:46.6805900,1200,7
"""
BURST = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
5,1368,0.55,ChatGPT,472,18,490,Conversation log
45,1368,1.02,GPT-4,1087,0,1087,Conversation log
46.5,1370,0.80,ChatGPT,30,200,230,API log
50,1371,0.10,GPT-4,64,12,76,API log
"""
MOONCAKE = [
    {"timestamp": 27, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2]},
    {"timestamp": 27, "input_length": 7320, "output_length": 490, "hash_ids": [0, 14]},
    {"timestamp": 3027, "input_length": 100, "output_length": 3, "hash_ids": [5]},
]
SIM = """num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
74,918,992,0.0806100217864923
290,905,1195,0.3204419889502762
"""
SIM_ARRIVED = """num_prefill_tokens,num_decode_tokens,arrived_at
74,918,10.5
290,905,12.0
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def _check_contract(df):
    assert not df.columns.duplicated().any()
    assert df.prompt_tokens.dtype == np.int64 and df.output_tokens.dtype == np.int64
    for col in ("prompt_tokens", "output_tokens"):
        assert df[col].between(1, MAX_TRACE_TOKENS).all()
    assert df.censored.dtype == bool
    if "arrival_s" in df:
        assert df.arrival_s.dtype == np.float64 and not df.arrival_s.isna().any()
        assert df.arrival_s.min() == 0.0


def test_azure(tmp_path):
    df = traces.load(_write(tmp_path, "a.csv", AZURE))
    _check_contract(df)
    assert df.attrs["format"] == "azure"
    assert df.prompt_tokens.tolist() == [374, 396, 1200] and df.output_tokens.tolist() == [44, 109, 7]
    # 18:15:50.9951690 - 18:15:46.6805900 = 4.314579 s; +60 s for the third.
    np.testing.assert_allclose(df.arrival_s, [0.0, 4.314579, 60.0], atol=1e-6)


def test_burstgpt_excludes_failed_and_filters_model(tmp_path):
    p = _write(tmp_path, "b.csv", BURST)
    df = traces.load(p)
    _check_contract(df)
    assert df.attrs["format"] == "burstgpt" and df.attrs["failed_requests"] == 1
    assert df.output_tokens.tolist() == [18, 200, 12]
    np.testing.assert_allclose(df.arrival_s, [0.0, 41.5, 45.0])
    gpt4 = traces.load(p, model="GPT-4")
    assert gpt4.prompt_tokens.tolist() == [64] and gpt4.attrs["failed_requests"] == 1
    with pytest.raises(ValueError, match="ChatGPT"):
        traces.load(p, model="Claude")


def test_mooncake(tmp_path):
    df = traces.load(_write(tmp_path, "m.jsonl", _jsonl(MOONCAKE)))
    _check_contract(df)
    assert df.attrs["format"] == "mooncake"
    assert df.output_tokens.tolist() == [500, 490, 3]
    np.testing.assert_allclose(df.arrival_s, [0.0, 0.0, 3.0])  # ms -> s


def test_simulator_tables(tmp_path):
    df = traces.load(_write(tmp_path, "s.csv", SIM))
    _check_contract(df)
    assert df.attrs["format"] == "simulator" and "arrival_s" not in df
    assert df.prompt_tokens.tolist() == [74, 290] and df.output_tokens.tolist() == [918, 905]
    df2 = traces.load(_write(tmp_path, "s2.csv", SIM_ARRIVED))
    np.testing.assert_allclose(df2.arrival_s, [0.0, 1.5])


def test_vllm_bench_json(tmp_path):
    obj = {"request_throughput": 3.2, "input_lens": [10, 20, 30], "output_lens": [5, 6, 7],
           "ttfts": [0.1, 0.2, 0.3]}
    df = traces.load(_write(tmp_path, "r.json", json.dumps(obj)))
    _check_contract(df)
    assert df.attrs["format"] == "vllm-bench" and df.output_tokens.tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="equal length"):
        traces.load(_write(tmp_path, "r2.json", json.dumps({"input_lens": [1, 2], "output_lens": [3]})))


def test_generic_with_mapping_csv_jsonl_parquet(tmp_path):
    raw = pd.DataFrame({"in": [5, 6, 7], "out": [1, 2, 3], "t": [2.0, 3.5, 9.0], "hit": [False, False, True]})
    cols = {"prompt_tokens": "in", "output_tokens": "out", "arrival_s": "t", "censored": "hit"}
    raw.to_csv(tmp_path / "g.csv", index=False)
    raw.to_parquet(tmp_path / "g.parquet")
    (tmp_path / "g.jsonl").write_text(_jsonl(raw.to_dict("records")))
    for name in ("g.csv", "g.parquet", "g.jsonl"):
        df = traces.load(tmp_path / name, columns=cols)
        _check_contract(df)
        assert df.attrs["format"] == "generic"
        assert df.prompt_tokens.tolist() == [5, 6, 7] and df.censored.tolist() == [False, False, True]
        np.testing.assert_allclose(df.arrival_s, [0.0, 1.5, 7.0])
    with pytest.raises(ValueError, match="cannot tell"):
        traces.load(tmp_path / "g.csv")


def test_round_trip_of_kvlab_table(tmp_path):
    df = traces.load(_write(tmp_path, "a.csv", AZURE))
    df.to_parquet(tmp_path / "k.parquet")
    back = traces.load(tmp_path / "k.parquet")
    assert back.attrs["format"] == "generic"
    pd.testing.assert_frame_equal(back, df, check_like=True)


@pytest.mark.parametrize("name, text, fmt", [
    ("a.csv", AZURE, "azure"), ("b.csv", BURST, "burstgpt"), ("m.jsonl", _jsonl(MOONCAKE), "mooncake"),
    ("s.csv", SIM, "simulator"),
])
def test_explicit_format_matches_auto(tmp_path, name, text, fmt):
    p = _write(tmp_path, name, text)
    pd.testing.assert_frame_equal(traces.load(p, format=fmt), traces.load(p))


def test_explicit_format_with_wrong_columns(tmp_path):
    with pytest.raises(ValueError, match=r"format 'azure' needs columns \['ContextTokens'"):
        traces.load(_write(tmp_path, "s.csv", SIM), format="azure")


def test_max_new_tokens_marks_censoring(tmp_path):
    df = traces.load(_write(tmp_path, "a.csv", AZURE), max_new_tokens=109)
    assert df.censored.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="exceed max_new_tokens=100"):
        traces.load(_write(tmp_path, "a.csv", AZURE), max_new_tokens=100)


def test_pile_up_at_the_maximum_is_detected(tmp_path):
    rng = np.random.default_rng(0)
    out = np.minimum(np.rint(rng.lognormal(np.log(100), 0.8, 5000)).astype(int) + 1, 400)
    n_cap = int((out == 400).sum())
    assert n_cap > 50
    pd.DataFrame({"num_prefill_tokens": 10, "num_decode_tokens": out}).to_csv(tmp_path / "c.csv", index=False)
    df = traces.load(tmp_path / "c.csv")
    assert df.attrs["detected_cap_tokens"] == 400 and df.censored.sum() == n_cap
    assert any("pile up" in n for n in df.attrs["notes"])
    # the same law without a cap: nothing detected
    free = np.rint(rng.lognormal(np.log(100), 0.8, 5000)).astype(int) + 1
    pd.DataFrame({"num_prefill_tokens": 10, "num_decode_tokens": free}).to_csv(tmp_path / "f.csv", index=False)
    df = traces.load(tmp_path / "f.csv")
    assert df.attrs["detected_cap_tokens"] is None and not df.censored.any()


def test_from_vllm_outputs():
    def req(n_prompt, n_out, reason, t):
        return SimpleNamespace(prompt_token_ids=list(range(n_prompt)),
                               outputs=[SimpleNamespace(token_ids=list(range(n_out)), finish_reason=reason)],
                               metrics=SimpleNamespace(arrival_time=t))
    df = traces.from_vllm_outputs([req(3, 5, "stop", 100.0), req(4, 16, "length", 100.25)])
    _check_contract(df)
    assert df.prompt_tokens.tolist() == [3, 4] and df.output_tokens.tolist() == [5, 16]
    assert df.censored.tolist() == [False, True]
    np.testing.assert_allclose(df.arrival_s, [0.0, 0.25])
    with pytest.raises(ValueError, match=r"outputs\[0\] is not a vLLM RequestOutput"):
        traces.from_vllm_outputs([object()])


# ----------------------------------------------------------------------------- bad input
BAD_CSV = [
    ("ContextTokens,GeneratedTokens,TIMESTAMP\n10,5,2023-11-16 18:15:46\n12,abc,2023-11-16 18:15:47\n",
     r"b\.csv: row 2 \(line 3\): GeneratedTokens='abc'"),
    ("ContextTokens,GeneratedTokens,TIMESTAMP\n10,5,2023-11-16 18:15:46\n12,,2023-11-16 18:15:47\n",
     r"row 2 \(line 3\): GeneratedTokens=nan"),
    ("ContextTokens,GeneratedTokens,TIMESTAMP\n10,5,2023-11-16 18:15:46\n-3,4,2023-11-16 18:15:47\n",
     r"row 2 \(line 3\): ContextTokens=-3"),
    ("ContextTokens,GeneratedTokens,TIMESTAMP\n10,0,2023-11-16 18:15:46\n3,4,2023-11-16 18:15:47\n",
     r"row 1 \(line 2\): GeneratedTokens=0"),
    ("ContextTokens,GeneratedTokens,TIMESTAMP\n10,2.5,2023-11-16 18:15:46\n3,4,2023-11-16 18:15:47\n",
     r"row 1 \(line 2\): GeneratedTokens=2.5"),
    ("ContextTokens,GeneratedTokens,TIMESTAMP\n10,2,2023-11-16 18:15:46\n3,4,yesterday\n",
     r"row 2 \(line 3\): TIMESTAMP='yesterday'"),
]


@pytest.mark.parametrize("text, match", BAD_CSV)
def test_bad_rows_raise_naming_file_and_row(tmp_path, text, match):
    p = _write(tmp_path, "b.csv", text)
    with pytest.raises(ValueError, match=match):
        traces.load(p)
    df = traces.load(p, on_bad="drop")
    assert df.attrs["dropped_rows"] == 1 and len(df) == 1
    assert "dropped 1 bad row(s)" in df.attrs["notes"]


def test_mixed_types_in_jsonl(tmp_path):
    rows = [dict(r) for r in MOONCAKE]
    rows[1]["output_length"] = "many"
    rows[2]["input_length"] = True
    p = _write(tmp_path, "m.jsonl", _jsonl(rows))
    with pytest.raises(ValueError, match=r"m\.jsonl: row 2 \(line 2\): output_length='many'"):
        traces.load(p)
    assert traces.load(p, on_bad="drop").attrs["dropped_rows"] == 2


def test_truncated_jsonl_line(tmp_path):
    text = _jsonl(MOONCAKE[:2]) + '{"timestamp": 40, "input_length": 12'
    p = _write(tmp_path, "t.jsonl", text)
    with pytest.raises(ValueError, match=r"t\.jsonl: line 3 is not a JSON object"):
        traces.load(p)
    df = traces.load(p, on_bad="drop")
    assert len(df) == 2 and df.attrs["dropped_rows"] == 1


@pytest.mark.parametrize("name, text, match", [
    ("e.csv", "", "is empty"),
    ("h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no data rows"),
    ("x.csv", "a,b\n1,2\n", "cannot tell the trace format"),
    ("x.txt2", "a,b\n1,2\n", "unknown file type"),
    ("x.json", "[1, 2]", "vLLM benchmark result"),
])
def test_bad_files(tmp_path, name, text, match):
    with pytest.raises(ValueError, match=match):
        traces.load(_write(tmp_path, name, text))


def test_bad_arguments(tmp_path):
    p = _write(tmp_path, "a.csv", AZURE)
    with pytest.raises(ValueError, match="format 'nope' is unknown"):
        traces.load(p, format="nope")
    with pytest.raises(ValueError, match="on_bad"):
        traces.load(p, on_bad="ignore")
    with pytest.raises(ValueError, match="does not exist"):
        traces.load(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="BurstGPT traces only"):
        traces.load(p, model="GPT-4")
    with pytest.raises(ValueError, match="columns must map"):
        traces.load(p, columns={"prompt_tokens": "ContextTokens"})


def test_all_rows_bad_with_drop(tmp_path):
    p = _write(tmp_path, "s.csv", "num_prefill_tokens,num_decode_tokens\n0,1\n2,-1\n")
    with pytest.raises(ValueError, match="no valid rows"):
        traces.load(p, on_bad="drop")


def test_columns_only_with_generic(tmp_path):
    with pytest.raises(ValueError, match="columns= applies"):
        traces.load(_write(tmp_path, "a.csv", AZURE), format="azure", columns={"prompt_tokens": "x"})


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=25)
@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 10**5)), min_size=1, max_size=40))
def test_simulator_table_round_trip(tmp_path_factory, rows):
    p = tmp_path_factory.mktemp("rt") / "t.csv"
    pd.DataFrame(rows, columns=["num_prefill_tokens", "num_decode_tokens"]).to_csv(p, index=False)
    df = traces.load(p, max_new_tokens=10**5)
    assert df.prompt_tokens.tolist() == [r[0] for r in rows]
    assert df.output_tokens.tolist() == [r[1] for r in rows]
    assert df.censored.tolist() == [r[1] == 10**5 for r in rows]


def test_rows_out_of_arrival_order_load_in_arrival_order(tmp_path):
    """A shuffled Azure file loads as the sorted one does (ties keep the file's order), with a note."""
    t = ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.9951690", "2023-11-16 18:15:50.9951690",
         "2023-11-16 18:15:52.0000000"]
    rows = [(t[3], 30, 3), (t[1], 10, 1), (t[0], 40, 4), (t[2], 20, 2)]
    path = tmp_path / "shuffled.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    df = traces.load(path)
    assert df["prompt_tokens"].tolist() == [40, 10, 20, 30] and df["output_tokens"].tolist() == [4, 1, 2, 3]
    np.testing.assert_allclose(df["arrival_s"], [0.0, 4.314579, 4.314579, 5.31941], atol=1e-6)
    assert any("not in arrival order" in n for n in df.attrs["notes"])
