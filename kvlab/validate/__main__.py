"""``python -m kvlab.validate``: remake the shipped stacks and the real-server error figures.

Fits ``data/costmodels/vllm-v0.json`` to the DistServe runs and ``vllm-v1.json`` to the
LLMServingSim runs of ``../shared/data/serving`` (``kvlab calibrate``, leave-one-run-out held-out
error inside) and ``vllm-v1-sync.json`` to NVIDIA's measured vLLM points
(``data/serving/aiconfigurator_points.csv``: vLLM V1 releases before 0.14.0, which schedule in step;
leave-one-GPU-out held-out error inside), then writes ``data/costmodels/real_server_errors.csv`` and
``point_errors.csv`` (NVIDIA's fixed-concurrency points replayed on the default model;
:mod:`.trust_figures`). Rerun it whenever the cost model's physics changes.
"""
STACKS = (("vllm-v0", "shared:distserve-vllm-opt13b", "vLLM V0 (2024) serving stack, fitted to DistServe's OPT-13B "
           "A100 runs"),
          ("vllm-v1", "shared:llmservingsim-vllm-0.19", "vLLM V1 (0.19) serving stack, fitted to LLMServingSim's "
           "RTX 4090 / RTX PRO 6000 runs"))
#: The stack fitted to the built-in points: (name, points' dataset, label).
POINT_STACKS = (("vllm-v1-sync", "aiconfigurator-vllm", "vLLM V1 scheduling in step (releases before 0.14.0, or "
                 "--no-async-scheduling), fitted to NVIDIA's measured vLLM points on H100, H200 and B200 (FP8)"),)

if __name__ == "__main__":  # pragma: no cover
    import argparse

    argparse.ArgumentParser(prog="python -m kvlab.validate", description=__doc__.split("\n\n")[0]).parse_args()
    from .._paths import DATA_DIR
    from ..costmodel.stacks import save
    from .calibrate import calibrate
    from .cli import load_runs
    from .points import fit_stack, point_table, read_points
    from .trust_figures import regenerate, regenerate_points

    for name, runs, label in STACKS:
        terms = calibrate(load_runs([runs], None), name=name, label=label, command="python -m kvlab.validate")
        print(f"{terms.describe()}: written to {save(terms, DATA_DIR / 'costmodels' / f'{name}.json')}")
    pts = read_points()
    for name, dataset, label in POINT_STACKS:
        terms = fit_stack([p for p in pts if p.setup.dataset == dataset], name=name, label=label,
                          command="python -m kvlab.validate")
        print(f"{terms.describe()}: written to {save(terms, DATA_DIR / 'costmodels' / f'{name}.json')}")
    print(regenerate().to_string(index=False))
    print(point_table(regenerate_points()).to_string(index=False))
