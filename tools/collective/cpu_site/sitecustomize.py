# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The launcher's site hook (test only): a CPU rank of a launch that asks for it (``PADDLE_OVERLAY_CPU_SHIM=1``,
set with this folder on ``PYTHONPATH`` by ``test/legacy_test``'s ``cpu_shim_env``) gets the CPU shim's
``install_site()`` before the script runs, so per-rank scripts in upstream's form, which import nothing of this
project, run on gloo. The shim is imported by name from ``tools/collective``, which the launcher puts on every
rank's ``PYTHONPATH``. Here, not in a ``.pth`` line: Paddle 2.6 reads ``site.USER_SITE``, unset while ``.pth``
files run.
"""

import os

if (os.environ.get("PADDLE_OVERLAY_CPU_SHIM") == "1" and os.environ.get("PADDLE_TRAINER_ID") is not None
        and os.environ.get("PADDLE_OVERLAY_TEST_DEVICE") == "cpu"):
    import hybrid_parallel_cpu_shim

    hybrid_parallel_cpu_shim.install_site()
