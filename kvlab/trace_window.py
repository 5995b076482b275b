"""N requests of a trace, at the trace's own rate: the one definition every analysis uses.

A trace (``kvlab.traces.load``) is a table of requests with lengths and, usually, arrival times.
Simulating "N requests of it" must keep the load the trace offers, or the answer is about a
different server. Two ways keep it:

``window``
    ``num_requests`` consecutive rows from ``start_row``, with their own arrival times (moved
    to start at 0). The window offers whatever rate the trace had over that stretch, bursts
    included.
``sample``
    ``num_requests`` rows drawn at random (seeded, kept in trace order). Thinning a trace
    thins its load by ``num_requests / len(trace)``, so the sample's arrival times are
    rescaled to offer the trace's own rate again.

Either can then be run "as if traffic grew": ``rate_scale`` divides every arrival time (2.0 =
twice the rate, same burst shape), or ``qps`` rescales to a given mean rate. A table without
arrival times is served all at once (offline), or as a Poisson process when ``qps`` is given.

The offered rate of a set of arrivals is ``(n - 1) / (last - first)`` requests/s: the
inverse of the mean gap between consecutive arrivals (the maximum-likelihood rate of a Poisson
process observed from its first to its last event).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _validate as v
from .arrivals import arrival_times

HOW = ("window", "sample")


def offered_rate_per_s(arrival_s: np.ndarray | pd.Series | None) -> float | None:
    """Requests per second offered by these arrival times: ``(n - 1) / (last - first)``.

    None when there are no times, fewer than two, or they all coincide (offline).
    """
    if arrival_s is None:
        return None
    t = np.asarray(arrival_s, dtype=np.float64)
    if t.size < 2:
        return None
    span = float(t.max() - t.min())
    return (t.size - 1) / span if span > 0 else None


@dataclass(frozen=True, kw_only=True)
class TraceWindow:
    """The requests an analysis serves, and where they come from.

    Attributes
    ----------
    requests : DataFrame
        ``prompt_tokens``, ``output_tokens`` (and ``censored`` when the trace has it), plus
        ``arrival_s`` (seconds from 0) unless the load is offline.
    how : {"all", "window", "sample"}
        How the rows were chosen (``all``: the whole trace).
    start_row, end_row : int
        Trace rows ``[start_row, end_row)`` the requests span (a sample spans the whole trace).
    num_requests, trace_requests : int
        Requests taken, and requests in the trace.
    trace_rate_per_s : float or None
        Rate the source rows offer before any scaling (requests/s; None when offline).
    rate_per_s : float or None
        Rate the requests offer as served (requests/s; None when offline).
    arrivals : {"trace", "poisson", "offline"}
        Where the arrival times come from.
    """

    requests: pd.DataFrame
    how: str
    start_row: int
    end_row: int
    num_requests: int
    trace_requests: int
    trace_rate_per_s: float | None
    rate_per_s: float | None
    arrivals: str

    @property
    def duration_s(self) -> float:
        """Seconds from the first to the last arrival (0 when offline)."""
        t = self.requests.get("arrival_s")
        return 0.0 if t is None or len(t) == 0 else float(t.max() - t.min())

    def describe(self) -> str:
        """One line: which requests, how many, over how long, at what rate."""
        where = ("all" if self.how == "all" else
                 f"rows {self.start_row:,}-{self.end_row - 1:,}" if self.how == "window" else "a sample")
        rate = ("offline (all at once)" if self.rate_per_s is None
                else f"{self.rate_per_s:.3g} requests/s ({self.arrivals} arrivals)")
        if self.rate_per_s is not None and self.trace_rate_per_s is not None \
                and abs(self.rate_per_s / self.trace_rate_per_s - 1) > 1e-9:
            rate += f", the trace offers {self.trace_rate_per_s:.3g}"
        return (f"{self.num_requests:,} of {self.trace_requests:,} requests ({where}) over "
                f"{self.duration_s:,.0f} s at {rate}")

    def as_dict(self) -> dict:
        """The record a result stores (JSON-ready, without the requests)."""
        return {"how": self.how, "start_row": self.start_row, "end_row": self.end_row,
                "num_requests": self.num_requests, "trace_requests": self.trace_requests,
                "trace_rate_per_s": self.trace_rate_per_s, "rate_per_s": self.rate_per_s,
                "duration_s": self.duration_s, "arrivals": self.arrivals}


def trace_window(trace: pd.DataFrame, num_requests: int | None = None, *, how: str = "window", start_row: int = 0,
                 seed: int = 0, rate_scale: float = 1.0, qps: float | None = None) -> TraceWindow:
    """``num_requests`` requests of ``trace`` at the trace's own rate (or a scaled one).

    Parameters
    ----------
    trace : DataFrame
        ``prompt_tokens``, ``output_tokens``, optional ``arrival_s`` (seconds; rows out of arrival
        order are taken in arrival order, ties in row order, as every kvlab loader returns them)
        and ``censored``.
    num_requests : int, optional
        Requests to take; None takes the whole trace.
    how : {"window", "sample"}
        Consecutive rows from ``start_row``, or a seeded random sample with its arrival times
        rescaled to the trace's rate (see the module note).
    start_row : int
        First row of a window (0-based).
    seed : int
        Seed of a sample, and of Poisson arrivals when ``qps`` is given for a trace without times.
    rate_scale : float
        Serve at this multiple of the offered rate (arrival times divided by it); > 0.
    qps : float, optional
        Serve at this mean rate instead (requests/s): the trace's times rescaled, or Poisson
        arrivals when it has none. Not with ``rate_scale``.

    Returns
    -------
    TraceWindow

    Raises
    ------
    ValueError
        A missing column, ``num_requests`` above the trace's size, a window past its end,
        ``rate_scale`` without arrival times, or both ``rate_scale`` and ``qps``.

    Examples
    --------
    >>> trace = pd.DataFrame({"prompt_tokens": 10, "output_tokens": 5, "arrival_s": np.arange(100) / 4.0})
    >>> w = trace_window(trace, 20, how="sample")
    >>> round(w.rate_per_s, 6), w.num_requests
    (4.0, 20)
    """
    trace = v.request_table(trace, "trace")  # the trace contract (datetime arrival_s becomes seconds)
    if "arrival_s" in trace.columns and (np.diff(trace["arrival_s"].to_numpy()) < 0).any():
        trace = trace.sort_values("arrival_s", kind="stable").reset_index(drop=True)  # a window is a span of time
    total = len(trace)
    how = v.choice(how, "how", HOW)
    n = total if num_requests is None else v.positive_int(num_requests, "num_requests")
    if n > total:
        raise ValueError(f"num_requests={n} is more than the trace's {total:,} requests")
    start_row = v.nonnegative_int(start_row, "start_row")
    seed = v.nonnegative_int(seed, "seed")
    rate_scale = v.positive_float(rate_scale, "rate_scale")
    if qps is not None:
        qps = v.positive_float(qps, "qps")
        if rate_scale != 1.0:
            raise ValueError("give rate_scale or qps, not both")
    has_times = "arrival_s" in trace.columns
    all_t = trace["arrival_s"].to_numpy(dtype=np.float64) if has_times else None
    trace_rate = offered_rate_per_s(all_t)

    if n == total and start_row == 0:
        rows, kind, start, end = np.arange(total), "all", 0, total
    elif how == "window":
        if start_row + n > total:
            raise ValueError(f"a window of {n:,} requests from start_row={start_row:,} runs past the trace's "
                             f"{total:,} requests")
        rows, kind, start, end = np.arange(start_row, start_row + n), "window", start_row, start_row + n
    else:
        rows = np.sort(np.random.default_rng(seed).choice(total, n, replace=False))
        kind, start, end = "sample", 0, total
    cols = [c for c in ("prompt_tokens", "output_tokens", "censored", "hash_ids") if c in trace.columns]
    out = trace[cols].iloc[rows].reset_index(drop=True)

    source_rate = trace_rate if kind != "window" else offered_rate_per_s(all_t[rows] if has_times else None)
    arrivals = "offline"
    if has_times and source_rate is not None:
        t = all_t[rows] - all_t[rows].min()
        own = offered_rate_per_s(t)
        if kind == "sample" and own is not None:
            t = t * (own / source_rate)  # thinned by n / total: stretch back to the trace's rate
        target = source_rate * rate_scale if qps is None else qps
        t = t * (source_rate / target)
        out["arrival_s"] = t
        arrivals = "trace"
    elif qps is not None:
        out["arrival_s"] = arrival_times(n, "poisson", qps=qps, seed=seed)
        arrivals = "poisson"
    elif rate_scale != 1.0:
        raise ValueError("rate_scale needs arrival times: the trace has none (give qps for Poisson arrivals)")
    rate = offered_rate_per_s(out["arrival_s"].to_numpy()) if "arrival_s" in out.columns else None
    return TraceWindow(requests=out, how=kind, start_row=start, end_row=end, num_requests=n, trace_requests=total,
                       trace_rate_per_s=source_rate, rate_per_s=rate, arrivals=arrivals)


def window_starts(total_requests: int, num_requests: int, num_windows: int) -> list[int]:
    """Start rows of ``num_windows`` windows of ``num_requests`` spread evenly over a trace.

    Disjoint when the trace holds them all (``num_windows x num_requests <= total_requests``),
    overlapping otherwise; the first starts at row 0 and the last ends at the trace's end.
    """
    total = v.positive_int(total_requests, "total_requests")
    n = v.positive_int(num_requests, "num_requests")
    k = v.positive_int(num_windows, "num_windows")
    if n > total:
        raise ValueError(f"num_requests={n} is more than the trace's {total:,} requests")
    if k == 1:
        return [0]
    return [int(round(i * (total - n) / (k - 1))) for i in range(k)]


__all__ = ["HOW", "TraceWindow", "offered_rate_per_s", "trace_window", "window_starts"]
