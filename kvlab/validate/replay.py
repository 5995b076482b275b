"""Replay a measured run in its own set-up and compare kvlab's latencies with the server's.

:func:`replay` serves a :class:`~kvlab.validate.records.RunRecord`'s requests (its arrivals and
exact lengths) with :func:`kvlab.simulate` under the run's set-up: vLLM's policy (V0's admission on
the whole prompt's pages with its 1% watermark, or V1's on the first chunk's, ``vllm_v1``), V0's whole
prefills or V1's chunked prefill, the run's ``max_num_seqs``, ``max_num_batched_tokens``,
``max_model_len``, block size and KV pool (the recorded block count where there is one), its model,
GPU and TP, its KV and weight precision, V1's async scheduling
(:attr:`SetUp.schedules_async`), its prefix cache (with the shared prefix the set-up states), its
``dp`` data-parallel ranks (``simulate(data_parallel=dp)``, :mod:`kvlab.sim.data_parallel`: routed
by load; a mixture of experts' in lockstep, a dense model's independent). A client that caps its
requests in flight (``max_concurrency`` C) is replayed exactly without preemptions: with FCFS
admission the engine's schedule under the cap is the one of ``max_num_seqs = min(max_num_seqs, C)``
(a request admitted while fewer than C run has had C fewer predecessors finish, so it was sent), and
the k-th request is sent at ``max(arrival_k, the (k - C + 1)-th finish among the first k)``
(:func:`client_send_times`); TTFT and E2E count from that send, as the client measures them, and the
wait before it is the client's queue. Over ``dp`` ranks each takes ``ceil(C / dp)`` as its share (an
approximation: the balancer spreads the client's C requests but not exactly evenly). :func:`compare` puts the
predicted and measured TTFT, TPOT and E2E (mean, p50, p90, p99), output throughput and
preemptions side by side, with the relative errors and the overload calls.

**Overload** (is the load sustained?) is decided the same way for the server and for kvlab, and
the same way :func:`kvlab.capacity.capacity` decides whether a rate is sustained: from the backlog
when the last request arrives. Under a sustained load the queue holds a few requests at any
instant; under overload it grows, and a share near ``1 - served rate / offered rate`` of the
requests is still waiting at the end of the arrivals. A run is *overloaded* when more than
:data:`MAX_BACKLOG_FRAC` of its requests, and more than
:data:`kvlab.capacity.MIN_BACKLOG_REQUESTS`, have not had their first token when the last one
arrives (the first token is the one admission mark both the servers' records and kvlab's have).
:func:`ttft_growth` (late-arrival over early-arrival median TTFT) is reported beside it.
"""
from __future__ import annotations

import inspect
import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..capacity import MIN_BACKLOG_REQUESTS, capacity as _capacity
from ..prefix_blocks import PrefixModel
from ..specs import with_precision
from .records import CLIENT_QUEUE, RunRecord

#: Share of a run's requests still waiting at the last arrival above which its queue grows
#: (:func:`kvlab.capacity.capacity`'s default ``max_backlog_frac``).
MAX_BACKLOG_FRAC = float(inspect.signature(_capacity).parameters["max_backlog_frac"].default)

METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class Replay:
    """kvlab's replay of one run: predicted per-request times beside the record.

    ``predicted`` has one row per request of ``record.requests`` (same order): ``ttft_s``,
    ``tpot_s``, ``e2e_s`` (from the client's send), ``client_queue_s`` (send - arrival),
    ``num_preemptions``, ``rank`` (its data-parallel rank; 0 without DP); ``iterations`` one table
    per rank
    (the engine's per-iteration rows); ``cost_model`` and ``stack`` name what priced it;
    ``front_end_s`` is the per-request front-end latency added to each TTFT and E2E (s).
    """

    record: RunRecord
    predicted: pd.DataFrame = field(repr=False)
    iterations: tuple[pd.DataFrame, ...] = field(repr=False)
    cost_model: str
    stack: str
    pool_pages: int
    makespan_s: float
    front_end_s: float = 0.0


def client_send_times(arrival_s: np.ndarray, finish_s: np.ndarray, cap: int | None) -> np.ndarray:
    """When a client that keeps at most ``cap`` requests in flight sends each one (seconds).

    Requests in arrival order wait in FIFO order (``asyncio.Semaphore``); the k-th (0-based) is sent
    at its arrival while fewer than ``cap`` earlier ones are unfinished, else at the
    ``(k - cap + 1)``-th smallest finish among the first ``k``. ``cap`` None: every request is
    sent on arrival. ``finish_s`` must respect causality (no request finishes before it is sent).
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    if cap is None or len(a) <= cap:
        return a.copy()
    f = np.asarray(finish_s, dtype=np.float64)
    sent = a.copy()
    pending: list[float] = []  # finishes of sent requests not yet counted as freeing a slot
    for k in range(1, len(a)):
        heapq.heappush(pending, f[k - 1])
        if k >= cap:
            sent[k] = max(a[k], heapq.heappop(pending))
    return sent


def run_model(record: RunRecord) -> Any:
    """The run's model at the run's KV and weight precision (:func:`kvlab.specs.with_precision`)."""
    s = record.setup
    return with_precision(s.model, kv_cache_dtype=s.kv_cache_dtype, weights=s.weight_dtype)


def run_cost(record: RunRecord, cost_model: Any, stack: str | None) -> tuple[Any, str] | None:
    """The cost-model object and stack name a named ``cost_model`` / ``stack`` pair prices ``record`` with, in
    what ``simulate``'s arguments cannot carry: the EP degree, the engine's kernel era (:attr:`.records.SetUp.kernels`;
    a named cost-model file prices on its own era instead) and its attention split (its profile's
    ``split_attention``). None where ``cost_model`` is an object (used as is)."""
    from ..costmodel import cost_model as build
    from ..costmodel.stacks import is_cost_model_file

    s = record.setup
    if not (cost_model is None or isinstance(cost_model, str)):
        return None
    named = cost_model if isinstance(cost_model, str) and is_cost_model_file(cost_model) else stack
    source = None if cost_model is None or named is cost_model else cost_model
    file = named is not None and is_cost_model_file(named)
    cost = build(run_model(record), s.gpu_spec, tp=s.tp, source=source, stack=named or "none", ep=s.expert_parallel,
                 kernels=None if file else s.kernels, split_attention=s.profile.split_attention)
    return cost, named or "none"


def front_end_s(record: RunRecord, cost_model: Any = None, stack: str | None = None) -> float:
    """The front end's latency per request (s) a replay of ``record`` adds to TTFT and E2E: the named
    stack's ``overhead_s_per_request`` when the run's clock starts at the client, else 0 (an engine-side
    clock, or no cost-model file named)."""
    from ..costmodel.stacks import load, named_file

    if not record.setup.client_clock:
        return 0.0
    named = named_file(cost_model, stack)
    return float(load(named).overhead_s_per_request) if named else 0.0


def replay(record: RunRecord, *, cost_model: Any = None, stack: str | None = None,
           front_end: float | None = None) -> Replay:
    """Serve ``record``'s requests in its own set-up (see the module note) and return the replay.

    ``cost_model`` and ``stack`` are :func:`kvlab.simulate`'s (default: the measured model where
    the GPU has measurements, else the roofline, with no stack overheads). ``front_end`` (s per
    request) is added to every predicted TTFT and E2E, outside the engine (it moves no iteration);
    None: :func:`front_end_s` of the named stack.
    """
    from ..sim import simulate

    front = front_end_s(record, cost_model, stack) if front_end is None else float(front_end)

    s = record.setup
    built = run_cost(record, cost_model, stack)
    if built is not None:
        cost_model, stack = built[0], None
    work = record.workload()
    max_out = int(work["output_tokens"].max())
    model = run_model(record)
    cap = s.max_concurrency
    seqs = s.max_num_seqs if cap is None else min(s.max_num_seqs, -(-cap // s.dp))  # a rank's share of the cap
    prefix = PrefixModel(system_prompt_tokens=s.shared_prefix_tokens, system_prompt_share=s.shared_prefix_share) \
        if s.shared_prefix_tokens else None
    prof = s.profile
    res = simulate(work, prof.policy, **dict(prof.policy_params), model=model, gpu=s.gpu_spec, tp=s.tp,
                   scheduler=s.scheduler, max_num_seqs=seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                   max_model_len=s.max_model_len, block_size=s.block_size, pool_pages=s.pool_pages,
                   gpu_memory_utilization=s.gpu_memory_utilization, max_new_tokens=max(max_out, 1),
                   cost_model=cost_model, stack=stack, record_iterations=True, async_scheduling=s.schedules_async,
                   prefix_caching=s.prefix_caching, prefix_model=prefix, data_parallel=s.dp)
    q = res.requests
    if (q["outcome"] == "finished_aborted").any():
        why = q.loc[q["outcome"] == "finished_aborted", "abort_reason"].iloc[0]
        raise ValueError(f"run {record.name}: kvlab aborted {int((q['outcome'] == 'finished_aborted').sum())} "
                         f"request(s) in the replay ({why}); the set-up cannot serve them")
    arr = work["arrival_s"].to_numpy(dtype=np.float64)
    first, fin = arr + q["ttft_s"].to_numpy(), arr + q["e2e_s"].to_numpy()
    sent = client_send_times(arr, fin, cap)
    pred = pd.DataFrame({"ttft_s": np.maximum(first - sent, 0.0) + front,
                         "tpot_s": q["mean_tbt_s"].fillna(0.0).to_numpy(),
                         "e2e_s": np.maximum(fin - sent, 0.0) + front, "client_queue_s": sent - arr,
                         "num_preemptions": q["num_preemptions"].to_numpy(dtype=np.float64),
                         "rank": q["rank"].to_numpy() if s.dp > 1 else 0}, index=work.index)
    it = res.iterations
    iters = [it[it["rank"].to_numpy() == k].drop(columns="rank").reset_index(drop=True)
             for k in range(s.dp)] if s.dp > 1 else [it]
    end_s = float((it["start_s"] + it["duration_s"]).max())
    return Replay(record=record, predicted=pred, iterations=tuple(iters), cost_model=res.params["cost_model"],
                  stack=built[1] if built is not None else res.params["stack"],
                  pool_pages=int(res.params["pool_pages"]),
                  makespan_s=end_s + front - float(work["arrival_s"].min()), front_end_s=front)


def _stats(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(np.mean(x)), "p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99))}


def ttft_growth(arrival_s: np.ndarray, ttft_s: np.ndarray) -> tuple[float, float]:
    """(late median TTFT / early median TTFT, late median TTFT in s): first and last quarter of arrivals."""
    order = np.argsort(arrival_s, kind="stable")
    t = np.asarray(ttft_s, dtype=np.float64)[order]
    q = max(1, len(t) // 4)
    early, late = float(np.median(t[:q])), float(np.median(t[-q:]))
    return (late / early if early > 0 else np.inf), late


def backlog(arrival_s: np.ndarray, ttft_s: np.ndarray) -> int:
    """Requests that have not had their first token when the last request arrives."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    return int(np.sum(arrival_s + np.asarray(ttft_s, dtype=np.float64) > arrival_s.max()))


def overloaded(arrival_s: np.ndarray, ttft_s: np.ndarray) -> bool:
    """Whether the queue grows over the arrivals (the module note's rule)."""
    waiting = backlog(arrival_s, ttft_s)
    return bool(waiting > MAX_BACKLOG_FRAC * len(arrival_s) and waiting > MIN_BACKLOG_REQUESTS)


def compare(rep: Replay) -> dict[str, Any]:
    """One row: the run, its set-up, predicted vs measured statistics, relative errors, overload calls.

    Keys ``{metric}_{stat}_{pred,meas,err}`` for metric in ttft, tpot, e2e (seconds; ``err`` =
    predicted / measured - 1), ``throughput_tok_s_{pred,meas,err}`` (output tokens over the
    makespan, first arrival to last completion), ``preemptions_pred`` / ``preemptions_meas``
    (None where the server did not record them), ``overload_{pred,meas}``, ``overload_right``,
    ``backlog_{pred,meas}`` (requests waiting for their first token at the last arrival),
    ``ttft_growth_{pred,meas}``, ``client_queue_mean_{pred,meas}`` (s a client's cap held a request).
    """
    rec, pred = rep.record, rep.predicted
    meas = rec.requests
    s = rec.setup
    row: dict[str, Any] = {"dataset": s.dataset, "run": rec.name, "model": s.model, "gpu": s.gpu, "tp": s.tp,
                           "dp": s.dp, "engine": s.engine, "requests": len(meas),
                           "rate_rps": (len(meas) - 1) / float(meas["arrival_s"].max()) if meas["arrival_s"].max() > 0
                           else float("inf"),
                           "cost_model": rep.cost_model, "stack": rep.stack, "pool_pages": rep.pool_pages}
    for m in METRICS:
        p, q = _stats(pred[f"{m}_s"].to_numpy(dtype=np.float64)), _stats(meas[f"{m}_s"].to_numpy(dtype=np.float64))
        for st in STATS:
            row[f"{m}_{st}_pred"], row[f"{m}_{st}_meas"] = p[st], q[st]
            row[f"{m}_{st}_err"] = p[st] / q[st] - 1 if q[st] > 0 else float("nan")
    out_tokens = float(meas["output_tokens"].sum())
    meas_span = float((meas["arrival_s"] + meas[CLIENT_QUEUE] + meas["e2e_s"]).max() - meas["arrival_s"].min())
    row["throughput_tok_s_pred"] = out_tokens / rep.makespan_s
    row["throughput_tok_s_meas"] = out_tokens / meas_span
    row["throughput_tok_s_err"] = row["throughput_tok_s_pred"] / row["throughput_tok_s_meas"] - 1
    row["preemptions_pred"] = int(pred["num_preemptions"].sum())
    row["preemptions_meas"] = rec.preemptions
    arr = meas["arrival_s"].to_numpy(dtype=np.float64)
    # first token counted from the offered arrival: the client's queue (a --max-concurrency cap) included,
    # unless the record has none to compare with (a capped run saved without queue_times): then both
    # sides count from the send
    queue = 1.0 if not s.max_concurrency or (meas[CLIENT_QUEUE] > 0).any() else 0.0
    wait_pred = (pred["ttft_s"] + queue * pred[CLIENT_QUEUE]).to_numpy(dtype=np.float64)
    wait_meas = (meas["ttft_s"] + queue * meas[CLIENT_QUEUE]).to_numpy(dtype=np.float64)
    row["client_queue_mean_pred"] = float(pred[CLIENT_QUEUE].mean())
    row["client_queue_mean_meas"] = float(meas[CLIENT_QUEUE].mean())
    gp, _ = ttft_growth(arr, wait_pred)
    gm, _ = ttft_growth(arr, wait_meas)
    row["ttft_growth_pred"], row["ttft_growth_meas"] = gp, gm
    row["backlog_pred"] = backlog(arr, wait_pred)
    row["backlog_meas"] = backlog(arr, wait_meas)
    row["overload_pred"] = overloaded(arr, wait_pred)
    row["overload_meas"] = overloaded(arr, wait_meas)
    row["overload_right"] = row["overload_pred"] == row["overload_meas"]
    return row


#: The headline metrics of the error table: (column of :func:`compare`, words).
HEADLINE = (("ttft_mean", "mean TTFT"), ("e2e_mean", "mean E2E"), ("tpot_mean", "decode time per token"))


def error_table(rows: list[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Per dataset: median |error| of mean TTFT, mean E2E and mean TPOT, and the overload calls.

    Columns ``dataset``, ``runs``, ``ttft_mean_abs_err``, ``e2e_mean_abs_err``,
    ``tpot_mean_abs_err`` (medians over the runs of |predicted / measured - 1|),
    ``overload_right`` (runs called right), ``overload_calls`` ("7 of 8 right").
    """
    df = pd.DataFrame(rows)
    out = []
    for ds, g in df.groupby("dataset", sort=False):
        r = {"dataset": ds, "runs": len(g)}
        for col, _ in HEADLINE:
            r[f"{col}_abs_err"] = float(g[f"{col}_err"].abs().median())
        r["overload_right"] = int(g["overload_right"].sum())
        r["overload_calls"] = f"{int(g['overload_right'].sum())} of {len(g)} right"
        out.append(r)
    return pd.DataFrame(out)
