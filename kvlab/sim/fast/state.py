"""What the fast engine's parts share: request status codes, page arithmetic, and the policy asked on arrays."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...backend import to_numpy
from ...policies import Policy, Requests
from ..request import RequestStatus

if TYPE_CHECKING:
    from .engine import FastEngine

WAITING, RUNNING, PREEMPTED, SWAPPED = (int(s) for s in (RequestStatus.WAITING, RequestStatus.RUNNING,
                                                         RequestStatus.PREEMPTED, RequestStatus.SWAPPED))
STOPPED, CAPPED, ABORTED = (int(s) for s in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
                                             RequestStatus.FINISHED_ABORTED))
ABORT_REASONS = ("", "exceeds_pool", "exceeds_token_budget", "kv_exceeds_pool", "preempted_rejected")


def no_progress(k: int, start_s: float, *, running: Any, waiting: int, swapped: int, free_pages: int,
                unpromised_pages: int) -> RuntimeError:
    """The reference engine's livelock error (its text up to the colon), with the fast engine's state."""
    return RuntimeError(f"iteration {k} at {start_s:.6f} s makes no progress: running={running[:5]}, "
                        f"waiting={waiting}, swapped={swapped}, free pages={free_pages}, "
                        f"unpromised pages={unpromised_pages}")


class Rules:
    """The policy's rules asked about the engine's requests by id (arrays of ids on ``xp``).

    Nothing here knows a policy: each call gathers the requests' columns into a
    :class:`kvlab.policies.Requests` and calls the policy's rule; the engine reads the policy's
    traits (``on_demand``, ``admits_on_own_pages``, ``keeps_state``, ``orders_queue``) from here.

    Attributes
    ----------
    monotone : bool
        A "no" from admission stays "no" while the unpromised pages only shrink and the running
        requests only decode: admission depends on the request's own pages and no state.
    """

    def __init__(self, policy: Policy, eng: FastEngine) -> None:
        self.policy, self.eng = policy, eng
        self.on_demand = bool(policy.on_demand)
        self.own_pages = bool(policy.admits_on_own_pages)
        self.keeps_state = bool(policy.keeps_state)
        self.monotone = self.own_pages and not self.keeps_state
        self.ordered = bool(policy.orders_queue)

    def requests(self, ids: Any) -> Requests:
        """The policy's view of requests ``ids`` (array of ids on ``xp``)."""
        e = self.eng
        return Requests(ids, e.prompt[ids], e.output[ids], e.gen[ids], e.xp)

    def reservation_tokens(self, ids: Any) -> Any:
        """Tokens each of ``ids`` reserves on (re)admission (array of int)."""
        return self.policy.reservation_tokens(self.requests(ids))

    def admission_pages(self, ids: Any) -> Any:
        """Unpromised pages each of ``ids`` needs to be admitted on its own (array of int)."""
        return self.policy.admission_pages(self.requests(ids))

    def fits_empty_pool(self, ids: Any) -> Any:
        """Whether each of ``ids`` could ever be admitted (bool array)."""
        return self.policy.fits_empty_pool(self.requests(ids))

    def can_admit(self, ids: Any, free_pages: Any) -> Any:
        """Whether each of ``ids`` may be admitted alone with ``free_pages`` unpromised pages (bool array).

        For a policy that ``admits_on_own_pages``, ``free_pages`` may be an array (one per id).
        """
        running = None if self.own_pages else self.requests(self.eng.run_ids)
        return self.policy.can_admit(self.requests(ids), free_pages=free_pages, running=running)

    def can_admit_one(self, r: int, free_pages: int) -> bool:
        """Whether request ``r`` may be admitted with ``free_pages`` unpromised pages."""
        return bool(self.can_admit(self.eng.xp.asarray([r]), free_pages)[0])

    def choose_victim(self, running: list[int]) -> int:
        """The request to preempt among ``running`` (ids, admission order)."""
        return running[int(self.policy.choose_victim(self.requests(self.eng.xp.asarray(running))))]

    def end_schedule(self, num_preempted: int, num_iterations: int = 1) -> None:
        """The policy's per-iteration update after ``num_iterations`` iterations (several: no preemption)."""
        if self.keeps_state:
            self.policy.end_schedule(num_preempted=num_preempted, running=self.requests(self.eng.run_ids),
                                     num_iterations=num_iterations)

    def queue_ranks(self, ids: Any) -> list[int]:
        """Ranks of requests ``ids`` in an ordered waiting queue (host ints)."""
        return to_numpy(self.eng.xp.asarray(self.policy.queue_rank(self.requests(ids)))).tolist()
