#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Run the collective tests of paddle_overlay against a pinned Paddle, in a venv per version.
# This script only prepares the venv (.venv-test/paddle-VERSION, made on demand, reused when
# its stamp matches) and hands every other argument to tools/collective_runner.py.
set -euo pipefail
shopt -s inherit_errexit  # failures inside $(ensure_venv) stop the script too

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_BOOTSTRAP="${PYTHON:-python3}"

usage() {
  cat <<'EOF'
usage: tools/run_collective_tests.sh [--paddle VERSION[,VERSION]] [runner options]

Makes or reuses the venv .venv-test/paddle-VERSION (pip: paddlepaddle==VERSION, for 2.x also
protobuf==3.20.3 and numpy<2, then this project with its [test] extra), installs the
coverage start-up hook into it, and runs tools/collective_runner.py with that venv's python.

  --paddle VERSION   Paddle to test: 3.3.1 (default) or 2.6.2; repeat the flag or give a
                     comma list to run several versions one after the other.
  --rebuild-venv     reinstall the venv's packages even if its stamp matches.
  -h, --help         this help (needs no venv).

Environment: PYTHON (interpreter used to create venvs, default python3),
PIP_INDEX_URL / PIP_FIND_LINKS (where pip finds wheels).

Runner options:
EOF
  "$PYTHON_BOOTSTRAP" "$ROOT/tools/collective_runner.py" --help | sed -n '/^options:/,$p' | tail -n +2 | grep -v -- '-h, --help'
}

versions=()
runner_args=()
rebuild=0
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --paddle) [[ $# -ge 2 ]] || { echo "error: --paddle needs a version" >&2; exit 2; }
              IFS=',' read -r -a more <<<"$2"; versions+=("${more[@]}"); shift 2 ;;
    --paddle=*) IFS=',' read -r -a more <<<"${1#--paddle=}"; versions+=("${more[@]}"); shift ;;
    --rebuild-venv) rebuild=1; shift ;;
    *) runner_args+=("$1"); shift ;;
  esac
done
((${#versions[@]})) || versions=(3.3.1)

if ((${#versions[@]} > 1)); then
  # Several versions write reports side by side: a fixed report path would be overwritten.
  for ((i = 0; i < ${#runner_args[@]}; i++)); do
    if [[ "${runner_args[i]}" == --junit-xml* ]]; then
      value="${runner_args[i]#--junit-xml}"; value="${value#=}"
      [[ -n "$value" ]] || value="${runner_args[i+1]:-}"
      if [[ "$value" != *"{paddle}"* ]]; then
        echo "error: with several --paddle versions, put {paddle} in the --junit-xml path" >&2; exit 2
      fi
    fi
  done
fi

# ensure_venv VERSION: create or reuse .venv-test/paddle-VERSION; prints its python path.
ensure_venv() {
  local version="$1" venv="$ROOT/.venv-test/paddle-$1"
  local py="$venv/bin/python" stamp="$venv/.paddle-overlay-stamp"
  local pins=("paddlepaddle==$version")
  [[ "$version" == 2.* ]] && pins+=("protobuf==3.20.3" "numpy<2")
  local project=()
  if [[ -f "$ROOT/pyproject.toml" ]]; then
    project=(-e "$ROOT[test]")
  else
    echo "warning: no pyproject.toml yet; installing test tools only (development fallback)" >&2
    project=(pytest parameterized coverage psutil)
  fi
  local want
  want="${pins[*]} | $(cat "$ROOT/pyproject.toml" 2>/dev/null | sha256sum | cut -c1-16)"
  if [[ $rebuild == 0 && -x "$py" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "venv: reusing $venv" >&2
  else
    if [[ ! -x "$py" ]]; then
      echo "venv: creating $venv" >&2
      "$PYTHON_BOOTSTRAP" -m venv "$venv"
    fi
    echo "venv: installing ${pins[*]} and ${project[*]}" >&2
    # One resolve, so the [test] extra cannot lift the numpy/protobuf pins.
    "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}" "${project[@]}" >&2
    printf '%s' "$want" >"$stamp"
  fi
  "$py" "$ROOT/tools/rank_coverage.py" install-pth >/dev/null
  echo "$py"
}

status=0
for version in "${versions[@]}"; do
  py="$(ensure_venv "$version")"
  echo "== Paddle $version: $py tools/collective_runner.py ${runner_args[*]:-}" >&2
  if ((${#versions[@]} == 1)); then
    exec "$py" "$ROOT/tools/collective_runner.py" ${runner_args[@]+"${runner_args[@]}"}
  fi
  "$py" "$ROOT/tools/collective_runner.py" ${runner_args[@]+"${runner_args[@]}"} || status=1
done
exit $status
