"""What each serving system lets its operator set, as kvlab settings and as the system's own flags.

A :class:`Setting` is one configuration a real server can run: the kvlab policy that models its
KV admission and reservation rule (``kvlab.policies``), its overflow mode, batch limits and the
share of GPU memory it gives the KV pool, plus the flags that set it on that system. Each
system lists its default and one change of each knob from it (:func:`settings`), so a search
compares what the operator can actually change, one knob at a time.

Systems and the version family whose flags are printed (check them against your version):

``vllm``          vLLM V1 (0.8 and later): on-demand pages, recompute on preemption, chunked
                  prefill always on. No per-request reservation exists to tune.
``sglang``        SGLang 0.4: admission against ``new_token_ratio`` (scaled by
                  ``--schedule-conservativeness``), retraction (recompute) on decode OOM.
``tgi``           TGI v3: reserves prompt + min(max_new_tokens, 1024) at admission (the cap is
                  fixed in the router), re-queues (recomputes) a request that outgrows it.
``tensorrt-llm``  TensorRT-LLM 0.17+ LLM API / ``trtllm-serve``: GUARANTEED_NO_EVICT reserves
                  prompt + max_tokens and never evicts; MAX_UTILIZATION pages on demand and
                  pauses (recomputes) requests when the cache is full.
``reservation``   Not a shipping server: the brief's recipe, a server that reserves prompt +
                  a percentile of the output lengths (TGI's rule with the cap set to it), with
                  each overflow mode (recompute, swap, reject), next to reserving everything.

Memory shares are mapped onto ``kvlab.pool_pages``'s ``gpu_memory_utilization`` (share of the
GPU's memory for weights + KV): vLLM's ``--gpu-memory-utilization``, SGLang's
``--mem-fraction-static`` and TGI's ``--cuda-memory-fraction`` as they are; TensorRT-LLM's
``kv_cache_free_gpu_memory_fraction`` (a share of the memory left after the weights) as
``(weights + f x (memory - weights)) / memory``.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .. import _validate as v
from ..specs import GIB, model as _model, gpu as _gpu

#: Systems :func:`settings` knows, in the order a comparison prints them.
SYSTEMS = ("vllm", "sglang", "tgi", "tensorrt-llm")
#: The brief's percentile-reservation recipe (not a shipping server).
RESERVATION = "reservation"
#: Version family whose flags are printed, per system.
VERSION_FAMILY = {"vllm": "vLLM V1 (0.8+)", "sglang": "SGLang 0.4+", "tgi": "TGI v3",
                  "tensorrt-llm": "TensorRT-LLM 0.17+ (LLM API, trtllm-serve)",
                  RESERVATION: "no shipping server (the brief's recipe)"}
#: Overflow modes of the reservation recipe.
OVERFLOW_MODES = ("recompute", "swap", "reject")


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One configuration a system can run, in kvlab's terms and in the system's flags.

    Attributes
    ----------
    system : str
        One of :data:`SYSTEMS` or :data:`RESERVATION`.
    label : str
        Short name: ``"default"`` or the knob changed, e.g. ``"max_num_seqs=128"``.
    knob : str
        The knob changed from the default (``"default"`` for the default itself).
    policy : str
        kvlab policy (``kvlab.policy_names()``) with ``policy_params``.
    preemption_mode : {"recompute", "swap", "reject"}
        What a preempted request goes through.
    max_num_seqs : int
        Requests running at most.
    max_num_batched_tokens : int
        Tokens per iteration (the chunked-prefill budget, tokens).
    gpu_memory_utilization : float
        Share of GPU memory for weights + KV (``kvlab.pool_pages``).
    output_cap_tokens : int, optional
        A server-side output cap below the trace's (tokens; it truncates longer outputs);
        None keeps the trace's cap.
    flags : dict
        The system's own flag -> value for this setting (values before clamping to the model).
    """

    system: str
    label: str
    knob: str
    policy: str
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    preemption_mode: str = "recompute"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    gpu_memory_utilization: float = 0.9
    output_cap_tokens: int | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.knob == "default"

    @property
    def overflow(self) -> str:
        """What happens to a request the pool cannot hold: ``none`` when it never can happen."""
        return "none" if self.policy == "reserve_max" and self.output_cap_tokens is None else self.preemption_mode


def _change(base: Setting, knob: str, value: Any, flag: str, flag_value: Any = None, **fields: Any) -> Setting:
    label = f"{knob}={value}"
    return replace(base, label=label, knob=knob, flags={**base.flags, flag: value if flag_value is None
                                                        else flag_value}, **fields)


def _trt_utilization(model: str, gpu: str, free_fraction: float, tp: int) -> float:
    """TensorRT-LLM's share of free memory after weights, as a share of all memory."""
    m, g = _model(model), _gpu(gpu)
    weights = m.weight_bytes_per_gpu(tp=tp)
    return min(0.99, (weights + free_fraction * (g.memory_bytes - weights)) / g.memory_bytes)


def settings(system: str, *, model: str, gpu: str, tp: int = 1, percentiles: Mapping[str, int] | None = None,
             max_new_tokens: int | None = None) -> list[Setting]:
    """The default setting of ``system`` and one change of each knob the operator can set.

    Parameters
    ----------
    system : str
        One of :data:`SYSTEMS` or :data:`RESERVATION`.
    model, gpu : str
        For TensorRT-LLM's memory share and SGLang's GPU-dependent chunk default.
    tp : int
        Tensor-parallel GPUs.
    percentiles : mapping of str to int, optional
        Output-length percentiles of the trace (``{"p95": tokens, ...}``): the reservation
        recipe's caps, and TensorRT-LLM's p99 output cap.
    max_new_tokens : int, optional
        The trace's output cap (tokens); caps at or above it are not offered.

    Returns
    -------
    list of Setting
        The default first.
    """
    system = v.choice(system, "system", SYSTEMS + (RESERVATION,))
    pct = dict(percentiles or {})
    cap = max_new_tokens
    big_gpu = _gpu(gpu).memory_bytes >= 60 * GIB
    if system == "vllm":
        base = Setting(system=system, label="default", knob="default", policy="vllm",
                       policy_params={"watermark_frac": 0.0}, max_num_seqs=256, max_num_batched_tokens=2048,
                       gpu_memory_utilization=0.9,
                       flags={"--max-num-seqs": 256, "--max-num-batched-tokens": 2048,
                              "--gpu-memory-utilization": 0.9})
        return [base,
                _change(base, "max_num_seqs", 128, "--max-num-seqs", max_num_seqs=128),
                _change(base, "max_num_seqs", 512, "--max-num-seqs", max_num_seqs=512),
                _change(base, "max_num_batched_tokens", 512, "--max-num-batched-tokens", max_num_batched_tokens=512),
                _change(base, "max_num_batched_tokens", 8192, "--max-num-batched-tokens",
                        max_num_batched_tokens=8192),
                _change(base, "gpu_memory_utilization", 0.95, "--gpu-memory-utilization",
                        gpu_memory_utilization=0.95)]
    if system == "sglang":
        chunk = 8192 if big_gpu else 2048
        base = Setting(system=system, label="default", knob="default", policy="sglang", max_num_seqs=256,
                       max_num_batched_tokens=chunk, gpu_memory_utilization=0.88,
                       policy_params={"init_ratio": 0.7},
                       flags={"--max-running-requests": 256, "--chunked-prefill-size": chunk,
                              "--mem-fraction-static": 0.88, "--schedule-conservativeness": 1.0})
        return [base,
                _change(base, "schedule_conservativeness", 0.3, "--schedule-conservativeness",
                        policy_params={"init_ratio": 0.21}),
                _change(base, "max_running_requests", 128, "--max-running-requests", max_num_seqs=128),
                _change(base, "chunked_prefill_size", 2048 if big_gpu else 8192, "--chunked-prefill-size",
                        max_num_batched_tokens=2048 if big_gpu else 8192),
                _change(base, "mem_fraction_static", 0.92, "--mem-fraction-static", gpu_memory_utilization=0.92)]
    if system == "tgi":
        base = Setting(system=system, label="default", knob="default", policy="tgi",
                       policy_params={"cap_tokens": 1024}, max_num_seqs=256, max_num_batched_tokens=4096,
                       gpu_memory_utilization=0.95,
                       flags={"--max-batch-prefill-tokens": 4096, "--cuda-memory-fraction": 0.95})
        return [base,
                _change(base, "max_batch_prefill_tokens", 2048, "--max-batch-prefill-tokens",
                        max_num_batched_tokens=2048),
                _change(base, "max_batch_prefill_tokens", 8192, "--max-batch-prefill-tokens",
                        max_num_batched_tokens=8192),
                _change(base, "max_batch_size", 128, "--max-batch-size", max_num_seqs=128),
                _change(base, "cuda_memory_fraction", 0.9, "--cuda-memory-fraction", gpu_memory_utilization=0.9)]
    if system == "tensorrt-llm":
        util = _trt_utilization(model, gpu, 0.9, tp)
        base = Setting(system=system, label="default", knob="default", policy="reserve_max", max_num_seqs=2048,
                       max_num_batched_tokens=8192, gpu_memory_utilization=util,
                       flags={"capacity_scheduler_policy": "GUARANTEED_NO_EVICT", "--max_batch_size": 2048,
                              "--max_num_tokens": 8192, "--kv_cache_free_gpu_memory_fraction": 0.9})
        out = [base,
               _change(base, "capacity_scheduler_policy", "MAX_UTILIZATION", "capacity_scheduler_policy",
                       policy="vllm", policy_params={"watermark_frac": 0.0}),
               _change(base, "max_num_tokens", 2048, "--max_num_tokens", max_num_batched_tokens=2048),
               _change(base, "max_batch_size", 256, "--max_batch_size", max_num_seqs=256),
               _change(base, "kv_cache_free_gpu_memory_fraction", 0.95, "--kv_cache_free_gpu_memory_fraction",
                       gpu_memory_utilization=_trt_utilization(model, gpu, 0.95, tp))]
        if "p99" in pct and (cap is None or pct["p99"] < cap):
            out.append(_change(base, "max_tokens", pct["p99"], "max_tokens", output_cap_tokens=pct["p99"]))
        return out
    # the brief's recipe: reserve prompt + a percentile, each overflow mode; and reserve everything
    base = Setting(system=system, label="reserve max_new_tokens", knob="default", policy="reserve_max",
                   flags={"reserve": "max_new_tokens"})
    out = [base]
    for name, tokens in pct.items():
        if cap is not None and tokens >= cap:
            continue
        for mode in OVERFLOW_MODES:
            out.append(replace(base, label=f"reserve {name}, {mode}", knob="reserve", policy="tgi",
                               policy_params={"cap_tokens": int(tokens)}, preemption_mode=mode,
                               flags={"reserve": f"{name} = {tokens} tokens", "overflow": mode}))
    return out


def default_settings(*, model: str, gpu: str, tp: int = 1) -> list[Setting]:
    """Each of :data:`SYSTEMS` at its default: the cross-system comparison."""
    return [settings(s, model=model, gpu=gpu, tp=tp)[0] for s in SYSTEMS]


# ------------------------------------------------------------------------------------- flags
def command_line(setting: Setting, *, model: str, max_model_len: int, max_prompt_tokens: int,
                 max_new_tokens: int, block_size: int = 16, tp: int = 1) -> str:
    """The launch command that applies ``setting`` on its system, clamped to the model's context.

    Parameters
    ----------
    setting : Setting
    model : str
        Model name as the server is told it (kvlab's name; put your checkpoint path there).
    max_model_len : int
        Longest prompt + output the server accepts (tokens), already clamped to the model's context.
    max_prompt_tokens : int
        Longest prompt to accept (tokens), at most ``max_model_len - 1``.
    max_new_tokens : int
        Default output cap (tokens); ``setting.output_cap_tokens`` overrides it.
    block_size : int
        Tokens per KV page (vLLM's ``--block-size``).
    tp : int
        Tensor-parallel GPUs.
    """
    cap = setting.output_cap_tokens or max_new_tokens
    f = dict(setting.flags)
    q = shlex.quote
    if setting.system == "vllm":
        parts = ["vllm serve", q(model), f"--max-model-len {max_model_len}", f"--block-size {block_size}",
                 f"--tensor-parallel-size {tp}" if tp > 1 else "",
                 *(f"{k} {val}" for k, val in f.items()),
                 "--generation-config vllm", "--override-generation-config", q(f'{{"max_new_tokens": {cap}}}')]
    elif setting.system == "sglang":
        parts = ["python -m sglang.launch_server --model-path", q(model), f"--context-length {max_model_len}",
                 f"--tp {tp}" if tp > 1 else "", *(f"{k} {val}" for k, val in f.items())]
    elif setting.system == "tgi":
        parts = ["text-generation-launcher --model-id", q(model), f"--max-input-tokens {max_prompt_tokens}",
                 f"--max-total-tokens {max_model_len}", f"--num-shard {tp}" if tp > 1 else "",
                 *(f"{k} {val}" for k, val in f.items())]
    elif setting.system == "tensorrt-llm":
        policy = f.pop("capacity_scheduler_policy")
        f.pop("max_tokens", None)
        parts = ["trtllm-serve", q(model), f"--max_seq_len {max_model_len}", f"--tp_size {tp}" if tp > 1 else "",
                 *(f"{k} {val}" for k, val in f.items()),
                 f"--extra_llm_api_options cfg.yaml  # cfg.yaml: scheduler_config: "
                 f"{{capacity_scheduler_policy: {policy}}}"]
    else:
        return ("no server flag: " + ", ".join(f"{k} {val}" for k, val in f.items())
                + f"; max_new_tokens {cap}, max_model_len {max_model_len}")
    return " ".join(p for p in parts if p)


def client_note(setting: Setting, *, max_new_tokens: int) -> str:
    """What clients must send for the simulation to hold (the output cap per request)."""
    cap = setting.output_cap_tokens or max_new_tokens
    if setting.system == "tensorrt-llm":
        return (f"clients send max_tokens <= {cap} (GUARANTEED_NO_EVICT reserves prompt + max_tokens; "
                f"an unset max_tokens reserves the whole context)")
    if setting.system == "tgi":
        return f"clients send max_new_tokens <= {cap} (TGI reserves prompt + min(max_new_tokens, 1024))"
    if setting.system == "sglang":
        return f"clients send max_new_tokens <= {cap} in sampling_params"
    return f"requests without max_tokens get {cap} (server default)"


__all__ = ["OVERFLOW_MODES", "RESERVATION", "SYSTEMS", "Setting", "VERSION_FAMILY", "client_note", "command_line",
           "default_settings", "settings"]
