#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
# Run the collective tests of paddle_overlay against a pinned Paddle, in a venv per release (made on
# first use): --help says everything. The launcher and the test bases set PADDLE_OVERLAY(_CHECK) where the tests need it.
set -euo pipefail
for var in PADDLE_OVERLAY PADDLE_OVERLAY_CHECK COVERAGE_PROCESS_START; do  # --coverage measures the ranks
  if [[ -n "${!var:-}" ]]; then echo "note: ignoring $var=${!var} from the environment (the tests set it where needed)" >&2; fi
  unset "$var"
done
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/collective_runner.py" --bootstrap "$@"
