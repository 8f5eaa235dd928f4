#!/usr/bin/env bash
# Real trials on a lent 2 x H200 machine (issues 4 and 5), in three parts of one session:
#
#   PART=sweep  bash benchmarks/h200_x2.sh   # 12 two-GPU layouts of the 2-layer MiniMax-M2 slice, local backend
#   PART=ray    bash benchmarks/h200_x2.sh   # --backend ray: 1-GPU trials two at a time, then 2-GPU trials;
#                                            # the same 1-GPU study again with --backend local (needs ray installed)
#   PART=local1 bash benchmarks/h200_x2.sh   # the 1-GPU layouts of the ray part, local backend on one GPU
#   PART=search bash benchmarks/h200_x2.sh   # the main command with 8 real trials (local backend) on the 2-layer slice
#   PART=search20 bash benchmarks/h200_x2.sh # the same search with today's trial defaults (20 steps, 10 warm-up)
#   PART=truth  bash benchmarks/h200_x2.sh   # the 2-GPU layouts the search chooses among, 20 steps with 10 warm-up,
#                                            # to judge it (benchmarks/data/h200_l2_2gpu_truth.jsonl)
#   PART=repeat bash benchmarks/h200_x2.sh   # the 4 fastest of them twice more, interleaved (run-to-run noise)
#
# Workload everywhere: MiniMax-M2 at full width (hidden 3,072, 256 experts top-8, vocab 200,064), seq 8,192,
# global batch 8 rows, bf16, synthetic tokens; parts sweep, ray, local1 and search pin 6 optimizer steps of which 2
# are warm-up (median of the last 4: the defaults of 2026-11-29), parts search20 and truth use 20 of which 10 are warm-up.
# Everything the parts write goes to $OUT (default ./h200_x2_out) as JSON lines, the tune outputs and a tarball of logs.
set -u
OUT=${OUT:-h200_x2_out}
R=${R:-/tmp/h200_x2_results}
mkdir -p "$OUT" "$R"
T0=$(date +%s)
log() { echo "$* ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/log.txt"; }
COMMON=(--model MiniMax-M2 --global-batch 8 --seq-len 8192 --stack megatron --trial-steps 6 --trial-warmup-steps 2 --trial-timeout 100 --results-dir "$R")
case "${PART:-sweep}" in
sweep)
  timeout 540 python3 -m launch.harness.sweep --model MiniMax-M2 --layers 2 --gpus 2xH200 --seq-len 8192 --global-batch 8 \
      --layouts benchmarks/data/h200_l2_2gpu_layouts.jsonl --out "$OUT/sweep_l2_2gpu.jsonl" --steps 6 --warmup 2 --timeout 100 \
      --trials-dir "$R/sweep/trials"
  log "sweep rc=$?"
  ;;
ray)
  python3 -m tuner.cli "${COMMON[@]}" --layers 1 --gpus 1xH200 --trials 4 --backend ray --parallel-trials 2 --study l1-1gpu-ray \
      > "$OUT/l1-1gpu-ray.txt" 2>&1; log "ray 1-GPU rc=$?"
  python3 -m tuner.cli "${COMMON[@]}" --layers 2 --gpus 2xH200 --trials 2 --backend ray --study l2-2gpu-ray \
      > "$OUT/l2-2gpu-ray.txt" 2>&1; log "ray 2-GPU rc=$?"
  python3 -m tuner.cli "${COMMON[@]}" --layers 1 --gpus 1xH200 --trials 4 --backend local --study l1-1gpu-local \
      > "$OUT/l1-1gpu-local.txt" 2>&1; log "local 1-GPU rc=$?"
  ;;
local1)
  # the 1-GPU layouts the ray part measured, with the local backend on GPU 0 (the other GPU idle)
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m launch.harness.sweep --model MiniMax-M2 --layers 1 --gpus 1xH200 --seq-len 8192 \
      --global-batch 8 --layouts benchmarks/data/h200_l1_1gpu_layouts.jsonl --out "$OUT/sweep_l1_1gpu.jsonl" --steps 6 --warmup 2 --timeout 100 \
      --trials-dir "$R/sweep1/trials"
  log "local 1-GPU sweep rc=$?"
  ;;
search)
  python3 -m tuner.cli "${COMMON[@]}" --layers 2 --gpus 2xH200 --trials 8 --backend local --study l2-2gpu-search \
      > "$OUT/l2-2gpu-search.txt" 2>&1; log "search rc=$?"
  python3 -m tuner.cli pareto --study l2-2gpu-search --results-dir "$R" --top 0 > "$OUT/l2-2gpu-search-pareto.txt" 2>&1
  ;;
search20)
  timeout 530 python3 -m tuner.cli --model MiniMax-M2 --global-batch 8 --seq-len 8192 --stack megatron --trial-timeout 120 \
      --results-dir "$R" --layers 2 --gpus 2xH200 --trials 8 --backend local --study l2-2gpu-search20 \
      > "$OUT/l2-2gpu-search20.txt" 2>&1; log "search20 rc=$?"
  python3 -m tuner.cli pareto --study l2-2gpu-search20 --results-dir "$R" --top 0 > "$OUT/l2-2gpu-search20-pareto.txt" 2>&1
  ;;
truth)
  timeout 530 python3 -m launch.harness.sweep --model MiniMax-M2 --layers 2 --gpus 2xH200 --seq-len 8192 --global-batch 8 \
      --layouts benchmarks/data/h200_l2_2gpu_truth.jsonl --out "$OUT/truth_l2_2gpu_20steps.jsonl" --steps 20 --warmup 10 \
      --timeout 120 --trials-dir "$R/truth/trials"
  log "truth rc=$?"
  ;;
repeat)
  timeout 530 python3 -m launch.harness.sweep --model MiniMax-M2 --layers 2 --gpus 2xH200 --seq-len 8192 --global-batch 8 \
      --layouts benchmarks/data/h200_l2_2gpu_repeat.jsonl --out "$OUT/repeat_l2_2gpu_20steps.jsonl" --steps 20 --warmup 10 \
      --timeout 120 --trials-dir "$R/repeat/trials"
  log "repeat rc=$?"
  ;;
esac
# every study's trials as JSON lines (layout, state, measured and predicted values), then the logs as one tarball
python3 - "$R" "$OUT/trials.jsonl" <<'PY'
import json, sys
from pathlib import Path
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
root, out = Path(sys.argv[1]), open(sys.argv[2], "a")
for db in sorted(root.glob("*/study.db")):
    for s in optuna.get_all_study_summaries(f"sqlite:///{db}"):
        st = optuna.load_study(study_name=s.study_name, storage=f"sqlite:///{db}")
        out.write(json.dumps({"study": s.study_name, "study_attrs": st.user_attrs}, default=str) + "\n")
        for t in st.trials:
            out.write(json.dumps({"study": s.study_name, "number": t.number, "state": t.state.name, "values": t.values,
                                  "params": t.params, "user_attrs": t.user_attrs,
                                  "wall_s": (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None},
                                 default=str) + "\n")
PY
tar -C "$R" -czf "$OUT/logs.tgz" --exclude='*.pt' --exclude='checkpoint' . 2>/dev/null
log "done"
