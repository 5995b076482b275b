"""vLLM: admit on the prompt's pages, allocate decode pages on demand, preempt the newest."""
from __future__ import annotations

from typing import Any

from .. import _validate as v
from .base import Policy, Requests, register


@register
class VLLMPolicy(Policy):
    """vLLM's on-demand paging (Kwon et al., SOSP 2023; ``vllm/v1/core/sched/scheduler.py``).

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
