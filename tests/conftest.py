"""Shared test set-up: headless plotting, GPU skips, and the notebook runner fixture."""
from __future__ import annotations

import os
import tempfile

os.environ.setdefault("MPLBACKEND", "Agg")
_cfg = tempfile.mkdtemp(prefix="kvlab-test-cfg-")
for var, sub in (("JUPYTER_CONFIG_DIR", "jupyter"), ("IPYTHONDIR", "ipython"), ("MPLCONFIGDIR", "mpl")):
    os.environ.setdefault(var, os.path.join(_cfg, sub))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from kvlab.backend import cupy_usable  # noqa: E402

settings.register_profile("kvlab", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvlab")

_HAS_GPU = cupy_usable()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CuPy with a usable CUDA device")
    for item in items:
        if "gpu" in item.keywords and not _HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture
def run_notebook(tmp_path):
    """Execute ``notebooks/<name>.ipynb`` with ``params`` through papermill; return its JSON results."""
    from kvlab.report import execute_notebook

    def _run(name: str, params: dict | None = None) -> dict:
        return execute_notebook(name, tmp_path / f"{name}.ipynb", params or {}, results_path=tmp_path / f"{name}.json")

    return _run


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """The array module, parametrised over NumPy and (when a GPU is usable) CuPy."""
    from kvlab.backend import get_xp

    if request.param == "cupy" and not _HAS_GPU:
        pytest.skip("needs CuPy with a usable CUDA device")
    return get_xp(request.param)
