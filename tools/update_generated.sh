#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Regenerate every generated file the repository commits: the CMakeLists.txt next to each
# testslist.csv, and patches/ from the wheels in .venv-test/paddle-VERSION (run
# tools/run_collective_tests.sh --paddle VERSION --venv-only once to make a missing venv).
# Run tools/format.sh --fix first when the overlay or test/collective/fleet changed.
# PYTHON: default .venv-test/paddle-3.3.1/bin/python (its [test] extra has cmakelang), else python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-$( [[ -x .venv-test/paddle-3.3.1/bin/python ]] && echo .venv-test/paddle-3.3.1/bin/python || echo python3)}"
"$python" tools/gen_ut_cmakelists.py
for version in 2.6.2 3.3.1; do
  "$python" tools/make_patch.py --from-wheel ".venv-test/paddle-$version" --version "$version" \
    --out "patches/paddle-v$version-stage1-broadcast-overlap.patch"
done
git status --short -- '*CMakeLists.txt' patches/
