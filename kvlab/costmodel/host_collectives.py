"""Collectives measured between the GPUs of one host, with and without GPU peer-to-peer.

How fast two GPUs of a PCIe host all-reduce depends on the host and on the serving engine as much
as on the GPUs. With peer-to-peer (P2P) access NCCL moves data GPU to GPU over PCIe; where the host
blocks it (PCIe Access Control Services or an IOMMU on, as many servers ship, or a VM) NCCL stages
it through host memory, at about half the speed. vLLM's TP all-reduce is its own custom all-reduce
where P2P works (``vllm/distributed/device_communicators/custom_all_reduce.py``, ``_can_p2p``; it
reads the peer's buffer over PCIe) and NCCL where it does not.

Measured on pairs of RTX PRO 6000 Blackwell Server Edition cards (BF16, CUDA-graph replays):

* LLMServingSim's host (casys-kaist/LLMServingSim, ``profiler/perf/RTXPRO6000/hardware.yaml``,
  NCCL through vLLM's ``PyNcclCommunicator``): at commit e08dc38 (measured 2026-09-08, no host
  configuration recorded) 16.2 us at 10 KiB, 90.6 us at 1.25 MiB, 1,309 us at 20 MiB: host
  memory's path; at commit 1b2cc02 (measured 2026-09-26, ``host_configuration``: ACS and IOMMU
  disabled) 12.9, 47.5 and 587 us: P2P;
* NVIDIA's (ai-dynamo/aiconfigurator 095f58a, ``systems/data/rtx_pro_6000_server``): vLLM 0.19.0's
  own TP all-reduce (``comm/vllm/0.19.0/custom_allreduce_perf.parquet``, graph mode) 91.5 us at
  1 MiB and 1,118 us at 16 MiB, on a host whose NCCL runs at the P2P speed (``comm/nccl/2.29.2``:
  44.4 and 473 us): with P2P, vLLM's all-reduce costs about what NCCL costs without it.

kvlab ships them as ``data/costmodels/host_collectives.csv``: ``gpu``, ``p2p`` (whether the host let
its GPUs reach each other peer-to-peer), ``engine`` (``nccl``, or ``vllm``: the engine's own TP
all-reduce), ``collective`` (``all_reduce``; ``all_gather``, which between two GPUs is one send of
the per-GPU chunk each way), ``num_gpus``, ``message_bytes``, ``time_s``, ``source``. :func:`rows`
reads it; :func:`curve_rows` gives the NCCL rows in :func:`kvlab.costmodel.fit.collective_curves`'
columns, one network per GPU and host configuration (:func:`network_name`: an all-reduce, and a
send/recv from the all-gather), and :func:`engine_rows` the engine's own TP all-reduce, which kvlab
prices that GPU's TP all-reduce from where the host has P2P (:func:`kvlab.costmodel.fit.engine_all_reduce`).

The engine tables are NVIDIA's (ai-dynamo/aiconfigurator 095f58a, ``systems/data/<system>/comm/<engine>/
<release>/custom_allreduce_perf.parquet``, graph mode): each GPU's earliest vLLM release is fitted
(H100-SXM, H200, A100-SXM4-80GB and L40S at 0.14.0, B200 and the RTX PRO 6000 at 0.19.0) and prices
every server's TP all-reduce; the later vLLM releases and SGLang's and TensorRT-LLM's tables of the same
GPUs are shipped as ``host_collectives_check.csv`` (:func:`checks`) to check it against (a table that
repeats another's rows, as some release folders do, is left out).
``python -m kvlab.costmodel.host_collectives --p2p FILE --no-p2p FILE --engine-allreduce FILE``
rewrites it (each ``hardware.yaml``'s host configuration stated on the command line: a file records
it only when the operator did; an engine table is taken as measured with P2P, as its host's NCCL
speed says).
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
from .data import aiconfigurator_table, shipped_table, write_csv_atomically

PATH = DATA_DIR / "costmodels" / "host_collectives.csv"
CHECK_PATH = DATA_DIR / "costmodels" / "host_collectives_check.csv"
REMAKE = ("python -m kvlab.costmodel.host_collectives --p2p FILE --no-p2p FILE --engine-allreduce FILE "
          "--engine-check FILE")
COLUMNS = ("gpu", "p2p", "engine", "collective", "num_gpus", "message_bytes", "time_s", "source")
#: The collectives kept: TP's all-reduce, and the all-gather that stands for a send between two GPUs.
KEPT = ("all_reduce", "all_gather")
#: Message sizes kept from an engine's table (bytes): what a TP iteration's all-reduce moves.
ENGINE_BYTES = (4096, 2 ** 28)
ENGINE_COLUMNS = ("framework", "version", "device", "kernel_source", "allreduce_dtype", "num_gpus", "message_size",
                  "latency")


def network_name(gpu: str, p2p: bool) -> str:
    """The network key of ``gpu``'s measured host collectives (``rtxpro6000_p2p``, ``rtxpro6000_no_p2p``)."""
    return f"{gpu.lower()}_{'p2p' if p2p else 'no_p2p'}"


def _catalogue_gpu(name: str, where: str) -> str:
    try:
        return _gpu(str(name)).name
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def read_hardware(path: str | os.PathLike, *, p2p: bool) -> pd.DataFrame:
    """One LLMServingSim ``hardware.yaml`` (NCCL) reduced to the shipped rows (:data:`COLUMNS`; times
    from the CUDA-graph replays, ``us_graphed``, else ``us``). ``ValueError`` names the file and what is
    missing or wrong."""
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
    gpu = _catalogue_gpu(name, where)
    source = f"LLMServingSim hardware.yaml, NCCL, measured {measured.get('at', '(date not recorded)')}"
    out = []
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or s.get("collective") not in KEPT:
            continue
        t = s.get("us_graphed", s.get("us"))
        b = s.get("bytes")
        if not isinstance(t, (int, float)) or not isinstance(b, (int, float)) or not t > 0 or not b > 0:
            raise ValueError(f"{where}: sample {i} ({s.get('collective')}) needs positive bytes and us_graphed, "
                             f"got bytes={b!r}, us_graphed={t!r}")
        out.append({"gpu": gpu, "p2p": bool(p2p), "engine": "nccl", "collective": s["collective"], "num_gpus": npus,
                    "message_bytes": int(b), "time_s": float(t) * 1e-6, "source": source})
    if not out:
        raise ValueError(f"{where}: no {' or '.join(KEPT)} sample")
    return pd.DataFrame(out)[list(COLUMNS)]


def read_engine_allreduce(path: str | os.PathLike) -> pd.DataFrame:
    """An engine's own TP all-reduce (aiconfigurator's ``custom_allreduce_perf.parquet``: ``message_size``
    in BF16 elements, ``latency`` in ms) reduced to the shipped rows: graph mode (how a server replays
    it: the rows whose ``backend`` ends in ``graph``; a table without ``backend``, as TensorRT-LLM's, is
    one its collector timed as CUDA-graph replays), messages of :data:`ENGINE_BYTES`, taken as measured
    with P2P (its host's NCCL runs at the P2P speed). ``engine`` is the table's ``framework`` (``vllm``,
    ``sglang``, ``trtllm``); a table whose ``kernel_source`` names another engine (a copy filed under the
    wrong one) is refused. Reading parquet needs pyarrow (kvlab's ``parquet`` extra)."""
    where = f"engine all-reduce table {os.fspath(path)}"
    gpu, table = aiconfigurator_table(Path(path), where, ENGINE_COLUMNS,
                                      "<systems>/<system>/comm/<engine>/<version>/custom_allreduce_perf.parquet")
    t = table[table["allreduce_dtype"] == "bfloat16"]
    if "backend" in t.columns:
        t = t[t["backend"].astype(str).str.endswith("graph")]
    t = t.assign(message_bytes=t["message_size"].astype(np.int64) * 2)
    t = t[t["message_bytes"].between(*ENGINE_BYTES)]
    if t.empty or not (t["latency"] > 0).all():
        raise ValueError(f"{where}: needs graph-mode BF16 rows of positive latency between {ENGINE_BYTES[0]:,} and "
                         f"{ENGINE_BYTES[1]:,} bytes")
    for col in ("framework", "version"):
        if t[col].nunique() != 1:
            raise ValueError(f"{where}: one {col} expected, got {sorted(set(t[col].astype(str)))}")
    engine, version = str(t["framework"].iloc[0]).lower(), str(t["version"].iloc[0])
    kernels = sorted(set(t["kernel_source"].astype(str)))
    if not all(k.lower().startswith(engine) for k in kernels):
        raise ValueError(f"{where}: framework {engine} but kernel_source {kernels}: another engine's table filed "
                         f"under this one")
    return pd.DataFrame({"gpu": gpu, "p2p": True, "engine": engine,
                         "collective": "all_reduce", "num_gpus": t["num_gpus"].astype(int).to_numpy(),
                         "message_bytes": t["message_bytes"].to_numpy(), "time_s": t["latency"].to_numpy() * 1e-3,
                         "source": f"aiconfigurator, {engine} {version} TP all-reduce"})[list(COLUMNS)]


def rows(path: str | os.PathLike = PATH) -> pd.DataFrame:
    """The shipped rows (:data:`COLUMNS`)."""
    table = shipped_table(path, COLUMNS, REMAKE)
    return table.assign(p2p=table["p2p"].astype(str).str.lower() == "true")


def checks(path: str | os.PathLike = CHECK_PATH) -> pd.DataFrame:
    """The shipped check rows (:data:`COLUMNS`): engines' TP all-reduce tables of later releases, which
    kvlab fits nothing to and checks its pricing against."""
    return rows(path)


def curve_rows(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s NCCL rows as :func:`kvlab.costmodel.data.vidur_collectives` gives Vidur's: ``network``
    (:func:`network_name`), ``collective`` (``all_reduce``; ``send_recv``: the two-GPU all-gather, one
    send of the chunk each way), ``num_gpus``, ``message_bytes``, ``time_s``."""
    out = []
    nccl = table[table["engine"] == "nccl"]
    for (gpu, p2p), g in nccl.groupby(["gpu", "p2p"]):
        parts = (("all_reduce", g[g["collective"] == "all_reduce"]),
                 ("send_recv", g[(g["collective"] == "all_gather") & (g["num_gpus"] == 2)]))
        for coll, t in parts:
            out.append(pd.DataFrame({"network": network_name(str(gpu), bool(p2p)), "collective": coll,
                                     "num_gpus": t["num_gpus"].astype(int).to_numpy(),
                                     "message_bytes": t["message_bytes"].astype(np.float64).to_numpy(),
                                     "time_s": t["time_s"].astype(np.float64).to_numpy()}))
    return pd.concat(out, ignore_index=True)


def engine_rows(table: pd.DataFrame, engine: str = "vllm") -> pd.DataFrame:
    """``engine``'s own TP all-reduce rows (measured with P2P): ``gpu``, ``num_gpus``, ``message_bytes``,
    ``time_s``, ``source``."""
    t = table[(table["engine"] == engine) & (table["collective"] == "all_reduce") & table["p2p"]]
    return t[["gpu", "num_gpus", "message_bytes", "time_s", "source"]].reset_index(drop=True)


def _sorted(parts: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True).sort_values(["gpu", "p2p", "engine", "source", "collective",
                                                            "num_gpus", "message_bytes"])


def _distinct(files: list[str | os.PathLike], shipped: list[pd.DataFrame]) -> tuple[list[pd.DataFrame], list[str]]:
    """The engine tables of ``files`` but those whose measurements repeat one of ``shipped`` or an earlier
    file's (same GPU and engine: a release folder holding another release's rows, nothing new to check
    against), and which files were left out."""
    kept: list[pd.DataFrame] = []
    dropped = []
    key = ["gpu", "engine", "num_gpus", "message_bytes", "time_s"]
    for f in files:
        t = read_engine_allreduce(f)
        same = [k for k in (*shipped, *kept)
                if len(k) == len(t) and k[key].reset_index(drop=True).equals(t[key].reset_index(drop=True))]
        if same:
            dropped.append(f"{os.fspath(f)}: {t['gpu'].iloc[0]}'s {t['source'].iloc[0]} again (the rows of "
                           f"{same[0]['source'].iloc[0]})")
        else:
            kept.append(t)
    return kept, dropped


def write(p2p_files: list[str | os.PathLike], no_p2p_files: list[str | os.PathLike],
          engine_files: list[str | os.PathLike] = (), check_files: list[str | os.PathLike] = (),
          path: Path = PATH, check_path: Path = CHECK_PATH) -> list[str]:
    """Read the files (each ``hardware.yaml`` with its host configuration, engine all-reduce tables to fit
    and to check against) and write both shipped tables atomically; returns the check tables left out
    because they repeat another's measurements."""
    parts = ([read_hardware(f, p2p=True) for f in p2p_files] + [read_hardware(f, p2p=False) for f in no_p2p_files]
             + [read_engine_allreduce(f) for f in engine_files])
    if not parts:
        raise ValueError(f"no file given (usage: {REMAKE})")
    write_csv_atomically(_sorted(parts), path)
    checked, dropped = _distinct(list(check_files), parts)
    if checked:
        write_csv_atomically(_sorted(checked), check_path)
    return dropped


if __name__ == "__main__":  # python -m kvlab.costmodel.host_collectives --p2p FILE --no-p2p FILE --engine-allreduce FILE
    ap = argparse.ArgumentParser(prog="python -m kvlab.costmodel.host_collectives",
                                 description="Rewrite data/costmodels/host_collectives.csv from LLMServingSim "
                                             "hardware.yaml files and aiconfigurator engine all-reduce tables.")
    ap.add_argument("--p2p", action="append", default=[], metavar="FILE", help="hardware.yaml measured with GPU "
                                                                                 "peer-to-peer")
    ap.add_argument("--no-p2p", action="append", default=[], metavar="FILE",
                    help="hardware.yaml measured with peer-to-peer blocked (through host memory)")
    ap.add_argument("--engine-allreduce", action="append", default=[], metavar="FILE",
                    help="an engine's TP all-reduce table (aiconfigurator's comm/<engine>/<version>/"
                         "custom_allreduce_perf.parquet)")
    ap.add_argument("--engine-check", action="append", default=[], metavar="FILE",
                    help="an engine's TP all-reduce table to check against, not fitted to (a later release, "
                         "another engine)")
    args = ap.parse_args()
    left_out = write(args.p2p, args.no_p2p, args.engine_allreduce, args.engine_check)
    print(f"wrote {PATH}" + (f" and {CHECK_PATH}" if args.engine_check else ""))
    for line in left_out:
        print(f"left out {line}")
