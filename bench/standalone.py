"""Import a kvlab module on a machine that lacks some of kvlab's package-level dependencies.

The lent GPU machine carries NumPy, SciPy, pandas, pytest, PyYAML and CuPy but not every
dependency of ``kvlab/__init__.py``; the GPU scripts need only modules that import without them,
so when ``import kvlab`` fails the package is registered without its ``__init__``.
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from types import ModuleType


def kvlab_module(name: str) -> ModuleType:
    """The module ``name`` (``kvlab.<...>``), with or without ``kvlab/__init__.py``."""
    try:
        import kvlab  # noqa: F401
    except ImportError as exc:
        print(f"note: import kvlab failed ({exc}); loading {name} without kvlab/__init__.py")
        pkg = types.ModuleType("kvlab")
        pkg.__path__ = [str(Path(__file__).resolve().parent.parent / "kvlab")]
        sys.modules["kvlab"] = pkg
    return importlib.import_module(name)
