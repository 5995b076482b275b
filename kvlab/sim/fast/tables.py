"""The compiled loop's result tables, built from host arrays (the reference's tables, column for column)."""
from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import pandas as pd

from ..reference import ITERATION_COLUMNS, PREFIX_ITERATION_COLUMNS
from ..request import FINISH_REASON, RequestStatus
from .state import ABORT_REASONS

#: The per-request state columns :func:`request_columns` reads (host arrays indexed by request row).
STATE_COLUMNS = ("prompt", "output", "admitted_iter", "first_token_iter", "finish_iter", "admitted_s",
                 "first_token_s", "finish_s", "gen", "num_preemptions", "num_swaps", "max_res", "max_used",
                 "last_token_s", "max_tbt_s", "status", "abort_code")
#: The state columns added under prefix caching (tokens).
PREFIX_STATE_COLUMNS = ("prefix_hit", "saved_prefill")


def request_columns(h: Mapping[str, np.ndarray], arrival_s: np.ndarray) -> pd.DataFrame:
    """The per-request columns from the engine state ``h`` (:data:`STATE_COLUMNS`, and
    :data:`PREFIX_STATE_COLUMNS` under prefix caching; tokens, pages, seconds), which the table
    keeps without copying: pass arrays nothing else writes."""
    gen = h["gen"]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_tbt_s = np.where(gen > 1, (h["last_token_s"] - h["first_token_s"]) / (gen - 1), np.nan)
    names = np.array([s.name.lower() for s in RequestStatus], dtype=object)
    reasons = np.array([FINISH_REASON.get(s, "") for s in RequestStatus], dtype=object)
    status = h["status"].astype(np.int64)
    table = pd.DataFrame({
        "prompt_tokens": h["prompt"], "output_tokens": h["output"], "arrival_s": arrival_s,
        "admitted_iter": h["admitted_iter"], "first_token_iter": h["first_token_iter"],
        "finish_iter": h["finish_iter"], "admitted_s": h["admitted_s"], "first_token_s": h["first_token_s"],
        "finish_s": h["finish_s"], "generated_tokens": gen, "num_preemptions": h["num_preemptions"],
        "num_swaps": h["num_swaps"], "max_reserved_pages": h["max_res"], "max_used_pages": h["max_used"],
        "mean_tbt_s": mean_tbt_s, "max_tbt_s": h["max_tbt_s"], "outcome": names[status],
        "finish_reason": reasons[status], "abort_reason": np.array(ABORT_REASONS, dtype=object)[h["abort_code"]],
    }, copy=False)  # the table owns the arrays (their consolidated copy would double a long run's memory)
    if "prefix_hit" in h:
        table["prefix_hit_tokens"], table["saved_prefill_tokens"] = h["prefix_hit"], h["saved_prefill"]
    return table


#: The iteration table's integer columns in the order of the rows of the loop's ``R`` (the prefix ones last).
INT_ITERATION_COLUMNS = tuple(name for name in ITERATION_COLUMNS if name not in ("start_s", "duration_s")) \
    + PREFIX_ITERATION_COLUMNS


def iteration_frame(ints: np.ndarray, times: np.ndarray, keep: Collection[str] | None = None) -> pd.DataFrame:
    """The iteration table around row-per-column arrays, without copying them.

    ``ints``: int64 of shape (13, iterations), the integer columns of :data:`ITERATION_COLUMNS`
    in order (:data:`INT_ITERATION_COLUMNS`), or (15, iterations) with
    :data:`PREFIX_ITERATION_COLUMNS` after them (prefix caching); ``times``: float64 of shape
    (2, iterations), ``start_s`` and ``duration_s``. ``keep``: the columns to keep (in the
    table's order), default all; the rows of the others are not read.
    """
    columns = {**dict(zip(INT_ITERATION_COLUMNS[:ints.shape[0]], ints)), "start_s": times[0], "duration_s": times[1]}
    names = [name for name in ITERATION_COLUMNS + PREFIX_ITERATION_COLUMNS
             if name in columns and (keep is None or name in keep)]
    return pd.DataFrame({name: columns[name] for name in names}, copy=False)
