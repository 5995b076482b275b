"""Pipeline parallelism: the iteration time a request sees when the model is split into stages.

Model (the level Sarathi-Serve's Falcon-180B TP4-PP2 set-up needs; stated, not hidden)
---------------------------------------------------------------------------------------
* The model's layers are split over ``pp`` stages of ``tp`` GPUs each;
  :func:`kvlab.costmodel.roofline` with ``pp`` prices one stage (layers / PP, weights and KV of
  one stage per GPU).
* The scheduler keeps ``pp`` micro-batches in flight (vLLM's virtual engines, Sarathi-Serve's
  pipeline scheduler): a request belongs to one micro-batch, and that micro-batch's next
  iteration can start only when it has left the last stage. With ``pp`` micro-batches of equal
  work, the cycle of one micro-batch is ``pp x (stage time + send)``, where ``send`` moves the
  micro-batch's activations (``tokens x hidden x dtype bytes``) to the next stage over the
  GPU interconnect plus a fixed latency. Every stage is busy all the time: no bubble.
* So the serving system behaves as ``pp`` independent engines, each holding ``1 / pp`` of the
  traffic and of the KV pool, each iteration lasting the cycle above.
  :func:`pipeline_cost` builds that cycle's cost model, and :func:`kvlab.capacity.capacity`
  runs one such engine at ``qps / pp`` and reports the system's rate.
* NOT modelled: bubbles from micro-batches of unequal work. With ``pp`` micro-batches of
  stage times ``t_1 .. t_pp`` the cycle is ``pp x max(t_i)`` (every stage waits for the slowest
  one), not ``pp x`` one micro-batch's own time. A prefill-first scheduler, whose micro-batches
  alternate between long prefills and short decodes, loses the most to these bubbles (the
  effect Sarathi-Serve's uniform chunks remove), so kvlab's prefill-first capacity under PP is
  an upper bound and its chunked-vs-prefill-first gain a lower bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _validate as v
from .costmodel import CostModel, roofline
from .specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model


@dataclass(frozen=True, kw_only=True)
class PipelineCostModel:
    """The cycle time of one of ``pp`` micro-batches in flight (see the module note).

    Has the :class:`kvlab.costmodel.CostModel` interface the simulator calls
    (``iteration_s``). Build it with :func:`pipeline_cost`.

    Attributes
    ----------
    stage : CostModel
        One stage (``pp`` set, so layers, weights and KV are one stage's share per GPU).
    pp : int
        Pipeline stages (>= 1).
    activation_bytes_per_token : float
        Bytes of one token's activations sent from one stage to the next (hidden x dtype bytes).
    send_latency_s : float
        Fixed latency of one stage-to-stage send (seconds).
    interconnect_bytes_per_s : float
        Bandwidth of a stage-to-stage send (bytes/s).
    """

    stage: CostModel
    pp: int
    activation_bytes_per_token: float
    send_latency_s: float
    interconnect_bytes_per_s: float

    def send_s(self, num_tokens: Any) -> Any:
        """Time to send one micro-batch's activations to the next stage (seconds)."""
        return self.send_latency_s + self.activation_bytes_per_token * num_tokens / self.interconnect_bytes_per_s

    def iteration_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any) -> Any:
        """Cycle time of a micro-batch with this work: ``pp x (stage time + send)`` (seconds).

        Arguments as :meth:`kvlab.costmodel.CostModel.iteration_s` (whole-model token counts;
        the stage model already holds one stage's share of the layers).
        """
        return self.pp * (self.stage.iteration_s(num_tokens, attention_pairs, kv_tokens) + self.send_s(num_tokens))


def pipeline_cost(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
                  dtype_bytes: int = 2, send_latency_s: float = 10e-6,
                  **roofline_kw: Any) -> CostModel | PipelineCostModel:
    """The cost model of ``model`` on ``tp x pp`` GPUs of type ``gpu``.

    ``pp = 1`` returns :func:`kvlab.costmodel.roofline` itself (no pipeline, nothing added);
    ``pp > 1`` wraps the roofline of one stage in a :class:`PipelineCostModel`.

    Parameters
    ----------
    model, gpu : str or spec
        Model and GPU (:mod:`kvlab.specs`).
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages.
    dtype_bytes : int
        Bytes per activation and weight element.
    send_latency_s : float
        Fixed latency of one stage-to-stage send (seconds).
    **roofline_kw
        Passed to :func:`kvlab.costmodel.roofline` (efficiencies, overheads).

    Examples
    --------
    >>> c = pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2)
    >>> round(float(c.iteration_s(1, 100, 100)) / float(c.stage.iteration_s(1, 100, 100)), 2)
    2.0
    """
    m, g = _model(model), _gpu(gpu)
    pp = v.positive_int(pp, "pp")
    stage = roofline(m, g, tp=tp, pp=pp, dtype_bytes=dtype_bytes, **roofline_kw)
    if pp == 1:
        return stage
    return PipelineCostModel(stage=stage, pp=pp,
                             activation_bytes_per_token=float(m.hidden_size * v.positive_int(dtype_bytes,
                                                                                              "dtype_bytes")),
                             send_latency_s=v.nonnegative_float(send_latency_s, "send_latency_s"),
                             interconnect_bytes_per_s=g.interconnect_bytes_per_s)
