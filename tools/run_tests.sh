#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# The README's test command (.ci/run calls it): every collective test (up to 4 ranks) on the
# oldest and newest tested Paddle (2.6.2, 3.3.1) with coverage across ranks (the start-up hook's
# launches on 3.3.1 only: docs/harness.md, "Suite time", says why), the harness's fault injection
# once (on 3.3.1, without coverage: it never applies the overlay; nor the patched-tree rows, whose
# ranks run the patched Paddle), the unit tests (test/unit with coverage, test/tools and benchmarks
# without) once, and one coverage figure over all of them (fails under
# COV_FAIL_UNDER percent). Every step runs even if another failed; the exit code is non-zero if
# any did. Ends with a recap table (step, result, time, log) and the coverage reports' paths.
# Outputs: .test-out/ci/.
#
# Time: the steps (the two venvs, made side by side; once 3.3.1's is made, 3.3.1's product rows,
# the harness then 3.3.1's other rows, the unit tests; once 2.6.2's is made, 2.6.2's rows and its
# patched-tree rows) run at the same time, each writing its own log; a collective run spends much
# of its time waiting (rank start-up, gloo, the launcher's polling; the fault injection mostly
# sleeps), so on 2 cores running them side by side is what keeps the suite inside its budget
# (docs/harness.md, "Suite time").
set -euo pipefail
for var in PADDLE_OVERLAY PADDLE_OVERLAY_CHECK; do  # the tests set them where needed
  if [[ -n "${!var:-}" ]]; then echo "note: ignoring $var=${!var} from the environment" >&2; fi
  unset "$var"
done
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Threshold on the merged figure (ranks of 3.3.1 and 2.6.2 plus the in-process unit tests):
# measured 94.2% with branches on a fresh clone at 851bf98, 2026-11-30.
COV_FAIL_UNDER="${COV_FAIL_UNDER:-92}"
OLDEST=2.6.2
NEWEST=3.3.1
REPORTS=.test-out/ci
py=".venv-test/paddle-$NEWEST/bin/python"
rm -rf "$REPORTS"
mkdir -p "$REPORTS/unit/coverage"
status=0
recap=()
declare -A step_name=() step_log=() step_start=() step_rc=()

# start NAME LOG COMMAND...: run COMMAND in the background, its output into LOG.
start() {
  echo "::: started $1 (log: $2): ${*:3}"
  "${@:3}" >"$2" 2>&1 &
  step_name[$!]=$1 step_log[$!]=$2 step_start[$!]=$SECONDS
}

# finish [PID]: wait for step PID to end (default: every started step); as each step ends, print
# its result and the end of its log. Returns non-zero if step PID failed (also when it ended
# during an earlier finish).
finish() {
  local pid rc result
  while ((${#step_name[@]})) && { (($# == 0)) || [[ -n "${step_name[$1]:-}" ]]; }; do
    rc=0
    wait -n -p pid "${!step_name[@]}" || rc=$?
    step_rc[$pid]=$rc
    result=ok
    if ((rc != 0)); then result="FAILED (exit $rc)" status=1; fi
    echo -e "\n::: ${step_name[$pid]}: $result ($((SECONDS - step_start[$pid]))s); last lines of ${step_log[$pid]}:"
    tail -n 25 "${step_log[$pid]}" | sed 's/^/    /'
    recap+=("${step_name[$pid]}|$result|$((SECONDS - step_start[$pid]))s|${step_log[$pid]}")
    unset "step_name[$pid]" "step_log[$pid]" "step_start[$pid]"
  done
  if (($# == 1)); then return "${step_rc[$1]:-0}"; fi
}

# merge_coverage OUT DATA_DIR...: one report (OUT/coverage-report.txt, OUT/coverage.xml) over the
# data files of every DATA_DIR; fails under COV_FAIL_UNDER.
merge_coverage() {
  local out="$1" rc=0
  shift
  mkdir -p "$out"
  cov() { COVERAGE_FILE="$out/.coverage" "$py" -m coverage "$1" --rcfile=tools/coveragerc "${@:2}"; }
  cov combine --keep "$@" && cov xml -o "$out/coverage.xml" >/dev/null &&
    cov report --fail-under="$COV_FAIL_UNDER" >"$out/coverage-report.txt" || rc=$?
  cat "$out/coverage-report.txt"
  return $rc
}

# harness_then_the_rest: the harness's fault injection once, on the newest release, in its own run
# folder and without coverage (its ranks never apply the overlay: measured, none of paddle_overlay's
# lines), then the newest release's examples and start-up hook with coverage, then its patched-tree
# rows without coverage (their ranks run the patched Paddle, not paddle_overlay: measured 0 lines).
harness_then_the_rest() {
  local rc=0
  export PORT_RANGE=55000:64000
  bash tools/run_collective_tests.sh --paddle "$NEWEST" -k "$harness" --run-dir "$REPORTS/runs-harness" \
    --junit-xml "$REPORTS/junit-harness-$NEWEST.xml" || rc=$?
  bash tools/run_collective_tests.sh --paddle "$NEWEST" --exclude "$fleet|$harness|$patched" "${cov[@]}" \
    --run-dir "$REPORTS/runs-examples" --junit-xml "$REPORTS/junit-examples-$NEWEST.xml" || rc=$?
  bash tools/run_collective_tests.sh --paddle "$NEWEST" -k "$patched" --run-dir "$REPORTS/runs-patched" \
    --junit-xml "$REPORTS/junit-patched-$NEWEST.xml" || rc=$?
  return $rc
}

# unit_tests: test/unit with coverage (coverage's own subprocess measurement, tools/coveragerc,
# follows what they start), then test/tools and benchmarks without it: they never run
# paddle_overlay's code (measured: no line of it), and coverage would slow their subprocesses.
unit_tests() {
  local rc=0
  COVERAGE_FILE="$PWD/$REPORTS/unit/coverage/.coverage" "$py" -m coverage run --rcfile=tools/coveragerc \
    -m pytest -q -rfEs -p no:cacheprovider --junit-xml "$REPORTS/junit-unit.xml" test/unit || rc=$?
  "$py" -m pytest -q -rfEs -p no:cacheprovider --junit-xml "$REPORTS/junit-tools.xml" test/tools benchmarks || rc=$?
  return $rc
}

# The collective steps run side by side: their launchers pick ports from disjoint ranges (Paddle's
# PORT_RANGE, default 35100:64000), so two launches are never handed the same port. The newest
# release's rows go to two steps: the product's (test/collective/fleet) in one, the others after
# the harness in another; the oldest release's patched-tree rows (no coverage: see above) get a
# step of their own, so that no step's chain is much longer than the rest.
fleet='^test_dygraph_sharding_stage1_'
harness='^test_collective_launch_fault_injection$'
patched='^test_patched_tree_broadcast_overlap$'
cov=(--nproc 4 --coverage)
# Both venvs are made side by side; each release's steps start as soon as its venv is made.
start "venv $NEWEST" "$REPORTS/venv-$NEWEST.log" bash tools/run_collective_tests.sh --paddle "$NEWEST" --venv-only
venv_newest=$!
start "venv $OLDEST" "$REPORTS/venv-$OLDEST.log" bash tools/run_collective_tests.sh --paddle "$OLDEST" --venv-only
venv_oldest=$!
if ! finish "$venv_newest"; then
  echo "::: the venv of Paddle $NEWEST could not be made; see its log above"
  finish
else
  start "collective $NEWEST" "$REPORTS/collective-$NEWEST.log" env PORT_RANGE=35100:44999 \
    bash tools/run_collective_tests.sh --paddle "$NEWEST" -k "$fleet" "${cov[@]}" --run-dir "$REPORTS/runs" \
    --junit-xml "$REPORTS/junit-collective-$NEWEST.xml"
  start "harness, examples $NEWEST" "$REPORTS/harness-examples-$NEWEST.log" harness_then_the_rest
  start "unit tests" "$REPORTS/unit.log" unit_tests
  if finish "$venv_oldest"; then
    # The start-up hook's launches run on the newest release only (docs/harness.md, "Suite time").
    start "collective $OLDEST" "$REPORTS/collective-$OLDEST.log" env PORT_RANGE=45000:49999 \
      bash tools/run_collective_tests.sh --paddle "$OLDEST" --exclude "$harness|^test_startup_launch\$|$patched" \
      "${cov[@]}" --run-dir "$REPORTS/runs" --junit-xml "$REPORTS/junit-collective-$OLDEST.xml"
    start "patched tree $OLDEST" "$REPORTS/patched-$OLDEST.log" env PORT_RANGE=50000:54999 \
      bash tools/run_collective_tests.sh --paddle "$OLDEST" -k "$patched" --run-dir "$REPORTS/runs-patched" \
      --junit-xml "$REPORTS/junit-patched-$OLDEST.xml"
  else
    echo "::: the venv of Paddle $OLDEST could not be made; see its log above"
  fi
  finish
  # One coverage figure for the package: every rank of both releases plus the in-process tests.
  start "coverage" "$REPORTS/coverage.log" merge_coverage "$REPORTS/coverage" "$REPORTS/runs/paddle-$NEWEST/coverage" \
    "$REPORTS/runs-examples/paddle-$NEWEST/coverage" "$REPORTS/runs/paddle-$OLDEST/coverage" "$REPORTS/unit/coverage"
  finish
fi

echo -e "\n::: recap (total ${SECONDS}s, exit $status)"
printf '%s\n' "step|result|time|log" "----|------|----|---" "${recap[@]}" | column -t -s '|'
for report in "$REPORTS"/coverage/coverage-report.txt "$REPORTS"/runs*/paddle-*/coverage-report.txt; do
  if [[ -f "$report" ]]; then echo "coverage report: $report"; fi
done
exit $status
