"""What each serving system lets its operator set, as kvlab settings and as the system's own flags.

The facts live in one server profile per system and version family
(:mod:`kvlab.recommend.servers`: ``vllm`` = vLLM V1 >= 0.11, ``vllm==0.8`` = the V0 engine of
0.6-0.10, ``sglang`` 0.5, ``tgi`` 3, ``tensorrt-llm`` 1.x, and ``reservation``, the brief's
recipe). This module is what the search calls: the settings of a system (its real default for
the model and GPU first, then one change of each knob), the launch command and config files of
a setting, and what clients must send.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..specs import ModelSpec, model as _model
from .servers import OVERFLOW_MODES, Context, Launch, LaunchContext, ServerProfile, Setting, profiles, resolve
from .servers import systems as _systems

#: Systems a comparison runs at their newest family's defaults, in the order it prints them.
SYSTEMS = _systems()
#: The brief's percentile-reservation recipe (not a shipping server).
RESERVATION = "reservation"
#: Version family of each system's newest profile, as printed.
VERSION_FAMILY = {s: resolve(s).family for s in (*SYSTEMS, RESERVATION)}


def profile_of(setting: Setting) -> ServerProfile:
    """The profile a setting belongs to (its family, else its system's newest)."""
    return profiles().get(setting.family) or resolve(setting.system)


def settings(system: str, *, model: str | ModelSpec, gpu: str, tp: int = 1, percentiles: Mapping[str, int] | None = None,
             max_new_tokens: int | None = None, max_model_len: int | None = None) -> list[Setting]:
    """The default setting of ``system`` and one change of each knob the operator can set.

    Parameters
    ----------
    system : str
        A system (:data:`SYSTEMS`, :data:`RESERVATION`), optionally pinned: ``"vllm==0.8"``.
    model : str or ModelSpec
        The model, with its precision (``kvlab.specs.with_precision``).
    gpu : str
    tp : int
        Tensor-parallel GPUs.
    percentiles : mapping of str to int, optional
        Output-length percentiles of the trace (``{"p95": tokens, ...}``): the reservation
        recipe's caps, and TensorRT-LLM's p99 output cap.
    max_new_tokens : int, optional
        The trace's output cap (tokens); caps at or above it are not offered.
    max_model_len : int, optional
        The served context (tokens), for the defaults that depend on it; default the model's.

    Returns
    -------
    list of Setting
        The default first.
    """
    prof = resolve(system)
    m = _model(model)
    ctx = Context(model=m, gpu_name=gpu, tp=m.check_tp(tp), max_model_len=max_model_len or m.max_context_tokens,
                  percentiles=dict(percentiles or {}), max_new_tokens=max_new_tokens)
    return prof.settings(ctx)


def default_settings(*, model: str | ModelSpec, gpu: str, tp: int = 1,
                     max_model_len: int | None = None) -> list[Setting]:
    """Each of :data:`SYSTEMS` at its newest family's default: the cross-system comparison."""
    return [settings(s, model=model, gpu=gpu, tp=tp, max_model_len=max_model_len)[0] for s in SYSTEMS]


# ------------------------------------------------------------------------------------- flags
def launch(setting: Setting, *, model: str | ModelSpec, max_model_len: int, max_prompt_tokens: int,
           max_new_tokens: int, block_size: int = 16, tp: int = 1, save_dir: str | Path | None = None) -> Launch:
    """The launch command (and config files) that apply ``setting`` on its system, clamped to the context.

    Parameters
    ----------
    setting : Setting
    model : str or ModelSpec
        The model; the command loads its Hugging Face id (``kvlab.specs.models()["hf_id"]``),
        or kvlab's name where it has none (give your checkpoint path there).
    max_model_len : int
        Longest prompt + output the server accepts (tokens), already clamped to the model's context.
    max_prompt_tokens : int
        Longest prompt to accept (tokens), at most ``max_model_len - 1``.
    max_new_tokens : int
        Default output cap (tokens); ``setting.output_cap_tokens`` overrides it.
    block_size : int
        Tokens per KV page (vLLM's ``--block-size``; checked against the release's values).
    tp : int
        Tensor-parallel GPUs.
    save_dir : path, optional
        Folder the command's config files are named in (and :func:`write_files` writes to).
    """
    ctx = LaunchContext(model=_model(model), max_model_len=max_model_len, max_prompt_tokens=max_prompt_tokens,
                        max_new_tokens=max_new_tokens, block_size=block_size, tp=tp,
                        save_dir=None if save_dir is None else str(save_dir))
    out = profile_of(setting).launch(setting, ctx)
    if not ctx.model.hf_id and out.argv:
        out = Launch(argv=out.argv, files=out.files, text=out.text,
                     notes=(*out.notes, f"{ctx.model.name} has no Hugging Face id: put your checkpoint path "
                                        f"in place of {ctx.model.name}"))
    if ctx.model.weight_dtype == "int4" and out.argv:
        out = Launch(argv=out.argv, files=out.files, text=out.text,
                     notes=(*out.notes, f"INT4 weights load from an AWQ or GPTQ checkpoint: give its id or path in "
                                        f"place of {ctx.checkpoint}"))
    return out


def command_line(setting: Setting, **kw: Any) -> str:
    """:func:`launch`'s command as one line."""
    return launch(setting, **kw).command


def write_files(launch_: Launch, save_dir: str | Path) -> list[Path]:
    """Write the config files ``launch_`` names into ``save_dir`` (created); the paths written."""
    folder = Path(save_dir)
    if not launch_.files:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in launch_.files.items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


def client_note(setting: Setting, *, max_new_tokens: int) -> str:
    """What clients must send for the simulation to hold (the output cap per request)."""
    return profile_of(setting).client_note(setting, max_new_tokens=max_new_tokens)


__all__ = ["OVERFLOW_MODES", "RESERVATION", "SYSTEMS", "Setting", "VERSION_FAMILY", "client_note", "command_line",
           "default_settings", "launch", "profile_of", "settings", "write_files"]
