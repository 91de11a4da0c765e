#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
# Regenerate every committed generated file: the CMakeLists.txt next to each testslist.csv, and patches/
# from the wheels in .venv-test/paddle-VERSION (make a missing one with run_collective_tests.sh --paddle
# VERSION --venv-only). Run tools/format.sh --fix first. PYTHON: default the 3.3.1 venv's (it has cmakelang).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-$( [[ -x .venv-test/paddle-3.3.1/bin/python ]] && echo .venv-test/paddle-3.3.1/bin/python || echo python3)}"
"$python" tools/gen_ut_cmakelists.py
for version in 2.6.2 3.3.1; do
  "$python" tools/make_patch.py --from-wheel ".venv-test/paddle-$version" --version "$version" \
    --out "patches/paddle-v$version-stage1-broadcast-overlap.patch"
done
git status --short -- '*CMakeLists.txt' patches/
