"""Readers that turn measured runs into :class:`~kvlab.validate.records.RunRecord`.

* :func:`read_distserve`: DistServe's vLLM (V0 era) OPT-13B runs on one A100-80GB
  (``distserve_vllm_opt13b_*.csv`` of ``../shared/data/serving``). The source recorded no server
  settings; the replay assumes V0's defaults, as the dataset's README says (listed in each
  record's ``assumptions``).
* :func:`read_llmservingsim`: LLMServingSim's vLLM 0.19.0 runs (``llmservingsim_vllm_*.csv``).
* :func:`read_shared`: both, from the folder that holds them (empty when it is absent).
* :func:`read_bench_result`: a ``vllm bench serve --save-result`` JSON file (per-request
  ``input_lens``, ``output_lens``, ``ttfts``, ``itls``) with a set-up YAML (:class:`SetUp`'s
  keys, plus ``request_rate``, ``burstiness`` and ``seed`` where the JSON lacks them).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .._paths import SHARED_DATA_DIR
from .._validate import read_text_file
from .records import RunRecord, SetUp

#: Where the shared serving runs live (``../shared/data/serving`` from the project root).
SHARED_SERVING = SHARED_DATA_DIR / "serving"

DISTSERVE = "distserve-vllm-opt13b"
LLMSERVINGSIM = "llmservingsim-vllm-0.19"

_DISTSERVE_ASSUMED = (
    "vLLM version not recorded: V0 engine (2024-04 artifact), whole prefills that stall decodes",
    "server flags not recorded: V0 defaults max_num_seqs=256, max_num_batched_tokens=max_model_len=2048, "
    "gpu_memory_utilization=0.9, block_size=16, 4 GiB swap",
    "times from the client's issue (HTTP round trip included, not modelled)",
)

#: The catalogue names of the LLMServingSim runs' models and GPUs.
_MODELS = {"meta-llama/Llama-3.1-8B": "Llama-3.1-8B", "Qwen/Qwen3-32B": "Qwen3-32B",
           "Qwen/Qwen3-30B-A3B-Instruct-2507": "Qwen3-30B-A3B", "facebook/opt-13b": "OPT-13B"}


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({' '.join(str(exc).split())})") from None


def read_distserve(folder: str | Path = SHARED_SERVING) -> list[RunRecord]:
    """The eight DistServe vLLM runs (OPT-13B, one A100-80GB, ShareGPT, Poisson 1-4 req/s)."""
    folder = Path(folder)
    req = _read_csv(folder / "distserve_vllm_opt13b_requests.csv")
    summ = _read_csv(folder / "distserve_vllm_opt13b_summary.csv")
    out = []
    for _, row in summ.iterrows():
        name = str(row["run"]) if "run" in summ.columns else Path(str(row["file"])).stem
        rows = req[req["run"] == name]
        if rows.empty:
            raise ValueError(f"{folder}: run {name} of the summary has no requests")
        setup = SetUp(name=name, dataset=DISTSERVE, server="vLLM", server_version="", engine="vllm-v0",
                      model=_MODELS.get(str(row["model"]), str(row["model"])), gpu="A100-80GB-SXM",
                      tp=int(row["tp"]), scheduler="prefill_first", max_num_seqs=256, max_num_batched_tokens=2048,
                      max_model_len=2048, block_size=16, gpu_memory_utilization=0.9, clock_start="client issue",
                      assumptions=_DISTSERVE_ASSUMED,
                      source=f"{row['source_repo']} {str(row['commit'])[:7]} {row['file']}")
        out.append(RunRecord(setup, rows))
    return sorted(out, key=lambda r: (float(r.name.split("-")[-1]), len(r.requests)))


def read_llmservingsim(folder: str | Path = SHARED_SERVING) -> list[RunRecord]:
    """The four LLMServingSim vLLM 0.19.0 runs (RTX 4090, RTX PRO 6000; 300 ShareGPT requests each)."""
    folder = Path(folder)
    req = _read_csv(folder / "llmservingsim_vllm_requests.csv").rename(columns={"input_tokens": "prompt_tokens"})
    summ = _read_csv(folder / "llmservingsim_vllm_summary.csv")
    out = []
    for _, row in summ.iterrows():
        name = str(row["run"])
        rows = req[req["run"] == name]
        if rows.empty:
            raise ValueError(f"{folder}: run {name} of the summary has no requests")
        blocks = None if pd.isna(row["num_gpu_blocks"]) else int(row["num_gpu_blocks"])
        dp = int(row["dp"])
        assumed = ["times from the engine's queue (queued_ts), as the source gives them"]
        if blocks is None:
            assumed.append("KV blocks not recorded: pool derived from gpu_memory_utilization=0.9")
        ep = int(row["tp"]) * dp if str(row["expert_parallel"]).strip().lower() == "true" else 1
        if dp > 1:
            assumed.append(f"DP{dp}: requests dealt round-robin to {dp} independent replicas (vLLM balances by load)"
                           + (f"; EP{ep}: each GPU's experts serve all ranks' tokens, every rank taken to carry "
                              "the replayed one's load" if ep > 1 else ""))
        mml = None if pd.isna(row["max_model_len"]) else int(row["max_model_len"])
        setup = SetUp(name=name, dataset=LLMSERVINGSIM, server="vLLM", server_version=str(row["vllm_version"]),
                      engine="vllm-v1", model=_MODELS.get(str(row["model"]), str(row["model"])), gpu=str(row["gpu"]),
                      tp=int(row["tp"]), dp=dp, expert_parallel=ep, scheduler="chunked", max_num_seqs=int(row["max_num_seqs"]),
                      max_num_batched_tokens=int(row["max_num_batched_tokens"]), max_model_len=mml,
                      block_size=16 if pd.isna(row["block_size"]) else int(row["block_size"]), pool_pages=blocks,
                      gpu_memory_utilization=(0.9 if pd.isna(row["gpu_memory_utilization"])
                                              else float(row["gpu_memory_utilization"])),
                      clock_start="engine queue", assumptions=tuple(assumed),
                      source=f"{row['source_repo']} {str(row['commit'])[:7]} {row['requests_file']}")
        out.append(RunRecord(setup, rows))
    return out


def read_shared(folder: str | Path = SHARED_SERVING) -> list[RunRecord]:
    """Every run of the shared serving datasets; ``[]`` when ``folder`` does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return read_distserve(folder) + read_llmservingsim(folder)


def _read_mapping(path: str | Path, what: str, parse, error: type[Exception], fmt: str) -> dict:
    """The mapping a ``what`` file holds, parsed by ``parse``; ``ValueError`` naming the file otherwise."""
    try:
        data = parse(read_text_file(path, what))
    except error as exc:
        raise ValueError(f"{what} {path} is not valid {fmt}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} must hold a mapping ({fmt} object), got {type(data).__name__}")
    return data


def read_setup_yaml(path: str | Path) -> dict:
    """A set-up YAML as a mapping (``ValueError`` naming the file when it is not one)."""
    return _read_mapping(path, "set-up file", yaml.safe_load, yaml.YAMLError, "YAML")


def read_bench_result(path: str | Path, setup: str | Path | dict) -> RunRecord:
    """A ``vllm bench serve --save-result`` JSON file as a run record, with its set-up.

    Per request: ``prompt_tokens`` = ``input_lens``, ``output_tokens`` = ``output_lens``,
    ``ttft_s`` = ``ttfts``, ``e2e_s`` = TTFT + the sum of its ``itls``, ``tpot_s`` = (E2E - TTFT) /
    (output - 1) (vLLM's own per-request TPOT). Failed requests (``errors`` non-empty, or no
    output) are dropped. Arrivals: the JSON's ``start_times`` when present (relative to the
    first), else Poisson (``burstiness`` 1) or gamma arrivals at the ``request_rate`` of the
    set-up or the JSON, seeded by ``seed`` (default 0): the same process as the benchmark's, not
    its draws, and the record's assumptions say so.
    """
    path = Path(path)
    data = _read_mapping(path, "vllm bench serve result", json.loads, json.JSONDecodeError, "JSON")
    missing = [k for k in ("input_lens", "output_lens", "ttfts", "itls") if k not in data]
    if missing:
        raise ValueError(f"{path}: lacks {', '.join(missing)} (save it with vllm bench serve --save-result "
                         "--save-detailed)")
    n = len(data["input_lens"])
    if any(len(data[k]) != n for k in ("output_lens", "ttfts", "itls")):
        raise ValueError(f"{path}: input_lens, output_lens, ttfts and itls differ in length")
    setup_map = dict(read_setup_yaml(setup) if not isinstance(setup, dict) else setup)
    where = f"set-up {setup}" if not isinstance(setup, dict) else "set-up"
    rate = setup_map.pop("request_rate", data.get("request_rate"))
    burst = float(setup_map.pop("burstiness", data.get("burstiness", 1.0)) or 1.0)
    seed = int(setup_map.pop("seed", 0))
    setup_map.setdefault("name", path.stem)
    assumptions = list(setup_map.pop("assumptions", None) or ())
    errors = data.get("errors") or [""] * n
    out = np.asarray(data["output_lens"], dtype=np.float64)
    ok = np.array([not e for e in errors]) & (out > 0)
    ttft = np.asarray([t if t is not None else np.nan for t in data["ttfts"]], dtype=np.float64)
    e2e = ttft + np.array([float(np.sum(x)) if x else 0.0 for x in data["itls"]])
    if "start_times" in data:
        arrival = np.asarray(data["start_times"], dtype=np.float64)
    else:
        from ..arrivals import arrival_times

        if rate is None:
            raise ValueError(f"{path}: no start_times and no request_rate; give request_rate in the set-up")
        r = float(rate)
        if math.isinf(r):
            arrival = np.zeros(n)
            assumptions.append("request_rate inf: every request sent at once")
        else:
            arrival = arrival_times(n, "gamma" if burst != 1.0 else "poisson", qps=r, cv=1 / math.sqrt(burst),
                                    seed=seed)
            assumptions.append(f"arrivals redrawn: {'Poisson' if burst == 1.0 else f'gamma (burstiness {burst})'} "
                               f"at {r:g} req/s, seed {seed} (the benchmark's own draws are not in the file)")
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), 0.0)
    req = pd.DataFrame({"arrival_s": arrival, "prompt_tokens": data["input_lens"], "output_tokens": out,
                        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e})[ok]
    setup_map["assumptions"] = assumptions
    setup_map.setdefault("source", str(path))
    return RunRecord(SetUp.from_mapping(setup_map, where), req)
