"""Hand-worked scenarios: a tiny pool, a few requests, every iteration index worked out on paper.

Every iteration lasts exactly 1 s (a cost model with only a 1 s fixed overhead), so the
iteration ``k`` of an event ends at ``k + 1`` seconds when nothing idles.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.costmodel import roofline
from kvlab.sim import simulate

ONE_SECOND = dataclasses.replace(
    roofline("Llama-2-7B", "A100-80GB-SXM"), linear_flops_per_token=0.0, attention_flops_per_pair=0.0,
    weight_bytes=0.0, kv_bytes_per_token=0.0, allreduce_bytes_per_token=0.0,
    allreduce_latency_s_per_iteration=0.0, iteration_overhead_s=1.0)


def run(prompts, outputs, policy, *, arrival_s=None, **kw):
    w = pd.DataFrame({"prompt_tokens": prompts, "output_tokens": outputs})
    if arrival_s is not None:
        w["arrival_s"] = arrival_s
    kw.setdefault("block_size", 4)
    kw.setdefault("max_num_batched_tokens", 16)
    return simulate(w, policy, model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=ONE_SECOND,
                    record_iterations=True, **kw)


def col(res, name):
    return res.requests[name].tolist()


def test_reserve_max_waits_for_a_finish():
    # Each reserves ceil((4 + 8) / 4) = 3 pages of 6: r0, r1 run; r2 waits for r0 (done in iter 2).
    res = run([4, 4, 4], [3, 8, 2], "reserve_max", max_new_tokens=8, pool_pages=6)
    assert col(res, "admitted_iter") == [0, 0, 3]
    assert col(res, "first_token_iter") == [0, 0, 3]
    assert col(res, "finish_iter") == [2, 7, 4]
    assert col(res, "max_reserved_pages") == [3, 3, 3]
    assert col(res, "max_used_pages") == [2, 3, 2]  # contexts 6, 11, 5 tokens
    assert col(res, "num_preemptions") == [0, 0, 0]
    assert col(res, "ttft_s") == [1.0, 1.0, 4.0]
    assert col(res, "e2e_s") == [3.0, 8.0, 5.0]
    it = res.iterations
    assert it["pages_reserved"].tolist()[:4] == [6, 6, 6, 6]
    assert it["batch_size"].tolist() == [2, 2, 2, 2, 2, 1, 1, 1]
    assert res.summary["max_running"] == 2


@pytest.mark.parametrize("policy,admitted,finish,reserved", [
    # prompt 4 + output 5 = 9 tokens; pool 10 pages of 4 tokens.
    ("orca_oracle", [0, 0, 0], [4, 4, 4], 3),     # ceil(9/4) = 3 pages: all three fit
    ("orca_pow2", [0, 0, 5], [4, 4, 9], 4),       # next power of two 16 tokens = 4 pages: two fit
    ("orca_max", [0, 5, 10], [4, 9, 14], 8),      # max_model_len 32 tokens = 8 pages: one fits
    ("reserve_max", [0, 0, 5], [4, 4, 9], 5),     # 4 + 16 = 20 tokens = 5 pages: two fit
])
def test_orca_baselines_reserve_true_pow2_and_max(policy, admitted, finish, reserved):
    kw = {"max_model_len": 32} if policy == "orca_max" else {}
    res = run([4, 4, 4], [5, 5, 5], policy, max_new_tokens=16, pool_pages=10, **kw)
    assert col(res, "admitted_iter") == admitted
    assert col(res, "finish_iter") == finish
    assert col(res, "max_reserved_pages") == [reserved] * 3
    assert col(res, "generated_tokens") == [5, 5, 5]


def test_orca_max_reserves_the_maximum_in_total_not_on_top_of_the_prompt():
    # prompt 4 + output 5, max_new_tokens 32, max_model_len 16: each reserves 16 tokens = 4 pages
    # of the 10 (not 4 + 32 = 36 tokens = 9 pages, which would admit one at a time). Two run
    # together (iters 0-4: 1 prefill + 4 decodes); r2 waits for them and runs in iters 5-9.
    res = run([4, 4, 4], [5, 5, 5], "orca_max", max_new_tokens=32, pool_pages=10, max_model_len=16)
    assert col(res, "admitted_iter") == [0, 0, 5]
    assert col(res, "finish_iter") == [4, 4, 9]
    assert col(res, "max_reserved_pages") == [4, 4, 4]


def test_vllm_preempts_most_recent_and_recomputes():
    # 4 pages. Both admitted on 1 prompt page; they grow to 2 pages each (iter 1). In iter 5 r0
    # needs a 3rd page: r1 (most recent) is preempted with 5 tokens generated; nothing admitted.
    # r1 needs ceil((4 + 5) / 4) = 3 pages: it waits until r0 finishes (iter 8, 9 tokens), is
    # prefilled again over 9 tokens in iter 9 (6th token) and finishes in iter 12.
    res = run([4, 4], [9, 9], "vllm", max_new_tokens=16, pool_pages=4, watermark_frac=0.0)
    assert col(res, "admitted_iter") == [0, 0]
    assert col(res, "finish_iter") == [8, 12]
    assert col(res, "num_preemptions") == [0, 1]
    assert col(res, "generated_tokens") == [9, 9]
    it = res.iterations
    assert it["num_preempted"].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert it.loc[9, "prefill_tokens"] == 9 and it.loc[9, "decode_tokens"] == 0
    assert it["pages_used"].tolist() == [2, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3]
    assert res.summary["preemptions_per_request"] == 0.5


def test_vllm_watermark_blocks_admission():
    # watermark int(0.25 x 8) = 2 pages: r0 takes 2 pages (prompt 8), r1's 2 would leave 4 >= 2,
    # r2's 2 would leave 2 >= 2, r3's would leave 0 < 2.
    res = run([8, 8, 8, 8], [1, 1, 1, 1], "vllm", max_new_tokens=4, pool_pages=8, watermark_frac=0.25,
              max_num_batched_tokens=64)
    assert col(res, "admitted_iter") == [0, 0, 0, 1]


def test_vllm_swap_moves_pages_and_resumes_before_waiting():
    # As the recompute case, but r1's 8 cached tokens (2 pages) go to the CPU pool in iter 5 and
    # come back in iter 9, where it decodes one token (no prefill again); r2 arrives at 5.5 s and
    # may only be admitted after r1 has resumed.
    res = run([4, 4, 4], [9, 9, 1], "vllm", max_new_tokens=16, pool_pages=4, watermark_frac=0.0,
              preemption_mode="swap", arrival_s=[0.0, 0.0, 5.5])
    page_copy_s = 5e-6 + 4 * (2 * 32 * 32 * 128 * 2) / 31.5e9  # latency + 2 MiB over PCIe Gen4
    assert res.params["page_copy_s"] == pytest.approx(page_copy_s)
    assert col(res, "num_swaps") == [0, 1, 0]
    assert col(res, "finish_iter")[:2] == [8, 12]
    it = res.iterations
    assert it["swap_pages_moved"].tolist()[5] == 2 and it["swap_pages_moved"].tolist()[9] == 2
    assert it.loc[5, "duration_s"] == pytest.approx(1 + 2 * page_copy_s)
    assert it["pages_swapped"].tolist()[5:10] == [2, 2, 2, 2, 0]
    # r2 needs 1 page, free in iters 6-8, but waits behind the swapped r1. In iter 9 r1 resumes
    # (3 pages reserved, one decode) and r2 is admitted on the last page (its 4-token prefill).
    assert col(res, "admitted_iter")[2] == 9
    assert it.loc[9, "prefill_tokens"] == 4 and it.loc[9, "decode_tokens"] == 1


def test_vllm_swap_falls_back_to_recompute_when_cpu_pool_full():
    res = run([4, 4], [9, 9], "vllm", max_new_tokens=16, pool_pages=4, watermark_frac=0.0,
              preemption_mode="swap", cpu_pool_pages=1)
    assert col(res, "num_swaps") == [0, 0]
    assert col(res, "num_preemptions") == [0, 1]
    assert res.iterations.loc[9, "prefill_tokens"] == 9


def test_vllm_reject_aborts_the_victim():
    res = run([4, 4], [9, 9], "vllm", max_new_tokens=16, pool_pages=4, watermark_frac=0.0,
              preemption_mode="reject")
    assert col(res, "outcome") == ["finished_stopped", "finished_aborted"]
    assert col(res, "abort_reason") == ["", "preempted_rejected"]
    assert col(res, "generated_tokens") == [9, 5]
    assert col(res, "finish_iter") == [8, 5]
    assert res.summary["num_aborted"] == 1 and np.isnan(res.requests.loc[1, "e2e_s"])


def test_tgi_requeues_a_request_that_outgrows_its_capped_reservation():
    # cap 2: reserve 4 + 2 = 6 tokens = 2 pages. In iter 5 the context reaches 9 tokens, a 3rd
    # page: the request requeues itself (no token that iteration), is readmitted in iter 6 with
    # 4 + 5 + min(11, 2) = 11 tokens = 3 pages, prefills 9 tokens and produces its 6th token.
    res = run([4], [6], "tgi", max_new_tokens=16, pool_pages=8, cap_tokens=2)
    assert col(res, "finish_iter") == [6]
    assert col(res, "num_preemptions") == [1]
    assert col(res, "max_reserved_pages") == [3]
    it = res.iterations
    assert it["duration_s"].tolist() == [1, 1, 1, 1, 1, 0, 1]
    assert it.loc[6, "prefill_tokens"] == 9


def test_tgi_reject_mode_aborts_the_overflow():
    res = run([4], [6], "tgi", max_new_tokens=16, pool_pages=8, cap_tokens=2, preemption_mode="reject")
    assert col(res, "abort_reason") == ["preempted_rejected"] and col(res, "generated_tokens") == [5]


def test_sglang_admits_on_ratio_and_retracts():
    # init ratio 0.1: r0 charges 4 + ceil(0.1 x 16) = 6 tokens, r1 4 + ceil(0.1 x 32) = 8 of the
    # 12 left: both admitted. From then on the run is the vLLM one (on-demand pages, r1 retracted
    # in iter 5); the ratio jumps to 1, but the idle server admits r1 after r0 finishes.
    res = run([4, 4], [9, 9], "sglang", max_new_tokens=16, pool_pages=4, init_ratio=0.1)
    assert col(res, "admitted_iter") == [0, 0]
    assert col(res, "finish_iter") == [8, 12]
    assert col(res, "num_preemptions") == [0, 1]
    # At the default ratio 0.7: r1 would charge 4 + ceil(0.7 x 32) = 27 tokens > 12: it waits,
    # and is admitted only when the server idles (r0 done in iter 8).
    res = run([4, 4], [9, 9], "sglang", max_new_tokens=16, pool_pages=4)
    assert col(res, "admitted_iter") == [0, 9]
    assert col(res, "num_preemptions") == [0, 0]


class _FixedPrediction:
    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, dtype=float)

    def ppf(self, q):
        return self.tokens


def test_predicted_reserves_the_quantile_and_grows_on_demand():
    # r0 predicted 2 tokens: reserves 4 + 2 = 6 tokens = 2 pages, grows to 3 on demand in iter 5.
    # r1 predicted 8: 4 + 8 = 12 tokens = 3 pages > the 2 left: it waits until r0 finishes (iter 8).
    res = run([4, 4], [9, 9], "predicted", max_new_tokens=16, pool_pages=4,
              prediction=_FixedPrediction([2, 8]))
    assert col(res, "admitted_iter") == [0, 9]
    assert col(res, "finish_iter") == [8, 17]
    assert col(res, "max_reserved_pages") == [3, 3]
    assert col(res, "num_preemptions") == [0, 0]


def test_prefill_first_stalls_decodes_and_chunked_does_not():
    kw = dict(max_new_tokens=8, pool_pages=20, max_num_batched_tokens=8)
    pf = run([4, 6, 4], [3, 2, 2], "reserve_max", scheduler="prefill_first", **kw)
    assert col(pf, "admitted_iter") == [0, 1, 2]
    assert col(pf, "first_token_iter") == [0, 1, 2]
    assert col(pf, "finish_iter") == [4, 3, 3]
    assert pf.iterations["decode_tokens"].tolist() == [0, 0, 0, 3, 1]
    ch = run([4, 6, 4], [3, 2, 2], "reserve_max", scheduler="chunked", **kw)
    assert col(ch, "admitted_iter") == [0, 0, 1]
    assert col(ch, "first_token_iter") == [0, 1, 1]
    assert col(ch, "finish_iter") == [2, 2, 2]
    assert ch.iterations["prefill_tokens"].tolist() == [8, 6, 0]


@pytest.mark.parametrize("scheduler, admitted, first, finish, prefill, decode", [
    # SGLang's default (no --enable-mixed-chunk): iteration 0 admits r0 (4 tokens) and r1's first 4 of 6;
    # iteration 1 finishes r1's prefill (2) and admits r2 (4) with no decode, so r0's second token waits;
    # iterations 2 and 3 decode (r1 and r2 end at 2, r0 at 3). Chunked mixes r0's decode into iteration 1.
    ("prefill_first_chunked", [0, 0, 1], [0, 1, 1], [3, 2, 2], [8, 6, 0, 0], [0, 0, 3, 1]),
    # TensorRT-LLM without chunked prefill: iteration 0 admits r0 (4) and stops at r1 (6 > the 4 left);
    # iteration 1 decodes r0 and admits r1 whole, stopping at r2 (4 > 1); iteration 2 decodes r0 and r1,
    # ending both, and admits r2 (4 of 6 left); iteration 3 decodes r2. (Prefill_first ends r0 at 4.)
    ("mixed_whole", [0, 1, 2], [0, 1, 2], [2, 2, 3], [4, 6, 4, 0], [0, 1, 2, 1]),
])
def test_the_schedulers_of_sglang_and_tensorrt_llm_by_hand(scheduler, admitted, first, finish, prefill, decode):
    """The same three requests as above under the two other servers' schedules, in both engines."""
    kw = dict(max_new_tokens=8, pool_pages=20, max_num_batched_tokens=8)
    for engine in ("reference", "fast"):
        res = run([4, 6, 4], [3, 2, 2], "reserve_max", scheduler=scheduler, engine=engine, **kw)
        assert col(res, "admitted_iter") == admitted and col(res, "first_token_iter") == first
        assert col(res, "finish_iter") == finish
        assert res.iterations["prefill_tokens"].tolist() == prefill
        assert res.iterations["decode_tokens"].tolist() == decode


@pytest.mark.parametrize("scheduler, admitted, first, finish, prefill, decode", [
    # r0 (4 tokens, 4 out) at 0 s, r1 (4, 2 out) at 0.5 s, r2 (4, 2 out) at 1.5 s; iteration k runs [k, k + 1).
    # Chunked: iteration 1 admits r1 beside r0, iteration 2 admits r2 beside both.
    ("chunked", [0, 1, 2], [0, 1, 2], [3, 2, 3], [4, 4, 4, 0], [0, 1, 2, 2]),
    # TGI 3: iteration 0 admits r0 into an idle server (its router may join new requests in the next pass);
    # iteration 1 joins r1 to the running r0, so iteration 2 is its decode pass and admits nothing though r2 waits;
    # iteration 3 admits r2; r0 ends in 3, r2 in 4.
    ("chunked_alternating", [0, 1, 3], [0, 1, 3], [3, 2, 4], [4, 4, 0, 4, 0], [0, 1, 2, 1, 1]),
])
def test_tgi_admits_no_request_in_the_pass_after_one_that_joined_requests_to_a_running_batch(
        scheduler, admitted, first, finish, prefill, decode):
    kw = dict(max_new_tokens=8, pool_pages=20, max_num_batched_tokens=8)
    for engine in ("reference", "fast"):
        res = run([4, 4, 4], [4, 2, 2], "reserve_max", arrival_s=[0.0, 0.5, 1.5], scheduler=scheduler, engine=engine,
                  **kw)
        assert col(res, "admitted_iter") == admitted and col(res, "first_token_iter") == first
        assert col(res, "finish_iter") == finish
        assert res.iterations["prefill_tokens"].tolist() == prefill
        assert res.iterations["decode_tokens"].tolist() == decode


def test_mixed_whole_refuses_a_prompt_over_the_budget_and_defaults_to_8192_tokens():
    over = run([9, 4], [2, 2], "vllm", scheduler="mixed_whole", max_new_tokens=8, pool_pages=20,
               max_num_batched_tokens=8)
    assert col(over, "abort_reason") == ["exceeds_token_budget", ""]
    one = pd.DataFrame({"prompt_tokens": [4], "output_tokens": [1]})
    assert simulate(one, "vllm", model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model=ONE_SECOND,
                    scheduler="mixed_whole").params["max_num_batched_tokens"] == 8192  # TensorRT-LLM's max_num_tokens


def test_prefill_first_rejects_a_prompt_over_the_token_budget():
    res = run([9, 4], [2, 2], "vllm", scheduler="prefill_first", max_new_tokens=8, pool_pages=20,
              max_num_batched_tokens=8)
    assert col(res, "abort_reason") == ["exceeds_token_budget", ""]


def test_arrivals_wait_for_the_next_iteration_and_idle_jumps():
    # r1 arrives at 1.5 s: iteration 0 runs 0-1 s, iteration 1 starts at 1 s (r1 not yet there),
    # iteration 2 at 2 s admits it. r2 arrives at 10 s, after everything has finished: the clock
    # jumps to 10 s.
    res = run([4, 4, 4], [3, 1, 1], "vllm", max_new_tokens=8, pool_pages=20, arrival_s=[0.0, 1.5, 10.0])
    assert col(res, "admitted_iter") == [0, 2, 3]
    assert col(res, "admitted_s") == [0.0, 2.0, 10.0]
    assert col(res, "ttft_s") == [1.0, 1.5, 1.0]


def test_a_request_that_cannot_fit_the_pool_is_rejected_not_hung():
    res = run([40, 4], [2, 2], "reserve_max", max_new_tokens=8, pool_pages=5)
    assert col(res, "abort_reason") == ["exceeds_pool", ""]
    assert col(res, "generated_tokens") == [0, 2]
    # On demand: the request grows until it alone fills the pool, then is aborted.
    res = run([4], [40], "vllm", max_new_tokens=64, pool_pages=3, watermark_frac=0.0)
    assert col(res, "abort_reason") == ["kv_exceeds_pool"]
    assert col(res, "generated_tokens") == [9]  # 12 tokens of context fill 3 pages


def test_length_cap_and_finish_reasons():
    res = run([4, 4], [3, 10], "vllm", max_new_tokens=5, pool_pages=20)
    assert col(res, "generated_tokens") == [3, 5]
    assert col(res, "outcome") == ["finished_stopped", "finished_length_capped"]
    assert col(res, "finish_reason") == ["stop", "length"]
    assert res.summary["num_length_capped"] == 1


def test_summary_of_the_reserve_max_scenario_by_hand():
    res = run([4, 4, 4], [3, 8, 2], "reserve_max", max_new_tokens=8, pool_pages=6)
    s = res.summary
    assert s["makespan_s"] == 8.0
    assert s["tokens_per_s"] == pytest.approx(13 / 8) and s["requests_per_s"] == pytest.approx(3 / 8)
    assert s["ttft_p50_s"] == 1.0 and s["e2e_p50_s"] == 5.0
    # per-request mean gaps between tokens: (3-1)/2, (8-1)/7, (5-4)/1 seconds
    assert s["tbt_p50_s"] == 1.0
    # pages used per iteration (at schedule): 2 4 4 3 4 3 3 3 of 6; reserved 6 6 6 6 6 3 3 3
    assert res.iterations["pages_used"].tolist() == [2, 4, 4, 3, 4, 3, 3, 3]
    assert s["mean_kv_used_frac"] == pytest.approx(26 / 48)
    assert s["reserved_unused_page_s"] == pytest.approx(4 + 2 + 2 + 3 + 2)
    assert s["preemptions_per_request"] == 0 and s["num_iterations"] == 8


@pytest.mark.parametrize("mode", ["recompute", "swap", "reject"])
def test_predicted_growth_past_the_reservation_preempts_the_newest(mode):
    # Both predicted 2 tokens: each reserves 4 + 2 = 6 tokens = 2 pages of the 4, so both are
    # admitted at iter 0 and the run follows the vLLM one: in iter 5 r0's context passes 8 tokens
    # and needs a 3rd page beyond its reservation; the pool is full, so r1 (the newest) is
    # preempted with 5 tokens generated. recompute: r1 waits for r0 (done in iter 8), is
    # prefilled again over 9 tokens in iter 9 and finishes in iter 12; swap: its 2 pages go to
    # the CPU and come back in iter 9 (one decode, no prefill), same finish; reject: aborted.
    res = run([4, 4], [9, 9], "predicted", max_new_tokens=16, pool_pages=4, preemption_mode=mode,
              prediction=_FixedPrediction([2, 2]))
    assert col(res, "admitted_iter") == [0, 0]
    assert col(res, "max_reserved_pages")[0] == 3
    it = res.iterations
    assert it["num_preempted"].tolist()[:6] == [0, 0, 0, 0, 0, 1]
    if mode == "reject":
        assert col(res, "abort_reason") == ["", "preempted_rejected"]
        assert col(res, "generated_tokens") == [9, 5] and col(res, "finish_iter") == [8, 5]
        return
    assert col(res, "finish_iter") == [8, 12] and col(res, "generated_tokens") == [9, 9]
    assert col(res, "num_preemptions") == [0, 1]
    assert col(res, "num_swaps") == ([0, 1] if mode == "swap" else [0, 0])
    assert it.loc[9, "prefill_tokens"] == (0 if mode == "swap" else 9)
    assert it.loc[9, "swap_pages_moved"] == (2 if mode == "swap" else 0)


def test_sglang_retraction_under_swap_and_reject():
    # The init-ratio-0.1 run of test_sglang_admits_on_ratio_and_retracts with the other modes:
    # r1 is retracted in iter 5 with 5 tokens; swap brings its 2 pages back in iter 9, reject
    # aborts it.
    res = run([4, 4], [9, 9], "sglang", max_new_tokens=16, pool_pages=4, init_ratio=0.1, preemption_mode="swap")
    assert col(res, "finish_iter") == [8, 12] and col(res, "num_swaps") == [0, 1]
    assert res.iterations.loc[9, "prefill_tokens"] == 0 and res.iterations.loc[9, "decode_tokens"] == 1
    res = run([4, 4], [9, 9], "sglang", max_new_tokens=16, pool_pages=4, init_ratio=0.1, preemption_mode="reject")
    assert col(res, "abort_reason") == ["", "preempted_rejected"] and col(res, "generated_tokens") == [9, 5]


def test_tgi_swap_mode_moves_the_outgrown_request_to_the_cpu():
    # cap 2 as in the requeue case: in iter 5 the request needs a 3rd page beyond its 2 reserved;
    # under swap its 2 pages (8 cached tokens) go to the CPU pool and come back in iter 6 with a
    # 3-page reservation (4 + 5 + 2 = 11 tokens), where it decodes its 6th token without prefill.
    res = run([4], [6], "tgi", max_new_tokens=16, pool_pages=8, cap_tokens=2, preemption_mode="swap")
    assert col(res, "num_swaps") == [1] and col(res, "generated_tokens") == [6]
    assert col(res, "finish_iter") == [6] and col(res, "max_reserved_pages") == [3]
    it = res.iterations
    assert it["swap_pages_moved"].tolist() == [0, 0, 0, 0, 0, 2, 2]
    assert it["prefill_tokens"].iloc[1:].sum() == 0
    # iter 5 computes nothing and only copies 2 pages out; iter 6 copies them back and decodes
    page_copy_s = res.params["page_copy_s"]
    assert it["duration_s"].tolist()[5:] == pytest.approx([2 * page_copy_s, 1 + 2 * page_copy_s])
