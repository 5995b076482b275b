"""The serving set-ups of Sarathi-Serve's capacity evaluation, as named presets.

Shipped as ``data/presets.yaml``, each with its source: model, GPU, TP and PP degrees, the P99
TBT SLOs (strict and relaxed), Sarathi-Serve's token budget per SLO, the vLLM baseline's max
batch and the capacity gain the paper reports.

>>> p = preset("mistral-7b-1xa100")
>>> p.slo("strict").tbt_p99_s, p.config("chunked", "strict").max_num_batched_tokens
(0.1, 512)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import yaml

from . import _validate as v
from . import claims as _claims
from ._paths import DATA_DIR, SHARED_DATA_DIR
from .capacity import SLO, CapacityResult, ServingConfig, capacities, capacity_table
from .costmodel.measured import check_kernels
from .lengths import Profile

PRESET_FILE = DATA_DIR / "presets.yaml"
SLO_KINDS = ("strict", "relaxed")
#: The scheduler of each side of the comparison: Sarathi-Serve's and the vLLM baseline's.
SCHEDULERS = ("chunked", "prefill_first")


@dataclass(frozen=True, kw_only=True)
class Preset:
    """One set-up of the paper (times in seconds, budgets in tokens).

    Attributes
    ----------
    name, model, gpu : str
    tp, pp : int
        Tensor-parallel GPUs per stage, pipeline stages.
    tbt_slo_s : dict
        ``{"strict": s, "relaxed": s}``, P99 TBT SLOs (seconds).
    token_budget_tokens : dict
        Sarathi-Serve's token budget per SLO (tokens per iteration).
    baseline_max_num_seqs : int
        The vLLM baseline's max batch (requests).
    scheduling_delay_p50_s : float
        Median scheduling delay SLO (seconds).
    paper_capacity_gain : float
        Sarathi-Serve's capacity over vLLM's as the paper reports it ("up to").
    source : str
    stage_link : str
        Link between pipeline stages (one of :data:`kvlab.costmodel.pipeline.STAGE_LINKS`).
    max_model_len : int, optional
        The context the paper served (tokens): its chat-trace runs set ``max_seq_len`` 8192
        whatever the model's own context.
    baseline_not_stated : str
        Non-empty when the paper's gain names no baseline deployment: what is unstated, and which
        one kvlab runs (its rows are then stand-ins).
    kernels : str or None
        The measured model's kernel era the paper's servers ran (:func:`kvlab.costmodel.cost_model`):
        ``"2024"`` (Vidur's profiles of that time) for Sarathi-Serve's runs.
    """

    name: str
    model: str
    gpu: str
    tp: int
    pp: int
    tbt_slo_s: dict[str, float]
    token_budget_tokens: dict[str, int]
    baseline_max_num_seqs: int
    scheduling_delay_p50_s: float
    paper_capacity_gain: float
    source: str
    stage_link: str = "in-node"
    kernels: str | None = None
    max_model_len: int | None = None
    baseline_not_stated: str = ""

    @property
    def num_gpus(self) -> int:
        """GPUs of the set-up (tp x pp)."""
        return self.tp * self.pp

    def slo(self, kind: str = "strict") -> SLO:
        """The strict or relaxed SLO."""
        kind = v.choice(kind, "slo", SLO_KINDS)
        return SLO(tbt_p99_s=self.tbt_slo_s[kind], scheduling_delay_p50_s=self.scheduling_delay_p50_s)

    def config(self, scheduler: str = "chunked", slo: str = "strict", **changes: Any) -> ServingConfig:
        """The configuration the paper runs under ``slo``.

        ``chunked``: Sarathi-Serve, token budget of that SLO. ``prefill_first``: the vLLM
        baseline (whole prefills, its default 8192-token budget). Both run at most
        ``baseline_max_num_seqs`` requests (per micro-batch under PP) with vLLM's on-demand
        allocation; ``changes`` override any :class:`kvlab.capacity.ServingConfig` field.
        """
        scheduler = v.choice(scheduler, "scheduler", SCHEDULERS)
        kind = v.choice(slo, "slo", SLO_KINDS)
        budget = self.token_budget_tokens[kind] if scheduler == "chunked" else None
        base = ServingConfig(model=self.model, gpu=self.gpu, tp=self.tp, pp=self.pp, scheduler=scheduler,
                             max_num_batched_tokens=budget, max_num_seqs=self.baseline_max_num_seqs,
                             stage_link=self.stage_link, max_model_len=self.max_model_len, kernels=self.kernels)
        return replace(base, **changes)


def _kernels(value: Any, where: str) -> str | None:
    """A set-up's kernel era (:func:`kvlab.costmodel.measured.check_kernels`), ``ValueError`` naming the file and key."""
    try:
        return check_kernels(value)
    except ValueError as exc:
        raise ValueError(f"{PRESET_FILE}: {where}: {exc}") from None


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    """``data/presets.yaml``, read once."""
    return yaml.safe_load(PRESET_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _load() -> dict[str, Preset]:
    raw = _raw()
    out = {}
    for name, p in raw["presets"].items():
        out[name] = Preset(name=name, model=p["model"], gpu=p["gpu"], tp=int(p["tp"]), pp=int(p["pp"]),
                           tbt_slo_s={k: float(p["tbt_slo_s"][k]) for k in SLO_KINDS},
                           token_budget_tokens={k: int(p["token_budget_tokens"][k]) for k in SLO_KINDS},
                           baseline_max_num_seqs=int(p["baseline_max_num_seqs"]),
                           scheduling_delay_p50_s=float(raw["scheduling_delay_p50_s"]),
                           paper_capacity_gain=float(p["paper_capacity_gain"]), source=str(p["source"]),
                           stage_link=str(p.get("stage_link", "in-node")),
                           max_model_len=raw.get("max_model_len"),
                           baseline_not_stated=str(p.get("baseline_not_stated", "")),
                           kernels=_kernels(raw.get("kernels"), "kernels"))
    return out


def paper_trial_requests() -> int:
    """Requests per trial in Sarathi-Serve's capacity runs (its artifact's ``num_requests``: 2,048)."""
    return int(_raw()["trial_requests"])


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    return list(_load())


def preset(name: str) -> Preset:
    """The preset ``name``; ``ValueError`` listing the presets for an unknown one."""
    return _load()[v.choice(name, "preset", preset_names())]


# ---------------------------------------------------------------------------------- the paper's comparison
#: The key columns of :func:`scheduler_comparison`'s table, in order.
COMPARISON_KEYS = ("preset", "trace", "slo", "cost_model", "seed", "scheduler")


def scheduler_comparison(names: Sequence[str], workloads: Mapping[str, pd.DataFrame | str | Path | Profile], *,
                         slos: Sequence[str] = SLO_KINDS, cost_models: Sequence[str] = ("roofline", "measured"),
                         engine: str | None = None, max_workers: int = 1, seed: int = 0,
                         seeds: Mapping[str, Sequence[int]] | None = None,
                         **capacity_kw: Any) -> tuple[pd.DataFrame, dict[tuple[Any, ...], CapacityResult]]:
    """Capacity of Sarathi-Serve (chunked) and the vLLM baseline (prefill-first) per preset, trace, SLO, cost model, seed.

    Parameters
    ----------
    names : sequence of str
        Preset names.
    workloads : mapping
        Trace label -> workload as :func:`kvlab.capacity.capacity` takes it (e.g. from
        :func:`trace_workload`).
    slos : sequence of {"strict", "relaxed"}
    cost_models : sequence of {"roofline", "measured"}
        Each search runs under each; ``measured`` is skipped for a preset it cannot price
        (:func:`kvlab.claims.cost_models_for` says why).
    engine : str, optional
        Simulator engine.
    max_workers : int
        Processes running whole searches.
    seed : int
        Seed of a trace not in ``seeds``.
    seeds : mapping, optional
        Trace label -> the seeds its searches run with (each a whole search: arrivals, and the
        sample of a profile), for an interval over seeds; default ``[seed]`` for every trace.
    **capacity_kw
        Passed to :func:`kvlab.capacity.capacity` (``num_requests``, ``rel_tol``, ...).

    Returns
    -------
    (DataFrame, dict)
        :func:`kvlab.capacity.capacity_table` keyed by :data:`COMPARISON_KEYS` (its
        ``cost_model`` column renamed ``cost_model_label``); and the results by those keys.
    """
    found: dict[tuple[Any, ...], CapacityResult] = {}
    for trace, workload in workloads.items():
        for sd in (seeds or {}).get(trace, [seed]):
            cases = {}
            for name in names:
                p = preset(name)
                for kind in slos:
                    reasons = _claims.cost_models_for(p.model, p.gpu, tp=p.tp, cost_models=list(cost_models))
                    for cm in cost_models:
                        if reasons[cm]:
                            continue
                        for sched in SCHEDULERS:
                            cases[(name, trace, kind, cm, int(sd), sched)] = (
                                p.config(sched, kind, engine=engine, cost_model=cm), p.slo(kind))
            # Sarathi-Serve's own trials: every request counts, no steadiness check (the paper's terms)
            found.update(capacities(workload, cases, max_workers=max_workers, seed=int(sd),
                                    **{"warmup_frac": 0.0, "max_backlog_frac": None, "window_check": False,
                                       **capacity_kw}))
    table = capacity_table(found, key_names=("preset", "trace", "slo", "cost_model_", "seed", "scheduler_"))
    table = table.rename(columns={"cost_model": "cost_model_label"}).rename(
        columns={"cost_model_": "cost_model"}).drop(columns=["scheduler_"])
    return table, found


def capacity_gains(comparison: pd.DataFrame) -> pd.DataFrame:
    """Chunked over prefill-first capacity per (preset, trace, slo, cost model, seed), from :func:`scheduler_comparison`.

    ``gain`` is NaN when prefill-first's capacity is 0 (no finite ratio).
    """
    keys = [k for k in COMPARISON_KEYS if k != "scheduler" and k in comparison]
    wide = comparison.pivot_table(index=keys, columns="scheduler", values="capacity_qps", sort=False).reset_index()
    wide.columns.name = None
    wide["gain"] = wide["chunked"] / wide["prefill_first"].where(wide["prefill_first"] > 0)
    return wide[[*keys, "chunked", "prefill_first", "gain"]]


def paper_claims(comparison: pd.DataFrame, *, inputs: Mapping[str, _claims.Inputs] | None = None,
                 rel_tol: float = 0.3) -> pd.DataFrame:
    """The claims table: each preset's "up to" gain next to kvlab's on each trace, per cost model, over seeds.

    The paper's gain is "up to" over its two SLOs and its chat and arxiv traces; kvlab gives one
    row per trace, its value under a cost model the best gain over the SLOs run, one per seed
    (the interval the verdict is decided on, +-``rel_tol``). A row whose trace, trial size or
    baseline is not the paper's (``inputs``: the arxiv file filtered to 4k against the paper's
    16k, a fitted profile in place of a trace, a quick run's small trials, the 5.6x's unstated
    baseline) is a stand-in and gets no verdict. The note names, for the roofline's best case,
    the constraint binding each scheduler just above its capacity, and what the pipeline model
    adds under PP.

    Parameters
    ----------
    comparison : DataFrame
        :func:`scheduler_comparison`'s table.
    inputs : mapping, optional
        Trace label -> what kvlab ran on it (:func:`trace_inputs`).
    """
    gains = capacity_gains(comparison)
    if "seed" not in gains:
        gains = gains.assign(seed=0)
    out = []
    for (name, trace), g in gains.groupby(["preset", "trace"], sort=False):
        p = preset(name)
        claim = (f"Sarathi-Serve serves up to {p.paper_capacity_gain}x vLLM's capacity "
                 f"({p.model}, {p.num_gpus} x {p.gpu}, TP{p.tp}-PP{p.pp}): {trace} trace")
        src = _claims.SetUp(model=p.model, gpu=p.gpu, tp=p.tp, pp=p.pp,
                            workload=f"chat (ShareGPT) and arxiv traces, {paper_trial_requests():,} requests per "
                                     "trial, Poisson arrivals",
                            scheduler=f"Sarathi-Serve chunks of {p.token_budget_tokens['strict']}/"
                                      f"{p.token_budget_tokens['relaxed']} tokens vs vLLM prefill-first, batch "
                                      f"{p.baseline_max_num_seqs}" + (", stages on two nodes" if p.pp > 1 else ""),
                            metric="capacity: highest request rate meeting the SLO; 'up to' over traces and SLOs",
                            slo=f"P99 TBT <= {p.tbt_slo_s['strict']:g} s (strict) / {p.tbt_slo_s['relaxed']:g} s "
                                f"(relaxed), median scheduling delay <= {p.scheduling_delay_p50_s:g} s")
        given = (inputs or {}).get(trace) or _claims.Inputs()
        row_in = replace(given, metric="capacity gain, chunked over prefill-first; 'up to' over traces and SLOs",
                         read_from=f"kvlab.capacity bisection over Poisson trials; best gain over the SLOs on the "
                                   f"{trace} trace, one per seed",
                         differs=given.differs + ((p.baseline_not_stated,) if p.baseline_not_stated else ()))
        mine = replace(src, workload=f"{given.trace_words() if given.trace else trace}, Poisson arrivals",
                       metric="capacity by kvlab.capacity (bisection over seeded Poisson trials); best over SLOs")
        value: dict[str, list[float] | None] = {cm: None for cm in _claims.COST_MODELS}
        why = []
        for cm, gc in g.groupby("cost_model", sort=False):
            per_seed = gc.groupby("seed")["gain"].max().dropna()
            if per_seed.empty:
                why.append(f"{cm}: prefill-first meets no SLO at any rate tried")
                continue
            value[cm] = per_seed.tolist()
            best = gc.loc[gc["gain"].idxmax()]
            rows = comparison[(comparison["preset"] == name) & (comparison["trace"] == trace)
                              & (comparison["slo"] == best["slo"]) & (comparison["cost_model"] == cm)
                              & ((comparison["seed"] == best["seed"]) if "seed" in comparison else True)
                              ].set_index("scheduler")
            why.append(f"{cm}: best at the {best['slo']} SLO, chunked {best['chunked']:.3g} vs "
                       f"prefill-first {best['prefill_first']:.3g} requests/s (prefill-first bound by "
                       f"{rows.loc['prefill_first', 'binding']}; chunked by {rows.loc['chunked', 'binding']})")
        why += [x for x in [_claims.not_run_note(_claims.cost_models_for(p.model, p.gpu, tp=p.tp))] if x]
        if p.pp > 1:
            why.append("pipeline bubbles of uneven micro-batches priced by a mean-field estimate (kvlab.costmodel.pipeline), "
                       f"stages linked by the {p.stage_link} network")
        if all(x is None for x in value.values()):
            out.append(_claims.Claim(claim=claim, source=p.source, source_setup=src.describe(),
                                     kvlab_setup=mine.describe(), trace=row_in.trace_words(),
                                     trial_size=row_in.trial_words(), metric=row_in.metric,
                                     read_from=row_in.read_from, claimed=f"{p.paper_capacity_gain}x",
                                     kvlab_value="n/a", verdict="not computed: " + "; ".join(why),
                                     kind="not computed", claim_type="simulated"))
            continue
        out.append(_claims.close(claim, p.source, p.paper_capacity_gain, value, rel_tol=rel_tol, unit="x",
                                 source_setup=src, kvlab_setup=mine, note="; ".join(why), inputs=row_in))
    return _claims.table(out)


# ---------------------------------------------------------------------------------- other sources' set-ups
@dataclass(frozen=True, kw_only=True)
class SourceSetup:
    """The set-up a published claim was measured in, and how kvlab runs it (``data/presets.yaml``).

    Attributes
    ----------
    name, source : str
    model, gpu : str
        Catalogue names (:mod:`kvlab.specs`).
    tp, pp : int
    profile : str
        Shipped length profile standing for the source's workload.
    trace : str
        Key of the shipped trace table (read from ``../shared/data/traces`` when present), or "".
    scheduler : str
        ``prefill_first`` or ``chunked``, with ``max_num_batched_tokens`` (tokens per iteration)
        and ``max_num_seqs`` (requests).
    max_num_seqs_stated : bool
        False when the source states no batch limit: ``max_num_seqs`` is then
        :data:`LIFTED_MAX_NUM_SEQS` (no cap; the KV pool bounds the batch).
    max_model_len : int
        Maximum sequence length (tokens, prompt + output).
    block_size : int
        Tokens per KV page.
    workload, metric, slo : str
        In words, as the source states them.
    stated : dict
        The source's own words for fields where kvlab runs a stand-in.
    missing : str
        What kvlab lacks to run the source's set-up ("" when it runs it).
    kernels : str or None
        The measured model's kernel era the source's servers ran (:func:`kvlab.costmodel.cost_model`):
        ``"2024"`` (Vidur's profiles) for the papers of 2023-2024, None (today's engines') for later ones.
    """

    name: str
    source: str
    model: str
    gpu: str
    tp: int
    pp: int
    profile: str
    trace: str
    scheduler: str
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    max_num_seqs_stated: bool
    workload: str
    metric: str
    slo: str
    stated: dict[str, Any]
    missing: str
    kernels: str | None = None

    @property
    def reproducible(self) -> bool:
        """Whether kvlab runs the source's own set-up (nothing missing)."""
        return not self.missing

    def source_setup(self, **changes: Any) -> _claims.SetUp:
        """The set-up as the source states it (for the claims table)."""
        fields = dict(model=self.model, gpu=self.gpu, tp=self.tp, pp=self.pp, workload=self.workload,
                      scheduler=self.scheduler_words(), metric=self.metric, slo=self.slo)
        return _claims.SetUp(**{**fields, **self.stated, **changes})

    def kvlab_setup(self, *, cost_model: str = "", workload: str | None = None, **changes: Any) -> _claims.SetUp:
        """The set-up kvlab runs (model, GPU, workload as loaded, scheduler; ``changes`` override)."""
        wl = workload if workload is not None else (f"profile {self.profile}" if self.profile else "")
        fields = dict(model=self.model, gpu=self.gpu, tp=self.tp, pp=self.pp, workload=wl,
                      scheduler=self.scheduler_words(), metric=self.metric, slo=self.slo)
        if cost_model:
            fields["metric"] = f"{fields['metric']}; cost model {cost_model}"
        return _claims.SetUp(**{**fields, **changes})

    def scheduler_words(self) -> str:
        """The scheduler and its limits in words."""
        kind = "prefill-first (vLLM v0)" if self.scheduler == "prefill_first" else "chunked prefill"
        cap = (f"at most {self.max_num_seqs} requests" if self.max_num_seqs_stated
               else "no batch cap (not stated in the paper: lifted, the KV pool bounds the batch)")
        return (f"{kind}, {self.max_num_batched_tokens:,} tokens per iteration, {cap}, "
                f"max sequence {self.max_model_len:,} tokens, block {self.block_size}")

    def simulate_kw(self) -> dict[str, Any]:
        """:func:`kvlab.simulate` keywords of the set-up (model, GPU, TP, scheduler and its limits)."""
        if self.pp != 1:
            raise ValueError(f"set-up {self.name} has pp={self.pp}: simulate it through kvlab.capacity")
        return dict(model=self.model, gpu=self.gpu, tp=self.tp, scheduler=self.scheduler,
                    max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
                    block_size=self.block_size, kernels=self.kernels)

    def config(self, policy: str = "vllm", *, cost_model: Any = None, **changes: Any) -> ServingConfig:
        """A :class:`kvlab.capacity.ServingConfig` of the set-up serving ``policy``."""
        base = ServingConfig(model=self.model, gpu=self.gpu, tp=self.tp, pp=self.pp, scheduler=self.scheduler,
                             max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
                             block_size=self.block_size, policy=policy, cost_model=cost_model, kernels=self.kernels)
        return replace(base, **changes)


#: ``max_num_seqs`` of a set-up whose source states no batch limit: no cap (the KV pool bounds the batch).
LIFTED_MAX_NUM_SEQS = 1 << 20


def _batch_limit(value: Any, name: str) -> tuple[int, bool]:
    if value == "not stated":
        return LIFTED_MAX_NUM_SEQS, False
    return v.positive_int(value, f"setups.{name}.max_num_seqs (or 'not stated')"), True


@lru_cache(maxsize=1)
def _load_setups() -> dict[str, SourceSetup]:
    raw = _raw()
    out = {}
    for name, s in raw["setups"].items():
        max_num_seqs, stated = _batch_limit(s["max_num_seqs"], name)
        out[name] = SourceSetup(name=name, source=str(s["source"]), model=s["model"], gpu=s["gpu"], tp=int(s["tp"]),
                                pp=int(s["pp"]), profile=str(s.get("profile", "")), trace=str(s.get("trace", "")),
                                scheduler=v.choice(s["scheduler"], f"setups.{name}.scheduler", SCHEDULERS),
                                max_num_batched_tokens=int(s["max_num_batched_tokens"]),
                                max_num_seqs=max_num_seqs, max_num_seqs_stated=stated,
                                max_model_len=int(s["max_model_len"]), block_size=int(s["block_size"]),
                                workload=str(s["workload"]), metric=str(s["metric"]),
                                slo=str(s.get("slo", "")), stated=dict(s.get("stated", {})),
                                missing=str(s.get("missing", "")), kernels=_kernels(s.get("kernels"), f"setups.{name}.kernels"))
    return out


def setup_names() -> list[str]:
    """Names of the shipped source set-ups."""
    return list(_load_setups())


def source_setup(name: str) -> SourceSetup:
    """The source set-up ``name``; ``ValueError`` listing the set-ups for an unknown one."""
    return _load_setups()[v.choice(name, "setup", setup_names())]


@lru_cache(maxsize=1)
def _traces() -> dict[str, dict[str, str]]:
    return {k: {kk: str(vv) for kk, vv in t.items()} for k, t in _raw()["traces"].items()}


def trace_names() -> list[str]:
    """Keys of the traces the presets name (``chat``, ``arxiv``)."""
    return list(_traces())


def trace_workload(name: str, *, trace_dir: str | Path | None = None) -> tuple[str, str]:
    """What stands for the trace ``name``: the file under ``trace_dir`` when present, else its profile.

    Parameters
    ----------
    name : str
        A key of :func:`trace_names`.
    trace_dir : path, optional
        Folder of the shared traces; default ``traces`` under :data:`kvlab._paths.SHARED_DATA_DIR`
        (``../shared/data`` beside the repository, or ``$KVLAB_SHARED_DATA``).

    Returns
    -------
    (str, str)
        The workload to pass to :func:`kvlab.capacity.capacity` (a file path or a profile name)
        and a line saying which it is.
    """
    t = _traces()[v.choice(name, "trace", trace_names())]
    folder = Path(trace_dir) if trace_dir is not None else SHARED_DATA_DIR / "traces"
    path = folder / t["file"]
    if path.is_file():
        return str(path), f"trace {t['file']} ({t['source']})"
    return t["profile"], f"profile {t['profile']} fitted to {t['file']} (the file is not at {folder})"


def trace_inputs(name: str, *, num_requests: int, trace_dir: str | Path | None = None) -> _claims.Inputs:
    """What a claims row run on the trace ``name`` rests on, against the paper's (:class:`kvlab.claims.Inputs`).

    The file when present: the paper's own trace, or a stand-in saying how it differs (the arxiv
    file is filtered to 4k tokens, the paper's runs allowed 16k); else the profile fitted to it
    (a stand-in). ``num_requests`` per trial against the paper's :func:`paper_trial_requests`.
    """
    t = _traces()[v.choice(name, "trace", trace_names())]
    workload, _ = trace_workload(name, trace_dir=trace_dir)
    n = v.positive_int(num_requests, "num_requests")
    if workload == t["profile"]:
        return _claims.Inputs(trace=t["profile"], trace_kind="fitted profile", num_requests=n,
                              source_num_requests=paper_trial_requests(),
                              differs=(f"{t['file']} is not under {Path(trace_dir) if trace_dir else SHARED_DATA_DIR / 'traces'}",))
    differs = (t["differs"],) if t.get("differs") else ()
    return _claims.Inputs(trace=t["file"], trace_kind="stand-in" if differs else "source's own", num_requests=n,
                          source_num_requests=paper_trial_requests(), differs=differs)
