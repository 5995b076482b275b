"""A request's life in the simulator: its status and one method per change of status."""
from __future__ import annotations

import enum
import math

from ..policies import Requests


class RequestStatus(enum.IntEnum):
    """Where a request is. Every finished status is greater than ``SWAPPED`` (pinned by a test)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    SWAPPED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6

    def is_finished(self) -> bool:
        """True for the three finished statuses."""
        return self > RequestStatus.SWAPPED


FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """One request in the reference engine (token counts in tokens, pages in pages).

    ``computed_tokens`` is the context whose KV is cached. The request's next output token is
    produced by the iteration in which ``computed_tokens`` reaches
    ``prompt_tokens + generated_tokens``: a prefill (or a recompute of prompt + generated tokens
    after a preemption) produces a token when it completes, a decode computes one token (the
    last output) and produces the next.
    """

    def __init__(self, *, index: int, prompt_tokens: int, output_tokens: int, arrival_s: float,
                 max_new_tokens: int) -> None:
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s
        self.target_tokens = min(output_tokens, max_new_tokens)
        self.status = RequestStatus.WAITING
        self.computed_tokens = 0
        self.generated_tokens = 0
        self.cpu_pages = 0
        self.admit_seq = -1
        self.admitted_iter = -1
        self.first_token_iter = -1
        self.finish_iter = -1
        self.num_preemptions = 0
        self.num_swaps = 0
        self.max_reserved_pages = 0
        self.max_used_pages = 0
        self.prefix_hit_tokens = 0  # prefix-cache hit at its first admission (tokens)
        self.saved_prefill_tokens = 0  # prefix-cache hits of all its admissions (tokens not computed)
        self.abort_reason = ""
        self.first_token_s = math.nan
        self.last_token_s = math.nan
        self.max_tbt_s = math.nan
        self.finish_s = math.nan
        self.admitted_s = math.nan

    def __repr__(self) -> str:
        return (f"Request({self.index}, {self.status.name}, prompt={self.prompt_tokens}, "
                f"generated={self.generated_tokens}/{self.target_tokens}, computed={self.computed_tokens})")

    def view(self) -> Requests:
        """What a policy reads of this request (its Python ints)."""
        return Requests.one(self.index, self.prompt_tokens, self.output_tokens, self.generated_tokens)

    @property
    def remaining_tokens(self) -> int:
        """Tokens to compute before the next output token (tokens)."""
        return self.prompt_tokens + self.generated_tokens - self.computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Has produced a token and has its whole context cached: its next step is one decode."""
        return self.generated_tokens > 0 and self.remaining_tokens == 1

    # ------------------------------------------------------------------ transitions
    def admit(self, *, iteration: int, seq: int, start_s: float) -> None:
        """WAITING or PREEMPTED -> RUNNING."""
        assert self.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), self
        self._start_running(iteration=iteration, seq=seq, start_s=start_s)

    def swap_in(self, *, iteration: int, seq: int, start_s: float) -> None:
        """SWAPPED -> RUNNING (its KV comes back from the CPU pool)."""
        assert self.status == RequestStatus.SWAPPED, self
        self.cpu_pages = 0
        self._start_running(iteration=iteration, seq=seq, start_s=start_s)

    def _start_running(self, *, iteration: int, seq: int, start_s: float) -> None:
        self.status = RequestStatus.RUNNING
        self.admit_seq = seq
        if self.admitted_iter < 0:
            self.admitted_iter, self.admitted_s = iteration, start_s

    def preempt_recompute(self) -> None:
        """RUNNING -> PREEMPTED: its KV is dropped and will be computed again."""
        assert self.status == RequestStatus.RUNNING, self
        self.status = RequestStatus.PREEMPTED
        self.computed_tokens = 0
        self.num_preemptions += 1

    def swap_out(self, cpu_pages: int) -> None:
        """RUNNING -> SWAPPED: its KV (``cpu_pages`` pages) is copied to the CPU pool."""
        assert self.status == RequestStatus.RUNNING, self
        self.status = RequestStatus.SWAPPED
        self.cpu_pages = cpu_pages
        self.num_preemptions += 1
        self.num_swaps += 1

    def abort(self, *, reason: str, iteration: int, end_s: float, preempted: bool) -> None:
        """Any unfinished status -> FINISHED_ABORTED, with a reason."""
        assert not self.status.is_finished(), self
        self.status = RequestStatus.FINISHED_ABORTED
        self.abort_reason = reason
        self.num_preemptions += int(preempted)
        self.finish_iter, self.finish_s = iteration, end_s

    def compute(self, chunk_tokens: int, *, iteration: int, end_s: float) -> bool:
        """Cache ``chunk_tokens`` more tokens in iteration ``iteration``; True if it finished.

        RUNNING -> FINISHED_STOPPED or FINISHED_LENGTH_CAPPED when the last token is produced.
        """
        assert self.status == RequestStatus.RUNNING and 0 < chunk_tokens <= self.remaining_tokens, self
        self.computed_tokens += chunk_tokens
        if self.remaining_tokens:
            return False
        self.generated_tokens += 1
        if self.generated_tokens == 1:
            self.first_token_iter, self.first_token_s = iteration, end_s
        else:
            gap_s = end_s - self.last_token_s
            self.max_tbt_s = gap_s if math.isnan(self.max_tbt_s) else max(self.max_tbt_s, gap_s)
        self.last_token_s = end_s
        if self.generated_tokens < self.target_tokens:
            return False
        capped = self.output_tokens > self.target_tokens
        self.status = RequestStatus.FINISHED_LENGTH_CAPPED if capped else RequestStatus.FINISHED_STOPPED
        self.finish_iter, self.finish_s = iteration, end_s
        return True
