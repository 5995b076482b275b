"""Server profiles against the releases: every printed command read back through a parser of that
system's documented flags (written here from the release's own parser: names, types, choices),
and each profile's defaults for H100, A100 and L4 worked out by hand from the cited source."""
from __future__ import annotations

import argparse
import json
import shlex

import numpy as np
import pytest
import yaml

from kvlab.recommend import recommend
from kvlab.recommend.servers import profiles, resolve
from kvlab.recommend.systems import launch, settings, write_files
from kvlab.specs import MIB, gpu, model, with_precision

MODEL = "Llama-3-8B"  # meta-llama/Meta-Llama-3-8B: 32 layers, 8 KV heads of 128, 8,192-token context
GPUS = ("H100-SXM", "A100-80GB-SXM", "L4")
CTX = dict(max_model_len=8192, max_prompt_tokens=8191, max_new_tokens=1000)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # unknown flag, bad type or choice: fail the test with argparse's words
        raise AssertionError(message)


def _parser(*specs) -> argparse.ArgumentParser:
    p = _Parser(add_help=False, allow_abbrev=False)
    for names, kw in specs:
        p.add_argument(*names, **kw)
    return p


# vllm/engine/arg_utils.py + vllm/config/cache.py (BlockSize and CacheDType literals)
VLLM_FLAGS = [(("model",), {}), (("--max-model-len",), {"type": int}),
              (("--block-size",), {"type": int, "choices": [1, 8, 16, 32, 64, 128, 256]}),
              (("--tensor-parallel-size", "-tp"), {"type": int, "default": 1}),
              (("--max-num-seqs",), {"type": int}), (("--max-num-batched-tokens",), {"type": int}),
              (("--gpu-memory-utilization",), {"type": float}),
              (("--kv-cache-dtype",), {"choices": ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"],
                                       "default": "auto"}),
              (("--kv-offloading-size",), {"type": float}), (("--quantization", "-q"), {}),
              (("--generation-config",), {}), (("--override-generation-config",), {"type": json.loads}),
              # SchedulerConfig.async_scheduling (vllm/config/scheduler.py), a boolean flag of every V1 release
              (("--async-scheduling",), {"action": argparse.BooleanOptionalAction})]
# the 0.6-0.10 V0 engine: --preemption-mode and --swap-space exist, the block sizes CUDA runs are 8/16/32
VLLM_V0_FLAGS = [f for f in VLLM_FLAGS if f[0][0] not in ("--block-size", "--kv-offloading-size",
                                                          "--async-scheduling")] + [
    (("--block-size",), {"type": int, "choices": [8, 16, 32]}),
    (("--preemption-mode",), {"choices": ["recompute", "swap"]}), (("--swap-space",), {"type": float}),
    (("--enable-chunked-prefill",), {"nargs": "?", "const": True, "default": False})]
# python/sglang/srt/server_args.py (add_cli_args)
SGLANG_FLAGS = [(("--model-path",), {}), (("--context-length",), {"type": int}),
                (("--tp-size", "--tensor-parallel-size"), {"type": int, "default": 1}),
                (("--mem-fraction-static",), {"type": float}), (("--max-running-requests",), {"type": int}),
                (("--chunked-prefill-size",), {"type": int}), (("--schedule-conservativeness",), {"type": float}),
                (("--kv-cache-dtype",), {"choices": ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"],
                                         "default": "auto"}),
                (("--enable-hierarchical-cache",), {"action": "store_true"}),
                (("--hicache-ratio",), {"type": float, "default": 2.0}), (("--quantization",), {}),
                (("--enable-mixed-chunk",), {"action": "store_true"})]
# launcher/src/main.rs of v3.3.7 (clap, kebab-case)
TGI_FLAGS = [(("--model-id",), {}), (("--max-input-tokens",), {"type": int}), (("--max-total-tokens",), {"type": int}),
             (("--num-shard",), {"type": int, "default": 1}), (("--max-batch-prefill-tokens",), {"type": int}),
             (("--cuda-memory-fraction",), {"type": float}),
             (("--kv-cache-dtype",), {"choices": ["fp8_e4m3fn", "fp8_e5m2"]}), (("--quantize",), {})]
# tensorrt_llm/commands/serve.py (click options)
TRT_FLAGS = [(("model",), {}), (("--backend",), {"choices": ["pytorch", "tensorrt", "_autodeploy"]}),
             (("--max_seq_len",), {"type": int}), (("--tp_size", "--tensor_parallel_size"), {"type": int, "default": 1}),
             (("--max_batch_size",), {"type": int}), (("--max_num_tokens",), {"type": int}),
             (("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction"), {"type": float}),
             (("--enable_chunked_prefill",), {"action": "store_true"}),
             (("--extra_llm_api_options", "--config"), {})]


def _argv(system: str, command: str) -> list[str]:
    argv = shlex.split(command)
    head = {"vllm": ["vllm", "serve"], "sglang": ["python", "-m", "sglang.launch_server"],
            "tgi": ["text-generation-launcher"], "tensorrt-llm": ["trtllm-serve"]}[system]
    assert argv[:len(head)] == head, command
    return argv[len(head):]


def _cases():
    for g in GPUS:
        for system in ("vllm", "vllm==0.8", "sglang", "tgi", "tensorrt-llm"):
            for s in settings(system, model=MODEL, gpu=g, tp=2, percentiles={"p99": 600}, max_new_tokens=1000):
                yield pytest.param(s, g, id=f"{g}-{system}-{s.label}")


@pytest.mark.parametrize("s, g", list(_cases()))
def test_every_printed_flag_parses_and_carries_the_simulated_value(s, g, tmp_path):
    run = launch(s, model=MODEL, block_size=16, tp=2, save_dir=str(tmp_path), **CTX)
    argv = _argv(s.system, run.command)
    fp8 = s.kv_cache_dtype == "fp8"
    if s.family in ("vllm>=0.11", "vllm 0.6-0.10"):
        ns = _parser(*(VLLM_FLAGS if s.family == "vllm>=0.11" else VLLM_V0_FLAGS)).parse_args(argv)
        assert (ns.model, ns.max_model_len, ns.block_size, ns.tensor_parallel_size) == \
            ("meta-llama/Meta-Llama-3-8B", 8192, 16, 2)
        assert (ns.max_num_seqs, ns.max_num_batched_tokens, ns.gpu_memory_utilization) == \
            (s.max_num_seqs, s.max_num_batched_tokens, s.gpu_memory_utilization)
        assert ns.kv_cache_dtype == ("fp8" if fp8 else "auto")
        assert ns.override_generation_config == {"max_new_tokens": 1000} and ns.generation_config == "vllm"
        if s.family == "vllm>=0.11":
            assert ns.kv_offloading_size == s.host_pool_gib  # None unless the CPU-offload setting
            assert ns.async_scheduling is True is s.async_scheduling  # 0.11-0.13 need the flag to run as simulated
        else:
            assert (ns.preemption_mode or "recompute") == s.preemption_mode
            assert ns.swap_space == (4.0 if s.preemption_mode == "swap" else None)
            assert bool(ns.enable_chunked_prefill) == (s.scheduler == "chunked")
    elif s.system == "sglang":
        ns = _parser(*SGLANG_FLAGS).parse_args(argv)
        assert (ns.model_path, ns.context_length, ns.tp_size) == ("meta-llama/Meta-Llama-3-8B", 8192, 2)
        assert (ns.mem_fraction_static, ns.max_running_requests, ns.chunked_prefill_size) == \
            (s.gpu_memory_utilization, s.max_num_seqs, s.max_num_batched_tokens)
        # admission keeps new_token_ratio x conservativeness free: the policy's ratio is 0.7 x the flag
        assert s.policy_params["init_ratio"] == pytest.approx(0.7 * ns.schedule_conservativeness)
        assert ns.kv_cache_dtype == ("fp8_e4m3" if fp8 else "auto")
        assert ns.enable_hierarchical_cache == (s.overflow == "cpu offload") and ns.hicache_ratio == 2.0
        # decodes wait behind prefill chunks unless --enable-mixed-chunk mixes them in (ServerArgs default False)
        assert s.scheduler == ("chunked" if ns.enable_mixed_chunk else "prefill_first_chunked")
    elif s.system == "tgi":
        ns = _parser(*TGI_FLAGS).parse_args(argv)
        assert (ns.model_id, ns.max_input_tokens, ns.max_total_tokens, ns.num_shard) == \
            ("meta-llama/Meta-Llama-3-8B", 8191, 8192, 2)
        assert ns.max_batch_prefill_tokens == s.max_num_batched_tokens
        assert ns.cuda_memory_fraction * 0.90 == pytest.approx(s.gpu_memory_utilization)  # TGI_WIGGLE_ROOM 0.9
        assert ns.kv_cache_dtype == ("fp8_e4m3fn" if fp8 else None)
    else:
        ns = _parser(*TRT_FLAGS).parse_args(argv)
        assert (ns.model, ns.backend, ns.max_seq_len, ns.tp_size) == ("meta-llama/Meta-Llama-3-8B", "pytorch", 8192, 2)
        assert (ns.max_batch_size, ns.max_num_tokens) == (s.max_num_seqs, s.max_num_batched_tokens)
        assert ns.enable_chunked_prefill == (s.scheduler == "chunked")
        w = model(MODEL).weight_bytes_per_gpu(tp=2)
        mem = gpu(g).memory_bytes
        assert (w + ns.kv_cache_free_gpu_memory_fraction * (mem - w)) / mem == pytest.approx(s.gpu_memory_utilization)
        # the YAML the command names is a real file, written into the save dir, with LLM API keys
        assert ns.extra_llm_api_options == str(tmp_path / "extra_llm_api_options.yaml")
        write_files(run, tmp_path)
        opts = yaml.safe_load((tmp_path / "extra_llm_api_options.yaml").read_text())
        assert set(opts) == {"scheduler_config", "kv_cache_config"}
        policy = opts["scheduler_config"]["capacity_scheduler_policy"]
        assert policy == ("MAX_UTILIZATION" if s.policy == "vllm" else "GUARANTEED_NO_EVICT")
        assert opts["kv_cache_config"] == {"enable_block_reuse": True, "dtype": "fp8" if fp8 else "auto"}


# ------------------------------------------------------------------ defaults, by hand from the source
def _default(system: str, g: str, **kw):
    return settings(system, model=MODEL, gpu=g, **kw)[0]


@pytest.mark.parametrize("g, tokens, seqs", [
    # get_batch_defaults: >= 70 GiB and not named A100 -> 8192 / 1024 for the OpenAI server, else 2048 / 256
    ("H100-SXM", 8192, 1024), ("H200", 8192, 1024), ("B200", 8192, 1024),
    ("A100-80GB-SXM", 2048, 256), ("A100-40GB", 2048, 256), ("L4", 2048, 256)])
def test_vllm_batch_defaults_follow_get_batch_defaults(g, tokens, seqs):
    d = _default("vllm", g)
    assert (d.max_num_batched_tokens, d.max_num_seqs, d.gpu_memory_utilization) == (tokens, seqs, 0.92)
    assert (d.scheduler, d.preemption_mode, d.kv_cache_dtype) == ("chunked", "recompute", "auto")


def test_vllm_v0_defaults():
    for g in GPUS:  # 256 sequences, 0.90, whole prefills with a budget of max(max_model_len, 2048)
        d = _default("vllm==0.8", g, max_model_len=8192)
        assert (d.max_num_seqs, d.gpu_memory_utilization, d.scheduler, d.max_num_batched_tokens) == \
            (256, 0.9, "prefill_first", 8192)
        assert _default("vllm==0.6.3", g, max_model_len=1024).max_num_batched_tokens == 2048
    # above 32K of context V0 chunks prefills, at 512 tokens by default
    long = settings("vllm==0.7", model="Llama-3.1-8B", gpu="H100-SXM", max_model_len=65536)[0]
    assert (long.scheduler, long.max_num_batched_tokens) == ("chunked", 512)


@pytest.mark.parametrize("g, chunk, frac, running", [
    # reserved MiB = 512 + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs + 1/8 x 1024, at least 10 GiB above 60 GiB
    ("H100-SXM", 8192, round((81559 - (512 + 12288 + 512 + 128)) / 81559, 3), 4096),      # 0.835
    ("A100-80GB-SXM", 8192, round((81920 - (512 + 12288 + 512 + 128)) / 81920, 3), 4096),  # 0.836
    ("L4", 2048, round((23034 - (512 + 3072 + 48 + 128)) / 23034, 3), 2048)])             # 0.837
def test_sglang_memory_and_running_request_defaults(g, chunk, frac, running):
    d = _default("sglang", g, max_model_len=8192)
    assert (d.max_num_batched_tokens, d.gpu_memory_utilization, d.max_num_seqs) == (chunk, frac, running)
    assert d.scheduler == "prefill_first_chunked"  # enable_mixed_chunk False: prefill chunks stall the decodes
    assert frac in (0.835, 0.836, 0.837)
    assert gpu(g).memory_bytes / MIB in (81559, 81920, 23034)


def test_sglang_running_requests_follow_the_pool():
    # min(pool // 2, clamp(pool / context x 512, 2048, 4096)): a pool of ~30k tokens on an L4 gives the floor,
    # a large pool the ceiling; a short context raises the per-request share
    prof = resolve("sglang")
    from kvlab.recommend.servers import Context
    l4 = prof.defaults(Context(model=model(MODEL), gpu_name="L4", max_model_len=8192))
    assert l4["max_running_requests"] == 2048
    h100 = prof.defaults(Context(model=model(MODEL), gpu_name="H100-SXM", max_model_len=8192))
    assert h100["max_running_requests"] == 4096


@pytest.mark.parametrize("g, tokens", [
    # compute_optimal = f16 FLOP/s / FLOPs per token: 15,032,385,536 for Llama-3-8B
    # (32 x (3 x 33,554,432 + 2 x 8,388,608 + 6 x 4096 x 14336)); capped at 8,192 (max_position_embeddings)
    ("H100-SXM", 8192), ("A100-80GB-SXM", 8192), ("L4", int(121e12 / 15_032_385_536)),  # 8,049
    ("H100-PCIe", 4096)])  # "nvidia-h100-pcie" is not in TGI's card table: no optimum, the 4,096 fallback
def test_tgi_prefill_default_and_memory_share(g, tokens):
    d = _default("tgi", g)
    assert d.max_num_batched_tokens == tokens and d.gpu_memory_utilization == pytest.approx(1.0 * 0.90)
    assert "--max-batch-size" not in d.flags  # ignored with prefill chunking (backend.rs)


def test_trtllm_defaults():
    for g in GPUS:
        d = _default("tensorrt-llm", g)
        assert (d.max_num_seqs, d.max_num_batched_tokens, d.scheduler, d.policy) == \
            (2048, 8192, "mixed_whole", "reserve_max")  # BuildConfig defaults; chunked prefill off: whole contexts
        # beside the generation requests (PyMicroBatchScheduler)
        assert d.flags["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"


# ------------------------------------------------------------------ versions, flags, precision
def test_system_versions_resolve_to_their_family():
    assert resolve("vllm").key == "vllm>=0.11" and resolve("vllm==0.12").key == "vllm>=0.11"
    for old in ("vllm==0.8", "vllm==0.6", "vllm==0.10.2"):
        assert resolve(old).key == "vllm 0.6-0.10"
    assert resolve("sglang==0.5.23").key == "sglang 0.5" and resolve("trtllm").system == "tensorrt-llm"
    with pytest.raises(ValueError, match="no profile covers vllm 0.4"):
        resolve("vllm==0.4")
    with pytest.raises(ValueError, match="not a release number"):
        resolve("vllm==latest")
    with pytest.raises(ValueError, match="system 'triton' is unknown"):
        resolve("triton")
    assert all(p.sources for p in profiles().values())  # every profile cites where it was read


def test_block_size_the_release_refuses_is_an_error_not_a_flag():
    s = _default("vllm", "H100-SXM")
    with pytest.raises(ValueError, match="block_size 7 is not a block size vLLM V1"):
        launch(s, model=MODEL, block_size=7, **CTX)
    import pandas as pd
    trace = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [5, 6]})
    with pytest.raises(ValueError, match="1, 8, 16, 32, 64, 128, 256"):
        recommend(trace, model=MODEL, gpu="H100-SXM", system="vllm", block_size=7)
    with pytest.raises(ValueError, match="8, 16, 32"):
        recommend(trace, model=MODEL, gpu="H100-SXM", system="vllm==0.8", block_size=64)


def test_fp8_kv_is_offered_where_system_and_gpu_support_it():
    def labels(system, g):
        return [s.label for s in settings(system, model=MODEL, gpu=g)]
    for system in ("vllm", "sglang", "tgi", "tensorrt-llm"):
        assert "kv_cache_dtype=fp8" in labels(system, "H100-SXM")
        assert "kv_cache_dtype=fp8" not in labels(system, "A100-80GB-SXM")  # no FP8 tensor cores
    # a model already served with FP8 KV prints it in every command and is not offered it again
    fp8 = with_precision(MODEL, kv_cache_dtype="fp8")
    ss = settings("vllm", model=fp8, gpu="H100-SXM")
    assert all(s.kv_cache_dtype == "fp8" for s in ss) and "kv_cache_dtype=fp8" not in [s.label for s in ss]
    assert "--kv-cache-dtype fp8" in launch(ss[0], model=fp8, **CTX).command


def test_commands_load_the_hugging_face_id_and_say_when_there_is_none():
    s = _default("vllm", "H100-SXM")
    assert launch(s, model=MODEL, **CTX).argv[2] == "meta-llama/Meta-Llama-3-8B"
    opt = launch(settings("vllm", model="OPT-175B", gpu="H100-SXM", tp=8)[0], model="OPT-175B", tp=8,
                 max_model_len=2048, max_prompt_tokens=2047, max_new_tokens=100)
    assert opt.argv[2] == "OPT-175B" and any("no Hugging Face id" in n for n in opt.notes)
    int4 = with_precision(MODEL, weights="int4")
    assert any("AWQ or GPTQ" in n for n in launch(s, model=int4, **CTX).notes)


def test_only_vllm_v0_lets_a_preempted_request_swap():
    from kvlab.recommend.servers import preemption_modes, resolve

    modes = preemption_modes()
    # vLLM V0's --preemption-mode swap (arg_utils.py of the 0.6-0.10 line); V1 removed it; SGLang retracts
    assert modes[resolve("vllm==0.8").family] == ("recompute", "swap")
    assert modes[resolve("vllm").family] == ("recompute",)
    assert modes[resolve("sglang").family] == ("recompute",)
    assert [f for f, m in modes.items() if "swap" in m] == [resolve("vllm==0.8").family]


# ------------------------------------------------------------------ async (overlapped) scheduling
@pytest.mark.parametrize("system, on", [
    ("vllm", True),          # V1: SchedulerConfig.async_scheduling None -> on, from v0.14.0 (PR #27614)
    ("vllm==0.12", True),    # the same family: its command passes --async-scheduling (off by default there)
    ("vllm==0.8", False),    # V0: LLMEngine.step schedules, runs and processes in turn
    ("sglang", True),        # 0.5: ServerArgs.disable_overlap_schedule False -> event_loop_overlap
    ("tensorrt-llm", True),  # 1.x PyTorch backend: disable_overlap_scheduler False -> _executor_loop_overlap
    ("tgi", False)])         # TGI 3: nothing cited, the profile's default (off) stands
def test_each_profile_states_its_release_async_default(system, on):
    assert resolve(system).async_scheduling is on
    assert {s.async_scheduling for s in settings(system, model=MODEL, gpu="H100-SXM", max_new_tokens=1000)} == {on}


def test_vllm_async_default_release_is_one_definition():
    from kvlab.recommend.servers.vllm import ASYNC_DEFAULT_SINCE
    from kvlab.validate import SetUp

    def schedules_async(version: str, engine: str = "vllm-v1") -> bool:
        return SetUp(name="x", dataset="user", model=MODEL, gpu="H100-SXM", server_version=version,
                     engine=engine).schedules_async

    assert ASYNC_DEFAULT_SINCE == (0, 14)
    assert [schedules_async(v) for v in ("0.11.2", "0.13.0", "0.14.0", "0.19.0", "")] == [False, False, True, True,
                                                                                           True]
    assert not schedules_async("0.19.0", engine="vllm-v0")


def test_a_fitted_stack_overlaps_its_cpu_work_exactly_when_its_profile_schedules_async():
    from kvlab.costmodel import stacks

    fitted = [p for p in profiles().values() if p.stack != "none"]
    assert {p.key for p in fitted} == {"vllm>=0.11", "vllm 0.6-0.10"}
    for p in fitted:  # vllm-v1: max(GPU, CPU); vllm-v0: GPU + CPU
        assert stacks.load(p.stack).overlap is p.async_scheduling, p.key


def _cpu_stack(tmp_path, overlap: bool) -> str:
    """A cost-model file with the CPU terms fitted to vLLM V0 (7.8 ms + 0.50 ms a sequence), overlapped or not,
    on today's kernels."""
    from dataclasses import replace

    from kvlab.costmodel import stacks

    terms = replace(stacks.load("vllm-v0"), name=f"cpu-overlap-{overlap}", overlap=overlap, kernels=None, meta={})
    return str(stacks.save(terms, tmp_path / f"cpu-overlap-{overlap}.json"))


def test_overlapped_cpu_work_prices_an_iteration_at_most_the_synchronous_sum(tmp_path):
    from kvlab.costmodel import prefill_attention_pairs, resolve as resolve_cost, stacks

    t = stacks.load("vllm-v0")
    gpu_only, over, add = (resolve_cost(c, MODEL, "H100-SXM")
                           for c in (None, _cpu_stack(tmp_path, True), _cpu_stack(tmp_path, False)))
    # decode batches of S sequences at context C, and one whole 2,048-token prefill
    batches = [(s, s * int(prefill_attention_pairs(1, c)), s * (c + 1), s)
               for s in (1, 8, 64, 256, 1024) for c in (128, 2048)]
    batches.append((2048, int(prefill_attention_pairs(2048, 0)), 2048, 1))
    for tokens, pairs, kv, seqs in batches:
        g = t.gpu_time_scale * float(gpu_only.iteration_s(tokens, pairs, kv, seqs))
        cpu = t.overhead_s + t.overhead_s_per_seq * seqs
        o, a = float(over.iteration_s(tokens, pairs, kv, seqs)), float(add.iteration_s(tokens, pairs, kv, seqs))
        assert o == pytest.approx(max(g, cpu), rel=1e-9) and a == pytest.approx(g + cpu, rel=1e-9)
        assert o < a  # both parts are positive: hiding the CPU work saves min(GPU, CPU)


def test_an_async_profile_runs_each_batch_no_slower_than_its_synchronous_twin(tmp_path):
    """Through recommend's own path (serving_config -> capacity.serve -> the simulator): 64 equal requests
    all at t = 0 give the same batches with or without the one-iteration lag; the async setting priced
    with its CPU work overlapped, the synchronous twin with it added, iteration by iteration."""
    from dataclasses import replace

    import pandas as pd

    from kvlab.capacity import serve
    from kvlab.recommend.core import serving_config

    s = _default("sglang", "H100-SXM", max_model_len=8192)
    assert s.async_scheduling
    trace = pd.DataFrame({"prompt_tokens": [600] * 64, "output_tokens": [40] * 64})
    runs = {}
    for setting, overlap in ((s, True), (replace(s, async_scheduling=False), False)):
        cfg = serving_config(setting, model=MODEL, gpu="H100-SXM", tp=1, block_size=16, max_new_tokens=1000,
                             cost_model=_cpu_stack(tmp_path, overlap))
        assert cfg.async_scheduling is setting.async_scheduling
        runs[overlap] = serve(trace, cfg, None, record_iterations=True).iterations
    a, b = runs[True], runs[False]
    cols = ["batch_size", "prefill_tokens", "decode_tokens"]
    assert len(a) == len(b) > 40 and np.array_equal(a[cols].to_numpy(), b[cols].to_numpy())
    assert (a["duration_s"].to_numpy() < b["duration_s"].to_numpy()).all()
    assert a["duration_s"].sum() < b["duration_s"].sum()
