"""Recompute against swap for one preemption: the costs side by side, their crossover.

A preempted sequence of ``s`` tokens (prompt + generated so far) can resume in two ways
(brief section 4):

* **recompute**: drop its KV pages and prefill the ``s`` tokens again. Priced with the same
  roofline the simulator uses (:class:`kvlab.costmodel.CostModel`): one iteration per prefill
  chunk when the scheduler prefills in chunks of a token budget, one iteration otherwise. Linear
  layers cost ~ 2 x params x s FLOPs, causal attention ~ s^2, KV writes ~ s bytes; at short
  lengths the weight reads (memory-bound) set the floor.
* **swap**: copy its ``ceil(s / block_size)`` pages to pinned host memory and back, each copy
  paying a fixed latency plus bytes / host-link bandwidth. How many copies a page takes depends
  on the KV layout (``copy_mode``): vLLM v0 keeps one K and one V tensor per layer and issues one
  ``cudaMemcpyAsync`` per page per tensor (``csrc/cache_kernels.cu: swap_blocks``), so a page is
  2 x layers small copies; a page-contiguous layout needs one copy per page; a batched copy
  gathers every page into one transfer.

Recompute is priced two ways, the two ends of what it costs in a server: alone (its chunks run in
iterations of their own, each reading every weight and paying the fixed overhead; the roofline
as it is) and piggybacked (:func:`piggyback`: its chunks ride decode iterations that run anyway,
so it pays only its own FLOPs and KV bytes).

Both are per GPU: under tensor parallelism each GPU recomputes its share of the FLOPs and swaps
its share of the KV heads over its own host link, in parallel with the others.

Model-level functions (:func:`preemption_costs`, :func:`crossover`, :func:`crossover_table`)
check lengths against the model's context; :func:`recompute_s` and :meth:`kvlab.swap.SwapModel.swap_s`
price any positive length.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from .costmodel import CostModel, describe as _describe_cost, prefill_attention_pairs, resolve as _resolve_cost
from .reservation import pool_pages
from .specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model, models as _models, gpus as _gpus
from .swap import COPY_MODES, DEFAULT_COPY_LATENCY_S, SwapModel, swap_model

TP_CHOICES = (1, 2, 4, 8)


def piggyback(cost: Any) -> Any:
    """The cost model of prefill work riding iterations that run anyway (marginal cost).

    Under continuous batching a recomputed sequence's chunks usually join other requests'
    decode iterations, which read the weights and pay the fixed overhead whatever joins them.
    The chunk then adds its own FLOPs and KV bytes only: this is ``cost`` with no weight bytes,
    no fixed overhead and no per-iteration all-reduce latency. It is the marginal cost in a
    compute-bound batch; in a memory-bound one the chunk can hide partly under the weight reads.
    A measured model gives its own marginal model
    (:meth:`kvlab.costmodel.MeasuredCostModel.marginal`).
    """
    if callable(getattr(cost, "marginal", None)):
        return cost.marginal()
    return replace(cost, weight_bytes=0.0, iteration_overhead_s=0.0, allreduce_latency_s_per_iteration=0.0,
                   label=f"{cost.label}, marginal")


def _chunk_iterations(cost: CostModel, chunk_tokens: Any, context_tokens: Any) -> np.ndarray:
    """Roofline time of prefill chunks of ``chunk_tokens`` after ``context_tokens`` (seconds)."""
    return cost.iteration_s(chunk_tokens, prefill_attention_pairs(chunk_tokens, context_tokens),
                            context_tokens + chunk_tokens)


def _recompute_s(cost: CostModel, seq: np.ndarray, chunk_tokens: int | None) -> np.ndarray:
    if chunk_tokens is None or chunk_tokens >= seq.max():
        return _chunk_iterations(cost, seq, np.zeros_like(seq))
    c = chunk_tokens
    # Full chunks j = 0, 1, ... cost the same for every sequence: price each once and sum with
    # a cumulative sum; each sequence then adds its own last (partial or full) chunk.
    num_full = int((seq.max() - 1) // c)
    j = np.arange(num_full, dtype=np.int64)
    full = np.concatenate([[0.0], np.cumsum(_chunk_iterations(cost, np.full_like(j, c), j * c))])
    before = (seq - 1) // c
    context = before * c
    return full[before] + _chunk_iterations(cost, seq - context, context)


def recompute_s(cost: CostModel, seq_tokens: Any, *, chunk_tokens: int | None = None) -> np.ndarray:
    """Time to prefill ``seq_tokens`` tokens again after a recompute preemption (seconds).

    One roofline iteration per chunk of ``chunk_tokens`` (the scheduler's prefill token budget),
    each chunk attending to the chunks before it; ``None`` prefills in one iteration. The
    sequence runs alone in those iterations, so each pays the weight reads and fixed overhead.

    Parameters
    ----------
    cost : CostModel
        The per-GPU roofline (:func:`kvlab.costmodel.roofline` or a calibrated one).
    seq_tokens : int or array of int
        Tokens to recompute (prompt + generated so far).
    chunk_tokens : int or None
        Prefill chunk size (tokens).

    Examples
    --------
    >>> from kvlab.costmodel import roofline
    >>> cost = roofline("Llama-3-8B", "H200")
    >>> bool(recompute_s(cost, 4096, chunk_tokens=512)[0] > recompute_s(cost, 4096)[0])
    True
    """
    seq = v.positive_int_array(seq_tokens, "seq_tokens")
    if chunk_tokens is not None:
        chunk_tokens = v.positive_int(chunk_tokens, "chunk_tokens")
    return np.asarray(_recompute_s(cost, seq, chunk_tokens), dtype=np.float64)


def recompute_flops(cost: CostModel, seq_tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    """Linear-layer and attention FLOPs of recomputing ``seq_tokens`` tokens, per GPU (FLOPs).

    Chunking does not change them: the chunks' attention pairs sum to ``s (s + 1) / 2``.
    """
    seq = v.positive_int_array(seq_tokens, "seq_tokens")
    return (cost.linear_flops_per_token * seq.astype(np.float64),
            cost.attention_flops_per_pair * prefill_attention_pairs(seq, 0).astype(np.float64))


def attention_dominance_tokens(cost: CostModel) -> float:
    """Sequence length at which recompute's attention FLOPs equal its linear FLOPs (tokens).

    Solves ``linear x s = attention x s (s + 1) / 2``: ``s = 2 linear / attention - 1``. Below
    it the O(s) linear layers dominate recompute, above it the O(s^2) attention does.
    """
    return 2.0 * cost.linear_flops_per_token / cost.attention_flops_per_pair - 1.0


def _check_context(seq: np.ndarray, m: ModelSpec, allow_beyond_context: bool) -> None:
    if not allow_beyond_context and seq.max() > m.max_context_tokens:
        i = int(np.argmax(seq > m.max_context_tokens))
        raise ValueError(f"seq_tokens element {i} is {int(seq[i])}, longer than the "
                         f"{m.max_context_tokens}-token context of {m.name}; pass "
                         f"allow_beyond_context=True to price it anyway")


def _models_for(model: str | ModelSpec, gpu: str | GPUSpec, tp: int, cost_model: Any,
                swap: SwapModel | None) -> tuple[ModelSpec, GPUSpec, CostModel, SwapModel]:
    m, g = _model(model), _gpu(gpu)
    tp = m.check_tp(tp)
    pool_pages(m, g, tp=tp)  # a model whose weights leave no KV page "does not fit": say so, price nothing
    cost = _resolve_cost(cost_model, m, g, tp=tp)
    sw = swap_model(m, g, tp=tp) if swap is None else swap
    for what, obj in (("cost_model", cost), ("swap", sw)):
        if (obj.model_name, obj.gpu_name, obj.tp) != (m.name, g.name, tp):
            raise ValueError(f"{what} describes {obj.model_name} on {obj.gpu_name} with tp={obj.tp}, "
                             f"not {m.name} on {g.name} with tp={tp}")
    return m, g, cost, sw


def preemption_costs(model: str | ModelSpec, gpu: str | GPUSpec, seq_tokens: Any, *, block_size: int = 16,
                     tp: int = 1, chunk_tokens: int | None = None, cost_model: Any = None,
                     swap: SwapModel | None = None, allow_beyond_context: bool = False) -> pd.DataFrame:
    """Recompute and swap cost of one preemption at each sequence length, per GPU.

    Parameters
    ----------
    model, gpu : str or spec
        Catalogue names (see :func:`kvlab.specs.models`) or specs.
    seq_tokens : int or array of int
        Sequence lengths at preemption (tokens).
    block_size : int
        Tokens per KV page.
    tp : int
        Tensor-parallel GPUs.
    chunk_tokens : int or None
        Prefill chunk size used for the recompute (tokens); ``None``: one iteration.
    cost_model : {"measured", "roofline"}, cost model object or None
        Iteration-time model (:func:`kvlab.costmodel.resolve`); ``None``: measured where the GPU
        has measurements, else the roofline.
    swap : SwapModel or None
        Overrides the link or copy mode; default :func:`swap_model` of ``model`` on ``gpu``.
    allow_beyond_context : bool
        Price lengths beyond the model's context instead of raising ``ValueError``.

    Returns
    -------
    DataFrame with ``seq_tokens``, ``recompute_s``, ``swap_s``, ``recompute_over_swap``,
    ``winner``, ``linear_flops``, ``attention_flops``, ``swap_bytes`` (one way) and
    ``num_copies`` (one way).
    """
    seq = v.positive_int_array(seq_tokens, "seq_tokens")
    block_size = v.positive_int(block_size, "block_size")
    if chunk_tokens is not None:
        chunk_tokens = v.positive_int(chunk_tokens, "chunk_tokens")
    m, _, cost, sw = _models_for(model, gpu, tp, cost_model, swap)
    _check_context(seq, m, allow_beyond_context)
    rec = _recompute_s(cost, seq, chunk_tokens)
    swp = sw._swap_s(seq, block_size)
    linear, attention = recompute_flops(cost, seq)
    return pd.DataFrame({
        "seq_tokens": seq, "recompute_s": rec, "swap_s": swp, "recompute_over_swap": rec / swp,
        "winner": np.where(rec <= swp, "recompute", "swap"),
        "linear_flops": linear, "attention_flops": attention,
        "swap_bytes": sw._swap_bytes(seq, block_size), "num_copies": sw._num_copies(seq, block_size),
    })


@dataclass(frozen=True, kw_only=True, eq=False)
class Crossover:
    """Where recompute and swap cost the same, for one model, GPU, TP and block size.

    ``crossover_tokens`` is the length from which ``winner_above`` is the cheaper method at every
    longer length up to ``max_seq_tokens``; ``winner_below`` wins just under it. ``None`` when
    one method wins at every length. Partly filled pages make swap a staircase, so the winner
    can change more than once (``num_crossings``), typically within the first page or two;
    ``first_crossover_tokens`` is the first change. Ties go to recompute.
    ``recompute_over_swap_min``/``_max`` bound the cost ratio over 1..``max_seq_tokens``.
    ``curves`` holds both costs on a log-spaced grid (from :func:`preemption_costs`);
    ``cost_model`` names the iteration-time model recompute was priced with.
    """

    model_name: str
    gpu_name: str
    tp: int
    block_size: int
    chunk_tokens: int | None
    copy_mode: str
    max_seq_tokens: int
    crossover_tokens: int | None
    first_crossover_tokens: int | None
    winner_below: str
    winner_above: str
    num_crossings: int
    recompute_over_swap_min: float
    recompute_over_swap_max: float
    curves: pd.DataFrame
    cost_model: str = ""

    def summary(self) -> str:
        """One sentence saying which method wins where."""
        head = f"{self.model_name} on {self.gpu_name} (tp={self.tp}, block_size={self.block_size}, " \
            f"cost model {self.cost_model or 'unnamed'})"
        if self.crossover_tokens is None:
            return (f"{head}: {self.winner_below} wins at every length up to {self.max_seq_tokens} tokens "
                    f"(recompute/swap between {self.recompute_over_swap_min:.3g} and "
                    f"{self.recompute_over_swap_max:.3g})")
        more = f" ({self.num_crossings} changes of winner, the first at {self.first_crossover_tokens})" \
            if self.num_crossings > 1 else ""
        return (f"{head}: {self.winner_below} wins just below {self.crossover_tokens} tokens, "
                f"{self.winner_above} from there to {self.max_seq_tokens}{more}")

    def __str__(self) -> str:
        return f"Crossover: {self.summary()}; cost curves in .curves"


def _winner(diff: np.ndarray) -> np.ndarray:
    return np.where(diff > 0, "swap", "recompute")


def crossing_tokens(seq_tokens: Any, recompute_s: Any, swap_s: Any) -> tuple[float | None, int]:
    """Where the cheaper method last changes, from two cost curves sampled on a grid (tokens).

    For measured curves, which come on sparse grids: the cost difference is interpolated
    linearly in length between the two grid points that bracket the last change of winner (as
    :class:`Crossover` defines it; ties go to recompute). Returns that length (``None`` when the
    winner never changes) and how many times the winner changes on the grid.
    """
    seq = v.positive_int_array(seq_tokens, "seq_tokens")
    rec, swp = np.asarray(recompute_s, dtype=np.float64), np.asarray(swap_s, dtype=np.float64)
    if rec.shape != seq.shape or swp.shape != seq.shape:
        raise ValueError(f"recompute_s and swap_s must have the shape of seq_tokens {seq.shape}, "
                         f"got {rec.shape} and {swp.shape}")
    if np.any(np.diff(seq) <= 0):
        raise ValueError("seq_tokens must be strictly increasing")
    diff = rec - swp
    swap_wins = diff > 0
    changes = np.flatnonzero(swap_wins[1:] != swap_wins[:-1])
    if changes.size == 0:
        return None, 0
    i = int(changes[-1])
    s0, s1 = float(seq[i]), float(seq[i + 1])
    return s0 + (s1 - s0) * diff[i] / (diff[i] - diff[i + 1]), int(changes.size)


def _dense_crossover(seq: np.ndarray, rec: np.ndarray, swp: np.ndarray) -> dict[str, Any]:
    diff = rec - swp
    swap_wins = diff > 0
    changes = np.flatnonzero(swap_wins[1:] != swap_wins[:-1])
    ratio = rec / swp
    return {
        "crossover_tokens": int(seq[changes[-1] + 1]) if changes.size else None,
        "first_crossover_tokens": int(seq[changes[0] + 1]) if changes.size else None,
        "winner_below": str(_winner(diff[changes[-1]:changes[-1] + 1] if changes.size else diff[:1])[0]),
        "winner_above": str(_winner(diff[-1:])[0]),
        "num_crossings": int(changes.size),
        "recompute_over_swap_min": float(ratio.min()), "recompute_over_swap_max": float(ratio.max()),
    }


def _curve_grid(max_seq: int, num_points: int) -> np.ndarray:
    return np.unique(np.geomspace(1, max_seq, num_points).round().astype(np.int64))


#: Most points of :func:`crossover`'s ``curves`` table (a table for plotting; the crossover itself
#: is found at every integer length whatever this is).
MAX_CURVE_POINTS = 100_000


def crossover(model: str | ModelSpec, gpu: str | GPUSpec, block_size: int = 16, *, tp: int = 1,
              chunk_tokens: int | None = None, cost_model: Any = None,
              swap: SwapModel | None = None, max_seq_tokens: int | None = None,
              allow_beyond_context: bool = False, num_curve_points: int = 200) -> Crossover:
    """The sequence length where recompute and swap of one preemption cost the same.

    Both costs are evaluated at every integer length from 1 to ``max_seq_tokens`` (default: the
    model's context), so the crossover is exact for the model, not a root-finder's estimate.

    Parameters
    ----------
    model, gpu, block_size, tp, chunk_tokens, cost_model, swap, allow_beyond_context
        As in :func:`preemption_costs`.
    max_seq_tokens : int or None
        Longest length considered (tokens); default the model's ``max_context_tokens``.
    num_curve_points : int
        Points of the log-spaced ``curves`` table.

    Examples
    --------
    >>> c = crossover("Llama-3-8B", "H200", 16)
    >>> c.winner_below in ("recompute", "swap")
    True
    """
    block_size = v.positive_int(block_size, "block_size")
    if chunk_tokens is not None:
        chunk_tokens = v.positive_int(chunk_tokens, "chunk_tokens")
    num_curve_points = v.positive_int(num_curve_points, "num_curve_points", maximum=MAX_CURVE_POINTS)
    m, g, cost, sw = _models_for(model, gpu, tp, cost_model, swap)
    # every length is evaluated densely (a few int64/float64 arrays of max_seq_tokens each):
    # bounded before anything is allocated
    max_seq = m.max_context_tokens if max_seq_tokens is None \
        else v.positive_int(max_seq_tokens, "max_seq_tokens", maximum=v.MAX_TRACE_TOKENS)
    _check_context(np.array([max_seq]), m, allow_beyond_context)
    seq = np.arange(1, max_seq + 1, dtype=np.int64)
    found = _dense_crossover(seq, _recompute_s(cost, seq, chunk_tokens), sw._swap_s(seq, block_size))
    curves = preemption_costs(m, g, _curve_grid(max_seq, num_curve_points), block_size=block_size, tp=sw.tp,
                              chunk_tokens=chunk_tokens, cost_model=cost, swap=sw, allow_beyond_context=True)
    return Crossover(model_name=m.name, gpu_name=g.name, tp=sw.tp, block_size=block_size,
                     chunk_tokens=chunk_tokens, copy_mode=sw.copy_mode, max_seq_tokens=max_seq,
                     curves=curves, cost_model=_describe_cost(cost), **found)


def smallest_tp(model: str | ModelSpec, gpu: str | GPUSpec, *, block_size: int = 16) -> int | None:
    """Smallest tensor-parallel degree in 1, 2, 4, 8 whose weights leave room for KV pages.

    ``None`` when the model does not fit even on 8 GPUs (see :func:`kvlab.reservation.pool_pages`).
    """
    for tp in TP_CHOICES:
        try:
            pool_pages(model, gpu, block_size=block_size, tp=tp)
        except ValueError:
            continue
        return tp
    return None


def crossover_table(models: Sequence[str] | None = None, gpus: Sequence[str] | None = None,
                    block_sizes: Sequence[int] = (8, 16, 32, 64, 128), *, chunk_tokens: int | None = None,
                    piggybacked: bool = False,
                    copy_mode: str = "per_page", link_bytes_per_s: float | None = None,
                    copy_latency_s: float = DEFAULT_COPY_LATENCY_S,
                    reference_tokens: int = 4000, cost_model: str | None = None) -> pd.DataFrame:
    """:func:`crossover` over the spec catalogue: models x GPUs x block sizes.

    Each model runs on each GPU with the smallest TP in 1, 2, 4, 8 that fits it
    (:func:`smallest_tp`); pairs that fit on no TP are left out.

    Parameters
    ----------
    models, gpus : sequence of str or None
        Catalogue names; ``None`` takes the whole catalogue.
    block_sizes : sequence of int
        Tokens per page.
    chunk_tokens, copy_mode, link_bytes_per_s, copy_latency_s
        As in :func:`recompute_s` and :func:`swap_model` (``link_bytes_per_s=None``: each GPU's
        nominal host link).
    piggybacked : bool
        Price recompute with :func:`piggyback` (riding other iterations) instead of alone.
    reference_tokens : int
        The brief's crossover (~4,000 tokens): ``recompute_over_swap_at_ref`` is the ratio there
        and ``brief_claim`` says whether recompute wins below a crossover within a factor of 2
        of it and swap above (``holds``) or not (``differs``, with what kvlab finds).
    cost_model : {"measured", "roofline"} or None
        Iteration-time model of every row (:func:`kvlab.costmodel.cost_model`; ``None``: measured
        where the GPU has measurements); the ``cost_model`` column names the one each row ran.

    Returns
    -------
    DataFrame, one row per (model, GPU, block size): ``model``, ``gpu``, ``host_link``, ``tp``,
    ``block_size``, ``max_seq_tokens``, ``crossover_tokens`` and ``first_crossover_tokens`` (NA
    when none; see :class:`Crossover`), ``winner_below``,
    ``winner_above``, ``num_crossings``, ``recompute_over_swap_min``/``_max``,
    ``recompute_over_swap_at_ref``, ``reference_tokens``, ``attention_dominance_tokens``,
    ``brief_claim``.
    """
    names_m = list(_models()["name"]) if models is None else list(models)
    names_g = list(_gpus()["name"]) if gpus is None else list(gpus)
    sizes = v.positive_int_array(block_sizes, "block_sizes")
    reference_tokens = v.positive_int(reference_tokens, "reference_tokens")
    if chunk_tokens is not None:
        chunk_tokens = v.positive_int(chunk_tokens, "chunk_tokens")
    rows = []
    for mn in names_m:
        m = _model(mn)
        seq = np.arange(1, m.max_context_tokens + 1, dtype=np.int64)
        ref = min(reference_tokens, m.max_context_tokens)
        for gn in names_g:
            g = _gpu(gn)
            tp = smallest_tp(m, g)
            if tp is None:
                continue
            alone = _resolve_cost(cost_model, m, g, tp=tp)
            cost = piggyback(alone) if piggybacked else alone
            sw = swap_model(m, g, tp=tp, copy_mode=copy_mode, link_bytes_per_s=link_bytes_per_s,
                            copy_latency_s=copy_latency_s)
            rec = _recompute_s(cost, seq, chunk_tokens)
            for bs in sizes.tolist():
                swp = sw._swap_s(seq, bs)
                rows.append({"model": m.name, "gpu": g.name, "host_link": g.host_link, "tp": tp,
                             "block_size": bs, "max_seq_tokens": m.max_context_tokens,
                             "cost_model": _describe_cost(cost),
                             **_dense_crossover(seq, rec, swp),
                             "recompute_over_swap_at_ref": float(rec[ref - 1] / swp[ref - 1]),
                             "reference_tokens": ref,
                             "attention_dominance_tokens": attention_dominance_tokens(cost)})
                rows[-1]["brief_claim"] = _brief_verdict(rows[-1], reference_tokens)
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.astype({"crossover_tokens": "Int64", "first_crossover_tokens": "Int64"})
    return table


def _brief_verdict(row: dict[str, Any], reference_tokens: int) -> str:
    """Verdict on "recompute is faster below ~reference_tokens, swap above" for one table row."""
    at = row["crossover_tokens"]
    if at is None:
        return f"differs: {row['winner_below']} always wins (recompute/swap " \
               f"{row['recompute_over_swap_min']:.2g}-{row['recompute_over_swap_max']:.2g})"
    if row["winner_below"] == "recompute" and reference_tokens / 2 <= at <= 2 * reference_tokens:
        return f"holds (crossover at {at:,} tokens)"
    return f"differs: {row['winner_below']} wins just below {at:,} tokens, {row['winner_above']} above"


def recompute_over_swap(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, block_sizes: Sequence[int],
                        cost_model: Any = None, swap: SwapModel | None = None, chunk_tokens: int | None = None,
                        min_seq_tokens: int = 64) -> pd.DataFrame:
    """Recompute time over swap time per block size, over lengths ``min_seq_tokens`` to the context.

    One row per block size: ``block_size``, ``min_ratio``, ``max_ratio`` (recompute / swap over
    every length), with swap priced by ``swap`` (default: the GPU's host link, this model's
    :func:`kvlab.swap.swap_model`) and recompute by ``cost_model``.
    """
    m, g = _model(model), _gpu(gpu)
    min_seq_tokens = v.positive_int(min_seq_tokens, "min_seq_tokens")
    if min_seq_tokens >= m.max_context_tokens:
        raise ValueError(f"min_seq_tokens {min_seq_tokens} must be below the {m.max_context_tokens}-token "
                         f"context of {m.name}")
    m, g, cost, sw = _models_for(m, g, v.positive_int(tp, "tp"), cost_model, swap)
    seq = np.arange(min_seq_tokens, m.max_context_tokens + 1, dtype=np.int64)
    rec = _recompute_s(cost, seq, chunk_tokens)
    rows = []
    for bs in v.positive_int_array(block_sizes, "block_sizes").tolist():
        ratio = rec / sw._swap_s(seq, bs)
        rows.append({"block_size": bs, "min_ratio": float(ratio.min()), "max_ratio": float(ratio.max())})
    return pd.DataFrame(rows)


# The swap model is re-exported: the crossover functions take it, and notebook 03 builds it here.
__all__ = ["COPY_MODES", "DEFAULT_COPY_LATENCY_S", "TP_CHOICES", "Crossover", "SwapModel", "attention_dominance_tokens",
           "crossing_tokens", "crossover", "crossover_table", "piggyback",
           "preemption_costs", "recompute_flops", "recompute_over_swap", "recompute_s", "smallest_tp", "swap_model"]
