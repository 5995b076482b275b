"""Package attributes imported on first use (PEP 562), so importing a package stays cheap.

A package's ``__init__`` names what it offers and where it lives; :func:`attach` returns the
module-level ``__getattr__``, ``__dir__`` and ``__all__`` that import the defining submodule the
first time a name is read (the pattern of scientific-python's ``lazy_loader.attach``).

One case needs care: a function named like the submodule that defines it (``kvlab.sweep``,
``kvlab.capacity``, ``kvlab.lengths.fit``). The import system binds every loaded submodule on its
package (``setattr(kvlab, "sweep", <module kvlab.sweep>)``), which would hide the function as
soon as anything imports the submodule; :class:`_Package` skips that binding for those names, so
they keep resolving to the function, as they did when the packages imported everything eagerly.
The submodules stay importable (``from kvlab.sweep import ...``) through ``sys.modules``.
"""
from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping


class _Package(types.ModuleType):
    """A package whose functions named like their submodule are not replaced by the submodule."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and name in self.__dict__.get("_function_over_module", ()):
            return
        super().__setattr__(name, value)


def attach(package: str, attributes: Mapping[str, str],
           submodules: tuple[str, ...] = ()) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``; call it from the package's ``__init__``.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    attributes : mapping of str to str
        Public name -> the submodule (relative to ``package``) that defines it.
    submodules : tuple of str
        Submodules reachable as ``package.<name>``.
    """
    names = sorted(set(attributes) | set(submodules))
    module = sys.modules[package]
    module._function_over_module = frozenset(name for name, where in attributes.items() if name == where)
    module.__class__ = _Package

    def module_getattr(name: str) -> object:
        if name in attributes:
            value = getattr(importlib.import_module(f"{package}.{attributes[name]}"), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        vars(module)[name] = value
        return value

    def module_dir() -> list[str]:
        return sorted(set(names) | {n for n in vars(module) if not n.startswith("_")})

    return module_getattr, module_dir, names
