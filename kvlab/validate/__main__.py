"""``python -m kvlab.validate``: remake the shipped stacks and the real-server error figures.

Fits ``data/costmodels/vllm-v0.json`` to the DistServe runs and ``vllm-v1.json`` to the
LLMServingSim runs of ``../shared/data/serving`` (``kvlab calibrate``, leave-one-run-out held-out
error inside), then writes ``data/costmodels/real_server_errors.csv`` (:mod:`.trust_figures`). Rerun it
whenever the cost model's physics changes.
"""
from ..cli import main

STACKS = (("vllm-v0", "shared:distserve-vllm-opt13b", "vLLM V0 (2024) serving stack, fitted to DistServe's OPT-13B "
           "A100 runs"),
          ("vllm-v1", "shared:llmservingsim-vllm-0.19", "vLLM V1 (0.19) serving stack, fitted to LLMServingSim's "
           "RTX 4090 / RTX PRO 6000 runs"))

if __name__ == "__main__":  # pragma: no cover
    from .._paths import DATA_DIR
    from .trust_figures import regenerate

    for name, runs, label in STACKS:
        main(["calibrate", runs, "-o", str(DATA_DIR / "costmodels" / f"{name}.json"), "--label", label,
              "--command-line", "python -m kvlab.validate"])
    print(regenerate().to_string(index=False))
