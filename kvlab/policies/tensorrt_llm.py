"""TensorRT-LLM's default capacity policy, ``GUARANTEED_NO_EVICT``."""
from __future__ import annotations

from typing import Any

from .base import Policy, Requests, register


@register
class ReserveMaxPolicy(Policy):
    """Reserve prompt + ``max_new_tokens`` at admission; never evict.

    TensorRT-LLM's ``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT`` admits a request only when the
    free blocks cover every running request's blocks to completion plus the new request's
    ``ceil((prompt + max_new_tokens) / block_size)``. Here each running request's reservation
    to completion stays promised in the pool, so the check is the new request's pages against
    the unpromised pages. A request never needs a page beyond its reservation, so it never
    preempts.
    """

    name = "reserve_max"

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + self.max_new_tokens
