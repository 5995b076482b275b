"""Notebook 09's study: every shared serving run replayed with the default model and with its
stack held out, the error tables, the per-request CDFs, where a target is missed and why.

The stack of a dataset is the engine its runs record (``vllm-v0`` for DistServe, ``vllm-v1`` for
LLMServingSim); "held out" means each run is predicted by that stack fitted to the dataset's other
runs (:func:`kvlab.validate.calibrate.leave_one_out`), never by terms fitted to itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..costmodel import measured_gpus, unsupported
from ..costmodel.measured import collectives_of, constants, reference_gpu
from ..specs import model as _model
from .calibrate import leave_one_out
from .readers import SHARED_SERVING, read_shared
from .records import RunRecord
from .replay import HEADLINE, MAX_BACKLOG_FRAC, Replay, compare, error_table, replay

#: Issue 20's targets: median |error| per dataset and metric, every overload call right.
TARGET_ABS_ERR = 0.15
#: A mean-TTFT gap below this (seconds) can be a client's HTTP round trip; a larger one is not.
CLIENT_GAP_S = 0.2


@dataclass(frozen=True)
class Study:
    """What the notebook shows (see the module note)."""

    runs: list[RunRecord]
    default: pd.DataFrame
    held_out: pd.DataFrame
    default_replays: dict[str, Replay] = field(repr=False)
    held_out_replays: dict[str, Replay] = field(repr=False)
    quick: bool = False

    def tables(self) -> pd.DataFrame:
        """The error table per dataset, for the default model and the held-out stack, with verdicts."""
        out = []
        for what, rows in (("default model (stack none)", self.default), ("stack held out", self.held_out)):
            t = error_table(rows)
            t.insert(1, "cost model", what)
            t.insert(2, "stack", [", ".join(sorted(set(rows.loc[rows["dataset"] == d, "stack"]))) for d in t["dataset"]])
            t["meets target"] = [bool(all(r[f"{c}_abs_err"] <= TARGET_ABS_ERR for c, _ in HEADLINE)
                                      and r["overload_right"] == r["runs"]) for _, r in t.iterrows()]
            out.append(t)
        return pd.concat(out, ignore_index=True)


def _subset(runs: list[RunRecord], quick: bool) -> list[RunRecord]:
    if not quick:
        return runs
    out = []
    for ds in dict.fromkeys(r.setup.dataset for r in runs):
        rr = [r for r in runs if r.setup.dataset == ds]
        out += [rr[0], rr[len(rr) // 2], rr[-1]] if len(rr) > 3 else rr
    return out


def run_study(folder: str | Path = SHARED_SERVING, *, quick: bool = False) -> Study | None:
    """The study over the runs in ``folder``; None when it holds none (``../shared/data`` absent).

    ``quick`` keeps three runs of each dataset (first, middle, last rate) and holds out within them.
    """
    runs = _subset(read_shared(folder), quick)
    if not runs:
        return None
    default_reps = {r.name: replay(r) for r in runs}
    default = pd.DataFrame([compare(rep) for rep in default_reps.values()])
    held, held_reps = [], {}
    for ds in dict.fromkeys(r.setup.dataset for r in runs):
        rr = [r for r in runs if r.setup.dataset == ds]
        stack = rr[0].setup.engine
        reps: list[Replay] = []
        held.append(leave_one_out(rr, name=stack, replays=reps))
        held_reps.update({rep.record.name: rep for rep in reps})
    return Study(runs=runs, default=default, held_out=pd.concat(held, ignore_index=True),
                 default_replays=default_reps, held_out_replays=held_reps, quick=quick)


def why(row: pd.Series | dict, record: RunRecord) -> str:
    """What the replay leaves out for this run, from its set-up and the comparison (facts, not a per-run note)."""
    s = record.setup
    m, g = _model(s.model), s.gpu_spec
    reasons = []
    not_measured = unsupported(m, g, tp=s.tp)
    if not_measured:
        reasons.append(f"GPU time from the spec-sheet roofline ({not_measured})")
    elif g.name not in measured_gpus():
        reasons.append(f"{g.name} has no measurements: its curves are {reference_gpu(g)}'s carried by spec ratios "
                       "(notebook 08's leave-one-GPU-out table says how far that carries)")
    collectives = [what for what, holds in ((f"TP{s.tp} all-reduces", s.tp > 1),
                                            (f"EP{s.expert_parallel} all-gathers and reduce-scatters of the "
                                             f"{s.expert_parallel // s.tp} data-parallel ranks' tokens",
                                             s.expert_parallel > s.tp)) if holds]
    if collectives and g.interconnect_bytes_per_s <= g.host_link_bytes_per_s:
        reasons.append(f"{' and '.join(collectives)} over PCIe (no NVLink), {_pcie_collectives(g, s.tp)}"
                       + ("" if s.p2p else "; the host's lack of GPU peer-to-peer is the set-up's (inferred where "
                          "the run does not record it)"))
    if s.dp > 1:
        reasons.append(f"DP{s.dp} ranks in lockstep (kvlab.sim.data_parallel) without the dummy steps vLLM runs before an "
                       "idle group pauses" if m.is_moe else
                       f"DP{s.dp} ranks routed on counts as of their last scheduled step (vLLM's client reads "
                       "them as republished every 100 ms)")
    if m.is_moe:
        reasons.append("mixture of experts: routing taken as uniform over the experts"
                       + (f", and each EP{s.expert_parallel} GPU's experts priced at {s.dp} x its rank's tokens "
                          "(the gathered tokens when the ranks are padded; above the CUDA-graph size the longest "
                          "rank's count)" if s.expert_parallel > s.tp else ""))
    cpu_s, per_seq_s = (float(row.get(f"held_out_overhead_s{k}") or 0.0) for k in ("", "_per_seq"))
    if s.schedules_async and (cpu_s > 0 or per_seq_s > 0) and row["tpot_mean_err"] > TARGET_ABS_ERR:
        # the held-out stack was fitted overlapped, as the run's scheduling (kvlab calibrate follows it)
        reasons.append(f"the stack fitted to the other runs has the server CPU-bound at {cpu_s * 1e3:.3g} ms + "
                       f"{per_seq_s * 1e3:.3g} ms per sequence an iteration, above this run's GPU time: a CPU time the "
                       "other runs' hosts showed (or that stands for their GPU-time errors) does not carry to this "
                       "host; calibrate on the server's own runs")
    meas_growth = float(row["ttft_growth_meas"])
    if 1.5 < meas_growth and not row["overload_meas"]:
        reasons.append(f"near saturation (measured late/early median TTFT {meas_growth:.2g}x, "
                       f"{int(row['backlog_meas'])} waiting at the last arrival, overload above "
                       f"{MAX_BACKLOG_FRAC:.1%}): TTFT is queueing and small throughput errors compound")
    if row["overload_meas"] and abs(row["ttft_mean_err"]) > TARGET_ABS_ERR:
        reasons.append("overloaded: the mean TTFT is the backlog, which grows with any error in throughput")
    if not s.pool_pages and (row["overload_meas"] or 1.5 < meas_growth) and abs(row["ttft_mean_err"]) > TARGET_ABS_ERR:
        reasons.append(f"KV pool not recorded (derived: {int(row['pool_pages']):,} blocks from gpu_memory_utilization="
                       f"{s.gpu_memory_utilization}): at this load admission waits on free blocks, so the queue "
                       "follows the pool's size")
    if s.pool_pages and row["preemptions_pred"] > 0:
        reasons.append(f"KV-bound ({s.pool_pages:,} blocks): {int(row['preemptions_pred']):,} preemptions predicted, "
                       "none recorded by the server to check them")
    gap_s = float(row["ttft_mean_meas"] - row["ttft_mean_pred"])
    if "client" in s.clock_start and row["ttft_mean_err"] < -TARGET_ABS_ERR and 0 < gap_s < CLIENT_GAP_S:
        reasons.append(f"client-side clock: the front end's latency (HTTP, tokenisation) is one number fitted per "
                       f"stack, and this run's mean TTFT is {gap_s * 1e3:,.0f} ms above the prediction")
    timing_only = all(r.startswith(("client-side", "overloaded", "near saturation")) for r in reasons)
    if not reasons or (timing_only and abs(row["tpot_mean_err"]) > TARGET_ABS_ERR):
        reasons.append(f"decode time per token {row['tpot_mean_err']:+.0%} with no missing term identified: the "
                       "stack's terms fitted to the other runs do not follow this one (run-to-run variation "
                       "of the server, or a term kvlab lacks)")
    return "; ".join(reasons)


def _pcie_collectives(g: Any, tp: int) -> str:
    """Where the measured model's collectives on PCIe GPU ``g`` (a :class:`kvlab.specs.GPUSpec`) come from."""
    c = constants()
    entry = c.get("gpus", {}).get(g.name, {})
    if not g.p2p:
        return f"priced from {collectives_of(g, reference_gpu(g), c)[2].split(': ', 1)[1]} (NCCL through host memory)"
    if str(tp) in entry.get("engine_all_reduce", {}).get("fits", {}):
        return (f"priced from vLLM's own all-reduce as measured on another host with this GPU "
                f"({entry['engine_all_reduce']['source']})")
    if entry and "network_gpu" not in entry:
        return "priced from NCCL measured on this GPU's own host"
    return "priced from another link's measured curves carried by bandwidth, with no measured collective on this one"


def misses(study: Study, which: str = "held_out") -> pd.DataFrame:
    """Runs whose |error| exceeds the target on a headline metric, or whose overload call is wrong, with why."""
    rows = getattr(study, which)
    by_name = {r.name: r for r in study.runs}
    out = []
    for _, r in rows.iterrows():
        bad = [f"{words} {r[f'{c}_err']:+.0%}" for c, words in HEADLINE if abs(r[f"{c}_err"]) > TARGET_ABS_ERR]
        if not r["overload_right"]:
            bad.append(f"overload called {'yes' if r['overload_pred'] else 'no'}, server "
                       f"{'yes' if r['overload_meas'] else 'no'}")
        if bad:
            out.append({"dataset": r["dataset"], "run": r["run"], "stack": r["stack"], "missed": "; ".join(bad),
                        "why": why(r, by_name[r["run"]])})
    return pd.DataFrame(out, columns=["dataset", "run", "stack", "missed", "why"])


def p2p_both_ways(study: Study) -> pd.DataFrame:
    """The runs whose collectives cross PCIe (TP, or EP over data-parallel ranks, on GPUs without NVLink)
    replayed with and without GPU peer-to-peer (the default model: GPU time only), since their records do
    not say which the host ran: ``run``, ``p2p``, ``as set up`` (the set-up's own choice), the headline
    errors and the overload call."""
    out = []
    for r in study.runs:
        s, g = r.setup, r.setup.gpu_spec
        if not ((s.tp > 1 or s.expert_parallel > s.tp) and g.interconnect_bytes_per_s <= g.host_link_bytes_per_s):
            continue
        for p2p in (True, False):
            row = compare(replay(r.with_setup(p2p=p2p)))
            out.append({"run": r.name, "p2p": p2p, "as set up": p2p == s.p2p,
                        **{f"{c}_err": row[f"{c}_err"] for c, _ in HEADLINE}, "overload_right": row["overload_right"]})
    return pd.DataFrame(out, columns=["run", "p2p", "as set up", *(f"{c}_err" for c, _ in HEADLINE), "overload_right"])


def pcie_lines(gpu: str = "RTXPRO6000", tp: int = 2) -> pd.DataFrame:
    """The all-reduce lines the measured model prices ``gpu``'s TP all-reduce from, with and without GPU
    peer-to-peer, one row per line (below and above vLLM's custom all-reduce bound where vLLM's own is
    measured): its latency (us) and bandwidth (GB/s), and a 1 MiB all-reduce as the model prices it (us)."""
    from dataclasses import replace

    from ..costmodel import cost_model
    from ..specs import gpu as _gpu

    out = []
    for p2p in (True, False):
        cm = cost_model("Qwen3-32B", replace(_gpu(gpu), p2p=p2p), tp=tp)
        lines = [("NCCL" if cm.custom_allreduce_s_per_byte == 0 else "vLLM's own, above the custom bound",
                  cm.allreduce_latency_s, cm.allreduce_s_per_byte)]
        if cm.custom_allreduce_s_per_byte > 0:
            lines.insert(0, ("vLLM's own, custom all-reduce", cm.custom_allreduce_latency_s,
                             cm.custom_allreduce_s_per_byte))
        for words, lat, spb in lines:
            out.append({"GPU": gpu, "TP": tp, "GPU peer-to-peer": p2p, "line": words, "latency (us)": lat * 1e6,
                        "GB/s": 1e-9 / spb,
                        "1 MiB all-reduce, as priced (us)": cm.allreduce_s(2 ** 20 / cm.activation_bytes_per_token) * 1e6})
    return pd.DataFrame(out)


def cdf_frame(study: Study, run: str) -> pd.DataFrame:
    """Long table of per-request TTFT, TPOT, E2E for one run: measured, default model, stack held out."""
    rec = next(r for r in study.runs if r.name == run)
    parts = [("measured", rec.requests)]
    parts.append(("kvlab, default model", study.default_replays[run].predicted))
    if run in study.held_out_replays:
        parts.append((f"kvlab, {rec.setup.engine} held out", study.held_out_replays[run].predicted))
    rows = []
    for who, t in parts:
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            v = np.sort(t[metric].to_numpy(dtype=np.float64))
            rows.append(pd.DataFrame({"who": who, "metric": metric, "value": v,
                                      "cdf": np.arange(1, len(v) + 1) / len(v)}))
    return pd.concat(rows, ignore_index=True)


def summary(study: Study) -> dict[str, Any]:
    """Key numbers for the results sidecar."""
    return {"tables": study.tables().to_dict(orient="records"),
            "misses": misses(study).to_dict(orient="records"),
            "default_runs": study.default.to_dict(orient="records"),
            "held_out_runs": study.held_out.to_dict(orient="records")}
