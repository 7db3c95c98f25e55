#!/usr/bin/env bash
# Session 31: per-launch durations (Nsight Compute) of the small-batch steps, grouped by step:
#   source tools/device_env.sh; bash tools/probe_route_steps.sh [gdn|mamba2|m2nostore] > $OUT/probe_route_steps.txt
# (see tools/probe_route_steps.py; one ncu run per line of the list, CSVs kept in $OUT/ncu_steps/;
# gdn, the default: session 31's list, durations only; mamba2: session 32's, with DRAM bytes;
# m2nostore: session 33's, the eager kernel's probe copy with and without its state store beside
# the deferred route's appending step, in order of need, so a run cut short keeps the first)
set -u
NCU=$(python3 -c "from replaybench.ncu import ncu_path; print(ncu_path())")
mkdir -p "$OUT/ncu_steps"
WHICH=${1:-gdn}
METRICS=gpu__time_duration.sum
[ "$WHICH" != gdn ] && METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
LIST_GDN='qwen3.5-4b eager 1
qwen3.5-4b replay 1
qwen3.5-4b replay 1 --route-k 2
qwen3.5-4b replay-dual 1
qwen3.5-122b-a10b eager 1
qwen3.5-122b-a10b replay 1
qwen3.5-122b-a10b replay 1 --route-k 2
qwen3.5-122b-a10b eager 16
qwen3.5-122b-a10b replay 16'
LIST_MAMBA2='nemotron-3-super-120b-a12b eager 1
nemotron-3-super-120b-a12b replay 1
nemotron-3-super-120b-a12b replay 1 --route-k 2 --block-v 32 --warps 8
nemotron-3-nano-4b eager 1
nemotron-3-nano-4b replay 1'
LIST_M2NOSTORE='nemotron-3-super-120b-a12b eager-probe 1
nemotron-3-super-120b-a12b eager-nostore 1
nemotron-3-super-120b-a12b replay 1 --route-k 2 --block-v 32 --warps 8
nemotron-3-nano-4b eager-nostore 1
nemotron-3-nano-4b eager-probe 1'
case $WHICH in
  gdn) LIST=$LIST_GDN ;;
  mamba2) LIST=$LIST_MAMBA2 ;;
  m2nostore) LIST=$LIST_M2NOSTORE ;;
  *) echo "probe_route_steps.sh: unknown list '$WHICH'; allowed: gdn, mamba2, m2nostore" >&2; exit 2 ;;
esac
while read -r model method batch extra; do
  [ -z "$model" ] && continue
  tag="$model-$method-b$batch${extra:+-$(echo $extra | tr -d ' -')}"
  csv="$OUT/ncu_steps/$tag.csv"
  "$NCU" --profile-from-start off --clock-control none --cache-control none --print-units base \
    --metrics "$METRICS" --csv python3 tools/probe_route_steps.py $model $method $batch $extra \
    > "$csv" 2> "$OUT/ncu_steps/$tag.err"
  layers=$(grep -o "layers [0-9]*" "$OUT/ncu_steps/$tag.err" | awk '{print $2}')
  python3 tools/probe_route_steps.py --summarise "$csv" --layers "${layers:-64}" --label "$tag"
done <<< "$LIST"
