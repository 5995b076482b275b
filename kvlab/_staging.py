"""A destination folder built in a hidden staging folder, locked, and cleaned up on any exit.

:func:`staged_folder` is what makes a report run all-or-nothing:

- it takes an exclusive ``flock`` on ``.<name>.lock`` beside the destination, so a second run
  into the same folder fails at once (``ValueError``) instead of after doing all the work;
- it builds the output in ``.<name>.partial-*`` beside the destination and renames it into place
  only when the body finished without an exception;
- staging folders of earlier runs into the same destination that were killed outright (SIGKILL,
  power loss) are removed once the lock is held: no live run can be using them;
- on an exception, on SIGINT, SIGTERM and SIGHUP it removes the staging folder and kills the process
  groups of the child processes that lead their own group. Jupyter kernels are such children
  (``jupyter_client`` starts each one in a new session), so a kernel and everything it started
  go with it. Python's default SIGTERM and SIGHUP actions kill the process without running
  ``finally`` blocks; here these signals raise :class:`Interrupted` instead, so the cleanup runs.

Problems preparing the destination (under a file, read-only, under ``/proc``) raise
``ValueError`` naming the folder: they are bad input, not failed runs.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator

try:  # POSIX only; on other systems the run is not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


#: Signals that stop a run cleanly (SIGHUP: the terminal that started it closed).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT, SIGTERM or SIGHUP); ``signum`` says which.

    A ``KeyboardInterrupt`` so that the libraries below (nbclient, asyncio) unwind and shut
    their kernels down exactly as they do on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (Linux ``/proc``; empty elsewhere)."""
    kids: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return kids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name (field 2) is in parentheses and may hold spaces: parse after it
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def _own_group_children() -> list[int]:
    """Children of this process that lead their own process group (Jupyter kernels)."""
    leaders = []
    for pid in _children(os.getpid()):
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                leaders.append(pid)
    return leaders


def _kill_groups(groups: set[int], sig: int) -> None:
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)


@contextlib.contextmanager
def raising_on_signals(groups: set[int] | None = None) -> Iterator[None]:
    """Within the block SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (once) after sending
    SIGTERM to the child process groups; the groups seen are added to ``groups``."""
    groups = set() if groups is None else groups
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        found = set(_own_group_children())
        groups.update(found)
        _kill_groups(found, signal.SIGTERM)
        if not fired:  # a second signal during the cleanup does not interrupt the cleanup
            fired.append(signum)
            raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _lock(dest: Path) -> Iterator[None]:
    """An exclusive, non-blocking lock on ``.<name>.lock`` beside ``dest``."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = dest.parent / f".{dest.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(f"another kvlab run is writing to {dest} (it holds {path}); "
                             "wait for it to finish or choose another --out") from None
        # the holder before us may have removed the file after we opened it: lock the live one
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def _output_error(dest: Path, exc: OSError) -> ValueError:
    reason = {errno.ENOTDIR: "a part of its path is a file", errno.EEXIST: "a part of its path is a file",
              errno.EACCES: "permission denied", errno.EPERM: "permission denied",
              errno.EROFS: "the file system is read-only",
              errno.ENOENT: "its parent folder does not accept new files"}.get(exc.errno or 0, exc.strerror or str(exc))
    return ValueError(f"cannot write the output folder {dest}: {reason}")


@contextlib.contextmanager
def staged_folder(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden staging folder that becomes ``dest`` when the block succeeds.

    Parameters
    ----------
    dest : path
        The destination folder; it must not exist.

    Raises
    ------
    ValueError
        ``dest`` exists, another run holds its lock, or its parent cannot be created or written.
    Interrupted
        SIGINT, SIGTERM or SIGHUP arrived; the staging folder and child process groups are gone.
    """
    dest = Path(dest)
    if dest.exists():
        raise ValueError(f"output folder {dest} already exists; choose another --out")
    with contextlib.ExitStack() as stack:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_lock(dest))
        except OSError as exc:
            raise _output_error(dest, exc) from None
        if dest.exists():  # a run that held the lock before us has finished
            raise ValueError(f"output folder {dest} already exists; choose another --out")
        for stale in dest.parent.glob(f".{glob.escape(dest.name)}.partial-*"):  # left by a killed run (SIGKILL):
            shutil.rmtree(stale, ignore_errors=True)                           # no live run holds the lock
        groups: set[int] = set()
        with raising_on_signals(groups):
            try:
                tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
            except OSError as exc:
                raise _output_error(dest, exc) from None
            try:
                yield tmp
                os.replace(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                _kill_groups(groups, signal.SIGKILL)  # whatever survived SIGTERM and the kernel shutdown
                raise
