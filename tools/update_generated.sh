#!/usr/bin/env bash
# Regenerate every generated file the repository commits: the CMakeLists.txt
# next to each testslist.csv, and the Paddle patches in patches/ (from the
# wheels in .venv-test/paddle-VERSION; run tools/run_collective_tests.sh
# --paddle VERSION --list once to make a missing venv).
# Tests (test/tools/test_gen_ut_cmakelists.py, test_make_patch.py) fail when
# these are stale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 tools/gen_ut_cmakelists.py
for version in 2.6.2 3.3.1; do
  python3 tools/make_patch.py --from-wheel ".venv-test/paddle-$version" --version "$version" \
    --out "patches/paddle-v$version-stage1-broadcast-overlap.patch"
done
git status --short -- test/collective/fleet/CMakeLists.txt patches/
