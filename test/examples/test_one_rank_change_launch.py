# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""A parameter's dtype changed on one rank only (bucket mode): the job ends with that rank's error
named, never a hang or a silent divergence; prints how long the launch took to end after the
change (no timed assertion: the launch's own timeout is the only limit).

Runs with this venv's Paddle (``sys.executable``): run it once per Paddle venv.
"""

import os
import re
import time
import unittest

from collective_launch import CollectiveLaunchError, launch_collective
from legacy_test.test_parallel_dygraph_dataparallel import cpu_shim_env  # gloo group creation on CPU ranks

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "one_rank_dtype_change.py")
TIMEOUT = 240  # seconds of behaviour: a hang would end here, and fail the assertions below


class TestOneRankChangeLaunch(unittest.TestCase):
    def test_one_rank_dtype_change_ends_the_job_naming_that_rank(self):
        with self.assertRaises(CollectiveLaunchError) as caught:
            launch_collective(SCRIPT, nproc=2, timeout=TIMEOUT, env=cpu_shim_env({}))
        ended = time.time()
        message = str(caught.exception)
        self.assertNotIn("timeout after", message)
        self.assertIn("rank 1 failed first", message)
        self.assertRegex(message, r"ValueError: parameter sync overlap: parameter \S+ changed from "
                                  r"float32 x \d+ elements to float64 x \d+ elements")
        self.assertIn("optimizer._set_broadcast_overlap(False)", message)
        self.assertNotIn("ONE-RANK-CHANGE rank 1 finished step 2", message)
        changed_at = float(re.search(r"ONE-RANK-CHANGE rank 1 changed \S+ at (\d+\.\d+)", message).group(1))
        print(f"one-rank dtype change: the launch ended {ended - changed_at:.1f} s after the change")


if __name__ == "__main__":
    unittest.main()
