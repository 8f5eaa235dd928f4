#!/usr/bin/env bash
# Issues 14 and 16 on 1 x H200 with Transformer Engine: the optimizer component test, gradient parity with its
# negative controls and the loss check on the same pair, the TE layout sweep (memory, time, host memory, saved-tensor
# census) and the first-trial probe. Budget-aware and resumable across calls (benchmarks/h200_te.py says how).
#
#   PART=all BUDGET_S=420 bash benchmarks/h200_te.sh             # parts: all, probe, component, sweep, snapshot, parity, probe_last
#   PART=all BUDGET_S=540 FINAL=1 bash benchmarks/h200_te.sh     # the last call: keeps room for the closing probe
#
# Needs: PYTHONPATH with Transformer Engine and megatron-core (/tmp/site after .te6/install.sh and the megatron-core wheel),
# the project on the path (this script adds the repository root). Writes at most 8 files under $OUT.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-h200_te_out}
mkdir -p "$OUT"
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=1
echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-unset} (unset, as in the earlier sweeps; the seed's run sets expandable_segments:True)"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
python3 benchmarks/h200_te.py
rc=$?
echo "h200_te.py rc=$rc"
exit $rc
