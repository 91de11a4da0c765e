# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""PADDLE_OVERLAY under Paddle's launcher: an unmodified training script on 2 ranks.

``startup_rank_check.py`` never imports paddle_overlay before training and never
calls ``apply()``; each rank prints what it ran with. Runs with this venv's
Paddle (``sys.executable``): run it once per Paddle venv.
"""

import json
import os
import tempfile
import unittest
from unittest import mock

from collective_launch import CollectiveLaunchError, launch_collective

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "startup_rank_check.py")
TIMEOUT = 240  # seconds for one 2-rank launch
OVERLAY_MODULE = "paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer"
ANNOUNCE = "paddle_overlay: applied to Paddle "  # the line apply() prints once per process


def announce_lines(text):
    return [l for l in text.splitlines() if l.startswith(ANNOUNCE)]


def launcher_text(result):
    with open(os.path.join(result.log_dir, "launcher.log")) as f:
        return f.read()


def rank_reports(result):
    """The STARTUP-CHECK dict of every rank, in rank order."""
    reports = []
    for rank, log in enumerate(result.rank_logs):
        lines = [l for l in log.splitlines() if l.startswith("STARTUP-CHECK ")]
        assert len(lines) == 1, f"rank {rank}: expected one STARTUP-CHECK line in {result.log_dir}, got {lines}"
        reports.append(json.loads(lines[0][len("STARTUP-CHECK "):]))
    return reports


class TestStartupLaunch(unittest.TestCase):
    def launch(self, value, log_dir=None):
        with mock.patch.dict(os.environ):
            os.environ.pop("PADDLE_OVERLAY", None)
            env = {} if value is None else {"PADDLE_OVERLAY": value}
            return launch_collective(SCRIPT, nproc=2, timeout=TIMEOUT, env=env, log_dir=log_dir)

    def test_on_every_rank_runs_with_the_overlay(self):
        result = self.launch("1")
        reports = rank_reports(result)
        for rank, r in enumerate(reports):
            self.assertEqual(
                (r["rank"], r["loaded_by_startup"], r["is_applied"], r["set_broadcast_overlap_from"]),
                (rank, True, True, OVERLAY_MODULE),
            )
            lines = announce_lines(result.rank_logs[rank])
            self.assertEqual(len(lines), 1, f"rank {rank}: {lines}")
            self.assertTrue(lines[0].endswith(f"(rank {rank})"), lines[0])
        self.assertEqual(reports[0]["loss"], reports[1]["loss"])
        # The launcher process imports Paddle too, but is not a rank: it must not apply. Its
        # output echoes rank 0's log, so it holds rank 0's line and nothing more.
        self.assertEqual(announce_lines(launcher_text(result)), announce_lines(result.rank_logs[0]))

    def test_unset_no_rank_applies(self):
        result = self.launch(None)
        reports = rank_reports(result)
        for rank, r in enumerate(reports):
            self.assertEqual((r["rank"], r["loaded_by_startup"], r["is_applied"]), (rank, False, False))
            self.assertNotEqual(r["set_broadcast_overlap_from"], OVERLAY_MODULE)
            self.assertEqual(announce_lines(result.rank_logs[rank]), [])
        self.assertEqual(announce_lines(launcher_text(result)), [])

    def test_bad_value_stops_the_launcher_with_the_message(self):
        log_dir = tempfile.mkdtemp(prefix="startup-bad-value-", dir=os.environ.get("PADDLE_OVERLAY_RUN_DIR"))
        with self.assertRaises(CollectiveLaunchError):
            self.launch("yes please", log_dir=log_dir)
        with open(os.path.join(log_dir, "launcher.log")) as f:
            last = f.read().strip().splitlines()[-1]
        self.assertTrue(last.startswith("ValueError: PADDLE_OVERLAY='yes please' is not understood."), last)
        self.assertFalse([n for n in os.listdir(log_dir) if n.startswith("workerlog")], "no rank may start")


if __name__ == "__main__":
    unittest.main()
