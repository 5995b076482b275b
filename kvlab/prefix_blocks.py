"""Block identities of a workload's requests, for the prefix cache (:mod:`kvlab.prefix_cache`).

Where they come from, in order of preference:

* **Mooncake hash ids** (a ``hash_ids`` column: one list per request, one id per
  ``hash_block_tokens``-token block of the prompt, 512 in the Mooncake traces,
  kvcache-ai/Mooncake ``FAST25-release/traces/README``). The server's blocks are smaller: block
  ``m`` of ``block_size`` tokens is sub-block ``m % r`` of hash block ``m // r`` (``r =
  hash_block_tokens / block_size``, which must be a whole number), so its identity is the pair
  ``(hash_ids[m // r], m % r)``. Only blocks the prompt fills are shared; Mooncake's ids
  already chain each block to its prefix (equal ids, equal prefix).
* **A stated prefix model** for traces without ids (:class:`PrefixModel`), off unless chosen:
  a share of the requests begins with the same system prompt of ``system_prompt_tokens``
  tokens (which requests: a seeded draw); and/or multi-turn sessions (a ``session_column``):
  a session's turns, in arrival order, extend one token stream (each prompt is the previous
  turn's prompt and output plus the new message), so a block's identity is (stream, position)
  over the prompt. A turn whose prompt is shorter than the previous turn's context (history
  cut) starts a new stream. Only prompts are keyed: a turn finds the previous turn's prompt
  blocks, not the blocks of its output (those it recomputes).
* Otherwise no block is shared between requests.

Every other block of a request (the rest of its prompt, its output) has an id of its own, so a
preempted request still finds its own blocks on return (vLLM hashes generated tokens too). The
ids are made dense (``0 .. num_ids - 1``) for the pool's arrays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from . import _validate as v
from .prefix_cache import BlockIds

#: Tokens per hash block of the Mooncake traces.
MOONCAKE_HASH_BLOCK_TOKENS = 512
#: The workload column holding per-request hash ids.
HASH_IDS = "hash_ids"


@dataclass(frozen=True, kw_only=True)
class PrefixModel:
    """A stated prefix model for traces without block ids (tokens, shares).

    Attributes
    ----------
    system_prompt_tokens : int
        Length of the shared system prompt (tokens; 0: none). A request shorter than it shares
        the blocks its prompt fills.
    system_prompt_share : float
        Share of requests that begin with it, in [0, 1].
    seed : int
        Seed of the draw of which requests do.
    session_column : str, optional
        Workload column naming each request's multi-turn session (None: no sessions). Where
        both are given, a session's first turn carries the system prompt and the session the rest.
    """

    system_prompt_tokens: int = 0
    system_prompt_share: float = 0.0
    seed: int = 0
    session_column: str | None = None

    def __post_init__(self) -> None:
        v.nonnegative_int(self.system_prompt_tokens, "system_prompt_tokens")
        v.fraction(self.system_prompt_share, "system_prompt_share", low_open=False, high_closed=True)
        v.nonnegative_int(self.seed, "seed")
        if self.session_column is not None and not isinstance(self.session_column, str):
            raise ValueError(f"session_column must be a column name (str), got {self.session_column!r}")


def shared_keys(workload: pd.DataFrame, *, block_size: int, hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS,
                model: PrefixModel | None = None) -> tuple[list[np.ndarray], str]:
    """Per request, the int64 keys of its leading full prompt blocks that other requests may share,
    and where they came from (``"hash_ids"``, ``"prefix model"`` or ``"none"``).

    Keys are only compared for equality; :func:`block_ids` makes them dense.
    """
    prompt = workload["prompt_tokens"].to_numpy(dtype=np.int64)
    full = prompt // block_size
    if HASH_IDS in workload.columns:
        hash_block_tokens = v.positive_int(hash_block_tokens, "hash_block_tokens")
        if hash_block_tokens % block_size:
            raise ValueError(f"block_size {block_size} does not divide the trace's {hash_block_tokens}-token hash "
                             f"blocks: its hash ids cannot be re-blocked")
        r = hash_block_tokens // block_size
        rows = [_ids(ids, i) for i, ids in enumerate(workload[HASH_IDS].to_numpy())]
        # the trace's ids made dense first, so (id, sub-block) -> id * r + sub-block stays in int64
        _, dense = np.unique(np.concatenate(rows) if rows else np.zeros(0, np.int64), return_inverse=True)
        out, at = [], 0
        for i, h in enumerate(rows):
            d = dense[at:at + h.size].astype(np.int64)
            at += h.size
            m = np.arange(min(int(full[i]), h.size * r), dtype=np.int64)
            out.append(d[m // r] * r + m % r)
        return out, HASH_IDS
    if model is None or not ((model.system_prompt_tokens and model.system_prompt_share) or model.session_column):
        return [np.zeros(0, dtype=np.int64) for _ in range(prompt.size)], "none"
    # keys: the system prompt's blocks are 0 .. S-1; stream t's block m is S + t * W + m
    sys_blocks = model.system_prompt_tokens // block_size if model.system_prompt_share else 0
    chosen = np.random.default_rng(model.seed).random(prompt.size) < model.system_prompt_share
    width = int(full.max()) + 1
    stream = np.arange(prompt.size)  # each request its own stream unless a session continues one
    if model.session_column is not None:
        v.require_columns(workload, (model.session_column,), "workload")
        output = workload["output_tokens"].to_numpy(dtype=np.int64)
        t = workload["arrival_s"].to_numpy() if "arrival_s" in workload.columns else np.zeros(prompt.size)
        order = np.lexsort((np.arange(prompt.size), t))
        last: dict[Any, int] = {}
        for i in order.tolist():
            sid = workload[model.session_column].iat[i]
            j = last.get(sid)
            if j is not None and prompt[i] >= prompt[j] + output[j]:
                stream[i] = stream[j]
            last[sid] = i
    out = []
    for i in range(prompt.size):
        first = chosen[stream[i]]  # a stream carries the system prompt if its first turn does
        k = min(sys_blocks, int(full[i])) if first else 0
        own = sys_blocks + stream[i] * width + np.arange(k, int(full[i]), dtype=np.int64)
        out.append(np.concatenate([np.arange(k, dtype=np.int64), own]) if model.session_column else
                   np.arange(k, dtype=np.int64))
    return out, "prefix model"


def _ids(value: Any, row: int) -> np.ndarray:
    arr = np.asarray(value if value is not None else [], dtype=object).reshape(-1)
    try:
        out = arr.astype(np.int64)
    except (TypeError, ValueError):
        raise ValueError(f"hash_ids of request {row} must be a list of non-negative integers, got {value!r}"
                         ) from None
    if (out < 0).any():
        raise ValueError(f"hash_ids of request {row} must be non-negative, got {value!r}")
    return out


def block_ids(keys: list[np.ndarray], capacity_blocks: np.ndarray) -> BlockIds:
    """Dense block ids: request ``i``'s ``capacity_blocks[i]`` blocks, its shared ``keys[i]`` first.

    Equal keys get equal ids; every other block gets an id of its own.
    """
    cap = np.asarray(capacity_blocks, dtype=np.int64)
    n_shared = np.array([min(k.size, int(c)) for k, c in zip(keys, cap)], dtype=np.int64)
    flat = np.concatenate([k[:s] for k, s in zip(keys, n_shared)]) if len(keys) else np.zeros(0, np.int64)
    uniq, dense = np.unique(flat, return_inverse=True)
    start = np.zeros(cap.size + 1, dtype=np.int64)
    np.cumsum(cap, out=start[1:])
    ids = np.empty(int(start[-1]), dtype=np.int64)
    own = uniq.size
    at = 0
    for i in range(cap.size):
        s, c, k = int(start[i]), int(cap[i]), int(n_shared[i])
        ids[s:s + k] = dense[at:at + k]
        ids[s + k:s + c] = np.arange(own, own + c - k)
        own += c - k
        at += k
    return BlockIds(ids=ids, start=start, num_ids=own)
