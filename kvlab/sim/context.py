"""The model's context limit, applied to a workload before the engines see it.

A server holds at most ``max_model_len`` tokens of one sequence (prompt + output). As vLLM does:

* a request whose prompt leaves no room for one output token (``prompt_tokens >= max_model_len``)
  is rejected on arrival: it never runs, and its row says ``finished_aborted`` with the reason
  :data:`CONTEXT_REJECT_REASON`;
* every other request generates at most ``max_model_len - prompt_tokens`` tokens: when that is
  below both its own length and ``max_new_tokens``, the engines run it to that length and its row
  says ``finished_length_capped`` (``context_capped`` True).

The engines are unchanged: they receive the admitted requests with their outputs cut at the
context, and :func:`merge` puts the rejected rows back in the workload's order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .request import FINISH_REASON, RequestStatus

#: ``abort_reason`` of a request rejected because its prompt does not fit the context.
CONTEXT_REJECT_REASON = "prompt exceeds the model's context"


@dataclass(frozen=True)
class ContextLimit:
    """Which requests the context rejects or cuts.

    Attributes
    ----------
    max_model_len : int
        The limit (tokens, prompt + output).
    rejected : ndarray of bool
        Per workload row: the prompt does not fit.
    capped : ndarray of bool
        Per workload row: admitted, and its output is cut by the context.
    output_tokens : ndarray of int64
        Output lengths of the admitted rows as the engines see them (tokens).
    """

    max_model_len: int
    rejected: np.ndarray
    capped: np.ndarray
    output_tokens: np.ndarray


def apply_context(prompt_tokens: np.ndarray, output_tokens: np.ndarray, *, max_new_tokens: int,
                  max_model_len: int) -> ContextLimit:
    """The :class:`ContextLimit` of a workload (arrays already validated, tokens)."""
    rejected = prompt_tokens >= max_model_len
    room = max_model_len - prompt_tokens
    capped = ~rejected & (room < np.minimum(output_tokens, max_new_tokens))
    if rejected.all():
        raise ValueError(f"every request's prompt reaches the model's context (max_model_len {max_model_len} "
                         f"tokens; shortest prompt {int(prompt_tokens.min())}): nothing can be served")
    kept = ~rejected
    return ContextLimit(max_model_len=max_model_len, rejected=rejected, capped=capped,
                        output_tokens=np.where(capped, room, output_tokens)[kept])


def merge(table: pd.DataFrame, limit: ContextLimit, *, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
          arrival_s: np.ndarray, request_ids: np.ndarray) -> pd.DataFrame:
    """The request table of the whole workload: the engine's rows of the admitted requests (true
    ``output_tokens`` restored, context-cut ones marked length-capped) and a row per rejected
    request, in workload order, with a bool ``context_capped`` column."""
    kept = np.flatnonzero(~limit.rejected)
    out = table.copy(deep=False)  # columns are replaced, never written in place: ``table`` is left as it was
    out["output_tokens"] = output_tokens[kept]
    cut = limit.capped[kept]
    if cut.any():
        stopped = cut & (out["outcome"].to_numpy() == RequestStatus.FINISHED_STOPPED.name.lower())
        for col, value in (("outcome", RequestStatus.FINISHED_LENGTH_CAPPED.name.lower()),
                           ("finish_reason", FINISH_REASON[RequestStatus.FINISHED_LENGTH_CAPPED])):
            out[col] = np.where(stopped, value, out[col].to_numpy())
    out["context_capped"] = cut
    rej = np.flatnonzero(limit.rejected)
    if rej.size == 0:
        out.index = pd.RangeIndex(len(out))
        return out
    rows = {}
    for col in out.columns:
        dtype = out[col].dtype
        if col == "request_id":
            rows[col] = request_ids[rej]
        elif col == "prompt_tokens":
            rows[col] = prompt_tokens[rej]
        elif col == "output_tokens":
            rows[col] = output_tokens[rej]
        elif col == "arrival_s":
            rows[col] = arrival_s[rej]
        elif col == "outcome":
            rows[col] = np.full(rej.size, RequestStatus.FINISHED_ABORTED.name.lower(), dtype=object)
        elif col == "finish_reason":
            rows[col] = np.full(rej.size, FINISH_REASON[RequestStatus.FINISHED_ABORTED], dtype=object)
        elif col == "abort_reason":
            rows[col] = np.full(rej.size, CONTEXT_REJECT_REASON, dtype=object)
        elif col == "context_capped":
            rows[col] = np.zeros(rej.size, dtype=bool)
        elif col.endswith("_iter") or col == "rank":  # never run: no iteration, no data-parallel rank
            rows[col] = np.full(rej.size, -1, dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            rows[col] = np.full(rej.size, np.nan, dtype=dtype)
        else:  # counts: generated tokens, preemptions, swaps, pages
            rows[col] = np.zeros(rej.size, dtype=dtype)
    both = pd.concat([out.assign(_row=kept), pd.DataFrame(rows).assign(_row=rej)], ignore_index=True)
    return both.sort_values("_row", kind="stable").drop(columns="_row").reset_index(drop=True)
