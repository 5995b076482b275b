"""Pipeline parallelism: the cycle of a micro-batch when the model is split into stages.

Model (the level Sarathi-Serve's Falcon-180B TP4-PP2 set-up needs; stated, not hidden)
---------------------------------------------------------------------------------------
* The model's layers are split over ``pp`` stages of ``tp`` GPUs each; the stage cost model
  (:func:`kvlab.costmodel.roofline` with ``pp``, or any model with ``iteration_s``) prices one
  stage (layers / PP, weights and KV of one stage per GPU).
* A stage's time for a micro-batch is its compute plus the send of the micro-batch's
  activations (``tokens x hidden x dtype bytes``) to the next stage over the stage link: the GPU
  interconnect when the stages share a node, a network link when they do not (the Falcon-180B
  set-up spans two nodes: the catalogue's ``internode`` link of the GPU, :data:`STAGE_LINKS`).
* The scheduler keeps ``pp`` micro-batches in flight (vLLM's virtual engines, Sarathi-Serve's
  pipeline scheduler), each with its own requests, visited round-robin by every stage. With
  stage times ``t_1 .. t_pp`` the steady-state cycle of every micro-batch is
  ``pp x max(t_i)`` (:func:`cycle_s`; :func:`pipeline_schedule` simulates the stages to show
  it): each stage waits for the slowest micro-batch, so a short decode micro-batch in flight
  with a long prefill idles ``pp x (max - own)``, the bubble. With equal micro-batches there is
  no bubble.
* kvlab serves the pipeline as ``pp`` engines, each with ``1 / pp`` of the traffic and of the
  KV pool, simulated one at a time (the engines stay unchanged; this is done outside them). An
  engine's cycle needs the stage times of the ``pp - 1`` other micro-batches in flight, which
  are the other engines' iterations; kvlab takes them as independent draws from the stage times
  of the engine's own run, a mean-field approximation: :meth:`PipelineCostModel.with_peers`
  prices each iteration at ``pp x E[max(own, X_1 .. X_{pp-1})]`` over that empirical
  distribution (idle rounds count as empty micro-batches of time 0), and
  :func:`kvlab.capacity.serve` runs each trial twice, first without bubbles to get the stage
  times, then with them. What this leaves out: correlation between the micro-batches in flight
  (a burst of arrivals reaches every engine at once), and the second pass's own change of the
  stage-time distribution (one fixed-point step only).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import _validate as v
from ..backend import array_namespace
from .roofline import roofline
from ..specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model

#: Stage links: ``"in-node"`` (the GPU interconnect) or ``"internode"`` (the GPU's share of its
#: node's network, :attr:`kvlab.specs.GPUSpec.internode_bytes_per_s`), with a latency per send
#: (seconds; assumed: 10 us over NVLink/PCIe, 30 us over a network).
STAGE_LINKS = ("in-node", "internode")
SEND_LATENCY_S = {"in-node": 10e-6, "internode": 30e-6}


@dataclass(frozen=True, kw_only=True)
class PipelineCostModel:
    """The cycle time of one of ``pp`` micro-batches in flight (see the module note).

    Has the :class:`kvlab.costmodel.CostModel` interface the simulator calls
    (``iteration_s``). Build it with :func:`pipeline_cost`.

    Attributes
    ----------
    stage : CostModel
        One stage (``pp`` set, so layers, weights and KV are one stage's share per GPU); any
        object with ``iteration_s``.
    pp : int
        Pipeline stages (>= 1).
    activation_bytes_per_token : float
        Bytes of one token's activations sent from one stage to the next (hidden x dtype bytes).
    send_latency_s : float
        Fixed latency of one stage-to-stage send (seconds).
    link_bytes_per_s : float
        Bandwidth of a stage-to-stage send (bytes/s).
    link : str
        Name of the stage link (one of :data:`STAGE_LINKS`).
    peer_stage_s : ndarray, optional
        Sorted stage times (seconds) the other micro-batches in flight are drawn from; None:
        they equal this one's (no bubble). Set with :meth:`with_peers`.
    """

    stage: Any
    pp: int
    activation_bytes_per_token: float
    send_latency_s: float
    link_bytes_per_s: float
    link: str = "in-node"
    peer_stage_s: np.ndarray | None = field(default=None, compare=False, repr=False)
    peer_table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)

    def send_s(self, num_tokens: Any) -> Any:
        """Time to send one micro-batch's activations to the next stage (seconds)."""
        return self.send_latency_s + self.activation_bytes_per_token * num_tokens / self.link_bytes_per_s

    @property
    def label(self) -> str:
        """The stage model's name, with the pipeline (recorded by results)."""
        return f"{getattr(self.stage, 'label', type(self.stage).__name__)}, PP{self.pp} pipeline ({self.link})"

    @property
    def model_name(self) -> str:
        return self.stage.model_name

    @property
    def gpu_name(self) -> str:
        return self.stage.gpu_name

    @property
    def tp(self) -> int:
        return self.stage.tp

    def stage_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any = 1) -> Any:
        """One stage's time for a micro-batch with this work: compute + send (seconds)."""
        return self.stage.iteration_s(num_tokens, attention_pairs, kv_tokens, num_seqs) + self.send_s(num_tokens)

    def iteration_s(self, num_tokens: Any, attention_pairs: Any, kv_tokens: Any, num_seqs: Any = 1) -> Any:
        """Cycle time of a micro-batch with this work (seconds).

        ``pp x stage time`` without peers; ``pp x E[max(stage time, pp - 1 peer draws)]`` with
        them (:meth:`with_peers`). Arguments as :meth:`kvlab.costmodel.CostModel.iteration_s`
        (whole-model token counts; the stage model already holds one stage's share of the layers).
        """
        own = self.stage_s(num_tokens, attention_pairs, kv_tokens, num_seqs)
        if self.peer_stage_s is None or self.pp == 1:
            return self.pp * own
        return self.pp * expected_max_s(own, self.peer_stage_s, self.pp - 1, table=self.peer_table)

    def with_peers(self, stage_times_s: Any, *, idle_rounds: float = 0.0) -> PipelineCostModel:
        """This model with the other micro-batches' stage times drawn from ``stage_times_s``.

        Parameters
        ----------
        stage_times_s : array of float
            Stage times (seconds) of the micro-batches of a run, one per iteration.
        idle_rounds : float
            Rounds in which an engine had nothing to run (empty micro-batches, time 0), added
            to the distribution with that weight (rounded to whole rounds).
        """
        times = np.asarray(stage_times_s, dtype=np.float64).ravel()
        if times.size == 0 or not np.all(np.isfinite(times)) or np.any(times < 0):
            raise ValueError("stage_times_s must be a non-empty array of finite times >= 0 (seconds)")
        idle = int(round(v.nonnegative_float(idle_rounds, "idle_rounds")))
        peers = np.sort(np.concatenate([np.zeros(idle), times]))
        return replace(self, peer_stage_s=peers, peer_table=max_table(peers, self.pp - 1))


def max_table(peers_s: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`expected_max_s` needs of a sample, computed once: sorted sample, ``F^k``, tail sums.

    For the sorted sample ``x_(1..n)``: ``F(x_(j))^k = (j / n)^k`` (j = 0..n) and
    ``tail[i] = sum over j > i of x_(j) (F(x_(j))^k - F(x_(j-1))^k)`` (i = 0..n).
    """
    x = np.sort(np.asarray(peers_s, dtype=np.float64).ravel())
    n = x.size
    cdf_k = (np.arange(n + 1) / n) ** k
    tail = np.concatenate([np.cumsum((x * np.diff(cdf_k))[::-1])[::-1], [0.0]])
    return x, cdf_k, tail


def expected_max_s(own_s: Any, peers_s: Any, k: int, *, table: tuple[np.ndarray, ...] | None = None) -> Any:
    """``E[max(own, X_1 .. X_k)]`` with ``X_i`` independent draws from the sample ``peers_s`` (seconds).

    ``own F(own)^k + sum over sample points x_(j) > own of x_(j) P(max of k draws = x_(j))``,
    with ``F`` the empirical distribution of the sample; ``own_s`` scalar or array (NumPy or
    CuPy). ``table`` is :func:`max_table` of the sample, when already computed.
    """
    x, cdf_k, tail = table if table is not None else max_table(peers_s, k)
    if not hasattr(own_s, "shape"):
        i = int(np.searchsorted(x, float(own_s), side="right"))
        return float(own_s) * float(cdf_k[i]) + float(tail[i])
    xp = array_namespace(own_s)
    idx = xp.searchsorted(xp.asarray(x), xp.asarray(own_s, dtype=xp.float64), side="right")
    return own_s * xp.asarray(cdf_k)[idx] + xp.asarray(tail)[idx]


def cycle_s(stage_s: Any, pp: int) -> float:
    """Steady-state cycle of ``pp`` micro-batches in flight with stage times ``stage_s`` (seconds).

    ``pp x max(stage_s)``: every stage serves the micro-batches round-robin, so each waits for
    the slowest (:func:`pipeline_schedule` simulates it).
    """
    t = np.asarray(stage_s, dtype=np.float64)
    pp = v.positive_int(pp, "pp")
    if t.shape != (pp,) or np.any(t < 0):
        raise ValueError(f"stage_s must hold pp = {pp} stage times >= 0 (seconds), got {t.tolist()}")
    return float(pp * t.max())


def pipeline_schedule(stage_s: Any, num_rounds: int) -> np.ndarray:
    """When each micro-batch enters the first stage, round by round, with stages served round-robin.

    ``pp = len(stage_s)`` stages and micro-batches; micro-batch ``i`` takes ``stage_s[i]`` at every
    stage. Stage ``s`` processes micro-batch ``i`` of round ``r`` once it has left stage ``s - 1``
    (stage ``pp - 1`` of round ``r - 1`` for the first stage) and stage ``s`` has finished the
    micro-batch before it. Returns the ``(num_rounds, pp)`` start times at the first stage
    (seconds); their spacing per micro-batch is its cycle.
    """
    t = np.asarray(stage_s, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or np.any(t < 0):
        raise ValueError("stage_s must be a 1-D array of stage times >= 0 (seconds)")
    num_rounds = v.positive_int(num_rounds, "num_rounds")
    pp = t.size
    stage_free = np.zeros(pp)      # when each stage finishes its last micro-batch
    done = np.zeros(pp)            # when each micro-batch left the last stage
    starts = np.zeros((num_rounds, pp))
    for r in range(num_rounds):
        for i in range(pp):
            ready = done[i]
            for s in range(pp):
                begin = max(ready, stage_free[s])
                if s == 0:
                    starts[r, i] = begin
                ready = stage_free[s] = begin + t[i]
            done[i] = ready
    return starts


def pipeline_cost(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, pp: int = 1,
                  dtype_bytes: int = 2, stage_cost: Any = None, link: str = "in-node",
                  send_latency_s: float | None = None, **roofline_kw: Any) -> Any:
    """The cost model of ``model`` on ``tp x pp`` GPUs of type ``gpu``.

    ``pp = 1`` returns the stage model itself (no pipeline, nothing added); ``pp > 1`` wraps it
    in a :class:`PipelineCostModel` (without peers: equal micro-batches, no bubble).

    Parameters
    ----------
    model, gpu : str or spec
        Model and GPU (:mod:`kvlab.specs`).
    tp, pp : int
        Tensor-parallel GPUs per stage and pipeline stages.
    dtype_bytes : int
        Bytes per activation and weight element.
    stage_cost : cost model, optional
        One stage's cost model (``iteration_s``); default :func:`kvlab.costmodel.roofline` with
        ``tp``, ``pp`` and ``roofline_kw``.
    link : {"in-node", "internode"}
        Stage link: the GPU interconnect, or the GPU's share of the node's network when the
        stages are on different nodes (:attr:`kvlab.specs.GPUSpec.internode_bytes_per_s`);
        latency per send from :data:`SEND_LATENCY_S`.
    send_latency_s : float, optional
        Overrides the link's latency per send (seconds).
    **roofline_kw
        Passed to :func:`kvlab.costmodel.roofline` (efficiencies, overheads).

    Examples
    --------
    >>> c = pipeline_cost("Falcon-180B", "A100-80GB-PCIe", tp=4, pp=2)
    >>> round(float(c.iteration_s(1, 100, 100)) / float(c.stage_s(1, 100, 100)), 2)
    2.0
    """
    m, g = _model(model), _gpu(gpu)
    pp = v.positive_int(pp, "pp")
    stage = roofline(m, g, tp=tp, pp=pp, dtype_bytes=dtype_bytes, **roofline_kw) if stage_cost is None else stage_cost
    if stage_cost is not None and not callable(getattr(stage_cost, "iteration_s", None)):
        raise ValueError(f"stage_cost must be a cost model with iteration_s, got {type(stage_cost).__name__}")
    if pp == 1:
        return stage
    link = v.choice(link, "link", STAGE_LINKS)
    link_bytes_per_s = g.peer_bytes_per_s if link == "in-node" else g.internode_bytes_per_s
    latency_s = SEND_LATENCY_S[link]
    if send_latency_s is not None:
        latency_s = v.nonnegative_float(send_latency_s, "send_latency_s")
    return PipelineCostModel(stage=stage, pp=pp, link=link,
                             activation_bytes_per_token=float(m.hidden_size * v.positive_int(dtype_bytes,
                                                                                              "dtype_bytes")),
                             send_latency_s=latency_s, link_bytes_per_s=link_bytes_per_s)
