"""The compiled loop's first compile is announced on stderr, and only when Numba will compile."""
from __future__ import annotations

from types import SimpleNamespace

from kvlab.sim.fast import compiled


def _dispatcher(signatures: list, index: dict) -> SimpleNamespace:
    cache_file = SimpleNamespace(_load_index=lambda: index)
    return SimpleNamespace(signatures=signatures, _cache=SimpleNamespace(_cache_file=cache_file))


def test_announced_only_when_nothing_is_loaded_or_cached(capsys):
    assert compiled._compile_notice(_dispatcher([], {})) is not None  # no cached code: compiles
    assert "compiling the simulator's loop" in capsys.readouterr().err
    assert compiled._compile_notice(_dispatcher([], {("sig",): "file.nbc"})) is None  # loads from the cache
    assert compiled._compile_notice(_dispatcher(["sig"], {})) is None  # already loaded in this process
    assert compiled._compile_notice(SimpleNamespace(signatures=[])) is None  # unknown internals: silent
    assert capsys.readouterr().err == ""


def test_the_installed_numba_has_the_cache_index_the_notice_reads():
    from kvlab.sim.fast import loop

    # the notice reads Numba's private cache index; a Numba without it would silence the notice
    index = loop.run_loop._cache._cache_file._load_index()
    assert isinstance(index, dict)
