#!/usr/bin/env bash
# `tune verify` on a lent 2 x H200 machine: real checks that should pass (two candidate layouts) and
# negative controls (deliberate bugs, launch/harness/spec.py FAULTS). Writes everything under $OUT (default ./verify_out).
#
#   bash benchmarks/verify_h200.sh            # on a machine with 2 GPUs, torch and megatron-core
#
# Model: MiniMax-M2 shaped (hidden 3,072, 48 heads, 8 query groups, head dim 128, expert FFN 1,536,
# top-8 sigmoid router, vocab 200,064), cut to 2 decoder layers and 64 experts so that 8 arms of
# 20 steps fit one 10-minute call. Workload: seq 4,096, global batch 8 rows, bf16.
set -u
OUT=${OUT:-verify_out}
R=${R:-/tmp/verify_results}
mkdir -p "$OUT" "$R"
python3 - "$R/MiniMax-M2-64e.json" <<'PY'
import json, sys
d = json.load(open("specs/data/models/MiniMax-M2.json"))
d["num_local_experts"] = 64
d["_source"] = "MiniMax-M2 preset with num_local_experts 64 (for a quick 2-GPU convergence check); " + d["_source"]
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
T0=$(date +%s)
python3 -m tuner.cli --model "$R/MiniMax-M2-64e.json" --layers 2 --gpus 2xH200 --seq-len 4096 --global-batch 8 \
    --trials 4 --study v2 --results-dir "$R" --stack megatron --allow-config-args > "$OUT/study.txt" 2>&1
echo "study rc=$? $(( $(date +%s) - T0 ))s" | tee -a "$OUT/log.txt"
run() {  # name, extra args...  (skipped when the call's time is nearly spent)
  local name=$1; shift
  if [ $(( $(date +%s) - T0 )) -gt ${BUDGET_S:-440} ]; then echo "$name skipped (time)" | tee -a "$OUT/log.txt"; return; fi
  local t=$(date +%s)
  python3 -m tuner.cli verify --study v2 --results-dir "$R" --reference tp=1,pp=1,ep=1 --steps 20 --timeout 200 "$@" \
      > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t ))s" | tee -a "$OUT/log.txt"
}
if [ "${SET:-1}" = 1 ]; then
  # 1. the real check, with the default warm start (40 steps); its starting checkpoint is kept and reused below
  run pass_tp2_ep2 --candidate tp=2,ep=2 --keep-checkpoint --out "$OUT/recipe_tp2_ep2.yaml"
  CK="$R/v2/verify/layout-tp2-pp1-ep2-dp1/checkpoint"
  # 2. negative controls and a second layout, from the same warmed checkpoint
  run fault_embedding --candidate tp=2,ep=2 --fault embedding_shard_misplaced --init-checkpoint "$CK"
  run pass_pp2 --candidate pp=2 --init-checkpoint "$CK"
  run fault_non_causal --candidate tp=2,ep=2 --fault non_causal_attention --init-checkpoint "$CK"
  run fault_sp_norm --candidate tp=2,ep=2 --fault sp_norm_grad_unreduced --init-checkpoint "$CK"
else
  # set 2: PP 2 again (does its 2.5% final-loss gap repeat?), the seed's bug class, and EP 2 vs EP 1
  run pass_pp2_again --candidate pp=2 --keep-checkpoint
  CK="$R/v2/verify/layout-tp1-pp2-dp1/checkpoint"
  run fault_sp_norm --candidate tp=2,ep=2 --fault sp_norm_grad_unreduced --init-checkpoint "$CK"
  run pass_ep2 --candidate tp=1,ep=2 --init-checkpoint "$CK"
fi
for d in "$R"/v2/verify/*/; do
  n=$(basename "$d"); mkdir -p "$OUT/$n"
  cp "$d/verify.json" "$OUT/$n/" 2>/dev/null; cp "$d/losses.png" "$OUT/$n/" 2>/dev/null
  [ "$n" = checkpoint ] && continue
  for arm in reference candidate; do
    [ -f "$d/$arm/log.txt" ] && tail -c 20000 "$d/$arm/log.txt" > "$OUT/$n/$arm.log.txt"
    [ -f "$d/$arm/steps.jsonl" ] && cp "$d/$arm/steps.jsonl" "$OUT/$n/$arm.steps.jsonl"
  done
done
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/log.txt"
tar -C "$OUT" -czf "$OUT.tgz" . && rm -rf "$OUT"/* && mv "$OUT.tgz" "$OUT/verify_out.tgz"
