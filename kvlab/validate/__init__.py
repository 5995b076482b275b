"""How close is kvlab to a real server? Replay measured runs in their own set-up and compare.

* :mod:`.records`: a run = its set-up (:class:`SetUp`) + measured per-request results (:class:`RunRecord`);
* :mod:`.readers`: the shared serving datasets (DistServe, LLMServingSim), ``vllm bench serve``
  result files with a set-up YAML;
* :mod:`.replay`: the replay, predicted vs measured statistics, overload calls, the error table;
* :mod:`.calibrate`: fit a serving stack's terms to measured runs (``kvlab calibrate``), with
  leave-one-run-out held-out error;
* :mod:`.trust_figures`: :func:`trust`, one line on how far a cost model's answers can be trusted on real servers.
"""
from .records import REQUEST_COLUMNS, RunRecord, SetUp
from .readers import SHARED_SERVING, read_bench_results, read_distserve, read_llmservingsim, read_shared
from .replay import HEADLINE, Replay, backlog, compare, error_table, overloaded, replay, ttft_growth
from .trust_figures import trust

__all__ = ["HEADLINE", "REQUEST_COLUMNS", "Replay", "RunRecord", "SHARED_SERVING", "SetUp", "backlog", "compare",
           "error_table", "overloaded", "read_bench_results", "read_distserve", "read_llmservingsim",
           "read_shared", "replay", "trust", "ttft_growth"]
