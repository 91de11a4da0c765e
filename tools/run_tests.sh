#!/usr/bin/env bash
# The README's test command (.ci/run calls it): every collective test under the launcher
# on Paddle 3.3.1 and 2.6.2 with coverage across ranks, then the plain unit
# tests. Every step runs even if an earlier one failed; the exit code is non-zero if any did.
# Budget on a fresh clone (2 CPU cores): about 3 min per venv + about 4 min per Paddle version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Measured on this project's collective suite: 94.2% with branches (Paddle 3.3.1 and
# 2.6.2, fresh clone, 2026-11-29).
COV_FAIL_UNDER="${COV_FAIL_UNDER:-92}"
REPORTS=build/ci
mkdir -p "$REPORTS"
status=0

step() {
  echo "::: $*"
  local start=$SECONDS
  "$@" || { echo "::: FAILED ($((SECONDS - start))s): $*"; status=1; return 0; }
  echo "::: ok ($((SECONDS - start))s): $*"
}

for version in 3.3.1 2.6.2; do
  step bash tools/run_collective_tests.sh --paddle "$version" --coverage --cov-fail-under "$COV_FAIL_UNDER" \
    --junit-xml "$REPORTS/junit-collective-$version.xml" --run-dir "$REPORTS/runs"
done

unit_dirs=(test/tools)
[[ -d test/unit ]] && unit_dirs+=(test/unit)
[[ -d benchmarks ]] && unit_dirs+=(benchmarks)
step .venv-test/paddle-3.3.1/bin/python -m pytest -q -rs -p no:cacheprovider \
  --junit-xml "$REPORTS/junit-unit.xml" "${unit_dirs[@]}"

echo "::: total ${SECONDS}s, exit $status"
exit $status
