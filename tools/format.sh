#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Format exactly the files the Paddle patch adds or changes as Paddle's pre-commit would (black
# 23.3.0, isort 5.12.0, upstream's Apache-2.0 header): tools/format.sh [--check | --fix] [FILE...]
# (default --check, the patch's files). Runs tools/paddle_format.py with $PYTHON, else the python of
# .venv-test/paddle-3.3.1 (its [test] extra pins black and isort), else python3. Exit codes: 0 clean
# or fixed, 1 --check found files that would change, 2 black/isort missing or not the pinned version.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_python="$root/.venv-test/paddle-3.3.1/bin/python"
exec "${PYTHON:-$( [[ -x "$venv_python" ]] && echo "$venv_python" || echo python3)}" "$root/tools/paddle_format.py" "$@"
