"""The Orca baselines of the vLLM paper (Kwon et al., SOSP 2023, section 6.1).

Orca reserves a contiguous slot per request at admission. The vLLM paper evaluates three
versions by how much it reserves: Orca (Oracle) the true sequence length, Orca (Pow2) the next
power of two of it (at most 2x over-reservation), Orca (Max) the maximum sequence length. None
of them ever needs more than it reserved, so they never preempt.
"""
from __future__ import annotations

from typing import Any

from .. import _validate as v
from .base import Policy, Requests, register


def _final_tokens(policy: Policy, reqs: Requests) -> Any:
    """Prompt + the tokens each request will really generate (capped by max_new_tokens)."""
    return reqs.prompt_tokens + reqs.xp.minimum(reqs.output_tokens, policy.max_new_tokens)


def next_power_of_two(x: Any) -> Any:
    """The smallest power of two >= ``x`` (ints >= 1, below 2**62), exactly, on ints or int64 arrays.

    ``x - 1`` with every bit below its highest set bit switched on, plus one (operators only).
    """
    y = x - 1
    for shift in (1, 2, 4, 8, 16, 32):
        y = y | (y >> shift)
    return y + 1


@register
class OrcaOraclePolicy(Policy):
    """Orca (Oracle): reserve exactly the true final length, prompt + min(output, max_new_tokens)."""

    name = "orca_oracle"

    def reservation_tokens(self, reqs: Requests) -> Any:
        return _final_tokens(self, reqs)


@register
class OrcaPow2Policy(Policy):
    """Orca (Pow2): reserve the next power of two of the true final length.

    Capped at prompt + max_new_tokens (the most the request could ever hold).
    """

    name = "orca_pow2"

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.xp.minimum(next_power_of_two(_final_tokens(self, reqs)), reqs.prompt_tokens + self.max_new_tokens)


@register
class OrcaMaxPolicy(Policy):
    """Orca (Max): reserve the maximum sequence length, ``max_model_len`` tokens in total.

    The maximum bounds prompt + output together (the vLLM paper's 2,048 tokens for OPT; its
    benchmark drops requests with prompt + output beyond it), so the reservation is
    ``max_model_len`` whatever the prompt, not prompt + ``max_new_tokens``.

    Parameters
    ----------
    max_model_len : int
        Maximum sequence length (tokens, prompt + output); the vLLM paper's Orca (Max) used 2048.
        A request whose prompt + generated length exceeds it lies outside that set-up; it reserves
        its own final length (prompt + min(output, max_new_tokens)) so that it can finish.
    """

    name = "orca_max"

    def __init__(self, *, max_model_len: int = 2048) -> None:
        super().__init__()
        self.max_model_len = v.positive_int(max_model_len, "max_model_len")

    def reservation_tokens(self, reqs: Requests) -> Any:
        return reqs.xp.maximum(self.max_model_len, _final_tokens(self, reqs))
