"""Pool workers die with their parent: killed outright (SIGKILL), stopped (SIGTERM, SIGHUP), or
interrupted inside the block; checked by process id in /proc, with real signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvlab._paths import SHARED_DATA_DIR
from kvlab._workers import worker_pool

from test_report_signals import _alive, _children, _wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _sleep_and_report(_: int) -> int:
    time.sleep(120)
    return os.getpid()


def _parent_with_busy_workers(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A Python process whose two pool workers sleep in a task; returns it and the workers' pids."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import time
        from kvlab._workers import worker_pool
        with worker_pool(2) as pool:
            futures = [pool.submit(time.sleep, 120) for _ in range(2)]
            print("ready", flush=True)
            time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    workers: list[int] = []

    def spawned() -> bool:
        workers[:] = [p for p in _children(proc.pid) if _alive(p)]
        return len(workers) == 2

    _wait_for(spawned, 30, "two workers")
    return proc, workers


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_workers_end_within_seconds_of_their_parent(tmp_path, signum):
    proc, workers = _parent_with_busy_workers(tmp_path)
    try:
        proc.send_signal(signum)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait_for(lambda: not any(map(_alive, workers)), 5, f"workers {workers} to end after {signum.name}")


def test_an_exception_in_the_block_kills_running_workers_at_once():
    start = time.monotonic()
    with pytest.raises(KeyError), worker_pool(2) as pool:
        for i in range(2):
            pool.submit(_sleep_and_report, i)
        time.sleep(1.0)  # let them start
        workers = list(pool._processes)  # the pids of its worker processes
        raise KeyError("stop")
    assert time.monotonic() - start < 20  # did not wait for the 120 s tasks
    _wait_for(lambda: not any(map(_alive, workers)), 5, "the workers to end")


TRACE = SHARED_DATA_DIR / "traces" / "azure2023_conv.csv"


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/data/traces/azure2023_conv.csv")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_recommend_with_workers_leaves_no_process(tmp_path, signum):
    """`kvlab recommend --workers 2` stopped while its workers search: every worker ends (SIGKILL of
    the parent included), and SIGTERM is one line with exit status 128 + 15."""
    proc = subprocess.Popen([sys.executable, "-m", "kvlab.cli", "recommend", str(TRACE), "--model", "Llama-3-8B",
                             "--gpu", "H100-SXM", "--system", "vllm", "--workers", "2", "--no-progress"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        def searching() -> bool:
            workers[:] = [p for p in _children(proc.pid) if _alive(p)]
            return len(workers) == 2 or proc.poll() is not None

        _wait_for(searching, 240, "the workers to start")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if signum == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "interrupted by SIGTERM" in err and "Traceback" not in err
    _wait_for(lambda: not any(map(_alive, workers)), 5, f"workers {workers} to end")
