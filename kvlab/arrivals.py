"""Request arrival times: offline, Poisson at a rate, or gamma-bursty with a coefficient of variation.

Inter-arrival gaps are drawn on the host with ``numpy.random.default_rng(seed)``; the first
request arrives after one gap (a Poisson process started at time 0).
"""
from __future__ import annotations

import numpy as np

from . import _validate as v

KINDS = ("offline", "poisson", "gamma")


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
