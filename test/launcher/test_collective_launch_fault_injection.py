# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Fault injection for collective_launch: a rank that hangs or dies mid-run fails the launch,
names that rank with its log tail, and leaves no process behind; rank start-up, however slow,
is charged neither to the launch's timeout nor to the test's own (pytest-timeout).

Run once per suite (not per Paddle release): it tests the launcher, not the overlay.
"""

import os
import unittest

import psutil
import pytest
from collective_launch import CollectiveLaunchError, launch_collective
from parameterized import parameterized

HERE = os.path.dirname(os.path.abspath(__file__))
HANG_TIMEOUT = 30  # seconds of behaviour given to the hanging launch (its expected verdict)
CRASH_TIMEOUT = 120  # seconds of behaviour for the crashing launch (an upper bound, not the verdict)
SLOW_START = 20  # seconds each rank sleeps before importing Paddle, and the slow-start test's pytest-timeout


def survivors(script_name):
    """Processes (other than this one) whose command line names this folder's ``script_name`` by its
    absolute path, as the launcher starts it: another checkout's runs of the same script do not count."""
    script, found = os.path.join(HERE, script_name), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] != os.getpid() and script in (p.info["cmdline"] or ()):
            found.append(p)
    return found


class TestCollectiveLaunchFaultInjection(unittest.TestCase):
    longMessage = False  # failures show the launch error with its real newlines, not its repr

    def assert_in_message(self, text, message):
        self.assertIn(text, message, f"{text!r} is not in the launch error:\n{message}")

    @parameterized.expand(
        [
            # (case, script, behaviour timeout, reason in the error, rank 1's last words)
            ("rank_hang", "collective_fault_rank_hang.py", HANG_TIMEOUT,
             f"timeout after {HANG_TIMEOUT}s of behaviour", "FAULT-HANG rank 1 sleeping forever"),
            ("rank_crash", "collective_fault_rank_crash.py", CRASH_TIMEOUT,
             "rank 1 failed first (sys.exit(3))", "FAULT-CRASH rank 1 exiting with code 3"),
        ]
    )
    def test_faulty_rank_fails_launch(self, _case, script, timeout, reason, rank1_tail):
        # launch_collective raises unittest.SkipTest (not caught here) when 2 ranks cannot run.
        with self.assertRaises(CollectiveLaunchError) as ctx:
            launch_collective(os.path.join(HERE, script), nproc=2, timeout=timeout)
        message = str(ctx.exception)
        for text in (script, reason, rank1_tail, "----- rank 1"):  # rank 1 named, its log tail shown
            self.assert_in_message(text, message)
        left = survivors(script)
        self.assertEqual(left, [], f"processes left behind: {[p.info['cmdline'] for p in left]}")

    @pytest.mark.timeout(SLOW_START)  # the test's own clock stands still while the ranks start
    def test_slow_start_is_not_charged_to_the_timeout(self):
        # Each rank sleeps before importing Paddle as long as the whole test may take; the
        # behaviour after it (exit, the launcher noticing) gets as long again.
        result = launch_collective(os.path.join(HERE, "collective_slow_start.py"), nproc=2, timeout=SLOW_START,
                                   env={"SLOW_START_SECONDS": str(SLOW_START)})
        self.assertEqual(result.returncode, 0)
        self.assertGreaterEqual(result.startup_seconds, SLOW_START)  # the sleep was counted as start-up
        for rank, log in enumerate(result.rank_logs):
            self.assertIn(f"SLOW-START rank {rank} imported Paddle", log)

    def test_rank_that_never_starts_hits_the_startup_limit(self):
        with self.assertRaises(CollectiveLaunchError) as ctx:
            launch_collective(os.path.join(HERE, "collective_slow_start.py"), nproc=2, timeout=600,
                              startup_timeout=5, env={"SLOW_START_SECONDS": "600"})
        self.assert_in_message("start-up timeout after 5s: rank(s) [0, 1] had not finished importing Paddle",
                               str(ctx.exception))
        left = survivors("collective_slow_start.py")
        self.assertEqual(left, [], f"processes left behind: {[p.info['cmdline'] for p in left]}")


if __name__ == "__main__":
    unittest.main()
