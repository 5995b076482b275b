"""What the compiled loop and its Python side share: request status codes and the livelock error."""
from __future__ import annotations

from typing import Any

from ..request import RequestStatus

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
