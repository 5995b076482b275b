"""Claims-table verdicts, worked by hand: the source's set-up, both cost models, the +-30% default."""
import math

import pytest

from kvlab import claims as c


def test_close_holds_within_the_tolerance_and_says_by_how_much_otherwise():
    assert c.close("x", "s", 2.6, 2.8, rel_tol=0.1).verdict == "holds"           # +7.7%
    assert c.close("x", "s", 2.6, 3.65, rel_tol=0.25).verdict == "differs (+40%)"
    assert c.close("x", "s", 125, 125, rel_tol=0.0).verdict == "holds"
    assert c.close("x", "s", 5.6, 2.0, note="why").verdict == "differs (-64%); why"
    # the default is +-30%: 3.3 is +27% of 2.6, 3.5 is +35%
    assert c.close("x", "s", 2.6, 3.3).verdict == "holds"
    assert c.close("x", "s", 2.6, 3.5).verdict == "differs (+35%)"


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


def test_both_cost_models_each_judged():
    both = c.close("x", "s", 2.0, {"roofline": 1.9, "measured": 2.2})
    assert both.verdict == "holds under roofline and measured"
    assert (both.roofline, both.measured) == (1.9, 2.2)
    assert both.kvlab_value == "1.9 (roofline), 2.2 (measured)"
    split = c.in_range("x", "s", 1.7, 2.7, {"roofline": 1.36, "measured": 2.0}, unit="x")
    assert split.verdict == "roofline: differs (1.36x below 1.7-2.7x); measured: holds"
    missing = c.close("x", "s", 2.0, {"roofline": 2.1, "measured": None})
    assert missing.verdict == "roofline: holds; measured: not run" and math.isnan(missing.measured)
    assert missing.kvlab_value == "2.1 (roofline), n/a (measured)"
    with pytest.raises(ValueError, match="unknown cost models"):
        c.close("x", "s", 2.0, {"vidur": 2.0})


def test_not_reproducible_names_what_is_missing_and_judges_no_stand_in():
    row = c.not_reproducible("x", "s", "2.31x", "TIE's model and GPU are not stated", value={"roofline": 0.9},
                             source_setup=c.SetUp(model="?", workload="LMSYS-Chat-1M"))
    assert row.verdict == "not reproducible here: TIE's model and GPU are not stated"
    assert row.kvlab_value == "stand-in: 0.9 (roofline)" and row.roofline == 0.9
    assert row.source_setup == "?; LMSYS-Chat-1M"
    with pytest.raises(ValueError, match="missing"):
        c.not_reproducible("x", "s", "2x", "")


def test_setup_describes_what_the_figure_rests_on_and_the_table_keeps_it():
    s = c.SetUp(model="OPT-13B", gpu="A100-40GB", workload="ShareGPT (vLLM paper)", scheduler="prefill-first",
                metric="capacity", slo="normalized latency <= 0.2 s/token")
    assert s.describe() == ("OPT-13B on 1 x A100-40GB (TP1-PP1); ShareGPT (vLLM paper); prefill-first; "
                            "metric: capacity; SLO: normalized latency <= 0.2 s/token")
    assert c.SetUp(model="Falcon-180B", gpu="A100-80GB-PCIe", tp=4, pp=2).describe() == \
        "Falcon-180B on 8 x A100-80GB-PCIe (TP4-PP2)"
    t = c.table([c.at_least("a", "s", 1, 2, source_setup=s, kvlab_setup=s), c.at_most("b", "s", 1, 2)])
    assert t.columns.tolist() == ["claim", "source", "source_setup", "kvlab_setup", "claimed", "kvlab_value",
                                  "roofline", "measured", "verdict"]
    assert t["claimed"].tolist() == [">= 1", "<= 1"]
    assert t["source_setup"].iloc[0] == s.describe() and t["kvlab_setup"].iloc[1] == ""
