import pytest


@pytest.mark.notebook
def test_notebook_01_quick(run_notebook):
    r = run_notebook("01_reservation_tables", {"quick": True, "max_new_tokens": [128, 512, 2048]})
    table = r["reservation_table"]
    assert [row["pages_per_request"] for row in table] == [8, 32, 128]
    assert [row["max_concurrent_requests"] for row in table] == [125, 31, 7]
    # Prompt of 512 tokens: ceil((512 + m) / 16) pages.
    assert [row["pages_per_request"] for row in r["reservation_table_with_prompt"]] == [40, 64, 160]
    assert r["pool_pages_real"] > 10_000
    # the pool arithmetic claims hold exactly: 1000 // 8, 1000 // 32, 1000 // 128
    assert len(r["claims"]) == 5 and [c["verdict"] for c in r["claims"][:3]] == ["holds"] * 3
    assert [c["claim_type"] for c in r["claims"][:3]] == ["arithmetic"] * 3
    # the waste rows on the profile calibrated to the seed essay are judged only where the real ShareGPT table agrees
    assert all(c["trace"] == "seed-figures (fitted profile)" for c in r["claims"][3:])
    # Waste rows: three caps, decode-only and with prompt pages; used fraction is a fraction.
    assert len(r["waste"]) == 6
    assert all(0 < w["kv_used_frac"] <= 1 for w in r["waste"])
    # The answer: a 2048-token cap with a 512-token prompt holds ceil(2560 / 16) = 160 pages per request.
    pool = r["pool_pages_real"]
    assert f"fits {pool // 160:,} concurrent requests" in r["answer"]
    assert f"{(pool // 40) / (pool // 160):.1f}x fewer than at 128" in r["answer"]
    used = next(w["kv_used_frac"] for w in r["waste"] if w["max_new_tokens"] == 2048 and w["with_prompt"])
    assert f"uses only {used:.0%} of the pages" in r["answer"]
    assert r["figures"] == ["01_reservation_tables-concurrency.png", "01_reservation_tables-used-share.png"]
    # which question its p95 answers, beside 02's caps, on the same 2,000-request sample (quick run)
    import numpy as np

    from kvlab import lengths

    out = lengths.workload_sample("seed-figures", 2000, seed=0)[0]["output_tokens"]
    p95, p99 = int(np.percentile(out, 95)), int(np.percentile(out, 99))
    assert f"That {p95:,} answers how much a reserving server should hold per request" in r["what_to_do"]
    assert f"its p95 or p99, {p95:,} or {p99:,} tokens on this sample" in r["what_to_do"]


@pytest.mark.notebook
def test_notebook_01_other_block_size(run_notebook):
    r = run_notebook("01_reservation_tables", {"quick": True, "block_size": 32, "pool_pages": 500})
    assert [row["pages_per_request"] for row in r["reservation_table"]] == [4, 16, 64]
    assert [row["max_concurrent_requests"] for row in r["reservation_table"]] == [125, 31, 7]
