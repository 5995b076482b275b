"""The strict stand-in for CuPy's rules (kvlab._strict): it refuses what CuPy refuses and otherwise
gives NumPy's answers."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab import backend
from kvlab._strict import StrictArray

xp = backend.get_xp("strict")


def test_selected_by_name_and_environment(monkeypatch):
    assert backend.backend_name(xp) == "strict"
    monkeypatch.setenv("KVLAB_BACKEND", "strict")
    assert backend.get_xp() is xp


@pytest.mark.parametrize("refused", [
    lambda a: np.asarray(a),                           # implicit device-to-host conversion
    lambda a: np.array(a),
    lambda a: pd.Series(a),
    lambda a: a + np.arange(3),                        # host array mixed into device arithmetic
    lambda a: np.arange(3) * a,
    lambda a: a < np.arange(3),
    lambda a: xp.maximum(a, np.arange(3)),
    lambda a: np.maximum(np.arange(3), a),
    lambda a: xp.maximum(a, [1, 2, 3]),                # a list in an element-wise operation
    lambda a: xp.concatenate([a, np.arange(3)]),
    lambda a: xp.where(np.array([True, False, True]), a, 0),
    lambda a: a.__setitem__(slice(0, 3), np.arange(3)),  # host values through basic indexing
    lambda a: int(a),                                  # scalar conversions of a non-0-d array
    lambda a: float(a[:1]),
    lambda a: bool(a > 0),
    lambda a: range(a[:1]),
    lambda a: backend.array_namespace(a, np.arange(3)),
])
def test_refuses_what_cupy_refuses(refused):
    with pytest.raises(TypeError):
        refused(xp.asarray([1, 2, 3]))


def test_allows_what_cupy_allows_with_numpy_results():
    host = np.array([5, 1, 4, 1, 3])
    a = xp.asarray(host)                               # host-to-device copy
    host[0] = 99                                       # the device copy is its own
    assert a.get().tolist() == [5, 1, 4, 1, 3]
    ref = np.array([5, 1, 4, 1, 3])
    assert isinstance(a[1], StrictArray) and a[1].ndim == 0       # integer indexing gives 0-d arrays
    assert int(a[1]) == 1 and float(a.sum()) == 14.0 and bool(a[0] == 5) and range(5)[a[4]] == 3
    assert a.item(2) == 4 and a.tolist() == ref.tolist()
    assert backend.to_numpy(xp.flatnonzero(a > 2)).tolist() == np.flatnonzero(ref > 2).tolist()
    assert backend.to_numpy(xp.cumsum(a) // 2 + (a % 3)).tolist() == (np.cumsum(ref) // 2 + ref % 3).tolist()
    assert backend.to_numpy(np.maximum(a, 3)).tolist() == np.maximum(ref, 3).tolist()   # dispatched
    assert backend.to_numpy(a[np.array([0, 2])]).tolist() == [5, 4]                     # host index
    a[[0, 1]] = np.array([7, 8])                       # host values under advanced indexing
    a[a > 6] = 0
    b = xp.zeros(5, dtype=xp.int64)
    np.fmax.at(b, xp.asarray([0, 0, 3]), xp.asarray([2, 9, 1]))
    assert a.get().tolist() == [0, 0, 4, 1, 3] and b.get().tolist() == [9, 0, 0, 1, 0]
    assert backend.array_namespace(a, np.float64(1.0), 2) is xp
