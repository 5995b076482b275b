import numpy as np
import pytest

from kvlab import backend


def test_numpy_by_name():
    assert backend.get_xp("numpy") is np
    assert backend.backend_name(np) == "numpy"


def test_unknown_backend_lists_choices():
    with pytest.raises(ValueError, match="numpy, cupy, strict, auto"):
        backend.get_xp("jax")


def test_env_var_selects_backend(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "numpy")
    assert backend.get_xp() is np
    monkeypatch.setenv("KVLAB_BACKEND", "tpu")
    with pytest.raises(ValueError, match="KVLAB_BACKEND"):
        backend.get_xp()


@pytest.mark.skipif(backend.cupy_usable(), reason="a GPU is present")
def test_cupy_without_device_is_an_error_and_auto_falls_back():
    with pytest.raises((RuntimeError, ImportError), match="(?i)cupy"):
        backend.get_xp("cupy")
    assert backend.get_xp("auto") is np


def test_to_numpy_and_namespace_on_host():
    a = np.arange(3)
    assert backend.array_namespace(a, 1.0) is np
    assert backend.to_numpy([1, 2]).tolist() == [1, 2]


@pytest.mark.gpu
def test_cupy_round_trip_and_mixed_devices():
    cp = backend.get_xp("cupy")
    a = backend.asarray(np.arange(5), cp)
    assert backend.array_namespace(a) is cp
    assert backend.to_numpy(a * 2).tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(TypeError, match="different devices"):
        backend.array_namespace(a, np.arange(5))
