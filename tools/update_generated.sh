#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Regenerate every generated file the repository commits: the CMakeLists.txt next to each
# testslist.csv (tools/gen_ut_cmakelists.py, which formats with cmakelang), and the Paddle
# patches in patches/ (from the wheels in .venv-test/paddle-VERSION; run
# tools/run_collective_tests.sh --paddle VERSION --list once to make a missing venv).
# Run tools/format.sh --fix first when the overlay or test/collective/fleet changed.
# Tests (test/tools/test_gen_ut_cmakelists.py, test_make_patch.py) fail when these are stale.
#
# Environment: PYTHON (default: .venv-test/paddle-3.3.1/bin/python, whose [test] extra has
# cmakelang; else python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  python=python3
  [[ -x .venv-test/paddle-3.3.1/bin/python ]] && python=.venv-test/paddle-3.3.1/bin/python
fi
"$python" tools/gen_ut_cmakelists.py
for version in 2.6.2 3.3.1; do
  "$python" tools/make_patch.py --from-wheel ".venv-test/paddle-$version" --version "$version" \
    --out "patches/paddle-v$version-stage1-broadcast-overlap.patch"
done
git status --short -- '*CMakeLists.txt' patches/
