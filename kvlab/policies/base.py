"""What every admission/reservation policy provides, and the registry that names them.

A policy answers three questions for the scheduler (``kvlab.sim``), in integers only:

* how many tokens' worth of pages to reserve for a request when it is (re)admitted
  (:meth:`Policy.reservation_tokens`);
* whether it may be admitted now, given the pages nobody holds or was promised
  (:meth:`Policy.can_admit`);
* when a running request needs a page beyond its reservation: grow from the unpromised pages
  and preempt others to make room (``on_demand = True``), or preempt the request itself
  (``on_demand = False``); and which running request is the victim (:meth:`Policy.choose_victim`).

A policy may also order the waiting queue (:attr:`Policy.orders_queue`, :meth:`Policy.queue_rank`);
by default it is FCFS.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Callable, ClassVar, Protocol, Sequence, TypeVar

import numpy as np

from ..reservation import pages_for


class PolicyName(str, enum.Enum):
    """The policies kvlab models (values are the names accepted by ``create_policy``)."""

    RESERVE_MAX = "reserve_max"
    ORCA_ORACLE = "orca_oracle"
    ORCA_POW2 = "orca_pow2"
    ORCA_MAX = "orca_max"
    TGI = "tgi"
    VLLM = "vllm"
    SGLANG = "sglang"
    PREDICTED = "predicted"


class RequestView(Protocol):
    """What a policy may read of a request (tokens)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    generated_tokens: int


class Policy(ABC):
    """An admission and reservation rule. One instance serves one simulation (it may hold state).

    Subclasses set ``name`` and ``on_demand`` and implement :meth:`reservation_tokens`.
    """

    name: ClassVar[PolicyName]
    on_demand: ClassVar[bool] = False

    def __init__(self) -> None:
        self.max_new_tokens = 0
        self.block_size = 1
        self.num_pages = 0

    def bind(self, *, output_tokens: np.ndarray, max_new_tokens: int, block_size: int, num_pages: int,
             seed: int) -> None:
        """Called once before a run with the run's workload and pool (tokens, pages)."""
        self.max_new_tokens, self.block_size, self.num_pages = max_new_tokens, block_size, num_pages

    @abstractmethod
    def reservation_tokens(self, req: RequestView) -> int:
        """Tokens of KV to reserve when ``req`` is (re)admitted, prompt and generated included.

        Must be at least ``prompt_tokens + generated_tokens`` (the context it must hold).
        """

    def can_admit(self, req: RequestView, *, free_pages: int, running: Sequence[RequestView]) -> bool:
        """Whether ``req`` may be admitted with ``free_pages`` pages neither held nor promised."""
        return int(pages_for(self.reservation_tokens(req), self.block_size)) <= free_pages

    def fits_empty_pool(self, req: RequestView) -> bool:
        """Whether ``req`` could ever run: admissible into an empty pool. Otherwise it is rejected."""
        return self.can_admit(req, free_pages=self.num_pages, running=())

    def choose_victim(self, running: Sequence[RequestView]) -> RequestView:
        """The running request to preempt (``running`` is in admission order): the most recent."""
        return running[-1]

    def end_schedule(self, *, num_preempted: int, running: Sequence[RequestView]) -> None:
        """Called once per iteration after scheduling, with the requests still running."""

    @property
    def orders_queue(self) -> bool:
        """Whether the waiting queue is kept sorted by :meth:`queue_rank` (otherwise FCFS)."""
        return False

    def queue_rank(self, req: RequestView) -> int:
        """Position of ``req`` in an ordered waiting queue: a distinct integer per request, lowest first."""
        return req.index


P = TypeVar("P", bound=type[Policy])
_REGISTRY: dict[PolicyName, type[Policy]] = {}


def register(cls: P) -> P:
    """Class decorator: register a policy under ``cls.name``; a duplicate raises ``ValueError``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"policy {cls.name.value!r} is already registered "
                         f"(by {_REGISTRY[cls.name].__name__})")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    """Names of the registered policies."""
    return [name.value for name in PolicyName if name in _REGISTRY]


def create_policy(name: str | PolicyName, **params: object) -> Policy:
    """A new instance of the policy called ``name`` with its parameters.

    Raises ``ValueError`` for an unknown name (listing the known ones) or a bad parameter.
    """
    try:
        key = PolicyName(name)
    except ValueError:
        key = None
    if key not in _REGISTRY:
        raise ValueError(f"policy {name!r} is unknown: expected one of {', '.join(policy_names())}")
    try:
        return _REGISTRY[key](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for policy {key.value!r}: {exc}") from None
