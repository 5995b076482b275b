"""Fixed-concurrency benchmark points of real servers: a mean TTFT and a mean TPOT per point, no per-request rows.

A *point* is what a closed-loop benchmark reports. ``C`` clients each send their next request when
their last one ends; every request has the same prompt and output length (``ignore_eos``); the
server's mean TTFT and mean TPOT over the measured requests are recorded. NVIDIA aiconfigurator's
benchmark script sends ``20 C`` measured requests after ``2 C`` warm-up ones (``aiperf profile
--concurrency C --num-requests 20C --warmup-request-count 2C --extra-inputs ignore_eos:true``:
``src/aiconfigurator/generator/config/backend_templates/benchmark/bench_run.sh.j2``,
ai-dynamo/aiconfigurator 095f58a). aiperf waits for every warm-up response before it starts
measuring (its ``docs/tutorials/warmup.md``, "Grace Period"), so the measured phase starts on an
idle server with a burst of ``C`` requests. That is what :func:`replay_point` serves: ``rounds x C``
requests offered at time 0 behind a client cap of ``C`` (:func:`kvlab.validate.replay.replay`), in the
point's own set-up, whose token budget admits one or two prompts an iteration and so breaks the burst
into a queue. It returns their means beside the measured ones.

The built-in points (:data:`PATH`, written by :func:`write` from aiconfigurator's silicon sample,
``aic-core/src/aiconfigurator_core/systems/silicon_sample.csv`` at 095f58a) are its aggregated
(not disaggregated) points whose model kvlab's catalogue holds, on the H100-SXM, H200 or B200,
with tensor parallelism only. They cover vLLM, SGLang and TensorRT-LLM, all with FP8 weights. The
sample records the server, its version (not always), model, GPU, TP, concurrency, lengths and the
two means. It records no engine flags: each point runs with the flags aiconfigurator's generator
writes for a benchmark (:func:`_benchmark_flags`), the rest its server's defaults for its version
(:func:`kvlab.validate.readers.with_server_defaults`), and every point lists these assumptions.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import _validate as v
from .._paths import DATA_DIR
from ..prefix_blocks import HASH_IDS, MOONCAKE_HASH_BLOCK_TOKENS
from ..costmodel.data import write_csv_atomically
from .readers import SUMMARY_KEYS, read_csv, summary_cell, with_server_defaults
from ..costmodel.stacks import StackTerms
from .calibrate import FOLD_TERMS, fit, fold_terms, replay_with
from .records import RunRecord, SetUp
from .replay import Replay, replay

PATH = DATA_DIR / "serving" / "aiconfigurator_points.csv"
#: The committed table's columns (times in seconds, lengths in tokens).
COLUMNS = ("point", "server", "server_version", "model", "gpu", "tp", "weight_dtype", "concurrency",
           "prompt_tokens", "output_tokens", "ttft_mean_s", "tpot_mean_s", "measured", "source_id")
#: Requests per client in the measured phase (aiconfigurator's ``BENCH_MULTI_ROUND``).
ROUNDS = 20
#: aiperf's ``--random-seed`` in aiconfigurator's benchmark script.
AIPERF_SEED = 100
#: aiconfigurator's names -> kvlab's: servers (and dataset suffix), GPUs, models (same architecture).
_SERVERS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
_GPUS = {"h100_sxm": "H100-SXM", "h200_sxm": "H200", "b200_sxm": "B200"}
_MODELS = {"meta-llama/Llama-3.1-70B": "Llama-3.1-70B", "meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B",
           "nvidia/Llama-3.1-8B-Instruct-FP8": "Llama-3.1-8B", "Qwen/Qwen3-32B": "Qwen3-32B"}
_WEIGHTS = {"fp8": "fp8", "bf16": "bf16"}
DATASET_PREFIX = "aiconfigurator-"


@dataclass(frozen=True)
class ConcurrencyPoint:
    """One measured point: the set-up (its ``max_concurrency`` is the point's ``C``), the lengths and the means.

    ``prompt_pool``: how many distinct prompts the client drew its requests from (aiperf reuses
    ``--num-dataset-entries`` synthetic prompts, 100 by default in its releases of 2025); None: every request its
    own. Each request's prompt is drawn uniformly from the pool (seeded with aiconfigurator's aiperf seed, 100;
    aiperf's own draws are not reproduced); a repeated prompt is served from the prefix cache where the set-up
    runs one.
    """

    setup: SetUp
    prompt_tokens: int
    output_tokens: int
    ttft_mean_s: float
    tpot_mean_s: float
    prompt_pool: int | None = None

    def __post_init__(self) -> None:
        where = f"point {self.setup.name}"
        if not self.setup.max_concurrency:
            raise ValueError(f"{where}: a fixed-concurrency point needs the set-up's max_concurrency")
        for f in ("prompt_tokens", "output_tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{where}: {f} must be a positive integer, got {v!r}")
        if self.prompt_pool is not None and (isinstance(self.prompt_pool, bool) or not isinstance(
                self.prompt_pool, (int, np.integer)) or self.prompt_pool < 1):
            raise ValueError(f"{where}: prompt_pool must be a positive integer or None, got {self.prompt_pool!r}")
        for f in ("ttft_mean_s", "tpot_mean_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float, np.floating)) and np.isfinite(v) and v > 0):
                raise ValueError(f"{where}: {f} must be a positive number of seconds, got {v!r}")

    @property
    def concurrency(self) -> int:
        return int(self.setup.max_concurrency or 0)

    @property
    def e2e_mean_s(self) -> float:
        """Mean end-to-end latency (s): TTFT plus TPOT for each later token (exact for means of fixed lengths)."""
        return self.ttft_mean_s + self.tpot_mean_s * (self.output_tokens - 1)

    def record(self, rounds: int = ROUNDS) -> RunRecord:
        """The measured phase as a run record: ``rounds x C`` requests offered at time 0, each sent when a
        client is free.

        A point has no per-request rows, so each row carries the point's means; only their means are compared
        (:func:`replay_point`).
        """
        n = max(rounds, 1) * self.concurrency
        rows = pd.DataFrame({"arrival_s": np.zeros(n), "prompt_tokens": self.prompt_tokens,
                             "output_tokens": self.output_tokens, "ttft_s": self.ttft_mean_s,
                             "tpot_s": self.tpot_mean_s, "e2e_s": self.e2e_mean_s})
        if self.prompt_pool:  # uniform draws (seeded), not aiperf's own sampler: only how often a prompt repeats matters
            blocks = -(-self.prompt_tokens // MOONCAKE_HASH_BLOCK_TOKENS)  # the prompt's 512-token hash blocks
            drawn = np.random.default_rng(AIPERF_SEED).integers(0, self.prompt_pool, n)
            rows[HASH_IDS] = [list(range(int(d) * blocks, (int(d) + 1) * blocks)) for d in drawn]
        return RunRecord(self.setup, rows)


def _setup(row: pd.Series, where: str, path: Path) -> SetUp:
    server = str(row["server"])
    version = "" if pd.isna(row["server_version"]) else str(row["server_version"])
    assumptions = [f"aiperf closed loop: {ROUNDS} requests per client measured after a drained warm-up, all of "
                   f"{int(row['prompt_tokens'])} prompt and {int(row['output_tokens'])} output tokens"]
    setup: dict[str, Any] = {"name": str(row["point"]), "dataset": DATASET_PREFIX + server.lower(), "server": server,
                             "server_version": version, "model": str(row["model"]), "gpu": str(row["gpu"]),
                             "tp": int(row["tp"]), "weight_dtype": str(row["weight_dtype"]),
                             "max_concurrency": int(row["concurrency"]), "clock_start": "client issue",
                             "source": f"{path.name} {row['source_id']}"}
    if server == "vLLM" and not version:
        # the async scheduler is vLLM's default from 0.14.0 (January 2026); a run measured before 2026 ran without it
        measured = str(row["measured"])
        if measured and measured < "2026":
            setup["async_scheduling"] = False
            assumptions.append(f"vLLM version not recorded; measured {measured}, before 0.14.0: no async scheduling")
    stated = {key: summary_cell(row[col], key, where) for key, cols in SUMMARY_KEYS.items()
              if key not in ("server", "server_version", "tp", "max_concurrency")
              for col in cols[:1] if col in row.index and not pd.isna(row[col]) and str(row[col]).strip()}
    # SGLang's prefill budget is also capped by its default chunk: learnt from its defaults, the others need none
    chunk = int(with_server_defaults(dict(setup), [])["max_num_batched_tokens"]) if server == "SGLang" else 0
    flags = {k: v for k, v in _benchmark_flags(server, int(row["concurrency"]), int(row["prompt_tokens"]),
                                                int(row["output_tokens"]), chunk).items() if k not in stated}
    if flags:
        assumptions.append("engine flags not in the table: as aiconfigurator's benchmark generator sets them "
                           f"({', '.join(f'{k}={v}' for k, v in flags.items())})")
    if "kv_cache_dtype" not in stated:
        assumptions.append("KV cache dtype not in the table: the model's (BF16)")
    setup = with_server_defaults({**setup, **flags, **stated}, assumptions)
    setup["assumptions"] = tuple(assumptions)
    return SetUp.from_mapping(setup, where)


def _benchmark_flags(server: str, concurrency: int, prompt: int, output: int, chunk: int) -> dict[str, Any]:
    """The engine flags aiconfigurator's generator writes for an aggregated benchmark run
    (``src/aiconfigurator/generator/rule_plugin/benchmark/{vllm,sglang,trtllm}.rule`` and the TensorRT-LLM
    template ``backend_templates/trtllm/extra_engine_args.yaml.j2``, 095f58a), as kvlab's set-up keys.

    All three: as many running requests as the benchmark's concurrency (``max_batch_size``). vLLM:
    ``max_num_batched_tokens`` = that + prompt + 1,500, ``max_model_len`` = prompt + output + 1,500. SGLang:
    ``--enable-mixed-chunk`` (kvlab's ``chunked`` scheduler) and ``--max-prefill-tokens`` prompt + 1,500 (a step's
    prefill tokens are also capped by its default ``chunked_prefill_size``, ``chunk``). TensorRT-LLM:
    ``max_num_tokens`` = concurrency + prompt + 1,500 rounded up to its 32-token blocks, chunked prefill off (its
    default), the overlap scheduler disabled and block reuse off (the template's defaults)."""
    extra = concurrency + prompt + 1500
    if server == "vLLM":
        return {"max_num_seqs": concurrency, "max_num_batched_tokens": extra, "max_model_len": prompt + output + 1500}
    if server == "SGLang":
        return {"max_num_seqs": concurrency, "scheduler": "chunked", "max_num_batched_tokens": min(chunk, prompt + 1500)}
    return {"max_num_seqs": concurrency, "max_num_batched_tokens": -(-extra // 32) * 32, "async_scheduling": False,
            "prefix_caching": False}


def read_points(path: str | Path = PATH) -> list[ConcurrencyPoint]:
    """The points of a table in :data:`COLUMNS`' layout (default: the built-in aiconfigurator points).

    A column named as a set-up key a summary may give (:data:`kvlab.validate.readers.SUMMARY_KEYS`:
    ``max_num_seqs``, ``max_num_batched_tokens``, ``kv_cache_dtype``, ``scheduler``, ``async_scheduling``,
    ``prefix_caching``, ...) states that flag for its rows: a user's own benchmark's flags. Where a row leaves
    one empty, the aiconfigurator benchmark's (:func:`_benchmark_flags`), then the server's default."""
    path = Path(path)
    table = read_csv(path)
    v.require_columns(table, COLUMNS, f"points table {path}")
    out = []
    for i, row in table.iterrows():
        where = f"{path} row {i + 2}"
        try:
            out.append(ConcurrencyPoint(_setup(row, where, path), int(row["prompt_tokens"]), int(row["output_tokens"]),
                                        float(row["ttft_mean_s"]), float(row["tpot_mean_s"])))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def replay_point(point: ConcurrencyPoint, *, cost_model: Any = None, stack: str | None = None,
                 terms: StackTerms | None = None, rounds: int = ROUNDS) -> tuple[dict[str, Any], Replay]:
    """Serve ``point``'s measured phase (module note) and compare its means: one row and the replay.

    ``cost_model`` and ``stack`` are :func:`kvlab.validate.replay.replay`'s; ``terms``, a stack's terms on the
    default measured model instead (:func:`kvlab.validate.calibrate.replay_with`: a fitted stack object).

    The row holds ``dataset``, ``point``, set-up columns, and ``{ttft,tpot,e2e}_mean_{pred,meas,err}``
    (seconds; ``err`` = predicted / measured - 1). It also holds ``throughput_tok_s_{pred,meas}``
    (output tokens per second of the closed loop, ``C x output / mean E2E``) and ``queued_pred``: whether,
    in most iterations after the first burst, kvlab ran fewer than ``C`` requests while others waited in the
    server (its KV pool or token budget, not the client, held them back).
    """
    rec = point.record(rounds)
    rep = replay(rec, cost_model=cost_model, stack=stack) if terms is None else replay_with(rec, terms)
    s, p = point.setup, rep.predicted
    row: dict[str, Any] = {"dataset": s.dataset, "point": s.name, "server": s.server, "server_version": s.server_version,
                           "model": s.model, "gpu": s.gpu, "tp": s.tp, "concurrency": point.concurrency,
                           "prompt_tokens": point.prompt_tokens, "output_tokens": point.output_tokens,
                           "cost_model": rep.cost_model, "stack": rep.stack}
    meas = {"ttft": point.ttft_mean_s, "tpot": point.tpot_mean_s, "e2e": point.e2e_mean_s}
    for m, q in meas.items():
        pred = float(p[f"{m}_s"].mean())
        row[f"{m}_mean_pred"], row[f"{m}_mean_meas"], row[f"{m}_mean_err"] = pred, q, pred / q - 1
    c, out = point.concurrency, point.output_tokens
    row["throughput_tok_s_pred"] = c * out / row["e2e_mean_pred"]
    row["throughput_tok_s_meas"] = c * out / row["e2e_mean_meas"]
    it = rep.iterations[0]
    steady = it["start_s"].to_numpy() > float(p["e2e_s"].max())  # after the first burst has surely ended
    short = (it["num_running"].to_numpy() < c) & (it["num_waiting"].to_numpy() > 0)
    row["queued_pred"] = bool(steady.any() and short[steady].mean() > 0.5)
    return row, rep


def point_table(rows: list[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Per dataset (server): points, and median |error| of mean TTFT, mean E2E and mean TPOT."""
    df = pd.DataFrame(rows)
    out = []
    for ds, g in df.groupby("dataset", sort=False):
        r: dict[str, Any] = {"dataset": ds, "points": len(g)}
        for m in ("ttft", "e2e", "tpot"):
            r[f"{m}_mean_abs_err"] = float(g[f"{m}_mean_err"].abs().median())
        out.append(r)
    return pd.DataFrame(out)


def groups(rows: list[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Per server, GPU, model and TP: points, concurrency range, and the signed median error (predicted /
    measured - 1) of mean TTFT, mean E2E and mean TPOT, worst |TPOT| first."""
    df = pd.DataFrame(rows)
    out = df.groupby(["dataset", "gpu", "model", "tp"], sort=False).agg(
        points=("point", "size"), concurrency=("concurrency", lambda c: f"{int(c.min())}-{int(c.max())}"),
        ttft_mean_err=("ttft_mean_err", "median"), e2e_mean_err=("e2e_mean_err", "median"),
        tpot_mean_err=("tpot_mean_err", "median")).reset_index()
    return out.sort_values("tpot_mean_err", key=np.abs, ascending=False, kind="stable").reset_index(drop=True)


def held_out(points: list[ConcurrencyPoint], *, every: int = 2, fit_rounds: int = 6) -> pd.DataFrame:
    """Each server's points predicted by a stack fitted to its other points (:func:`kvlab.validate.calibrate.fit`):
    one GPU's points by the stack fitted on the server's other GPUs, or, where it has one GPU, one TP degree's
    by the others'. The fit takes every ``every``-th point of the others, each served ``fit_rounds`` rounds (the
    loop settles within a few); a group whose others are fewer than 2 points is skipped; a held-out point is
    replayed in full. Rows are :func:`replay_point`'s, with ``held_out`` (what was left out) and ``stack`` (the
    fitted terms, described)."""
    rows = []
    for ds in dict.fromkeys(p.setup.dataset for p in points):
        mine = [p for p in points if p.setup.dataset == ds]
        by = "gpu" if len({p.setup.gpu for p in mine}) > 1 else "tp"
        keys = sorted({getattr(p.setup, by) for p in mine}, key=str)
        for key in keys if len(keys) > 1 else ():
            train = [p for p in mine if getattr(p.setup, by) != key][::every]
            if len(train) < 2:  # a fit needs two runs at least
                continue
            terms = fit([p.record(fit_rounds) for p in train], name=f"{ds}-without-{by}-{key}").terms
            for p in (p for p in mine if getattr(p.setup, by) == key):
                row, _ = replay_point(p, terms=terms)
                rows.append({**row, "held_out": f"{by} {key}", "stack": terms.describe(), **fold_terms(terms)})
    return pd.DataFrame(rows)


def fit_stack(points: list[ConcurrencyPoint], *, name: str, label: str, command: str = "", every: int = 2,
              fit_rounds: int = 6) -> StackTerms:
    """A stack fitted to one server's ``points`` (every ``every``-th, served ``fit_rounds`` rounds, as in
    :func:`held_out`), its record holding the points it was fitted to and :func:`held_out`'s errors, each
    point predicted by the stack fitted without its GPU (or TP degree; ``folds``: those stacks' terms by the
    ``held_out`` key the points carry): what a shipped cost-model file
    states (:func:`kvlab.costmodel.stacks.save`; ``overload_right`` None: a closed loop makes no overload call)."""
    import datetime as dt

    if len({p.setup.dataset for p in points}) != 1:
        raise ValueError("fit_stack takes one server's points (one dataset)")
    used = points[::every]
    f = fit([p.record(fit_rounds) for p in used], name=name)
    ho = held_out(points, every=every, fit_rounds=fit_rounds)
    keep = ["point", "dataset", "gpu", "model", "tp", "concurrency", "held_out", "ttft_mean_err", "e2e_mean_err",
            "tpot_mean_err"]
    rows = [{("run" if k == "point" else k): (x.item() if hasattr(x, "item") else x) for k, x in r.items()}
            for r in ho[keep].to_dict(orient="records")]
    folds = {key: {c: float(g[c].iloc[0]) for c in FOLD_TERMS} for key, g in ho.groupby("held_out", sort=False)}
    by = "GPU" if ho["held_out"].str.startswith("gpu").all() else "TP degree"
    meta = {"fitted_to": [{"run": p.setup.name, "dataset": p.setup.dataset, "model": p.setup.model,
                           "gpu": p.setup.gpu, "tp": p.setup.tp, "engine": p.setup.engine,
                           "server": f"{p.setup.server} {p.setup.server_version}".strip(),
                           "requests": fit_rounds * p.concurrency} for p in used],
            "fit": {"steps": f.steps, "residual": f.residual, "scale_fitted": f.scale_fitted,
                    "points": f"1 in {every} of the {len(points)} points, {fit_rounds} rounds each"},
            "command": command, "date": dt.date.today().isoformat(),
            "held_out": {"method": f"leave-one-{by}-out: each point predicted by terms fitted to the points of the "
                                   f"server's other {by}s",
                         "folds": folds,  # each fold's terms (fold_terms), once
                         "runs": [{**r, "overload_right": None} for r in rows],
                         "median_abs_err": {m: float(ho[f"{m}_mean_err"].abs().median()) for m in ("ttft", "e2e", "tpot")},
                         "overload_right": None}}
    return replace(f.terms, label=label, meta=meta)


def derive(silicon: pd.DataFrame) -> pd.DataFrame:
    """The points kvlab can run from aiconfigurator's silicon sample (module note), in :data:`COLUMNS`."""
    s = silicon
    keep = ((s["mode"] == "agg") & s["system"].isin(list(_GPUS)) & s["model_path"].isin(list(_MODELS))
            & s["precision"].isin(list(_WEIGHTS)) & s["backend"].isin(list(_SERVERS))
            & s["pp_size"].fillna(1).eq(1) & s["attention_dp_size"].fillna(1).le(1)
            & s["moe_ep_size"].fillna(1).le(1) & s["silicon_ttft_ms"].gt(0) & s["silicon_tpot_ms"].gt(0))
    s = s[keep]
    source = s["silicon_data_source"].astype(str)
    conc = source.str.extract(r"silicon_concurrency=(\d+)")[0].astype(float).fillna(s["batch_size"])
    measured = source.str.extract(r"measured=(\d{4}-\d{2}-\d{2})")[0].fillna("")
    out = pd.DataFrame({
        "point": [f"{i}#{k}" for k, i in zip(s.index, s["id"])], "server": s["backend"].map(_SERVERS),
        "server_version": s["backend_version"].fillna(""), "model": s["model_path"].map(_MODELS),
        "gpu": s["system"].map(_GPUS), "tp": s["tp_size"].astype(int), "weight_dtype": s["precision"].map(_WEIGHTS),
        "concurrency": conc.astype(int), "prompt_tokens": s["isl"].astype(int), "output_tokens": s["osl"].astype(int),
        "ttft_mean_s": s["silicon_ttft_ms"] / 1e3, "tpot_mean_s": s["silicon_tpot_ms"] / 1e3,
        "measured": measured, "source_id": s["id"]})
    return out.sort_values(["server", "gpu", "model", "tp", "prompt_tokens", "output_tokens", "concurrency", "point"],
                           kind="stable").reset_index(drop=True)


def write(silicon_csv: str | os.PathLike, path: Path = PATH) -> Path:
    """Rewrite :data:`PATH` from a checkout's ``silicon_sample.csv`` (:func:`derive`)."""
    table = derive(pd.read_csv(silicon_csv))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv_atomically(table, path)
    return path


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".csv"):
        sys.exit("usage: python -m kvlab.validate.points AICONFIGURATOR/aic-core/src/aiconfigurator_core/systems/"
                 "silicon_sample.csv")
    print(f"written {write(sys.argv[1])}")

