"""The swap price: copying a sequence's KV pages to host memory and back, per GPU.

Each copy pays a fixed latency plus bytes / host-link bandwidth; how many copies a page takes
depends on the KV layout (``copy_mode``): vLLM v0 keeps one K and one V tensor per layer and
issues one ``cudaMemcpyAsync`` per page per tensor (``csrc/cache_kernels.cu: swap_blocks``), so
a page is 2 x layers small copies; a page-contiguous layout needs one copy per page; a batched
copy gathers every page into one transfer. Under tensor parallelism each GPU swaps its share of
the KV heads over its own host link, in parallel with the others.

The simulator charges :meth:`SwapModel.page_copy_s` per page swapped; the recompute-vs-swap
analysis (:mod:`kvlab.preemption_cost`) and the host-link fit (:mod:`kvlab.calibrate`) build on
the same model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _validate as v
from .reservation import pages_for
from .specs import GPUSpec, ModelSpec, gpu as _gpu, model as _model

COPY_MODES = ("per_layer_page", "per_page", "batched")
# Fixed cost of one host<->device copy: driver call plus DMA set-up (seconds). An assumption of
# the order measured for small pinned cudaMemcpyAsync calls; kvlab.calibrate.fit_host_link fits
# it from kvlab.measure's copy table.
DEFAULT_COPY_LATENCY_S = 5e-6


@dataclass(frozen=True, kw_only=True)
class SwapModel:
    """Per-GPU cost of swapping a sequence's KV pages to host memory and back.

    Build it with :func:`swap_model`.

    Parameters
    ----------
    kv_bytes_per_token : float
        KV bytes of one token on one GPU, all its layers, K and V (bytes/token).
    copies_per_page : int
        Copies needed to move one page one way (1, or 2 x layers for a per-layer layout).
    batched : bool
        All pages move in one transfer per direction (``copies_per_page`` is then unused).
    link_bytes_per_s : float
        Host-link bandwidth per direction (bytes/s).
    copy_latency_s : float
        Fixed cost of one copy (seconds).
    """

    model_name: str
    gpu_name: str
    tp: int
    copy_mode: str
    kv_bytes_per_token: float
    copies_per_page: int
    batched: bool
    link_bytes_per_s: float
    copy_latency_s: float

    def num_copies(self, seq_tokens: Any, block_size: int) -> np.ndarray:
        """Copies issued to move ``seq_tokens`` tokens one way (count per length)."""
        return self._num_copies(*_seq_and_block(seq_tokens, block_size))

    def swap_bytes(self, seq_tokens: Any, block_size: int) -> np.ndarray:
        """Bytes moved one way: whole pages, the partly filled last one included (bytes)."""
        return self._swap_bytes(*_seq_and_block(seq_tokens, block_size))

    def swap_s(self, seq_tokens: Any, block_size: int) -> np.ndarray:
        """Swap out and back in: twice the one-way copy time (seconds per length).

        One way costs ``num_copies x copy_latency_s + swap_bytes / link_bytes_per_s``.
        """
        return self._swap_s(*_seq_and_block(seq_tokens, block_size))

    def page_copy_s(self, block_size: int) -> float:
        """One full page moved one way (seconds): what the simulator charges per page swapped."""
        return float(self._swap_s(np.array([v.positive_int(block_size, "block_size")]), block_size)[0] / 2.0)

    # Unchecked versions for kvlab's own callers, which validated their inputs already.
    def _num_copies(self, seq: np.ndarray, block_size: int) -> np.ndarray:
        pages = pages_for(seq, block_size)
        return np.minimum(pages, 1) if self.batched else pages * self.copies_per_page

    def _swap_bytes(self, seq: np.ndarray, block_size: int) -> np.ndarray:
        return pages_for(seq, block_size) * (block_size * self.kv_bytes_per_token)

    def _swap_s(self, seq: np.ndarray, block_size: int) -> np.ndarray:
        return 2.0 * (self._num_copies(seq, block_size) * self.copy_latency_s
                      + self._swap_bytes(seq, block_size) / self.link_bytes_per_s)


def _seq_and_block(seq_tokens: Any, block_size: Any) -> tuple[np.ndarray, int]:
    return v.positive_int_array(seq_tokens, "seq_tokens"), v.positive_int(block_size, "block_size")


def swap_model(model: str | ModelSpec, gpu: str | GPUSpec, *, tp: int = 1, dtype_bytes: int | None = None,
               copy_mode: str = "per_page", link_bytes_per_s: float | None = None,
               copy_latency_s: float = DEFAULT_COPY_LATENCY_S) -> SwapModel:
    """The :class:`SwapModel` of ``model`` on ``gpu`` under tensor parallelism ``tp``.

    Parameters
    ----------
    dtype_bytes : int, optional
        Bytes of a cached element; default the model's KV precision (``kv_cache_dtype``).
    copy_mode : {"per_page", "per_layer_page", "batched"}
        ``per_page``: one copy per page (a page-contiguous layout; what ``kvlab.sim`` charges),
        ``per_layer_page``: one copy per page per layer for K and for V (vLLM v0's layout, the
        system of the vLLM paper's Fig. 19), ``batched``: one transfer per direction.
    link_bytes_per_s : float or None
        Host-link bandwidth per direction (bytes/s); ``None`` takes the GPU spec's nominal
        figure (e.g. PCIe Gen5 x16, 63e9), which pinned copies reach only in part.
    copy_latency_s : float
        Fixed cost of one copy (seconds).
    """
    m, g = _model(model), _gpu(gpu)
    tp = v.positive_int(tp, "tp")
    copy_mode = v.choice(copy_mode, "copy_mode", COPY_MODES)
    link = g.host_link_bytes_per_s if link_bytes_per_s is None \
        else v.positive_float(link_bytes_per_s, "link_bytes_per_s")
    copy_latency_s = v.nonnegative_float(copy_latency_s, "copy_latency_s")
    return SwapModel(
        model_name=m.name, gpu_name=g.name, tp=tp, copy_mode=copy_mode,
        kv_bytes_per_token=float(m.kv_bytes_per_token(tp=tp, dtype_bytes=dtype_bytes)),
        copies_per_page=m.kv_tensors_per_layer * m.num_layers if copy_mode == "per_layer_page" else 1,
        batched=copy_mode == "batched", link_bytes_per_s=link, copy_latency_s=copy_latency_s)


__all__ = ["COPY_MODES", "DEFAULT_COPY_LATENCY_S", "SwapModel", "swap_model"]
