"""`kvlab report` stopped by SIGTERM or SIGINT leaves no partial folder and no process; a second
run into the same --out fails at once; an --out that cannot be written is one line, exit 2."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from kvlab import _staging
from kvlab.cli import main

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped by its new parent, is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(int(p.name)) == pid]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2:].split()[1])


def _kvlab(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-m", "kvlab.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, timeout_s=90.0, what=""):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _slow_notebook(path: Path) -> Path:
    """A notebook whose kernel starts a grandchild (`sleep`), writes both pids, and waits."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell("pid_file = ''\nresults_path = 'r.json'", metadata={"tags": ["parameters"]}),
                new_code_cell("import os, subprocess, time\nchild = subprocess.Popen(['sleep', '300'])\n"
                              "open(pid_file + '.tmp', 'w').write(f'{os.getpid()} {child.pid}')\n"
                              "os.replace(pid_file + '.tmp', pid_file)\ntime.sleep(300)")]
    nbformat.write(nb, str(path))
    return path


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_removes_the_partial_folder_the_kernel_and_its_children(tmp_path, signum):
    nb = _slow_notebook(tmp_path / "01_slow.ipynb")
    pid_file = tmp_path / "pids"
    proc = _kvlab("report", str(nb), "-p", "pid_file", str(pid_file), "--out", "run", "--no-progress", cwd=tmp_path)
    try:
        _wait_for(lambda: pid_file.exists() or proc.poll() is not None, what="the notebook to execute")
        assert proc.poll() is None, proc.communicate()
        kernel_pid, grandchild_pid = map(int, pid_file.read_text().split())
        assert _alive(kernel_pid) and _alive(grandchild_pid)
        assert [p.name for p in tmp_path.glob(".run.partial-*")]  # the run is mid-way
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum
    assert f"interrupted by {signal.Signals(signum).name}" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_slow.ipynb", "pids"]  # no run, partial or lock
    _wait_for(lambda: not _alive(kernel_pid) and not _alive(grandchild_pid), 10, "the kernel processes to end")


def test_sigterm_during_a_real_quick_report(tmp_path):
    """The brief's case: `kvlab report 01 -p quick true --out X`, stopped once its kernel runs."""
    proc = _kvlab("report", "01", "-p", "quick", "true", "--out", "X", "--no-progress", cwd=tmp_path)
    kids: list[int] = []
    try:
        def executing():
            kids[:] = _children(proc.pid)
            return (kids and any(tmp_path.glob(".X.partial-*"))) or proc.poll() is not None

        _wait_for(executing, what="the kernel to start")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert list(tmp_path.iterdir()) == []
    _wait_for(lambda: not any(map(_alive, kids)), 10, "the kernel to end")


def test_a_second_run_into_the_same_out_fails_at_once(tmp_path, capsys):
    nb = _slow_notebook(tmp_path / "01_slow.ipynb")
    with _staging.staged_folder(tmp_path / "run") as staging:  # a first run holds the lock
        start = time.monotonic()
        assert main(["report", str(nb), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
        assert time.monotonic() - start < 5  # refused before any notebook ran
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "another kvlab run is writing to" in err
        (staging / "index.html").write_text("first")
    assert (tmp_path / "run" / "index.html").read_text() == "first"  # the first run is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_slow.ipynb", "run"]  # lock removed


@pytest.mark.parametrize("out", ["a_file/run", "/proc/kvlab-run"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a folder")
    nb = _slow_notebook(tmp_path / "01_slow.ipynb")
    assert main(["report", str(nb), "--out", out, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvlab report: error: cannot write the output folder {out}") and err.count("\n") == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_one_line_and_exit_2(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    nb = _slow_notebook(tmp_path / "01_slow.ipynb")
    try:
        assert main(["report", str(nb), "--out", str(ro / "run"), "--no-progress"]) == 2
    finally:
        ro.chmod(0o755)
    assert "permission denied" in capsys.readouterr().err


def test_a_yaml_date_parameter_stays_a_string(tmp_path):
    """`-p model 2024-01-01`: YAML reads a date, which a notebook parameter cannot hold."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell("model = 'x'\nresults_path = 'r.json'", metadata={"tags": ["parameters"]}),
                new_code_cell("import kvlab\nkvlab.report.write_results(results_path, {'model': model})")]
    nbformat.write(nb, str(tmp_path / "01_m.ipynb"))
    params = tmp_path / "p.yaml"
    params.write_text("tags: [2024-01-02]\n")
    assert main(["report", str(tmp_path / "01_m.ipynb"), "-p", "model", "2024-01-01", "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "r" / "01_m.json").read_text()) == {"model": "2024-01-01"}
    from kvlab.cli import _load_params_file, _parse_value

    assert _load_params_file(str(params)) == {"tags": ["2024-01-02"]}
    with pytest.raises(ValueError, match="must be a string, number"):
        _parse_value("!!binary aGk=")


def test_a_killed_runs_staging_folder_is_removed_by_the_next_run(tmp_path):
    stale = tmp_path / ".run.partial-abc123"  # what SIGKILL (which no handler sees) leaves
    stale.mkdir()
    (stale / "01_x.ipynb").write_text("{}")
    other = tmp_path / ".other.partial-abc123"  # another destination's: not ours to touch
    other.mkdir()
    with _staging.staged_folder(tmp_path / "run") as staging:
        (staging / "index.html").write_text("ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.partial-abc123", "run"]

