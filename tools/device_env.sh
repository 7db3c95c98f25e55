# Source on the GPU machine from the repo root: installs the project (no deps: the image has
# them), puts the vLLM kernel stub (.vllm-stub, tools/vllm_kernel_stub.py) on PYTHONPATH when
# carried, exports the carried git sha (.git-sha, tools/git_sha.sh), and defines
#   rbsweep GPU TIMEOUT SCENARIO [sweep args...]   one sweep pinned to one GPU, logged
#   rbpack                                         results/ + reports/ + logs -> $OUT/device.tar.gz
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RB=/tmp/rb; mkdir -p $RB/results $RB/reports $RB/logs
python3 -m pip install -q --no-deps --no-build-isolation -e . >$RB/logs/install.log 2>&1 || cat $RB/logs/install.log
[ -d .vllm-stub ] && export PYTHONPATH="$PWD/.vllm-stub:${PYTHONPATH:-}"
[ -f .git-sha ] && export REPLAYBENCH_GIT_SHA="$(cat .git-sha)"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv > $RB/logs/gpu.txt

rbsweep() {
  local gpu=$1 to=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout "$to" replaybench sweep "$@" --results-dir $RB/results \
    --reports-dir $RB/reports --no-progress >> $RB/logs/sweep-gpu$gpu.log 2>&1
  echo "gpu$gpu $* -> rc $?" | tee -a $RB/logs/steps.log
}

rbpack() {
  tar -czf "$OUT/device.tar.gz" -C $RB results reports logs && ls -la "$OUT"
}
