"""Collectives measured on a GPU host with and without peer-to-peer: reading, fitting, pricing, replaying."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import yaml

from kvlab.costmodel import cost_model, host_collectives as hc
from kvlab.costmodel.measured import constants, send_recv
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


def test_shipped_lines_hold_every_measured_size_and_the_host_path_is_slower():
    """The fitted alpha-beta lines reproduce every shipped all-reduce measurement (4 KiB-20 MiB) within
    15%, and without peer-to-peer every size measured both ways is slower: host memory's path."""
    rows = hc.rows()
    nets = constants()["networks"]
    ar = rows[rows["collective"] == "all_reduce"]
    for p2p, g in ar.groupby("p2p"):
        fit = nets[hc.network_name(PAIR, bool(p2p))]["all_reduce"]["2"]
        pred = fit["latency_s"] + fit["s_per_byte"] * g["message_bytes"].to_numpy()
        assert np.abs(pred / g["time_s"].to_numpy() - 1).max() < 0.15
    both = ar.pivot_table(index="message_bytes", columns="p2p", values="time_s").dropna()
    assert len(both) >= 10 and (both[False] > both[True]).all()
    # at the sizes a decode and a prefill of Qwen3-32B move (1.25 MiB, 20 MiB): 1.9x and 2.2x slower
    assert both.loc[1310720, False] / both.loc[1310720, True] == pytest.approx(1.91, abs=0.02)
    assert both.loc[20971520, False] / both.loc[20971520, True] == pytest.approx(2.23, abs=0.02)


@pytest.mark.parametrize("p2p", [True, False])
def test_rtx_pro_6000_tp2_all_reduce_is_its_hosts_measurement(p2p):
    """Qwen3-32B TP2's all-reduce of T tokens (T x 5,120 x 2 bytes) is the measured one of the host's
    configuration within 15% at every measured size; no custom all-reduce on PCIe; the label says which."""
    g = gpu(PAIR) if p2p else _no_p2p(PAIR)
    cm = cost_model("Qwen3-32B", g, tp=2)
    assert cm.custom_allreduce_max_bytes == 0
    assert ("no GPU peer-to-peer: rtxpro6000_no_p2p" in cm.label) == (not p2p)
    rows = hc.rows()
    meas = rows[(rows["collective"] == "all_reduce") & (rows["p2p"] == p2p)]
    for b, t in zip(meas["message_bytes"], meas["time_s"]):
        assert cm.allreduce_s(b / (5120 * 2)) == pytest.approx(t, rel=0.15)


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
    return RunRecord(SetUp(name="pair", dataset="d", model="Llama-3.1-8B", gpu=PAIR, tp=2, p2p=p2p,
                           clock_start="engine queue"), req)


def test_a_run_without_p2p_is_replayed_on_the_host_path():
    """The set-up's p2p reaches the replay: the same TP2 run is slower per token and to first token
    without peer-to-peer, says so, and a bad value is refused naming the run and the key."""
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
