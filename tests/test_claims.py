"""Claims-table verdicts, worked by hand."""
from kvlab import claims as c


def test_close_holds_within_the_tolerance_and_says_by_how_much_otherwise():
    assert c.close("x", "s", 2.6, 2.8, rel_tol=0.1).verdict == "holds"           # +7.7%
    assert c.close("x", "s", 2.6, 3.65, rel_tol=0.25).verdict == "differs (+40%)"
    assert c.close("x", "s", 125, 125, rel_tol=0.0).verdict == "holds"
    assert c.close("x", "s", 5.6, 2.0, note="why").verdict == "differs (-64%); why"


def test_thresholds():
    assert c.at_least("x", "s", 0.5, 0.554).verdict == "holds"
    assert c.at_least("x", "s", 0.99, 0.977).verdict == "differs (0.977 < 0.99)"
    assert c.at_most("x", "s", 1.2, 6.82).verdict == "differs (6.82 > 1.2)"
    assert c.at_most("x", "s", 1.2, 1.2).verdict == "holds"
    t = c.table([c.at_least("a", "s", 1, 2), c.at_most("b", "s", 1, 2)])
    assert t.columns.tolist() == ["claim", "source", "claimed", "kvlab_value", "verdict"]
    assert t["claimed"].tolist() == [">= 1", "<= 1"]
