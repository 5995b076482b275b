"""Iteration-time models: what one serving iteration costs on a GPU.

Two named models share one interface, ``iteration_s(num_tokens, attention_pairs, kv_tokens,
num_seqs=1)`` (aggregates over the batch, NumPy or CuPy arrays):

* :func:`roofline` (:mod:`.roofline`): spec-sheet peak FLOP/s and HBM bandwidth with assumed
  efficiencies; any GPU of the catalogue;
* :func:`measured` (:mod:`.measured`): curves fitted (:mod:`.fit`) to public GPU measurements
  (Vidur's per-operation profiles and collective curves, Sarathi-Serve's measured batches); the
  GPUs of :func:`measured_gpus`, extrapolated by spec ratios to every other catalogue GPU.

:func:`cost_model` picks one by name (default: measured where the GPU has measurements, else the
roofline) and wraps it for pipeline parallelism; :func:`resolve` turns what a user passes as
``cost_model=`` ("measured", "roofline", a cost-model file or shipped stack name, a model object
or None) into a model; :func:`describe` gives the readable name every result records. A serving
stack (:mod:`.stacks`: per-iteration and per-sequence CPU overheads and a GPU-time scale fitted to
real servers, ``"vllm-v0"``, ``"vllm-v1"``, or a user's ``kvlab calibrate`` file) adds to either model.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import _validate as v
from ..specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model
from .measured import (MeasuredCostModel, check_kernels, constants as _constants, measured, measured_gpus, send_recv,
                       unsupported)
from .roofline import CostModel, prefill_attention_pairs, roofline
from . import stacks as _stacks

SOURCES = ("measured", "roofline")


def cost_model(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
               source: str | None = None, stack: str = "none", link: str = "in-node", ep: int = 1,
               kernels: str | None = None, split_attention: bool = False) -> Any:
    """The iteration-time model of ``model`` on ``tp x pp`` GPUs of type ``gpu``.

    Parameters
    ----------
    model, gpu : str or spec
        Model and GPU (:mod:`kvlab.specs`).
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages. ``pp > 1`` returns a
        :class:`kvlab.costmodel.pipeline.PipelineCostModel` around one stage's model
        (:func:`kvlab.costmodel.pipeline.pipeline_cost`); in-node sends are priced by the same source: the
        measured send/recv curve, or the interconnect's spec bandwidth.
    source : {"measured", "roofline"} or None
        ``None`` (default): the measured model (extrapolated from the nearest measured GPU where
        ``gpu`` has no measurements, labelled so; MLA and mixture-of-experts models included); where
        it cannot price the pair (no constants file) the roofline, and its ``label`` says why.
    stack : str
        Serving stack whose CPU overheads the measured model adds (:func:`measured`): ``"none"``
        (default, GPU time only: what a stack that hides its CPU work, such as vLLM V1 with CUDA
        graphs, approaches), ``"sarathi-serve"`` (the overheads fitted to Sarathi-Serve's 2023
        batches, for reproducing that paper's set-up), a fitted stack of :mod:`.stacks`
        (``"vllm-v0"``, ``"vllm-v1"``) or the path of a cost-model file (``kvlab calibrate``).
    link : str
        Stage link under PP (:func:`kvlab.costmodel.pipeline.pipeline_cost`).
    ep : int
        Expert-parallel degree of a mixture of experts (the measured model; the roofline ignores it).
    kernels : str or None
        The measured model's kernel era (:mod:`.measured`): None (default) for today's engines'
        measured kernels, or the era the stack states (``"vllm-v0"`` and ``"sarathi-serve"``: ``"2024"``,
        Vidur's profiles); ``"2024"`` asks for it.
    split_attention : bool
        The server runs a mixed batch's prefill and decode attention as separate kernels (TensorRT-LLM):
        the measured model drops vLLM's FA2 mixed-batch term (:func:`.measured.build`).

    Returns
    -------
    object with ``iteration_s`` and ``label``

    Examples
    --------
    >>> cost_model("Llama-3-8B", "H200", source="roofline").label
    'roofline (spec sheet)'
    """
    m, g = _model(model), _gpu(gpu)
    tp, pp = v.positive_int(tp, "tp"), v.positive_int(pp, "pp")
    if source is not None:
        v.choice(source, "source", SOURCES)
    check_kernels(kernels)
    known_stacks = ["none", *_constants().get("stacks", {}), *_stacks.named_stacks()]
    if stack not in known_stacks and not _stacks.is_cost_model_file(stack):
        raise ValueError(f"unknown stack {stack!r}: known are {', '.join(known_stacks)} "
                         "(or a cost-model file path ending in .json)")
    if _stacks.is_cost_model_file(stack):  # a fitted stack (kvlab.costmodel.stacks) on the stack-free model
        terms = _stacks.load(stack)
        base = cost_model(m, g, tp=tp, pp=1, source=source or terms.base, link=link, ep=ep,
                          kernels=kernels or terms.kernels, split_attention=split_attention)
        stage = _stacks.apply(base, terms)
        if pp == 1:
            return stage
        from .pipeline import pipeline_cost
        return pipeline_cost(m, g, tp=tp, pp=pp, stage_cost=stage, link=link)
    why = None if source == "roofline" else unsupported(m, g, tp=tp)
    use_measured = source != "roofline" and why is None
    if use_measured:
        stage = measured(m, g, tp=tp, pp=pp, stack=stack, ep=ep, kernels=kernels, split_attention=split_attention)
    else:
        stage = roofline(m, g, tp=tp, pp=pp, label="roofline (spec sheet)" if why is None
                         else f"roofline (spec sheet; {why})")
    if pp == 1:
        return stage
    from .pipeline import pipeline_cost  # the pipeline wraps this package's models
    if use_measured and link == "in-node":
        latency_s, bytes_per_s = send_recv(g)
        return replace(pipeline_cost(m, g, tp=tp, pp=pp, stage_cost=stage, link=link),
                       send_latency_s=latency_s, link_bytes_per_s=bytes_per_s)
    return pipeline_cost(m, g, tp=tp, pp=pp, stage_cost=stage, link=link)


def resolve(cost: Any, model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
            link: str = "in-node", stack: str | None = None, kernels: str | None = None,
            split_attention: bool = False) -> Any:
    """The model a ``cost_model=`` argument names: ``None``, ``"measured"``, ``"roofline"``, a
    cost-model file (a path ending in ``.json``, or a shipped stack's name: :mod:`.stacks`) or an object.

    ``None`` is :func:`cost_model`'s default (measured where the GPU has measurements); an object
    must have ``iteration_s`` and is returned as is (its kernels are its own). ``stack`` adds a stack to
    a named source; ``kernels`` and ``split_attention`` are :func:`cost_model`'s, for a named source or file.
    """
    if isinstance(cost, str) and _stacks.is_cost_model_file(cost):
        if stack not in (None, "none"):
            raise ValueError(f"cost_model {cost!r} is a cost-model file with its own stack; "
                             f"stack={stack!r} cannot be added to it")
        return cost_model(model, gpu, tp=tp, pp=pp, stack=cost, link=link, kernels=kernels,
                          split_attention=split_attention)
    if cost is None or isinstance(cost, str):
        if isinstance(cost, str) and cost not in SOURCES:
            raise ValueError(f"cost_model must be one of {', '.join(SOURCES)}, a cost-model file (.json or one "
                             f"of {', '.join(_stacks.named_stacks()) or 'none shipped'}), a cost model object "
                             f"or None, got {cost!r}")
        return cost_model(model, gpu, tp=tp, pp=pp, source=cost, link=link, stack=stack or "none", kernels=kernels,
                          split_attention=split_attention)
    if stack not in (None, "none"):
        raise ValueError(f"stack={stack!r} cannot be added to a cost model object; pass a named source or file")
    if not callable(getattr(cost, "iteration_s", None)):
        raise ValueError(f"cost_model must be 'measured', 'roofline', None or a kvlab.costmodel model "
                         f"(anything with iteration_s), got {type(cost).__name__}")
    return cost


def describe(cost: Any) -> str:
    """The readable name of a cost model, as results record it (its ``label``, else its type)."""
    return str(getattr(cost, "label", None) or type(cost).__name__)


__all__ = ["CostModel", "MeasuredCostModel", "SOURCES", "cost_model", "describe", "measured", "measured_gpus",
           "prefill_attention_pairs", "resolve", "roofline", "send_recv", "unsupported"]
