"""``python -m kvlab.validate``: remake the shipped stacks and the real-server error figures.

Fits ``data/costmodels/vllm-v0.json`` to the DistServe runs and ``vllm-v1.json`` to the
LLMServingSim runs of ``../shared/data/serving`` (``kvlab calibrate``, leave-one-run-out held-out
error inside), then writes ``data/costmodels/real_server_errors.csv`` and ``point_errors.csv`` (NVIDIA's
fixed-concurrency points replayed on the default model; :mod:`.trust_figures`). Rerun it whenever the cost
model's physics changes.
"""
STACKS = (("vllm-v0", "shared:distserve-vllm-opt13b", "vLLM V0 (2024) serving stack, fitted to DistServe's OPT-13B "
           "A100 runs"),
          ("vllm-v1", "shared:llmservingsim-vllm-0.19", "vLLM V1 (0.19) serving stack, fitted to LLMServingSim's "
           "RTX 4090 / RTX PRO 6000 runs"))

if __name__ == "__main__":  # pragma: no cover
    import argparse

    argparse.ArgumentParser(prog="python -m kvlab.validate", description=__doc__.split("\n\n")[0]).parse_args()
    from .._paths import DATA_DIR
    from ..costmodel.stacks import save
    from .calibrate import calibrate
    from .cli import load_runs
    from .points import point_table
    from .trust_figures import regenerate, regenerate_points

    for name, runs, label in STACKS:
        terms = calibrate(load_runs([runs], None), name=name, label=label, command="python -m kvlab.validate")
        print(f"{terms.describe()}: written to {save(terms, DATA_DIR / 'costmodels' / f'{name}.json')}")
    print(regenerate().to_string(index=False))
    print(point_table(regenerate_points()).to_string(index=False))
