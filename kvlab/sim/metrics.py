"""Tables and summary figures of a finished simulation."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .context import CONTEXT_REJECT_REASON
from .reference import ITERATION_COLUMNS, PREFIX_ITERATION_COLUMNS
from .request import FINISH_REASON, Request, RequestStatus

PERCENTILES = (50, 90, 99)
#: The iteration columns :func:`summarize` reads (with :data:`PREFIX_ITERATION_COLUMNS` under prefix
#: caching): an engine asked for the summary only keeps these.
SUMMARY_ITERATION_COLUMNS = ("start_s", "duration_s", "batch_size", "decode_tokens", "pages_used", "pages_reserved")


def request_table(requests: list[Request], request_ids: np.ndarray, *, prefix_caching: bool = False) -> pd.DataFrame:
    """One row per request: timings (seconds), iteration indices, tokens, pages, outcome.

    Iteration indices are -1 where the event never happened; times are NaN there. Under prefix
    caching two more columns: ``prefix_hit_tokens`` (its hit at first admission) and
    ``saved_prefill_tokens`` (its hits over all admissions), in tokens.
    """
    rows = []
    for r in requests:
        mean_tbt_s = ((r.last_token_s - r.first_token_s) / (r.generated_tokens - 1)
                      if r.generated_tokens > 1 else np.nan)
        rows.append((r.prompt_tokens, r.output_tokens, r.arrival_s, r.admitted_iter, r.first_token_iter,
                     r.finish_iter, r.admitted_s, r.first_token_s, r.finish_s, r.generated_tokens,
                     r.num_preemptions, r.num_swaps, r.max_reserved_pages, r.max_used_pages,
                     mean_tbt_s, r.max_tbt_s, r.status.name.lower(), FINISH_REASON.get(r.status, ""),
                     r.abort_reason))
    table = pd.DataFrame(rows, columns=[
        "prompt_tokens", "output_tokens", "arrival_s", "admitted_iter", "first_token_iter", "finish_iter",
        "admitted_s", "first_token_s", "finish_s", "generated_tokens", "num_preemptions", "num_swaps",
        "max_reserved_pages", "max_used_pages", "mean_tbt_s", "max_tbt_s", "outcome", "finish_reason",
        "abort_reason"])
    table.insert(0, "request_id", request_ids)
    table.insert(table.columns.get_loc("mean_tbt_s"), "ttft_s", table["first_token_s"] - table["arrival_s"])
    table.insert(table.columns.get_loc("mean_tbt_s"), "e2e_s", table["finish_s"] - table["arrival_s"])
    aborted = table["outcome"] == RequestStatus.FINISHED_ABORTED.name.lower()
    table.loc[aborted, "e2e_s"] = np.nan
    if prefix_caching:
        table["prefix_hit_tokens"] = np.array([r.prefix_hit_tokens for r in requests], dtype=np.int64)
        table["saved_prefill_tokens"] = np.array([r.saved_prefill_tokens for r in requests], dtype=np.int64)
    return table


def iteration_table(rows: list[tuple], *, prefix_caching: bool = False) -> pd.DataFrame:
    """One row per iteration (times in seconds, counts in requests, tokens and pages); under prefix
    caching with :data:`kvlab.sim.reference.PREFIX_ITERATION_COLUMNS` too."""
    cols = list(ITERATION_COLUMNS) + (list(PREFIX_ITERATION_COLUMNS) if prefix_caching else [])
    return pd.DataFrame(rows, columns=cols)


def summarize(requests: pd.DataFrame, iterations: pd.DataFrame, *, num_pages: int) -> dict[str, float]:
    """The run's headline figures.

    * ``num_requests``, ``num_completed``, ``num_aborted`` (including ``num_rejected_context``:
      prompts that reach the model's context), ``num_length_capped`` (including
      ``num_context_capped``: outputs cut at the context, :mod:`kvlab.sim.context`);
    * ``tokens_per_s``, ``requests_per_s``: generated tokens and completed (not aborted)
      requests over the makespan (first arrival to end of the last iteration);
    * ``{ttft,e2e}_p{50,90,99}_s``: over completed requests;
    * ``tbt_p{50,90,99}_s``: over every gap between two consecutive output tokens of every
      completed request (:func:`token_gaps_s`; Sarathi-Serve's P99 TBT), with
      ``num_tbt_max_only_requests`` the requests that contributed only their longest gap;
    * ``normalized_latency_s_per_token``: mean over completed requests of end-to-end latency /
      generated tokens (the vLLM paper's serving metric);
    * ``preemptions_per_request``, ``preempted_request_frac``;
    * ``mean_kv_used_frac``, ``mean_kv_reserved_frac``: time-weighted shares of the pool held
      / promised; ``reserved_unused_page_s``: promised-but-empty pages x seconds;
    * ``max_running``, ``mean_batch_size`` (time-weighted), ``num_iterations``;
    * prefix caching (0 when it is off): ``prefix_hit_rate`` (tokens hit at first admission /
      prompt tokens of the requests admitted), ``saved_prefill_tokens`` (hit tokens over all
      admissions: prefill not computed), ``mean_pages_cached`` / ``max_pages_cached``
      (time-weighted mean and peak of the pages no request holds that keep a cached block),
      ``mean_pages_shared_saved`` / ``max_pages_shared_saved`` (pages sharing saves: block-table
      entries minus distinct pages in use).

    Data-parallel ranks (a ``rank`` column in both tables, :mod:`kvlab.sim.data_parallel`): each rank's
    iterations are rows of their own (``num_iterations`` counts them all), token gaps are taken per
    rank, and the pool shares are of one rank's ``num_pages``, averaged over the ranks' rows.
    """
    done = (requests["outcome"] != RequestStatus.FINISHED_ABORTED.name.lower()).to_numpy()  # completed (mask)
    num_done = int(done.sum())
    iteration_end_s = (iterations["start_s"] + iterations["duration_s"]).to_numpy()
    end_s = float(iteration_end_s.max()) if len(iterations) else 0.0
    makespan_s = end_s - float(requests["arrival_s"].min())
    dur = iterations["duration_s"].to_numpy(dtype=np.float64)
    total_s = float(dur.sum())
    product = np.empty_like(dur)  # one array for every product below (each as long as the run)

    def tw(values: pd.Series) -> float:
        return float(np.multiply(values.to_numpy(), dur, out=product).sum() / total_s) if total_s > 0 \
            else float("nan")

    out: dict[str, float] = {
        "num_requests": float(len(requests)),
        "num_completed": float(num_done),
        "num_aborted": float(len(requests) - num_done),
        "num_length_capped": float((requests["outcome"] == "finished_length_capped").sum()),
        "num_rejected_context": float((requests["abort_reason"] == CONTEXT_REJECT_REASON).sum()),
        "num_context_capped": (float(requests["context_capped"].sum()) if "context_capped" in requests.columns
                               else 0.0),
        "makespan_s": makespan_s,
        "tokens_per_s": float(requests["generated_tokens"].sum()) / makespan_s if makespan_s > 0 else float("nan"),
        "requests_per_s": num_done / makespan_s if makespan_s > 0 else float("nan"),
    }
    for name, col in (("ttft", "ttft_s"), ("e2e", "e2e_s")):
        vals = requests[col].to_numpy()[done]
        vals = vals[~np.isnan(vals)]
        for q in PERCENTILES:
            out[f"{name}_p{q}_s"] = float(np.percentile(vals, q)) if vals.size else float("nan")
    if "rank" in iterations.columns:  # data-parallel ranks: a request's iterations are its rank's (own indices)
        parts = [_token_gap_counts(requests[requests["rank"].to_numpy() == r],
                                   iterations[iterations["rank"].to_numpy() == r].reset_index(drop=True))
                 for r in range(int(requests["rank"].max()) + 1)]
        gap_s, gap_count = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
        max_only = sum(p[2] for p in parts)
    else:
        gap_s, gap_count, max_only = _token_gap_counts(requests, iterations, iteration_end_s)
    del iteration_end_s  # (as long as the run: let go before the percentiles)
    for q, value in zip(PERCENTILES, _weighted_percentiles(gap_s, gap_count, PERCENTILES)):
        out[f"tbt_p{q}_s"] = value
    out["num_tbt_max_only_requests"] = float(max_only)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_token = requests["e2e_s"].to_numpy()[done] / requests["generated_tokens"].to_numpy()[done]
    out["normalized_latency_s_per_token"] = float(pd.Series(per_token).mean()) if num_done else float("nan")
    out.update({
        "preemptions_per_request": float(requests["num_preemptions"].mean()),
        "preempted_request_frac": float((requests["num_preemptions"] > 0).mean()),
        "mean_kv_used_frac": tw(iterations["pages_used"]) / num_pages,
        "mean_kv_reserved_frac": tw(iterations["pages_reserved"]) / num_pages,
        "reserved_unused_page_s": float(np.multiply(np.subtract(  # pages as floats: exact below 2**53
            iterations["pages_reserved"].to_numpy(), iterations["pages_used"].to_numpy(), out=product), dur,
            out=product).sum()),
        "max_running": float(iterations["batch_size"].max()) if len(iterations) else 0.0,
        "mean_batch_size": tw(iterations["batch_size"]),
        "num_iterations": float(len(iterations)),
    })
    out.update(_prefix_figures(requests, iterations, tw))
    return out


def _prefix_figures(requests: pd.DataFrame, iterations: pd.DataFrame, tw: Any) -> dict[str, float]:
    """The prefix cache's summary figures (see :func:`summarize`); zeros when it was off."""
    if "prefix_hit_tokens" not in requests.columns:
        return {"prefix_hit_rate": 0.0, "saved_prefill_tokens": 0.0, "mean_pages_cached": 0.0,
                "max_pages_cached": 0.0, "mean_pages_shared_saved": 0.0, "max_pages_shared_saved": 0.0}
    admitted = (requests["admitted_iter"] >= 0).to_numpy()
    prompt = float(requests["prompt_tokens"].to_numpy()[admitted].sum())
    out = {"prefix_hit_rate": float(requests["prefix_hit_tokens"].sum()) / prompt if prompt else 0.0,
           "saved_prefill_tokens": float(requests["saved_prefill_tokens"].sum())}
    for col in ("pages_cached", "pages_shared_saved"):
        out[f"mean_{col}"] = tw(iterations[col]) if len(iterations) else 0.0
        out[f"max_{col}"] = float(iterations[col].max()) if len(iterations) else 0.0
    return out


def token_gaps_s(requests: pd.DataFrame, iterations: pd.DataFrame) -> tuple[np.ndarray, int]:
    """Every time between two consecutive output tokens of a completed request, pooled (seconds).

    Rebuilt from the per-iteration table: a request that runs without interruption from its
    first token to its last produces a token in every iteration in between that decodes
    (chunked: every iteration; prefill-first: every iteration that is not a prefill). That rule
    is checked per request: the count of such iterations must equal its ``generated_tokens - 1``.
    A request for which it fails (it was preempted, or skipped for lack of token budget)
    contributes only its longest gap (``max_tbt_s``, exact), which keeps the stall it suffered in
    the tail and slightly overstates the tail's share.

    Returns
    -------
    gaps_s : ndarray of float64
        The gaps (seconds), in no particular order.
    num_max_only : int
        Requests that contributed their longest gap only.
    """
    gap_s, count, max_only = _token_gap_counts(requests, iterations)
    return np.repeat(gap_s, count), max_only


def _token_gap_counts(requests: pd.DataFrame, iterations: pd.DataFrame,
                      end_s: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`token_gaps_s` as distinct gaps and how often each occurs (a million-request run has
    tens of millions of gaps but only one per iteration step, so summaries never expand them);
    ``end_s``: each iteration's end (seconds), when the caller has it."""
    if end_s is None:
        end_s = (iterations["start_s"] + iterations["duration_s"]).to_numpy()
    dec = np.flatnonzero(iterations["decode_tokens"].to_numpy() > 0)
    m, dec_end_s = dec.size, end_s[dec]
    gen = requests["generated_tokens"].to_numpy()
    live = ((requests["outcome"] != RequestStatus.FINISHED_ABORTED.name.lower()).to_numpy() & (gen >= 2))  # mask
    first = requests["first_token_iter"].to_numpy()[live]
    a = np.searchsorted(dec, first, side="right")
    b = np.searchsorted(dec, requests["finish_iter"].to_numpy()[live], side="right")
    del dec  # arrays as long as the run are let go as soon as they are used (a long run's memory)
    exact = ((b - a) == gen[live] - 1) & (requests["num_preemptions"].to_numpy()[live] == 0)
    a, b, first = a[exact], b[exact], first[exact]
    first_gaps = dec_end_s[a] - end_s[first]
    # Later gaps: the step between consecutive decoding iterations j-1 and j, for j in (a, b);
    # count how many requests cover each step with a difference array (summed in place).
    cover = np.bincount(a + 1, minlength=m + 1)
    cover -= np.bincount(b, minlength=m + 1)
    np.cumsum(cover, out=cover)
    max_only = requests["max_tbt_s"].to_numpy(dtype=np.float64)[live][~exact]
    k, d = first_gaps.size, max(m - 1, 0)  # first gaps, then one per step, then the longest gaps only
    gap_s, count = np.empty(k + d + max_only.size), np.ones(k + d + max_only.size, np.int64)
    gap_s[:k] = first_gaps
    np.subtract(dec_end_s[1:], dec_end_s[:-1], out=gap_s[k:k + d])
    count[k:k + d] = cover[1:m]
    gap_s[k + d:] = max_only
    return gap_s, count, int((~exact).sum())


def _weighted_percentiles(values: np.ndarray, counts: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """``np.percentile(np.repeat(values, counts), q)`` for each q (linear interpolation), without
    the repeat and without sorting every value: the order statistics each q needs are found in
    buckets cut at a sorted sample of the values, and only the buckets that hold them are sorted."""
    keep = counts > 0
    if not keep.all():  # (a copy of tens of millions of values otherwise)
        values, counts = values[keep], counts[keep]
    if values.size == 0:
        return [float("nan")] * len(qs)
    total = int(counts.sum())
    positions = [q / 100.0 * (total - 1) for q in qs]
    ranks = sorted({r for pos in positions for r in (int(np.floor(pos)), min(int(np.floor(pos)) + 1, total - 1))})
    edges = np.unique(values[::max(values.size // 4096, 1)])  # bucket b: edges[b - 1] < value <= edges[b]
    bucket = np.searchsorted(edges, values, side="left")
    ends = np.cumsum(np.bincount(bucket, weights=counts, minlength=edges.size + 1))  # exact below 2**53
    at: dict[int, float] = {}
    for b in np.unique(np.searchsorted(ends, ranks, side="right")).tolist():
        start = int(ends[b - 1]) if b else 0
        inside = bucket == b
        order = np.argsort(values[inside])  # ties hold equal values: their order changes no order statistic
        v, c = values[inside][order], start + np.cumsum(counts[inside][order])
        for r in ranks:
            if start <= r < int(ends[b]):
                at[r] = float(v[np.searchsorted(c, r, side="right")])
    out = []
    for pos in positions:
        lo = int(np.floor(pos))
        out.append(at[lo] + (at[min(lo + 1, total - 1)] - at[lo]) * (pos - lo))
    return out
