#!/usr/bin/env bash
# Every multi-GPU torch+NCCL stand-in of issue 20, one after another (about
# 4-5 minutes on 2x H200); JSON results to benchmarks/data/ (or $1).
#   bash benchmarks/standin/run_2gpu.sh [OUT_DIR]
# SMOKE=1 runs each once, folded onto the GPUs there are (a start-up check on
# one GPU; its numbers are marked "smoke" and are not measurements).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-benchmarks/data}
mkdir -p "$OUT"
N=${NPROC:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
if [ "$N" -lt 2 ] && [ -z "${SMOKE:-}" ]; then
  echo "run_2gpu.sh: needs 2 or more GPUs, $N visible (SMOKE=1 for a start-up check)" >&2
  exit 2
fi
DEG=$N; [ -n "${SMOKE:-}" ] && DEG=2
EXTRA=""; [ -n "${SMOKE:-}" ] && EXTRA="--fold --tokens 1024 --reps 1"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
T="torchrun --standalone --nproc_per_node $N"
S=benchmarks/standin
$T $S/allgather_anchor.py --out "$OUT/standin_allgather_anchor.json" ${SMOKE:+--iters 2}
$T $S/v1_plan_replay.py $EXTRA --degree $DEG --out "$OUT/standin_v1_replay_s$DEG.json"
$T $S/launch_depth.py $EXTRA --degree $DEG --out "$OUT/standin_launch_depth_s$DEG.json"
C=""; [ -n "${SMOKE:-}" ] && C="--fold --tokens 1024 --reps 1"
for ch in default 1 2 4 8 16 32; do
  if [ "$ch" = default ]; then env -u NCCL_MAX_NCHANNELS $T $S/contention.py $C --out "$OUT/standin_contention_default.json"
  else NCCL_MAX_NCHANNELS=$ch $T $S/contention.py $C --out "$OUT/standin_contention_nch$ch.json"; fi
  [ -n "${SMOKE:-}" ] && break
done
for ctas in 4 8 16; do
  [ -n "${SMOKE:-}" ] && break
  NCCL_MAX_CTAS=$ctas $T $S/contention.py $C --out "$OUT/standin_contention_ctas$ctas.json"
done
python3 $S/peer_copy.py ${SMOKE:+--tokens 1024 --reps 1} --out "$OUT/standin_peer_copy.json" || echo "peer_copy: exit $?"
