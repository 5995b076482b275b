"""SGLang: admit against an estimate of future decode tokens (``new_token_ratio``), retract on OOM."""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from .. import _validate as v
from ..reservation import pages_for
from .base import Policy, PolicyName, RequestView, register


@register
class SGLangPolicy(Policy):
    """SGLang's ``PrefillAdder`` admission and decode retraction (``sglang/srt/managers``).

    Each running request is charged ``min(max_new_tokens - generated, clip_tokens) x ratio``
    future tokens; a new request is admitted when its context plus its own charge plus the
    running requests' charges fit in the unpromised pages (counted in tokens). The ratio starts
    at ``init_ratio``, falls linearly by ``init_ratio x (1 - min_ratio_factor) / decay_steps``
    per iteration to ``init_ratio x min_ratio_factor``; when decoding runs out of pages,
    requests are retracted (preempted, the most recently admitted first here; SGLang retracts
    the one with the fewest decoded tokens) and the ratio is raised to
    ``min(1, (tokens decoded by the remaining requests + retract_steps x their number) /
    their total max_new_tokens)`` as in ``ScheduleBatch.retract_decode``. Decode pages are
    allocated on demand.

    The ratio is an exact fraction, so admission never depends on floating-point rounding.

    Parameters
    ----------
    init_ratio : float
        Starting new_token_ratio, in (0, 1]; default 0.7.
    min_ratio_factor : float
        Floor as a share of ``init_ratio``, in (0, 1]; default 0.14.
    decay_steps : int
        Iterations to decay from the start to the floor; default 600.
    clip_tokens : int
        Cap on a request's estimated remaining tokens; default 4096.
    retract_steps : int
        Decode steps credited per remaining request when the ratio is raised; default 20.
    """

    name = PolicyName.SGLANG
    on_demand = True

    def __init__(self, *, init_ratio: float = 0.7, min_ratio_factor: float = 0.14, decay_steps: int = 600,
                 clip_tokens: int = 4096, retract_steps: int = 20) -> None:
        super().__init__()
        self.init_ratio = Fraction(str(v.fraction(init_ratio, "init_ratio")))
        self.min_ratio = self.init_ratio * Fraction(str(v.fraction(min_ratio_factor, "min_ratio_factor")))
        self.decay_per_step = (self.init_ratio - self.min_ratio) / v.positive_int(decay_steps, "decay_steps")
        self.clip_tokens = v.positive_int(clip_tokens, "clip_tokens")
        self.retract_steps = v.nonnegative_int(retract_steps, "retract_steps")
        self.ratio = self.init_ratio

    def reservation_tokens(self, req: RequestView) -> int:
        return req.prompt_tokens + req.generated_tokens

    def _remaining(self, req: RequestView) -> int:
        return min(self.max_new_tokens - req.generated_tokens, self.clip_tokens)

    def can_admit(self, req: RequestView, *, free_pages: int, running: Sequence[RequestView]) -> bool:
        future = self._remaining(req) + sum(self._remaining(r) for r in running)
        charge = -(-future * self.ratio.numerator // self.ratio.denominator)  # ceil, exact
        return self.reservation_tokens(req) + charge <= free_pages * self.block_size

    def fits_empty_pool(self, req: RequestView) -> bool:
        """The context alone must fit: the estimate of future tokens only delays admission."""
        return int(pages_for(self.reservation_tokens(req), self.block_size)) <= self.num_pages

    def end_schedule(self, *, num_preempted: int, running: Sequence[RequestView]) -> None:
        if num_preempted and running:
            decoded = sum(r.generated_tokens for r in running)
            raised = Fraction(decoded + self.retract_steps * len(running), self.max_new_tokens * len(running))
            self.ratio = min(Fraction(1), raised)
        else:
            self.ratio = max(self.min_ratio, self.ratio - self.decay_per_step)
