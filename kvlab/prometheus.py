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
  joint information), rounded to whole tokens by the one rounding rule of :mod:`kvlab._intmath`,
  from the fit truncated at :data:`kvlab._validate.MAX_TRACE_TOKENS` (the fit is bounded). Draws
  above the last finite bucket come from the fitted tail alone, which the histogram cannot check:
  a note says how many requests that concerns, and a histogram whose requests are *all* above its
  last finite bucket is an error (any length there would be invented);
* with two scrapes, the histograms are the requests finished between them and the rate is the
  counter's increase over the time between the scrapes (the samples' timestamps, or
  ``interval_s``); arrivals are then Poisson at that rate. One scrape gives no rate.

Parsing is ``prometheus_client``'s (the Prometheus project's Python client): its text-format
parser, or its OpenMetrics parser for a scrape in that format (ending ``# EOF``, or carrying
exemplars ``... # {trace_id="..."} 1.0``, which only OpenMetrics has), so label escapes,
timestamps (ms in the text format, s in OpenMetrics) and exemplars are read by the grammar,
never by a hand regex (a metric's ``:`` may be spelled ``_``, as prometheus_client 0.26's own
OpenMetrics writer spells vLLM's sample names). Files may be gzip-compressed and UTF-8, UTF-16 or UTF-32 with a
byte-order mark (:func:`kvlab._validate.read_text_file`). Every count is then checked here:
finite, a whole number, non-negative, at most 2**53, cumulative counts not decreasing with ``le``,
``_count`` equal to the ``+Inf`` bucket, no sample given twice, and no count falling between two
scrapes; each error names the file, the metric, the label set and the bucket.
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
from ._intmath import quantile_tokens, round_tokens
from .arrivals import arrival_times
from .lengths.fit import FittedLength, fit_binned

PROMPT = "vllm:request_prompt_tokens"
OUTPUT = "vllm:request_generation_tokens"
SUCCESS = "vllm:request_success_total"
#: Families tried for each histogram.
FAMILIES = ("log-normal", "gamma", "weibull", "log-logistic")
#: Synthetic requests drawn at most (when the histograms count more).
MAX_REQUESTS = 20_000
#: The largest count read: 2**53, the largest integer a float64 (the exposition's number type)
#: holds exactly. A larger count is a corrupt file, not a server's requests.
MAX_COUNT = 2**53
#: Largest scrape file read (bytes, decompressed): a vLLM /metrics page is tens of kB.
MAX_SCRAPE_BYTES = 64 * 2**20

# an exemplar after a sample's value (and optional timestamp): `} 12 # {trace_id="..."} 1.0`
_EXEMPLAR = re.compile(r"^[^#].*\s#\s*\{", re.MULTILINE)
_EOF = re.compile(r"^\s*#\s*EOF\s*$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One sample: metric name, labels, value, optional timestamp (seconds since the epoch)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_s: float | None


def _labels_text(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{val}"' for k, val in sorted(labels.items())) + "}" if labels else ""


def _is_openmetrics(text: str) -> bool:
    return bool(_EOF.search(text) or _EXEMPLAR.search(text))


_METADATA = re.compile(r"^(#\s+(?:TYPE|HELP|UNIT)\s+)(\S+)", re.MULTILINE)


def _families(text: str, openmetrics: bool) -> list:
    if not openmetrics:
        from prometheus_client.parser import text_string_to_metric_families

        return list(text_string_to_metric_families(text))
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    if not _EOF.search(text):  # exemplars but no terminator: OpenMetrics cut before its last line
        text = text.rstrip("\n") + "\n# EOF\n"
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        # prometheus_client 0.26's OpenMetrics writer spells sample names with '_' for ':'
        # (vllm_request_prompt_tokens_bucket) but keeps ':' in # TYPE lines, so its own parser
        # reads the samples as untyped and refuses their exemplars: spell the metadata alike
        escaped = _METADATA.sub(lambda m: m.group(1) + m.group(2).replace(":", "_"), text)
        if escaped == text:
            raise
        return list(text_string_to_metric_families(escaped))


def _bad_line(text: str, openmetrics: bool) -> tuple[int, str, str] | None:
    """(line number, line, reason) of the first sample line the parser refuses on its own."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            _families(s + "\n", openmetrics)
        except Exception as exc:  # the parser's own reason (ValueError, or IndexError on a torn line)
            return lineno, s, " ".join(str(exc).split()) or type(exc).__name__
    return None


def parse_exposition(text: str, source: str = "text") -> list[Sample]:
    """The samples of a Prometheus text or OpenMetrics exposition, parsed by ``prometheus_client``.

    Raises ``ValueError`` naming the source (and the line, where one line is to blame) of text
    the parser refuses, and of a sample given twice (same name and labels).
    """
    openmetrics = _is_openmetrics(text)
    try:
        families = _families(text, openmetrics)
    except Exception as exc:  # the parser raises ValueError, IndexError or TypeError on bad text
        kind = "OpenMetrics" if openmetrics else "Prometheus text"
        bad = _bad_line(text, openmetrics)
        if bad is not None:
            lineno, line, reason = bad
            raise ValueError(f"{source}: line {lineno} is not a Prometheus sample ({kind} format): "
                             f"{line[:80]!r} ({reason[:120]})") from None
        raise ValueError(f"{source}: not a valid {kind} exposition: {' '.join(str(exc).split())[:200]}") from None
    out, seen = [], set()
    for fam in families:
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen:
                raise ValueError(f"{source}: {s.name}{_labels_text(s.labels)} is given twice: which value "
                                 f"holds is ambiguous (two scrapes concatenated?)")
            seen.add(key)
            ts = None if s.timestamp is None else float(s.timestamp)
            out.append(Sample(name=s.name, labels=dict(s.labels), value=float(s.value), timestamp_s=ts))
    return out


def _same(a: str, b: str) -> bool:
    """Whether two metric names are one name (``:`` written as ``_``, as some exporters escape it)."""
    return a == b or a.replace(":", "_") == b.replace(":", "_")


def _named(samples: Sequence[Sample], *names: str) -> list[Sample]:
    """The samples named one of ``names`` (see :func:`_same`)."""
    return [s for s in samples if any(_same(s.name, n) for n in names)]


def _count(value: float, where: str) -> int:
    """A count read from a scrape as an int, or ``ValueError`` naming ``where``."""
    if not math.isfinite(value) or value < 0 or value > MAX_COUNT or value != math.floor(value):
        raise ValueError(f"{where} = {value!r}: a count must be a whole number in [0, 2**53]")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """A histogram summed over its label sets: upper bounds and counts per bucket.

    ``upper[i]`` is bucket ``i``'s ``le`` (the last is ``inf``); ``counts[i]`` the requests in
    ``(upper[i-1], upper[i]]`` (the first bucket starts at 0). ``series`` holds each label
    set's cumulative counts (for checks between two scrapes); ``source`` names the scrape.
    """

    name: str
    upper: np.ndarray
    counts: np.ndarray
    source: str = "text"
    series: dict | None = None

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def __sub__(self, earlier: Histogram) -> Histogram:
        where = f"{earlier.source} -> {self.source}: {self.name}"
        if not np.array_equal(self.upper, earlier.upper):
            raise ValueError(f"{where}: the two scrapes have different buckets "
                             f"({_bounds(earlier.upper)} vs {_bounds(self.upper)})")
        later_series, earlier_series = self.series or {}, earlier.series or {}
        for labels, before in earlier_series.items():
            after = later_series.get(labels)
            if after is None:
                raise ValueError(f"{where}{_labels_text(dict(labels))} is in the earlier scrape only: give scrapes "
                                 f"of one server run, the earlier first")
            fell = np.flatnonzero(after < before)
            if fell.size:
                i = int(fell[0])
                raise ValueError(f"{where}_bucket{_labels_text(dict(labels) | {'le': _le(self.upper[i])})} fell "
                                 f"from {int(before[i]):,} to {int(after[i]):,} between the scrapes (the server "
                                 f"restarted?); give scrapes of one server run, the earlier first")
        diff = self.counts - earlier.counts
        if (diff < 0).any():  # summed counts fell: only possible without series (hand-built histograms)
            i = int(np.flatnonzero(diff < 0)[0])
            raise ValueError(f"{where}: bucket le={_le(self.upper[i])} counts fell between the scrapes (the server "
                             f"restarted?); give scrapes of one server run, the earlier first")
        return Histogram(name=self.name, upper=self.upper, counts=diff, source=f"{earlier.source} -> {self.source}")


def _le(x: float) -> str:
    return "+Inf" if math.isinf(x) else f"{x:g}"


def _bounds(upper: np.ndarray) -> str:
    return ", ".join(_le(u) for u in upper[:6]) + (", ..." if upper.size > 6 else "")


def histogram(samples: Sequence[Sample], name: str, source: str = "text") -> Histogram:
    """The histogram ``name`` (``name_bucket`` samples) summed over label sets other than ``le``.

    Each label set's cumulative counts are checked (see the module docstring) before summing;
    every label set must have the same buckets, ending at ``+Inf``.
    """
    bucket = f"{name}_bucket"
    series: dict[tuple, dict[float, int]] = {}
    totals: dict[tuple, int] = {}
    for s in _named(samples, bucket, f"{name}_count"):
        if _same(s.name, bucket):
            where = f"{source}: {bucket}{_labels_text(s.labels)}"
            if "le" not in s.labels:
                raise ValueError(f"{where} has no le label")
            try:
                le = float(s.labels["le"])
            except ValueError:
                raise ValueError(f"{where}: le={s.labels['le']!r} is not a number") from None
            if math.isnan(le):
                raise ValueError(f"{where}: le is NaN")
            rest = tuple(sorted((k, val) for k, val in s.labels.items() if k != "le"))
            if le in series.get(rest, {}):  # the same bucket under both spellings of the name
                raise ValueError(f"{where} is given twice: which value holds is ambiguous")
            series.setdefault(rest, {})[le] = _count(s.value, where)
        else:
            totals[tuple(sorted(s.labels.items()))] = _count(s.value, f"{source}: {s.name}{_labels_text(s.labels)}")
    if not series:
        raise ValueError(f"{source}: no {bucket} samples; is this a vLLM server's /metrics?")
    upper = None
    cumulative = {}
    for rest, by_le in series.items():
        labels = dict(rest)
        ups = np.array(sorted(by_le))
        if not math.isinf(ups[-1]) or ups[-1] < 0:
            raise ValueError(f"{source}: {name}{_labels_text(labels)} has no le=\"+Inf\" bucket")
        if upper is None:
            upper, first = ups, labels
        elif not np.array_equal(ups, upper):
            raise ValueError(f"{source}: {name}{_labels_text(labels)} has buckets {_bounds(ups)}, "
                             f"{name}{_labels_text(first)} has {_bounds(upper)}: label sets must share buckets")
        c = np.array([by_le[u] for u in ups], dtype=np.int64)
        fell = np.flatnonzero(np.diff(c) < 0)
        if fell.size:
            i = int(fell[0]) + 1
            raise ValueError(f"{source}: {bucket}{_labels_text(labels | {'le': _le(ups[i])})} = {int(c[i]):,} is "
                             f"below the {int(c[i - 1]):,} of le={_le(ups[i - 1])}: cumulative bucket counts must "
                             f"not decrease with le")
        total = totals.get(rest)
        if total is not None and total != c[-1]:
            raise ValueError(f"{source}: {name}_count{_labels_text(labels)} = {total:,} but its le=\"+Inf\" bucket "
                             f"counts {int(c[-1]):,}: the two must be equal")
        cumulative[rest] = c
    if upper[0] < 1:  # lengths are >= 1 token: a bucket below 1 must be empty
        below = np.flatnonzero(upper < 1)[-1]
        nonzero = [dict(r) for r, c in cumulative.items() if c[below] > 0]
        if nonzero:
            raise ValueError(f"{source}: {bucket}{_labels_text(nonzero[0] | {'le': _le(upper[below])})} "
                             f"counts requests shorter than 1 token: not a token-length histogram")
        keep = upper >= 1
        upper, cumulative = upper[keep], {r: c[keep] for r, c in cumulative.items()}
    summed = np.sum(list(cumulative.values()), axis=0, dtype=np.int64)
    return Histogram(name=name, upper=upper, counts=np.diff(summed, prepend=0), source=source, series=cumulative)


def fit_histogram(h: Histogram, families: Sequence[str] = FAMILIES) -> FittedLength:
    """The family of ``families`` whose interval-censored fit to ``h`` has the lowest AIC
    (:func:`kvlab.lengths.fit.fit_binned`: the buckets are the intervals).

    Raises ``ValueError`` naming the histogram and its source where the data cannot support a
    fit: fewer than 2 requests, no finite bucket, or every request above the last finite bucket.
    """
    where = f"{h.source}: {h.name}"
    if h.total < 2:
        raise ValueError(f"{where}: {h.total} requests counted; need at least 2 to fit a distribution")
    if h.upper.size < 2:
        raise ValueError(f"{where} has only the le=\"+Inf\" bucket: it says how many requests there were, "
                         f"not how long they were; a length fit needs finite buckets")
    above = int(h.counts[-1])
    if 2 * above > h.total:
        share = "all" if above == h.total else f"{above:,} of"
        raise ValueError(f"{where}: {share} {h.total:,} requests are above the last finite bucket "
                         f"(le={_le(h.upper[-2])}): the histogram says only that they are longer, so their "
                         f"length distribution (its median included) cannot be supported by the data; give "
                         f"buckets that reach the longest lengths (vLLM's reach max_model_len)")
    return fit_binned(h.upper, h.counts, families)


def _bounded_ppf(fit: FittedLength, q: np.ndarray, where: str) -> np.ndarray:
    """Quantiles (tokens, continuous) of ``fit`` truncated at ``MAX_TRACE_TOKENS``; ``ValueError``
    naming ``where`` if the fit is degenerate (a quantile not finite) or puts most lengths above it."""
    with np.errstate(all="ignore"):
        dist = fit.dist
        top = float(dist.cdf(v.MAX_TRACE_TOKENS + 0.5))
        x = dist.ppf(np.asarray(q, dtype=np.float64) * top)
    shown = ", ".join(f"{k}={val:.4g}" for k, val in fit.params.items())
    if not np.isfinite(top) or top <= 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"{where}: the {fit.family} fit ({shown}) is degenerate: its quantiles are not finite lengths")
    if top < 0.5:
        raise ValueError(f"{where}: the {fit.family} fit ({shown}) puts {1 - top:.1%} of lengths above "
                         f"{v.MAX_TRACE_TOKENS:,} tokens, longer than any model's context: not a token-length "
                         f"histogram (buckets in other units?)")
    return np.minimum(x, v.MAX_TRACE_TOKENS)


def _draw(fit: FittedLength, n: int, seed: int, where: str) -> np.ndarray:
    u = np.random.default_rng(seed).random(n)
    return round_tokens(_bounded_ppf(fit, u, where))


def _percentiles(fit: FittedLength, where: str, q: Sequence[float] = (50, 90, 99)) -> dict[str, int]:
    """``{"p50": tokens, ...}`` of a fit (truncated as the draws are)."""
    x = quantile_tokens(_bounded_ppf(fit, np.asarray(q) / 100.0, where))
    return {f"p{p:g}": int(t) for p, t in zip(q, x)}


def _fit_notes(h: Histogram, fit: FittedLength, drawn: np.ndarray) -> list[str]:
    """Notes on what the draws rest on beyond the histogram: requests above its last finite
    bucket, one bucket holding every request, mass cut at ``MAX_TRACE_TOKENS``."""
    notes = [n for n in (_tail_note(h, drawn),) if n]
    full = np.flatnonzero(h.counts)
    if full.size == 1:
        lo = 0.0 if full[0] == 0 else h.upper[full[0] - 1]
        notes.append(f"{h.name}: all {h.total:,} requests are in one bucket ({_le(lo)}, {_le(h.upper[full[0]])}] "
                     f"tokens: the data say nothing of their spread within it, so the fit's {fit.family} shape "
                     f"(median {int(np.median(drawn)):,} tokens) is an assumption")
    with np.errstate(all="ignore"):
        cut = 1.0 - float(fit.dist.cdf(v.MAX_TRACE_TOKENS + 0.5))
    if cut > 0.01:
        notes.append(f"{h.name}: the fit puts {cut:.1%} of lengths above {v.MAX_TRACE_TOKENS:,} tokens (longer than "
                     f"any model's context); draws are cut there")
    return notes


def _tail_note(h: Histogram, drawn: np.ndarray) -> str | None:
    """A note on the requests counted above the last finite bucket, whose lengths the fit invents."""
    above = int(h.counts[-1])
    if not above:
        return None
    last = h.upper[-2]
    share = above / h.total
    return (f"{h.name}: {above:,} of {h.total:,} requests ({share:.1%}) are counted only as longer than the last "
            f"finite bucket (le={_le(last)} tokens); their lengths come from the fitted tail, which the histogram "
            f"cannot check ({int(np.count_nonzero(drawn > last)):,} draws above {_le(last)}, longest "
            f"{int(drawn.max()):,} tokens)")


def _read(source: str | Path) -> tuple[str, str]:
    """(text, name) of a path or an exposition text."""
    if not isinstance(source, (str, Path)):
        raise ValueError(f"a Prometheus scrape must be a path or exposition text, got {type(source).__name__}")
    if isinstance(source, Path) or "\n" not in source:  # a path (text always has a newline)
        return v.read_text_file(source, "Prometheus scrape", max_bytes=MAX_SCRAPE_BYTES), str(source)
    return source, "text"


def is_exposition(path: str | Path) -> bool:
    """Whether a file looks like a Prometheus exposition (``# TYPE`` lines or vLLM metrics),
    gzip-compressed or not, in UTF-8, UTF-16 or UTF-32 (judged from its first 64 kB)."""
    import gzip
    import zlib

    p = Path(path)
    if not p.is_file():
        return False
    try:
        with p.open("rb") as fh:
            head = fh.read(65536)
        if head.startswith(b"\x1f\x8b"):
            with gzip.open(p, "rb") as fh:
                head = fh.read(65536)
    except (OSError, EOFError, zlib.error):
        return False
    enc = next((e for bom, e in ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
                                 (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16")) if head.startswith(bom)), "utf-8")
    text = head.decode(enc, errors="replace")
    return "# TYPE " in text or f"{PROMPT}_bucket" in text


def _counter(samples: Sequence[Sample], name: str, source: str) -> tuple[dict[str, int], float | None]:
    """Counter value by ``finished_reason`` and the latest timestamp seen (s)."""
    by: dict[str, int] = {}
    mine = _named(samples, name)
    ts = [s.timestamp_s for s in mine if s.timestamp_s is not None]
    for s in mine:
        key = s.labels.get("finished_reason", "")
        by[key] = by.get(key, 0) + _count(s.value, f"{source}: {name}{_labels_text(s.labels)}")
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
        A missing histogram, a malformed line or count (named with file, metric and bucket),
        scrapes of different servers or runs, two scrapes without timestamps or ``interval_s``,
        or histograms that cannot support a fit.
    """
    seed = v.nonnegative_int(seed, "seed")
    if num_requests is not None:
        num_requests = v.positive_int(num_requests, "num_requests", maximum=v.MAX_REQUESTS)
    text1, name1 = _read(first)
    s1 = parse_exposition(text1, name1)
    hp, ho = histogram(s1, PROMPT, name1), histogram(s1, OUTPUT, name1)
    done1, ts1 = _counter(s1, SUCCESS, name1)
    rate = interval = None
    source = name1
    finished = done1
    if second is not None:
        text2, name2 = _read(second)
        s2 = parse_exposition(text2, name2)
        hp, ho = histogram(s2, PROMPT, name2) - hp, histogram(s2, OUTPUT, name2) - ho
        done2, ts2 = _counter(s2, SUCCESS, name2)
        finished = {}
        for k in sorted(set(done1) | set(done2)):
            if done2.get(k, 0) < done1.get(k, 0):
                raise ValueError(f"{name1} -> {name2}: {SUCCESS}{{finished_reason=\"{k}\"}} fell from "
                                 f"{done1.get(k, 0):,} to {done2.get(k, 0):,} between the scrapes (the server "
                                 f"restarted?); give scrapes of one server run, the earlier first")
            finished[k] = done2.get(k, 0) - done1.get(k, 0)
        if interval_s is not None:
            interval = v.positive_float(interval_s, "interval_s")
        elif ts1 is not None and ts2 is not None:
            if ts2 <= ts1:
                raise ValueError(f"{name1}, {name2}: the second scrape's timestamps ({ts2:.3f} s) are not later "
                                 f"than the first's ({ts1:.3f} s): give the earlier scrape first")
            interval = ts2 - ts1
        else:
            raise ValueError(f"{name1}, {name2}: the samples carry no timestamps; give interval_s (seconds "
                             f"between the scrapes)")
        total = sum(finished.values()) if finished else ho.total
        rate = total / interval if total > 0 else None
        source = f"{name1} -> {name2}"
    elif interval_s is not None:
        raise ValueError("interval_s is for two scrapes; one scrape gives no rate")
    prompt_fit, output_fit = fit_histogram(hp), fit_histogram(ho)
    where_p, where_o = f"{source}: {PROMPT}", f"{source}: {OUTPUT}"
    observed = min(hp.total, ho.total)
    n = min(observed, MAX_REQUESTS) if num_requests is None else num_requests
    prompt, output = _draw(prompt_fit, n, seed, where_p), _draw(output_fit, n, seed + 1, where_o)
    table = {"prompt_tokens": prompt, "output_tokens": output, "censored": np.zeros(n, dtype=bool)}
    if rate is not None:
        table["arrival_s"] = arrival_times(n, "poisson", qps=rate, seed=seed)
    df = pd.DataFrame(table)
    length = finished.get("length", 0)
    notes = [f"{n:,} requests drawn from interval-censored fits to the histograms of {observed:,} requests "
             f"(prompt: {prompt_fit.family}, output: {output_fit.family}); prompt and output drawn independently",
             "arrivals: Poisson at the counters' rate" if rate is not None else
             "no rate: one scrape (give a second scrape, or qps)"]
    notes += _fit_notes(hp, prompt_fit, prompt) + _fit_notes(ho, output_fit, output)
    if length:
        notes.append(f"{length:,} requests finished at their max_tokens (finished_reason=length): their "
                     f"true output lengths are longer")
    df.attrs.update({"source": source, "format": "prometheus", "dropped_rows": 0,
                     "failed_requests": int(finished.get("abort", 0)), "detected_cap_tokens": None,
                     "notes": notes,
                     "prometheus": {"observed_requests": observed, "rate_per_s": rate, "interval_s": interval,
                                    "prompt_fit": {"family": prompt_fit.family, **prompt_fit.params,
                                                   **_percentiles(prompt_fit, where_p)},
                                    "output_fit": {"family": output_fit.family, **output_fit.params,
                                                   **_percentiles(output_fit, where_o)},
                                    "finished": finished}})
    return v.request_table(df, source)


__all__ = ["Histogram", "Sample", "fit_histogram", "from_prometheus", "histogram", "is_exposition",
           "parse_exposition"]
