# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The race checker (PADDLE_OVERLAY_CHECK) on 2 ranks: the parameter, layer and path named
on a model that reads a weight mid-broadcast (its zero on the README's model is checked in
the README snippet's launch, test_readme_snippet.py; its raise mode in
test_race_check_raise_launch.py).

Runs with this venv's Paddle (``sys.executable``): run it once per Paddle venv.
"""

import os
import re
import unittest

from collective_launch import launch_collective
from legacy_test.test_parallel_dygraph_dataparallel import cpu_shim_env  # gloo group creation on CPU ranks

HERE = os.path.dirname(os.path.abspath(__file__))
HELD = os.path.join(HERE, "race_check_held.py")
TIMEOUT = 240  # seconds per 2-rank launch


def summary_lines(log, rank):
    head = re.search(rf"paddle_overlay race check: rank {rank}: (\d+) read\(s\).*", log)
    assert head is not None, log[-3000:]
    return int(head.group(1)), [l.strip() for l in log[head.end():].splitlines() if l.startswith("  ")]


class TestRaceCheckLaunch(unittest.TestCase):
    def test_held_reference_is_named_by_parameter_layer_and_path(self):
        result = launch_collective(HELD, nproc=2, timeout=TIMEOUT, env=cpu_shim_env({"PADDLE_OVERLAY_CHECK": "1"}))
        for rank, log in enumerate(result.rank_logs):
            param, layer = re.search(r"HELD-PARAM (\S+) (\S+)", log).groups()
            count, details = summary_lines(log, rank)
            # steps 2 and 3 read the weight in forward before anything waited for it
            self.assertEqual(count, 2, f"rank {rank}: {result.log_dir}")
            self.assertEqual(details, [f"2  {param}  in HeldModel({layer})  via matmul"])


if __name__ == "__main__":
    unittest.main()
