#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
# Regenerate the committed patches/ from the wheels in .venv-test/paddle-VERSION (make a missing one with
# run_collective_tests.sh --paddle VERSION --venv-only): the patches that have a consumer, the 3.3.1 series
# patches/3.3.1/0001-...patch onward (the pull requests to submit) and the 2.6.2 single patch (a build of the
# oldest release). The others are generated on demand (docs/patches.md). Run tools/format.sh --fix first.
# PYTHON: default the 3.3.1 venv's (its [test] extra holds the formatters each release's tree uses).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-$( [[ -x .venv-test/paddle-3.3.1/bin/python ]] && echo .venv-test/paddle-3.3.1/bin/python || echo python3)}"
"$python" tools/make_patch.py --from-wheel .venv-test/paddle-3.3.1 --version 3.3.1 --series patches/3.3.1
"$python" tools/make_patch.py --from-wheel .venv-test/paddle-2.6.2 --version 2.6.2 \
  --out patches/paddle-v2.6.2-stage1-broadcast-overlap.patch
git status --short -- patches/
