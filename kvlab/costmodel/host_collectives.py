"""Collectives measured between the GPUs of one host, with and without GPU peer-to-peer.

How fast two GPUs of a PCIe host all-reduce depends on the host as much as on the GPUs: with
peer-to-peer (P2P) access NCCL moves data GPU to GPU over PCIe; where the host blocks it (PCIe
Access Control Services or an IOMMU on, as many servers ship, or a VM) NCCL stages it through host
memory, at about half the speed. vLLM's custom all-reduce needs P2P as well
(``vllm/distributed/device_communicators/custom_all_reduce.py``, ``_can_p2p``).

LLMServingSim's profiler measured both on its pair of RTX PRO 6000 Blackwell Server Edition cards
(casys-kaist/LLMServingSim, ``profiler/perf/RTXPRO6000/hardware.yaml``: NCCL all-reduce, all-gather
and reduce-scatter through vLLM's ``PyNcclCommunicator``, replayed from CUDA graphs, BF16):

* commit e08dc38 (measured 2026-09-08): 16.2 us at 10 KiB, 90.6 us at 1.25 MiB, 1,309 us at 20 MiB;
* commit 1b2cc02 (measured 2026-09-26, ``host_configuration``: ACS and IOMMU disabled): 12.9 us,
  47.5 us and 587 us.

The second file records that the operator had just disabled ACS and the IOMMU; the first records no
host configuration and measures half the bandwidth, the signature of NCCL's host-memory path.

kvlab ships the all-reduce and all-gather rows (the all-gather of two GPUs is one send each way of
the per-GPU chunk, so it stands for a send/recv between them) as
``data/costmodels/host_collectives.csv``: ``gpu``, ``p2p`` (whether GPU peer-to-peer ran),
``collective``, ``num_gpus``, ``message_bytes``, ``time_s``, ``measured_at``. :func:`rows` reads it;
:func:`curve_rows` gives them in :func:`kvlab.costmodel.fit.collective_curves`' columns, one
network per GPU and host configuration (:func:`network_name`). ``python -m
kvlab.costmodel.host_collectives --p2p FILE --no-p2p FILE`` rewrites it from ``hardware.yaml`` files
(each file's host configuration stated on the command line: a file records it only when the operator did).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .. import _validate as v
from .._paths import DATA_DIR
from ..specs import gpu as _gpu
from .data import shipped_table, write_csv_atomically

PATH = DATA_DIR / "costmodels" / "host_collectives.csv"
REMAKE = "python -m kvlab.costmodel.host_collectives --p2p FILE --no-p2p FILE"
COLUMNS = ("gpu", "p2p", "collective", "num_gpus", "message_bytes", "time_s", "measured_at")
#: The collectives kept: TP's all-reduce, and the all-gather that stands for a send between two GPUs.
KEPT = ("all_reduce", "all_gather")


def network_name(gpu: str, p2p: bool) -> str:
    """The network key of ``gpu``'s measured host collectives (``rtxpro6000_p2p``, ``rtxpro6000_no_p2p``)."""
    return f"{gpu.lower()}_{'p2p' if p2p else 'no_p2p'}"


def read_hardware(path: str | os.PathLike, *, p2p: bool) -> pd.DataFrame:
    """One ``hardware.yaml`` reduced to the shipped rows (:data:`COLUMNS`; times from the CUDA-graph
    replays, ``us_graphed``, else ``us``). ``ValueError`` names the file and what is missing or wrong."""
    where = f"hardware file {os.fspath(path)}"
    data = v.yaml_data(v.read_text_file(os.fspath(path), "hardware file", max_bytes=1 << 24), where)
    try:
        name = data["spec"]["gpu_name"]
        measured = data["measured"]
        inter = measured["interconnect"]
        samples, npus = inter["samples"], int(inter["npus"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: expected spec.gpu_name and measured.interconnect.npus and .samples "
                         f"(LLMServingSim's hardware.yaml); missing {exc}") from None
    try:
        gpu = _gpu(str(name)).name
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    out = []
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or s.get("collective") not in KEPT:
            continue
        t = s.get("us_graphed", s.get("us"))
        b = s.get("bytes")
        if not isinstance(t, (int, float)) or not isinstance(b, (int, float)) or not t > 0 or not b > 0:
            raise ValueError(f"{where}: sample {i} ({s.get('collective')}) needs positive bytes and us_graphed, "
                             f"got bytes={b!r}, us_graphed={t!r}")
        out.append({"gpu": gpu, "p2p": bool(p2p), "collective": s["collective"], "num_gpus": npus,
                    "message_bytes": int(b), "time_s": float(t) * 1e-6, "measured_at": str(measured.get("at", ""))})
    if not out:
        raise ValueError(f"{where}: no {' or '.join(KEPT)} sample")
    return pd.DataFrame(out)[list(COLUMNS)]


def rows(path: str | os.PathLike = PATH) -> pd.DataFrame:
    """The shipped rows (:data:`COLUMNS`)."""
    table = shipped_table(path, COLUMNS, REMAKE)
    return table.assign(p2p=table["p2p"].astype(str).str.lower() == "true")


def curve_rows(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s rows as :func:`kvlab.costmodel.data.vidur_collectives` gives Vidur's: ``network``
    (:func:`network_name`), ``collective`` (``all_reduce``; a two-GPU ``all_gather`` as ``send_recv``:
    each GPU sends its chunk once), ``num_gpus``, ``message_bytes``, ``time_s``."""
    keep = (table["collective"] == "all_reduce") | ((table["collective"] == "all_gather") & (table["num_gpus"] == 2))
    t = table[keep]
    return pd.DataFrame({"network": [network_name(g, bool(p)) for g, p in zip(t["gpu"], t["p2p"])],
                         "collective": np.where(t["collective"] == "all_gather", "send_recv", "all_reduce"),
                         "num_gpus": t["num_gpus"].astype(int).to_numpy(),
                         "message_bytes": t["message_bytes"].astype(np.float64).to_numpy(),
                         "time_s": t["time_s"].astype(np.float64).to_numpy()})


def write(p2p_files: list[str | os.PathLike], no_p2p_files: list[str | os.PathLike], path: Path = PATH) -> None:
    """Read the files (each with its host configuration) and write the shipped table atomically."""
    parts = [read_hardware(f, p2p=True) for f in p2p_files] + [read_hardware(f, p2p=False) for f in no_p2p_files]
    if not parts:
        raise ValueError(f"no hardware file given (usage: {REMAKE})")
    table = pd.concat(parts, ignore_index=True).sort_values(["gpu", "p2p", "collective", "num_gpus", "message_bytes"])
    write_csv_atomically(table, path)


if __name__ == "__main__":  # python -m kvlab.costmodel.host_collectives --p2p FILE --no-p2p FILE
    ap = argparse.ArgumentParser(prog="python -m kvlab.costmodel.host_collectives",
                                 description="Rewrite data/costmodels/host_collectives.csv from LLMServingSim "
                                             "hardware.yaml files.")
    ap.add_argument("--p2p", action="append", default=[], metavar="FILE", help="measured with GPU peer-to-peer")
    ap.add_argument("--no-p2p", action="append", default=[], metavar="FILE",
                    help="measured with peer-to-peer blocked (through host memory)")
    args = ap.parse_args()
    write(args.p2p, args.no_p2p)
    print(f"wrote {PATH}")
