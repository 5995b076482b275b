"""vLLM V1's admission (``vllm_v1``): a waiting request needs only its first chunk's pages free
(no watermark), and reserves just those; worked by hand against V0's rule."""
from __future__ import annotations

import pandas as pd
import pytest

from kvlab import simulate

# Two 100-token prompts of 5 output tokens at t = 0; a 10-page pool of 16-token pages; 64 tokens per iteration.
W = pd.DataFrame({"prompt_tokens": [100, 100], "output_tokens": [5, 5]})
KW = dict(model="Llama-2-7B", gpu="A100-80GB-SXM", cost_model="roofline", pool_pages=10, block_size=16,
          max_num_batched_tokens=64, max_num_seqs=4, max_new_tokens=5, record_iterations=True)


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_v0_admits_on_the_whole_prompt_and_v1_on_its_first_chunk(engine):
    """V0 (watermark 0): r0 reserves pages(100) = 7, so r1 (7 pages) waits until r0 finishes in
    iteration 5 and starts in 6. V1: r0 reserves its first chunk, pages(64) = 4; in iteration 1
    r0's last 36 tokens grow it to 7 pages on demand and r1 is admitted with the 28 tokens left of
    the budget (pages(28) = 2 <= 3 free): 9 pages in use. In iteration 2 r1's next 63 tokens need
    4 more pages with 1 free, so r1, the newest, is preempted; it returns when r0 finishes."""
    v0 = simulate(W, "vllm", watermark_frac=0.0, engine=engine, **KW)
    assert v0.requests["admitted_iter"].tolist() == [0, 6]
    assert v0.requests["num_preemptions"].tolist() == [0, 0]
    assert v0.iterations["pages_reserved"].iloc[0] == 7
    v1 = simulate(W, "vllm_v1", engine=engine, **KW)
    q, it = v1.requests, v1.iterations
    assert q["admitted_iter"].tolist() == [0, 1]
    assert q["num_preemptions"].tolist() == [0, 1]
    assert it["pages_reserved"].iloc[:3].tolist() == [4, 9, 7]
    assert it["prefill_tokens"].iloc[:2].tolist() == [64, 64] and it["batch_size"].iloc[1] == 2
    assert it["num_preempted"].iloc[2] == 1
    assert q["finish_iter"].tolist() == [5, 11]  # r1 recomputes from scratch: 64 + 36, then 4 more decodes


def test_v1_takes_no_watermark_parameter():
    with pytest.raises(ValueError, match="bad parameters for policy 'vllm_v1'"):
        simulate(W, "vllm_v1", watermark_frac=0.01, **KW)
