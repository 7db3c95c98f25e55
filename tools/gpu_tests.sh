#!/usr/bin/env bash
# The Triton kernel tests on the GPU machine (real dims, CUDA graphs), within a time budget:
#   source tools/device_env.sh; bash tools/gpu_tests.sh [SECONDS] [WORKERS] [TEST PATHS...]
# (default paths: tests/kernels/replayssm)
# Writes $OUT/gpu_pytest.log (one line per test as it finishes) and $OUT/gpu_failures.log (each
# failure's traceback as it happens, tests/conftest.py), both complete even when the budget cuts
# the run off. WORKERS: xdist processes sharing the one GPU; more run the real-dims tests at
# batch 256-512 out of GPU memory or time.
set -u
BUDGET=${1:-280}
# default workers: 3 on a 141 GB H200, 2 on an 80 GB H100 (the batch-512 real-dims tests need ~25 GB each)
MEM_MB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
WORKERS=${2:-$(( ${MEM_MB:-0} > 100000 ? 3 : 2 ))}
shift $(( $# < 2 ? $# : 2 ))
PATHS=("$@"); [ ${#PATHS[@]} -eq 0 ] && PATHS=(tests/kernels/replayssm)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export REPLAYBENCH_FAILLOG="$OUT/gpu_failures.log"
: > "$REPLAYBENCH_FAILLOG"
timeout "$BUDGET" python3 -m pytest -n "$WORKERS" -v -rfE --durations=25 -p no:cacheprovider -o addopts="" \
  "${PATHS[@]}" > "$OUT/gpu_pytest.log" 2>&1
rc=$?
echo "pytest rc $rc (124: cut off by the ${BUDGET}s budget)" >> "$OUT/gpu_pytest.log"
grep -cE " PASSED " "$OUT/gpu_pytest.log" | sed 's/^/passed: /'
grep -E " FAILED " "$OUT/gpu_pytest.log" | sed 's/^/  /'
tail -1 "$OUT/gpu_pytest.log"
