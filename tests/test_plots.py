"""kvlab.plots: the shared figure helpers (ties, log scales, marked points, files beside results)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvlab import plots


def test_tie_groups_names_the_settings_that_share_a_point():
    df = pd.DataFrame({"goodput": [10.0, 10.0, 12.0, 10.0, 12.0, 7.0],
                       "p99_tbt_s": [0.05, 0.05, 0.05, 0.06, 0.05, 0.05],
                       "setting": ["a", "b", "c", "d", "e", "f"]})
    ties = plots.tie_groups(df, "goodput", "p99_tbt_s", "setting")
    # a and b share (10, 0.05); c and e share (12, 0.05); d and f stand alone
    assert sorted(map(tuple, ties[["count", "labels"]].values.tolist())) == [(2, "a, b"), (2, "c, e")]
    with pytest.raises(ValueError, match="no column 'nope'"):
        plots.tie_groups(df, "goodput", "nope", "setting")


def test_label_ties_annotates_each_tie_once():
    df = pd.DataFrame({"x": [1.0, 1.0, 1.0, 2.0], "y": [3.0, 3.0, 3.0, 4.0], "name": ["p50", "p90", "p99", "max"]})
    fig, ax = plt.subplots()
    ax.scatter(df.x, df.y)
    plots.label_ties(ax, df, "x", "y", "name")
    assert [t.get_text() for t in ax.texts] == ["3 tie: p50, p90, p99"]
    plt.close(fig)


def test_log_if_spans_decades():
    fig, ax = plt.subplots()
    assert plots.log_if_spans(ax, [1, 5, 99], "y") is False and ax.get_yscale() == "linear"  # < 2 decades
    assert plots.log_if_spans(ax, [0, 1, 100], "x") is True and ax.get_xscale() == "log"  # zero ignored
    with pytest.raises(ValueError, match="axis"):
        plots.log_if_spans(ax, [1, 1000], "z")
    plt.close(fig)


def test_mark_selected_and_legend_outside():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9], label="curve")
    plots.mark_selected(ax, 2, 4, "recommended", offset_points=(-10, 5))
    plots.legend_outside(ax, title="series")
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["curve"]
    fig.canvas.draw()
    # the legend's box starts right of the axes' box: outside the data
    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
    (note,) = ax.texts
    assert note.get_text() == "recommended" and note.xy == (2, 4)
    # the star sits on the point; a label offset to the left ends left of it
    assert list(ax.collections[-1].get_offsets()[0]) == [2, 4]
    px = ax.transData.transform((2, 4))[0]
    assert note.get_window_extent().x1 <= px
    plt.close(fig)


def test_save_writes_png_and_svg_beside_results(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    name = plots.save(fig, tmp_path / "r" / "01_x.json", "curve")
    assert name == "01_x-curve.png"
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["01_x-curve.png", "01_x-curve.svg"]
    assert (tmp_path / "r" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="figure name"):
        plots.save(fig, tmp_path / "r.json", "bad name")
    plt.close(fig)


def test_ticks_at_swept_values_only_on_a_log_axis():
    fig, ax = plt.subplots()
    ax.plot([128, 512, 2048], [1, 2, 3])
    ax.set_xscale("log")
    plots.ticks_at(ax, [2048, 128, 512])
    fig.canvas.draw()
    assert list(ax.get_xticks()) == [128, 512, 2048]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["128", "512", "2,048"]
    assert len(ax.xaxis.get_minorticklocs()) == 0  # no minor ticks left to collide
    plt.close(fig)
