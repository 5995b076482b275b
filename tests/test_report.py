"""kvlab report: papermill execution, parameters, HTML/JSON outputs, atomic run folders."""
import json
import os
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from kvlab import report
from kvlab.cli import main


def _notebook(path, body):
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell("x = 1\nresults_path = 'r.json'", metadata={"tags": ["parameters"]}),
                new_code_cell(body)]
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def notebooks(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    good = _notebook(d / "01_good.ipynb",
                     "import kvlab\nkvlab.report.write_results(results_path, {'x_squared': x * x})")
    bad = _notebook(d / "02_bad.ipynb", "y = 1\nraise RuntimeError('boom ' + str(x))")
    return good, bad


def test_figures_are_embedded_even_under_a_headless_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = _notebook(tmp_path / "01_plot.ipynb",
                   "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()\n"
                   "import kvlab\nkvlab.report.write_results(results_path, {})")
    report.execute_notebook(nb, tmp_path / "out.ipynb")
    outputs = [o for c in nbformat.read(str(tmp_path / "out.ipynb"), as_version=4).cells for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert os.environ["MPLBACKEND"] == "Agg"  # restored for the caller


def test_resolve_by_number_name_and_stem(notebooks):
    good, bad = notebooks
    d = good.parent
    assert report.resolve_notebooks(["1"], d) == [good]
    assert report.resolve_notebooks(["02"], d) == [bad]
    assert report.resolve_notebooks(["good"], d) == [good]
    assert report.resolve_notebooks([], d) == [good, bad]
    with pytest.raises(ValueError, match="known notebooks are 01_good, 02_bad"):
        report.resolve_notebooks(["03"], d)


def test_write_results_is_json_clean(tmp_path):
    import numpy as np
    import pandas as pd

    p = tmp_path / "a" / "r.json"
    report.write_results(p,
                             {"n": np.int64(3), "f": np.float32(0.5), "nan": float("nan"),
                              "df": pd.DataFrame({"a": [1, 2]}), "arr": np.arange(2)})
    assert json.loads(p.read_text()) == {"n": 3, "f": 0.5, "nan": None, "df": [{"a": 1}, {"a": 2}], "arr": [0, 1]}
    assert [q.name for q in p.parent.iterdir()] == ["r.json"]  # no temporary file left


def test_cli_report_runs_and_writes_complete_folder(notebooks, tmp_path):
    good, _ = notebooks
    out = tmp_path / "run"
    assert main(["report", str(good), "-p", "x", "7", "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["01_good.html", "01_good.ipynb", "01_good.json", "index.html"]
    assert json.loads((out / "01_good.json").read_text()) == {"x_squared": 49}
    assert "01_good.html" in (out / "index.html").read_text()
    assert "<html" in (out / "01_good.html").read_text().lower()


def test_yaml_parameter_file(notebooks, tmp_path):
    good, _ = notebooks
    params = tmp_path / "p.yaml"
    params.write_text("x: 5\n")
    out = tmp_path / "run"
    assert main(["report", str(good), "-f", str(params), "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "01_good.json").read_text()) == {"x_squared": 25}


def test_failing_notebook_names_cell_and_leaves_no_partial_run(notebooks, tmp_path, capsys):
    good, bad = notebooks
    out = tmp_path / "run"
    with pytest.raises(report.NotebookError, match=r"notebook 02_bad failed in cell \d+ .*RuntimeError: boom 1"):
        report.run_report([str(good), str(bad)], out=out, progress=False)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run")] == []
    assert main(["report", str(bad), "--out", str(out), "--no-progress"]) == 1
    assert "02_bad" in capsys.readouterr().err


def test_unknown_parameter_is_an_error(notebooks, tmp_path, capsys):
    good, _ = notebooks
    assert main(["report", str(good), "-p", "blocksize", "32", "--out", str(tmp_path / "r")]) == 2
    assert "blocksize" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no parameter"):
        report.execute_notebook(good, tmp_path / "o.ipynb", {"nope": 1})


def test_existing_output_folder_is_refused(notebooks, tmp_path):
    good, _ = notebooks
    with pytest.raises(ValueError, match="already exists"):
        report.run_report([str(good)], out=tmp_path, progress=False)


def test_default_run_folder_under_reports(notebooks, tmp_path, monkeypatch):
    good, _ = notebooks
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(good), "--no-progress"]) == 0
    runs = list((tmp_path / "reports").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("run-")
    assert sorted(p.name for p in runs[0].iterdir()) == ["01_good.html", "01_good.ipynb", "01_good.json", "index.html"]


def test_numbers_in_tables_are_formatted():
    from kvlab.report.tables import format_number

    # four significant digits, thousands separators, no trailing zeros (hand-worked)
    assert format_number(1166.6605) == "1,167"
    assert format_number(123.456) == "123.5"
    assert format_number(0.5) == "0.5"
    assert format_number(2048.0) == "2,048"
    assert format_number(1234567.8) == "1,234,568"
    assert format_number(0.012345) == "0.01235"
    assert format_number(-3.14159) == "-3.142"
    assert format_number(3.2e-5) == "3.2e-05"
    assert format_number(0.0) == "0"


def test_verdicts_are_counted_from_their_structured_kind_never_their_words():
    from kvlab import claims as c

    # notebook 05's rows as issue 24 found them: the words would count "best" and "mixed"
    rows = c.table([c.close("a", "s", 2.6, {"roofline": 4.0, "measured": 2.5}, note="roofline: best on chat"),
                    c.close("b", "s", 3.7, {"roofline": 3.5, "measured": 3.6}),
                    c.close("c", "s", 5.6, 2.0), c.not_reproducible("d", "s", "2x", "no set-up")])
    assert report.verdict_counts(rows.to_dict(orient="records")) == \
        {"mixed": 1, "holds": 1, "differs": 1, "not reproducible": 1}
    assert report.verdict_counts([{"verdict": "holds"}]) == {"unclassified": 1}
    assert report.verdict_counts(None) == {}


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_report_files_follow_the_umask(notebooks, tmp_path, mask):
    good, _ = notebooks
    old = os.umask(mask)
    try:
        out = report.run_report([str(good)], out=tmp_path / "run", progress=False)
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~mask
    for f in out.iterdir():
        assert (f.stat().st_mode & 0o777) == 0o666 & ~mask, f.name


def test_parameter_reaching_only_some_notebooks_warns(notebooks, tmp_path, capsys):
    good, _ = notebooks
    other = tmp_path / "nbs" / "03_other.ipynb"
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell("y = 2  # another knob\nresults_path = 'r.json'", metadata={"tags": ["parameters"]}),
                new_code_cell("import kvlab\nkvlab.report.write_results(results_path, {'y': y})")]
    nbformat.write(nb, str(other))
    with pytest.warns(report.ParameterWarning, match="parameter x is used only by 01_good; 03_other does not"):
        per = report.split_parameters([good, other], {"x": 3})
    assert per == {good: {"x": 3}, other: {}}
    out = tmp_path / "run"
    assert main(["report", str(good), str(other), "-p", "y", "5", "--out", str(out), "--no-progress"]) == 0
    assert "warning: parameter y is used only by 03_other; 01_good does not declare it" in capsys.readouterr().err
    assert json.loads((out / "03_other.json").read_text()) == {"y": 5}


def _declared_in_cell(path):
    """The names assigned in a notebook's parameters cell and their trailing comments, read with
    Python's own parser (independently of papermill)."""
    import ast
    import io
    import tokenize

    nb = nbformat.read(str(path), as_version=4)
    src = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = [t.id for node in ast.parse(src).body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    comments = [tok.string.lstrip("# ").strip() for tok in tokenize.generate_tokens(io.StringIO(src).readline)
                if tok.type == tokenize.COMMENT and tok.line[:tok.start[1]].strip()]  # trailing comments
    return names, comments


def test_list_params_prints_every_parameter_of_every_notebook(capsys):
    assert main(["report", "--list-params"]) == 0
    text = capsys.readouterr().out
    blocks = {b.splitlines()[0]: b for b in text.strip().split("\n\n")}
    paths = report.list_notebooks()
    assert sorted(blocks) == [p.stem for p in paths]
    for path in paths:
        names, comments = _declared_in_cell(path)
        listed = [line.split()[0] for line in blocks[path.stem].splitlines()[2:]]
        assert listed == names, path.stem
        for comment in comments:
            assert comment in blocks[path.stem], (path.stem, comment)


def test_list_params_of_one_notebook(notebooks, capsys):
    good, _ = notebooks
    assert main(["report", "--list-params", str(good)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "01_good"
    assert [ln.split()[:3] for ln in lines[2:]] == [["x", "int", "1"], ["results_path", "str", "'r.json'"]]


def test_a_parameter_papermill_cannot_read_is_named(tmp_path):
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell("x = 1  # fine\nn = None  # None = all: an '=' papermill cannot parse",
                              metadata={"tags": ["parameters"]})]
    nbformat.write(nb, str(tmp_path / "01_eq.ipynb"))
    with pytest.raises(ValueError, match=r"01_eq: papermill cannot read parameter\(s\) n "):
        report.parameters(tmp_path / "01_eq.ipynb")


def test_progress_line_names_the_notebook_its_time_and_its_own_progress(tmp_path, capsys):
    d = tmp_path / "nbs"
    d.mkdir()
    nb = _notebook(d / "01_slow.ipynb", "import sys, time\nfrom tqdm.auto import tqdm\n"
                                        "for _ in tqdm(range(4), desc='fitting', mininterval=0):\n    time.sleep(0.8)\n"
                                        "print('a warning', file=sys.stderr)\n"
                                        "import kvlab\nkvlab.report.write_results(results_path, {})")
    report.run_report([str(nb)], out=tmp_path / "run", progress=True)
    err = capsys.readouterr().err
    # the notebook's own tqdm bar (text, not a widget) shows on the report's line, after its name and time
    assert re.search(r"01_slow 0:0[1-9] .*0/1 notebooks.*fitting: +\d+%", err), err
    assert "without encryption" not in err and "IPKernelApp" not in err  # kernel transport notices hidden
    page = (tmp_path / "run" / "01_slow.html").read_text()
    assert "a warning" in page and "time.sleep" not in page  # stderr kept, code hidden
    assert "fitting" not in page and "IProgress" not in page  # progress bars left out of the page


def test_run_inputs_group_values_by_notebook():
    from pathlib import Path

    from kvlab.report.run import _inputs

    a, b = Path("01_a.ipynb"), Path("02_b.ipynb")
    declared = {a: {"trace": '""', "model": '"X"', "num_requests": "None", "seed": "0"},
                b: {"model": '"Y"', "profile": '""', "seed": "0", "gpu": "None"}}
    rows = _inputs([a, b], declared, {a: {}, b: {"seed": 3}})
    assert rows == [("model", "X (01); Y (02)"), ("num_requests", "default (all of a trace)"), ("seed", "0 (01); 3 (02)")]
    rows = _inputs([a, b], declared, {a: {"trace": "t.csv", "seed": 3}, b: {"model": "X", "seed": 3}})
    assert rows == [("trace", "t.csv"), ("model", "X"), ("num_requests", "default (all of a trace)"), ("seed", "3")]


def test_tables_show_what_a_reader_needs_and_nothing_else():
    import pandas as pd

    from kvlab.report import tables

    df = pd.DataFrame({"family": ["gamma", "weibull"], "params": [{"shape": 0.6633875390047553, "scale_tokens": 57.1974},
                                                                   {"shape": 0.77536, "scale_tokens": 32.845}],
                       "unused": [float("nan"), None], "pool_pages": [28531, 1726], "ok": [True, False]})
    shown = tables.display_frame(df)
    # no 0..N index, the all-empty column gone, the mapping spread into columns with units, numbers formatted
    assert list(shown.columns) == ["family", "params shape", "params scale (tokens)", "pool (pages)", "ok"]
    assert shown.iloc[0].tolist() == ["gamma", "0.6634", "57.2", "28,531", "yes"]
    # named row labels are kept as a column; a 0..N index that was only reordered is not
    assert list(tables.display_frame(df.set_index("family")).columns)[0] == "family"
    assert "0" not in tables.display_frame(df.iloc[::-1].reset_index(drop=True)).iloc[:, 0].tolist()
    html = tables.to_html(df)
    assert '<td class="num">28,531</td>' in html and "<td>gamma</td>" in html and "nan" not in html.lower()


def test_rests_on_reads_in_units_and_significant_digits():
    from kvlab.report.tables import setup_items

    rows = dict(setup_items({"copy_latency_s": 4.9999999999999996e-06, "link_bytes_per_s": 31.5e9,
                             "load": {"duration_s": 1038.455005725461, "rate_per_s": 4.419126037364613,
                                      "trace_rate_per_s": None}, "chunk_tokens": None, "workload": ""}))
    assert rows == {"copy latency": "5 µs", "link": "31.5 GB/s", "load": "duration 1,038 s, rate 4.419 /s"}


def test_pages_name_build_folders_relative_to_the_project(tmp_path):
    from kvlab.report.pages import project_relative

    root = tmp_path / "kvlab"
    text = f"{root}/kvlab/capacity.py:588: warning; runs from {tmp_path}/shared/data/serving; /srv/trace.csv stays"
    assert project_relative(text, root) == ("kvlab/capacity.py:588: warning; runs from ../shared/data/serving; "
                                            "/srv/trace.csv stays")
