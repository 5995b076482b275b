"""File modes for report output: readable by others, as the user's umask allows.

``tempfile.mkdtemp`` and ``mkstemp`` create private (0700 / 0600) entries; a report is meant to be
read by a web server or a colleague, so run folders and sidecars get the modes an ordinary
``mkdir`` / ``open`` would give them (0755 / 0644 under the usual umask 022).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask (read without changing it for longer than one call)."""
    with _LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def public_dir(path: str | os.PathLike) -> Path:
    """Give the folder ``path`` mode 0777 less the umask (0755 under umask 022)."""
    os.chmod(path, 0o777 & ~umask())
    return Path(path)


def public_file(path: str | os.PathLike) -> Path:
    """Give the file ``path`` mode 0666 less the umask (0644 under umask 022)."""
    os.chmod(path, 0o666 & ~umask())
    return Path(path)
