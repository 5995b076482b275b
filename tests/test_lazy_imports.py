"""kvlab's public names load on first use: `import kvlab` imports no array or data library, and
functions named like their submodule (kvlab.sweep, kvlab.capacity, kvlab.lengths.fit) stay
functions once the submodule is imported. Each check runs in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys

import pytest

import kvlab


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def test_import_kvlab_loads_no_heavy_library():
    loaded = _run("import sys, kvlab; print(sorted({m.split('.')[0] for m in sys.modules}))")
    for heavy in ("numpy", "pandas", "scipy", "matplotlib", "seaborn", "papermill"):
        assert f"'{heavy}'" not in loaded


def test_simulate_needs_no_scipy_and_functions_named_like_their_submodule_stay_functions():
    # The submodules are imported by `import` statements (which bind a submodule on its package)
    # before the functions are read: the order that would hide the function without kvlab._lazy.
    out = _run("import sys, kvlab, kvlab.lengths; kvlab.simulate; print('scipy' in sys.modules); "
               "import kvlab.sweep, kvlab.capacity, kvlab.recommend, kvlab.lengths.fit, kvlab.lengths.profiles; "
               "print([type(f).__name__ for f in (kvlab.sweep, kvlab.capacity, kvlab.lengths.fit)])")
    assert out.splitlines() == ["False", "['function', 'function', 'function']"]


def test_every_public_name_resolves_and_unknown_names_raise():
    assert "simulate" in dir(kvlab) and "studies" in kvlab.__all__
    for name in ("simulate", "crossover", "SLO", "Recommendation", "studies", "swap"):
        assert getattr(kvlab, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'simulat'"):
        _ = kvlab.simulat
