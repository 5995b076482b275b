"""SGLang: admit against an estimate of future decode tokens (``new_token_ratio``), retract on OOM."""
from __future__ import annotations

from fractions import Fraction
from typing import Any

from .. import _validate as v
from .._intmath import ceil_div
from .base import CompiledForm, Policy, Requests, register


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

    The ratio is an exact fraction, so admission never depends on floating-point rounding. A
    request could ever run when its context alone fits the pool (the estimate of future tokens
    only delays admission).

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

    name = "sglang"
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

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.prompt_tokens + reqs.generated_tokens

    def _remaining(self, reqs: Requests) -> Any:
        """Each request's estimated future tokens before the ratio (tokens)."""
        return reqs.xp.minimum(self.max_new_tokens - reqs.generated_tokens, self.clip_tokens)

    def can_admit(self, reqs: Requests, *, free_pages: Any, running: Requests | None) -> Any:
        future = self._remaining(reqs)
        if running is not None and running.size:
            future = future + int(running.xp.sum(self._remaining(running)))
        charge = ceil_div(future * self.ratio.numerator, self.ratio.denominator)  # exact
        return self.reservation_tokens(reqs) + charge <= free_pages * self.block_size

    def end_schedule(self, *, num_preempted: int, running: Requests, num_iterations: int = 1) -> None:
        if num_preempted and running.size:
            decoded = int(running.xp.sum(running.generated_tokens))
            raised = Fraction(decoded + self.retract_steps * running.size, self.max_new_tokens * running.size)
            self.ratio = min(Fraction(1), raised)
        else:
            self.ratio = max(self.min_ratio, self.ratio - num_iterations * self.decay_per_step)

    def compiled_form(self) -> CompiledForm:
        own = type(self).can_admit is SGLangPolicy.can_admit and type(self).end_schedule is SGLangPolicy.end_schedule
        if not own:  # a subclass with its own rules is asked
            return super().compiled_form()
        return CompiledForm(admission="future_charge", end_schedule="ratio_decay", constants=(
            self.clip_tokens, self.min_ratio.numerator, self.min_ratio.denominator, self.decay_per_step.numerator,
            self.decay_per_step.denominator))

    def compiled_state(self) -> tuple[int, int]:
        return self.ratio.numerator, self.ratio.denominator

    def load_compiled_state(self, state: tuple[int, int]) -> None:
        self.ratio = Fraction(int(state[0]), int(state[1]))
