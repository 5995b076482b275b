"""Request arrival times: offline, Poisson at a rate, or gamma-bursty with a coefficient of variation;
a trace's own arrival process measured (:func:`gap_cv`) and scaled in time (:func:`time_compressed`).

Inter-arrival gaps are drawn on the host with ``numpy.random.default_rng(seed)``; the first
request arrives after one gap (a Poisson process started at time 0).

The burstiness of a trace is the coefficient of variation (CV, standard deviation / mean) of
its gaps between consecutive arrivals: 1 for Poisson arrivals, above 1 for bursty traffic
(Gamma gaps of shape ``k`` have CV ``1 / sqrt(k)``). :data:`PROCESSES` names the arrival
processes a capacity search can scale (:func:`kvlab.capacity.capacity`).
"""
from __future__ import annotations

import numpy as np

from . import _validate as v

KINDS = ("offline", "poisson", "gamma")
#: Arrival processes a capacity search scales to a rate: Poisson, the trace's own times
#: time-compressed, or a Gamma renewal with the trace's measured gap CV.
PROCESSES = ("poisson", "replay", "gamma")


def _times(arrival_s: object, what: str, min_n: int) -> np.ndarray:
    t = np.asarray(arrival_s, dtype=np.float64).ravel()
    if t.size < min_n or not np.isfinite(t).all():
        raise ValueError(f"{what} needs at least {min_n} finite arrival times, got {t.size}"
                         + ("" if np.isfinite(t).all() else " with NaN or infinite ones"))
    t = np.sort(t)
    if t[-1] <= t[0]:
        raise ValueError(f"{what}: every arrival time is the same ({t[0]:g} s): the trace is offline")
    return t


def gap_cv(arrival_s: object) -> float:
    """Coefficient of variation of the gaps between consecutive arrivals (std / mean, no unit).

    1 for a Poisson process, larger for bursty traffic; the moment estimate a Gamma renewal
    process with the same CV reproduces (shape ``1 / cv**2``).

    Examples
    --------
    >>> round(gap_cv([0.0, 1.0, 2.0, 3.0]), 6)  # evenly spaced: no variation
    0.0
    """
    gaps = np.diff(_times(arrival_s, "gap_cv", 3))
    return float(gaps.std() / gaps.mean())


def time_compressed(arrival_s: object, qps: float) -> np.ndarray:
    """The arrival times moved to start at 0 and scaled so they offer ``qps`` requests/s.

    The offered rate is ``(n - 1) / (last - first)`` (:func:`kvlab.trace_window.offered_rate_per_s`);
    every gap is multiplied by the same factor, so the trace's bursts keep their shape.

    Examples
    --------
    >>> time_compressed([10.0, 11.0, 14.0], qps=2.0).tolist()  # 2 gaps over 4 s -> over 1 s
    [0.0, 0.25, 1.0]
    """
    qps = v.positive_float(qps, "qps")
    t = np.asarray(arrival_s, dtype=np.float64).ravel()
    ts = _times(t, "time_compressed", 2)
    own = (ts.size - 1) / (ts[-1] - ts[0])
    return (t - ts[0]) * (own / qps)


def arrival_times(num_requests: int, kind: str = "offline", *, qps: float | None = None, cv: float = 1.0,
                  seed: int = 0) -> np.ndarray:
    """Arrival times of ``num_requests`` requests (seconds since the start).

    Parameters
    ----------
    num_requests : int
        Requests (> 0).
    kind : {"offline", "poisson", "gamma"}
        ``offline``: all at 0. ``poisson``: exponential gaps with mean ``1 / qps``. ``gamma``:
        gamma gaps with mean ``1 / qps`` and coefficient of variation ``cv`` (shape ``1 / cv^2``;
        ``cv = 1`` is Poisson, larger is burstier).
    qps : float
        Mean request rate (requests/s), needed for ``poisson`` and ``gamma``.
    cv : float
        Coefficient of variation of the gaps for ``gamma`` (> 0).
    seed : int
        Seed of the host generator.

    Raises
    ------
    ValueError
        A parameter the kind would ignore (``qps`` for offline, ``cv`` other than 1 for all but
        gamma), rather than a result that silently differs from what was asked.

    Examples
    --------
    >>> arrival_times(3, "poisson", qps=2.0, seed=0).round(3).tolist()
    [0.34, 0.85, 0.86]
    """
    n = v.positive_int(num_requests, "num_requests")
    kind = v.choice(kind, "arrivals", KINDS)
    if kind != "gamma" and cv != 1.0:
        raise ValueError(f"cv={cv!r} is used only with gamma arrivals, not {kind!r}")
    if kind == "offline":
        if qps is not None:
            raise ValueError(f"qps={qps!r} is ignored by offline arrivals (all at 0); choose 'poisson' or 'gamma'")
        return np.zeros(n)
    if qps is None:
        raise ValueError(f"qps must be given for {kind} arrivals (requests/s)")
    qps = v.positive_float(qps, "qps")
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        gaps = rng.exponential(1.0 / qps, n)
    else:
        cv = v.positive_float(cv, "cv")
        shape = 1.0 / cv**2
        gaps = rng.standard_gamma(shape, size=n) * (1.0 / (qps * shape))   # gamma, mean 1 / qps
    return np.cumsum(gaps)
