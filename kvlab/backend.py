"""Array backend: NumPy on a CPU, CuPy on an NVIDIA GPU.

kvlab's array code is written once against an array module ``xp``. This module picks it:

* ``KVLAB_BACKEND=numpy`` (or no CuPy / no usable device under ``auto``): NumPy;
* ``KVLAB_BACKEND=cupy``: CuPy, and an error if CuPy is missing or has no usable device;
* ``KVLAB_BACKEND=auto`` (default): CuPy when ``cupy.is_available()`` is true, else NumPy.

Random inputs are always drawn on the host with a seeded ``numpy.random.Generator`` and then
moved with :func:`asarray`, so NumPy and CuPy runs see identical inputs.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

BACKENDS = ("numpy", "cupy", "auto")
ENV_VAR = "KVLAB_BACKEND"


def _import_cupy() -> ModuleType:
    try:
        import cupy  # noqa: PLC0415  (lazy: CuPy is an optional extra)
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
    if key == "cupy":
        cupy = _import_cupy()
        if not cupy_usable():
            raise RuntimeError("backend 'cupy' was asked for but CuPy finds no usable CUDA device "
                               "(cupy.is_available() is False); use KVLAB_BACKEND=numpy or auto")
        return cupy
    return _import_cupy() if cupy_usable() else np


def backend_name(xp: ModuleType) -> str:
    """``'numpy'`` or ``'cupy'`` for an array module."""
    return "cupy" if xp.__name__.startswith("cupy") else "numpy"


def array_namespace(*arrays: Any) -> ModuleType:
    """The array module of ``arrays``: CuPy if they are CuPy arrays, else NumPy.

    Raises ``TypeError`` when NumPy and CuPy arrays are mixed (they live on different devices).
    """
    kinds = {type(a).__module__.split(".")[0] for a in arrays if hasattr(a, "__array_namespace__")
             or type(a).__module__.split(".")[0] in ("numpy", "cupy")}
    kinds.discard("builtins")
    if "cupy" in kinds and "numpy" in kinds:
        raise TypeError("arrays on different devices: NumPy (host) and CuPy (GPU) arrays were mixed; "
                        "move them with kvlab.backend.asarray or to_numpy first")
    return _import_cupy() if "cupy" in kinds else np


def asarray(a: Any, xp: ModuleType, dtype: Any = None) -> Any:
    """``a`` as an array of module ``xp`` (copies host data to the GPU for CuPy)."""
    return xp.asarray(a, dtype=dtype)


def to_numpy(a: Any) -> np.ndarray:
    """``a`` as a NumPy array (``.get()`` for CuPy arrays, a no-op view for NumPy)."""
    if type(a).__module__.split(".")[0] == "cupy":
        return a.get()
    return np.asarray(a)
