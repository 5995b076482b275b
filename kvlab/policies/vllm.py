"""vLLM: admit on the prompt's pages (V0) or the first chunk's (V1), allocate on demand, preempt the newest."""
from __future__ import annotations

from typing import Any

from .. import _validate as v
from .base import Policy, Requests, register


@register
class VLLMPolicy(Policy):
    """vLLM V0's on-demand paging (Kwon et al., SOSP 2023; V0's ``BlockSpaceManager``).

    A request is admitted when the pages for its context (prompt, plus generated tokens after a
    preemption) leave at least a watermark of the pool free (v0 ``BlockSpaceManager``:
    ``free - required >= int(watermark x num_blocks)``). Decode pages are allocated on demand;
    when one cannot be, the most recently admitted running request is preempted
    (``self.running.pop()``) until it can. The scheduler admits no new request in an iteration
    that preempted (the same rule applies to every policy in ``kvlab.sim``).

    Parameters
    ----------
    watermark_frac : float
        Share of the pool kept free at admission, in [0, 1); default 0.01 (v0's 1%).
    """

    name = "vllm"
    on_demand = True

    def __init__(self, *, watermark_frac: float = 0.01) -> None:
        super().__init__()
        self.watermark_frac = v.fraction(watermark_frac, "watermark_frac", low_open=False, high_closed=False)

    @property
    def watermark_pages(self) -> int:
        """Pages admission must leave free: ``int(watermark_frac x num_pages)``."""
        return int(self.watermark_frac * self.num_pages)

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + reqs.generated_tokens

    def admission_headroom_pages(self, reqs: Requests) -> Any:
        return self.watermark_pages


@register
class VLLMV1Policy(Policy):
    """vLLM V1's on-demand paging, as 0.19.0 runs it (wheel, commit 2a69949).

    A waiting request is admitted when the blocks of its first scheduled chunk fit the free
    blocks: ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``) takes ``min(remaining,
    token budget)`` tokens past its prefix-cache hit and ``KVCacheManager.allocate_slots``
    (``vllm/v1/core/kv_cache_manager.py``) returns None only when ``num_blocks_to_allocate`` exceeds
    ``get_num_free_blocks()``: no watermark, and no block beyond that chunk is set aside
    (:attr:`~kvlab.policies.Policy.reserves_first_chunk`). Later chunks and decode blocks are
    allocated on demand, preempting the most recently admitted running request
    (``self.running.pop()``) until they fit; an iteration that preempted admits no one.
    """

    name = "vllm_v1"
    on_demand = True
    reserves_first_chunk = True

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + reqs.generated_tokens
