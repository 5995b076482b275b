"""kvlab.traces.from_prometheus: histograms of a known distribution give back its percentiles."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from kvlab.prometheus import fit_histogram, histogram, is_exposition, parse_exposition
from kvlab.traces import from_prometheus

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
    with pytest.raises(ValueError, match="counts fell"):
        from_prometheus(path.read_text(), _exposition(_draw(PROMPT, 100, 9), _draw(OUTPUT, 100, 9), stop=100,
                                                      length=0), interval_s=10)
    with pytest.raises(ValueError, match="need at least 2"):
        fit_histogram(histogram(parse_exposition('x_bucket{le="10"} 1\nx_bucket{le="+Inf"} 1\n'), "x"))
