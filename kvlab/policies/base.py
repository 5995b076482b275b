"""What every admission/reservation policy provides, and the registry that names them.

A policy states its rules once, over arrays of requests (:class:`Requests`: parallel integer
arrays on one array module, or one request's Python ints), the way a ``scipy.stats``
distribution defines ``_cdf`` once. The engines (``kvlab.sim``) call the same rules: the fast
engine on arrays of many requests, the reference engine on one request at a time. The rules:

* :meth:`Policy.reservation_tokens` (required): tokens of KV to reserve for each request when
  it is (re)admitted;
* :meth:`Policy.admission_headroom_pages`: pages admission must leave free beyond the
  reservation (vLLM's watermark); default none. With the reservation it makes
  :meth:`Policy.admission_pages`, what a request needs free to be admitted on its own, and
  :meth:`Policy.fits_empty_pool`, whether it could ever be admitted;
* :meth:`Policy.can_admit`: whether each request may be admitted given the unpromised pages and
  the running requests; by default its admission pages fit the unpromised pages;
* :attr:`Policy.on_demand`: when a running request needs a page beyond its reservation, grow
  from the unpromised pages, preempting others to make room (True), or preempt the request
  itself (False); :meth:`Policy.choose_victim` picks the running request to preempt;
* :meth:`Policy.queue_rank` with :attr:`Policy.orders_queue`: the waiting queue's order
  (default FCFS);
* :meth:`Policy.end_schedule`: per-iteration state updates (SGLang's ``new_token_ratio``);
* :attr:`Policy.reserves_first_chunk`: admission from the waiting queue asks only for the pages
  of the request's first scheduled chunk (its prefix-cache hit plus ``min(remaining, token
  budget left)`` tokens) among the unpromised pages, and reserves just those (vLLM V1's
  ``allocate_slots``); ``can_admit`` and the reservation then rule only resuming a swapped request.

The simulator's compiled loop evaluates some rules itself and asks Python for the rest (one
call per question, so every policy runs there and stays correct). :meth:`Policy.compiled_form`
says which of ``can_admit`` and ``end_schedule`` the loop may evaluate in compiled form
(:class:`CompiledForm`); the default is derived from the traits below, and a policy with its own
rules may name a compiled rule of the loop that says the same (SGLang's ``future_charge`` and
``ratio_decay``), with its state as integers (:meth:`Policy.compiled_state`).

Traits the engines read instead of asking which policy they hold (set for each subclass from
what it overrides, so they cannot drift from the code):

* ``admits_on_own_pages``: :meth:`~Policy.can_admit` is the default, so admission depends only
  on the request's own admission pages, an answer that stays "no" while the unpromised pages
  only shrink. The compiled loop then decides admission itself from per-request facts.
* ``keeps_state``: :meth:`~Policy.end_schedule` is overridden, so it must be called after every
  iteration.
* ``preempts_newest``: :meth:`~Policy.choose_victim` is the default (the most recently admitted
  running request), a rule the compiled engine loop applies without asking.

A new serving system is one module in this package: a subclass decorated with :func:`register`
(modules are imported, and so registered, in name order).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import numpy as np

from .._intmath import ceil_div


@dataclass(frozen=True, slots=True)
class Requests:
    """Requests as a policy reads them (tokens).

    Either equal-length integer arrays on the array module ``xp`` (NumPy or CuPy), or one
    request's Python ints with ``xp = numpy``; a rule written with ``xp`` functions and
    operators answers both.

    Attributes
    ----------
    index : array of int or int
        Row of each request in the workload.
    prompt_tokens, output_tokens, generated_tokens : array of int or int
        Prompt length, true output length, tokens generated so far (tokens).
    xp : module
        The array module of the arrays.
    """

    index: Any
    prompt_tokens: Any
    output_tokens: Any
    generated_tokens: Any
    xp: ModuleType = np

    @property
    def size(self) -> int:
        """Number of requests (1 for Python ints)."""
        shape = getattr(self.index, "shape", ())
        return int(shape[0]) if shape else 1

    @classmethod
    def one(cls, index: int, prompt_tokens: int, output_tokens: int, generated_tokens: int) -> Requests:
        """One request's view (Python ints, NumPy rules)."""
        return cls(index, prompt_tokens, output_tokens, generated_tokens, np)

    @classmethod
    def empty(cls, xp: ModuleType = np) -> Requests:
        """No requests (length-0 arrays)."""
        z = xp.zeros(0, dtype=xp.int64)
        return cls(z, z, z, z, xp)


class Policy(ABC):
    """An admission and reservation rule. One instance serves one simulation (it may hold state).

    Subclasses set ``name`` (the registry key) and ``on_demand``, and implement
    :meth:`reservation_tokens`; every other rule has a default (see the module note).
    """

    name: ClassVar[str]
    on_demand: ClassVar[bool] = False
    reserves_first_chunk: ClassVar[bool] = False
    admits_on_own_pages: ClassVar[bool] = True
    keeps_state: ClassVar[bool] = False
    preempts_newest: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.fits_empty_pool is not Policy.fits_empty_pool:
            raise TypeError(f"{cls.__name__} overrides fits_empty_pool, which is derived from admission_pages")
        cls.admits_on_own_pages = cls.can_admit is Policy.can_admit
        cls.keeps_state = cls.end_schedule is not Policy.end_schedule
        cls.preempts_newest = cls.choose_victim is Policy.choose_victim

    def __init__(self) -> None:
        self.max_new_tokens = 0
        self.block_size = 1
        self.num_pages = 0
        self._on_device: dict[tuple[str, str], Any] = {}

    def bind(self, *, output_tokens: np.ndarray, max_new_tokens: int, block_size: int, num_pages: int,
             seed: int) -> None:
        """Called once before a run with the run's workload and pool (tokens, pages)."""
        self.max_new_tokens, self.block_size, self.num_pages = max_new_tokens, block_size, num_pages
        self._on_device = {}

    def per_request(self, attr: str, xp: ModuleType) -> Any:
        """The per-request host array ``self.<attr>`` on array module ``xp`` (copied once per module)."""
        key = (attr, xp.__name__)
        if key not in self._on_device:
            self._on_device[key] = xp.asarray(getattr(self, attr))
        return self._on_device[key]

    def pages(self, tokens: Any) -> Any:
        """Pages holding ``tokens`` tokens, ``ceil(tokens / block_size)``, on any array module."""
        return ceil_div(tokens, self.block_size)

    # ------------------------------------------------------------------ the rules
    @abstractmethod
    def reservation_tokens(self, reqs: Requests) -> Any:
        """Tokens of KV to reserve when each request is (re)admitted, prompt and generated included.

        Must be at least ``prompt_tokens + generated_tokens`` (the context it must hold).
        """

    def admission_headroom_pages(self, reqs: Requests) -> Any:
        """Pages each request's admission must leave unpromised beyond its reservation (default 0)."""
        return 0

    def admission_pages(self, reqs: Requests) -> Any:
        """Unpromised pages each request needs to be admitted on its own: reservation + headroom."""
        return self.pages(self.reservation_tokens(reqs)) + self.admission_headroom_pages(reqs)

    def fits_empty_pool(self, reqs: Requests) -> Any:
        """Whether each request could ever run: its admission pages fit the whole pool (not overridden)."""
        return self.admission_pages(reqs) <= self.num_pages

    def can_admit(self, reqs: Requests, *, free_pages: Any, running: Requests | None) -> Any:
        """Whether each request may be admitted alone with ``free_pages`` pages neither held nor promised.

        ``free_pages`` is an int or an array matching ``reqs``; ``running`` the running requests
        in admission order (``None`` for a policy whose ``admits_on_own_pages``: the default
        rule does not read it). An override must not depend on anything but its arguments and
        the policy's state.
        """
        return self.admission_pages(reqs) <= free_pages

    def choose_victim(self, running: Requests) -> int:
        """Position in ``running`` (admission order) of the request to preempt: the most recent."""
        return running.size - 1

    # A default, not abstract (B027): keeps_state derives from whether a policy overrides it.
    def end_schedule(self, *, num_preempted: int, running: Requests, num_iterations: int = 1) -> None:  # noqa: B027
        """Update per-iteration state after an iteration is scheduled (default: no state).

        ``running`` holds the requests still running after it. ``num_iterations > 1`` stands for
        that many consecutive iterations in which nothing was preempted and ``running`` (as given,
        before the first of them) only decoded, one token each per iteration.
        """

    @property
    def orders_queue(self) -> bool:
        """Whether the waiting queue is kept sorted by :meth:`queue_rank` (otherwise FCFS)."""
        return False

    def queue_rank(self, reqs: Requests) -> Any:
        """Position of each request in an ordered waiting queue: distinct integers, lowest first."""
        return reqs.index

    # ------------------------------------------------------------------ the compiled loop's view
    def compiled_form(self) -> CompiledForm:
        """The rules the compiled loop may evaluate itself (default: from the traits; the rest is asked)."""
        return CompiledForm(admission="own_pages" if self.admits_on_own_pages else "ask",
                            end_schedule="ask" if self.keeps_state else "none")

    def compiled_state(self) -> tuple[int, int]:
        """The state a compiled form reads and updates, as two ints (default none: ``(0, 1)``)."""
        return 0, 1

    def load_compiled_state(self, state: tuple[int, int]) -> None:  # noqa: B027 (a default: no state)
        """Take back the state :meth:`compiled_state` gave, as the compiled loop left it."""


@dataclass(frozen=True)
class CompiledForm:
    """Which of a policy's rules the compiled loop (``kvlab.sim.fast.loop``) may evaluate itself.

    Attributes
    ----------
    admission : {"own_pages", "future_charge", "ask"}
        ``own_pages``: the default :meth:`Policy.can_admit` (admission pages fit the unpromised
        pages). ``future_charge``: SGLang's rule, ``reservation_tokens + ceil(ratio x (future(r)
        + sum of future over the running)) <= unpromised pages x block_size`` with ``future =
        min(max_new_tokens - generated, clip_tokens)`` and ``ratio`` the state's fraction.
        ``ask``: the loop asks :meth:`Policy.can_admit`.
    end_schedule : {"none", "ratio_decay", "ask"}
        ``none``: no per-iteration state. ``ratio_decay``: after an iteration that preempted
        nothing (or leaves nothing running), ``ratio = max(floor, ratio - step)``; otherwise the
        loop asks :meth:`Policy.end_schedule`. ``ask``: it asks after every iteration.
    constants : tuple of int
        ``future_charge`` / ``ratio_decay``: ``(clip_tokens, floor numerator, floor denominator,
        step numerator, step denominator)``.
    """

    admission: str = "ask"
    end_schedule: str = "ask"
    constants: tuple[int, ...] = ()


P = TypeVar("P", bound=type[Policy])
_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: P) -> P:
    """Class decorator: register a policy under ``cls.name``; a duplicate raises ``ValueError``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy class {cls.__name__} needs a non-empty str name, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"policy {name!r} is already registered (by {_REGISTRY[name].__name__})")
    _REGISTRY[name] = cls
    return cls


def policy_names() -> list[str]:
    """Names of the registered policies, in registration order."""
    return list(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    """The registered class called ``name``; ``ValueError`` listing the known names otherwise."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"policy {name!r} is unknown: expected one of {', '.join(policy_names())}")
    return _REGISTRY[name]


def create_policy(name: str, **params: object) -> Policy:
    """A new instance of the policy called ``name`` with its parameters.

    Raises ``ValueError`` for an unknown name (listing the known ones) or a bad parameter.
    """
    cls = policy_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for policy {name!r}: {exc}") from None

