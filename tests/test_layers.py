"""kvlab's layers import only downward (face > analyses > simulator > rules > costs > facts > base).

Every ``import`` of a kvlab module inside the package, module-level or deferred into a function,
is read from the source with ``ast`` and checked against the layer table below (design.md's).
A new top-level module must be placed in the table.
"""
from __future__ import annotations

import ast
from pathlib import Path

import kvlab

LAYERS = {
    "base": ["_validate", "_intmath", "_lazy", "_paths", "_staging", "_strict", "_numba_cache", "_workers", "backend"],
    "facts": ["specs", "hf_config", "traces", "prometheus", "lengths", "reservation", "paged", "prefix_cache",
              "prefix_blocks", "arrivals", "trace_window"],
    "costs": ["costmodel", "swap", "pipeline"],
    "rules": ["policies", "predict"],
    "simulator": ["sim"],
    "analyses": ["capacity", "recommend", "validate", "sweep", "presets", "claims", "studies", "preemption_cost", "calibrate",
                 "measure", "plots"],
    "face": ["report", "cli", "__init__", "__version__"],
}
RANK = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}
# Known debts (imports reaching up a layer that have not been moved yet): none.
KNOWN_UPWARD: set[tuple[str, str]] = set()
ROOT = Path(kvlab.__file__).parent


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Top-level kvlab modules that ``path`` (inside package folder ``root``) imports
    (``kvlab.sim.fast`` counts as ``sim``)."""
    here = path.relative_to(root.parent).with_suffix("").parts
    package = here if path.name == "__init__.py" else here[:-1]
    package = package[:-1] if package[-1] == "__init__" else package
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[:len(package) - node.level + 1])
                targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
            elif node.module and node.module.split(".")[0] == "kvlab":
                targets = [node.module.split(".")]
            else:
                continue
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names if a.name.split(".")[0] == "kvlab"]
        else:
            continue
        found.update(t[1] if len(t) > 1 else "__init__" for t in targets)
    return found


def _layer_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[0]


def test_every_module_has_a_layer():
    unplaced = sorted({_layer_of(p) for p in ROOT.rglob("*.py")} - set(RANK))
    assert not unplaced, f"place these kvlab modules in a layer of tests/test_layers.py: {unplaced}"


def test_imports_go_only_downward():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _layer_of(path)
        for target in _imports(path):
            if target in RANK and RANK[target] > RANK[module] and (module, target) not in KNOWN_UPWARD:
                upward.append(f"{path.relative_to(ROOT.parent)} imports kvlab.{target}")
    assert not upward, "imports reaching up a layer:\n" + "\n".join(upward)


def test_the_check_sees_deferred_and_relative_imports(tmp_path):
    # A hand-written module laid out like kvlab/sim/fast/compiled.py: a relative import two
    # packages up, one package up inside a function, and an absolute one.
    folder = tmp_path / "kvlab" / "sim" / "fast"
    folder.mkdir(parents=True)
    (folder / "engine.py").write_text("from ...sweep import sweep\n\ndef f():\n    from ..reference import X\n"
                                      "    import kvlab.capacity\n    from . import queue\n", encoding="utf-8")
    assert _imports(folder / "engine.py", tmp_path / "kvlab") == {"sweep", "sim", "capacity"}
