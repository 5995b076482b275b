"""What the fast engine's parts share: request status codes, page arithmetic, and a policy's rules on arrays."""
from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ...backend import to_numpy
from ...policies import Policy
from ...policies.orca import OrcaMaxPolicy, OrcaOraclePolicy, OrcaPow2Policy
from ...policies.predicted import PredictedPolicy
from ...policies.sglang import SGLangPolicy
from ...policies.tensorrt_llm import ReserveMaxPolicy
from ...policies.tgi import TGIPolicy
from ...policies.vllm import VLLMPolicy
from ..request import RequestStatus

if TYPE_CHECKING:
    from .engine import FastEngine

WAITING, RUNNING, PREEMPTED, SWAPPED = (int(s) for s in (RequestStatus.WAITING, RequestStatus.RUNNING,
                                                         RequestStatus.PREEMPTED, RequestStatus.SWAPPED))
STOPPED, CAPPED, ABORTED = (int(s) for s in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
                                             RequestStatus.FINISHED_ABORTED))
ABORT_REASONS = ("", "exceeds_pool", "exceeds_token_budget", "kv_exceeds_pool", "preempted_rejected")
# Policies whose ``can_admit`` stays false while the unpromised pages only shrink and the running set
# only decodes: a blocked queue head stays blocked through a decode-only stretch.
MONOTONE = (ReserveMaxPolicy, OrcaOraclePolicy, OrcaPow2Policy, OrcaMaxPolicy, TGIPolicy, VLLMPolicy,
            PredictedPolicy)


def pages_of(tokens: Any, block_size: int) -> Any:
    """``ceil(tokens / block_size)`` on any array module or Python int (pages).

    ``kvlab.reservation.pages_for`` converts to NumPy, which would move CuPy arrays to the host.
    """
    return -(-tokens // block_size)


class View:
    """The :class:`kvlab.policies.RequestView` of one request, for policy methods called per request."""

    __slots__ = ("index", "prompt_tokens", "output_tokens", "generated_tokens")

    def __init__(self, index: int, prompt_tokens: int, output_tokens: int, generated_tokens: int) -> None:
        self.index, self.prompt_tokens = index, prompt_tokens
        self.output_tokens, self.generated_tokens = output_tokens, generated_tokens


class Rules:
    """A policy's answers on arrays: the built-in policies' rules written as array expressions.

    A policy class kvlab does not know is asked request by request through :class:`View`s,
    which gives the same answers, slower.
    """

    def __init__(self, policy: Policy, eng: "FastEngine") -> None:
        self.policy, self.eng = policy, eng
        self.kind = type(policy) if type(policy) in MONOTONE + (SGLangPolicy,) else None
        self.monotone = self.kind in MONOTONE
        self.on_demand = bool(policy.on_demand)
        self.bs, self.num_pages, self.mnt = policy.block_size, policy.num_pages, policy.max_new_tokens
        self.custom_victim = type(policy).choose_victim is not Policy.choose_victim
        self.ordered = bool(policy.orders_queue)
        if self.kind is PredictedPolicy:
            self.predicted = eng.xp.asarray(policy.predicted_tokens)

    def view(self, r: int) -> View:
        e = self.eng
        return View(r, int(e.prompt[r]), int(e.output[r]), int(e.gen[r]))

    # ----------------------------------------------------------------- reservation (tokens)
    def reservation_tokens(self, ids: Any) -> Any:
        """Tokens each of ``ids`` reserves on (re)admission (array of int)."""
        e, xp, k = self.eng, self.eng.xp, self.kind
        p, g = e.prompt[ids], e.gen[ids]
        if k in (VLLMPolicy, SGLangPolicy):
            return p + g
        if k is ReserveMaxPolicy:
            return p + self.mnt
        if k is OrcaOraclePolicy:
            return p + xp.minimum(e.output[ids], self.mnt)
        if k is OrcaPow2Policy:
            final = p + xp.minimum(e.output[ids], self.mnt)
            # 1 << (final - 1).bit_length(): frexp's exponent is the bit length (exact below 2**53)
            bits = xp.where(final > 1, xp.frexp((final - 1).astype(xp.float64))[1], 0).astype(xp.int64)
            return xp.minimum(xp.left_shift(xp.int64(1), bits), p + self.mnt)
        if k is OrcaMaxPolicy:
            return xp.maximum(self.policy.max_model_len, p + xp.minimum(e.output[ids], self.mnt))
        if k is TGIPolicy:
            return p + g + xp.minimum(self.mnt - g, self.policy.cap_tokens)
        if k is PredictedPolicy:
            return p + xp.maximum(self.predicted[ids], g)
        ids_h = to_numpy(ids).tolist()
        return xp.asarray([self.policy.reservation_tokens(self.view(r)) for r in ids_h], dtype=xp.int64)

    def can_admit_vec(self, res_pages: Any, free_pages: Any) -> Any:
        """``can_admit`` for policies whose answer depends only on the request's pages (bool array)."""
        if self.kind is VLLMPolicy:
            return free_pages - res_pages >= self.policy.watermark_pages
        return res_pages <= free_pages

    def fits_empty_pool(self, ids: Any, res_pages: Any) -> Any:
        """``fits_empty_pool`` of each of ``ids`` (bool array)."""
        if self.kind is SGLangPolicy:
            return res_pages <= self.num_pages
        if self.kind is not None:
            return self.can_admit_vec(res_pages, self.num_pages)
        ids_h = to_numpy(ids).tolist()
        return self.eng.xp.asarray([self.policy.fits_empty_pool(self.view(r)) for r in ids_h], dtype=bool)

    def can_admit_one(self, r: int, free_pages: int) -> bool:
        """``policy.can_admit(r, free_pages, running)`` against the engine's running set."""
        e = self.eng
        if self.kind is SGLangPolicy:
            pol, xp = self.policy, e.xp
            def remaining(g: Any) -> Any:
                return xp.minimum(self.mnt - g, pol.clip_tokens)
            future = int(remaining(e.gen[r])) + int(remaining(e.gen[e.run_ids]).sum())
            charge = -(-future * pol.ratio.numerator // pol.ratio.denominator)
            return int(e.prompt[r] + e.gen[r]) + charge <= free_pages * self.bs
        if self.kind is not None:
            res = int(pages_of(self.reservation_tokens(e.xp.asarray([r]))[0], self.bs))
            return bool(self.can_admit_vec(res, free_pages))
        running = [self.view(x) for x in to_numpy(e.run_ids).tolist()]
        return bool(self.policy.can_admit(self.view(r), free_pages=free_pages, running=running))

    def choose_victim(self, running: list[int]) -> int:
        """``policy.choose_victim`` over the running ids (admission order)."""
        if not self.custom_victim:
            return running[-1]
        views = [self.view(x) for x in running]
        chosen = self.policy.choose_victim(views)
        return next(r for r, view in zip(running, views) if view is chosen)

    def end_schedule(self, num_preempted: int, num_iterations: int = 1) -> None:
        """``policy.end_schedule`` after each of ``num_iterations`` iterations (several: no preemption)."""
        e, pol = self.eng, self.policy
        if self.kind is SGLangPolicy:
            n = int(e.run_ids.shape[0])
            if num_preempted and n:
                decoded = int(e.gen[e.run_ids].sum())
                pol.ratio = min(Fraction(1), Fraction(decoded + pol.retract_steps * n, pol.max_new_tokens * n))
            else:
                pol.ratio = max(pol.min_ratio, pol.ratio - num_iterations * pol.decay_per_step)
        elif self.kind is None:
            running = [self.view(x) for x in to_numpy(e.run_ids).tolist()]
            for _ in range(num_iterations):
                pol.end_schedule(num_preempted=num_preempted, running=running)

    def queue_rank(self, r: int) -> int:
        if self.kind is PredictedPolicy:
            return int(self.policy.ranks[r])
        return int(self.policy.queue_rank(self.view(r)))
