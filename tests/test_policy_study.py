"""kvlab.studies.policy_study: the helpers notebook 04 is built from, on hand-made inputs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.sim import simulate
from kvlab.studies import policy_study as study

KW = dict(model="Llama-2-7B", gpu="A100-80GB-SXM")


def test_tail_share_by_hand():
    t = pd.DataFrame({"e2e_s": np.arange(1.0, 11.0), "outcome": "finished_stopped",
                      "num_preemptions": [0, 0, 1, 0, 0, 0, 0, 0, 0, 2]})
    # p90 of 1..10 is 9.1: of the preempted (e2e 3 and 10) one is above it
    assert study.tail_share(t) == 0.5
    assert np.isnan(study.tail_share(t.assign(num_preemptions=0)))
    aborted = t.assign(outcome=["finished_aborted"] + ["finished_stopped"] * 9)
    assert study.tail_share(aborted) == 0.5  # the aborted row does not count


def test_decode_scaling_recovers_known_slopes():
    batch = np.array([1, 2, 4, 8, 16, 32])
    it = pd.DataFrame({"batch_size": batch, "decode_tokens": batch, "prefill_tokens": 0, "duration_s": 0.02})
    slope, r = study.decode_scaling(it)
    assert slope == pytest.approx(1.0) and r == pytest.approx(1.0)
    it["duration_s"] = 0.02 + 0.001 * batch
    expected = np.polyfit(np.log(batch), np.log(batch / it["duration_s"]), 1)[0]
    assert study.decode_scaling(it)[0] == pytest.approx(expected)
    # iterations with prefill are ignored
    mixed = pd.concat([it, it.assign(prefill_tokens=100, duration_s=5.0)])
    assert study.decode_scaling(mixed)[0] == pytest.approx(expected)
    with pytest.raises(ValueError, match="two batch sizes"):
        study.decode_scaling(it.iloc[:1])


def test_overflow_study_counts_the_overrun():
    # prompt 16, block 16, reserve 32: 3 pages hold a context of 48 tokens, i.e. 33 outputs.
    w = pd.DataFrame({"prompt_tokens": [16] * 5, "output_tokens": [10, 30, 33, 34, 60]})
    ov = study.overflow_study(w, reserve_tokens=32, max_new_tokens=128, pool_pages=100, **KW)
    assert ov["policy"].tolist() == ["reserve_max", "tgi", "tgi", "tgi"]
    base, rec, swap, rej = (ov.iloc[i] for i in range(4))
    assert (rec["preemption_mode"], swap["preemption_mode"], rej["preemption_mode"]) == ("recompute", "swap", "reject")
    assert base["num_truncated"] == 3 and base["preempted_request_frac"] == 0  # 33, 34, 60 cut at 32
    assert rej["num_aborted"] == 2                                            # 34 and 60 overrun
    assert rec["num_aborted"] == 0 and swap["num_aborted"] == 0
    assert rec["preempted_request_frac"] == pytest.approx(2 / 5)
    assert swap["preempted_request_frac"] == pytest.approx(2 / 5)


def test_policy_sweep_rows():
    w = pd.DataFrame({"prompt_tokens": [16, 32], "output_tokens": [5, 9]})
    sw = study.policy_sweep(w, ["vllm", "reserve_max"], [8, 16], pool_pages=50, **KW)
    assert sw[["policy", "max_new_tokens"]].values.tolist() == [["vllm", 8], ["vllm", 16],
                                                                ["reserve_max", 8], ["reserve_max", 16]]
    one = simulate(w, "reserve_max", max_new_tokens=16, pool_pages=50, **KW).summary
    assert sw.iloc[3]["tokens_per_s"] == one["tokens_per_s"]
