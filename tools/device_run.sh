#!/usr/bin/env bash
# Run on the device machine (the GPU box) from the repo root:
#   bash tools/device_run.sh "STEP1;STEP2;..."     steps: tests | sweep:SCENARIO[:TIMEOUT] | ncu:SCENARIO
# Installs the project without touching the image's packages, puts the vLLM kernel stub
# (.vllm-stub, built by tools/vllm_kernel_stub.py) on PYTHONPATH when carried, runs the
# steps, and packs results/ + reports/ + logs into $OUT/device.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RB=/tmp/rb; mkdir -p $RB/results $RB/reports $RB/logs
python3 -m pip install -q --no-deps --no-build-isolation -e . >$RB/logs/install.log 2>&1 || { cat $RB/logs/install.log; exit 1; }
[ -d .vllm-stub ] && export PYTHONPATH="$PWD/.vllm-stub:${PYTHONPATH:-}"
# the tree arrives without .git: tools/git_sha.sh wrote the sha + dirty flag into .git-sha
[ -f .git-sha ] && export REPLAYBENCH_GIT_SHA="$(cat .git-sha)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv | tee $RB/logs/gpu.txt
IFS=';' read -ra STEPS <<< "${1:-tests}"
for s in "${STEPS[@]}"; do
  kind=${s%%:*}; rest=${s#*:}
  case $kind in
    tests) timeout ${rest/tests/300} python3 -m pytest tests/kernels tests/replaybench/runners -x -q -p no:cacheprovider \
             2>&1 | tee $RB/logs/tests.log | tail -25 ;;
    sweep) scen=${rest%%:*}; to=${rest#*:}; [ "$to" = "$rest" ] && to=500
           timeout $to replaybench sweep "$scen" --results-dir $RB/results --reports-dir $RB/reports --no-progress \
             2>&1 | tee -a $RB/logs/sweep.log | tail -5 ;;
    py)    timeout 300 python3 ${rest} 2>&1 | tee -a $RB/logs/py.log | tail -30 ;;
  esac
done
tar -czf "$OUT/device.tar.gz" -C $RB results reports logs
ls -la "$OUT"
