#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Run the collective tests of paddle_overlay against a pinned Paddle, in a venv per release
# (made on first use): tools/collective_runner.py --help says everything.
set -euo pipefail
# The test tooling decides where the overlay is applied (the ranks get PADDLE_OVERLAY=1 from the
# harness); a value left in the user's shell would apply it in every tool and test process.
for var in PADDLE_OVERLAY PADDLE_OVERLAY_CHECK; do
  if [[ -n "${!var:-}" ]]; then echo "note: ignoring $var=${!var} from the environment (the tests set it where needed)" >&2; fi
  unset "$var"
done
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/collective_runner.py" --bootstrap "$@"
