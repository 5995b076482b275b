"""The loop compiled ahead of time (kvlab.sim.fast.aot) against Numba's JIT loop, and its guards.

The module is built at most once per session (one build costs ~45 CPU-seconds; later sessions
load it from the cache folder while kvlab's sources are unchanged). Both loops run the same
random workloads: their tables must be equal to the bit. The rest checks what keeps it honest:
its name follows every source byte, it refuses arguments it was not compiled for, a failed
build falls back to the JIT loop with one warning, and a run through it imports neither Numba
nor SciPy.
"""
from __future__ import annotations

import os
import shutil
import time
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from kvlab.prefix_blocks import PrefixModel
from kvlab.sim import simulate
from kvlab.sim.fast import aot, compiled

from test_sim_fast_equivalence import random_case, run

_KERNEL = compiled._kernel

def _has_c_compiler() -> bool:
    return aot.c_compiler() is not None


@pytest.fixture(scope="session")
def aot_loop():
    """The ahead-of-time compiled ``run_loop`` (built here when the cache has none for these sources)."""
    if not _has_c_compiler():
        pytest.skip("no C compiler: numba.pycc cannot link the module (kvlab runs the JIT loop)")
    loaded = aot.load()
    assert loaded is not None, "the ahead-of-time build failed (see the RuntimeWarning)"
    return loaded


def _both(monkeypatch, fn):
    """``fn()`` through the AOT loop, then through the JIT loop (``KVLAB_AOT=0``); and which ran (a spy)."""
    ran = []

    def spy():
        entry, ahead = _KERNEL()
        ran.append(ahead)
        return entry, ahead

    monkeypatch.setattr(compiled, "_kernel", spy)
    monkeypatch.setenv("KVLAB_AOT", "1")
    ahead = fn()
    monkeypatch.setenv("KVLAB_AOT", "0")
    jit = fn()
    return ahead, jit, ran


def _assert_identical(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert a.summary.keys() == b.summary.keys()
    np.testing.assert_array_equal(list(a.summary.values()), list(b.summary.values()))


@pytest.mark.parametrize("forms", ["1", "0"])
def test_aot_and_jit_loops_give_identical_tables(aot_loop, monkeypatch, forms):
    """Random cases over every policy, scheduler and preemption mode (the equivalence tests'),
    with the compiled forms and asking every question: the same tables to the bit."""
    monkeypatch.setenv("KVLAB_COMPILED_FORMS", forms)
    for seed in range(0, 240, 7):  # 35 cases: each of the policies several times
        w, policy, kw = random_case(seed)
        ahead, jit, ran = _both(monkeypatch, lambda w=w, policy=policy, kw=kw: run(w, policy, "fast", **kw))
        _assert_identical(ahead, jit)
        assert ran == [True, False]


def test_aot_and_jit_loops_agree_under_a_prefix_cache(aot_loop, monkeypatch):
    """The prefix cache's pool arrays go through the AOT signature too (a shared system prompt)."""
    rng = np.random.default_rng(3)
    w = pd.DataFrame({"prompt_tokens": rng.integers(70, 200, 60), "output_tokens": rng.integers(1, 60, 60),
                      "arrival_s": rng.exponential(0.05, 60).cumsum()})
    kw = dict(model="Llama-2-7B", gpu="A100-80GB-SXM", pool_pages=40, block_size=16, prefix_caching=True,
              prefix_model=PrefixModel(system_prompt_tokens=64, system_prompt_share=0.8), record_iterations=True)
    for policy in ("vllm", "sglang"):
        ahead, jit, ran = _both(monkeypatch, lambda policy=policy: simulate(w, policy, **kw))
        _assert_identical(ahead, jit)
        assert ran == [True, False] and ahead.requests["prefix_hit_tokens"].sum() > 0


def test_module_name_follows_every_source_byte_and_numpy(tmp_path, monkeypatch):
    """A copy of kvlab's sources has the installed name; an edit, a new file, NumPy's version, the CPU
    each change it."""
    copy = tmp_path / "kvlab"
    shutil.copytree(aot._PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    monkeypatch.setattr(aot, "_names", {})
    name = aot.module_name(copy)
    assert name == aot.module_name(aot._PACKAGE) and name.startswith(aot.PREFIX)
    edited = copy / "sim" / "fast" / "loop.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    monkeypatch.setattr(aot, "_names", {})
    assert aot.module_name(copy) not in (name, "")
    edited.write_text(edited.read_text().removesuffix("\n# an edit\n"))
    monkeypatch.setattr(aot, "_names", {})
    assert aot.module_name(copy) == name  # the same bytes again: the same module
    (copy / "extra.py").write_text("")
    monkeypatch.setattr(aot, "_names", {})
    with_file = aot.module_name(copy)
    assert with_file != name
    monkeypatch.setattr(aot.np, "__version__", "0.0.1")
    monkeypatch.setattr(aot, "_names", {})
    other_numpy = aot.module_name(copy)
    assert other_numpy != with_file
    monkeypatch.setattr(aot, "cpu_fingerprint", lambda: "model name : another CPU")  # code tuned to the CPU
    monkeypatch.setattr(aot, "_names", {})
    assert aot.module_name(copy) not in (other_numpy, with_file)


def _arguments() -> list:
    """Arguments of the compiled signature (:data:`kvlab.sim.fast.aot.ARGUMENTS`), zeros of each shape."""
    return [(1.5 if dtype == "float64" else 1) if ndim == 0 else np.zeros((2,) * ndim, dtype=dtype)
            for _, dtype, ndim in aot.ARGUMENTS]


def test_check_arguments_names_what_the_module_was_not_compiled_for():
    args = _arguments()
    aot.check_arguments(tuple(args))  # what it was compiled for: accepted
    assert len(args) == 27 and [a[0] for a in aot.ARGUMENTS][6] == "Q"
    wrong = list(args)
    wrong[6] = args[6].astype(np.float64)
    with pytest.raises(TypeError, match=r"argument 'Q' must be a writable C-contiguous 2-dimensional int64 array, "
                                        r"not a float64 2-dimensional one"):
        aot.check_arguments(tuple(wrong))
    wrong = list(args)
    wrong[21] = np.zeros((2, 4), dtype=np.int64)[:, ::2]  # R, strided
    with pytest.raises(TypeError, match=r"'R' .* not a int64 2-dimensional non-contiguous one"):
        aot.check_arguments(tuple(wrong))
    wrong = list(args)
    wrong[0] = np.zeros((2, 2), dtype=np.int64)  # S has one dimension
    with pytest.raises(TypeError, match=r"'S' .* not a int64 2-dimensional one"):
        aot.check_arguments(tuple(wrong))
    wrong = list(args)
    wrong[4] = 1.0  # cost_kind is an integer
    with pytest.raises(TypeError, match=r"'cost_kind' must be a int64 scalar, not float"):
        aot.check_arguments(tuple(wrong))
    frozen = np.zeros(2, dtype=np.int64)
    frozen.flags.writeable = False
    with pytest.raises(TypeError, match=r"'C' .* read-only"):
        aot.check_arguments(tuple(args[:2] + [frozen] + args[3:]))
    with pytest.raises(TypeError, match="takes 27 arguments, not 26"):
        aot.check_arguments(tuple(args[:-1]))


def test_a_failed_build_warns_once_and_the_jit_loop_runs(tmp_path, monkeypatch, capsys):
    """numba.pycc missing (an import that fails inside the real build): one RuntimeWarning naming
    why, the reason kept so that later processes do not rebuild, and the JIT loop runs."""
    monkeypatch.setattr(aot, "cache_folder", lambda: tmp_path)
    monkeypatch.setattr(aot, "_folders", {})
    monkeypatch.setattr(aot, "_loaded", {})
    monkeypatch.setattr(aot, "_warned", set())
    monkeypatch.setattr(aot, "_failed", {})
    monkeypatch.setitem(sys.modules, "numba.pycc", None)  # import numba.pycc raises ImportError
    monkeypatch.setenv("KVLAB_AOT", "1")
    with pytest.warns(RuntimeWarning, match=r"ahead of time \(ModuleNotFoundError: .*numba\.pycc.*; delete .*\.failed"):
        assert aot.load() is None
    assert "compiling the simulator's loop ahead of time" in capsys.readouterr().err
    failed = tmp_path / f"{aot.module_name()}.failed"
    assert "numba.pycc" in failed.read_text()
    assert not list(tmp_path.glob(f"{aot.PREFIX}*.so"))
    calls = []
    monkeypatch.setattr(aot, "build", lambda *a: calls.append(a))
    monkeypatch.setattr(aot, "_failed", {})  # as a later process: only the kept file remembers
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process already
        entry, ahead = compiled._kernel()
    from kvlab.sim.fast import loop

    assert (entry, ahead) == (loop.run_loop, False) and calls == []  # the kept reason: no second build
    w = pd.DataFrame({"prompt_tokens": [16, 32], "output_tokens": [2, 3]})
    assert simulate(w, "vllm", model="Llama-3-8B", gpu="H100-SXM").summary["num_requests"] == 2


def test_prune_keeps_the_newest_modules_of_other_sources(tmp_path, monkeypatch):
    """After a build: the new module and the two newest others stay; older ones go with their markers."""
    suffix = aot.module_path(tmp_path, "x").name[1:]
    names = [f"{aot.PREFIX}{i:024d}" for i in range(5)]
    for age, name in enumerate(names):  # names[0] newest
        (tmp_path / f"{name}{suffix}").write_bytes(b"")
        (tmp_path / f"{name}.lock").write_bytes(b"")
        os.utime(tmp_path / f"{name}{suffix}", (1e9 - age, 1e9 - age))
    (tmp_path / f"{names[3]}.failed").write_text("reason")
    (tmp_path / "other.so").write_bytes(b"")
    (tmp_path / f"{names[1]}.cpython-399-other.so").write_bytes(b"")  # another interpreter's build
    os.utime(tmp_path / f"{names[1]}.cpython-399-other.so", (1e9 - 1, 1e9 - 1))
    (tmp_path / ".build-killed").mkdir()  # a killed build's folder, two days old
    os.utime(tmp_path / ".build-killed", (time.time() - 2 * 86400,) * 2)
    removed = aot.prune(tmp_path, keep=names[4])  # the oldest one was just built (an older clock)
    assert removed == [names[2], names[3]]
    left = sorted(p.name for p in tmp_path.iterdir())
    locks = [f"{n}.lock" for n in names]  # a lock stays: another process may hold it
    assert left == sorted(["other.so", f"{names[1]}.cpython-399-other.so", *locks,
                           *(f"{n}{suffix}" for n in (names[0], names[1], names[4]))])


def test_prune_skips_a_file_another_process_removed(tmp_path, monkeypatch):
    suffix = aot.module_path(tmp_path, "x").name[1:]
    for i in range(5):
        (tmp_path / f"{aot.PREFIX}{i:024d}{suffix}").write_bytes(b"")
    real = aot._mtime

    def vanishing(path):  # every file's stat fails, as when another prune removed it first
        path.unlink(missing_ok=True)
        return real(path)

    monkeypatch.setattr(aot, "_mtime", vanishing)
    aot.prune(tmp_path, keep=f"{aot.PREFIX}{0:024d}")  # no FileNotFoundError


def test_module_name_follows_numba_and_llvmlite_and_the_interpreter(monkeypatch):
    base = aot.module_name(aot._PACKAGE)
    for patch in ((aot, "_compiler_versions", lambda: b"numba 9.9"),
                  (aot.sys.implementation, "cache_tag", "cpython-399")):
        with monkeypatch.context() as m:
            aot._names.clear()
            m.setattr(*patch)
            assert aot.module_name(aot._PACKAGE) != base
    aot._names.clear()
    assert aot.module_name(aot._PACKAGE) == base


def test_no_c_compiler_fails_the_build_at_once_and_one_process_tries_once(tmp_path, monkeypatch, capsys):
    """Without a compiler the build stops before pycc's long part (nothing announced); a process
    that failed does not try again on its next simulation, even when no failure file could be written."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match="no C compiler on the path"):
        aot.build(tmp_path, "kvlab_loop_x")
    assert "compiling" not in capsys.readouterr().err
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(aot, "_build_once", lambda folder, name: calls.append(name) or "it failed")
    with pytest.warns(RuntimeWarning, match="could not be compiled ahead of time"):
        assert aot.load() is None
    assert aot.load() is None and len(calls) == 1


def test_numba_disable_jit_runs_the_plain_python_loop_not_the_module(monkeypatch):
    from kvlab.sim.fast import compiled, loop

    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    monkeypatch.setattr(aot, "load", lambda: pytest.fail("the ahead-of-time module was asked for"))
    assert compiled._kernel() == (loop.run_loop, False)


def test_a_run_through_the_aot_loop_imports_neither_numba_nor_scipy(aot_loop):
    """A fresh process (the bench's set-up: Llama-2-70B TP2, the default cost model, 10 requests)."""
    code = ("import sys, pandas as pd, kvlab\n"
            "w = pd.DataFrame({'prompt_tokens': [100] * 10, 'output_tokens': [20] * 10})\n"
            "kvlab.simulate(w, 'vllm', model='Llama-2-70B', gpu='A100-80GB-SXM', tp=2, arrivals='poisson', qps=2.0)\n"
            "print(sorted(m for m in ('numba', 'scipy', 'llvmlite') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "KVLAB_AOT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
    assert "compiling" not in out.stderr  # loaded, not built again
