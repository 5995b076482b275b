"""A stand-in for CuPy's rules on the host: device arrays that refuse what CuPy refuses (tests only).

No GPU runs kvlab's CuPy path in CI, yet code that works on NumPy can still fail on CuPy, whose
arrays live on another device: NumPy cannot read them implicitly and they do not mix with host
arrays. ``KVLAB_BACKEND=strict`` (or ``kvlab.backend.get_xp("strict")``) gives array code this
namespace instead: NumPy does the arithmetic, so results equal NumPy's bit for bit, but its
:class:`StrictArray` refuses, with CuPy's ``TypeError``:

* implicit conversion to NumPy: ``numpy.asarray(a)``, ``numpy.array(a)``, a pandas constructor
  (CuPy: "Implicit conversion to a NumPy array is not allowed"); the explicit transfers
  ``a.get()``, ``a.tolist()`` and ``a.item()`` are allowed, and ``numpy.<function>(a)`` runs on
  the device, as CuPy dispatches it;
* mixing with host arrays: a ``numpy.ndarray`` operand of an operator or function (CuPy:
  "Unsupported type"), and a Python list operand of an element-wise operation;
* a host array stored through basic indexing (``a[2:5] = numpy_array``; CuPy converts host
  values only under advanced indexing);
* ``int()``, ``float()``, ``bool()``, ``operator.index()`` of an array that is not 0-d (0-d
  arrays convert, as on CuPy, where each conversion waits for the device).

Like CuPy, integer indexing and reductions return 0-d arrays, not NumPy scalars, so such a value
used where a Python number is needed goes through the conversions above. Creating an array from
host data (``asarray``, ``array``, ``ascontiguousarray``) is the explicit host-to-device copy
and accepts NumPy arrays and lists, as CuPy does; so do indices (CuPy converts NumPy and list
indices to device arrays).

Why not ``array-api-strict``: it checks code against the Python array API standard, which kvlab's
array code does not target: the engine uses NumPy functions CuPy provides and the standard lacks
(``flatnonzero``, ``repeat``, ``searchsorted`` with ``side``, ``fmax``, ``frexp``, ``ufunc.at``,
in-place fancy assignment, ``.astype`` on the array), so it would fail on what runs fine on CuPy,
while what CuPy really refuses (a host array in an expression) is the one thing to catch. This
namespace refuses exactly that and accepts the rest.
"""
from __future__ import annotations

import operator
import types
from typing import Any, Callable

import numpy as np

_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed (kvlab strict backend, as CuPy). "
             "Please use `.get()` to construct a NumPy array explicitly, or kvlab.backend.to_numpy.")
#: Functions that copy host data to the device, accepting NumPy arrays and lists.
_FROM_HOST = frozenset({"asarray", "array", "asanyarray", "ascontiguousarray"})
#: NumPy submodules and I/O the device namespace does not offer.
_ABSENT = frozenset({"random", "linalg", "fft", "ma", "char", "rec", "lib", "testing", "polynomial", "ctypeslib",
                     "load", "save", "savez", "loadtxt", "savetxt", "genfromtxt", "fromfile", "frombuffer"})


def _refuse_host(value: Any, where: str) -> None:
    raise TypeError(f"Unsupported type {type(value)} in {where}: a host (NumPy) array mixed with device arrays "
                    f"(kvlab strict backend, as CuPy); move it with xp.asarray first")


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float, complex, np.generic))


def _operand(x: Any, where: str) -> Any:
    """One operand of an element-wise operation: a device array's data or a scalar."""
    if isinstance(x, StrictArray):
        return x._data
    if _is_scalar(x):
        return x
    if isinstance(x, (np.ndarray, list, tuple)):
        _refuse_host(x, where)
    return x


def _unwrap(x: Any, where: str) -> Any:
    """Arguments of a non-element-wise function: device arrays inside sequences allowed, host arrays not."""
    if isinstance(x, StrictArray):
        return x._data
    if isinstance(x, np.ndarray):
        _refuse_host(x, where)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, where) for v in x)
    return x


def _wrap(x: Any) -> Any:
    """NumPy results as device values: arrays and NumPy scalars become (0-d) StrictArrays."""
    if isinstance(x, np.ndarray):
        return StrictArray(x)
    if isinstance(x, np.generic):
        return StrictArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _index(key: Any) -> Any:
    """An index: device arrays unwrapped; NumPy arrays and lists allowed (CuPy converts them)."""
    if isinstance(key, StrictArray):
        return key._data
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    return key


def _is_advanced(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (StrictArray, np.ndarray, list)) for k in keys)


def _binary(op: Callable[[Any, Any], Any], name: str, reflected: bool = False) -> Callable[..., Any]:
    def method(self: StrictArray, other: Any) -> Any:
        if not isinstance(other, StrictArray) and not _is_scalar(other) \
                and not isinstance(other, (np.ndarray, list, tuple)):
            return NotImplemented
        value = _operand(other, f"operator {name}")
        return _wrap(op(value, self._data) if reflected else op(self._data, value))
    method.__name__ = name
    return method


def _inplace(op: Callable[[Any, Any], Any], name: str) -> Callable[..., Any]:
    def method(self: StrictArray, other: Any) -> StrictArray:
        self._data = op(self._data, _operand(other, f"operator {name}"))
        return self
    method.__name__ = name
    return method


class StrictArray:
    """A device array of the strict stand-in: NumPy data behind CuPy's refusals (see the module)."""

    __slots__ = ("_data",)
    __hash__ = None                 # type: ignore[assignment]

    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    # Explicit transfers to the host.
    def get(self) -> np.ndarray:
        """A NumPy copy of the array (CuPy's device-to-host transfer)."""
        return self._data.copy()

    def tolist(self) -> Any:
        return self._data.tolist()

    def item(self, *args: Any) -> Any:
        return self._data.item(*args)

    # Implicit transfers: refused.
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(_IMPLICIT)

    # NumPy functions and ufuncs given device arrays run on the device, as CuPy dispatches them
    # (``__array_function__``, ``__array_ufunc__``); a host array among the operands is refused.
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        call = _Ufunc(ufunc)
        return call(*inputs, **kwargs) if method == "__call__" else getattr(call, method)(*inputs, **kwargs)

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        return getattr(strict, func.__name__)(*args, **kwargs)

    def _scalar(self, convert: Callable[[Any], Any], name: str) -> Any:
        if self._data.ndim != 0:
            raise TypeError(f"{name}() of a {self._data.ndim}-d device array of shape {self._data.shape}: only 0-d "
                            f"arrays convert to Python scalars here (kvlab strict backend); index or reduce first")
        return convert(self._data[()])

    def __int__(self) -> int:
        return self._scalar(int, "int")

    def __float__(self) -> float:
        return self._scalar(float, "float")

    def __bool__(self) -> bool:
        return self._scalar(bool, "bool")

    def __index__(self) -> int:
        return self._scalar(operator.index, "index")

    def __complex__(self) -> complex:
        return self._scalar(complex, "complex")

    # Shape and container protocol.
    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def T(self) -> StrictArray:
        return StrictArray(self._data.T)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Any:
        return (StrictArray(np.asarray(v)) for v in self._data)

    def __repr__(self) -> str:
        return f"strict.{self._data!r}"

    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._data[_index(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, StrictArray):
            value = value._data
        elif isinstance(value, (np.ndarray, list, tuple)) and np.ndim(value) > 0 and not _is_advanced(key):
            _refuse_host(value, "assignment through basic indexing")
        self._data[_index(key)] = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):      # no NumPy protocol (__array_interface__, buffer, ...) leaks through
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        attr = getattr(self._data, name)
        if callable(attr):
            def method(*args: Any, **kwargs: Any) -> Any:
                where = f"ndarray.{name}"
                return _wrap(attr(*[_unwrap(a, where) for a in args],
                                  **{k: _unwrap(v, where) for k, v in kwargs.items()}))
            return method
        return _wrap(attr)

    __add__, __radd__, __iadd__ = _binary(operator.add, "+"), _binary(operator.add, "+", True), \
        _inplace(operator.iadd, "+=")
    __sub__, __rsub__, __isub__ = _binary(operator.sub, "-"), _binary(operator.sub, "-", True), \
        _inplace(operator.isub, "-=")
    __mul__, __rmul__, __imul__ = _binary(operator.mul, "*"), _binary(operator.mul, "*", True), \
        _inplace(operator.imul, "*=")
    __truediv__, __rtruediv__, __itruediv__ = _binary(operator.truediv, "/"), \
        _binary(operator.truediv, "/", True), _inplace(operator.itruediv, "/=")
    __floordiv__, __rfloordiv__, __ifloordiv__ = _binary(operator.floordiv, "//"), \
        _binary(operator.floordiv, "//", True), _inplace(operator.ifloordiv, "//=")
    __mod__, __rmod__, __imod__ = _binary(operator.mod, "%"), _binary(operator.mod, "%", True), \
        _inplace(operator.imod, "%=")
    __pow__, __rpow__ = _binary(operator.pow, "**"), _binary(operator.pow, "**", True)
    __and__, __rand__, __iand__ = _binary(operator.and_, "&"), _binary(operator.and_, "&", True), \
        _inplace(operator.iand, "&=")
    __or__, __ror__, __ior__ = _binary(operator.or_, "|"), _binary(operator.or_, "|", True), \
        _inplace(operator.ior, "|=")
    __xor__, __rxor__ = _binary(operator.xor, "^"), _binary(operator.xor, "^", True)
    __lshift__, __rshift__ = _binary(operator.lshift, "<<"), _binary(operator.rshift, ">>")
    __matmul__, __rmatmul__ = _binary(operator.matmul, "@"), _binary(operator.matmul, "@", True)
    __lt__, __le__ = _binary(operator.lt, "<"), _binary(operator.le, "<=")
    __gt__, __ge__ = _binary(operator.gt, ">"), _binary(operator.ge, ">=")
    __eq__, __ne__ = _binary(operator.eq, "=="), _binary(operator.ne, "!=")  # type: ignore[assignment]

    def __neg__(self) -> StrictArray:
        return StrictArray(-self._data)

    def __pos__(self) -> StrictArray:
        return StrictArray(+self._data)

    def __abs__(self) -> StrictArray:
        return StrictArray(abs(self._data))

    def __invert__(self) -> StrictArray:
        return StrictArray(~self._data)


class _Ufunc:
    """A NumPy ufunc on device arrays: operands must be device arrays or scalars."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        where = f"ufunc {self.__name__}"
        out = kwargs.get("out")
        kwargs = {k: (_unwrap(v, where) if k == "out" else _operand(v, where) if k == "where" else v)
                  for k, v in kwargs.items()}
        result = self._ufunc(*[_operand(a, where) for a in args], **kwargs)
        return out if out is not None else _wrap(result)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._ufunc, name)        # reduce, accumulate, at, ...
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            where = f"ufunc {self.__name__}.{name}"
            return _wrap(method(*[_unwrap(a, where) for a in args],
                                **{k: _unwrap(v, where) for k, v in kwargs.items()}))
        return call


class _Namespace(types.ModuleType):
    """``xp`` of the strict backend: NumPy's functions on :class:`StrictArray`."""

    ndarray = StrictArray

    def __getattr__(self, name: str) -> Any:
        if name in _ABSENT or name.startswith("_"):
            raise AttributeError(f"the strict device namespace has no {name!r}")
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc):
            value: Any = _Ufunc(attr)
        elif name in _FROM_HOST:
            def value(obj: Any, *args: Any, **kwargs: Any) -> StrictArray:
                if isinstance(obj, StrictArray):           # already on the device: no transfer
                    data = attr(obj._data, *args, **kwargs)
                    return obj if data is obj._data else StrictArray(data)
                return StrictArray(np.array(attr(_unwrap_host(obj), *args, **kwargs), copy=True))
        elif callable(attr) and not isinstance(attr, type):
            def value(*args: Any, **kwargs: Any) -> Any:
                where = f"xp.{name}"
                return _wrap(attr(*[_unwrap(a, where) for a in args],
                                  **{k: _unwrap(v, where) for k, v in kwargs.items()}))
            value.__name__ = name
        else:
            value = attr                              # dtypes, constants (int64, inf, newaxis, ...)
        setattr(self, name, value)
        return value


def _unwrap_host(obj: Any) -> Any:
    """Host data for a host-to-device copy: device arrays inside lists are unwrapped."""
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap_host(v) for v in obj)
    return obj._data if isinstance(obj, StrictArray) else obj


#: The strict array namespace (``kvlab.backend.get_xp("strict")``).
strict = _Namespace("kvlab.strict", __doc__)

__all__ = ["StrictArray", "strict"]
