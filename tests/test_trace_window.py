"""N requests of a trace (kvlab.trace_window): rows, rates and rescaling checked by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.trace_window import offered_rate_per_s, trace_window, window_starts


def _trace(n: int = 200, rate: float = 20.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"prompt_tokens": np.arange(1, n + 1), "output_tokens": rng.integers(1, 50, n),
                         "arrival_s": 3.0 + np.cumsum(rng.exponential(1 / rate, n))})


def test_offered_rate_is_the_inverse_mean_gap():
    assert offered_rate_per_s(np.array([0.0, 0.5, 1.0, 2.0])) == pytest.approx(3 / 2.0)
    assert offered_rate_per_s(np.zeros(5)) is None and offered_rate_per_s(np.array([1.0])) is None
    assert offered_rate_per_s(None) is None


def test_window_keeps_consecutive_rows_and_their_times():
    t = _trace()
    w = trace_window(t, 50, start_row=30)
    assert w.how == "window" and (w.start_row, w.end_row, w.num_requests, w.trace_requests) == (30, 80, 50, 200)
    assert w.requests["prompt_tokens"].tolist() == list(range(31, 81))
    gaps = np.diff(t["arrival_s"].to_numpy()[30:80])
    assert np.allclose(np.diff(w.requests["arrival_s"]), gaps) and w.requests["arrival_s"].iloc[0] == 0
    assert w.rate_per_s == pytest.approx(49 / gaps.sum())
    assert w.arrivals == "trace" and "rows 30-79" in w.describe()


def test_sample_is_rescaled_to_the_trace_rate():
    t = _trace(4000, rate=20.0)
    full = (len(t) - 1) / (t["arrival_s"].iloc[-1] - t["arrival_s"].iloc[0])
    w = trace_window(t, 400, how="sample", seed=3)
    assert w.rate_per_s == pytest.approx(full) and w.trace_rate_per_s == pytest.approx(full)
    assert w.requests["prompt_tokens"].is_monotonic_increasing  # trace order kept
    # the thinned sample alone would offer about a tenth of the rate
    rows = w.requests["prompt_tokens"].to_numpy() - 1
    assert offered_rate_per_s(t["arrival_s"].to_numpy()[rows]) < 0.15 * full


def test_rate_scale_and_qps():
    t = _trace()
    base = trace_window(t, 100)
    twice = trace_window(t, 100, rate_scale=2.0)
    assert np.allclose(twice.requests["arrival_s"] * 2.0, base.requests["arrival_s"])
    assert twice.rate_per_s == pytest.approx(2 * base.rate_per_s) and twice.trace_rate_per_s == base.rate_per_s
    assert trace_window(t, 100, qps=7.0).rate_per_s == pytest.approx(7.0)
    offline = t.drop(columns="arrival_s")
    assert trace_window(offline, 10).rate_per_s is None and trace_window(offline).arrivals == "offline"
    poisson = trace_window(offline, 10, qps=5.0, seed=1)
    assert poisson.arrivals == "poisson" and (np.diff(poisson.requests["arrival_s"]) >= 0).all()


def test_whole_trace_and_window_starts():
    t = _trace(50)
    w = trace_window(t)
    assert w.how == "all" and w.num_requests == 50 and w.requests["arrival_s"].iloc[0] == 0
    assert window_starts(100, 20, 5) == [0, 20, 40, 60, 80]
    assert window_starts(100, 40, 3) == [0, 30, 60] and window_starts(10, 10, 1) == [0]


@pytest.mark.parametrize("kw, match", [
    ({"num_requests": 201}, "more than the trace's 200"),
    ({"num_requests": 50, "start_row": 160}, "runs past"),
    ({"how": "random"}, "how 'random' is unknown"),
    ({"rate_scale": 2.0, "qps": 3.0}, "not both"),
    ({"rate_scale": 0}, "rate_scale"),
])
def test_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        trace_window(_trace(), **kw)
    with pytest.raises(ValueError, match="rate_scale needs arrival times"):
        trace_window(_trace().drop(columns="arrival_s"), rate_scale=2.0)
