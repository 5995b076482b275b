"""Process pools whose workers die with the process that started them.

``concurrent.futures.ProcessPoolExecutor`` workers outlive a parent that is killed outright
(SIGKILL, the OOM killer) or by a signal whose default action ends it before ``finally`` blocks run:
they keep computing for minutes, holding hundreds of MB. :func:`worker_pool` makes each worker

- ask the kernel for SIGKILL when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``, through
  ``ctypes`` as no library in kvlab's stack exposes it), then check that the parent is still the
  one that started it (it may have died before the request took effect);
- elsewhere, watch its parent id from a daemon thread and exit when it changes (within 0.5 s);

and on an exception in the parent (an interrupt included) kills the workers at once instead of
waiting for their running tasks.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterator

_PR_SET_PDEATHSIG = 1


def _die_with(parent_pid: int) -> None:
    """In a worker: end this process when ``parent_pid`` stops being its parent."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # the parent died before the request took effect
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="kvlab-parent-watch", daemon=True).start()


def _start_worker(parent_pid: int, initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    _die_with(parent_pid)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def worker_pool(max_workers: int, *, mp_context: Any = None, initializer: Callable[..., Any] | None = None,
                initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``max_workers`` processes bound to this one (see the module note).

    On leaving the block normally the pool shuts down as usual (running tasks finish); on an
    exception its workers are killed and the exception propagates.
    """
    pool = ProcessPoolExecutor(max_workers=max_workers, mp_context=mp_context, initializer=_start_worker,
                               initargs=(os.getpid(), initializer, initargs))
    try:
        yield pool
    except BaseException:
        # ProcessPoolExecutor has no public way to stop running tasks: its worker table is private
        # but has kept this name and shape since Python 3.2.
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
