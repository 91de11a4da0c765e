# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: sleeps ``SLOW_START_SECONDS`` before importing Paddle, then exits 0.

Stands for a loaded machine on which Python and Paddle start slowly. Used by
test_collective_launch_fault_injection.py: the sleep must count as rank start-up, not
against the launch's behaviour timeout. After importing Paddle it waits until its own
readiness file exists (the hook writes it from a thread), so the launcher sees it.
"""

import os
import time

time.sleep(float(os.environ.get("SLOW_START_SECONDS", "0")))

import paddle  # noqa: E402

rank = os.environ["PADDLE_TRAINER_ID"]
ready = os.path.join(os.environ["PADDLE_OVERLAY_RANK_SIGNAL_DIR"], f"rank-{rank}")
while not os.path.exists(ready):
    time.sleep(0.1)
print(f"SLOW-START rank {rank} imported Paddle {paddle.__version__}", flush=True)
