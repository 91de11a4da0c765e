#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
# Regenerate the committed patches/ from the wheels in .venv-test/paddle-VERSION (make a missing one with
# run_collective_tests.sh --paddle VERSION --venv-only): per version the series patches/VERSION/0001-...patch
# onward and the single patch of all of them. Run tools/format.sh --fix first. PYTHON: default the 3.3.1 venv's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-$( [[ -x .venv-test/paddle-3.3.1/bin/python ]] && echo .venv-test/paddle-3.3.1/bin/python || echo python3)}"
for version in 2.6.2 3.3.1; do
  "$python" tools/make_patch.py --from-wheel ".venv-test/paddle-$version" --version "$version" \
    --out "patches/paddle-v$version-stage1-broadcast-overlap.patch"
  "$python" tools/make_patch.py --from-wheel ".venv-test/paddle-$version" --version "$version" \
    --series "patches/$version"
done
git status --short -- patches/
