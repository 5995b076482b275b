"""kvlab report: papermill execution, parameters, HTML/JSON outputs, atomic run folders."""
import json
import os

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

    p = report.write_results(tmp_path / "a" / "r.json",
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
