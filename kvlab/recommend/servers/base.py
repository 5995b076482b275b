"""What a server profile is: one system and version family, its real defaults, its knobs and its flags.

A :class:`Setting` is one configuration a real server can run, in kvlab's terms (the policy that
models its KV admission and reservation rule, overflow mode, batch limits, memory share, KV
precision, host pool) and in the system's own flags. A :class:`ServerProfile` states, for one
version family, the defaults the release computes for a model and GPU
(:meth:`ServerProfile.defaults`), the settings worth comparing (its default and one change of
each knob), the launch command that applies a setting (every simulated value spelled out, so the
command behaves as simulated whatever the release's defaults) and any config file it needs.

Memory shares are mapped onto ``kvlab.pool_pages``'s ``gpu_memory_utilization`` (share of the
GPU's memory for weights + KV, 1 GiB of activations off the top).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ...specs import GIB, ModelSpec, gpu as _gpu, model as _model

#: Overflow modes of the reservation recipe and the old servers that swap.
OVERFLOW_MODES = ("recompute", "swap", "reject")


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One configuration a system can run, in kvlab's terms and in the system's flags.

    Attributes
    ----------
    system : str
        The serving system (``vllm``, ``sglang``, ``tgi``, ``tensorrt-llm``, ``reservation``).
    family : str
        Key of the profile (version family) it belongs to, e.g. ``"vllm>=0.11"``.
    version : str
        The version family in words, as printed.
    label : str
        Short name: ``"default"`` or the knob changed, e.g. ``"max_num_seqs=128"``.
    knob : str
        The knob changed from the default (``"default"`` for the default itself).
    policy : str
        kvlab policy (``kvlab.policy_names()``) with ``policy_params``.
    preemption_mode : {"recompute", "swap", "reject"}
        What a preempted request goes through (``swap`` also prices a CPU offload tier).
    scheduler : {"chunked", "prefill_first", "prefill_first_chunked", "mixed_whole", "chunked_alternating"}
        Chunked prefill with a token budget, whole prefills that stall decodes (vLLM V0), chunked
        prefills that stall decodes (SGLang), whole prefills beside the decodes (TensorRT-LLM without
        chunked prefill), or chunked prefill admitting in alternate iterations (TGI 3).
    max_num_seqs : int
        Requests running at most.
    max_num_batched_tokens : int
        Tokens per iteration (the chunked-prefill budget, tokens).
    gpu_memory_utilization : float
        Share of GPU memory for weights + KV (``kvlab.pool_pages``).
    kv_cache_dtype : {"auto", "fp8"}
        KV-cache storage (``kvlab.specs.KV_CACHE_DTYPES``).
    host_pool_gib : float, optional
        Host memory the preempted or evicted KV may go to (GiB per replica): vLLM V0's
        ``--swap-space``, vLLM's ``--kv-offloading-size``, SGLang's hierarchical cache. None: the
        simulator's default swap pool (only read when ``preemption_mode`` is ``swap``).
    overflow_kind : str
        What the table calls the overflow: ``recompute``, ``swap`` (a server that swaps, or the
        recipe), ``cpu offload`` (a host KV tier priced by the host link), ``reject``.
    output_cap_tokens : int, optional
        A server-side output cap below the trace's (tokens; it truncates longer outputs);
        None keeps the trace's cap.
    prefix_caching : bool
        The server runs its prefix cache (simulated by :mod:`kvlab.prefix_cache` where the trace
        carries block identities; see :func:`kvlab.recommend.core.serving_config`).
    async_scheduling : bool
        The server schedules each iteration while the previous one runs (``kvlab.simulate``'s).
    flags : dict
        The system's own option -> value for this setting, as printed (before the context clamp).
    """

    system: str
    family: str = ""
    version: str = ""
    label: str
    knob: str
    policy: str
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    preemption_mode: str = "recompute"
    scheduler: str = "chunked"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    host_pool_gib: float | None = None
    overflow_kind: str = ""
    output_cap_tokens: int | None = None
    prefix_caching: bool = False
    async_scheduling: bool = False
    flags: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.knob == "default"

    @property
    def overflow(self) -> str:
        """What happens to a request the pool cannot hold: ``none`` when it never can happen."""
        if self.policy == "reserve_max" and self.output_cap_tokens is None:
            return "none"
        return self.overflow_kind or self.preemption_mode

    def host_pool_pages(self, model: str | ModelSpec, *, block_size: int, tp: int = 1) -> int | None:
        """The host pool in pages of ``block_size`` tokens on one GPU (its 1/tp share), or None."""
        if self.host_pool_gib is None:
            return None
        page_bytes = block_size * _model(model).kv_bytes_per_token(tp=tp)
        return int(self.host_pool_gib * GIB / tp // page_bytes)


def change(base: Setting, knob: str, value: Any, flag: str | None = None, flag_value: Any = None,
           **fields: Any) -> Setting:
    """``base`` with one knob changed: labelled ``knob=value``, its flag set (None: no flag)."""
    flags = dict(base.flags)
    if flag is not None:
        flags[flag] = value if flag_value is None else flag_value
    flags.update(fields.pop("flags", {}))
    return replace(base, label=f"{knob}={value}", knob=knob, flags=flags, **fields)


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a profile needs to compute its defaults and settings."""

    model: ModelSpec
    gpu_name: str
    tp: int = 1
    max_model_len: int = 0
    percentiles: Mapping[str, int] = field(default_factory=dict)
    max_new_tokens: int | None = None

    @property
    def gpu(self):
        return _gpu(self.gpu_name)


@dataclass(frozen=True, kw_only=True)
class Launch:
    """The command that applies a setting, and the files it reads.

    Attributes
    ----------
    argv : list of str
        The command, one argument per item (``shlex.join`` prints it).
    files : dict of str to str
        File name -> content of each config file the command names (written by ``--save-dir``).
    notes : tuple of str
        What else the operator must do for the command to run as simulated.
    text : str
        The command in words where there is no server to launch (the reservation recipe).
    """

    argv: list[str] = field(default_factory=list)
    files: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    text: str = ""

    @property
    def command(self) -> str:
        return shlex.join(self.argv) if self.argv else self.text


@dataclass(frozen=True, kw_only=True)
class LaunchContext:
    """What a launch command is clamped to (tokens) and where its files go."""

    model: ModelSpec
    max_model_len: int
    max_prompt_tokens: int
    max_new_tokens: int
    block_size: int = 16
    tp: int = 1
    save_dir: str | None = None

    @property
    def checkpoint(self) -> str:
        """What the server loads: the model's Hugging Face id, else kvlab's name (give a path)."""
        return self.model.hf_id or self.model.name

    def file(self, name: str) -> str:
        """Path of a config file as the command names it (inside ``save_dir`` when given)."""
        return f"{self.save_dir.rstrip('/')}/{name}" if self.save_dir else name


def flag_args(flags: Mapping[str, Any]) -> list[str]:
    """``{"--a": 1, "--b": True, "--c": None}`` -> ``["--a", "1", "--b"]`` (True: a bare switch)."""
    out: list[str] = []
    for k, val in flags.items():
        if val is None or val is False:
            continue
        out += [k] if val is True else [k, str(val)]
    return out


class ServerProfile:
    """One serving system and version family. Subclasses set the class attributes and methods.

    Attributes
    ----------
    system : str
        The system's name (``--system`` takes it, optionally with ``==VERSION``).
    shipping : bool
        A server one can run (False for the brief's recipe: not in comparisons).
    key : str
        The family's key, e.g. ``"vllm>=0.11"``.
    family : str
        The family in words.
    versions : tuple
        ``(first, last)`` versions as tuples, ``last`` None when open-ended.
    sources : tuple of str
        Release and source file each fact was read from.
    overflow, prefix_cache, host_offload : str
        What the server does with a request the pool cannot hold; its prefix cache in words;
        its host KV tier ("" when it has none).
    prefix_caching : bool
        Whether the release runs its prefix cache by default (every setting of the profile
        inherits it; :attr:`Setting.prefix_caching`).
    async_scheduling : bool
        Whether the release schedules each iteration while the previous one runs by default
        (every setting inherits it; :attr:`Setting.async_scheduling`).
    block_sizes : tuple of int or None
        ``--block-size`` values the release accepts (None: the system has no such flag).
    kv_cache_dtypes : dict
        kvlab KV dtype -> the system's value for it (absent: not supported).
    kv_knobs : tuple of str
        Knobs that change the KV pool, its precision, its host tier or its reservation (the
        answer says KV does not bind when all of these tie the default).
    tp_flag, kv_flag : str
        The tensor-parallel and KV-dtype options ("" where there is none on the command line).
    fp8_weights_args : tuple of str
        What quantizes BF16 weights to FP8 at load (empty: a pre-quantized checkpoint is needed).
    stack : str
        The serving stack whose CPU overheads price this family by default (a shipped cost-model
        file, :mod:`kvlab.costmodel.stacks`, fitted to real servers of the family); ``"none"``
        (GPU time only) where no stack is fitted to one.
    split_attention : bool
        The server runs a mixed batch's prefill and decode attention as separate kernels
        (:func:`kvlab.costmodel.cost_model`): no part of vLLM's FA2 varlen mixed-batch cost.
    policy, policy_params, scheduler : str, mapping, str
        How the simulator runs the server by default (:mod:`kvlab.policies`, :func:`kvlab.simulate`'s
        ``scheduler``): its default setting's, and a replay's of its measured runs (:mod:`kvlab.validate`).
    engine : str
        The name a measured run of this family gives as its ``engine`` (:class:`kvlab.validate.SetUp`); "" for
        a profile no run names.
    kernels : str or None
        The kernel era its servers ran (:func:`kvlab.costmodel.cost_model`): None for today's, ``"2024"``.
    """

    system: str = ""
    shipping: bool = True
    key: str = ""
    family: str = ""
    versions: tuple = ((0,), None)
    sources: tuple[str, ...] = ()
    overflow: str = ""
    prefix_cache: str = ""
    prefix_caching: bool = False
    async_scheduling: bool = False
    host_offload: str = ""
    block_sizes: tuple[int, ...] | None = None
    kv_cache_dtypes: Mapping[str, str] = {"auto": "auto"}
    kv_knobs: tuple[str, ...] = ()
    tp_flag: str = ""
    fp8_weights_args: tuple[str, ...] = ()
    kv_flag: str = ""
    stack: str = "none"
    split_attention: bool = False
    policy: str = ""
    policy_params: Mapping[str, Any] = {}
    scheduler: str = "chunked"
    engine: str = ""
    kernels: str | None = None

    # --------------------------------------------------------------- what subclasses write
    def defaults(self, ctx: Context) -> dict[str, Any]:
        """The release's default of each knob this profile models, for ``ctx``'s model and GPU."""
        raise NotImplementedError

    def settings(self, ctx: Context) -> list[Setting]:
        """The default setting first, then one change of each knob."""
        raise NotImplementedError

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        """The command (and files) that apply ``setting``, clamped to the context."""
        raise NotImplementedError

    def client_note(self, setting: Setting, *, max_new_tokens: int) -> str:
        """What clients must send for the simulation to hold."""
        cap = setting.output_cap_tokens or max_new_tokens
        return f"requests without max_tokens get {cap} (server default)"

    # --------------------------------------------------------------- shared by the profiles
    def option_args(self, setting: Setting, ctx: LaunchContext) -> list[str]:
        """TP, FP8 weights, the setting's flags and its KV dtype, as command-line arguments."""
        args = [self.tp_flag, str(ctx.tp)] if ctx.tp > 1 and self.tp_flag else []
        if ctx.model.weight_dtype == "fp8":
            args += list(self.fp8_weights_args)
        flags = dict(setting.flags)
        if setting.kv_cache_dtype != "auto" and self.kv_flag:
            flags[self.kv_flag] = self.kv_flag_value(setting.kv_cache_dtype)
        return args + flag_args(flags)

    def supports_fp8_kv(self, ctx: Context) -> bool:
        """Whether to offer FP8 KV: the system stores it and the GPU has FP8 tensor cores."""
        return "fp8" in self.kv_cache_dtypes and ctx.gpu.has_fp8 and ctx.model.kv_cache_dtype == "auto"

    def base(self, **fields: Any) -> Setting:
        """The default :class:`Setting` of this family with ``fields``."""
        return Setting(**{"system": self.system, "family": self.key, "version": self.family, "label": "default",
                          "knob": "default", "prefix_caching": self.prefix_caching,
                          "async_scheduling": self.async_scheduling, "policy": self.policy,
                          "policy_params": dict(self.policy_params), "scheduler": self.scheduler, **fields})

    def check_block_size(self, block_size: int) -> int:
        """``block_size`` if this release accepts it as ``--block-size``, else ``ValueError``."""
        if self.block_sizes is not None and block_size not in self.block_sizes:
            raise ValueError(f"block_size {block_size} is not a block size {self.family} accepts: "
                             f"{', '.join(map(str, self.block_sizes))}")
        return block_size

    def kv_flag_value(self, kv_cache_dtype: str) -> str:
        """The system's value of ``--kv-cache-dtype`` for kvlab's ``kv_cache_dtype``."""
        if kv_cache_dtype not in self.kv_cache_dtypes:
            raise ValueError(f"{self.family} has no {kv_cache_dtype} KV cache (it takes "
                             f"{', '.join(self.kv_cache_dtypes)})")
        return self.kv_cache_dtypes[kv_cache_dtype]

    def fp8_kv(self, base: Setting, ctx: Context, flag: str | None) -> list[Setting]:
        """The FP8-KV change of ``base`` where the system and GPU support it (half the KV bytes)."""
        if not self.supports_fp8_kv(ctx):
            return []
        return [change(base, "kv_cache_dtype", "fp8", flag, self.kv_cache_dtypes["fp8"], kv_cache_dtype="fp8")]

    def describe(self) -> dict[str, str]:
        """The profile in words: family, overflow, prefix cache, host tier, sources."""
        return {"system": self.system, "family": self.family, "stack": self.stack, "overflow": self.overflow,
                "prefix_cache": self.prefix_cache, "host_offload": self.host_offload or "none",
                "sources": "; ".join(self.sources)}


__all__ = ["Context", "Launch", "LaunchContext", "OVERFLOW_MODES", "ServerProfile", "Setting", "change", "flag_args"]
