"""The compiled loop built ahead of time: a CPython extension module that loads without Numba.

Loading Numba's cached dispatcher of :func:`.loop.run_loop` imports Numba and, through it, its
type and target registries and SciPy's BLAS: about 0.7 of the 1.2 CPU-seconds a short kvlab
process cost (README, Benchmarks). The same loop compiled ahead of time by ``numba.pycc`` is a
plain extension module, which :func:`load` imports with :mod:`importlib` without importing Numba,
building it first when there is none for these sources:

* it is built in kvlab's Numba cache folder (:func:`kvlab._numba_cache.cache_folder`) under a
  name from a SHA-256 of every kvlab source file and NumPy's version (:func:`module_name`): an
  edit to any of them builds a new module, so stale code never runs. The build is announced on
  stderr before it starts (tens of seconds) and its duration after; it runs in a temporary folder
  and is moved into place whole (``os.replace``), under a lock so that processes starting at once
  build it once; then modules of other sources beyond the newest :data:`KEEP` are removed.
* its machine code is tuned to this CPU (``target_cpu = "host"``, as Numba's JIT code is: pycc's
  generic code ran the loop ~10% slower), so the name also hashes the CPU's model and feature
  flags (:func:`cpu_fingerprint`): machines of different CPUs sharing a cache folder each build
  their own.
* pycc compiles one signature (:data:`ARGUMENTS`), and the module does not check what it is
  given: :func:`check_arguments` does, naming the argument.
* when pycc is missing or the build fails, one ``RuntimeWarning`` says why and :func:`load`
  returns ``None``: the caller runs Numba's JIT dispatcher, as before. The reason is kept beside
  the module (``<name>.failed``) so that later processes do not rebuild in vain; deleting that
  file, or any change to the sources, tries again.

``KVLAB_AOT=0`` (read by :mod:`.compiled`) skips it: the JIT dispatcher runs (the tests run both).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..._numba_cache import cache_folder

_PACKAGE = Path(__file__).resolve().parents[2]  # the kvlab package folder
PREFIX = "kvlab_loop_"
#: Modules (of different sources) kept in the cache folder after a build, the newest first.
KEEP = 3
#: :func:`.loop.run_loop`'s arguments in order: name, dtype and dimensions (0: a scalar); every
#: array is C-contiguous and writable.
ARGUMENTS: tuple[tuple[str, str, int], ...] = (
    ("S", "int64", 1), ("F", "float64", 1), ("C", "int64", 1), ("page_copy_s", "float64", 0),
    ("cost_kind", "int64", 0), ("cost_params", "float64", 1), ("Q", "int64", 2), ("Fct", "int64", 2),
    ("T", "float64", 2), ("E", "int64", 2), ("order", "int64", 1), ("arrival", "float64", 1),
    *((name, "int64", 1) for name in ("wq", "sw", "run", "sched_ids", "sched_chunk", "snap", "stale", "limbo", "fin")),
    ("R", "int64", 2), ("RT", "float64", 2), ("pg", "int64", 2), ("page_of", "int64", 1), ("blk", "int64", 2),
    ("rb", "int64", 2))
_loaded: dict[Path, Callable[..., int]] = {}
_folders: dict[str | None, Path] = {}  # cache_folder() per NUMBA_CACHE_DIR
_names: dict[Path, str] = {}
_warned: set[str] = set()
_failed: dict[Path, str] = {}  # why this process could not build or load a module


def cpu_fingerprint() -> str:
    """This CPU's model and feature flags (the first processor of ``/proc/cpuinfo`` on Linux;
    the platform's machine and processor names elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            lines = []
            for line in info:
                if not line.strip():
                    break
                if line.split(":")[0].strip() in ("vendor_id", "model name", "flags", "Features", "CPU part"):
                    lines.append(line.strip())
        if lines:
            return "\n".join(lines)
    except OSError:
        pass
    import platform

    return f"{platform.machine()} {platform.processor()}"


def _compiler_versions() -> bytes:
    """The installed Numba's and llvmlite's ``_version.py`` bytes (found without importing them;
    empty where missing): a new compiler builds a new module, as Numba's own cache recompiles."""
    out = b""
    for package in ("numba", "llvmlite"):
        with contextlib.suppress(Exception):
            spec = importlib.util.find_spec(package)
            out += package.encode() + (Path(spec.origin).parent / "_version.py").read_bytes()
    return out


def module_name(root: Path = _PACKAGE) -> str:
    """The module's name for the kvlab sources under ``root``: a SHA-256 of each ``.py`` file's
    path (relative to ``root``) and bytes, of NumPy's version (its C interface), of Numba's and
    llvmlite's (:func:`_compiler_versions`), of the interpreter (``sys.implementation.cache_tag``)
    and of :func:`cpu_fingerprint` (the code is tuned to the CPU)."""
    if root not in _names:
        h = hashlib.sha256(f"numpy {np.__version__}\n{sys.implementation.cache_tag}\n{cpu_fingerprint()}".encode())
        h.update(_compiler_versions())
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes())
        _names[root] = PREFIX + h.hexdigest()[:24]
    return _names[root]


def module_path(folder: Path, name: str) -> Path:
    """Where the module ``name`` is built in ``folder`` (with this interpreter's extension suffix)."""
    return folder / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def check_arguments(args: tuple[Any, ...]) -> None:
    """Raise ``TypeError`` naming the first of ``args`` that is not what the module was compiled for
    (:data:`ARGUMENTS`): code compiled ahead of time has no dispatch and would misread it."""
    if len(args) != len(ARGUMENTS):
        raise TypeError(f"run_loop takes {len(ARGUMENTS)} arguments, not {len(args)}")
    for value, (name, dtype, ndim) in zip(args, ARGUMENTS):
        if ndim == 0:
            kinds = (int, np.integer) if dtype == "int64" else (int, float, np.integer, np.floating)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds):
                raise TypeError(f"run_loop argument {name!r} must be a {dtype} scalar, not {type(value).__name__}")
            continue
        if not isinstance(value, np.ndarray):
            raise TypeError(f"run_loop argument {name!r} must be a {dtype} array, not {type(value).__name__}")
        if value.dtype != dtype or value.ndim != ndim or not value.flags.c_contiguous or not value.flags.writeable:
            got = f"{value.dtype} {value.ndim}-dimensional" + ("" if value.flags.c_contiguous else " non-contiguous") \
                + ("" if value.flags.writeable else " read-only")
            raise TypeError(f"run_loop argument {name!r} must be a writable C-contiguous {ndim}-dimensional {dtype} "
                            f"array, not a {got} one")


def _signature() -> Any:
    """:data:`ARGUMENTS` as pycc's signature (imports Numba)."""
    from numba import types

    def numba_type(dtype: str, ndim: int) -> Any:
        scalar = getattr(types, dtype)
        return scalar if ndim == 0 else types.Array(scalar, ndim, "C")

    return types.int64(*(numba_type(dtype, ndim) for _, dtype, ndim in ARGUMENTS))


def c_compiler() -> str | None:
    """The C compiler pycc would link the module with (``CC``, else Python's own build's), or
    ``None`` when it is not on the path."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def build(folder: Path, name: str) -> Path:
    """Compile :func:`.loop.run_loop` with ``numba.pycc`` into the module ``name`` in ``folder``
    (built in a temporary folder there, then moved into place); its path. Announced on stderr.
    Without a C compiler it fails at once (pycc would find out after most of the build)."""
    if c_compiler() is None:
        raise RuntimeError("no C compiler on the path (set CC, or install gcc): numba.pycc links the module with one")
    start = time.perf_counter()
    print("kvlab: compiling the simulator's loop ahead of time (first run after installing or changing kvlab; "
          "kept for later runs) ...", file=sys.stderr, flush=True)
    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():  # pycc is pending deprecation in Numba; its replacement is not released
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC
    from . import loop

    target = module_path(folder, name)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        cc = CC(name)
        cc.output_dir, cc.output_file, cc.target_cpu = str(tmp), target.name, "host"
        cc.export("run_loop", _signature())(loop.run_loop.py_func)
        cc.compile()
        os.replace(tmp / target.name, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"kvlab: compiled the simulator's loop in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return target


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another process's prune
        return 0.0


def prune(folder: Path, keep: str) -> list[str]:
    """Remove the files of kvlab loop modules in ``folder`` other than ``keep`` and the newest
    :data:`KEEP` - 1 others (by modification time, every interpreter's suffix alike), and build
    folders a killed build left over a day ago; the names removed. Lock files stay (another process
    may hold one), and a file another process removed first is skipped."""
    built = [p for p in folder.glob(f"{PREFIX}*") if p.suffix in (".so", ".pyd")]
    newest = sorted(built, key=_mtime, reverse=True)
    names = list(dict.fromkeys(p.name[:len(keep)] for p in newest))
    kept = {keep, *[n for n in names if n != keep][:KEEP - 1]}
    removed = sorted({p.name[:len(keep)] for p in folder.glob(f"{PREFIX}*")} - kept)
    for path in folder.glob(f"{PREFIX}*"):
        if path.name[:len(keep)] in removed and not path.name.endswith(".lock"):
            with contextlib.suppress(OSError):
                path.unlink()
    for stale in folder.glob(".build-*"):
        if time.time() - _mtime(stale) > 86400:
            shutil.rmtree(stale, ignore_errors=True)
    return removed


@contextlib.contextmanager
def _lock(folder: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<name>.lock`` in ``folder`` (none where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover (Windows)
        yield
        return
    with open(folder / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _warn_once(name: str, reason: str, failed: Path) -> None:
    if name not in _warned:
        _warned.add(name)
        retry = f"; delete {failed} to try again" if failed.exists() else ""
        warnings.warn(f"kvlab: the simulator's loop could not be compiled ahead of time ({reason}); Numba's JIT "
                      f"loop runs instead (it imports Numba, ~0.7 CPU s per process){retry}", RuntimeWarning,
                      stacklevel=3)


def _import(name: str, path: Path) -> Any:
    """The extension module at ``path`` (its init function is ``PyInit_<name>``), imported directly."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _build_once(folder: Path, name: str) -> str | None:
    """Build the module ``name`` unless it is built or its build failed before (under the lock, so
    that a process waiting on another's build reads its outcome); the failure's reason, or ``None``."""
    path, failed = module_path(folder, name), folder / f"{name}.failed"
    with _lock(folder, name):
        if path.exists():  # built by another process meanwhile
            return None
        if failed.exists():
            return failed.read_text(encoding="utf-8").strip()
        try:
            build(folder, name)
        except Exception as err:  # any failure: the JIT loop still runs
            reason = f"{type(err).__name__}: {err}".strip()[:500]
            with contextlib.suppress(OSError):
                failed.write_text(reason + "\n", encoding="utf-8")
            return reason
    with contextlib.suppress(OSError):
        prune(folder, keep=name)
    return None


def load() -> Callable[..., int] | None:
    """The ahead-of-time compiled ``run_loop`` (built first when missing), or ``None`` when it
    cannot be built or loaded (warned once; a build's failure is kept in ``<name>.failed``)."""
    folder = _folders.get(os.environ.get("NUMBA_CACHE_DIR")) or cache_folder()
    _folders[os.environ.get("NUMBA_CACHE_DIR")] = folder
    name = module_name()
    path = module_path(folder, name)
    if path in _loaded:
        return _loaded[path]
    if path in _failed:  # this process tried already: no second build
        return None
    try:
        reason = None if path.exists() else _build_once(folder, name)
        if reason is None:
            _loaded[path] = _import(name, path).run_loop
    except Exception as err:  # a module that cannot be loaded (or a lock that cannot be taken)
        reason = f"{type(err).__name__}: {err}".strip()[:500]
    if reason is not None:
        _failed[path] = reason
        _warn_once(name, reason, folder / f"{name}.failed")
        return None
    return _loaded[path]
