"""kvlab.sim.metrics: summary percentiles of token gaps without expanding them; the summary of a run that keeps
only the iteration columns it reads."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvlab.sim import simulate
from kvlab.sim.metrics import SUMMARY_ITERATION_COLUMNS, _weighted_percentiles

from test_prefix_cache_fuzz import COST as PREFIX_COST, cases as prefix_cases
from test_sim_fast_equivalence import random_case


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


def _summary_or_error(work, policy: str, engine: str, record: bool, **kw):
    """The run's summary (with its iteration table) or the first clause of the error it stops on."""
    try:
        res = simulate(work, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", engine=engine, record_iterations=record,
                       **kw)
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc).split(':')[0]}", None
    return res.summary, res.iterations


def _assert_same_summary(ref, got) -> None:
    if isinstance(ref, str):
        assert got == ref
        return
    assert list(got) == list(ref)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=0, nan_ok=True), key


@pytest.mark.parametrize("seed", range(60))
def test_summary_without_iterations_equals_the_references(seed):
    """The fast engine asked for the summary only (its loop writes only the iteration columns the
    summary reads) gives the reference's summary, figure for figure, on the equivalence suite's cases."""
    work, policy, kw = random_case(seed)
    ref, ref_iterations = _summary_or_error(work, policy, "reference", True, **kw)
    got, got_iterations = _summary_or_error(work, policy, "fast", False, **kw)
    assert got_iterations is None
    if ref_iterations is not None:
        assert set(SUMMARY_ITERATION_COLUMNS) < set(ref_iterations.columns)
    _assert_same_summary(ref, got)


@settings(max_examples=60, deadline=None)
@given(prefix_cases())
def test_summary_without_iterations_equals_the_references_under_prefix_caching(case):
    """The same under prefix caching (the summary then reads the prefix iteration columns too)."""
    work, policy, kw = case
    kw = {**kw, "cost_model": PREFIX_COST, "prefix_caching": True}
    ref, _ = _summary_or_error(work, policy, "reference", True, **kw)
    got, _ = _summary_or_error(work, policy, "fast", False, **kw)
    _assert_same_summary(ref, got)
