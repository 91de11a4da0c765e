#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Run the collective tests of paddle_overlay against a pinned Paddle, in a venv per release.
# This script checks its arguments (without any venv), prepares the venv
# (.venv-test/paddle-VERSION, built in a temporary folder and moved into place, reused when its
# stamp matches) and hands every other argument to tools/collective_runner.py.
set -euo pipefail
# The test tooling decides where the overlay is applied (the ranks get PADDLE_OVERLAY=1 from the
# harness); a value left in the user's shell would apply it in every tool and test process.
for var in PADDLE_OVERLAY PADDLE_OVERLAY_CHECK; do
  if [[ -n "${!var:-}" ]]; then echo "note: ignoring $var=${!var} from the environment (the tests set it where needed)" >&2; fi
  unset "$var"
done
shopt -s inherit_errexit  # failures inside $(ensure_venv) stop the script too

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_BOOTSTRAP="${PYTHON:-python3}"
# The releases paddle_overlay is tested on: one list, paddle_overlay/_patching.py's TESTED_PADDLE.
read -r -a SUPPORTED <<<"$("$PYTHON_BOOTSTRAP" -c "
import sys; sys.path.insert(0, sys.argv[1])
from paddle_overlay._patching import TESTED_PADDLE; print(*TESTED_PADDLE)" "$ROOT")"
DEFAULT_VERSION="${SUPPORTED[-1]}"

usage() {
  cat <<EOF
usage: tools/run_collective_tests.sh [--paddle VERSION[,VERSION] | --matrix] [runner options]

Makes or reuses the venv .venv-test/paddle-VERSION (pip: paddlepaddle==VERSION plus the pins
that release needs, then this project with its [test] extra), installs the harness start-up
hooks into it, and runs tools/collective_runner.py with that venv's python.

  --paddle VERSION   Paddle to test, one of: ${SUPPORTED[*]}
                     (default $DEFAULT_VERSION); repeat the flag or give a comma list to run
                     several one after the other (a table of results ends the run).
  --matrix           every release above, one after the other (slow: a venv each).
  --rebuild-venv     reinstall the venv even if its stamp matches.
  --venv-only        make or reuse the venv(s), print each python path, run nothing.
  -h, --help         this help.

--help, --list, bad options and unknown -k names answer without building a venv.
Pins per release: 2.6.2: protobuf==3.20.3 numpy<2; 3.0.0 to 3.3.0: protobuf<6 (protobuf 6+
breaks their DistributedStrategy); 3.3.1: none.
Environment: PYTHON (interpreter used to create venvs, default python3),
PIP_INDEX_URL / PIP_FIND_LINKS (where pip finds wheels).

Runner options:
EOF
  "$PYTHON_BOOTSTRAP" "$ROOT/tools/collective_runner.py" --help | sed -n '/^options:/,$p' | tail -n +2 | grep -v -- '-h, --help'
}

die() { echo "error: $*" >&2; exit 2; }

is_supported() {
  local v
  for v in "${SUPPORTED[@]}"; do [[ "$v" == "$1" ]] && return 0; done
  return 1
}

versions=()
runner_args=()
rebuild=0
venv_only=0
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --paddle) [[ $# -ge 2 ]] || die "--paddle needs a version, one of: ${SUPPORTED[*]}"
              IFS=',' read -r -a more <<<"$2"; versions+=("${more[@]}"); shift 2 ;;
    --paddle=*) IFS=',' read -r -a more <<<"${1#--paddle=}"; versions+=("${more[@]}"); shift ;;
    --matrix) versions+=("${SUPPORTED[@]}"); shift ;;
    --rebuild-venv) rebuild=1; shift ;;
    --venv-only) venv_only=1; shift ;;
    *) runner_args+=("$1"); shift ;;
  esac
done
((${#versions[@]})) || versions=("$DEFAULT_VERSION")
for version in "${versions[@]}"; do
  is_supported "$version" || die "Paddle $version is not a supported release; use one of: ${SUPPORTED[*]}"
done

# Everything the runner can answer or refuse without Paddle, before any venv is built.
for arg in ${runner_args[@]+"${runner_args[@]}"}; do
  if [[ "$arg" == "--list" ]]; then
    exec "$PYTHON_BOOTSTRAP" "$ROOT/tools/collective_runner.py" "${runner_args[@]}"
  fi
done
"$PYTHON_BOOTSTRAP" "$ROOT/tools/collective_runner.py" ${runner_args[@]+"${runner_args[@]}"} --check-selection

if ((${#versions[@]} > 1)); then
  # Several versions write reports side by side: a fixed report path would be overwritten.
  for ((i = 0; i < ${#runner_args[@]}; i++)); do
    if [[ "${runner_args[i]}" == --junit-xml* ]]; then
      value="${runner_args[i]#--junit-xml}"; value="${value#=}"
      [[ -n "$value" ]] || value="${runner_args[i+1]:-}"
      [[ "$value" == *"{paddle}"* ]] || die "with several --paddle versions, put {paddle} in the --junit-xml path"
    fi
  done
fi

# pins VERSION: what pip must hold besides paddlepaddle==VERSION for that release to work.
pins() {
  case "$1" in
    2.*) echo "protobuf==3.20.3 numpy<2" ;;
    3.3.1) echo "" ;;
    3.*) echo "protobuf<6" ;;
  esac
}

# ensure_venv VERSION: create or reuse .venv-test/paddle-VERSION; prints its python path.
# A new venv is built in .venv-test/.paddle-VERSION.partial-PID and moved into place only when
# pip succeeded, so a failed build leaves nothing half-made (its scripts' shebangs name the
# temporary path: always run it as `python -m ...`).
ensure_venv() {
  local version="$1" venv="$ROOT/.venv-test/paddle-$1"
  local py="$venv/bin/python" stamp_name=".paddle-overlay-stamp"
  local -a want_pins
  read -r -a want_pins <<<"paddlepaddle==$version $(pins "$version")"
  local want
  want="${want_pins[*]} | $(sha256sum <"$ROOT/pyproject.toml" | cut -c1-16)"
  if [[ $rebuild == 0 && -x "$py" && -f "$venv/$stamp_name" && "$(cat "$venv/$stamp_name")" == "$want" ]]; then
    echo "venv: reusing $venv" >&2
  else
    local tmp="$ROOT/.venv-test/.paddle-$version.partial-$$"
    rm -rf "$tmp"
    mkdir -p "$ROOT/.venv-test"
    trap "rm -rf '$tmp'" EXIT  # Ctrl-C or a kill mid-build leaves nothing either
    echo "venv: building $venv (in $tmp): ${want_pins[*]} and -e $ROOT[test]" >&2
    "$PYTHON_BOOTSTRAP" -m venv "$tmp"
    # One resolve, so the [test] extra cannot lift the numpy/protobuf pins.
    if ! "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check "${want_pins[@]}" -e "$ROOT[test]" >&2; then
      rm -rf "$tmp"
      echo "error: pip could not install ${want_pins[*]} for Paddle $version (see above); nothing was kept" >&2
      return 1
    fi
    printf '%s' "$want" >"$tmp/$stamp_name"
    rm -rf "$venv"
    mv "$tmp" "$venv"
    trap - EXIT
  fi
  "$py" "$ROOT/tools/rank_coverage.py" install-pth >/dev/null
  "$py" "$ROOT/tools/collective/rank_signals.py" install-pth >/dev/null
  echo "$py"
}

if ((venv_only)); then
  for version in "${versions[@]}"; do ensure_venv "$version"; done
  exit 0
fi

if ((${#versions[@]} == 1)); then
  py="$(ensure_venv "${versions[0]}")"
  echo "== Paddle ${versions[0]}: $py tools/collective_runner.py ${runner_args[*]:-}" >&2
  exec "$py" "$ROOT/tools/collective_runner.py" ${runner_args[@]+"${runner_args[@]}"}
fi

# Several releases: run each, keep its last line, end with a table.
status=0
table=()
out_dir="$ROOT/.test-out/release-runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out_dir"
for version in "${versions[@]}"; do
  start=$SECONDS
  log="$out_dir/paddle-$version.log"
  if ! py="$(ensure_venv "$version" 2> >(tee "$log" >&2))"; then
    table+=("$version|VENV FAILED|pip could not install it|$((SECONDS - start))s|$log")
    status=1
    continue
  fi
  echo "== Paddle $version: $py tools/collective_runner.py ${runner_args[*]:-}" | tee -a "$log" >&2
  set +e
  "$py" "$ROOT/tools/collective_runner.py" ${runner_args[@]+"${runner_args[@]}"} 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  set -e
  counts="$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log" | tail -1)"
  result=PASS
  ((rc == 0)) || { result=FAIL; status=1; }
  table+=("$version|$result|${counts:-no summary (rc $rc)}|$((SECONDS - start))s|$log")
done
echo
{
  echo "paddle|result|tests|time|log"
  echo "------|------|-----|----|---"
  printf '%s\n' "${table[@]}"
} | column -t -s '|'
exit $status
