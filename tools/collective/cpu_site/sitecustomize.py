# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test harness only: a CPU rank of a per-rank script beside the test-only CPU shim gets the shim's
gloo group creation (its item 1) before the script runs, so scripts in upstream's form run on gloo.

The ``TestMultipleGpus`` stand-in puts this folder first on the ranks' ``PYTHONPATH`` and names the shim
in ``PADDLE_OVERLAY_CPU_SHIM``. Python imports ``sitecustomize`` once ``site`` is done (every ``.pth``
processed, the overlay's start-up hook in place), so the shim may import Paddle here; a ``.pth`` line may
not (Paddle 2.6 reads ``site.USER_SITE``, unset while the venv's ``.pth`` files run). The launcher (no
``PADDLE_TRAINER_ID``) and GPU ranks are left alone. Another ``sitecustomize`` further on the path (the
runner's ``--slow-start`` one, a system one) runs first, as it would without this one.
"""

import importlib.util
import os
import runpy
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _folder in sys.path:
    _other = os.path.join(_folder or os.curdir, "sitecustomize.py")
    if os.path.abspath(_folder or os.curdir) != _HERE and os.path.isfile(_other):
        runpy.run_path(_other, run_name="sitecustomize")
        break

_shim = os.environ.get("PADDLE_OVERLAY_CPU_SHIM")
if _shim and os.environ.get("PADDLE_TRAINER_ID") is not None and os.environ.get("PADDLE_OVERLAY_TEST_DEVICE") == "cpu":
    _spec = importlib.util.spec_from_file_location("hybrid_parallel_cpu_shim", _shim)
    _module = sys.modules["hybrid_parallel_cpu_shim"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install_group_creation()
