"""Shared test set-up: headless plotting, GPU skips, and the notebook runner fixture."""
from __future__ import annotations

import json
import os
import tempfile

os.environ.setdefault("MPLBACKEND", "Agg")
_cfg = tempfile.mkdtemp(prefix="kvlab-test-cfg-")
for var, sub in (("JUPYTER_CONFIG_DIR", "jupyter"), ("IPYTHONDIR", "ipython"), ("MPLCONFIGDIR", "mpl")):
    os.environ.setdefault(var, os.path.join(_cfg, sub))

import pytest
from hypothesis import HealthCheck, settings

from kvlab.backend import cupy_usable

settings.register_profile("kvlab", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvlab")

_HAS_GPU = cupy_usable()
# The device side of the xp fixture: CuPy on a GPU, else the strict stand-in for CuPy's rules when
# the run asks for it (KVLAB_BACKEND=strict, the step of .ci/run after the README's command).
_DEVICE = "cupy" if _HAS_GPU else "strict" if os.environ.get("KVLAB_BACKEND", "").strip().lower() == "strict" \
    else None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CuPy with a usable CUDA device")
    for item in items:
        if "gpu" in item.keywords and not _HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(params=["compiled", "asks"])
def fast_loop(request, monkeypatch):
    """Run a test both ways through the compiled loop: with the compiled forms of the policy's rules
    and the cost model (the default), and asking Python every question (``KVLAB_COMPILED_FORMS=0``,
    the path of a policy or cost model with no compiled form)."""
    monkeypatch.setenv("KVLAB_COMPILED_FORMS", "1" if request.param == "compiled" else "0")
    return request.param


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory):
    """``kvlab report -p quick true``: every notebook, as the test suite runs them (once per session)."""
    from kvlab.cli import main

    out = tmp_path_factory.mktemp("report") / "run"
    assert main(["report", "-p", "quick", "true", "--out", str(out), "--no-progress"]) == 0
    return out


def _at_defaults(name: str, params: dict) -> bool:
    """Whether ``params`` are ``{"quick": True}`` and otherwise the notebook's own defaults."""
    import ast

    import papermill

    from kvlab._paths import ROOT

    defaults = papermill.inspect_notebook(str(ROOT / "notebooks" / f"{name}.ipynb"))
    rest = {k: v for k, v in params.items() if k != "quick"}
    try:
        return params.get("quick") is True and all(
            k in defaults and ast.literal_eval(defaults[k]["default"]) == v for k, v in rest.items())
    except (ValueError, SyntaxError):  # a default that is not a literal
        return False


@pytest.fixture
def run_notebook(tmp_path, request):
    """Execute ``notebooks/<name>.ipynb`` with ``params`` through papermill; return its JSON results.

    A quick run at the notebook's defaults is the session's :func:`quick_report` page (the same
    execution, not run twice)."""
    from kvlab.report import execute_notebook

    def _run(name: str, params: dict | None = None) -> dict:
        params = params or {}
        if _at_defaults(name, params):
            folder = request.getfixturevalue("quick_report")
            results = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        else:
            folder = tmp_path
            results = execute_notebook(name, tmp_path / f"{name}.ipynb", params, results_path=tmp_path / f"{name}.json")
        _check_summary_card(name, results, folder)
        return results

    return _run


def _check_summary_card(name: str, results: dict, folder) -> None:
    """Every notebook a test runs also goes on a report's summary page: the question, answer and
    what to do its sidecar states must read there, and its key figure must exist and be shown."""
    import html
    import re

    from kvlab.report.pages import index_html
    from kvlab.report.results import verdict_counts

    entry = {"stem": name, "title": name, "question": "", "html": f"{name}.html", "ipynb": f"{name}.ipynb",
             "json": f"{name}.json", "results": results, "verdicts": verdict_counts(results.get("claims")),
             "runtime_s": 0.0}
    page = index_html({"name": "test", "date": "", "runtime_s": 0.0, "version": "", "command": "", "inputs": []},
                      [entry])
    body = re.sub(r"</?(code|b|i)>", "", page.split("<body>", 1)[1])  # inline markdown, rendered
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).replace("*", "").split())
    for key in ("question", "answer", "what_to_do"):
        if key in results:
            assert isinstance(results[key], str) and results[key].strip(), f"{name}: sidecar {key!r} is empty"
            assert " ".join(re.sub(r"[`*]", "", results[key]).split()) in text, f"{name}: {key} not on the summary page"
    figures = results.get("figures") or []
    for fig in figures:
        assert (folder / fig).is_file(), f"{name}: figure {fig} listed in the sidecar was not written"
    if figures:
        assert f'src="{html.escape(figures[0])}"' in page


@pytest.fixture(params=["numpy", "device"])
def xp(request):
    """The array module: NumPy, and the device's (CuPy on a GPU, or the strict stand-in under
    KVLAB_BACKEND=strict; skipped otherwise)."""
    from kvlab.backend import get_xp

    if request.param == "numpy":
        return get_xp("numpy")
    if _DEVICE is None:
        pytest.skip("needs CuPy with a usable CUDA device (or KVLAB_BACKEND=strict for the stand-in)")
    return get_xp(_DEVICE)


@pytest.fixture
def device_xp():
    """The device's array module alone (CuPy on a GPU, or the strict stand-in; skipped otherwise)."""
    from kvlab.backend import get_xp

    if _DEVICE is None:
        pytest.skip("needs CuPy with a usable CUDA device (or KVLAB_BACKEND=strict for the stand-in)")
    return get_xp(_DEVICE)
