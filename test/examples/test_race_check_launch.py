# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The race checker (PADDLE_OVERLAY_CHECK) on 2 ranks: zero on the README's model, and
the parameter, layer and path named on a model that reads a weight mid-broadcast.

Runs with this venv's Paddle (``sys.executable``): run it once per Paddle venv.
"""

import os
import re
import tempfile
import unittest

from collective_launch import CollectiveLaunchError, launch_collective

HERE = os.path.dirname(os.path.abspath(__file__))
README_CHECK = os.path.join(HERE, "readme_train_check.py")
HELD = os.path.join(HERE, "race_check_held.py")
TIMEOUT = 240  # seconds per 2-rank launch


def summary_lines(log, rank):
    head = re.search(rf"paddle_overlay race check: rank {rank}: (\d+) read\(s\).*", log)
    assert head is not None, log[-3000:]
    return int(head.group(1)), [l.strip() for l in log[head.end():].splitlines() if l.startswith("  ")]


class TestRaceCheckLaunch(unittest.TestCase):
    def test_readme_model_reports_zero(self):
        out = tempfile.mkdtemp(prefix="race-check-", dir=os.environ.get("PADDLE_OVERLAY_RUN_DIR"))
        result = launch_collective(
            README_CHECK, nproc=2, timeout=TIMEOUT,
            env={"README_TRAIN_DIR": out, "PADDLE_OVERLAY_CHECK": "1"},
        )
        for rank, log in enumerate(result.rank_logs):
            count, details = summary_lines(log, rank)
            self.assertEqual((count, details), (0, []), f"rank {rank}: {result.log_dir}")
            self.assertIn("none: every read waited for its broadcast", log)

    def test_held_reference_is_named_by_parameter_layer_and_path(self):
        result = launch_collective(HELD, nproc=2, timeout=TIMEOUT, env={"PADDLE_OVERLAY_CHECK": "1"})
        for rank, log in enumerate(result.rank_logs):
            param, layer = re.search(r"HELD-PARAM (\S+) (\S+)", log).groups()
            count, details = summary_lines(log, rank)
            # steps 2 and 3 read the weight in forward before anything waited for it
            self.assertEqual(count, 2, f"rank {rank}: {result.log_dir}")
            self.assertEqual(details, [f"2  {param}  in HeldModel({layer})  via matmul"])

    def test_raise_mode_fails_the_rank_at_the_first_race(self):
        with self.assertRaises(CollectiveLaunchError) as caught:
            launch_collective(HELD, nproc=2, timeout=TIMEOUT, env={"PADDLE_OVERLAY_CHECK": "raise"})
        self.assertIn("while its broadcast was still pending", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
