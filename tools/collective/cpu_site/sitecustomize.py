# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test harness only: a CPU rank of a script beside the CPU shim (``PADDLE_OVERLAY_CPU_SHIM``, set by the
``TestMultipleGpus`` stand-in with this folder on ``PYTHONPATH``) gets the shim's gloo group creation
before the script runs. Here, not in a ``.pth`` line: Paddle 2.6 reads ``site.USER_SITE``, unset while
``.pth`` files run.
"""

import importlib.util
import os
import sys

_shim = os.environ.get("PADDLE_OVERLAY_CPU_SHIM")
if _shim and os.environ.get("PADDLE_TRAINER_ID") is not None and os.environ.get("PADDLE_OVERLAY_TEST_DEVICE") == "cpu":
    _spec = importlib.util.spec_from_file_location("hybrid_parallel_cpu_shim", _shim)
    _module = sys.modules["hybrid_parallel_cpu_shim"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install_group_creation()
