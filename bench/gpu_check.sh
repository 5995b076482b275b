#!/usr/bin/env bash
# One prepared check for a lent NVIDIA GPU machine (H200; CuPy for CUDA 13, NumPy, SciPy, pandas,
# pytest preinstalled; no network, no papermill). Runs kvlab from the source tree
# (PYTHONPATH=.) and writes its results under $OUT when set, else ./gpu_results.
#
#   bash bench/gpu_check.sh            # every stage of STAGES (under 9 minutes)
#   bash bench/gpu_check.sh env gpu_tests  # chosen stages
#   bash bench/gpu_check.sh batched_cupy   # the batched engine on CuPy (its own call: under 6 minutes)
#
# Each stage is one function writing its own files; add a stage by writing stage_<name> and
# listing it in STAGES. Each stage is capped by a timeout (100 + 120 + 150 + 60 + 90 s at most,
# plus a few seconds for env: under 9 minutes; costmodel reuses crossover's profile.csv); not yet
# run on a GPU, so give the device call a 600 s limit.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
RESULTS="${OUT:-$PWD/gpu_results}"
mkdir -p "$RESULTS"
STAGES=(env gpu_tests equivalence_cupy crossover costmodel sweep_bench)
status=0

# kvlab/__init__.py may import packages this machine lacks (pyyaml, ...): this prelude registers
# the kvlab package without running its __init__ in that case, so kvlab.measure still imports.
PY_PRELUDE='
import sys, types, pathlib
try:
    import kvlab
except ImportError as exc:
    print(f"note: import kvlab failed ({exc}); loading submodules without kvlab/__init__.py")
    pkg = types.ModuleType("kvlab"); pkg.__path__ = [str(pathlib.Path("kvlab").resolve())]
    sys.modules["kvlab"] = pkg
'

stage_env() {   # what machine and software this is
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
      --format=csv 2>&1 || echo "nvidia-smi failed"
    python - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("numpy", "scipy", "pandas", "pytest", "cupy", "ml_dtypes", "yaml"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # noqa: BLE001
        print(name, "missing:", exc)
import cupy
print("cupy.is_available()", cupy.is_available())
print("CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(), "driver", cupy.cuda.runtime.driverGetVersion())
PY
  } >"$RESULTS/env.txt" 2>&1
  cat "$RESULTS/env.txt"
}

stage_gpu_tests() {  # every GPU-marked test (backend, block pool, measurement, fast engine, sweep)
  timeout 100 python -c "$PY_PRELUDE
import pytest
sys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', '-rs', '-m', 'gpu', 'tests/test_backend.py',
                      'tests/test_paged.py', 'tests/test_measure.py', 'tests/test_sim_fast_equivalence.py',
                      'tests/test_sweep.py']))" >"$RESULTS/pytest_gpu.txt" 2>&1
  local rc=$?
  tail -n 30 "$RESULTS/pytest_gpu.txt"
  return $rc
}

stage_equivalence_cupy() {  # the fast engine on CuPy against the reference engine, every random case
  KVLAB_BACKEND=cupy timeout 120 python -c "$PY_PRELUDE
import pytest
sys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', '-rs', 'tests/test_sim_fast_equivalence.py']))" \
    >"$RESULTS/pytest_equivalence_cupy.txt" 2>&1
  local rc=$?
  tail -n 30 "$RESULTS/pytest_equivalence_cupy.txt"
  return $rc
}

stage_crossover() {  # measured recompute vs swap for Llama-3-8B and Llama-2-7B shapes
  timeout 150 python bench/measure_crossover.py --out "$RESULTS" --models Llama-3-8B Llama-2-7B \
    >"$RESULTS/crossover.txt" 2>&1
  local rc=$?
  cat "$RESULTS/crossover.txt"
  return $rc
}

stage_costmodel() {  # roofline, measured curves and fitted roofline vs kvlab.measure's forward passes here
  timeout 60 python bench/costmodel_check.py --out "$RESULTS" --gpu H200 --models Llama-3-8B Llama-2-7B \
    $([ -f "$RESULTS/profile.csv" ] || echo --quick) >"$RESULTS/costmodel.txt" 2>&1
  local rc=$?
  cat "$RESULTS/costmodel.txt"
  return $rc
}

stage_sweep_bench() {  # 1,000-configuration sweep on NumPy (serial, processes) and CuPy (the fast engine)
  timeout 90 python -u bench/bench_sweep.py --parts sweep --out "$RESULTS" --workers "$(nproc)" \
    --cupy-configs 50 >"$RESULTS/sweep_bench.txt" 2>&1
  local rc=$?
  cat "$RESULTS/sweep_bench.txt"
  return $rc
}

stage_batched_cupy() {  # the batched engine on CuPy: equal to the reference, then CuPy vs NumPy vs compiled loop
  if ! python -c "import sys, cupy; sys.exit(0 if cupy.is_available() else 1)" >/dev/null 2>&1; then
    echo "batched_cupy: skipped (no CuPy with a usable CUDA device)" | tee "$RESULTS/batched_cupy.txt"
    return 0
  fi
  # every simulation of the random sweep against the reference engine, the batch's arrays on the GPU
  KVLAB_BACKEND=cupy timeout 120 python -c "$PY_PRELUDE
import pytest
sys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', '-rs', 'tests/test_sim_batched.py']))" \
    >"$RESULTS/pytest_batched_cupy.txt" 2>&1
  local rc=$?
  tail -n 30 "$RESULTS/pytest_batched_cupy.txt"
  # the 1,000-configuration in-scope sweep: compiled loop on every core, batched NumPy at S = 1 and 32,
  # batched CuPy at S = 1, 32, 200 and the whole sweep in one batch (tables checked equal)
  timeout 220 python -u bench/bench_sweep.py --parts batched --backends numpy cupy --workers "$(nproc)" \
    --batch-sizes 1 32 200 --numpy-max-batch 32 --out "$RESULTS" >"$RESULTS/batched_cupy.txt" 2>&1
  local rc2=$?
  cat "$RESULTS/batched_cupy.txt"
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
}

chosen=("$@")
[ ${#chosen[@]} -eq 0 ] && chosen=("${STAGES[@]}")
for stage in "${chosen[@]}"; do
  echo "=== stage $stage"
  start=$SECONDS
  if ! "stage_$stage"; then
    echo "=== stage $stage FAILED"
    status=1
  fi
  echo "=== stage $stage took $((SECONDS - start)) s"
done
echo "results in $RESULTS: $(ls "$RESULTS" | tr '\n' ' ')"
exit $status
