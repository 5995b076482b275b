"""kvlab.sim.metrics: summary percentiles of token gaps without expanding them."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvlab.sim.metrics import _weighted_percentiles


@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(0, 6)), min_size=1, max_size=30),
       st.lists(st.sampled_from([0, 1, 50, 90, 99, 100]), min_size=1, max_size=4))
def test_weighted_percentiles_equal_numpy_on_the_expanded_sample(pairs, qs):
    values = np.array([p[0] for p in pairs])
    counts = np.array([p[1] for p in pairs])
    expanded = np.repeat(values, counts)
    got = _weighted_percentiles(values, counts, tuple(qs))
    if expanded.size == 0:
        assert all(np.isnan(g) for g in got)
    else:
        assert got == pytest.approx([float(np.percentile(expanded, q)) for q in qs], rel=1e-12, abs=1e-12)
