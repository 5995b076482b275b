"""Server profiles pinned to versions: one module per system and version family.

Each module in this package defines ``PROFILE``, a :class:`~kvlab.recommend.servers.base.ServerProfile`
stating its family's real defaults (the computed ones included), its overflow behaviour, prefix
cache and host KV tier, the flags it accepts, and the release and source file each was read
from. Adding a serving system (or a version family) means adding one module here.

``--system vllm`` is the newest family of a system; ``--system vllm==0.8`` the family whose
versions hold 0.8.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache

from .base import (OVERFLOW_MODES, Context, Launch, LaunchContext, ServerProfile, Setting, change,
                   flag_args)

#: Other names a system answers to.
ALIASES = {"trtllm": "tensorrt-llm", "tensorrt_llm": "tensorrt-llm", "trt-llm": "tensorrt-llm",
           "text-generation-inference": "tgi"}


@cache
def profiles() -> dict[str, ServerProfile]:
    """Every profile of this package, by key (``"vllm>=0.11"``, ``"vllm 0.6-0.10"``, ...)."""
    found: dict[str, ServerProfile] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        prof = getattr(importlib.import_module(f"{__name__}.{info.name}"), "PROFILE", None)
        if isinstance(prof, ServerProfile):
            found[prof.key] = prof
    return found


def engines() -> dict[str, ServerProfile]:
    """The profile of each engine a measured run may name (:attr:`ServerProfile.engine`: ``"vllm-v1"``, ...)."""
    return {p.engine: p for p in sorted(profiles().values(), key=lambda p: p.key) if p.engine}


def by_engine(engine: str) -> ServerProfile:
    """The profile of the engine a measured run names; ``ValueError`` naming the known engines."""
    known = engines()
    if engine not in known:
        raise ValueError(f"engine must be one of {', '.join(sorted(known))}, got {engine!r}")
    return known[engine]


def systems() -> tuple[str, ...]:
    """The shipping systems the profiles cover, in the order a comparison prints them."""
    order = ("vllm", "sglang", "tgi", "tensorrt-llm")
    names = {p.system for p in profiles().values() if p.shipping}
    return tuple(s for s in order if s in names) + tuple(sorted(names - set(order)))


def preemption_modes() -> dict[str, tuple[str, ...]]:
    """What each shipping family does with a preempted request: family in words -> its modes
    (``("recompute", "swap")`` where the release lets you choose ``--preemption-mode swap``,
    ``("recompute",)`` otherwise), newest families first. Read from the profiles: a family swaps
    when its profile models a ``preemption_mode`` knob (only vLLM V0 does; vLLM V1 removed it, and
    SGLang, TGI and TensorRT-LLM recompute)."""
    fams = sorted((p for p in profiles().values() if p.shipping), key=lambda p: (systems().index(p.system)
                                                                                if p.system in systems() else 99,
                                                                                tuple(-v for v in p.versions[0])))
    return {p.family: ("recompute", "swap") if "preemption_mode" in p.kv_knobs else ("recompute",) for p in fams}


def _version(text: str, spec: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(\.\d+){0,2}", text):
        raise ValueError(f"system {spec!r}: version {text!r} is not a release number such as 0.8 or 0.8.5")
    return tuple(int(x) for x in text.split("."))


def _holds(prof: ServerProfile, version: tuple[int, ...]) -> bool:
    first, last = prof.versions
    n = len(version)
    return first[:n] <= version and (last is None or version <= last[:n])


def resolve(system: str) -> ServerProfile:
    """The profile ``system`` names: ``"vllm"`` (the newest family) or ``"vllm==0.8"``.

    Raises ``ValueError`` naming the known systems and families.
    """
    spec = str(system).strip()
    name, _, version = spec.partition("==")
    name = ALIASES.get(name.strip().lower(), name.strip().lower())
    mine = sorted((p for p in profiles().values() if p.system == name), key=lambda p: p.versions[0])
    if not mine:
        known = [*systems(), *sorted({p.system for p in profiles().values()} - set(systems()))]
        raise ValueError(f"system {spec!r} is unknown; known systems are {', '.join(known)} "
                         f"(optionally with ==VERSION, e.g. vllm==0.8)")
    if not version:
        return mine[-1]
    want = _version(version.strip(), spec)
    for prof in reversed(mine):
        if _holds(prof, want):
            return prof
    raise ValueError(f"system {spec!r}: no profile covers {name} {version}; kvlab has "
                     f"{', '.join(p.family for p in mine)}")


__all__ = ["ALIASES", "Context", "Launch", "LaunchContext", "OVERFLOW_MODES", "ServerProfile", "Setting", "change",
           "by_engine", "engines", "flag_args", "preemption_modes", "profiles", "resolve", "systems"]
