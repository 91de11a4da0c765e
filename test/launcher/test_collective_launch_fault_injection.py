# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Fault injection for collective_launch: a rank that hangs or dies mid-run fails the launch,
names that rank with its log tail, and leaves no process behind, even a rank Paddle's launcher was
forking when it was told to end; rank start-up, however slow, is charged neither to the launch's
timeout nor to the test's own (pytest-timeout).

Run once per suite (not per Paddle release): it tests the launcher, not the overlay.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest

import psutil
import pytest
import rank_signals
from collective_launch import CollectiveLaunchError, kill_marked, launch_collective, marked
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

    def test_sigterm_while_paddles_launcher_forks_a_rank_leaves_nothing(self):
        # The rank is forked after the SIGTERM, so after the scan that sent it; Paddle's handler does not
        # end it (its Container has no handle on it): only a second scan finds it. Before the kill scanned
        # again, such a rank outlived the start-up limit test in CI.
        log_dir = tempfile.mkdtemp(prefix="sigterm-while-forking-", dir=os.environ.get("PADDLE_OVERLAY_RUN_DIR"))
        signal_dir = os.path.join(log_dir, "rank-signals")
        os.makedirs(signal_dir)
        cmd = [sys.executable, os.path.join(HERE, "paddle_launch_sigterm_while_forking.py"), "--nproc_per_node",
               "2", "--log_dir", log_dir, os.path.join(HERE, "collective_slow_start.py")]
        env = {**os.environ, rank_signals.DIR_ENV: signal_dir, "SLOW_START_SECONDS": "600"}
        with open(os.path.join(log_dir, "launcher.log"), "wb") as out:
            launcher = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        try:
            while not os.path.exists(os.path.join(signal_dir, "forking")):  # Paddle imported, the pod deploying
                self.assertIsNone(launcher.poll(), f"the launcher exited before it forked a rank: {log_dir}")
                time.sleep(0.05)
            self.assertEqual([p.pid for p in marked(rank_signals.DIR_ENV, signal_dir)], [launcher.pid])
            self.assertEqual(kill_marked(rank_signals.DIR_ENV, signal_dir), [])
        finally:
            kill_marked(rank_signals.DIR_ENV, signal_dir)
            launcher.wait()
        with open(os.path.join(log_dir, "launcher.log"), errors="replace") as f:
            self.assertIn("Terminating with signal 15", f.read())  # Paddle's handler ran, after the fork
        with open(os.path.join(signal_dir, "forked")) as f:
            rank = int(f.read())
        try:
            self.assertEqual(psutil.Process(rank).status(), psutil.STATUS_ZOMBIE, f"rank {rank} still runs")
        except psutil.NoSuchProcess:
            pass
        left = survivors("collective_slow_start.py")
        self.assertEqual(left, [], f"processes left behind: {[p.info['cmdline'] for p in left]}")


if __name__ == "__main__":
    unittest.main()
