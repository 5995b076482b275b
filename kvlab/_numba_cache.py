"""Where Numba caches kvlab's compiled code: a folder that can be written, on any install.

Numba's ``cache=True`` writes beside the module (``__pycache__``), else under the user's cache
folder (``~/.cache/numba``); when neither can be written (a read-only install in a container whose
home is read-only too) every decorated function fails at import with "cannot cache function: no
locator available". Importing this module (kvlab's compiled modules do, before Numba) runs
:func:`ensure_writable_cache`:
when neither folder can be written and ``NUMBA_CACHE_DIR`` is unset, it points Numba at a private
folder under the system's temporary folder, with one warning that says so.

:func:`cache_folder` names the folder Numba caches into; the ahead-of-time compiled loop
(:mod:`kvlab.sim.fast.aot`) is built there too. :func:`njit` is the decorator every cached
compiled function of kvlab uses (``numba.njit`` with ``cache=True``). Numba keys its on-disk
cache on the modification time and size of the decorated function's own file only, so an edit
to a function it inlines from another module (a cost formula inlined into the simulator's loop)
would run stale cached code. :func:`njit` keys it on a SHA-256 of the sources of every module
that has compiled functions through it so far (modules import what they inline first, so those
are registered before the functions that inline them) and of the function's own module: any
edit to any of them recompiles.
"""
from __future__ import annotations

import hashlib
import inspect
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

_PACKAGE = Path(__file__).resolve().parent
_done = False
#: Source files of the modules whose functions were compiled through :func:`njit`, in order.
_SOURCES: dict[str, None] = {}


def _writable(folder: Path) -> bool:
    """True when a file can be created in ``folder`` (made if missing), as Numba's own check does."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _user_cache() -> Path:
    """Numba's user-wide cache folder (its ``appdirs`` rule on Linux and macOS)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numba"


def ensure_writable_cache() -> None:
    """Set ``NUMBA_CACHE_DIR`` to a private temporary folder when Numba has nowhere to cache (once)."""
    global _done
    if _done:
        return
    _done = True
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    if _writable(_PACKAGE / "sim" / "fast" / "__pycache__") or _writable(_user_cache()):
        return
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    fallback = Path(tempfile.gettempdir()) / f"kvlab-numba-{uid}"
    if not _writable(fallback):
        fallback = Path(tempfile.mkdtemp(prefix="kvlab-numba-"))
    os.environ["NUMBA_CACHE_DIR"] = str(fallback)
    try:  # Numba already imported elsewhere: its config was read then
        import sys

        if "numba" in sys.modules:
            sys.modules["numba"].config.CACHE_DIR = str(fallback)
    except AttributeError:  # pragma: no cover
        pass
    warnings.warn(f"kvlab's folder ({_PACKAGE}) and {_user_cache()} cannot be written: Numba caches kvlab's "
                  f"compiled loop in {fallback} (set NUMBA_CACHE_DIR to choose)", RuntimeWarning, stacklevel=2)


def cache_folder() -> Path:
    """The folder Numba caches kvlab's compiled loop in (made if missing): ``NUMBA_CACHE_DIR`` when
    set (by the user, or by :func:`ensure_writable_cache` when nothing else can be written), else
    the loop's ``__pycache__`` when it can be written, else the user's cache folder (Numba's order)."""
    ensure_writable_cache()
    if os.environ.get("NUMBA_CACHE_DIR"):
        folder = Path(os.environ["NUMBA_CACHE_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    in_tree = _PACKAGE / "sim" / "fast" / "__pycache__"
    return in_tree if _writable(in_tree) else _user_cache()


def sources_hash(files: list[str] | tuple[str, ...]) -> str:
    """SHA-256 of the named source files' bytes (in order; a file that cannot be read counts empty)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode())
        try:
            h.update(Path(f).read_bytes())
        except OSError:
            pass
    return h.hexdigest()


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)`` with the cache keyed on :func:`sources_hash` of the
    sources compiled so far and the function's own (see the module note)."""
    import numba

    def decorate(fn: Callable[..., Any]) -> Any:
        own = inspect.getsourcefile(fn) or ""
        _SOURCES.setdefault(own, None)
        dispatcher = numba.njit(cache=True, **options)(fn)
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        if cache_file is not None and hasattr(cache_file, "_source_stamp"):  # Numba 0.5x-0.6x
            cache_file._source_stamp = ("kvlab-sources", sources_hash(tuple(_SOURCES)))
        return dispatcher

    return decorate


ensure_writable_cache()
