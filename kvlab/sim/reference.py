"""The reference engine: plain Python, one object per request, to be read as the specification.

NOTE (the model; a fast engine must reproduce every integer below exactly)
-------------------------------------------------------------------------
* Time is iteration-indexed. Iteration k starts at ``start_s``; requests with
  ``arrival_s <= start_s`` join the back of the waiting queue (in arrival order, ties by row)
  before it is scheduled; a policy that ``orders_queue`` then has the waiting queue sorted by
  ``policy.queue_rank`` (a distinct integer per request; preempted requests included), so
  its "front" below is the lowest rank. If nothing is running, waiting or swapped, the clock
  jumps to the next arrival. Iteration k lasts
  ``cost_model.iteration_s(tokens, attention_pairs, kv_tokens, num_seqs)`` (0 when it computes no
  token; ``num_seqs`` counts the sequences scheduled) plus ``page_copy_s`` per page swapped out or in.
* Tokens: a request caches ``computed_tokens`` of context; the iteration in which that reaches
  ``prompt + generated`` produces its next output token (prefill and decode are one rule). After
  ``min(output_tokens, max_new_tokens)`` tokens it finishes (LENGTH_CAPPED if output_tokens >
  max_new_tokens, else STOPPED) and its pages are freed at the end of the iteration.
* Pages: a scheduled chunk of c tokens needs ``pages_for(computed + c)`` pages, allocated when
  scheduled. At (re)admission a request reserves ``pages_for(policy.reservation_tokens(req))``.
  A page beyond the reservation: if ``policy.on_demand``, it is taken from the unpromised pages,
  preempting ``policy.choose_victim(running)`` (the newest by default) until it fits; otherwise
  the request preempts itself (TGI's requeue). A request that is the only holder of GPU pages and
  still cannot grow can never fit: it is aborted ("kv_exceeds_pool").
* Preemption (mode): recompute frees the pages and puts the request at the front of the waiting
  queue with computed_tokens = 0; swap copies pages_for(computed) pages to the CPU pool (if they
  fit, else recompute) and puts it at the front of the swapped queue; reject aborts it
  ("preempted_rejected"). A victim already scheduled in this iteration is unscheduled first.
* Each iteration, phases in order: ``_schedule_running``; then, only if nothing was preempted,
  ``_resume_swapped`` (FCFS) and, only if no request is left swapped, ``_admit_waiting`` (FCFS,
  stopping at the first request that does not fit: head-of-line blocking).
  - chunked: running requests that decode go first (oldest admission first), then running
    partial prefills, then swapped and waiting ones; each takes ``min(remaining, budget left)``
    tokens of ``max_num_batched_tokens``.
  - prefill_first: if a waiting request can be admitted, the iteration admits waiting requests
    whole (their full prefill must fit the budget left) and runs no decode; otherwise it decodes
    every running request and resumes swapped ones.
  - prefill_first_chunked (SGLang's default, ``--enable-mixed-chunk`` off): prefill work goes first
    and never shares an iteration with a decode: running partial prefills take ``min(remaining, budget
    left)`` tokens, then (if nothing was preempted) waiting requests are admitted as under chunked; only
    an iteration that scheduled none of these decodes every running request and resumes swapped ones
    (no admission). With requests swapped out it schedules as chunked without admission.
  - mixed_whole (TensorRT-LLM without chunked prefill): as chunked, but a waiting request is admitted
    only when its whole prefill fits the budget left (the first that does not stops admission), and
    one whose prefill exceeds ``max_num_batched_tokens`` is aborted ("exceeds_token_budget").
  - chunked_alternating (TGI 3 with prefill chunking): as chunked, but an iteration scheduled right after
    one that admitted a waiting request beside running ones admits none while anything runs (TGI's router
    follows each ``prefill`` pass that joins new requests to the running batch with a ``decode`` pass, which
    takes none; a ``prefill`` from an idle server may be followed by a joining one; partial prefills go on
    in every pass).
  At most ``max_num_seqs`` requests run.
* Admission checks ``policy.can_admit(req, free_pages=unpromised pages, running)`` (a policy that
  ``reserves_first_chunk``, vLLM V1: whether the pages of its prefix-cache hit plus its first
  chunk, ``min(remaining - hit tokens, budget left)``, fit the unpromised pages plus the hit pages
  others hold; it then reserves just those pages; resuming a swapped request asks ``can_admit``), except that
  a server with nothing running (and no request finishing, under async scheduling) admits its head
  whenever ``policy.fits_empty_pool(req)`` (so it
  never idles with work queued). A request that does not fit an empty pool is aborted
  ("exceeds_pool"); under prefill_first and mixed_whole, one whose prefill exceeds
  ``max_num_batched_tokens`` is aborted ("exceeds_token_budget").
* Prefix caching (only when the engine is given block ids; :mod:`kvlab.prefix_cache` states the
  pool's rules): at (re)admission a request's hit is its longest cached prefix of full blocks,
  at most ``(prompt + generated - 1) // block_size`` blocks; it starts with those pages in its
  block table and ``computed_tokens`` = hit blocks x ``block_size`` (its prefill skips them).
  Admission asks the policy with ``free_pages`` = unpromised pages + the hit pages other
  requests already hold (they cost nothing more); under prefill_first and mixed_whole the whole-prefill
  checks use the tokens left after the hit. A scheduled chunk enters the blocks it fills in the cache.
  Finished, preempted and aborted requests release their pages (the cached ones stay cached,
  evictable, least recently freed first). Preemption is recompute only. The hit at a request's
  first admission is its ``prefix_hit_tokens``; the hits of all its admissions add up to its
  ``saved_prefill_tokens``.
* Async scheduling (``async_scheduling``: vLLM V1's default since v0.14.0; ``EngineCore.step_with_batch_queue``
  in ``vllm/v1/engine/core.py`` schedules iteration k while k - 1 runs and processes k - 1's outputs
  after): while the engine is busy (the previous iteration ran into this one and a request is
  running or swapped), iteration k is scheduled at the start of k - 1: only arrivals up to then
  join the waiting queue, and the requests that finished in k - 1 still hold their pages and
  running slots (counted against ``max_num_seqs``; they compute nothing) until k is scheduled.
  Otherwise (an idle engine, or nothing running or swapped: the lagged schedule would be empty, so
  vLLM waits for k - 1 and schedules after it) they are released first and arrivals up to the
  iteration's start join, as without it. Tokens still stream when their iteration ends.
* Data-parallel ranks (``as_rank``): :mod:`kvlab.sim.data_parallel` states the group's rules. A rank
  starts with no request (the group routes each one to a rank), never jumps its clock (with
  nothing to schedule at ``now_s`` it waits, not lagged, until the group sets ``now_s``), and runs
  each iteration for the duration the group gives it (its own, or in lockstep the group's).
* All scheduling decisions compare integers; the only float comparison is arrival visibility.
  Every iteration must compute a token or abort a request, or else preempt one right after an
  iteration that did; otherwise ``RuntimeError`` is raised with the state (no livelock).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .._intmath import ceil_div
from ..costmodel import CostModel, prefill_attention_pairs
from ..paged import BlockPool
from ..prefix_cache import BlockIds, PrefixPool
from ..policies import Policy, Requests
from .config import PoolConfig, PreemptionMode, SchedulerConfig, SchedulerKind, SwapConfig
from .request import Request, RequestStatus


@dataclass
class _Step:
    """What iteration ``k`` does: chunks per request, preemptions, swap traffic, finishes."""

    k: int
    start_s: float
    budget_tokens: int
    chunks: dict[Request, int] = field(default_factory=dict)
    num_preempted: int = 0
    swap_pages: int = 0
    num_aborted: int = 0
    joined: bool = False  # a waiting request was admitted beside running ones (chunked_alternating's rule)
    duration_s: float = 0.0  # set before it runs: the engine's own price, or its data-parallel group's

    def work(self) -> tuple[int, int, int, int]:
        """What the iteration computes: (tokens, attention pairs, KV tokens read, sequences)."""
        pairs = sum(int(prefill_attention_pairs(c, r.computed_tokens)) for r, c in self.chunks.items())
        kv_tokens = sum(r.computed_tokens + c for r, c in self.chunks.items())
        return sum(self.chunks.values()), pairs, kv_tokens, len(self.chunks)

    def schedule(self, req: Request, chunk_tokens: int) -> None:
        self.chunks[req] = chunk_tokens
        self.budget_tokens -= chunk_tokens

    def unschedule(self, req: Request) -> None:
        self.budget_tokens += self.chunks.pop(req, 0)


ITERATION_COLUMNS = ("iteration", "start_s", "duration_s", "batch_size", "prefill_tokens", "decode_tokens",
                     "num_running", "num_waiting", "num_swapped", "num_preempted", "pages_used",
                     "pages_reserved", "pages_free", "pages_swapped", "swap_pages_moved")
#: Iteration columns added under prefix caching (pages, counted when ``pages_used`` is):
#: pages no request holds that keep a cached block, and pages sharing saves (block-table entries
#: minus distinct pages in use).
PREFIX_ITERATION_COLUMNS = ("pages_cached", "pages_shared_saved")


class ReferenceEngine:
    """Runs one simulation; :meth:`run` returns the requests and the per-iteration rows.

    ``as_rank``: the engine is one data-parallel rank of a group (:mod:`kvlab.sim.data_parallel` drives it
    through :meth:`steps`): it starts with no request (they come by :meth:`assign`) and its clock is the group's.
    """

    def __init__(self, requests: list[Request], *, policy: Policy, pool: PoolConfig, scheduler: SchedulerConfig,
                 swap: SwapConfig, cost_model: CostModel, blocks: BlockIds | None = None,
                 as_rank: bool = False) -> None:
        self.requests = requests
        self.policy, self.cfg, self.swap_cfg, self.cost = policy, scheduler, swap, cost_model
        self.block_size = pool.block_size
        self.caching = blocks is not None
        if self.caching and scheduler.preemption_mode != PreemptionMode.RECOMPUTE:
            raise ValueError(f"prefix caching preempts by recompute only, not {scheduler.preemption_mode.value!r}")
        self.pool: BlockPool | PrefixPool = (PrefixPool(num_pages=pool.num_pages, blocks=blocks) if self.caching
                                             else BlockPool(num_pages=pool.num_pages, num_owners=len(requests), xp=np))
        self.as_rank = as_rank
        order = [] if as_rank else sorted(requests, key=lambda r: (r.arrival_s, r.index))
        self.pending: deque[Request] = deque(order)
        self.waiting: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.running: list[Request] = []  # admission order, oldest first
        self.cpu_pages_used = 0
        self.now_s = 0.0
        self.k = 0
        self.admit_count = 0
        self.joined_last = False  # the previous iteration's ``joined`` (chunked_alternating)
        self.idle_before = False  # the previous iteration computed no token and aborted none
        self.rows: list[tuple] = []
        self.finishing: list[Request] = []  # async: finished in the previous iteration, pages and slots held
        self.prev_start_s: float | None = None  # async: when the iteration that ran into now started

    # ------------------------------------------------------------------ main loop
    def run(self) -> tuple[list[Request], list[tuple]]:
        for step in self.steps():
            step.duration_s = self.duration_s(step)
        return self.requests, self.rows

    def steps(self) -> Iterator[_Step | None]:
        """The iterations one at a time: each is yielded once scheduled and runs when resumed, for the
        ``duration_s`` set on it. Under ``as_rank`` an engine with nothing to schedule at ``now_s``
        yields None instead of jumping to its next arrival (the group moves ``now_s`` and assigns
        arrivals), and the generator never ends by itself."""
        while self.as_rank or self.pending or self.waiting or self.running or self.swapped:
            lagged = self.prev_start_s is not None and bool(self.running or self.swapped)
            if not lagged:
                self._release_finishing()
            visible_s = self.prev_start_s if lagged else self.now_s
            while self.pending and self.pending[0].arrival_s <= visible_s:
                self.waiting.append(self.pending.popleft())
            if self.policy.orders_queue:
                self.waiting = deque(sorted(self.waiting, key=lambda r: int(self.policy.queue_rank(r.view()))))
            if not (self.waiting or self.running or self.swapped):
                self.prev_start_s = None
                if self.as_rank:
                    yield None
                else:
                    self.now_s = self.pending[0].arrival_s
                continue
            step = self._schedule()
            self.joined_last = step.joined
            self._release_finishing()
            self._check_progress(step)
            yield step
            self._execute(step)

    def assign(self, req: Request) -> None:
        """A request the group routed to this rank (in arrival order); it joins at its arrival."""
        self.pending.append(req)

    def duration_s(self, step: _Step) -> float:
        """The iteration's own time (s): its swap traffic plus, when it computes a token, the cost model's."""
        tokens, pairs, kv_tokens, seqs = step.work()
        duration_s = step.swap_pages * self.swap_cfg.page_copy_s
        if tokens:
            duration_s += float(self.cost.iteration_s(tokens, pairs, kv_tokens, seqs))
        return duration_s

    def _release_finishing(self) -> None:
        """Async scheduling: the previous iteration's finished requests give back their pages and slots."""
        for req in self.finishing:
            self.pool.release(req.index)
        self.finishing.clear()

    def _slots_taken(self) -> int:
        """Running slots in use: the running requests and (async) the ones finished in the previous iteration."""
        return len(self.running) + len(self.finishing)

    # ------------------------------------------------------------------ scheduling phases
    def _schedule(self) -> _Step:
        step = _Step(k=self.k, start_s=self.now_s, budget_tokens=self.cfg.max_num_batched_tokens)
        if self.cfg.kind == SchedulerKind.PREFILL_FIRST and not self.swapped:
            self._admit_waiting(step, whole=True)
        elif self.cfg.kind == SchedulerKind.PREFILL_FIRST_CHUNKED and not self.swapped:
            self._schedule_running(step, decodes=False)
            if not step.num_preempted:
                self._admit_waiting(step, whole=False)
        if not step.chunks:
            self._schedule_running(step)
            if not step.num_preempted:
                self._resume_swapped(step)
                busy = self._slots_taken() > 0
                alternate = self.cfg.kind == SchedulerKind.CHUNKED_ALTERNATING
                if not self.swapped and (self.cfg.kind in (SchedulerKind.CHUNKED, SchedulerKind.MIXED_WHOLE)
                                         or alternate and not (self.joined_last and busy)):
                    self._admit_waiting(step, whole=self.cfg.kind == SchedulerKind.MIXED_WHOLE, beside=busy)
        if self.policy.keeps_state:
            self.policy.end_schedule(num_preempted=step.num_preempted, running=self._batch(self.running))
        return step

    def _schedule_running(self, step: _Step, *, decodes: bool = True) -> None:
        """Running requests take ``min(remaining, budget left)`` tokens: decodes first (none unless
        ``decodes``), then partial prefills, each in admission order."""
        order = [r for r in self.running if r.is_decoding] if decodes else []
        for req in order + [r for r in self.running if not r.is_decoding]:
            if req.status != RequestStatus.RUNNING or req in step.chunks:
                continue  # preempted as a victim earlier in this loop
            if step.budget_tokens == 0:
                break
            chunk = min(req.remaining_tokens, step.budget_tokens)
            if self._preempt_until_fits(req, chunk, step):
                self._allocate(req, chunk, step)

    def _resume_swapped(self, step: _Step) -> None:
        while self.swapped and self._slots_taken() < self.cfg.max_num_seqs and step.budget_tokens > 0:
            req = self.swapped[0]
            if not self.policy.fits_empty_pool(req.view()):
                self.swapped.popleft()
                self.cpu_pages_used -= req.cpu_pages
                self._abort(req, "exceeds_pool", step, preempted=False)
                continue
            if self._slots_taken() and not self._can_admit(req):
                break
            self.swapped.popleft()
            self.cpu_pages_used -= req.cpu_pages
            step.swap_pages += req.cpu_pages
            cpu_pages = req.cpu_pages
            req.swap_in(iteration=step.k, seq=self._next_seq(), start_s=step.start_s)
            self._reserve(req)
            self.pool.allocate([req.index], [cpu_pages])
            self.running.append(req)
            self._allocate(req, min(req.remaining_tokens, step.budget_tokens), step)

    def _admit_waiting(self, step: _Step, *, whole: bool, beside: bool = False) -> None:
        """Admit from the front of the waiting queue until one does not fit; ``beside``: requests were running
        when the phase began (an admission then sets ``step.joined``)."""
        while self.waiting and self._slots_taken() < self.cfg.max_num_seqs and step.budget_tokens > 0:
            req = self.waiting[0]
            if not self.policy.fits_empty_pool(req.view()):
                self.waiting.popleft()
                self._abort(req, "exceeds_pool", step, preempted=False)
                continue
            hit, shared = self._match(req)
            if whole and req.remaining_tokens - hit * self.block_size > self.cfg.max_num_batched_tokens:
                self.waiting.popleft()
                self._abort(req, "exceeds_token_budget", step, preempted=False)
                continue
            if whole and req.remaining_tokens - hit * self.block_size > step.budget_tokens:
                break
            first = self._pages(hit * self.block_size + min(req.remaining_tokens - hit * self.block_size,
                                                              step.budget_tokens))
            if self._slots_taken() and not (first <= self.pool.num_uncommitted_pages + shared
                                            if self.policy.reserves_first_chunk else self._can_admit(req, shared)):
                break
            self.waiting.popleft()
            req.admit(iteration=step.k, seq=self._next_seq(), start_s=step.start_s)
            step.joined = step.joined or beside
            if hit:
                self._take_hits(req, hit)
            self._reserve(req, first if self.policy.reserves_first_chunk else None)
            self.running.append(req)
            self._allocate(req, min(req.remaining_tokens, step.budget_tokens), step)

    def _preempt_until_fits(self, req: Request, chunk: int, step: _Step) -> bool:
        """Make room for ``req``'s chunk; False when ``req`` itself was preempted or aborted."""
        need = self._pages(req.computed_tokens + chunk)
        beyond = need - max(self.pool.reserved_pages(req.index), self.pool.used_pages(req.index))
        if beyond <= 0:
            return True
        if not self.policy.on_demand:
            self._preempt(req, step)
            return False
        while beyond > self.pool.num_uncommitted_pages:
            victim = self.running[self.policy.choose_victim(self._batch(self.running))]
            if victim is req and len(self.running) == 1:
                self.running.remove(req)
                self._abort(req, "kv_exceeds_pool", step, preempted=False)
                return False
            self._preempt(victim, step)
            if victim is req:
                return False
        self.pool.reserve(req.index, need)
        return True

    # ------------------------------------------------------------------ asking the policy
    def _can_admit(self, req: Request, shared_pages: int = 0) -> bool:
        running = None if self.policy.admits_on_own_pages else self._batch(self.running)
        free = self.pool.num_uncommitted_pages + shared_pages
        return bool(self.policy.can_admit(req.view(), free_pages=free, running=running))

    def _match(self, req: Request) -> tuple[int, int]:
        """``req``'s prefix-cache hit if admitted now: (blocks, of them pages others hold); (0, 0) without caching."""
        if not self.caching:
            return 0, 0
        return self.pool.match(req.index, (req.prompt_tokens + req.generated_tokens - 1) // self.block_size)

    def _take_hits(self, req: Request, blocks: int) -> None:
        self.pool.take_hits(req.index, blocks)
        req.computed_tokens = blocks * self.block_size
        req.saved_prefill_tokens += req.computed_tokens
        if req.num_preemptions == 0:
            req.prefix_hit_tokens = req.computed_tokens

    @staticmethod
    def _batch(reqs: list[Request]) -> Requests:
        """The policy's view of ``reqs`` (length-``len(reqs)`` NumPy arrays, in order)."""
        cols = np.array([(r.index, r.prompt_tokens, r.output_tokens, r.generated_tokens) for r in reqs],
                        dtype=np.int64).reshape(-1, 4).T
        return Requests(*cols, xp=np)

    # ------------------------------------------------------------------ state changes
    def _pages(self, tokens: int) -> int:
        """Pages holding ``tokens`` tokens (one Python int; ``pages_for`` without NumPy's per-call overhead)."""
        return ceil_div(tokens, self.block_size)

    def _next_seq(self) -> int:
        self.admit_count += 1
        return self.admit_count

    def _reserve(self, req: Request, pages: int | None = None) -> None:
        """Reserve ``pages`` for ``req`` (default: its policy's reservation)."""
        if pages is None:
            pages = self._pages(int(self.policy.reservation_tokens(req.view())))
        self.pool.reserve(req.index, pages)
        req.max_reserved_pages = max(req.max_reserved_pages, pages)

    def _allocate(self, req: Request, chunk: int, step: _Step) -> None:
        extra = self._pages(req.computed_tokens + chunk) - self.pool.used_pages(req.index)
        if extra > 0:
            self.pool.allocate([req.index], [extra])
        if self.caching:
            self.pool.cache_blocks(req.index, (req.computed_tokens + chunk) // self.block_size)
        used = self.pool.used_pages(req.index)
        req.max_used_pages = max(req.max_used_pages, used)
        req.max_reserved_pages = max(req.max_reserved_pages, self.pool.reserved_pages(req.index))
        step.schedule(req, chunk)

    def _preempt(self, victim: Request, step: _Step) -> None:
        step.unschedule(victim)
        self.running.remove(victim)
        step.num_preempted += 1
        mode = self.cfg.preemption_mode
        if mode == PreemptionMode.REJECT:
            self._abort(victim, "preempted_rejected", step, preempted=True)
            return
        kv_pages = self._pages(victim.computed_tokens)
        self.pool.release(victim.index)
        if mode == PreemptionMode.SWAP and kv_pages <= self.swap_cfg.cpu_pool_pages - self.cpu_pages_used:
            self.cpu_pages_used += kv_pages
            step.swap_pages += kv_pages
            victim.swap_out(kv_pages)
            self.swapped.appendleft(victim)
        else:
            victim.preempt_recompute()
            self.waiting.appendleft(victim)

    def _abort(self, req: Request, reason: str, step: _Step, *, preempted: bool) -> None:
        self.pool.release(req.index)
        req.abort(reason=reason, iteration=step.k, end_s=step.start_s, preempted=preempted)
        step.num_aborted += 1

    # ------------------------------------------------------------------ running an iteration
    def _check_progress(self, step: _Step) -> None:
        if not step.chunks and not step.num_aborted and (self.idle_before or not step.num_preempted):
            raise RuntimeError(
                f"iteration {step.k} at {step.start_s:.6f} s makes no progress: "
                f"running={self.running}, waiting={list(self.waiting)[:5]}, swapped={list(self.swapped)[:5]}, "
                f"free pages={self.pool.num_free_pages}, unpromised pages={self.pool.num_uncommitted_pages}")

    def _execute(self, step: _Step) -> None:
        num_tokens, duration_s = sum(step.chunks.values()), step.duration_s
        end_s = step.start_s + duration_s
        decode_tokens = sum(1 for r in step.chunks if r.is_decoding)
        pages_used, pages_reserved = self.pool.num_used_pages, self.pool.num_committed_pages
        cache_cols = ((self.pool.num_cached_free_pages, self.pool.num_shared_saved_pages) if self.caching else ())
        for req, chunk in step.chunks.items():
            if req.compute(chunk, iteration=step.k, end_s=end_s):
                self.running.remove(req)
                if self.cfg.async_scheduling:
                    self.finishing.append(req)
                else:
                    self.pool.release(req.index)
        self.rows.append((step.k, step.start_s, duration_s, len(step.chunks), num_tokens - decode_tokens,
                          decode_tokens, len(self.running), len(self.waiting), len(self.swapped),
                          step.num_preempted, pages_used, pages_reserved, self.pool.num_pages - pages_reserved,
                          self.cpu_pages_used, step.swap_pages, *cache_cols))
        self.idle_before = not step.chunks and not step.num_aborted
        self.prev_start_s = step.start_s if self.cfg.async_scheduling else None
        self.now_s = end_s
        self.k += 1
