"""Claims-table verdicts, worked by hand: the source's set-up, both cost models, the +-30% default."""
import math

import pytest

from kvlab import claims as c


def test_close_holds_within_the_tolerance_and_says_by_how_much_otherwise():
    assert c.close("x", "s", 2.6, 2.8, rel_tol=0.1).verdict == "holds"           # +7.7%
    assert c.close("x", "s", 2.6, 3.65, rel_tol=0.25).verdict == "differs (+40%)"
    assert c.close("x", "s", 5.6, 2.0, note="why").verdict == "differs (-64%); why"
    # the default is +-30%: 3.3 is +27% of 2.6, 3.5 is +35%
    assert c.close("x", "s", 2.6, 3.3).verdict == "holds"
    assert c.close("x", "s", 2.6, 3.5).verdict == "differs (+35%)"
    assert c.close("x", "s", 2.6, 3.3).kind == "holds" and c.close("x", "s", 2.6, 3.5).kind == "differs"


def test_thresholds_and_the_sources_own_range():
    assert c.at_least("x", "s", 0.5, 0.554).verdict == "holds"
    assert c.at_least("x", "s", 0.99, 0.977).verdict == "differs (0.977 < 0.99)"
    assert c.at_most("x", "s", 1.2, 6.82).verdict == "differs (6.82 > 1.2)"
    assert c.at_most("x", "s", 1.2, 1.2).verdict == "holds"
    assert c.in_range("x", "s", 1.7, 2.7, 2.0, unit="x").verdict == "holds"
    assert c.in_range("x", "s", 1.7, 2.7, 1.36, unit="x").verdict == "differs (1.36x below 1.7-2.7x)"
    assert c.in_range("x", "s", 2.7, 8, 8.5).claimed == "2.7-8"
    with pytest.raises(ValueError, match="low <= high"):
        c.in_range("x", "s", 3, 2, 2.5)


def test_an_interval_over_seeds_straddling_the_threshold_is_inconclusive():
    # Mistral's 2.6x at +-30% accepts 1.82-3.38: seeds at 3.35 and 3.56 straddle 3.38 (issue 23's flip)
    row = c.close("x", "s", 2.6, [3.35, 3.56, 3.41])
    assert row.kind == "inconclusive"
    assert row.verdict == "inconclusive (3.35-3.56 over 3 seeds straddles 3.38)"
    assert row.kvlab_value == "3.44 (3.35-3.56 over 3 seeds)" and row.kind not in ("holds", "differs")
    # wholly inside or wholly outside the accepted region decides
    assert c.close("x", "s", 2.6, [2.5, 2.9, 3.3]).kind == "holds"
    assert c.close("x", "s", 2.6, [3.4, 3.6]).verdict == "differs (+35%)"
    assert c.at_least("x", "s", 1.0, [0.9, 1.1]).kind == "inconclusive"
    assert c.in_range("x", "s", 1.7, 2.7, [1.5, 3.0]).verdict == "inconclusive (1.5-3 over 2 seeds straddles 1.7 and 2.7)"
    # per cost model: one inconclusive, one holds -> mixed
    both = c.close("x", "s", 2.0, {"roofline": [1.9, 2.1], "measured": [2.5, 2.7]})
    assert both.kind == "mixed" and both.roofline == pytest.approx(2.0)
    assert both.verdict == "roofline: holds; measured: inconclusive (2.5-2.7 over 2 seeds straddles 2.6)"


def test_arithmetic_claims_hold_within_two_percent_or_differ_with_the_cause():
    cause = "kvlab reserves 10% of memory for activations"
    assert c.exact("slots", "s", 15_700, 15_500, cause=cause).kind == "holds"      # -1.3%
    row = c.exact("slots", "s", 15_700, 14_475, cause=cause)                       # -7.8%: +-30% would say holds
    assert row.kind == "differs" and row.verdict == f"differs (-7.8%: {cause})"
    assert row.claim_type == "arithmetic" and c.close("x", "s", 15_700, 14_475).kind == "holds"
    assert c.exact("n", "s", 125, 125, cause=cause, rel_tol=0).verdict == "holds"
    with pytest.raises(ValueError, match="cause"):
        c.exact("slots", "s", 15_700, 14_475, cause="")
    with pytest.raises(ValueError, match="0-0.02"):
        c.exact("slots", "s", 15_700, 14_475, cause=cause, rel_tol=0.3)


def test_a_stand_in_row_gets_no_holds_or_differs():
    fitted = c.Inputs(trace="sarathi-sharegpt", trace_kind="fitted profile", num_requests=2048,
                      source_num_requests=2048, metric="capacity", read_from="kvlab.capacity")
    row = c.close("x", "s", 2.6, 2.6, inputs=fitted)
    assert row.kind == "stand-in" and not row.verdict.startswith(("holds", "differs"))
    assert row.verdict.startswith("stand-in: ran on the fitted profile sarathi-sharegpt, not the trace")
    assert row.trace == "sarathi-sharegpt (fitted profile)" and row.trial_size == "2,048 requests (source: 2,048)"
    # a smaller trial than the source's, or a stated difference, is a stand-in too
    small = c.Inputs(trace="chat.csv", trace_kind="source's own", num_requests=32, source_num_requests=2048)
    assert c.close("x", "s", 2.6, 9.0, inputs=small).verdict.startswith(
        "stand-in: 32 requests per trial (source: 2,048)")
    arxiv = c.Inputs(trace="arxiv.csv", trace_kind="stand-in", differs=("4k stand-in (paper: 16k)",))
    assert c.at_least("x", "s", 1, 2, inputs=arxiv).kind == "stand-in"
    # the source's own inputs are judged
    own = c.Inputs(trace="chat.csv", trace_kind="source's own", num_requests=2048, source_num_requests=2048)
    assert c.close("x", "s", 2.6, 2.6, inputs=own).kind == "holds"
    # a sensitivity run with the source's input in place that gives the same verdict lets it stand ...
    same = c.Inputs(trace="p", trace_kind="fitted profile", sensitivity=2.7, sensitivity_run="the trace itself")
    row = c.close("x", "s", 2.6, 2.5, inputs=same)
    assert row.kind == "holds" and "does not change it: the trace itself gives 2.7 (the same verdict)" in row.verdict
    # the same kind of verdict counts, not the same number: both differ here
    far = c.Inputs(trace="p", trace_kind="fitted profile", sensitivity=5.0, sensitivity_run="the trace itself")
    assert c.close("x", "s", 2.6, 4.0, inputs=far).kind == "differs"
    # ... and one that changes it does not
    flips = c.Inputs(trace="p", trace_kind="fitted profile", sensitivity=4.0, sensitivity_run="the trace itself")
    assert c.close("x", "s", 2.6, 2.5, inputs=flips).kind == "stand-in"
    with pytest.raises(ValueError, match="trace_kind"):
        c.Inputs(trace="x", trace_kind="real")


def test_both_cost_models_each_judged():
    both = c.close("x", "s", 2.0, {"roofline": 1.9, "measured": 2.2})
    assert both.verdict == "holds under roofline and measured" and both.kind == "holds"
    assert (both.roofline, both.measured) == (1.9, 2.2)
    assert both.kvlab_value == "1.9 (roofline), 2.2 (measured)"
    split = c.in_range("x", "s", 1.7, 2.7, {"roofline": 1.36, "measured": 2.0}, unit="x")
    assert split.verdict == "roofline: differs (1.36x below 1.7-2.7x); measured: holds" and split.kind == "mixed"
    missing = c.close("x", "s", 2.0, {"roofline": 2.1, "measured": None})
    assert missing.verdict == "roofline: holds; measured: not run" and math.isnan(missing.measured)
    assert missing.kvlab_value == "2.1 (roofline), n/a (measured)" and missing.kind == "holds"
    with pytest.raises(ValueError, match="unknown cost models"):
        c.close("x", "s", 2.0, {"vidur": 2.0})


def test_unjudged_rows_name_what_is_missing():
    row = c.not_reproducible("x", "s", "2.31x", "TIE's model and GPU are not stated", value={"roofline": 0.9},
                             source_setup=c.SetUp(model="?", workload="LMSYS-Chat-1M"))
    assert row.verdict == "not reproducible here: TIE's model and GPU are not stated" and row.kind == "not reproducible"
    assert row.kvlab_value == "stand-in: 0.9 (roofline)" and row.roofline == 0.9
    assert row.source_setup == "?; LMSYS-Chat-1M"
    with pytest.raises(ValueError, match="missing"):
        c.not_reproducible("x", "s", "2x", "")
    swap = c.not_testable("x", "s", "<= 1.2x", "host-link copies of block size unmeasured", value=6.3, unit="x")
    assert swap.kind == "not testable" and swap.kvlab_value == "unmeasured model: 6.3x"
    assert c.reported("x", "s", "~4,000", "3 of 5 rows").verdict == "reported: 3 of 5 rows"


def test_setup_describes_what_the_figure_rests_on_and_the_table_keeps_it():
    s = c.SetUp(model="OPT-13B", gpu="A100-40GB", workload="ShareGPT (vLLM paper)", scheduler="prefill-first",
                metric="capacity", slo="normalized latency <= 0.2 s/token")
    assert s.describe() == ("OPT-13B on 1 x A100-40GB (TP1-PP1); ShareGPT (vLLM paper); prefill-first; "
                            "metric: capacity; SLO: normalized latency <= 0.2 s/token")
    assert c.SetUp(model="Falcon-180B", gpu="A100-80GB-PCIe", tp=4, pp=2).describe() == \
        "Falcon-180B on 8 x A100-80GB-PCIe (TP4-PP2)"
    t = c.table([c.at_least("a", "s", 1, 2, source_setup=s, kvlab_setup=s), c.at_most("b", "s", 1, 2)])
    assert set(c.SHOWN) <= set(t.columns) and {"kind", "claim_type", "roofline", "measured"} <= set(t.columns)
    assert t["claimed"].tolist() == [">= 1", "<= 1"] and t["kind"].tolist() == ["holds", "differs"]
    assert t["source_setup"].iloc[0] == s.describe() and t["kvlab_setup"].iloc[1] == ""
