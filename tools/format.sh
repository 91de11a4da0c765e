#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# tools/format.sh [--check | --fix] [FILE...]: check (default) or fix, as Paddle's pre-commit does, the
# files the Paddle patch takes text from (default: make_patch.patch_source_files()) with isort 5.12.0 and
# black 23.3.0 (Paddle's settings, below), run by $PYTHON, else the newest tested release's venv python (its [test] extra
# pins both). Exit codes: 0 clean or fixed, 1 --check would change files, 2 black/isort missing or unpinned.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
newest=$(cd "$root" && python3 -c 'from paddle_overlay._patching import TESTED_PADDLE as t; print(t[-1])')
venv_python="$root/.venv-test/paddle-$newest/bin/python"
py="${PYTHON:-$( [[ -x "$venv_python" ]] && echo "$venv_python" || echo python3)}"
check=1
case "${1:-}" in --check) shift ;; --fix) check="" && shift ;; esac
if ! "$py" -c 'import black, isort, sys; sys.exit((black.__version__, isort.__version__) != ("23.3.0", "5.12.0"))' 2>/dev/null; then
  echo "error: black 23.3.0 and isort 5.12.0 needed: pip install black==23.3.0 isort==5.12.0 (the [test] extra)" >&2
  exit 2
fi
if (($# == 0)); then
  cd "$root"
  mapfile -t files < <("$py" -c 'import sys; sys.path.insert(0, "tools"); import make_patch; print(*make_patch.patch_source_files(), sep="\n")')
  set -- "${files[@]}"
fi
rc=0  # --src: no folder's modules count as first party but paddle's (as the old isort.Config(src_paths=()))
"$py" -m isort -q --profile black -l 80 -p paddle --src "$root/.no-src" ${check:+--check-only} "$@" || rc=1
"$py" -m black -l 80 -S ${check:+--check --fast} "$@" || rc=1
exit $rc
