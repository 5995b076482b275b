"""Reservation arithmetic: pages per request, pool size from GPU memory, concurrency and waste.

A server that reserves for the worst case at admission holds ``ceil(tokens / block_size)`` pages
per request for its whole life (brief section 1). These closed forms are what notebook 01 shows;
the simulator (``kvlab.sim``) shows what happens over time.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from . import _validate as v
from ._intmath import ceil_div
from .specs import GIB, GPUSpec, ModelSpec, gpu as _gpu, model as _model


def pages_for(tokens: np.ndarray | int, block_size: int) -> np.ndarray | int:
    """Pages needed to hold ``tokens`` tokens: ``ceil(tokens / block_size)`` (pages)."""
    return ceil_div(np.asarray(tokens, dtype=np.int64), block_size)


def pool_pages(model: str | ModelSpec, gpu: str | GPUSpec, *, block_size: int = 16,
               gpu_memory_utilization: float = 0.9, tp: int = 1, pp: int = 1,
               dtype_bytes: int | None = None, activation_reserve_bytes: float = 1 * GIB) -> int:
    """KV pages that fit on one GPU after weights and activations (pages).

    ``(memory x gpu_memory_utilization - weights per GPU - activation_reserve_bytes)
    / (block_size x KV bytes per token per GPU)``, rounded down, as vLLM sizes its block pool.
    Weights and KV take the model's precision (``kvlab.specs.with_precision``: FP8 KV halves
    the page, so the pool holds twice the pages); ``dtype_bytes`` forces one byte width on both.

    Raises ``ValueError`` (with the numbers) when the weights and reserve do not fit.
    """
    m, g = _model(model), _gpu(gpu)
    block_size = v.positive_int(block_size, "block_size")
    util = v.fraction(gpu_memory_utilization, "gpu_memory_utilization")
    activation_reserve_bytes = v.nonnegative_float(activation_reserve_bytes, "activation_reserve_bytes")
    budget = g.memory_bytes * util
    weights = m.weight_bytes_per_gpu(tp=tp, pp=pp, dtype_bytes=dtype_bytes)
    free = budget - weights - activation_reserve_bytes
    page_bytes = block_size * m.kv_bytes_per_token(tp=tp, pp=pp, dtype_bytes=dtype_bytes)
    if free < page_bytes:
        raise ValueError(
            f"model {m.name} does not fit GPU {g.name} (tp={tp}, pp={pp}): "
            f"{g.memory_bytes / GIB:.1f} GiB x gpu_memory_utilization {util} = {budget / GIB:.1f} GiB, "
            f"weights {weights / GIB:.1f} GiB + activation reserve {activation_reserve_bytes / GIB:.1f} GiB "
            f"leave {free / GIB:.2f} GiB, less than one {page_bytes / 2**20:.2f} MiB KV page")
    return int(free // page_bytes)


def reservation_table(max_new_tokens: Sequence[int] | int = (128, 512, 2048), *, pool_pages: int = 1000,
                      block_size: int = 16, prompt_tokens: int = 0) -> pd.DataFrame:
    """Worst-case reservation per request and the concurrency it allows.

    Parameters
    ----------
    max_new_tokens : int or sequence of int
        Output caps to tabulate (tokens).
    pool_pages : int
        KV pages in the pool (pages).
    block_size : int
        Tokens per page.
    prompt_tokens : int
        Prompt length reserved on top of the output (tokens); 0 counts decode reservation only,
        as the brief's table does.

    Returns
    -------
    DataFrame with ``max_new_tokens``, ``prompt_tokens``, ``prompt_pages``, ``decode_pages``,
    ``pages_per_request`` and ``max_concurrent_requests = pool_pages // pages_per_request``.

    Examples
    --------
    >>> reservation_table([128, 512, 2048], pool_pages=1000, block_size=16)[
    ...     ["pages_per_request", "max_concurrent_requests"]].values.tolist()
    [[8, 125], [32, 31], [128, 7]]
    """
    mnt = v.positive_int_array(max_new_tokens, "max_new_tokens")
    pool_pages = v.positive_int(pool_pages, "pool_pages")
    block_size = v.positive_int(block_size, "block_size")
    prompt_tokens = v.nonnegative_int(prompt_tokens, "prompt_tokens")
    if prompt_tokens:
        # Prompt and output share pages: the request holds ceil((prompt + output) / block_size).
        total = pages_for(prompt_tokens + mnt, block_size)
        prompt_pages = np.full_like(mnt, pages_for(prompt_tokens, block_size))
    else:
        total = pages_for(mnt, block_size)
        prompt_pages = np.zeros_like(mnt)
    return pd.DataFrame({
        "max_new_tokens": mnt,
        "prompt_tokens": prompt_tokens,
        "prompt_pages": prompt_pages,
        "decode_pages": total - prompt_pages,
        "pages_per_request": total,
        "max_concurrent_requests": pool_pages // total,
    })


def reservation_waste(output_tokens: np.ndarray, max_new_tokens: Sequence[int] | int, *, block_size: int = 16,
                      prompt_tokens: np.ndarray | int | None = None, low_use_frac: float = 0.05,
                      overreserve_factor: float = 9.0) -> pd.DataFrame:
    """How much of a worst-case reservation a sample of requests actually uses.

    Each request reserves ``ceil((prompt + max_new_tokens) / block_size)`` pages and uses
    ``ceil((prompt + min(output, max_new_tokens)) / block_size)`` of them at its largest.

    Parameters
    ----------
    output_tokens : array of int
        Observed output lengths (tokens).
    max_new_tokens : int or sequence of int
        Caps to evaluate (tokens).
    block_size : int
        Tokens per page.
    prompt_tokens : array of int, int or None
        Prompt lengths (tokens); ``None`` counts decode pages only.
    low_use_frac : float
        Threshold for the "uses under X of its reservation" share (default 5%).
    overreserve_factor : float
        Threshold for the "reserves more than k x what it uses" share (default 9x).

    Returns
    -------
    DataFrame, one row per cap: ``kv_used_frac`` (used / reserved pages, summed over requests),
    ``share_under_low_use`` (requests whose tokens are under ``low_use_frac`` of their reserved
    tokens), ``p50_output_tokens``, ``p99_output_tokens``, ``overreservation_at_p99``
    (max_new_tokens / p99 output), ``share_overreserved`` (requests reserving more than
    ``overreserve_factor`` x the tokens they use), ``share_capped`` (outputs cut at the cap).
    """
    out = v.positive_int_array(output_tokens, "output_tokens")
    mnt = v.positive_int_array(max_new_tokens, "max_new_tokens")
    block_size = v.positive_int(block_size, "block_size")
    low_use_frac = v.fraction(low_use_frac, "low_use_frac")
    overreserve_factor = v.positive_float(overreserve_factor, "overreserve_factor")
    if prompt_tokens is None:
        prompt = np.zeros_like(out)
    else:
        prompt = np.broadcast_to(v.nonnegative_int_array(prompt_tokens, "prompt_tokens"), out.shape)
    rows = []
    for cap in mnt.tolist():
        used_tokens = prompt + np.minimum(out, cap)
        reserved_tokens = prompt + cap
        used_pages = pages_for(used_tokens, block_size)
        reserved_pages = pages_for(reserved_tokens, block_size)
        rows.append({
            "max_new_tokens": cap,
            "block_size": block_size,
            "with_prompt": prompt_tokens is not None,
            "kv_used_frac": used_pages.sum() / reserved_pages.sum(),
            "share_under_low_use": float(np.mean(used_tokens < low_use_frac * reserved_tokens)),
            "p50_output_tokens": float(np.percentile(out, 50)),
            "p99_output_tokens": float(np.percentile(out, 99)),
            "overreservation_at_p99": cap / float(np.percentile(out, 99)),
            "share_overreserved": float(np.mean(reserved_tokens > overreserve_factor * used_tokens)),
            "share_capped": float(np.mean(out >= cap)),
        })
    return pd.DataFrame(rows)


def real_pool_table(model: str | ModelSpec, gpu: str | GPUSpec, max_new_tokens: Sequence[int] | int = (128, 512, 2048),
                    *, block_size: int = 16, gpu_memory_utilization: float = 0.9, tp: int = 1, pp: int = 1,
                    prompt_tokens: int = 0, dtype_bytes: int | None = None,
                    activation_reserve_bytes: float = 1 * GIB) -> pd.DataFrame:
    """:func:`reservation_table` for a real model on a real GPU (pool sized by :func:`pool_pages`)."""
    m, g = _model(model), _gpu(gpu)
    pool = pool_pages(m, g, block_size=block_size, gpu_memory_utilization=gpu_memory_utilization, tp=tp, pp=pp,
                      dtype_bytes=dtype_bytes, activation_reserve_bytes=activation_reserve_bytes)
    table = reservation_table(max_new_tokens, pool_pages=pool, block_size=block_size, prompt_tokens=prompt_tokens)
    table.insert(0, "gpu", g.name)
    table.insert(0, "model", m.name)
    table["pool_pages"] = pool
    table["kv_bytes_per_token"] = m.kv_bytes_per_token(tp=tp, pp=pp, dtype_bytes=dtype_bytes)
    return table
