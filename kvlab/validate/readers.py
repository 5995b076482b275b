"""Readers that turn measured runs into :class:`~kvlab.validate.records.RunRecord`.

* :func:`read_distserve`: DistServe's vLLM (V0 era) OPT-13B runs on one A100-80GB
  (``distserve_vllm_opt13b_*.csv`` of ``../shared/data/serving``). The source recorded no server
  settings; the replay assumes V0's defaults, as the dataset's README says (listed in each
  record's ``assumptions``).
* :func:`read_llmservingsim`: LLMServingSim's vLLM 0.19.0 runs (``llmservingsim_vllm_*.csv``).
* :func:`read_shared`: both, from the folder that holds them (empty when it is absent).
* :func:`read_bench_results`: a ``vllm bench serve --save-result`` JSON file (per-request
  ``input_lens``, ``output_lens``, ``ttfts``, ``itls``; one result or several appended) with a
  set-up YAML (:class:`SetUp`'s keys, plus ``request_rate``, ``burstiness``, ``arrivals`` and
  ``seed`` where the JSON lacks them); likewise SGLang's and aiperf's per-request output, and
  inference-perf's report folder (a run per load stage) and GuideLLM's report (a run per benchmark).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .._paths import SHARED_DATA_DIR
from .._validate import read_text_file
from ..specs import model as _model
from .records import CLIENT_QUEUE, RunRecord, SetUp

#: Where the shared serving runs live (``../shared/data/serving`` from the project root).
SHARED_SERVING = SHARED_DATA_DIR / "serving"

DISTSERVE = "distserve-vllm-opt13b"
LLMSERVINGSIM = "llmservingsim-vllm-0.19"
#: What a replay with the prefix cache on but no stated shared prefix assumes.
PREFIX_NOTE = ("prefix caching on: the record holds no token ids, so a shared prefix is known only from the set-up's "
               "shared_prefix_tokens (none here): each request finds only its own blocks after a preemption")

_DISTSERVE_ASSUMED = (
    "vLLM version not recorded: V0 engine (2024-04 artifact), whole prefills that stall decodes",
    "server flags not recorded: V0 defaults max_num_seqs=256, max_num_batched_tokens=max_model_len=2048, "
    "gpu_memory_utilization=0.9, block_size=16, 4 GiB swap",
    "times from the client's issue (HTTP round trip included, not modelled)",
)

#: LLMServingSim's hosts that ran their multi-GPU runs without GPU peer-to-peer, with why (not recorded with the
#: runs, all of 2026-04-25 by their meta.json's started_at): its RTX PRO 6000 pair measured NCCL through host memory
#: on 2026-09-08 and at the peer-to-peer speed only after its operator disabled ACS and the IOMMU on 2026-09-26
#: (profiler/perf/RTXPRO6000/hardware.yaml at e08dc38 and 1b2cc02), and LLMServingSim's own replay of the runs
#: (bench/examples/RTXPRO6000/*/config.json, 5daddb2) uses a 16 GB/s link.
_LLMSERVINGSIM_NO_P2P = {"RTXPRO6000": "GPU peer-to-peer not recorded: off, as LLMServingSim's RTX PRO 6000 host "
                                       "measured it until ACS and the IOMMU were disabled on 2026-09-26 (the runs are "
                                       "of 2026-04-25); its collectives through host memory"}


def read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({' '.join(str(exc).split())})") from None


def read_distserve(folder: str | Path = SHARED_SERVING) -> list[RunRecord]:
    """The eight DistServe vLLM runs (OPT-13B, one A100-80GB, ShareGPT, Poisson 1-4 req/s)."""
    folder = Path(folder)
    req = read_csv(folder / "distserve_vllm_opt13b_requests.csv")
    summ = read_csv(folder / "distserve_vllm_opt13b_summary.csv")
    out = []
    for _, row in summ.iterrows():
        name = str(row["run"]) if "run" in summ.columns else Path(str(row["file"])).stem
        rows = req[req["run"] == name]
        if rows.empty:
            raise ValueError(f"{folder}: run {name} of the summary has no requests")
        setup = SetUp(name=name, dataset=DISTSERVE, server="vLLM", server_version="", engine="vllm-v0",
                      model=_model(str(row["model"])).name, gpu="A100-80GB-SXM",
                      tp=int(row["tp"]), scheduler="prefill_first", max_num_seqs=256, max_num_batched_tokens=2048,
                      max_model_len=2048, block_size=16, gpu_memory_utilization=0.9, clock_start="client issue",
                      assumptions=_DISTSERVE_ASSUMED,
                      source=f"{row['source_repo']} {str(row['commit'])[:7]} {row['file']}")
        out.append(RunRecord(setup, rows))
    return sorted(out, key=lambda r: (float(r.name.split("-")[-1]), len(r.requests)))


def read_llmservingsim(folder: str | Path = SHARED_SERVING) -> list[RunRecord]:
    """The four LLMServingSim vLLM 0.19.0 runs (RTX 4090, RTX PRO 6000; 300 ShareGPT requests each)."""
    folder = Path(folder)
    req = read_csv(folder / "llmservingsim_vllm_requests.csv").rename(columns={"input_tokens": "prompt_tokens"})
    summ = read_csv(folder / "llmservingsim_vllm_summary.csv")
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
        recorded = str(row["enable_prefix_caching"]).strip().lower()
        prefix = recorded != "false"
        if recorded not in ("true", "false"):
            assumed.append("prefix caching not recorded: vLLM V1's default, on")
        if prefix:
            assumed.append(PREFIX_NOTE)
        ep = int(row["tp"]) * dp if str(row["expert_parallel"]).strip().lower() == "true" else 1
        if dp > 1:
            assumed.append(f"DP{dp}: each request routed to the least-loaded rank (4 x waiting + running); a mixture "
                           "of experts' ranks in lockstep, routed when the group's next step starts, not on arrival")
        no_p2p = int(row["tp"]) * dp > 1 and str(row["gpu"]) in _LLMSERVINGSIM_NO_P2P  # collectives across GPUs
        if no_p2p:
            assumed.append(_LLMSERVINGSIM_NO_P2P[str(row["gpu"])])
        mml = None if pd.isna(row["max_model_len"]) else int(row["max_model_len"])
        setup = SetUp(name=name, dataset=LLMSERVINGSIM, server="vLLM", server_version=str(row["vllm_version"]),
                      engine="vllm-v1", model=_model(str(row["model"])).name, gpu=str(row["gpu"]),
                      tp=int(row["tp"]), dp=dp, expert_parallel=ep, p2p=not no_p2p,
                      scheduler="chunked", max_num_seqs=int(row["max_num_seqs"]),
                      max_num_batched_tokens=int(row["max_num_batched_tokens"]), max_model_len=mml,
                      block_size=16 if pd.isna(row["block_size"]) else int(row["block_size"]), pool_pages=blocks,
                      gpu_memory_utilization=(0.9 if pd.isna(row["gpu_memory_utilization"])
                                              else float(row["gpu_memory_utilization"])),
                      prefix_caching=prefix, clock_start="engine queue", assumptions=tuple(assumed),
                      source=f"{row['source_repo']} {str(row['commit'])[:7]} {row['requests_file']}")
        out.append(RunRecord(setup, rows))
    return out


#: Server flags a set-up may use for its own keys (as ``vllm serve`` and SGLang's ``launch_server`` spell them,
#: dashes or underscores, leading dashes dropped): flag -> (set-up key, whether the flag says the opposite).
SERVER_FLAGS = {"tensor_parallel_size": ("tp", False), "tp_size": ("tp", False),
                "data_parallel_size": ("dp", False), "dp_size": ("dp", False),
                "enable_prefix_caching": ("prefix_caching", False), "no_enable_prefix_caching": ("prefix_caching", True),
                "disable_radix_cache": ("prefix_caching", True), "num_gpu_blocks_override": ("pool_pages", False),
                "max_running_requests": ("max_num_seqs", False), "chunked_prefill_size": ("max_num_batched_tokens", False),
                "mem_fraction_static": ("gpu_memory_utilization", False), "page_size": ("block_size", False),
                "context_length": ("max_model_len", False), "no_async_scheduling": ("async_scheduling", True),
                "disable_overlap_schedule": ("async_scheduling", True), "quantization": ("weight_dtype", False),
                "num_gpu_blocks": ("pool_pages", False)}  # the last not a flag: the blocks vLLM's log reports


def _precision(key: str, value):
    """A set-up value as kvlab spells it: any FP8 KV-cache format is ``fp8`` (a byte an element), and weights
    without quantization (``none``, ``bfloat16``, ``float16``, ``auto``) are ``bf16`` (two bytes)."""
    text = str(value).strip().lower()
    if key == "kv_cache_dtype" and text.startswith("fp8"):
        return "fp8"
    if key == "weight_dtype" and text in ("none", "null", "bfloat16", "float16", "auto"):
        return "bf16"
    return value


#: Summary columns read as set-up keys: the key itself, the names the shared files use, and the server flags
#: that mean it (:data:`SERVER_FLAGS`).
SUMMARY_KEYS = {key: (key, *other, *(f for f, (k, negated) in SERVER_FLAGS.items() if k == key and not negated))
                for key, other in {"server_version": ("vllm_version",), "server": (), "tp": (), "dp": (),
                                   "max_num_seqs": (), "max_num_batched_tokens": (), "max_model_len": (),
                                   "block_size": (), "pool_pages": (), "gpu_memory_utilization": (),
                                   "kv_cache_dtype": (), "weight_dtype": (),
                                   "prefix_caching": (), "max_concurrency": (), "clock_start": (), "scheduler": (),
                                   "engine": (), "async_scheduling": ()}.items()}
_INT_KEYS = {"tp", "dp", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "pool_pages",
             "max_concurrency"}


def summary_cell(value, key: str, where: str):
    """A summary cell as the set-up key wants it (int, bool, float or str)."""
    if key in _INT_KEYS:
        try:
            return int(float(value))
        except ValueError:
            raise ValueError(f"{where}: {key} must be a whole number, got {value!r}") from None
    if key in ("prefix_caching", "async_scheduling"):
        return str(value).strip().lower() in ("true", "1", "yes", "on")
    if key == "gpu_memory_utilization":
        return float(value)
    return _precision(key, str(value).strip())


def read_dataset(summary: str | Path, requests: str | Path) -> list[RunRecord]:
    """The runs of a dataset in the shared folder's layout: one summary row per run, one request row per request.

    ``summary`` needs ``run``, ``model`` (catalogue name or Hugging Face id) and ``gpu`` (catalogue or
    ``nvidia-smi`` name; a trailing parenthesis is dropped), and may give the set-up's engine flags
    (:data:`SUMMARY_KEYS`: ``vllm_version``, ``tp``, ``num_gpu_blocks``, ``enable_prefix_caching``,
    ...); what it lacks is the server's default for its version (:func:`with_server_defaults`).
    ``requests`` needs ``run``, ``arrival_s``, ``prompt_tokens`` (or ``input_tokens``),
    ``output_tokens``, ``ttft_s``, ``tpot_s``, ``e2e_s``, and may give ``client_queue_s``. The
    dataset is named after the files (``h100_vllm_summary.csv``: ``h100-vllm``).
    """
    summary, requests = Path(summary), Path(requests)
    dataset = summary.name.removesuffix("_summary.csv").replace("_", "-")
    summ = read_csv(summary)
    req = read_csv(requests).rename(columns={"input_tokens": "prompt_tokens"})
    for path, table, need in ((summary, summ, ("run", "model", "gpu")),
                              (requests, req, ("run", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s",
                                               "tpot_s", "e2e_s"))):
        missing = [c for c in need if c not in table.columns]
        if missing:
            raise ValueError(f"{path}: lacks column(s) {', '.join(missing)}")
    out = []
    for i, row in summ.iterrows():
        where = f"{summary} row {i + 2}"
        name = str(row["run"])
        rows = req[req["run"].astype(str) == name]
        if rows.empty:
            raise ValueError(f"{where}: run {name} has no requests in {requests}")
        setup: dict = {"name": name, "dataset": dataset, "model": str(row["model"]).strip(),
                       "gpu": str(row["gpu"]).split("(")[0].strip(),
                       "source": " ".join(str(row[c]) for c in ("source_repo", "commit", "file")
                                          if c in summ.columns and not pd.isna(row[c])) or str(summary)}
        for key, cols in SUMMARY_KEYS.items():
            col = next((c for c in cols if c in summ.columns and not pd.isna(row[c]) and str(row[c]).strip()), None)
            if col is not None:
                setup[key] = summary_cell(row[col], key, where)
        if setup.get("server_version") and "server" not in setup:
            setup["server"] = "vLLM"
        assumptions: list[str] = []
        setup = with_server_defaults(setup, assumptions)
        setup["assumptions"] = tuple(assumptions)
        out.append(RunRecord(SetUp.from_mapping(setup, where), rows))
    return out


#: The shared datasets with a reader of their own (their sources recorded what the generic layout lacks).
_OWN_READERS = {"distserve_vllm_opt13b": read_distserve, "llmservingsim_vllm": read_llmservingsim}


def read_shared(folder: str | Path = SHARED_SERVING) -> list[RunRecord]:
    """Every run of the shared serving datasets: DistServe's and LLMServingSim's by their own readers,
    any other ``<name>_summary.csv`` + ``<name>_requests.csv`` pair by :func:`read_dataset`;
    ``[]`` when ``folder`` does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out: list[RunRecord] = []
    for summary in sorted(folder.glob("*_summary.csv")):
        stem = summary.name.removesuffix("_summary.csv")
        if stem in _OWN_READERS:
            out += _OWN_READERS[stem](folder)
        elif (folder / f"{stem}_requests.csv").exists():
            out += read_dataset(summary, folder / f"{stem}_requests.csv")
    return out


def read_setup_yaml(path: str | Path) -> dict:
    """A set-up YAML as a mapping (``ValueError`` naming the file when it is not one)."""
    try:
        data = yaml.safe_load(read_text_file(path, "set-up file"))
    except yaml.YAMLError as exc:
        raise ValueError(f"set-up file {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"set-up file {path} must hold a mapping (YAML object), got {type(data).__name__}")
    return data


def setup_keys(data: dict, where: str) -> dict:
    """A set-up mapping with server flags (:data:`SERVER_FLAGS`) as kvlab's keys: ``--tensor-parallel-size 4``
    is ``tp: 4``, ``quantization: fp8`` is ``weight_dtype: fp8`` (``dtype: bfloat16`` or ``float16`` is ``bf16``
    where no quantization is given), an FP8 KV cache of any format is
    ``kv_cache_dtype: fp8`` (:func:`_precision`), ``enable_expert_parallel: true`` is ``expert_parallel`` over
    every GPU. A key given twice (as itself and as a flag) with different values is a ``ValueError`` naming
    ``where``."""
    out: dict = {}
    dtype = None  # vLLM's --dtype: the weights' bytes unless quantization says otherwise
    for key, value in data.items():
        k = str(key).lstrip("-").replace("-", "_")
        if k == "dtype":
            dtype = value
            continue
        if k in SERVER_FLAGS:
            k, negated = SERVER_FLAGS[k]
            value = (not value) if negated and isinstance(value, bool) else value
        value = _precision(k, value)
        if k in out and out[k] != value:
            raise ValueError(f"{where}: {k} is given twice ({out[k]!r} and {value!r}, as {key})")
        out[k] = value
    if dtype is not None and "weight_dtype" not in out:
        out["weight_dtype"] = _precision("weight_dtype", dtype)
    tp, dp = out.get("tp", 1), out.get("dp", 1)
    if out.pop("enable_expert_parallel", False) is True and "expert_parallel" not in out and isinstance(tp, int) \
            and isinstance(dp, int):  # else SetUp names the bad value
        out["expert_parallel"] = tp * dp
    return out


#: Set-up keys filled from the server's own defaults when a record lacks them: profile key -> set-up key.
_DEFAULTED = {"max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
              "gpu_memory_utilization": "gpu_memory_utilization", "block_size": "block_size",
              "kv_cache_dtype": "kv_cache_dtype", "enable_prefix_caching": "prefix_caching"}


def with_server_defaults(setup_map: dict, assumptions: list[str]) -> dict:
    """``setup_map`` with the engine flags it lacks set to its server's defaults for its version.

    The defaults are those of the server profile that covers ``server_version``
    (:func:`kvlab.recommend.servers.resolve`, e.g. vLLM >= 0.11 on an H100: ``max_num_seqs`` 1024,
    ``max_num_batched_tokens`` 8192, prefix caching on), for the set-up's model, GPU, TP and
    ``max_model_len``; the newest family when no version is given. Each value taken is appended to
    ``assumptions``. A server kvlab has no profile for keeps :class:`SetUp`'s defaults.
    """
    from ..recommend.servers import Context, profiles, resolve
    from ..specs import KV_CACHE_DTYPES, WEIGHT_DTYPES, gpu as _gpu, with_precision

    out = dict(setup_map)
    if "model" not in out or "gpu" not in out:
        return out  # SetUp.from_mapping names what is missing
    out["model"], out["gpu"] = _model(out["model"]).name, _gpu(out["gpu"]).name  # catalogue names
    system = str(out.get("server", "vLLM")).strip().lower()
    if not any(p.system == system for p in profiles().values()):
        return out
    version = re.match(r"\d+(\.\d+){0,2}", str(out.get("server_version") or ""))
    prof = resolve(f"{system}=={version.group(0)}" if version else system)
    m = _model(out["model"])
    kv, weights = str(out.get("kv_cache_dtype", m.kv_cache_dtype)), str(out.get("weight_dtype", m.weight_dtype))
    if kv in KV_CACHE_DTYPES and weights in WEIGHT_DTYPES:  # else SetUp names the bad value
        m = with_precision(m, kv_cache_dtype=kv, weights=weights)  # the defaults depend on the memory left
    ctx = Context(model=m, gpu_name=out["gpu"], tp=int(out.get("tp", 1)),
                  max_model_len=int(out.get("max_model_len") or 0))
    d = prof.defaults(ctx)
    if prof.system != "vllm":  # another server's flags have their own names: its default setting's values
        base = prof.settings(ctx)[0]
        d = {"max_num_seqs": base.max_num_seqs, "max_num_batched_tokens": base.max_num_batched_tokens,
             "gpu_memory_utilization": base.gpu_memory_utilization, "enable_prefix_caching": base.prefix_caching}
    taken = []
    for src, dst in _DEFAULTED.items():
        if dst not in out and d.get(src) is not None:
            out[dst] = d[src]
            taken.append(f"{dst}={d[src]}")
    if "scheduler" not in out and "enable_chunked_prefill" in d:
        out["scheduler"] = "chunked" if d["enable_chunked_prefill"] else "prefill_first"
        taken.append(f"scheduler={out['scheduler']}")
    if "engine" not in out and prof.engine:
        out["engine"] = prof.engine
        taken.append(f"engine={prof.engine}")
    if taken:
        assumptions.append(f"not in the record, taken as {prof.family}'s defaults (kvlab.recommend.servers "
                           f"{prof.key}, for {ctx.gpu_name}): {', '.join(taken)}")
    return out


#: How a result without ``start_times`` had its arrivals drawn (the set-up's ``arrivals`` key).
ARRIVALS = ("poisson", "gamma", "constant")
#: Set-up keys that redraw arrivals: a client that records each send time needs none of them.
REDRAW_KEYS = ("request_rate", "burstiness", "arrivals", "seed")


def _sent_at_recorded_times(setup_map: dict) -> dict:
    """``setup_map`` without :data:`REDRAW_KEYS` (for a client that records when it sent each request)."""
    return {k: x for k, x in setup_map.items() if k not in REDRAW_KEYS}


def _json_values(path: Path) -> list:
    """The JSON values of a result file: one, or several one after another (``--append-result``, JSONL)."""
    text = read_text_file(path, "benchmark result")
    dec, pos, out = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ValueError(f"benchmark result {path} is not valid JSON: {' '.join(str(exc).split())}") from None
        out.append(obj)
    if not out:
        raise ValueError(f"benchmark result {path} is empty")
    return out


def _arrivals(data: dict, where: str, n: int, rate, burst: float, process: str | None, seed: int, capped: bool,
              assumptions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(offered arrival, client queue) per request (s): from ``start_times`` (send times) and
    ``queue_times`` when the result has them, else redrawn at the rate."""
    if "start_times" in data:
        sent = np.asarray(data["start_times"], dtype=np.float64)
        if "queue_times" in data:
            queue = np.asarray([q or 0.0 for q in data["queue_times"]], dtype=np.float64)
            return sent - queue, queue
        if capped:
            assumptions.append("no queue_times: the send times (start_times) taken as the offered arrivals")
        return sent, np.zeros(n)
    from ..arrivals import arrival_times

    if rate is None:
        raise ValueError(f"{where}: no start_times and no request_rate; give request_rate in the set-up")
    r = float(rate)  # the result writes an unlimited rate as "inf"
    if capped:
        assumptions.append("the client's queue behind max_concurrency is not recorded: overload is called from "
                           "the send on both sides")
    if math.isinf(r):
        assumptions.append("request_rate inf: every request sent at once")
        return np.zeros(n), np.zeros(n)
    kind = process or ("poisson" if burst == 1.0 else "gamma")
    if kind not in ARRIVALS:
        raise ValueError(f"{where}: arrivals must be one of {', '.join(ARRIVALS)}, got {kind!r}")
    if kind == "constant":
        assumptions.append(f"arrivals: constant rate {r:g} req/s, one every {1 / r:.4g} s")
        return np.arange(n) / r, np.zeros(n)
    arrival = arrival_times(n, kind, qps=r, cv=1 / math.sqrt(burst) if kind == "gamma" else 1.0, seed=seed)
    assumptions.append(f"arrivals redrawn: {'Poisson' if kind == 'poisson' else f'gamma (burstiness {burst})'} "
                       f"at {r:g} req/s, seed {seed} (the benchmark's own draws are not in the file)")
    return arrival, np.zeros(n)


def _bench_record(data: dict, where: str, setup_map: dict, setup_where: str) -> RunRecord:
    """One result object (``where`` names it in errors) as a run record under ``setup_map``."""
    missing = [k for k in ("input_lens", "output_lens", "ttfts", "itls") if k not in data]
    if missing:
        raise ValueError(f"{where}: lacks {', '.join(missing)} (save it with vllm bench serve --save-result "
                         "--save-detailed, or python -m sglang.bench_serving --output-file F --output-details)")
    n = len(data["input_lens"])
    if any(len(data[k]) != n for k in ("output_lens", "ttfts", "itls")):
        raise ValueError(f"{where}: input_lens, output_lens, ttfts and itls differ in length")
    setup_map = dict(setup_map)
    rate = setup_map.pop("request_rate", data.get("request_rate"))
    burst = float(setup_map.pop("burstiness", data.get("burstiness", 1.0)) or 1.0)
    process = setup_map.pop("arrivals", None)
    seed = int(setup_map.pop("seed", 0))
    if "max_concurrency" not in setup_map and data.get("max_concurrency"):
        setup_map["max_concurrency"] = int(data["max_concurrency"])
    assumptions = list(setup_map.pop("assumptions", None) or ())
    errors = data.get("errors") or [""] * n
    out = np.asarray(data["output_lens"], dtype=np.float64)
    ok = np.array([not e for e in errors]) & (out > 0)
    ttft = np.asarray([t if t is not None else np.nan for t in data["ttfts"]], dtype=np.float64)
    e2e = ttft + np.array([float(np.sum(x)) if x else 0.0 for x in data["itls"]])
    arrival, queue = _arrivals(data, where, n, rate, burst, process, seed, bool(setup_map.get("max_concurrency")),
                               assumptions)
    return _client_record(pd.DataFrame({"arrival_s": arrival, "prompt_tokens": data["input_lens"], "output_tokens": out,
                                        "ttft_s": ttft, "e2e_s": e2e, CLIENT_QUEUE: queue})[ok],
                          setup_map, assumptions, setup_where)


def _client_record(req: pd.DataFrame, setup_map: dict, assumptions: list[str], setup_where: str) -> RunRecord:
    """A benchmark client's requests (arrival, lengths, TTFT, E2E, client queue) as a run under ``setup_map``
    (the server's defaults for what it leaves out): TPOT per request, (E2E - TTFT) / (output - 1)."""
    setup_map = with_server_defaults(setup_map, assumptions)
    if setup_map.get("prefix_caching") and not setup_map.get("shared_prefix_tokens"):
        assumptions.append(PREFIX_NOTE)
    out = req["output_tokens"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (req["e2e_s"] - req["ttft_s"]) / (out - 1), 0.0)
    setup_map["assumptions"] = assumptions
    return RunRecord(SetUp.from_mapping(setup_map, setup_where), req.assign(tpot_s=tpot))


#: aiperf's per-request metrics a run needs (``profile_export.jsonl``: tokens, and milliseconds for the times).
AIPERF_METRICS = ("input_sequence_length", "output_sequence_length", "time_to_first_token", "request_latency")


def _aiperf_record(objects: list[dict], where: str, setup_map: dict, setup_where: str) -> RunRecord:
    """aiperf's ``profile_export.jsonl`` (one object per request; ``where`` names the file) as one run: a request
    arrives when aiperf sent it (``metadata.request_start_ns``, from the first), with its ``time_to_first_token``
    and ``request_latency`` (ms) and lengths; failed and cancelled requests, and any outside the profiling phase,
    are dropped."""
    rows = []
    for i, o in enumerate(objects):
        meta, met = o.get("metadata") or {}, o.get("metrics") or {}
        if o.get("error") or meta.get("was_cancelled") or meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        missing = [k for k in AIPERF_METRICS if not isinstance(met.get(k), dict) or "value" not in met[k]]
        missing += [] if isinstance(meta.get("request_start_ns"), (int, float)) else ["metadata.request_start_ns"]
        if missing:
            raise ValueError(f"{where} record {i + 1}: lacks {', '.join(missing)} (aiperf's profile_export.jsonl)")
        rows.append([meta["request_start_ns"], *(met[k]["value"] for k in AIPERF_METRICS)])
    if not rows:
        raise ValueError(f"{where}: no successful request in the profiling phase")
    start_ns = np.asarray([r[0] for r in rows], dtype=np.int64)  # epoch ns: exact in integers, not in a double
    prompt, out, ttft_ms, e2e_ms = (np.asarray(c, dtype=np.float64) for c in zip(*(r[1:] for r in rows)))
    setup_map = _sent_at_recorded_times(setup_map)
    assumptions = list(setup_map.pop("assumptions", None) or ())
    sent = (start_ns - start_ns.min()) / 1e9
    arrival, queue = _arrivals({"start_times": sent.tolist()}, where, len(sent), None, 1.0, None, 0,
                               bool(setup_map.get("max_concurrency")), assumptions)
    return _client_record(pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompt.astype(np.int64),
                                        "output_tokens": out, "ttft_s": ttft_ms / 1e3, "e2e_s": e2e_ms / 1e3,
                                        CLIENT_QUEUE: queue}).sort_values("arrival_s", kind="stable")
                          .reset_index(drop=True), setup_map, assumptions, setup_where)


#: inference-perf's per-request report (kubernetes-sigs/inference-perf ``reportgen/base.py``) and its stages' reports.
INFERENCE_PERF_REQUESTS = "per_request_lifecycle_metrics.json"
INFERENCE_PERF_STAGE = re.compile(r"stage_(-?\d+)_lifecycle_metrics\.json")


def _is_num(x) -> bool:
    """Whether a JSON value is a finite number (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _obj(x) -> dict:
    """A JSON value as an object: itself, or empty where it is none."""
    return x if isinstance(x, dict) else {}


def _inference_perf_request(o, where: str) -> tuple[float, float, float, float, float, bool]:
    """(send, prompt tokens, output tokens, TTFT, E2E, ok) of one inference-perf request record (s, tokens)."""
    if not isinstance(o, dict) or not _is_num(o.get("start_time")):
        raise ValueError(f"{where}: expected an object with a numeric start_time (inference-perf's per-request "
                         "report)")
    info = _obj(o.get("info"))
    resp = _obj(info.get("response_metrics")) or info  # the layout from 2026-05 on, or the flat one before it
    usage = _obj(resp.get("server_usage"))
    times = resp.get("output_token_times")
    start = float(o["start_time"])
    if o.get("error") or not isinstance(times, list) or not times:  # failed, or not streamed
        return start, 0.0, 0.0, float("nan"), float("nan"), False
    if not _is_num(times[0]) or not _is_num(o.get("end_time")) or not start <= times[0] <= o["end_time"]:
        raise ValueError(f"{where}: expected start_time <= output_token_times[0] <= end_time (seconds)")
    prompt = usage.get("prompt_tokens", info.get("input_tokens", _obj(_obj(info.get("request_metrics"))
                                                                      .get("text")).get("input_tokens")))
    out = usage.get("completion_tokens")
    if out is None:
        try:
            body = _obj(json.loads(o.get("request") or "{}"))
        except (json.JSONDecodeError, TypeError):
            body = {}
        # ignore_eos: the server ran to max_tokens, exact where the client's re-tokenised count is not
        out = body.get("max_tokens") if body.get("ignore_eos") is True else None
        out = resp.get("output_tokens") if out is None else out
    if not _is_num(prompt) or not _is_num(out) or prompt < 1 or out < 0:
        raise ValueError(f"{where}: lacks its prompt or output token count")
    return start, float(prompt), float(out), float(times[0]) - start, float(o["end_time"]) - start, out > 0


def _inference_perf_stages(folder: Path) -> list[tuple[int, int, float | None, int | None]]:
    """(stage id, requests, requested rate, concurrency of a ``concurrent`` stage) of each
    ``stage_<id>_lifecycle_metrics.json`` beside the per-request report, in stage order (empty when there are
    none)."""
    found = sorted((int(m.group(1)), f) for f in folder.iterdir() if (m := INFERENCE_PERF_STAGE.fullmatch(f.name)))
    out = []
    for sid, f in found:
        vals = _json_values(f)
        load = vals[0].get("load_summary") if isinstance(vals[0], dict) else None
        if not isinstance(load, dict) or not _is_num(load.get("count")) or load["count"] < 0:
            raise ValueError(f"{f}: lacks load_summary.count (inference-perf's stage report)")
        cap = load.get("concurrency")
        out.append((sid, int(load["count"]), load.get("requested_rate"), int(cap) if _is_num(cap) and cap >= 1 else None))
    return out


def _inference_perf_records(items: list, path: Path, setup_map: dict, setup_where: str) -> list[RunRecord]:
    """inference-perf's ``per_request_lifecycle_metrics.json`` (``items``, read from ``path``) as a run per stage.

    A stage sends its requests and waits for every one to finish before the next stage begins
    (``loadgen/load_generator.py``, ``run_stage``), so the stages are separate runs of an empty server: the
    requests in order of sending, the first ``count`` of them stage 0, and so on, by the stage reports beside
    the file; without them, the file is one run. A ``concurrent`` stage's ``concurrency`` is its run's client
    cap unless the set-up gives one. A request arrives when it was sent (``start_time``, the
    client's ``perf_counter``); TTFT runs to its first content chunk (``output_token_times``), E2E to
    ``end_time``. Lengths: the server's ``usage`` where recorded, else ``max_tokens`` for an ``ignore_eos``
    request, else the client's re-tokenised count. Failed and non-streamed requests are dropped.
    """
    rows = np.array([_inference_perf_request(o, f"{path} request {i + 1}") for i, o in enumerate(items)],
                    dtype=np.float64).reshape(-1, 6)
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    stages = _inference_perf_stages(path.parent)
    if stages and sum(st[1] for st in stages) != len(rows):
        raise ValueError(f"{path}: holds {len(rows)} requests, but its stage reports count "
                         f"{sum(st[1] for st in stages)} ({', '.join(f'stage {st[0]}: {st[1]}' for st in stages)})")
    base = _sent_at_recorded_times(setup_map)
    name = str(base.pop("name"))
    bounds = np.cumsum([0] + [st[1] for st in stages]) if stages else np.array([0, len(rows)])
    out = []
    for k in range(len(bounds) - 1):
        part = rows[bounds[k]:bounds[k + 1]]
        failed = int((part[:, 5] == 0).sum())
        part = part[part[:, 5] > 0]
        sid, _, rate, cap = stages[k] if stages else (None, 0, None, None)
        where = f"{path}" + (f" stage {sid}" if stages else "")
        if not len(part):
            raise ValueError(f"{where}: no successful streamed request (inference-perf's api.streaming: true "
                             "records the first token)")
        assumptions = list(base.get("assumptions") or ())
        if stages:
            assumptions.append(f"inference-perf stage {sid}" + (f" at {rate:g} req/s" if _is_num(rate) else "")
                               + ": a run of its own (the client waits for a stage's requests before the next)")
        else:
            assumptions.append("no inference-perf stage reports beside the file: its stages replayed as one run")
        if failed:
            assumptions.append(f"{failed} failed or unstreamed requests not replayed")
        out.append(_client_record(pd.DataFrame({"arrival_s": part[:, 0] - part[0, 0],
                                                "prompt_tokens": part[:, 1].astype(np.int64),
                                                "output_tokens": part[:, 2], "ttft_s": part[:, 3],
                                                "e2e_s": part[:, 4], CLIENT_QUEUE: 0.0}),
                                  {**base, "name": f"{name}-stage{sid}" if stages else name, "assumptions": None,
                                   **({"max_concurrency": cap} if cap and "max_concurrency" not in base else {})},
                                  assumptions, setup_where))
    return out


#: GuideLLM's per-request fields a run needs, in both its layouts (``start_time`` before 0.4, ``request_start_time``
#: from 0.4 on; the rest the same names): the send (epoch s), tokens, TTFT (ms) and latency (s).
GUIDELLM_FIELDS = ("prompt_tokens", "output_tokens", "time_to_first_token_ms", "request_latency")


def _guidellm_record(bench: dict, where: str, setup_map: dict, setup_where: str) -> RunRecord:
    """One benchmark of a GuideLLM report (``where`` names it) as a run: its successful requests, each arriving
    when GuideLLM sent it; its strategy's cap (``concurrent`` streams, ``synchronous`` 1, or ``max_concurrency``)
    unless the set-up gives one."""
    reqs = _obj(bench.get("requests"))
    done = reqs.get("successful")
    if not isinstance(done, list) or not done:
        raise ValueError(f"{where}: no successful request recorded (requests.successful)")
    total = _obj(bench.get("request_totals")).get("successful")
    if _is_num(total) and total > len(done):
        raise ValueError(f"{where}: holds {len(done)} of its {total} successful requests (sampled: a replay needs "
                         "every request; run GuideLLM without --output-sampling)")
    rows = []
    for i, r in enumerate(done):
        r = _obj(r)
        start, vals = r.get("request_start_time", r.get("start_time")), [r.get(k) for k in GUIDELLM_FIELDS]
        if not _is_num(start) or not all(_is_num(v) and v >= 0 for v in vals):
            raise ValueError(f"{where} request {i + 1}: lacks its send time or one of {', '.join(GUIDELLM_FIELDS)} "
                             "(a streamed request records its first token)")
        rows.append([start, *vals])
    a = np.asarray(rows, dtype=np.float64)
    a = a[np.argsort(a[:, 0], kind="stable")]
    strategy = _obj(_obj(bench.get("config") or bench.get("args")).get("strategy"))
    kind = str(strategy.get("type_", "?"))
    cap = {"concurrent": strategy.get("streams"), "synchronous": 1}.get(kind, strategy.get("max_concurrency"))
    setup_map = _sent_at_recorded_times(setup_map)
    if "max_concurrency" not in setup_map and _is_num(cap) and cap >= 1:
        setup_map["max_concurrency"] = int(cap)
    assumptions = list(setup_map.pop("assumptions", None) or ())
    rate = strategy.get("rate")
    cut = sum(len(reqs.get(k) or ()) for k in ("incomplete", "errored"))
    assumptions.append(f"GuideLLM {kind}" + (f" at {rate:g} req/s" if _is_num(rate) else "")
                       + ": a run of its own" + (f"; {cut} incomplete or failed requests not replayed"
                                                 if cut else ""))
    return _client_record(pd.DataFrame({"arrival_s": a[:, 0] - a[0, 0], "prompt_tokens": a[:, 1].astype(np.int64),
                                        "output_tokens": a[:, 2], "ttft_s": a[:, 3] / 1e3, "e2e_s": a[:, 4],
                                        CLIENT_QUEUE: 0.0}), setup_map, assumptions, setup_where)


def read_bench_results(path: str | Path, setup: str | Path | dict) -> list[RunRecord]:
    """The runs of a benchmark client's result file (or inference-perf's report folder), with their set-up.

    The set-up (a YAML file or a mapping) gives :class:`SetUp`'s keys or the server's own flags
    (:func:`setup_keys`); what it lacks is the server's default for its version. Formats, told apart by content:

    * ``vllm bench serve --save-result --save-detailed``: one result, or several one per line
      (``--append-result``: stages of one server, named ``<name>-1``, ``<name>-2``, ...). Per request:
      ``prompt_tokens`` = ``input_lens``, ``output_tokens`` = ``output_lens``, ``ttft_s`` = ``ttfts``, ``e2e_s`` =
      TTFT + the sum of its ``itls``, ``tpot_s`` = (E2E - TTFT) / (output - 1) (vLLM's own per-request TPOT);
      failed requests (``errors`` non-empty, or no output) dropped; the client's cap the result's
      ``max_concurrency`` unless the set-up gives one. Arrivals: ``start_times`` (when each request was sent)
      less ``queue_times`` (how long the cap held it) when present; else drawn at the ``request_rate`` of the
      set-up or the result: Poisson (``burstiness`` 1), gamma, or ``arrivals: constant`` in the set-up (one every
      1 / rate s), seeded by ``seed`` (default 0): the same process as the benchmark's, not its draws, and the
      record's assumptions say so.
    * ``python -m sglang.bench_serving --output-file F --output-details``: the same per-request lists, one object
      per run (``bench_serving.py`` of sgl-project/sglang, commit 0033168f: ``output_lens`` 0 for a failed
      request, ``request_rate``, ``max_concurrency``; Poisson arrivals, no send times).
    * aiperf's ``profile_export.jsonl`` (:func:`_aiperf_record`; ai-dynamo/aiperf
      ``docs/tutorials/working-with-profile-exports.md``): one run, its arrivals the send times it records; give
      ``max_concurrency`` in the set-up for ``--concurrency``.
    * inference-perf's report folder or its ``per_request_lifecycle_metrics.json`` (:func:`_inference_perf_records`;
      kubernetes-sigs/inference-perf ``reportgen/base.py`` and ``apis/base.py``, read at 7de5ef2 and 599d379): a
      run per load stage (``<name>-stage<id>``) when its ``stage_<id>_lifecycle_metrics.json`` reports lie
      beside it, its arrivals the send times it records.
    * a GuideLLM JSON report (``guidellm benchmark --output-path F.json``; :func:`_guidellm_record`;
      vllm-project/guidellm ``schemas/request_stats.py`` from 0.4, ``benchmark/benchmark.py`` before, read at
      v0.3.0 and ee7a774): a run per benchmark (each strategy or rate), ``<name>-1``, ``<name>-2``, ...
    """
    path = Path(path)
    if path.is_dir():  # inference-perf's report folder
        if not (path / INFERENCE_PERF_REQUESTS).is_file():
            raise ValueError(f"{path} is a folder without {INFERENCE_PERF_REQUESTS} (inference-perf writes it "
                             "with report.request_lifecycle.per_request: true)")
        path = path / INFERENCE_PERF_REQUESTS
    objects = _json_values(path)
    setup_where = f"set-up {setup}" if not isinstance(setup, dict) else "set-up"
    base = setup_keys(read_setup_yaml(setup) if not isinstance(setup, dict) else setup, setup_where)
    name = str(base.pop("name", path.parent.name if path.name == INFERENCE_PERF_REQUESTS else path.stem))
    base.setdefault("source", str(path))
    if len(objects) == 1 and isinstance(objects[0], list):  # inference-perf: one array, an object per request
        return _inference_perf_records(objects[0], path, {**base, "name": name}, setup_where)
    if not all(isinstance(o, dict) for o in objects):
        raise ValueError(f"benchmark result {path} must hold JSON objects (or one array of inference-perf's "
                         "request records)")
    if isinstance(objects[0].get("benchmarks"), list):  # a GuideLLM report: a run per benchmark (stage)
        benches = objects[0]["benchmarks"]
        if not benches:
            raise ValueError(f"GuideLLM report {path} holds no benchmarks")
        return [_guidellm_record(b if isinstance(b, dict) else {}, f"{path} benchmark {i + 1} of {len(benches)}",
                                 {**base, "name": name if len(benches) == 1 else f"{name}-{i + 1}"}, setup_where)
                for i, b in enumerate(benches)]
    if "metadata" in objects[0] and "metrics" in objects[0]:  # aiperf's profile_export.jsonl: a record per request
        return [_aiperf_record(objects, str(path), {**base, "name": name}, setup_where)]
    out = []
    for i, data in enumerate(objects):
        one = len(objects) == 1
        where = str(path) if one else f"{path} result {i + 1} of {len(objects)}"
        out.append(_bench_record(data, where, {**base, "name": name if one else f"{name}-{i + 1}"}, setup_where))
    return out
