"""How far to trust an answer: the cost model's validated error on real-server runs of that GPU family.

:func:`trust` reads committed derived figures, never typed-in ones:
``data/costmodels/real_server_errors.csv``, one row per measured run of ``../shared/data/serving``
and stack: the default cost model (stack "none", nothing fitted to these runs) and each fitted
stack's *held-out* error (from the stack's cost-model file: leave-one-run-out, or for a stack fitted to
fixed-concurrency points leave-one-GPU-out, those rows with no overload call), with the kernel era
each was priced on (``kernels``: the run's engine's, or the stack's); an answer counts only the runs
priced on its own era. ``python -m
kvlab.validate`` remakes the stacks and this file from the shared runs and the built-in points.
"""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from .._paths import DATA_DIR
from ..specs import NO_P2P

ERRORS_PATH = DATA_DIR / "costmodels" / "real_server_errors.csv"
#: One row per fixed-concurrency point of :mod:`.points` replayed on the default model (``python -m kvlab.validate``).
POINT_ERRORS_PATH = DATA_DIR / "costmodels" / "point_errors.csv"
POINT_COLUMNS = ("dataset", "point", "server", "gpu", "model", "tp", "ttft_mean_err", "e2e_mean_err", "tpot_mean_err")
COLUMNS = ("dataset", "run", "gpu", "model", "stack", "kernels", "held_out", "ttft_mean_err", "e2e_mean_err",
           "tpot_mean_err", "overload_right", "cost_model")


def gpu_family(gpu: str) -> str:
    """A GPU's family: its name up to the first hyphen (``A100-80GB-SXM`` -> ``A100``)."""
    return re.split(r"[-\s]", str(gpu).strip(), maxsplit=1)[0].upper()


def stack_of(cost_model: Any, stack: str | None = None) -> str:
    """The stack a ``cost_model`` / ``stack`` pair prices with: a cost-model file's name, a stacked
    object's terms' name, else ``stack`` or ``"none"``."""
    from ..costmodel.stacks import is_cost_model_file, load

    if isinstance(cost_model, str) and is_cost_model_file(cost_model):
        return load(cost_model).name
    terms = getattr(cost_model, "terms", None)
    if terms is not None:
        return terms.name
    return stack or "none"


def kernels_of(cost_model: Any, stack: str | None = None) -> str:
    """The kernel era (:data:`kvlab.costmodel.measured.KERNEL_ERAS`, ``"today"`` for None) a ``cost_model`` /
    ``stack`` pair prices with: a cost-model file's, a model object's (or its base's), a named stack's."""
    from ..costmodel.measured import constants
    from ..costmodel.stacks import load, named_file

    named = named_file(cost_model, stack)
    if named:
        era = load(named).kernels
    elif cost_model is not None and not isinstance(cost_model, str):
        era = getattr(cost_model, "kernels", getattr(getattr(cost_model, "base", None), "kernels", None))
    else:
        era = constants().get("stacks", {}).get(stack or "none", {}).get("kernels")
    return era or "today"


def _measured(rows: pd.DataFrame) -> str:
    """What ``rows`` are, counted: measured runs (an overload call each) and fixed-concurrency points (none)."""
    calls = int(rows["overload_right"].notna().sum())
    points = len(rows) - calls
    return " and ".join([*([f"{calls} measured vLLM run{'s' if calls != 1 else ''}"] if calls else []),
                         *([f"{points} measured vLLM point{'s' if points != 1 else ''} at fixed concurrency"]
                           if points else [])])


def _overload(rows: pd.DataFrame) -> str:
    """``; overload called right on k of n`` over the rows that make a call (a closed loop's points make none)."""
    called = rows[rows["overload_right"].notna()]
    return f"; overload called right on {int(called['overload_right'].astype(bool).sum())} of {len(called)}" \
        if len(called) else ""


def _medians(rows: pd.DataFrame) -> str:
    med = {m: float(rows[f"{m}_mean_err"].abs().median()) for m in ("ttft", "e2e", "tpot")}
    return f"mean TTFT {med['ttft']:.1%}, mean E2E {med['e2e']:.1%}, TPOT {med['tpot']:.1%}"


def trust(cost_model: Any = None, gpu: str = "", stack: str | None = None, family: str = "") -> str:
    """One line: the validated error of ``cost_model`` with ``stack`` on real-server runs of ``gpu``'s family.

    E.g. "real servers (vLLM V0, stack vllm-v0): median |error| on 8 measured vLLM runs on A100,
    held out: mean TTFT 15.1%, mean E2E 7.7%, TPOT 7.8%; overload called right on 8 of 8", or, where
    no run of that GPU family validates the stack, that the answer is not checked there (with the
    stack's errors where it is validated). ``family`` is the server's version family, named first.
    A source asked for by name (``"measured"``, ``"roofline"``) counts only the runs that source priced.
    """
    line = _validated(cost_model, gpu, stack, family)
    hidden = _hidden_cpu(cost_model, stack)
    return line if hidden is None else (
        f"{line}; its CPU time per iteration is not identified: the fitted runs' GPU iterations (p10 "
        f"{hidden * 1e3:.3g} ms) hid it, so where this set-up's iterations are shorter (a small model on a fast GPU) "
        "the server may be CPU-bound and slower per token than kvlab predicts")


def _hidden_cpu(cost_model: Any, stack: str | None) -> float | None:
    """The ``cpu_not_identified_below_s`` of the stack a ``cost_model`` / ``stack`` pair prices with
    (a cost-model file's, a stacked object's terms'; see :func:`kvlab.validate.calibrate.hidden_cpu_bound_s`)."""
    from ..costmodel.stacks import load, named_file

    named = named_file(cost_model, stack)
    terms = load(named) if named else getattr(cost_model, "terms", None)
    value = None if terms is None else terms.meta.get("cpu_not_identified_below_s")
    return None if value is None else float(value)


def _validated(cost_model: Any, gpu: str, stack: str | None, family: str) -> str:
    """:func:`trust`'s line without the identification caveat."""
    from ..specs import gpu as _gpu

    name = _gpu(gpu).name if gpu else ""
    fam = gpu_family(name)
    st = stack_of(cost_model, stack)
    who = f"real servers ({family + ', ' if family else ''}stack {st}{' = GPU time only, none fitted' if st == 'none' else ''})"
    if not ERRORS_PATH.exists():
        return f"{who}: no validation figures shipped ({ERRORS_PATH.name} absent)"
    df = pd.read_csv(ERRORS_PATH, dtype={"kernels": str})
    mine = df[(df["stack"] == st) & (df["kernels"] == kernels_of(cost_model, stack))]  # runs priced on its kernels
    if cost_model in ("measured", "roofline"):  # a source asked for by name: only runs priced by it
        mine = mine[mine["cost_model"].astype(str).str.startswith(cost_model)]
    rows = mine[mine["gpu"].map(gpu_family) == fam]
    if rows.empty:
        if mine.empty:
            return f"{who}: no measured run validates it; the answer is not checked against a real server"
        have = ", ".join(sorted(set(mine["gpu"].map(gpu_family))))
        how = "held out" if bool(mine["held_out"].all()) else "nothing fitted to them"
        return (f"{who}: not validated on {fam or 'this GPU'}, so the answer is not checked against a real server "
                f"there; on {_measured(mine)} on {have} ({how}) its median |error| is {_medians(mine)}")
    how = "held out" if bool(rows["held_out"].all()) else "nothing fitted to them"
    no_p2p = int(rows["cost_model"].astype(str).str.contains(NO_P2P, regex=False).sum())
    host = (f"; {no_p2p} of them replayed without GPU peer-to-peer, as their host is taken to have run, so on a "
            "host with it a TP or expert-parallel run's collectives are checked less") if no_p2p else ""
    return f"{who}: median |error| on {_measured(rows)} on {fam} ({how}{host}): {_medians(rows)}{_overload(rows)}"


def point_trust(systems: list[str], gpu: Any) -> str:
    """One line: the default model's validated error on NVIDIA's measured fixed-concurrency points of each of
    ``systems`` (server profiles' ``system``: ``vllm``, ``sglang``, ``tensorrt-llm``) on ``gpu``'s family (a catalogue
    name or a :class:`~kvlab.specs.GPUSpec`), read from
    :data:`POINT_ERRORS_PATH`; ``""`` where none was measured there."""
    from ..specs import gpu as _gpu

    if not POINT_ERRORS_PATH.exists() or not gpu:
        return ""
    df = pd.read_csv(POINT_ERRORS_PATH)
    fam = gpu_family(gpu.name if hasattr(gpu, "name") else _gpu(gpu).name)  # a user's own GPU spec: its own name
    parts = []
    for system in dict.fromkeys(systems):
        rows = df[(df["server"].str.lower() == system) & (df["gpu"].map(gpu_family) == fam)]
        if len(rows):
            parts.append(f"{rows['server'].iloc[0]} on {fam}: {len(rows)} points, median |error| {_medians(rows)}")
    if not parts:
        return ""
    return ("NVIDIA's measured points at fixed concurrency (aiconfigurator's silicon sample; FP8 weights, closed "
            "loop; GPU time only, nothing fitted to them): " + "; ".join(parts))


def regenerate_points(path=POINT_ERRORS_PATH) -> pd.DataFrame:
    """Remake :data:`POINT_ERRORS_PATH`: every built-in point (:mod:`.points`) replayed on the default model."""
    from .points import read_points, replay_point

    df = pd.DataFrame([replay_point(p)[0] for p in read_points()])[list(POINT_COLUMNS)]
    df.to_csv(path, index=False, float_format="%.5g")
    return df


def regenerate(path=ERRORS_PATH) -> pd.DataFrame:
    """Remake :data:`ERRORS_PATH` from the shared runs (default model) and the shipped stacks' held-out errors."""
    from ..costmodel.stacks import load, named_stacks
    from .readers import read_shared
    from .replay import compare, replay

    runs = read_shared()
    if not runs:
        raise ValueError("../shared/data/serving is absent: nothing to validate")
    rows = []
    for r in runs:
        c = compare(replay(r))
        rows.append({**{k: c[k] for k in COLUMNS if k in c}, "stack": "none", "kernels": r.setup.kernels or "today",
                     "held_out": False})
    for name in named_stacks():
        terms = load(name)
        for row in (terms.meta.get("held_out") or {}).get("runs", []):
            rows.append({**{k: row[k] for k in COLUMNS if k in row}, "model": row.get("model", ""),
                         "stack": name, "kernels": terms.kernels or "today", "held_out": True})
    df = pd.DataFrame(rows)[list(COLUMNS)]
    df.to_csv(path, index=False, float_format="%.5g")
    return df

