"""Array backend: NumPy on a CPU, CuPy on an NVIDIA GPU.

kvlab's array code is written once against an array module ``xp``. This module picks it:

* ``KVLAB_BACKEND=numpy`` (or no CuPy / no usable device under ``auto``): NumPy;
* ``KVLAB_BACKEND=cupy``: CuPy, and an error if CuPy is missing or has no usable device;
* ``KVLAB_BACKEND=auto`` (default): CuPy when ``cupy.is_available()`` is true, else NumPy;
* ``KVLAB_BACKEND=strict`` (tests): NumPy behind CuPy's rules (:mod:`kvlab._strict`): arrays that
  refuse implicit conversion to NumPy and mixing with host arrays, so CI catches code that would
  fail on a GPU without one.

Random inputs are always drawn on the host with a seeded ``numpy.random.Generator`` and then
moved with :func:`asarray`, so NumPy and CuPy runs see identical inputs.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

BACKENDS = ("numpy", "cupy", "strict", "auto")
ENV_VAR = "KVLAB_BACKEND"


def _import_cupy() -> ModuleType:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "CuPy is not installed: install the GPU extra, `pip install -e \".[gpu]\"` "
            "(cupy-cuda12x) or `pip install cupy-cuda13x` for CUDA 13"
        ) from exc
    return cupy


def cupy_usable() -> bool:
    """True when CuPy imports and reports at least one usable CUDA device."""
    try:
        cupy = _import_cupy()
    except ImportError:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:  # pragma: no cover - driver errors on odd machines
        return False


def get_xp(name: str | None = None) -> ModuleType:
    """Return the array module for backend ``name`` (``numpy``, ``cupy`` or ``auto``).

    ``None`` reads ``KVLAB_BACKEND`` (default ``auto``).
    """
    if name is None:
        name = os.environ.get(ENV_VAR, "auto")
    key = str(name).strip().lower()
    if key not in BACKENDS:
        raise ValueError(f"backend {name!r} is unknown: expected one of {', '.join(BACKENDS)} "
                         f"(set by argument or the {ENV_VAR} environment variable)")
    if key == "numpy":
        return np
    if key == "strict":
        from ._strict import strict
        return strict
    if key == "cupy":
        cupy = _import_cupy()
        if not cupy_usable():
            raise RuntimeError("backend 'cupy' was asked for but CuPy finds no usable CUDA device "
                               "(cupy.is_available() is False); use KVLAB_BACKEND=numpy or auto")
        return cupy
    return _import_cupy() if cupy_usable() else np


def backend_name(xp: ModuleType) -> str:
    """``'numpy'``, ``'cupy'`` or ``'strict'`` for an array module."""
    if xp.__name__.startswith("cupy"):
        return "cupy"
    return "strict" if xp.__name__ == "kvlab.strict" else "numpy"


def array_namespace(*arrays: Any) -> ModuleType:
    """The array module of ``arrays``: CuPy (or the strict stand-in) for device arrays, else NumPy.

    Raises ``TypeError`` when host (NumPy) arrays are mixed with device arrays. NumPy scalars and
    Python numbers go with either.
    """
    kinds = set()
    for a in arrays:
        if type(a).__module__.split(".")[0] == "cupy":
            kinds.add("cupy")
        elif _is_strict(a):
            kinds.add("strict")
        elif isinstance(a, np.ndarray):
            kinds.add("numpy")
    if len(kinds) > 1:
        raise TypeError(f"arrays on different devices: {' and '.join(sorted(kinds))} arrays were mixed; "
                        "move them with kvlab.backend.asarray or to_numpy first")
    if "cupy" in kinds:
        return _import_cupy()
    return get_xp("strict") if "strict" in kinds else np


def _is_strict(a: Any) -> bool:
    return type(a).__module__ == "kvlab._strict"


def asarray(a: Any, xp: ModuleType, dtype: Any = None) -> Any:
    """``a`` as an array of module ``xp`` (copies host data to the GPU for CuPy)."""
    return xp.asarray(a, dtype=dtype)


def to_numpy(a: Any) -> np.ndarray:
    """``a`` as a NumPy array (``.get()`` for device arrays, a no-op view for NumPy)."""
    if type(a).__module__.split(".")[0] == "cupy" or _is_strict(a):
        return a.get()
    return np.asarray(a)
