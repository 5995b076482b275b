"""kvlab._intmath: the one ceiling division and the one rounding rule, against independent forms."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, strategies as st

from kvlab._intmath import ceil_div, quantile_tokens, round_tokens


@given(a=st.integers(0, 10**18), b=st.integers(1, 10**9))
def test_ceil_div_is_the_exact_ceiling(a, b):
    assert ceil_div(a, b) == math.ceil(Fraction(a, b))
    assert isinstance(ceil_div(a, b), int)


def test_ceil_div_on_arrays_keeps_the_dtype():
    got = ceil_div(np.array([0, 1, 16, 17, 32], dtype=np.int64), 16)
    assert got.dtype == np.int64
    assert got.tolist() == [0, 1, 1, 2, 2]


def test_round_tokens_ties_go_up_and_counts_start_at_one():
    # Hand-worked: half-up, unlike NumPy's half-to-even rint (which gives 2, 2, 4).
    assert round_tokens([1.5, 2.5, 3.5]).tolist() == [2, 3, 4]
    assert round_tokens([0.0, 0.49, 1.49, 7.2]).tolist() == [1, 1, 1, 7]


@given(x=st.floats(0.0, 1e6, allow_nan=False))
def test_quantile_tokens_is_the_smallest_count_whose_interval_reaches_x(x):
    # Count k collects [k - 0.5, k + 0.5) (k >= 2) and [0, 1.5) (k = 1): the q-quantile of the
    # count is the smallest k with k + 0.5 >= x, the continuous quantile.
    k = int(quantile_tokens(x))
    assert k >= 1 and k + 0.5 >= x
    assert k == 1 or (k - 1) + 0.5 < x
    # Away from ties the quantile and the rounding agree.
    if x % 1.0 != 0.5:
        assert k == int(round_tokens(x))
