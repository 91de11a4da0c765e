# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Project-only launch tests: make the harness (tools/collective) importable."""

import os
import sys

HARNESS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "collective")
if HARNESS_DIR not in sys.path:
    sys.path.insert(0, HARNESS_DIR)
