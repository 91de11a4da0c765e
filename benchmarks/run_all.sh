#!/usr/bin/env bash
# Run every CPU measurement of the product, saving each output under OUT (the virtual clock's
# benchmark, overlap_clock.py, is a model, not a measurement: benchmarks/README.md gives its command).
# usage: benchmarks/run_all.sh [OUT]   (default build/bench; about 6 minutes on 2 cores)
# Uses .venv-test/paddle-3.3.1 and, when present, .venv-test/paddle-2.6.2
# (tools/run_collective_tests.sh makes them); PY331 / PY262 override.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${1:-build/bench}"
PY331="${PY331:-.venv-test/paddle-3.3.1/bin/python}"
PY262="${PY262:-.venv-test/paddle-2.6.2/bin/python}"
mkdir -p "$OUT"
echo "overlay commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" | tee "$OUT/commit.txt"

run() {  # run PY NAME SCRIPT: two CPU ranks; keep rank 0's log as the result
  local py="$1" name="$2" script="$3"
  rm -rf "$OUT/logs-$name"
  # tools/collective: the test-only CPU shim (hybrid_parallel_cpu_shim), imported by name
  PYTHONPATH="$PWD/tools/collective${PYTHONPATH:+:$PYTHONPATH}" "$py" -m paddle.distributed.launch --nproc_per_node 2 --log_dir "$OUT/logs-$name" "$script" >/dev/null 2>&1 \
    || { echo "FAILED: $name (see $OUT/logs-$name)"; return 1; }
  grep -E '^(\||paddle |Table|upstream:|ours on|llama /|.extra)' "$OUT/logs-$name/workerlog.0" | tee "$OUT/$name.txt"
}
run "$PY331" ordering-3.3.1 benchmarks/ordering.py
run "$PY331" overhead-3.3.1 benchmarks/overhead.py
run "$PY331" buckets-3.3.1 benchmarks/buckets.py
run "$PY331" allgather-3.3.1 benchmarks/allgather_overlap.py
if [[ -x "$PY262" ]]; then
  run "$PY262" ordering-2.6.2 benchmarks/ordering.py
  run "$PY262" overhead-2.6.2 benchmarks/overhead.py
  run "$PY262" buckets-2.6.2 benchmarks/buckets.py
  run "$PY262" allgather-2.6.2 benchmarks/allgather_overlap.py
fi
echo "results in $OUT"
