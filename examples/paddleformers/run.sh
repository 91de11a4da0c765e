#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# PaddleFormers Trainer + paddle_overlay, enabled by PADDLE_OVERLAY=1 alone: a tiny random
# LLaMA on 2 CPU ranks (gloo), sharding stage 1, for each of Paddle's two stage-1 optimizers:
#   v1  --split_param false, PaddleFormers' --stage1_broadcast_overlap (parameter broadcast)
#   v2  --split_param true,  PaddleFormers' --stage1_allgather_overlap (comm-buffer all-gather)
# Three launches each:
#   on      PADDLE_OVERLAY=1, overlap switch true, 6 steps, checkpoints at 3 and 6
#   off     no PADDLE_OVERLAY, overlap switch false, same 6 steps
#   resume  PADDLE_OVERLAY=1, resumes the on run's checkpoint-3 and trains to step 6
# then check_results.py: on vs off bitwise (losses, parameters), resume vs on bitwise.
# --by-setting: on and resume with PADDLE_OVERLAY=overlap and no trainer switch at all (the overlay
# turns the overlap on by itself, paddle_overlay/auto_overlap.py); each rank's overlap line is shown.
# Opt-in, not part of CI: it makes its own venv from requirements.txt (about 1 GB, a few
# minutes the first time) and needs the package registry.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/examples/paddleformers"
VENV="${PADDLEFORMERS_VENV:-$ROOT/.venv-examples/paddleformers}"
OUT="$ROOT/.test-out/examples/paddleformers/$(date +%Y%m%d-%H%M%S)"
TIMEOUT=600  # seconds per launch
STAGES=(v1 v2)
BY_SETTING=""

usage() {
  cat <<EOF
usage: examples/paddleformers/run.sh [--out DIR] [--only v1|v2] [--by-setting]

Makes or reuses the venv $VENV (pinned requirements.txt, then this project with
pip install -e), runs the on / off / resume launches on 2 CPU ranks for sharding stage 1
V1 and V2 and compares them.
  --out DIR     where runs, rank logs and checkpoints go (default .test-out/examples/paddleformers/<time>)
  --only STAGE  v1 (broadcast overlap) or v2 (all-gather overlap) only; default both
  --by-setting  on and resume runs: PADDLE_OVERLAY=overlap and no overlap switch, instead of
                PADDLE_OVERLAY=1 and the switch true
Environment: PADDLEFORMERS_VENV (venv path), PYTHON (interpreter that creates it, default python3).
EOF
}

while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) [[ $# -ge 2 ]] || { echo "error: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift 2 ;;
    --only)
      [[ $# -ge 2 && ( "$2" == v1 || "$2" == v2 ) ]] || { echo "error: --only needs v1 or v2" >&2; exit 2; }
      STAGES=("$2"); shift 2 ;;
    --by-setting) BY_SETTING=1; shift ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

ensure_venv() {
  local stamp="$VENV/.requirements-sha256" want
  want="$(cat "$HERE/requirements.txt" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
  if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "venv: reusing $VENV"
    return
  fi
  echo "venv: installing $HERE/requirements.txt and this project into $VENV"
  [[ -x "$VENV/bin/python" ]] || "${PYTHON:-python3}" -m venv "$VENV"
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements.txt" \
      || ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$ROOT"; then
    rm -rf "$VENV"
    echo "error: pip failed (output above); removed the half-made $VENV" >&2
    exit 1
  fi
  printf '%s' "$want" >"$stamp"
}

# launch NAME [ENV=VALUE...] -- [trainer arguments...]: one 2-rank launch into $OUT/NAME.
launch() {
  local name="$1"; shift
  local envs=()
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  rm -rf "$OUT/$name"
  mkdir -p "$OUT/$name"
  echo "run $name: ${envs[*]:-(no PADDLE_OVERLAY)} $*"
  # tools/collective on the ranks' path: the test-only CPU shim train_tiny_llama.py imports for V2
  if ! env -u PADDLE_OVERLAY PYTHONPATH="$ROOT/tools/collective${PYTHONPATH:+:$PYTHONPATH}" "${envs[@]}" \
      timeout -k 10 "$TIMEOUT" \
      "$VENV/bin/python" -m paddle.distributed.launch --nproc_per_node 2 --log_dir "$OUT/$name/log" \
      "$HERE/train_tiny_llama.py" --output_dir "$OUT/$name/out" "${COMMON[@]}" "$@" \
      >"$OUT/$name/launch.log" 2>&1; then
    echo "FAIL run $name: see $OUT/$name/launch.log and $OUT/$name/log/workerlog.*" >&2
    tail -n 5 "$OUT/$name/launch.log" >&2
    exit 1
  fi
}

ensure_venv
# Trainer arguments shared by every run; README.md says why each non-default is there.
COMMON=(
  --device cpu --sharding stage1 --max_grad_norm 0
  --save_checkpoint_format unified_checkpoint --load_checkpoint_format unified_checkpoint
  --max_steps 6 --save_steps 3 --logging_steps 1 --per_device_train_batch_size 2
  --learning_rate 1e-3 --seed 42 --report_to none
)
# V1: DygraphShardingOptimizer, the 2-layer model (21 parameters)
V1=(--split_param false --amp_master_grad false)
# V2: DygraphShardingOptimizerV2 (PaddleFormers' default), 1 MB comm buffers and a 4-layer
# model (39 parameters, 4 buffers); the bf16 flags only satisfy PaddleFormers' V2 check: on the
# CPU Paddle's AMP makes no effect and every tensor stays float32 (README.md)
V2=(
  --split_param true --bf16 true --fp16_opt_level O1 --amp_master_grad true
  --sharding_comm_buffer_size_MB 1 --unified_checkpoint_config ignore_merge_optimizer
  --hidden_size 128 --intermediate_size 512 --num_hidden_layers 4
)
failed=0
for stage in "${STAGES[@]}"; do
  if [[ "$stage" == v1 ]]; then
    extra=("${V1[@]}"); switch=--stage1_broadcast_overlap
  else
    extra=("${V2[@]}"); switch=--stage1_allgather_overlap
  fi
  on=(PADDLE_OVERLAY=1 -- "${extra[@]}" "$switch" true)
  [[ -z "$BY_SETTING" ]] || on=(PADDLE_OVERLAY=overlap -- "${extra[@]}")
  launch "$stage/on" "${on[@]}"
  launch "$stage/off" -- "${extra[@]}" "$switch" false
  launch "$stage/resume" "${on[@]}" --resume_from_checkpoint "$OUT/$stage/on/out/checkpoint-3"
  if [[ -n "$BY_SETTING" ]] && ! grep -h "^paddle_overlay: rank" "$OUT/$stage/on/log"/workerlog.*; then
    echo "FAIL  on: no rank printed a PADDLE_OVERLAY=overlap line" >&2
    failed=1
  fi
  echo "== $stage: runs in $OUT/$stage"
  "$VENV/bin/python" "$HERE/check_results.py" "$OUT/$stage/on/out" "$OUT/$stage/off/out" \
    "$OUT/$stage/resume/out" 3 "$stage" || failed=1
done
exit "$failed"
