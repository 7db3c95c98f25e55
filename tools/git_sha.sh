#!/usr/bin/env bash
# Write "<sha> clean|dirty" of this checkout to .git-sha (git-ignored), to carry to the GPU
# machine, where the tree arrives without .git; tools/device_run.sh exports it.
cd "$(dirname "$0")/.." && d=clean
[ -n "$(git status --porcelain --untracked-files=no)" ] && d=dirty
echo "$(git rev-parse HEAD) $d" > .git-sha
