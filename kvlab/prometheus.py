"""A trace from what a running vLLM server already exports: its Prometheus ``/metrics``.

vLLM exports per-request histograms of prompt and generation tokens
(``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``; cumulative ``_bucket``
counts with upper bounds ``le``, plus ``_count`` and ``_sum``) and a counter of finished
requests by reason (``vllm:request_success_total{finished_reason="stop"|"length"|"abort"}``).
:func:`from_prometheus` turns one scrape (or the difference of two) into kvlab's trace table:

* each length histogram is fitted by maximum likelihood as **interval-censored** data: a
  request in bucket ``(le[i-1], le[i]]`` contributes ``log(F(le[i]) - F(le[i-1]))``, the last
  bucket ``(le[-1], inf)`` is right-censored (:func:`kvlab.lengths.fit.fit_binned`, the same
  interval likelihood as every length fit; the lowest AIC wins);
* ``num_requests`` requests are drawn from the two fits (independently: the histograms carry no
  joint information), rounded to whole tokens by the one rounding rule of :mod:`kvlab._intmath`;
* with two scrapes, the histograms are the requests finished between them and the rate is the
  counter's increase over the time between the scrapes (the samples' timestamps, or
  ``interval_s``); arrivals are then Poisson at that rate. One scrape gives no rate.

The exposition parser reads the text format's sample lines (``name{labels} value
[timestamp_ms]``) and ignores comments; it needs no Prometheus client library.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from .arrivals import arrival_times
from .lengths.fit import FittedLength, fit_binned

PROMPT = "vllm:request_prompt_tokens"
OUTPUT = "vllm:request_generation_tokens"
SUCCESS = "vllm:request_success_total"
#: Families tried for each histogram.
FAMILIES = ("log-normal", "gamma", "weibull", "log-logistic")
#: Synthetic requests drawn at most (when the histograms count more).
MAX_REQUESTS = 20_000

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One sample line: metric name, labels, value, optional timestamp (ms)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None


def parse_exposition(text: str, source: str = "text") -> list[Sample]:
    """The sample lines of a Prometheus text exposition (comments and blank lines skipped).

    Raises ``ValueError`` naming the source and line of a line that is not a sample.
    """
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"{source}: line {lineno} is not a Prometheus sample: {line[:80]!r}")
        try:
            value = float(m.group(3))
        except ValueError:
            raise ValueError(f"{source}: line {lineno}: value {m.group(3)!r} is not a number") from None
        labels = {k: val.replace('\\"', '"').replace("\\\\", "\\") for k, val in _LABEL.findall(m.group(2) or "")}
        out.append(Sample(name=m.group(1), labels=labels, value=value,
                          timestamp_ms=int(m.group(4)) if m.group(4) else None))
    return out


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """A histogram summed over its label sets: upper bounds and counts per bucket.

    ``upper[i]`` is bucket ``i``'s ``le`` (the last is ``inf``); ``counts[i]`` the requests in
    ``(upper[i-1], upper[i]]`` (the first bucket starts at 0).
    """

    name: str
    upper: np.ndarray
    counts: np.ndarray

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def __sub__(self, earlier: Histogram) -> Histogram:
        if not np.array_equal(self.upper, earlier.upper):
            raise ValueError(f"{self.name}: the two scrapes have different buckets")
        diff = self.counts - earlier.counts
        if (diff < 0).any():
            raise ValueError(f"{self.name}: counts fell between the scrapes (the server restarted?); "
                             f"give scrapes of one server run, the earlier first")
        return Histogram(name=self.name, upper=self.upper, counts=diff)


def histogram(samples: Sequence[Sample], name: str, source: str = "text") -> Histogram:
    """The histogram ``name`` (``name_bucket`` samples) summed over label sets other than ``le``."""
    cum: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket":
            if "le" not in s.labels:
                raise ValueError(f"{source}: a {name}_bucket sample has no le label")
            le = float(s.labels["le"])
            cum[le] = cum.get(le, 0.0) + s.value
    if not cum:
        raise ValueError(f"{source}: no {name}_bucket samples; is this a vLLM server's /metrics?")
    upper = np.array(sorted(cum))
    if not math.isinf(upper[-1]):
        raise ValueError(f"{source}: {name} has no le=\"+Inf\" bucket")
    c = np.array([cum[u] for u in upper])
    counts = np.diff(c, prepend=0.0)
    if (counts < 0).any():
        raise ValueError(f"{source}: {name} bucket counts must not decrease with le")
    return Histogram(name=name, upper=upper, counts=np.round(counts).astype(np.int64))


def fit_histogram(h: Histogram, families: Sequence[str] = FAMILIES) -> FittedLength:
    """The family of ``families`` whose interval-censored fit to ``h`` has the lowest AIC
    (:func:`kvlab.lengths.fit.fit_binned`: the buckets are the intervals)."""
    if h.total < 2:
        raise ValueError(f"{h.name}: {h.total} requests counted; need at least 2 to fit a distribution")
    return fit_binned(h.upper, h.counts, families)


def _percentiles(fit: FittedLength, q: Sequence[float] = (50, 90, 99)) -> dict[str, int]:
    """``{"p50": tokens, ...}`` of a fit."""
    return {f"p{p:g}": int(t) for p, t in zip(q, fit.ppf(np.asarray(q) / 100.0))}


def _read(source: str | Path) -> tuple[str, str]:
    """(text, name) of a path or an exposition text."""
    if isinstance(source, Path) or ("\n" not in str(source) and Path(str(source)).exists()):
        p = Path(source)
        return p.read_text(), str(p)
    if "\n" not in str(source):
        raise ValueError(f"Prometheus scrape {str(source)!r} is neither an existing file nor exposition text")
    return str(source), "text"


def is_exposition(path: str | Path) -> bool:
    """Whether a file looks like a Prometheus text exposition (``# TYPE`` lines or vLLM metrics)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open(errors="replace") as fh:
        head = fh.read(65536)
    return "# TYPE " in head or f"{PROMPT}_bucket" in head


def _counter(samples: Sequence[Sample], name: str) -> tuple[dict[str, float], int | None]:
    """Counter value by ``finished_reason`` and the latest timestamp seen (ms)."""
    by: dict[str, float] = {}
    ts = [s.timestamp_ms for s in samples if s.name == name and s.timestamp_ms is not None]
    for s in samples:
        if s.name == name:
            key = s.labels.get("finished_reason", "")
            by[key] = by.get(key, 0.0) + s.value
    return by, (max(ts) if ts else None)


def from_prometheus(first: str | Path, second: str | Path | None = None, *, interval_s: float | None = None,
                    num_requests: int | None = None, seed: int = 0) -> pd.DataFrame:
    """A trace table drawn from a vLLM server's Prometheus histograms.

    Parameters
    ----------
    first : str or Path
        A scrape of ``/metrics``: a file, or the exposition text itself.
    second : str or Path, optional
        A later scrape of the same server: the trace is then the requests finished in between,
        at the rate they finished.
    interval_s : float, optional
        Seconds between the scrapes; needed when their samples carry no timestamps.
    num_requests : int, optional
        Requests to draw; default the requests the histograms count (at most
        :data:`MAX_REQUESTS`).
    seed : int
        Seed of the draws and of the Poisson arrivals.

    Returns
    -------
    DataFrame
        ``prompt_tokens``, ``output_tokens``, ``censored`` (all False: which outputs hit a cap
        is unknown), ``arrival_s`` when the rate is known. ``attrs`` as
        :func:`kvlab.traces.load` gives, plus ``"prometheus"``: the fits, their percentiles,
        the observed request count, the rate and the interval.

    Raises
    ------
    ValueError
        A missing histogram, a malformed line, scrapes of different servers or runs, or two
        scrapes without timestamps or ``interval_s``.
    """
    seed = v.nonnegative_int(seed, "seed")
    text1, name1 = _read(first)
    s1 = parse_exposition(text1, name1)
    hp, ho = histogram(s1, PROMPT, name1), histogram(s1, OUTPUT, name1)
    done1, ts1 = _counter(s1, SUCCESS)
    rate = interval = None
    source = name1
    finished = done1
    if second is not None:
        text2, name2 = _read(second)
        s2 = parse_exposition(text2, name2)
        hp, ho = histogram(s2, PROMPT, name2) - hp, histogram(s2, OUTPUT, name2) - ho
        done2, ts2 = _counter(s2, SUCCESS)
        finished = {k: done2.get(k, 0.0) - done1.get(k, 0.0) for k in done2}
        if interval_s is not None:
            interval = v.positive_float(interval_s, "interval_s")
        elif ts1 is not None and ts2 is not None and ts2 > ts1:
            interval = (ts2 - ts1) / 1e3
        else:
            raise ValueError(f"{name1}, {name2}: the samples carry no timestamps; give interval_s (seconds "
                             f"between the scrapes)")
        total = sum(finished.values()) if finished else float(ho.total)
        rate = total / interval if total > 0 else None
        source = f"{name1} -> {name2}"
    elif interval_s is not None:
        raise ValueError("interval_s is for two scrapes; one scrape gives no rate")
    prompt_fit, output_fit = fit_histogram(hp), fit_histogram(ho)
    observed = min(hp.total, ho.total)
    n = min(observed, MAX_REQUESTS) if num_requests is None else v.positive_int(num_requests, "num_requests")
    table = {"prompt_tokens": prompt_fit.sample(n, seed), "output_tokens": output_fit.sample(n, seed + 1),
             "censored": np.zeros(n, dtype=bool)}
    if rate is not None:
        table["arrival_s"] = arrival_times(n, "poisson", qps=rate, seed=seed)
    df = pd.DataFrame(table)
    length = finished.get("length", 0.0)
    notes = [f"{n:,} requests drawn from interval-censored fits to the histograms of {observed:,} requests "
             f"(prompt: {prompt_fit.family}, output: {output_fit.family}); prompt and output drawn independently",
             "arrivals: Poisson at the counters' rate" if rate is not None else
             "no rate: one scrape (give a second scrape, or qps)"]
    if length:
        notes.append(f"{int(length):,} requests finished at their max_tokens (finished_reason=length): their "
                     f"true output lengths are longer")
    df.attrs.update({"source": source, "format": "prometheus", "dropped_rows": 0,
                     "failed_requests": int(finished.get("abort", 0.0)), "detected_cap_tokens": None,
                     "notes": notes,
                     "prometheus": {"observed_requests": observed, "rate_per_s": rate, "interval_s": interval,
                                    "prompt_fit": {"family": prompt_fit.family, **prompt_fit.params,
                                                   **_percentiles(prompt_fit)},
                                    "output_fit": {"family": output_fit.family, **output_fit.params,
                                                   **_percentiles(output_fit)},
                                    "finished": finished}})
    return df


__all__ = ["Histogram", "Sample", "fit_histogram", "from_prometheus", "histogram", "is_exposition",
           "parse_exposition"]
