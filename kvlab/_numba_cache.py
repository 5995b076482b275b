"""Where Numba caches kvlab's compiled code: a folder that can be written, on any install.

Numba's ``cache=True`` writes beside the module (``__pycache__``), else under the user's cache
folder (``~/.cache/numba``); when neither can be written (a read-only install in a container whose
home is read-only too) every decorated function fails at import with "cannot cache function: no
locator available". Importing this module (kvlab's compiled modules do, before Numba) runs
:func:`ensure_writable_cache`:
when neither folder can be written and ``NUMBA_CACHE_DIR`` is unset, it points Numba at a private
folder under the system's temporary folder, with one warning that says so.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_done = False


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


ensure_writable_cache()
