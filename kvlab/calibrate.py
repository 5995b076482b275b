"""Fit cost models to measured tables and check them against measurements.

The measured cost model's curves are fitted to public GPU measurements by
:mod:`kvlab.costmodel.fit` and held out by :mod:`kvlab.costmodel.validate`;
:func:`cost_model_claims` states what those measurements say next to both cost models. This
module also fits and checks against tables measured on your own GPU:

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
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from . import _validate as v
from . import claims as _claims
from .claims import COST_MODELS
from .costmodel import CostModel, cost_model, prefill_attention_pairs, roofline
from .costmodel.fit import SARATHI_GPU, SARATHI_MODEL, SARATHI_TP, predict_batches
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


def profile_work(profile: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A cost model's inputs for each profile row: tokens, attention pairs, KV tokens (sums over
    the batch) and sequences, as :meth:`kvlab.costmodel.CostModel.iteration_s` takes them."""
    tokens, context, batch = (profile[c].to_numpy(dtype=np.int64) for c in ("tokens", "context", "batch"))
    return batch * tokens, batch * prefill_attention_pairs(tokens, context), batch * (context + tokens), batch


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
                        iteration_overhead_s=float(p[2]), label="roofline (efficiencies fitted to a measured profile)")

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


def profile_errors(profile: pd.DataFrame | str | os.PathLike, cost_models: Mapping[str, Any]) -> pd.DataFrame:
    """Each cost model's error on a measured profile, per phase: rows, MAPE and worst case.

    ``cost_models`` maps a name to anything with ``iteration_s`` (e.g. ``{"roofline": ...,
    "measured": ...}``). MAPE is the mean of ``|predicted / measured - 1|``; ``worst`` the
    signed error of largest magnitude.
    """
    table = load_profile(profile)
    work = profile_work(table)
    measured = table["seconds"].to_numpy(dtype=np.float64)
    rows = []
    for name, cost in cost_models.items():
        rel = np.asarray(cost.iteration_s(*work), dtype=np.float64) / measured - 1.0
        for phase in PHASES:
            sel = (table["phase"] == phase).to_numpy()
            if sel.any():
                r = rel[sel]
                rows.append({"cost_model": name, "label": getattr(cost, "label", name), "phase": phase,
                             "rows": int(sel.sum()), "mape": float(np.mean(np.abs(r))),
                             "worst": float(r[np.argmax(np.abs(r))])})
    return pd.DataFrame(rows)


def cost_model_claims(batches: pd.DataFrame) -> pd.DataFrame:
    """What Sarathi-Serve's measured batches say, next to kvlab's value under each cost model.

    ``batches`` is :func:`kvlab.costmodel.data.sarathi_batches` (or the committed published
    figures, :func:`kvlab.costmodel.validate.published_batches`): Yi-34B, TP2 on two A100-80GB
    PCIe. Each claim is computed from the measured rows and from both cost models' predictions
    of the same batches (the measured model with its shipped constants).
    """
    b = batches[~batches["warmup"].astype(bool)].reset_index(drop=True)
    models = {name: cost_model(SARATHI_MODEL, SARATHI_GPU, tp=SARATHI_TP, source=name, stack="sarathi-serve")
              for name in COST_MODELS}
    pred = {name: predict_batches(c, b) for name, c in models.items()}
    setup = _claims.SetUp(model=SARATHI_MODEL, gpu=SARATHI_GPU, tp=SARATHI_TP, scheduler="one batch",
                          metric="batch execution time")
    src = "Sarathi-Serve OSDI'24 artifact (microsoft/sarathi-serve 02d2567)"

    def at(source: str, **match: int) -> int | None:
        sel = b["source"] == source
        for key, val in match.items():
            sel &= b[key] == val
        idx = np.flatnonzero(sel.to_numpy())
        return int(idx[0]) if idx.size else None

    rows: list[_claims.Claim] = []
    for what, source, key, val in (("decode batch of 1 at ~1k context", "figure-2 decode", "decode_seqs", 1),
                                   ("decode batch of 128 at ~1k context", "figure-2 decode", "decode_seqs", 128),
                                   ("prefill of 1,024 tokens", "figure-2 prefill", "prefill_tokens", 1024),
                                   ("prefill of 8,192 tokens", "figure-2 prefill", "prefill_tokens", 8192)):
        i = at(source, **{key: val})
        if i is not None:
            rows.append(_claims.close(
                f"A {what} takes {b['measured_s'][i] * 1e3:,.1f} ms", f"{src}, {source.replace(' ', '/')}.csv",
                b["measured_s"][i] * 1e3, {k: p[i] * 1e3 for k, p in pred.items()}, rel_tol=0.15, unit=" ms",
                source_setup=setup, kvlab_setup=setup, note="within 15%: the issue's target"))
    i1, i128 = at("figure-2 decode", decode_seqs=1), at("figure-2 decode", decode_seqs=128)
    if i1 is not None and i128 is not None:
        def fall(t: Any) -> float:
            return float(t[i1] / (t[i128] / 128))
        rows.append(_claims.close(
            "Per-token decode time falls drastically from batch 1 to 128", f"{src}, figure-2/README.md",
            fall(b["measured_s"].to_numpy()), {k: fall(p) for k, p in pred.items()}, unit="x",
            source_setup=setup, kvlab_setup=setup, note="claimed: the measured fall"))
    pf = b[(b["source"] == "figure-2 prefill") & (b["prefill_tokens"] >= 512)].index.to_numpy()
    if pf.size >= 2:
        def spread(t: Any) -> float:
            per_token = np.asarray(t)[pf] / b["prefill_tokens"].to_numpy()[pf]
            return float(per_token.max() / per_token.min())
        rows.append(_claims.close(
            "Per-token prefill time is about constant from 512 tokens (max / min per-token time)",
            f"{src}, figure-2/README.md", spread(b["measured_s"].to_numpy()),
            {k: spread(p) for k, p in pred.items()}, unit="x", source_setup=setup, kvlab_setup=setup,
            note="claimed: the measured spread over 512-16,384 tokens"))
    dec, hyb = at("table-2", decode_seqs=4, prefill_tokens=0), at("table-2", prefill_tokens=1021)
    if dec is not None and hyb is not None:
        def ratio(t: Any) -> float:
            return float((t[dec] / 4) / (t[hyb] / 1024))
        rows.append(_claims.close(
            "A decode-only batch's per-token time is 85x a piggybacked (hybrid) batch's", f"{src}, table-2/README.md",
            85.0, {k: ratio(p) for k, p in pred.items()}, unit="x", source_setup=setup, kvlab_setup=setup,
            note=f"the measured rows give {ratio(b['measured_s'].to_numpy()):.0f}x"))
    chunked = b[(b["source"] == "figure-9") & (b["prefill_tokens"] == 4095)]
    if len(chunked) and {512, 16384} <= set(chunked["chunk_tokens"]):
        i512 = int(chunked.index[chunked["chunk_tokens"] == 512][0])
        iall = int(chunked.index[chunked["chunk_tokens"] == 16384][0])

        def overhead(t: Any) -> float:
            return float(t[i512] / t[iall])
        rows.append(_claims.close(
            "Prefilling 4,095 tokens in 512-token chunks costs more than in one go (chunked / whole)",
            f"{src}, figure-9/chunking-overhead.csv", overhead(b["measured_s"].to_numpy()),
            {k: overhead(p) for k, p in pred.items()}, rel_tol=0.1, unit="x", source_setup=setup,
            kvlab_setup=setup, note="claimed: the measured ratio; within 10%"))
    return _claims.table(rows)
