"""Collectives measured on a GPU host with and without peer-to-peer: reading, fitting, pricing, replaying."""
from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvlab.costmodel import cost_model, host_collectives as hc
from kvlab.costmodel.measured import build, constants, send_recv
from kvlab.specs import gpu, gpu_from_file
from kvlab.validate.records import RunRecord, SetUp

PAIR = "RTXPRO6000"


def _no_p2p(name: str):
    return replace(gpu(name), p2p=False)


def test_read_hardware_keeps_graphed_all_reduce_and_all_gather(tmp_path):
    """Times in seconds from ``us_graphed`` (``us`` where absent), reduce-scatter left out, the GPU's
    catalogue name, and each bad sample or missing key named with the file."""
    doc = {"spec": {"gpu_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"},
           "measured": {"at": "2026-09-08", "interconnect": {"npus": 2, "samples": [
               {"collective": "all_reduce", "bytes": 1024, "us": 20.0, "us_graphed": 10.0},
               {"collective": "all_gather", "bytes": 2048, "us": 12.0},
               {"collective": "reduce_scatter", "bytes": 1024, "us_graphed": 9.0}]}}}
    f = tmp_path / "hardware.yaml"
    f.write_text(yaml.safe_dump(doc))
    t = hc.read_hardware(f, p2p=False)
    assert list(t["collective"]) == ["all_reduce", "all_gather"] and set(t["gpu"]) == {PAIR}
    assert set(t["engine"]) == {"nccl"} and t["source"].iloc[0].endswith("measured 2026-09-08")
    assert t["time_s"].tolist() == pytest.approx([10e-6, 12e-6]) and not t["p2p"].any()
    curves = hc.curve_rows(t)  # a two-GPU all-gather is one send of the chunk each way
    assert list(curves["collective"]) == ["all_reduce", "send_recv"]
    assert set(curves["network"]) == {"rtxpro6000_no_p2p"}
    doc["measured"]["interconnect"]["samples"][0]["bytes"] = -1
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=r"hardware\.yaml: sample 0 \(all_reduce\) needs positive bytes"):
        hc.read_hardware(f, p2p=False)
    f.write_text(yaml.safe_dump({"spec": {"gpu_name": "RTXPRO6000"}}))
    with pytest.raises(ValueError, match=r"hardware\.yaml: expected spec\.gpu_name .*missing 'measured'"):
        hc.read_hardware(f, p2p=True)


def test_read_engine_allreduce_keeps_graph_mode_bf16_in_bytes(tmp_path):
    """aiconfigurator's engine all-reduce table: BF16 elements to bytes, ms to s, graph mode only, sizes of
    4 KiB-256 MiB, the device's catalogue name; a table without graph rows is refused naming the file."""
    t = pd.DataFrame({"framework": "vLLM", "version": "0.19.0", "device": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                      "kernel_source": "vLLM_custom_graph", "allreduce_dtype": "bfloat16", "num_gpus": 2,
                      "message_size": [1024, 4096, 4096, 2 ** 29], "latency": [0.01, 0.02, 0.05, 9.0],
                      "backend": ["vllm_graph", "vllm_graph", "vllm_eager", "vllm_graph"]})
    f = tmp_path / "custom_allreduce_perf.parquet"
    t.to_parquet(f)
    r = hc.read_engine_allreduce(f)
    assert r["message_bytes"].tolist() == [8192] and r["time_s"].tolist() == pytest.approx([2e-5])
    assert r[["gpu", "engine"]].iloc[0].tolist() == [PAIR, "vllm"] and r["p2p"].all()
    t.assign(backend="vllm_eager").to_parquet(f)
    with pytest.raises(ValueError, match="custom_allreduce_perf.parquet: needs graph-mode BF16 rows"):
        hc.read_engine_allreduce(f)


def test_read_engine_allreduce_takes_each_engine_and_refuses_a_table_filed_under_another(tmp_path):
    """TensorRT-LLM's table has no ``backend`` (its collector replays CUDA graphs): every BF16 row is kept,
    the engine is the table's ``framework``; a table whose ``kernel_source`` names another engine than its
    ``framework`` is refused, naming the file and both."""
    t = pd.DataFrame({"framework": "TRTLLM", "version": "1.3.0rc20", "device": "NVIDIA H100 80GB HBM3",
                      "kernel_source": "TRTLLM", "allreduce_dtype": ["bfloat16", "float16"], "num_gpus": 4,
                      "message_size": [2 ** 19, 2 ** 19], "latency": [0.0129, 0.02], "implementation": "trtllm"})
    f = tmp_path / "custom_allreduce_perf.parquet"
    t.to_parquet(f)
    r = hc.read_engine_allreduce(f)
    assert r[["gpu", "engine", "num_gpus", "message_bytes"]].values.tolist() == [["H100-SXM", "trtllm", 4, 2 ** 20]]
    assert r["time_s"].tolist() == pytest.approx([12.9e-6]) and r["source"].iloc[0].endswith("trtllm 1.3.0rc20 TP all-reduce")
    t.assign(framework="SGLang").to_parquet(f)
    with pytest.raises(ValueError, match=r"parquet: framework sglang but kernel_source \['TRTLLM'\]"):
        hc.read_engine_allreduce(f)
    t.drop(columns="kernel_source").to_parquet(f)
    with pytest.raises(ValueError, match="kernel_source"):
        hc.read_engine_allreduce(f)


def test_a_check_table_repeating_another_is_left_out_and_named(tmp_path):
    """A release folder holding another table's rows (L40S's vLLM 0.22.0 is 0.14.0's) adds nothing to check
    against: ``write`` leaves it out of the check table and says which file repeated which table."""
    def table(version: str, latency: float) -> Path:
        d = tmp_path / version
        d.mkdir()
        pd.DataFrame({"framework": "vLLM", "version": version, "device": "NVIDIA L40S", "kernel_source": "vLLM_custom_graph",
                      "allreduce_dtype": "bfloat16", "num_gpus": 2, "message_size": [2 ** 19], "latency": [latency],
                      "backend": "vllm_graph"}).to_parquet(d / "custom_allreduce_perf.parquet")
        return d / "custom_allreduce_perf.parquet"
    fitted, again, other = table("0.14.0", 0.06), table("0.22.0", 0.06), table("0.24.0", 0.05)
    left_out = hc.write([], [], [fitted], [again, other], path=tmp_path / "fit.csv", check_path=tmp_path / "chk.csv")
    assert len(left_out) == 1 and str(again) in left_out[0] and "vllm 0.14.0" in left_out[0]
    chk = hc.checks(tmp_path / "chk.csv")
    assert chk["source"].tolist() == ["aiconfigurator, vllm 0.24.0 TP all-reduce"]


def test_shipped_lines_hold_the_measurements_they_rest_on():
    """Each host network's NCCL all-reduce line reproduces every row it rests on within 13% (4 KiB-20 MiB);
    each GPU's TP all-reduce reproduces vLLM's own measured one (its custom all-reduce below 8 MiB, NCCL
    above) within 10% median at TP2 and TP4 and 20% at TP8, far closer than kvlab's model without it."""
    consts = constants()
    nets = consts["networks"]
    cr = hc.curve_rows(hc.rows())
    assert set(cr["network"]) == {"rtxpro6000_p2p", "rtxpro6000_no_p2p"}
    for net, g in cr[cr["collective"] == "all_reduce"].groupby("network"):
        fit = nets[net]["all_reduce"]["2"]
        pred = fit["latency_s"] + fit["s_per_byte"] * g["message_bytes"].to_numpy()
        assert len(g) >= 12 and np.abs(pred / g["time_s"].to_numpy() - 1).max() < 0.13, net
    without = copy.deepcopy(consts)
    for e in without["gpus"].values():
        e.pop("engine_all_reduce", None)
    er = hc.engine_rows(hc.rows())
    assert set(er["gpu"]) == {"A100-80GB-SXM", "B200", "H100-SXM", "H200", "L40S", PAIR}
    for (g, n), rows_ in er.groupby(["gpu", "num_gpus"]):
        err = [_allreduce_errors(build("Llama-3-8B", g, tp=int(n), constants=c), rows_) for c in (consts, without)]
        assert np.median(err[0]) < (0.10 if n <= 4 else 0.20), (g, n)
        assert np.median(err[0]) < np.median(err[1]) or n == 8, (g, n)


def _allreduce_errors(cm, rows_: pd.DataFrame) -> np.ndarray:
    """|predicted / measured - 1| of ``cm``'s all-reduce at each row's message size."""
    pred = np.array([cm.allreduce_s(b / cm.activation_bytes_per_token) for b in rows_["message_bytes"]])
    return np.abs(pred / rows_["time_s"].to_numpy() - 1)


def test_later_vllm_releases_all_reduce_as_the_fitted_one_predicts():
    """Fitted to each GPU's earliest vLLM table, kvlab prices the later releases' TP all-reduce (NVIDIA's
    tables, never fitted to) within 15% MAPE at TP2 and TP4, 35% at TP8 (where the custom all-reduce
    switches algorithm inside the fitted range) on the NVLinked GPUs. Not on the RTX PRO 6000: vLLM
    0.24.0's all-reduce there (an 8-GPU host) is 3x faster at 1 MiB than 0.19.0's (a 2-GPU one), so
    kvlab, fitted to 0.19.0 as the runs it replays ran, prices it at least twice too slow at TP2."""
    chk = hc.checks()
    chk = chk[chk["engine"] == "vllm"]
    assert {"vllm 0.19.0", "vllm 0.24.0"} <= {s.split(", ")[-1].replace(" TP all-reduce", "") for s in chk["source"]}
    for (g, src, n), rows_ in chk[chk["gpu"] != PAIR].groupby(["gpu", "source", "num_gpus"]):
        mape = float(np.mean(_allreduce_errors(cost_model("Llama-3-8B", g, tp=int(n)), rows_)))
        assert mape < (0.15 if n <= 4 else 0.35), (g, src, n, mape)
    rtx = chk[(chk["gpu"] == PAIR) & (chk["num_gpus"] == 2)]
    fitted = hc.engine_rows(hc.rows())
    fitted = fitted[fitted["gpu"] == PAIR].set_index("message_bytes")["time_s"]
    assert fitted.loc[1048576] / rtx.set_index("message_bytes")["time_s"].loc[1048576] > 2.5
    assert np.median(_allreduce_errors(cost_model("Qwen3-32B", PAIR, tp=2), rtx)) > 1.0


def _by_size(t: pd.DataFrame) -> pd.Series:
    return t[t["num_gpus"] == 2].set_index("message_bytes")["time_s"]


def test_on_the_rtx_pro_6000_the_host_sets_the_all_reduce_not_the_engine():
    """NVIDIA's RTX PRO 6000 tables come from two hosts: one measured only 2 GPUs (vLLM 0.19.0, SGLang
    0.5.10, TensorRT-LLM 1.3.0rc10), one 8 (vLLM 0.24.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20). On each
    host vLLM's and SGLang's TP2 all-reduce agree within 5% in the median, and all three within 5% from
    16 MiB (where the link, not the kernel, sets the time); between the hosts every engine's is over twice
    as fast on the 8-GPU one at 16 MiB. So the 0.19.0-to-0.24.0 change is the host's."""
    t = pd.concat([hc.rows(), hc.checks()])
    t = t[(t["gpu"] == PAIR) & (t["engine"] != "nccl")]
    host_gpus = t.groupby("source")["num_gpus"].max()
    hosts = {n: {s.split(", ")[1].split()[0]: _by_size(t[t["source"] == s]) for s in host_gpus[host_gpus == n].index}
             for n in (2, 8)}
    assert all(set(h) == {"vllm", "sglang", "trtllm"} for h in hosts.values())
    for h in hosts.values():
        assert abs(np.median((h["sglang"] / h["vllm"]).dropna()) - 1) < 0.05
        for engine in ("sglang", "trtllm"):
            ratio = (h[engine] / h["vllm"]).dropna()
            assert (abs(ratio[ratio.index >= 2 ** 24] - 1) < 0.05).all() and (ratio.index >= 2 ** 24).sum() >= 5
    for engine in ("vllm", "sglang", "trtllm"):
        assert hosts[2][engine].loc[2 ** 24] / hosts[8][engine].loc[2 ** 24] > 2.0


def test_other_engines_tp_all_reduce_against_vllms():
    """kvlab prices every server's TP all-reduce from vLLM's. On the NVLinked H100 and H200, SGLang 0.5.9 and
    0.5.10's own (NVIDIA's tables, never fitted to) are within 15% MAPE at TP2-4, as vLLM's later releases;
    SGLang 0.5.14's and TensorRT-LLM's are faster at small messages, so there kvlab is over 20% slow in the
    median at TP2 (a known miss, shown in notebook 08's section 2d)."""
    chk = hc.checks()
    for (g, src, n), rows_ in chk[chk["gpu"].isin(["H100-SXM", "H200"]) & (chk["engine"] != "vllm")].groupby(
            ["gpu", "source", "num_gpus"]):
        rel = _allreduce_errors(cost_model("Llama-3-8B", g, tp=int(n)), rows_)
        if "sglang 0.5.9 " in src or "sglang 0.5.10 " in src:
            assert n == 8 or np.mean(rel) < 0.15, (g, src, n)
        elif n == 2:
            cm = cost_model("Llama-3-8B", g, tp=2)
            signed = np.array([cm.allreduce_s(b / cm.activation_bytes_per_token) for b in rows_["message_bytes"]])
            assert np.median(signed / rows_["time_s"].to_numpy() - 1) > 0.20, (g, src)


def test_vllm_all_reduce_with_p2p_costs_about_what_nccl_costs_without():
    """Independent measurements of RTX PRO 6000 pairs: NCCL without P2P is slower than with it at every size
    both were measured (1.9x at 1.25 MiB); vLLM 0.19.0's own all-reduce on a host whose NCCL runs at the P2P
    speed is 1.4-2.4x NCCL's with P2P from 4 KiB (its custom all-reduce reads the peer over PCIe), and
    within 10% of NCCL's without P2P where both were measured (16 MiB)."""
    t = hc.rows()
    t = t[t["gpu"] == PAIR]
    nccl = t[(t["engine"] == "nccl") & (t["collective"] == "all_reduce")]
    both = nccl.pivot_table(index="message_bytes", columns="p2p", values="time_s").dropna()
    assert len(both) >= 10 and (both[False] > both[True]).all()
    assert both.loc[1310720, False] / both.loc[1310720, True] == pytest.approx(1.91, abs=0.02)
    vllm = t[t["engine"] == "vllm"].set_index("message_bytes")["time_s"]
    over_p2p = (vllm / nccl[nccl["p2p"]].set_index("message_bytes")["time_s"]).dropna()
    assert len(over_p2p) >= 10 and over_p2p.between(1.4, 2.4).all() and over_p2p.loc[1048576] > 2.0
    over_host = (vllm / nccl[~nccl["p2p"]].set_index("message_bytes")["time_s"]).dropna()
    assert len(over_host) >= 1 and over_host.between(0.9, 1.1).all()


@pytest.mark.parametrize("p2p", [True, False])
def test_rtx_pro_6000_tp2_all_reduce_is_what_vllm_pays_on_that_host(p2p):
    """Qwen3-32B TP2's all-reduce of T tokens (T x 5,120 x 2 bytes) is the measured one vLLM pays in the
    host's configuration (its own all-reduce with P2P, NCCL's without) within 12% at every measured size;
    the label says which."""
    g = gpu(PAIR) if p2p else _no_p2p(PAIR)
    cm = cost_model("Qwen3-32B", g, tp=2)
    assert ("no GPU peer-to-peer: rtxpro6000_no_p2p" in cm.label) == (not p2p)
    assert ("TP all-reduce: aiconfigurator, vllm 0.19.0 TP all-reduce, measured" in cm.label) == p2p
    t = hc.rows()
    meas = t[(t["gpu"] == PAIR) & (t["collective"] == "all_reduce") & (t["p2p"] == p2p)
             & (t["engine"] == ("vllm" if p2p else "nccl"))]
    assert len(meas) >= 12
    for b, s in zip(meas["message_bytes"], meas["time_s"]):
        assert cm.allreduce_s(b / (5120 * 2)) == pytest.approx(s, rel=0.12)


def test_no_p2p_turns_off_custom_all_reduce_and_carries_the_host_line_by_host_link():
    """An NVLinked H100 on a host without peer-to-peer: no custom all-reduce, and the RTX PRO 6000 host's
    line carried by the host-link ratio (both PCIe Gen5 x16: 1); an L4 (Gen4 x16, half the link) pays
    twice the seconds per byte. Pipeline sends take the same line."""
    ref = cost_model("Llama-3-8B", _no_p2p(PAIR), tp=2)
    h100 = cost_model("Llama-3-8B", _no_p2p("H100-SXM"), tp=2)
    assert cost_model("Llama-3-8B", "H100-SXM", tp=2).custom_allreduce_max_bytes > 0
    assert h100.custom_allreduce_max_bytes == 0 and "rtxpro6000_no_p2p collectives of RTXPRO6000 x1.00" in h100.label
    assert h100.allreduce_s(512.0) == pytest.approx(ref.allreduce_s(512.0))
    l4 = cost_model("Llama-3-8B", _no_p2p("L4"), tp=2)
    ratio = gpu("L4").host_link_bytes_per_s / gpu(PAIR).host_link_bytes_per_s
    assert l4.allreduce_s_per_byte == pytest.approx(ref.allreduce_s_per_byte / ratio)
    assert send_recv(_no_p2p("H100-SXM")) == pytest.approx(send_recv(_no_p2p(PAIR)))
    assert send_recv(_no_p2p("H100-SXM"))[1] < send_recv("H100-SXM")[1] / 10


def test_roofline_without_p2p_sends_at_half_the_host_link():
    """The spec-sheet model's all-reduce of T tokens without peer-to-peer, by hand: 2 layers' worth per
    layer x ring 2(tp - 1)/tp x hidden x 2 bytes over half the host link."""
    g, m = _no_p2p("H100-SXM"), "Llama-3-8B"
    rf = cost_model(m, g, tp=2, source="roofline")
    assert rf.interconnect_bytes_per_s == g.host_link_bytes_per_s / 2 and "no GPU peer-to-peer" in rf.label
    with_p2p = cost_model(m, "H100-SXM", tp=2, source="roofline")
    t = 1000
    extra = rf.allreduce_bytes_per_token * t * (1 / rf.interconnect_bytes_per_s - 1 / with_p2p.interconnect_bytes_per_s)
    assert rf.iteration_s(t, t, t, 1) - with_p2p.iteration_s(t, t, t, 1) == pytest.approx(extra)
    assert rf.allreduce_bytes_per_token == 2 * 32 * 1.0 * 4096 * 2  # 32 layers, ring 1 at TP2, hidden 4,096


def test_gpu_spec_file_takes_p2p(tmp_path):
    spec = {"name": "MyCard", "memory_mib": 49152, "hbm_bandwidth_gbps": 960, "bf16_dense_tflops": 180,
            "host_link_gbps": 31.5, "interconnect_gbps": 31.5, "internode_gbps": 12.5}
    f = tmp_path / "gpu.yaml"
    f.write_text(yaml.safe_dump({**spec, "p2p": False}))
    assert gpu_from_file(f).p2p is False
    f.write_text(yaml.safe_dump(spec))
    assert gpu_from_file(f).p2p is True
    f.write_text(yaml.safe_dump({**spec, "p2p": "no"}))
    with pytest.raises(ValueError, match=r"gpu\.yaml: p2p must be true or false, got 'no'"):
        gpu_from_file(f)


def _record(p2p: bool) -> RunRecord:
    n = 24
    req = pd.DataFrame({"arrival_s": np.arange(n) * 0.05, "prompt_tokens": 600, "output_tokens": 40,
                        "ttft_s": 0.1, "tpot_s": 0.03, "e2e_s": 1.3})
    return RunRecord(SetUp(name="pair", dataset="d", model="Llama-3.1-8B", gpu="H100-SXM", tp=2, p2p=p2p,
                           clock_start="engine queue"), req)


def test_a_run_without_p2p_is_replayed_on_the_host_path():
    """The set-up's p2p reaches the replay: the same TP2 run on NVLinked H100s is slower per token and to
    first token without peer-to-peer (host memory's path instead of NVLink), says so, and a bad value is
    refused naming the run and the key."""
    from kvlab.validate.replay import replay

    on, off = replay(_record(True)), replay(_record(False))
    assert "no GPU peer-to-peer" in off.cost_model and "no GPU peer-to-peer" not in on.cost_model
    assert "(no GPU peer-to-peer)" in off.record.setup.describe()
    assert off.predicted["tpot_s"].mean() > on.predicted["tpot_s"].mean()
    assert off.predicted["ttft_s"].mean() > on.predicted["ttft_s"].mean()
    with pytest.raises(ValueError, match="run x: p2p must be true or false"):
        SetUp(name="x", dataset="d", model="Llama-3.1-8B", gpu=PAIR, p2p="no")


def test_llmservingsim_multi_gpu_runs_are_replayed_without_p2p():
    """The shared LLMServingSim runs on two RTX PRO 6000s (TP2, DP2) are set up without peer-to-peer, with
    the reason among their assumptions; the single-GPU runs keep the default."""
    from kvlab.validate.readers import SHARED_SERVING, read_llmservingsim

    if not (SHARED_SERVING / "llmservingsim_vllm_summary.csv").is_file():
        pytest.skip("../shared/data/serving is absent")
    for r in read_llmservingsim():
        s = r.setup
        multi = s.tp * s.dp > 1
        assert s.p2p is not multi, s.name
        assert any("peer-to-peer" in a and "2026-09-26" in a for a in s.assumptions) is multi


def test_expert_parallel_gathers_run_on_nccl_and_tp_on_vllms_all_reduce():
    """vLLM's expert-parallel all-gather and reduce-scatter go through NCCL (its all2all manager), its TP
    all-reduce through its own: on the P2P host, Qwen3-30B-A3B DP2 + EP2 prices the gathers on NCCL's line
    and Qwen3-32B TP2 its all-reduce on vLLM's lines (below and above 8 MiB), each as fitted; an
    extrapolated GPU (H100-PCIe) or one without P2P keeps the model without them."""
    consts = constants()
    nccl = consts["networks"]["rtxpro6000_p2p"]["all_reduce"]["2"]
    ep = cost_model("Qwen3-30B-A3B", PAIR, tp=1, ep=2)
    assert (ep.ep_comm_latency_s, ep.ep_comm_s_per_byte) == pytest.approx((nccl["latency_s"], nccl["s_per_byte"]))
    eng = consts["gpus"][PAIR]["engine_all_reduce"]
    tp = cost_model("Qwen3-32B", PAIR, tp=2)
    small, large = eng["fits"]["2"]["small"], eng["fits"]["2"]["large"]
    assert (tp.custom_allreduce_latency_s, tp.custom_allreduce_s_per_byte) == pytest.approx(
        (small["latency_s"], small["s_per_byte"]))
    assert (tp.allreduce_latency_s, tp.allreduce_s_per_byte) == pytest.approx((large["latency_s"], large["s_per_byte"]))
    assert tp.custom_allreduce_max_bytes == eng["split_bytes"] == 8 * 2 ** 20
    for other in (cost_model("Llama-3-8B", "H100-PCIe", tp=2), cost_model("Llama-3-8B", _no_p2p("H100-SXM"), tp=2)):
        assert other.custom_allreduce_s_per_byte == 0 and "TP all-reduce: aiconfigurator" not in other.label


def test_why_names_where_a_pcie_runs_collectives_come_from():
    """Notebook 09's reasons say which measurement priced a PCIe run's collectives: vLLM's own all-reduce
    (P2P, a measured TP), NCCL through host memory (no P2P, and that the set-up says so), NCCL of the GPU's
    own host (RTX PRO 6000 EP gathers with P2P), or another link's carried curves (RTX 4090)."""
    from kvlab.validate.study import why

    row = {"ttft_growth_meas": 1.0, "overload_meas": False, "ttft_mean_err": 0.0, "tpot_mean_err": 0.0,
           "backlog_meas": 0, "pool_pages": 1000, "preemptions_pred": 0, "ttft_mean_meas": 0.1, "ttft_mean_pred": 0.1}
    req = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": 100, "output_tokens": 10, "ttft_s": 0.1,
                        "tpot_s": 0.01, "e2e_s": 0.2})

    def reason(**kw):
        return why(row, RunRecord(SetUp(name="r", dataset="d", **kw), req))

    assert "vLLM's own all-reduce as measured on another host with this GPU (aiconfigurator, vllm 0.14.0" in \
        reason(model="Llama-3-8B", gpu="L40S", tp=4)
    off = reason(model="Qwen3-32B", gpu=PAIR, tp=2, p2p=False)
    assert "rtxpro6000_no_p2p collectives (NCCL through host memory)" in off and "set-up's" in off
    assert "NCCL measured on this GPU's own host" in reason(model="Qwen3-30B-A3B", gpu=PAIR, dp=2, expert_parallel=2)
    assert "another link's measured curves carried" in reason(model="Llama-3-8B", gpu="RTX4090", tp=2)


def test_notebook_09s_pcie_lines_are_the_models():
    """The lines section 2b shows are the cost model's own: without P2P the NCCL host-memory fit, with P2P
    vLLM's two measured lines, and a 1 MiB all-reduce priced on the custom one (below 8 MiB)."""
    from kvlab.validate.study import pcie_lines

    t = pcie_lines()
    nccl = constants()["networks"]["rtxpro6000_no_p2p"]["all_reduce"]["2"]
    off = t[~t["GPU peer-to-peer"]].iloc[0]
    assert off["latency (us)"] == pytest.approx(nccl["latency_s"] * 1e6)
    assert off["GB/s"] == pytest.approx(1e-9 / nccl["s_per_byte"])
    small = constants()["gpus"][PAIR]["engine_all_reduce"]["fits"]["2"]["small"]
    on = t[t["GPU peer-to-peer"]]
    assert len(on) == 2 and on["1 MiB all-reduce, as priced (us)"].iloc[0] == pytest.approx(
        (small["latency_s"] + small["s_per_byte"] * 2 ** 20) * 1e6)
