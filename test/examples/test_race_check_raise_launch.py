# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The race checker's raise mode (PADDLE_OVERLAY_CHECK=raise) on 2 ranks: the rank stops at the first read
of a weight mid-broadcast (race_check_held.py). A row of its own: the operator entry points it wraps are
release-specific and the report mode's row (test_race_check_launch.py) shows them on every release; what
raise adds, stopping instead of counting, is the same on every release, so it runs on the newest release
only (docs/harness.md, "Which rows run where").

Runs with this venv's Paddle (``sys.executable``).
"""

import os
import unittest

from collective_launch import CollectiveLaunchError, launch_collective
from legacy_test.test_parallel_dygraph_dataparallel import cpu_shim_env  # gloo group creation on CPU ranks

HELD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "race_check_held.py")
TIMEOUT = 240  # seconds for the 2-rank launch


class TestRaceCheckRaiseLaunch(unittest.TestCase):
    def test_raise_mode_fails_the_rank_at_the_first_race(self):
        with self.assertRaises(CollectiveLaunchError) as caught:
            launch_collective(HELD, nproc=2, timeout=TIMEOUT, env=cpu_shim_env({"PADDLE_OVERLAY_CHECK": "raise"}))
        self.assertIn("while its broadcast was still pending", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
