#!/usr/bin/env bash
# Benchmark: wall time of the whole main job, `tune --model MiniMax-M2 --gpus 64xH200`
# (fresh study each run, so nothing is resumed). Target (issue 2): under 30 s on 2 cores.
# Against enumerate + estimate in the same run, with the study's storage writes: benchmarks/bench_main_job.py.
#   bash benchmarks/bench_main_job.sh [RUNS]
set -euo pipefail
runs=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  start=$(date +%s.%N)
  tune --model MiniMax-M2 --gpus 64xH200 --results-dir "$tmp/r$i" >"$tmp/out$i.txt" 2>&1
  end=$(date +%s.%N)
  printf '{"benchmark": "main_job", "run": %d, "wall_s": %.2f, "target_s": 30, "cpus": %d}\n' "$i" "$(echo "$end - $start" | bc)" "$(nproc)"
done
