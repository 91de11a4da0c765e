#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
# tools/apply_patch.sh [--no-register] PADDLE_SRC [PATCH or SERIES folder] (--help: tools/apply_patch.py); PYTHON: its python3.
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/apply_patch.py" "$@"
