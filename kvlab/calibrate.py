"""Fit the roofline's efficiency factors and overheads, and the host link, to measured tables.

Two measured tables, each produced by :mod:`kvlab.measure` on a GPU or exported from a real
server's benchmark:

* a **profile** of forward passes, columns ``phase`` (``prefill`` or ``decode``), ``tokens``
  (new tokens per sequence: the prefill chunk, 1 for decode), ``context`` (tokens already cached
  per sequence), ``batch`` (sequences), ``seconds``. :func:`fit_roofline` fits
  ``compute_efficiency``, ``bandwidth_efficiency`` and ``iteration_overhead_s`` of
  :func:`kvlab.costmodel.roofline` to it;
* a **copy table**, columns ``direction`` (``d2h`` or ``h2d``), ``copy_bytes`` (bytes per copy),
  ``num_copies``, ``seconds`` (for all of them). :func:`fit_host_link` fits the per-copy latency
  and the link bandwidth of :func:`kvlab.swap.swap_model` to it.

Errors are reported relative to the measurement, since the rows span orders of magnitude.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from . import _validate as v
from .costmodel import CostModel, prefill_attention_pairs, roofline
from .swap import COPY_MODES, SwapModel, swap_model
from .specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model

PROFILE_COLUMNS = ("phase", "tokens", "context", "batch", "seconds")
PHASES = ("prefill", "decode")
COPY_COLUMNS = ("direction", "copy_bytes", "num_copies", "seconds")
DIRECTIONS = ("d2h", "h2d")


def _table(data: pd.DataFrame | str | os.PathLike, columns: tuple[str, ...], what: str) -> pd.DataFrame:
    if isinstance(data, (str, os.PathLike)):
        try:
            data = pd.read_csv(data)
        except (OSError, ValueError, UnicodeError) as exc:  # parser errors are ValueErrors
            raise ValueError(f"{what} file {os.fspath(data)!r} cannot be read as CSV: {exc}") from None
    if not isinstance(data, pd.DataFrame):
        raise ValueError(f"{what} must be a DataFrame or a CSV path, got {type(data).__name__}")
    v.require_columns(data, columns, what)
    if len(data) == 0:
        raise ValueError(f"{what} has no rows")
    return data.reset_index(drop=True)


def _check_rows(table: pd.DataFrame, what: str, positive: tuple[str, ...], nonnegative: tuple[str, ...],
                labels: dict[str, tuple[str, ...]]) -> None:
    for col, allowed in labels.items():
        bad = ~table[col].isin(allowed)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{what} row {i}: {col} {table[col][i]!r} is not one of {', '.join(allowed)}")
    for col in positive + nonnegative:
        x = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(x) | ((x <= 0) if col in positive else (x < 0))
        if bad.any():
            i = int(np.argmax(bad))
            need = "a positive" if col in positive else "a non-negative"
            raise ValueError(f"{what} row {i}: {col} must be {need} number, got {table[col][i]!r}")


def load_profile(data: pd.DataFrame | str | os.PathLike) -> pd.DataFrame:
    """A checked profile table (DataFrame or CSV path): columns :data:`PROFILE_COLUMNS`.

    Raises ``ValueError`` naming the missing columns, or the first bad row and column.
    """
    table = _table(data, PROFILE_COLUMNS, "profile")
    _check_rows(table, "profile", ("tokens", "batch", "seconds"), ("context",), {"phase": PHASES})
    for col in ("tokens", "context", "batch"):
        x = table[col].to_numpy(dtype=np.float64)
        if np.any(x != np.round(x)):
            i = int(np.argmax(x != np.round(x)))
            raise ValueError(f"profile row {i}: {col} must be a whole number of tokens/sequences, got {x[i]!r}")
    decode_bad = (table["phase"] == "decode") & (table["tokens"] != 1)
    if decode_bad.any():
        i = int(np.argmax(decode_bad))
        raise ValueError(f"profile row {i}: a decode row computes tokens=1 per sequence, got {table['tokens'][i]!r}")
    return table.astype({"tokens": np.int64, "context": np.int64, "batch": np.int64, "seconds": np.float64})


def load_copies(data: pd.DataFrame | str | os.PathLike) -> pd.DataFrame:
    """A checked copy table (DataFrame or CSV path): columns :data:`COPY_COLUMNS`."""
    table = _table(data, COPY_COLUMNS, "copy table")
    _check_rows(table, "copy table", ("copy_bytes", "num_copies", "seconds"), (), {"direction": DIRECTIONS})
    return table.astype({"copy_bytes": np.int64, "num_copies": np.int64, "seconds": np.float64})


def select_model(table: pd.DataFrame, model: str | ModelSpec) -> pd.DataFrame:
    """The rows of ``model`` when ``table`` has a ``model`` column (as :func:`kvlab.measure.run`
    writes it), else ``table`` itself; ``ValueError`` when the column lacks the model."""
    if "model" not in table.columns:
        return table
    name = _model(model).name
    rows = table[table["model"] == name]
    if rows.empty:
        raise ValueError(f"table has no rows of model {name!r}: its models are "
                         f"{', '.join(map(str, table['model'].unique()))}")
    return rows.reset_index(drop=True)


def profile_work(profile: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The roofline's inputs for each profile row: tokens, attention pairs, KV tokens (sums over
    the batch), as :meth:`kvlab.costmodel.CostModel.iteration_s` takes them."""
    tokens, context, batch = (profile[c].to_numpy(dtype=np.int64) for c in ("tokens", "context", "batch"))
    return batch * tokens, batch * prefill_attention_pairs(tokens, context), batch * (context + tokens)


@dataclass(frozen=True, kw_only=True, eq=False)
class RooflineFit:
    """A roofline fitted to a profile.

    ``rel_rmse`` is the root mean square of (predicted - measured) / measured over the rows,
    ``max_abs_rel_error`` the largest such error; ``table`` is the profile with ``predicted_s``
    and ``rel_error`` columns.
    """

    cost_model: CostModel
    compute_efficiency: float
    bandwidth_efficiency: float
    iteration_overhead_s: float
    rel_rmse: float
    max_abs_rel_error: float
    table: pd.DataFrame


def fit_roofline(profile: pd.DataFrame | str | os.PathLike, model: str | ModelSpec, gpu: str | GPUSpec, *,
                 tp: int = 1) -> RooflineFit:
    """Fit ``compute_efficiency``, ``bandwidth_efficiency`` and ``iteration_overhead_s`` to a profile.

    Minimises the squared log ratio of predicted to measured seconds with
    ``scipy.optimize.least_squares`` (bounded: efficiencies in [0.001, 1], overhead >= 0), from
    a few starting points because the roofline's ``max`` makes the loss non-smooth. A parameter
    the profile does not exercise (say, bandwidth with prefill rows only) stays near its start.

    Examples
    --------
    >>> import pandas as pd
    >>> from kvlab.costmodel import roofline
    >>> true = roofline("Llama-3-8B", "H200", compute_efficiency=0.5, iteration_overhead_s=0.001)
    >>> prof = pd.DataFrame({"phase": ["prefill"] * 4 + ["decode"] * 2, "tokens": [256, 1024, 4096, 8192, 1, 1],
    ...                      "context": [0, 0, 0, 0, 2048, 4096], "batch": [1, 1, 1, 1, 64, 8]})
    >>> prof["seconds"] = true.iteration_s(*profile_work(prof))
    >>> round(fit_roofline(prof, "Llama-3-8B", "H200").compute_efficiency, 3)
    0.5
    """
    table = load_profile(profile)
    m, g = _model(model), _gpu(gpu)
    tp = v.positive_int(tp, "tp")
    work = profile_work(table)
    measured = table["seconds"].to_numpy(dtype=np.float64)

    def build(p: np.ndarray) -> CostModel:
        return roofline(m, g, tp=tp, compute_efficiency=float(p[0]), bandwidth_efficiency=float(p[1]),
                        iteration_overhead_s=float(p[2]))

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.log(build(p).iteration_s(*work) / measured)

    lower, upper = [1e-3, 1e-3, 0.0], [1.0, 1.0, max(float(measured.max()), 1e-9)]
    starts = [[ce, be, min(1e-3, float(measured.min()) / 2)] for ce in (0.3, 0.7) for be in (0.4, 0.9)]
    best = min((least_squares(residuals, x0, bounds=(lower, upper), method="trf") for x0 in starts),
               key=lambda r: r.cost)
    cost = build(best.x)
    predicted = np.asarray(cost.iteration_s(*work), dtype=np.float64)
    rel = predicted / measured - 1.0
    return RooflineFit(cost_model=cost, compute_efficiency=float(best.x[0]), bandwidth_efficiency=float(best.x[1]),
                       iteration_overhead_s=float(best.x[2]), rel_rmse=float(np.sqrt(np.mean(rel ** 2))),
                       max_abs_rel_error=float(np.abs(rel).max()),
                       table=table.assign(predicted_s=predicted, rel_error=rel))


@dataclass(frozen=True, kw_only=True, eq=False)
class LinkFit:
    """Host-link latency and bandwidth fitted to a copy table (``rel_rmse`` as in :class:`RooflineFit`)."""

    link_bytes_per_s: float
    copy_latency_s: float
    rel_rmse: float
    max_abs_rel_error: float
    table: pd.DataFrame

    def swap_model(self, model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1,
                   copy_mode: str = "per_page") -> SwapModel:
        """:func:`kvlab.swap.swap_model` with this fit's latency and bandwidth."""
        v.choice(copy_mode, "copy_mode", COPY_MODES)
        return swap_model(model, gpu, tp=tp, copy_mode=copy_mode, link_bytes_per_s=self.link_bytes_per_s,
                          copy_latency_s=self.copy_latency_s)


def fit_host_link(copies: pd.DataFrame | str | os.PathLike) -> LinkFit:
    """Fit ``seconds = num_copies x (copy_latency_s + copy_bytes / link_bytes_per_s)``.

    The model is linear in (latency, 1 / bandwidth): a non-negative least-squares fit
    (``scipy.optimize.nnls``) with each row divided by its measured seconds, so small and large
    copies weigh alike. Both directions are pooled (swap pays both).
    """
    table = load_copies(copies)
    n = table["num_copies"].to_numpy(dtype=np.float64)
    total_bytes = n * table["copy_bytes"].to_numpy(dtype=np.float64)
    measured = table["seconds"].to_numpy(dtype=np.float64)
    if len(np.unique(table["copy_bytes"])) < 2:
        raise ValueError("copy table must hold at least two copy sizes (copy_bytes) to separate latency "
                         "from bandwidth")
    a = np.column_stack([n, total_bytes * 1e-9]) / measured[:, None]   # 1e-9: condition the columns
    (latency, ns_per_byte), _ = nnls(a, np.ones_like(measured))
    if ns_per_byte <= 0:
        raise ValueError("copy table shows no growth of time with bytes: cannot fit a link bandwidth")
    predicted = n * latency + total_bytes * ns_per_byte * 1e-9
    rel = predicted / measured - 1.0
    return LinkFit(link_bytes_per_s=1e9 / ns_per_byte, copy_latency_s=float(latency),
                   rel_rmse=float(np.sqrt(np.mean(rel ** 2))), max_abs_rel_error=float(np.abs(rel).max()),
                   table=table.assign(predicted_s=predicted, rel_error=rel))
