"""Tables and summary figures of a finished simulation."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .reference import ITERATION_COLUMNS
from .request import FINISH_REASON, Request, RequestStatus

PERCENTILES = (50, 90, 99)


def request_table(requests: list[Request], request_ids: np.ndarray) -> pd.DataFrame:
    """One row per request: timings (seconds), iteration indices, tokens, pages, outcome.

    Iteration indices are -1 where the event never happened; times are NaN there.
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
    return table


def iteration_table(rows: list[tuple]) -> pd.DataFrame:
    """One row per iteration (times in seconds, counts in requests, tokens and pages)."""
    return pd.DataFrame(rows, columns=list(ITERATION_COLUMNS))


def summarize(requests: pd.DataFrame, iterations: pd.DataFrame, *, num_pages: int) -> dict[str, float]:
    """The run's headline figures.

    * ``tokens_per_s``, ``requests_per_s``: generated tokens and completed (not aborted)
      requests over the makespan (first arrival to end of the last iteration);
    * ``{ttft,tbt,e2e}_p{50,90,99}_s``: over completed requests (TBT: each request's mean gap);
    * ``normalized_latency_s_per_token``: mean over completed requests of end-to-end latency /
      generated tokens (the vLLM paper's serving metric);
    * ``preemptions_per_request``, ``preempted_request_frac``;
    * ``mean_kv_used_frac``, ``mean_kv_reserved_frac``: time-weighted shares of the pool held
      / promised; ``reserved_unused_page_s``: promised-but-empty pages x seconds;
    * ``max_running``, ``mean_batch_size`` (time-weighted), ``num_iterations``.
    """
    done = requests[requests["outcome"] != RequestStatus.FINISHED_ABORTED.name.lower()]
    end_s = float((iterations["start_s"] + iterations["duration_s"]).max()) if len(iterations) else 0.0
    makespan_s = end_s - float(requests["arrival_s"].min())
    dur = iterations["duration_s"].to_numpy()
    total_s = float(dur.sum())

    def tw(values: pd.Series) -> float:
        return float((values.to_numpy() * dur).sum() / total_s) if total_s > 0 else float("nan")

    out: dict[str, float] = {
        "num_requests": float(len(requests)),
        "num_completed": float(len(done)),
        "num_aborted": float(len(requests) - len(done)),
        "num_length_capped": float((requests["outcome"] == "finished_length_capped").sum()),
        "makespan_s": makespan_s,
        "tokens_per_s": float(requests["generated_tokens"].sum()) / makespan_s if makespan_s > 0 else float("nan"),
        "requests_per_s": len(done) / makespan_s if makespan_s > 0 else float("nan"),
    }
    for name, col in (("ttft", "ttft_s"), ("tbt", "mean_tbt_s"), ("e2e", "e2e_s")):
        vals = done[col].dropna().to_numpy()
        for q in PERCENTILES:
            out[f"{name}_p{q}_s"] = float(np.percentile(vals, q)) if vals.size else float("nan")
    out["normalized_latency_s_per_token"] = (float((done["e2e_s"] / done["generated_tokens"]).mean())
                                             if len(done) else float("nan"))
    out.update({
        "preemptions_per_request": float(requests["num_preemptions"].mean()),
        "preempted_request_frac": float((requests["num_preemptions"] > 0).mean()),
        "mean_kv_used_frac": tw(iterations["pages_used"]) / num_pages,
        "mean_kv_reserved_frac": tw(iterations["pages_reserved"]) / num_pages,
        "reserved_unused_page_s": float(((iterations["pages_reserved"] - iterations["pages_used"]).to_numpy()
                                         * dur).sum()),
        "max_running": float(iterations["batch_size"].max()) if len(iterations) else 0.0,
        "mean_batch_size": tw(iterations["batch_size"]),
        "num_iterations": float(len(iterations)),
    })
    return out
