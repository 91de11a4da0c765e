# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test-only stand-in for upstream Paddle's ``test/legacy_test`` package (see its module)."""
