"""Integer arithmetic kvlab does in one way only: ceiling division and rounding to token counts.

Rounding rule
-------------
A continuous length ``x`` (tokens) becomes the integer count ``k = max(floor(x + 0.5), 1)``:
the nearest integer with ties rounded **up** (half-up, not NumPy's half-to-even ``rint``), and
at least 1 because a request generates at least one token. Count ``k >= 2`` therefore collects
the interval ``[k - 0.5, k + 0.5)`` and ``k = 1`` everything below 1.5: the interval model every
length likelihood and cdf in kvlab uses (:mod:`kvlab.lengths.fit`, :mod:`kvlab.predict`). Its
quantile is :func:`quantile_tokens`: the smallest ``k`` whose interval reaches ``x``.

Every function takes Python ints, NumPy or CuPy arrays alike (only ``//``, ``-`` and the array's
own methods), so the simulator's array code can call them on the device.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def ceil_div(numerator: Any, denominator: Any) -> Any:
    """``ceil(numerator / denominator)`` for integers, exactly (no float division).

    Works on Python ints (returns an int) and on integer arrays of any array module (returns an
    array of the same module), as ``-(-numerator // denominator)``; ``denominator > 0``.

    Examples
    --------
    >>> ceil_div(33, 16), ceil_div(32, 16), ceil_div(0, 16)
    (3, 2, 0)
    """
    return -(-numerator // denominator)


def round_tokens(x: Any) -> np.ndarray:
    """Continuous lengths ``x`` (tokens) as counts: ``max(floor(x + 0.5), 1)`` (int64 tokens).

    The one rounding rule of kvlab (ties up, at least one token; see the module docstring).

    Examples
    --------
    >>> round_tokens([0.2, 1.5, 2.5, 2.49]).tolist()
    [1, 2, 3, 2]
    """
    x = np.asarray(x, dtype=np.float64)
    return np.maximum(np.floor(x + 0.5), 1.0).astype(np.int64)


def quantile_tokens(x: Any) -> np.ndarray:
    """The smallest count whose rounding interval reaches ``x``: ``max(ceil(x - 0.5), 1)`` (int64).

    If ``x`` is the ``q``-quantile of a continuous length, this is the ``q``-quantile of the
    count :func:`round_tokens` makes of it: the smallest ``k`` with ``P(K <= k) >= q``.

    Examples
    --------
    >>> quantile_tokens([0.2, 1.5, 2.5, 2.51]).tolist()
    [1, 1, 2, 3]
    """
    x = np.asarray(x, dtype=np.float64)
    return np.maximum(np.ceil(x - 0.5), 1.0).astype(np.int64)


__all__ = ["ceil_div", "quantile_tokens", "round_tokens"]
