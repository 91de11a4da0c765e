# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Fault injection for collective_launch: a rank that hangs or dies mid-run must fail the
launch within its timeout, show that rank's log tail, and leave no process behind."""

import os
import time
import unittest

import psutil
from collective_launch import CollectiveLaunchError, CollectiveTestCase, launch_collective
from parameterized import parameterized

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 20.0  # seconds given to each faulty launch
SLACK = 30.0  # seconds allowed on top: killing the tree (SIGTERM grace) and collecting logs


def survivors(script_name):
    """Processes (other than this one) whose command line mentions ``script_name``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] != os.getpid() and any(script_name in a for a in p.info["cmdline"] or ()):
            found.append(p)
    return found


class TestCollectiveLaunchFaultInjection(CollectiveTestCase):
    @parameterized.expand(
        [
            # (case, script, text expected in the error message)
            ("rank_hang", "collective_fault_rank_hang.py", "timeout after 20s", "FAULT-HANG rank 1 sleeping forever"),
            ("rank_crash", "collective_fault_rank_crash.py", "exit code", "FAULT-CRASH rank 1 exiting with code 3"),
        ]
    )
    def test_faulty_rank_fails_launch(self, _case, script, reason, rank1_tail):
        # launch_collective raises unittest.SkipTest (not caught below) when 2 ranks cannot run.
        start = time.monotonic()
        with self.assertRaises(CollectiveLaunchError) as ctx:
            launch_collective(os.path.join(HERE, script), nproc=2, timeout=TIMEOUT)
        elapsed = time.monotonic() - start
        message = str(ctx.exception)
        self.assertLess(elapsed, TIMEOUT + SLACK, f"launch took {elapsed:.1f}s")
        self.assertIn(script, message)
        self.assertIn(reason, message)
        self.assertIn(rank1_tail, message)  # the failing rank's log tail is shown
        self.assertIn("----- rank 1", message)
        left = survivors(script)
        self.assertEqual(left, [], f"processes left behind: {[p.info['cmdline'] for p in left]}")


if __name__ == "__main__":
    unittest.main()
