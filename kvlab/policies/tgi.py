"""Hugging Face Text Generation Inference: capped reservation and re-queueing."""
from __future__ import annotations

from typing import Any

from .. import _validate as v
from .base import Policy, Requests, register


@register
class TGIPolicy(Policy):
    """Reserve prompt + min(max_new_tokens, cap) at admission; requeue a request that outgrows it.

    TGI's router (``backends/v3/src/queue.rs``) reserves a request's prompt plus its
    ``max_new_tokens`` with the reserved output capped (1,024 tokens in recent versions). A
    request that needs a page beyond its reservation is preempted itself (``on_demand`` is
    false): it goes back to the front of the queue and, under recompute, is prefilled again
    over prompt + generated tokens, reserving the next ``cap`` tokens when readmitted.

    Parameters
    ----------
    cap_tokens : int
        Largest output reservation (tokens), default 1024.
    """

    name = "tgi"

    def __init__(self, *, cap_tokens: int = 1024) -> None:
        super().__init__()
        self.cap_tokens = v.positive_int(cap_tokens, "cap_tokens")

    def reservation_tokens(self, reqs: Requests) -> Any:
        g = reqs.generated_tokens
        return reqs.prompt_tokens + g + reqs.xp.minimum(self.max_new_tokens - g, self.cap_tokens)
