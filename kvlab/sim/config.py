"""Small frozen configurations of the simulator's components."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


#: The server's defaults, stated once: :func:`kvlab.simulate`, :class:`SchedulerConfig` and
#: :class:`kvlab.capacity.ServingConfig` read them here (running requests at most; output cap, tokens).
DEFAULT_MAX_NUM_SEQS = 128
DEFAULT_MAX_NEW_TOKENS = 8192


class SchedulerKind(str, enum.Enum):
    """How prefills and decodes share an iteration."""

    CHUNKED = "chunked"
    PREFILL_FIRST = "prefill_first"
    PREFILL_FIRST_CHUNKED = "prefill_first_chunked"
    MIXED_WHOLE = "mixed_whole"
    CHUNKED_ALTERNATING = "chunked_alternating"


#: Every scheduler's name (``kvlab.simulate``'s ``scheduler``).
SCHEDULERS = tuple(k.value for k in SchedulerKind)


class PreemptionMode(str, enum.Enum):
    """What happens to a preempted request."""

    RECOMPUTE = "recompute"
    SWAP = "swap"
    REJECT = "reject"


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Continuous-batching limits and modes."""

    kind: SchedulerKind = field(default=SchedulerKind.CHUNKED,
                                metadata={"help": "chunked (Sarathi-Serve, vLLM V1), prefill_first (vLLM V0), "
                                                  "prefill_first_chunked (SGLang without --enable-mixed-chunk), "
                                                  "mixed_whole (TensorRT-LLM without chunked prefill) or "
                                                  "chunked_alternating (TGI 3: chunked, but no admission in the "
                                                  "iteration after one that admitted beside running requests)"})
    max_num_seqs: int = field(default=DEFAULT_MAX_NUM_SEQS, metadata={"help": "running requests at most (requests)"})
    max_num_batched_tokens: int = field(default=2048, metadata={"help": "tokens computed per iteration (tokens)"})
    preemption_mode: PreemptionMode = field(default=PreemptionMode.RECOMPUTE,
                                            metadata={"help": "recompute, swap or reject"})
    async_scheduling: bool = field(default=False, metadata={
        "help": "schedule each iteration while the previous one runs (vLLM V1 >= 0.14's default): admissions "
                "see arrivals and freed pages and slots one iteration late"})


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """The GPU KV pool."""

    num_pages: int = field(metadata={"help": "KV pages on the GPU (pages)"})
    block_size: int = field(default=16, metadata={"help": "tokens per page"})


@dataclass(frozen=True, kw_only=True)
class SwapConfig:
    """The CPU swap pool and the price of moving a page over the host link."""

    cpu_pool_pages: int = field(metadata={"help": "pages the CPU pool holds (pages)"})
    page_copy_s: float = field(metadata={"help": "one page one way: copy latency + bytes / host link (seconds)"})
