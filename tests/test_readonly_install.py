"""kvlab runs from a read-only copy whose user's home cannot be written either: Numba's compiled
loop is cached in a private temporary folder, with one warning, the loop built ahead of time is
looked for there, and the answer is the reference's.

Root writes through file modes, so the copy is made read-only by a read-only bind mount in a
private mount namespace (``unshare -m``); the test skips where that is not allowed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import warnings
warnings.simplefilter("always")
import pandas as pd, kvlab
w = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [2, 16], "arrival_s": [0.29, 0.03]})
fast = kvlab.simulate(w, "vllm", model="Llama-3-8B", gpu="H100-SXM").requests.ttft_s.tolist()
ref = kvlab.simulate(w, "vllm", model="Llama-3-8B", gpu="H100-SXM", engine="reference").requests.ttft_s.tolist()
import kvlab.sim.fast.loop  # the JIT loop's module was importable (its cached functions have a locator)
from kvlab._numba_cache import njit


@njit()
def plus_one(x):  # a cached JIT function compiled from the read-only copy
    return x + 1


assert plus_one(1) == 2
print("FILE", kvlab.__file__)
print("SAME", fast == ref)
"""


def _can_mount_read_only(tmp: Path) -> bool:
    if shutil.which("unshare") is None or not hasattr(os, "getuid") or os.getuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount --bind {tmp} {tmp} && mount -o remount,bind,ro {tmp} && ! touch {tmp}/x"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def test_a_read_only_install_with_a_read_only_home_simulates(tmp_path):
    ro, scratch = tmp_path / "install", tmp_path / "tmp"
    scratch.mkdir()
    ro.mkdir()
    if not _can_mount_read_only(ro):
        pytest.skip("needs root and unshare -m to make a read-only mount")
    for part in ("kvlab", "data"):
        shutil.copytree(REPO / part, ro / part, ignore=shutil.ignore_patterns("__pycache__"))
    (ro / "probe.py").write_text(PROBE)
    # the loop built ahead of time for these sources, put where the read-only copy will look for it
    # (the same sources: the same module name), so that the test does not pay a second build
    from kvlab._numba_cache import cache_folder
    from kvlab.sim.fast import aot

    assert aot.load() is not None
    built = aot.module_path(cache_folder(), aot.module_name())
    cache = scratch / f"kvlab-numba-{os.getuid()}"
    cache.mkdir()
    shutil.copy2(built, cache / built.name)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "PYTHONPATH")}
    env.update(HOME=str(ro / "home-that-does-not-exist"), PYTHONPATH=str(ro), TMPDIR=str(scratch))
    script = (f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && "
              f"cd {scratch} && exec {sys.executable} {ro / 'probe.py'}")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"FILE {ro / 'kvlab' / '__init__.py'}" in out.stdout and "SAME True" in out.stdout
    warned = [line for line in out.stderr.splitlines() if "cannot be written: Numba caches" in line]
    assert len(warned) == 1, out.stderr[-2000:]
    assert any(cache.rglob("*.nbi")), "the compiled code was cached in the temporary folder"
    assert "compiling the simulator's loop ahead of time" not in out.stderr, "the module there was not found"
    assert "no locator" not in out.stderr and "internal error" not in out.stderr
