"""The notebooks a report can run: finding them, their parameters, and who gets which parameter.

Each notebook declares its parameters in a cell tagged ``parameters``, one literal per line with a
trailing comment as its help (``block_size = 16  # tokens per page``); papermill reads them.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

from .._paths import NOTEBOOK_DIR


class ParameterWarning(UserWarning):
    """A given parameter reaches only some of the selected notebooks."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One notebook parameter: its name, Python type name, default (as written) and help."""

    name: str
    type: str
    default: str
    help: str


def list_notebooks(notebook_dir: str | os.PathLike = NOTEBOOK_DIR) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``) in reading order."""
    return sorted(p for p in Path(notebook_dir).glob("[0-9][0-9]_*.ipynb"))


def resolve_notebooks(selectors: Iterable[str] | None = None,
                      notebook_dir: str | os.PathLike = NOTEBOOK_DIR) -> list[Path]:
    """Notebooks named by number (``01``, ``1``), full stem (``01_reservation_tables``), name
    without number (``reservation_tables``) or path; all of them when ``selectors`` is empty."""
    known = list_notebooks(notebook_dir)
    if not selectors:
        if not known:
            raise ValueError(f"no notebooks found in {notebook_dir}")
        return known
    chosen: list[Path] = []
    for sel in selectors:
        s = str(sel)
        p = Path(s)
        if p.suffix == ".ipynb" and p.exists():
            chosen.append(p)
            continue
        stem = p.stem if p.suffix == ".ipynb" else s
        hits = [k for k in known
                if stem in (k.stem, k.stem[:2], k.stem[3:]) or (stem.isdigit() and int(stem) == int(k.stem[:2]))]
        if len(hits) != 1:
            names = ", ".join(k.stem for k in known)
            raise ValueError(f"notebook {s!r} {'is ambiguous' if hits else 'is unknown'}: known notebooks are {names}")
        chosen.append(hits[0])
    return chosen


def _type_name(default: str) -> str:
    try:
        value = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        return "expression"
    return "None" if value is None else type(value).__name__


def _assigned_names(path: str | os.PathLike) -> list[str]:
    """Names assigned in the notebook's ``parameters`` cell, read with Python's parser."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    src = next((c.source for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])), "")
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        raise ValueError(f"notebook {Path(path).stem}: its parameters cell is not valid Python: {exc}") from None
    return [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]


def parameters(path: str | os.PathLike) -> list[Parameter]:
    """The parameters ``path`` declares in its ``parameters`` cell, in the cell's order.

    ``type`` is the type of the default literal (``None`` where the default is ``None``; the help
    says what else it takes); ``help`` is the line's trailing comment.
    """
    import papermill

    info = papermill.inspect_notebook(str(path))
    missed = [name for name in _assigned_names(path) if name not in info]
    if missed:
        raise ValueError(f"notebook {Path(path).stem}: papermill cannot read parameter(s) {', '.join(missed)} in its "
                         "parameters cell (one assignment per line; no '=' inside the trailing help comment)")
    return [Parameter(name, _type_name(str(spec.get("default"))), str(spec.get("default")),
                      re.sub(r"^#\s*", "", str(spec.get("help") or "")).strip())
            for name, spec in info.items()]


def notebook_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """The parameters a notebook declares, with their defaults as written in the cell."""
    return {p.name: p.default for p in parameters(path)}


def format_parameters(paths: Iterable[Path]) -> str:
    """Each notebook's parameters as aligned text: name, type, default and help."""
    blocks = []
    for path in paths:
        params = parameters(path)
        width = [max([len(getattr(p, f)) for p in params] + [len(f)]) for f in ("name", "type")]
        dwidth = min(max([len(p.default) for p in params] + [7]), 28)
        lines = [f"{path.stem}", f"  {'name':<{width[0]}}  {'type':<{width[1]}}  {'default':<{dwidth}}  help"]
        lines += [f"  {p.name:<{width[0]}}  {p.type:<{width[1]}}  {p.default:<{dwidth}}  {p.help}".rstrip()
                  for p in params]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


#: Parameters ``kvlab report`` sets itself: a value given for one is an error, never replaced silently.
SET_BY_REPORT = ("results_path",)

#: Values a parameter takes, by the type of its default (``None`` and expressions take any value).
_ACCEPTS = {"bool": ((bool,), "true or false"), "int": ((int,), "an integer"),
            "float": ((int, float), "a number"), "str": ((str,), "a string"),
            # a list parameter also takes one value (kvlab's functions take a value or a list of them)
            "list": ((list, tuple, str, int, float), "a list or one value"), "dict": ((dict,), "a mapping")}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}... ({len(text):,} characters)"


def check_values(path: Path, values: Mapping[str, Any], declared: Mapping[str, str] | None = None) -> None:
    """``ValueError`` unless each of ``values`` is a parameter ``path`` declares, of its default's
    type (``"yes please"`` is not a bool, ``1.5`` not an int), and not one kvlab report sets."""
    declared = notebook_parameters(path) if declared is None else declared
    for name, value in values.items():
        if name in SET_BY_REPORT:
            raise ValueError(f"parameter {name} of notebook {path.stem} is set by kvlab (the run folder's "
                             f"{path.stem}.json); it cannot be given")
        if name not in declared:
            continue  # unknown names are reported by the caller, with the notebook's parameters
        accepted = _ACCEPTS.get(_type_name(declared[name]))
        if accepted is None:
            continue
        types, what = accepted
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise ValueError(f"parameter {name} of notebook {path.stem} must be {what} (its default is "
                             f"{declared[name][:40]}), got {_shown(value)}")


def split_parameters(paths: list[Path], given: Mapping[str, Any]) -> dict[Path, dict[str, Any]]:
    """Give each notebook the parameters it declares.

    A key is a parameter name (given to every selected notebook that declares it) or, when no
    selected notebook declares it, a notebook selector mapping to that notebook's own
    ``{name: value}`` (as in a YAML file). A name no selected notebook declares raises
    ``ValueError``; a name only some declare warns (:class:`ParameterWarning`), naming the
    notebooks that run without it. Each value is checked by :func:`check_values`.
    """
    declared = {p: notebook_parameters(p) for p in paths}
    per: dict[Path, dict[str, Any]] = {p: {} for p in paths}
    unused = []
    names = {name for d in declared.values() for name in d}
    for key, value in given.items():
        if isinstance(value, Mapping) and key not in names and key not in SET_BY_REPORT:
            try:
                target = resolve_notebooks([key])[0]
            except ValueError:  # neither a parameter nor a notebook
                unused.append(key)
                continue
            if target not in per:
                raise ValueError(f"parameters are given for notebook {target.stem}, which is not in this run")
            unknown = sorted(set(value) - set(declared[target]))
            if unknown:
                raise ValueError(f"notebook {target.stem} has no parameter(s) {', '.join(u[:40] for u in unknown)}; "
                                 f"its parameters are {', '.join(declared[target])}")
            per[target].update(value)
            continue
        reached = [p for p in paths if key in declared[p]]
        if not reached:
            unused.append(key)
            continue
        for p in reached:
            per[p][key] = value
        if len(reached) < len(paths):
            missed = [p.stem for p in paths if p not in reached]
            warnings.warn(f"parameter {key} is used only by {', '.join(p.stem for p in reached)}; "
                          f"{', '.join(missed)} {'does' if len(missed) == 1 else 'do'} not declare it "
                          "and run without it", ParameterWarning, stacklevel=3)
    if unused:
        raise ValueError(f"parameter(s) {', '.join(_shown(u)[1:-1][:40] for u in sorted(unused))} are declared by "
                         f"none of the notebooks {', '.join(p.stem for p in paths)} (kvlab report --list-params "
                         "shows theirs)")
    for p in paths:
        check_values(p, per[p], declared[p])
    return per
