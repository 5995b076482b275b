"""kvlab.prometheus.from_prometheus: histograms of a known distribution give back its percentiles, and
every malformed scrape (issue 25: exemplars, timestamps, escapes, gzip, UTF-16, bad counts, fits
the data cannot support) is read right or refused naming the file, metric and bucket."""
from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvlab._validate import MAX_TRACE_TOKENS
from kvlab.cli import main
from kvlab.lengths.fit import FittedLength
from kvlab.prometheus import _bounded_ppf, fit_histogram, histogram, is_exposition, parse_exposition
from kvlab.prometheus import from_prometheus

# vLLM's token buckets: build_1_2_5_buckets up to the model's length
BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
PROMPT = stats.lognorm(0.9, scale=150.0)      # p50 150, p90 476, p99 1217 tokens
OUTPUT = stats.gamma(2.0, scale=60.0)         # p50 101, p90 233, p99 398 tokens


def _exposition(prompt: np.ndarray, output: np.ndarray, *, stop: int, length: int, ts_ms: int | None = None) -> str:
    """A vLLM /metrics text, written out by hand: cumulative buckets split over two label sets."""
    stamp = "" if ts_ms is None else f" {ts_ms}"
    lines = ["# HELP vllm:request_prompt_tokens Number of prefill tokens processed.",
             "# TYPE vllm:request_prompt_tokens histogram"]
    for name, x in (("vllm:request_prompt_tokens", prompt), ("vllm:request_generation_tokens", output)):
        half = x.size // 2
        for part, values in (("a", x[:half]), ("b", x[half:])):
            for le in BUCKETS:
                lines.append(f'{name}_bucket{{engine="{part}",le="{float(le)}",model_name="m"}} '
                             f'{float(np.count_nonzero(values <= le))}')
            lines.append(f'{name}_bucket{{engine="{part}",le="+Inf",model_name="m"}} {float(values.size)}')
            lines.append(f'{name}_count{{engine="{part}",model_name="m"}} {float(values.size)}')
            lines.append(f'{name}_sum{{engine="{part}",model_name="m"}} {float(values.sum())}')
    lines += ["# TYPE vllm:request_success_total counter",
              f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {float(stop)}{stamp}',
              f'vllm:request_success_total{{finished_reason="length",model_name="m"}} {float(length)}{stamp}']
    return "\n".join(lines) + "\n"


def _draw(dist, n: int, seed: int) -> np.ndarray:
    return np.maximum(1, np.ceil(dist.rvs(n, random_state=np.random.default_rng(seed)))).astype(int)


def _bucket(x: float) -> tuple[float, float]:
    i = int(np.searchsorted(BUCKETS, x))
    return (BUCKETS[i - 1] if i else 0.0), (BUCKETS[i] if i < len(BUCKETS) else np.inf)


def test_percentiles_come_back_within_the_bucket_resolution():
    prompt, output = _draw(PROMPT, 20000, 1), _draw(OUTPUT, 20000, 2)
    df = from_prometheus(_exposition(prompt, output, stop=19000, length=1000), num_requests=5000)
    fits = df.attrs["prometheus"]
    for key, dist in (("prompt_fit", PROMPT), ("output_fit", OUTPUT)):
        for p in (50, 90, 99):
            true = float(dist.ppf(p / 100))
            lo, hi = _bucket(true)
            got = fits[key][f"p{p}"]
            assert lo - 1 <= got <= hi + 1, (key, p, true, got)  # the bucket that holds the truth (+1: ceil)
            assert got == pytest.approx(true, rel=0.15)
    assert fits["prompt_fit"]["family"] == "log-normal"
    assert len(df) == 5000 and "arrival_s" not in df.columns  # one scrape: no rate
    assert any("finished_reason=length" in n for n in df.attrs["notes"])


def test_two_scrapes_give_the_rate_and_the_requests_between():
    p1, o1 = _draw(PROMPT, 3000, 3), _draw(OUTPUT, 3000, 4)
    p2, o2 = _draw(PROMPT, 6000, 5), _draw(OUTPUT, 6000, 6)
    first = _exposition(p1, o1, stop=3000, length=0, ts_ms=1_000_000)
    second = _exposition(np.concatenate([p1, p2]), np.concatenate([o1, o2]), stop=9000, length=0, ts_ms=1_600_000)
    df = from_prometheus(first, second, seed=1)
    meta = df.attrs["prometheus"]
    assert meta["interval_s"] == 600.0 and meta["rate_per_s"] == pytest.approx(6000 / 600)
    assert meta["observed_requests"] == 6000 and len(df) == 6000
    rate = (len(df) - 1) / (df["arrival_s"].max() - df["arrival_s"].min())
    assert rate == pytest.approx(10.0, rel=0.05)
    # the histogram of the difference is the second batch's alone
    h = histogram(parse_exposition(second), "vllm:request_generation_tokens") - \
        histogram(parse_exposition(first), "vllm:request_generation_tokens")
    edges = [0, *BUCKETS, np.inf]
    assert h.counts.tolist() == [int(np.count_nonzero((o2 > lo) & (o2 <= hi))) for lo, hi in zip(edges, edges[1:])]
    untimed = [t.replace(" 1000000", "") for t in (first,)] + [second.replace(" 1600000", "")]
    with pytest.raises(ValueError, match="interval_s"):
        from_prometheus(*untimed)
    assert from_prometheus(*untimed, interval_s=300).attrs["prometheus"]["rate_per_s"] == pytest.approx(20.0)


def test_files_and_bad_input(tmp_path):
    path = tmp_path / "metrics.txt"
    path.write_text(_exposition(_draw(PROMPT, 500, 7), _draw(OUTPUT, 500, 8), stop=500, length=0))
    assert is_exposition(path)
    csv = tmp_path / "trace.csv"
    csv.write_text("prompt_tokens,output_tokens\n1,2\n")
    assert not is_exposition(csv)
    assert len(from_prometheus(path)) == 500
    with pytest.raises(ValueError, match="line 2 is not a Prometheus sample"):
        parse_exposition("# ok\nthis is not a sample\n")
    with pytest.raises(ValueError, match="no vllm:request_prompt_tokens_bucket"):
        from_prometheus("up 1\nother_metric 2\n")
    with pytest.raises(ValueError, match=r'text -> text: vllm:request_prompt_tokens_bucket\{engine="a",le="20",'
                                         r'model_name="m"\} fell from 1 to 0 between the scrapes'):
        from_prometheus(path.read_text(), _exposition(_draw(PROMPT, 100, 9), _draw(OUTPUT, 100, 9), stop=100,
                                                      length=0), interval_s=10)
    with pytest.raises(ValueError, match="need at least 2"):
        fit_histogram(histogram(parse_exposition('x_bucket{le="10"} 1\nx_bucket{le="+Inf"} 1\n'), "x"))


# ----------------------------------------------------------------- issue 25: hand-made scrapes
PM, OM = "vllm:request_prompt_tokens", "vllm:request_generation_tokens"


def _hand(prompt: dict, output: dict, *, tail: str = "", extra: str = "") -> str:
    """A scrape written out by hand: ``{le: cumulative count}`` per histogram, ``tail`` after each
    bucket sample (a timestamp, an exemplar)."""
    lines = []
    for name, buckets in ((PM, prompt), (OM, output)):
        lines.append(f"# TYPE {name} histogram")
        lines += [f'{name}_bucket{{le="{le}",model_name="m"}} {c}{tail}' for le, c in buckets.items()]
    return "\n".join(lines) + "\n" + extra


PROMPT_B = {"10": 10, "100": 60, "1000": 100, "+Inf": 100}  # 10 / 50 / 40 / 0 requests per bucket
OUTPUT_B = {"10": 20, "100": 90, "1000": 100, "+Inf": 100}


def test_exemplars_are_not_read_as_the_bucket_count():
    # OpenMetrics exemplar after each bucket: one traced request of 5,000 tokens. The old hand
    # parser read 5000.0 as every bucket's count: 100 requests became 5,000.
    text = _hand(PROMPT_B, OUTPUT_B, tail=' # {trace_id="4bf92f3577b34da6"} 5000.0 1700000000.250')
    h = histogram(parse_exposition(text), PM)
    assert h.counts.tolist() == [10, 50, 40, 0] and h.total == 100
    df = from_prometheus(text)
    assert df.attrs["prometheus"]["observed_requests"] == 100 and len(df) == 100
    # the same scrape ending in # EOF (a real OpenMetrics page) reads the same
    assert histogram(parse_exposition(text + "# EOF\n"), PM).counts.tolist() == [10, 50, 40, 0]


def test_timestamps_text_ms_and_openmetrics_seconds_give_one_interval():
    a = _hand({"10": 1, "100": 6, "1000": 10, "+Inf": 10}, {"10": 2, "100": 9, "1000": 10, "+Inf": 10},
              extra='vllm:request_success_total{finished_reason="stop"} 10 1700000000000\n')
    b = _hand({"10": 4, "100": 26, "1000": 40, "+Inf": 40}, {"10": 8, "100": 36, "1000": 40, "+Inf": 40},
              extra='vllm:request_success_total{finished_reason="stop"} 40 1700000300000\n')
    meta = from_prometheus(a, b).attrs["prometheus"]
    assert meta["interval_s"] == 300.0 and meta["rate_per_s"] == pytest.approx(30 / 300)
    om = [t.replace(" 1700000000000", " 1700000000.0").replace(" 1700000300000", " 1700000300.0")
          .replace("vllm:request_success_total", "# TYPE vllm:request_success counter\nvllm:request_success_total")
          + "# EOF\n" for t in (a, b)]
    assert from_prometheus(*om).attrs["prometheus"]["interval_s"] == 300.0
    with pytest.raises(ValueError, match="not later than the first's"):
        from_prometheus(a, b.replace(" 1700000300000", " 1699999999000"))


def test_escaped_label_values_are_read_by_the_grammar():
    # a quote, a backslash, a brace and spaces inside a label value
    text = _hand(PROMPT_B, OUTPUT_B).replace('model_name="m"', r'model_name="a\"} b \\ 7"')
    samples = parse_exposition(text)
    assert {s.labels["model_name"] for s in samples} == {'a"} b \\ 7'}
    assert histogram(samples, PM).counts.tolist() == [10, 50, 40, 0]


def test_gzip_and_utf16_scrapes_read_like_utf8(tmp_path):
    text = _hand(PROMPT_B, OUTPUT_B)
    plain, gz, u16 = tmp_path / "m.txt", tmp_path / "m.gz", tmp_path / "m16.txt"
    plain.write_text(text)
    gz.write_bytes(gzip.compress(text.encode()))
    u16.write_text(text, encoding="utf-16")  # with a byte-order mark, as Windows tools write it
    want = from_prometheus(plain, seed=3)
    for path in (gz, u16):
        assert is_exposition(path)
        got = from_prometheus(path, seed=3)
        pd.testing.assert_frame_equal(got, want)
    nobom = tmp_path / "nobom.txt"
    nobom.write_bytes(text.encode("utf-16-le"))
    with pytest.raises(ValueError, match=r"nobom\.txt holds zero bytes: UTF-16 without a byte-order mark"):
        from_prometheus(nobom)


@pytest.mark.parametrize("count", ["NaN", "+Inf", "1e30", "-3", "12.5"])
def test_bad_counts_name_file_metric_and_bucket(tmp_path, count):
    path = tmp_path / "bad.txt"
    path.write_text(_hand({**PROMPT_B, "100": count}, OUTPUT_B))
    with pytest.raises(ValueError, match=r'bad\.txt: vllm:request_prompt_tokens_bucket\{le="100",model_name="m"\} '
                                         r'= .*a count must be a whole number'):
        from_prometheus(path)
    assert main(["recommend", str(path), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]) == 2


def test_decreasing_buckets_and_mismatched_count_are_refused(tmp_path):
    path = tmp_path / "dec.txt"
    path.write_text(_hand({"10": 10, "100": 60, "1000": 50, "+Inf": 100}, OUTPUT_B))
    with pytest.raises(ValueError, match=r'dec\.txt: vllm:request_prompt_tokens_bucket\{le="1000",model_name="m"\} '
                                         r'= 50 is below the 60 of le=100'):
        from_prometheus(path)
    path.write_text(_hand(PROMPT_B, OUTPUT_B, extra=f'{PM}_count{{model_name="m"}} 99\n'))
    with pytest.raises(ValueError, match=r'dec\.txt: vllm:request_prompt_tokens_count\{model_name="m"\} = 99 but'):
        from_prometheus(path)
    path.write_text(_hand(PROMPT_B, OUTPUT_B) + f'{PM}_bucket{{le="10",model_name="m"}} 10\n')
    with pytest.raises(ValueError, match=r"dec\.txt: .*given twice"):
        from_prometheus(path)


def test_inf_only_histogram_is_a_clear_error(tmp_path):
    path = tmp_path / "inf.txt"
    path.write_text(_hand({"+Inf": 100}, OUTPUT_B))  # was a raw ZeroDivisionError
    with pytest.raises(ValueError, match=r'inf\.txt: vllm:request_prompt_tokens has only the le="\+Inf" bucket'):
        from_prometheus(path)


def test_all_requests_above_the_last_bucket_is_an_error_not_an_invented_tail(tmp_path, capsys):
    # every output longer than 1,000 tokens: the old fit drew them near 20,000 tokens (or as
    # -9223372036854775808, which the CLI then blamed on the file) without a word
    path = tmp_path / "tail.txt"
    path.write_text(_hand(PROMPT_B, {"10": 0, "100": 0, "1000": 0, "+Inf": 100}))
    with pytest.raises(ValueError, match=r"tail\.txt: vllm:request_generation_tokens: all 100 requests are above the "
                                         r"last finite bucket \(le=1000\).*cannot be supported by the data"):
        from_prometheus(path)
    assert main(["recommend", str(path), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: vllm:request_generation_tokens: all 100 requests are above" in err and "-9223372036854775808" not in err


def test_part_of_the_requests_above_the_last_bucket_is_noted_and_bounded():
    df = from_prometheus(_hand(PROMPT_B, {"10": 20, "100": 60, "1000": 80, "+Inf": 100}))
    note = next(n for n in df.attrs["notes"] if n.startswith(OM))
    assert "20 of 100 requests (20.0%) are counted only as longer than the last finite bucket (le=1000" in note
    assert df.output_tokens.between(1, MAX_TRACE_TOKENS).all()
    assert not any(n.startswith(PM) for n in df.attrs["notes"])  # no prompt above its last bucket


def test_a_degenerate_fit_is_an_error_not_a_wrapped_length():
    # a log-normal whose mass lies beyond 10M tokens: every quantile of the bounded fit is undefined
    fit = FittedLength(family="log-normal", params={"mu": 1000.0, "sigma": 0.5}, loglik=0.0, n=10, n_censored=0)
    with pytest.raises(ValueError, match="scrape.txt: x: the log-normal fit .* is degenerate"):
        _bounded_ppf(fit, np.array([0.5]), "scrape.txt: x")
    fine = FittedLength(family="log-normal", params={"mu": np.log(100.0), "sigma": 1.0}, loglik=0.0, n=10, n_censored=0)
    assert _bounded_ppf(fine, np.array([0.5]), "x")[0] == pytest.approx(100.0, rel=1e-9)


def test_an_exposition_written_by_prometheus_client_reads_back_exactly():
    # the exporter vLLM itself uses writes both formats (with _created samples, and exemplars in
    # OpenMetrics); the counts read back must be the histogram of the observed lengths
    from prometheus_client import CollectorRegistry, Counter, Histogram as PromHistogram, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    reg = CollectorRegistry()
    hist = {name: PromHistogram(name, "tokens", ["model_name"], buckets=BUCKETS, registry=reg) for name in (PM, OM)}
    done = Counter("vllm:request_success", "finished", ["finished_reason", "model_name"], registry=reg)
    prompt, output = _draw(PROMPT, 400, 11), _draw(OUTPUT, 400, 12)
    for p, o in zip(prompt, output):
        hist[PM].labels(model_name="m").observe(float(p), exemplar={"trace_id": f"t{p}"})
        hist[OM].labels(model_name="m").observe(float(o), exemplar={"trace_id": f"t{o}"})
        done.labels(finished_reason="stop", model_name="m").inc()
    edges = [0, *BUCKETS, np.inf]
    for text in (generate_latest(reg).decode(), generate_openmetrics(reg).decode()):
        samples = parse_exposition(text)
        for name, x in ((PM, prompt), (OM, output)):
            want = [int(np.count_nonzero((x > lo) & (x <= hi))) for lo, hi in zip(edges, edges[1:])]
            assert histogram(samples, name).counts.tolist() == want
        assert from_prometheus(text).attrs["prometheus"]["finished"] == {"stop": 400}
    assert "# {trace_id=" in generate_openmetrics(reg).decode()  # the exemplars were there to be skipped


def test_histograms_the_data_cannot_support_are_refused_or_noted(tmp_path):
    path = tmp_path / "m.txt"
    # 99 of 100 outputs above the only finite bucket: even the median would be invented
    path.write_text(_hand(PROMPT_B, {"10": 1, "+Inf": 100}))
    with pytest.raises(ValueError, match=r"m\.txt: vllm:request_generation_tokens: 99 of 100 requests are above the "
                                         r"last finite bucket \(le=10\).*\(its median included\) cannot be supported"):
        from_prometheus(path)
    # buckets below one token, or in other units than tokens
    path.write_text(_hand(PROMPT_B, {"0.001": 50, "0.01": 100, "+Inf": 100}))
    with pytest.raises(ValueError, match=r'vllm:request_generation_tokens_bucket\{le="0.01",model_name="m"\} counts '
                                         r"requests shorter than 1 token"):
        from_prometheus(path)
    path.write_text(_hand(PROMPT_B, {"1e20": 50, "1e30": 100, "+Inf": 100}))
    with pytest.raises(ValueError, match=r"m\.txt: vllm:request_generation_tokens: the .* fit .* puts 100.0% of lengths "
                                         r"above 10,000,000 tokens"):
        from_prometheus(path)
    # every request in one bucket: drawn inside it, with a note that the spread is assumed
    df = from_prometheus(_hand(PROMPT_B, {"10": 0, "100": 100, "1000": 100, "+Inf": 100}))
    assert df.output_tokens.between(11, 100).all()
    assert any(n.startswith(f"{OM}: all 100 requests are in one bucket (10, 100] tokens") for n in df.attrs["notes"])
