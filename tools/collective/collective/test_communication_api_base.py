# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test-only stand-in for upstream Paddle's ``test/collective/test_communication_api_base.py``.

What it replaces, and why: upstream's ``CommunicationTestDistBase`` is the base of its
multi-device collective drivers (``setUp(num_of_devices=N, timeout=T)``, then
``run_test_case(script, user_defined_envs)``); it starts ``python -m paddle.distributed.launch
--devices ...`` on GPUs. The project's 4-rank drivers in ``test/collective/fleet`` use it, as
upstream's hybrid-parallel drivers do, so they run unchanged inside a Paddle tree. Here, with
``tools/collective`` first on ``PYTHONPATH`` (set by ``tools/collective_runner.py``), the same
calls run through :func:`collective_launch.launch_collective`: ``num_of_devices`` ranks on the
CPU with gloo (GPUs when enough are visible), a rank start-up limit apart from the behaviour
timeout, the process tree killed on failure with every rank's log tail, and a skip with the
reason when the ranks cannot run here. ``PADDLE_OVERLAY=1`` is given to the ranks as in
:mod:`legacy_test.test_parallel_dygraph_dataparallel` (overlay mode).

Never shipped upstream: ``tools/make_patch.py`` only takes files of ``test/collective/fleet``.
"""

import os
import sys
import unittest

from collective_launch import launch_collective
from legacy_test.test_parallel_dygraph_dataparallel import (
    _launch_timeout,
    _rank_env,
    _script_path,
)

__all__ = ["CommunicationTestDistBase"]


class CommunicationTestDistBase(unittest.TestCase):
    """Upstream's base for N-process collective drivers (same names and signatures)."""

    def setUp(self, save_log_dir=None, num_of_devices=2, timeout=120, nnode=1):
        self._num_of_devices = num_of_devices
        self._timeout = timeout
        self._nnode = nnode
        self._save_log_dir = save_log_dir

    def run_test_case(self, script_file, user_defined_envs=None):
        """Run ``script_file`` on ``num_of_devices`` ranks; ``user_defined_envs`` (dict) is
        added to the ranks' environment. Raises
        :class:`collective_launch.CollectiveLaunchError` on a timeout or a failing rank; skips
        when the ranks cannot run here (multi-node: always skipped)."""
        if self._nnode > 1:
            self.skipTest("multi-node cases are not run by the test stand-in")
        env = _rank_env("auto_growth", user_defined_envs, None)
        timeout = max(float(self._timeout), _launch_timeout())
        try:
            return launch_collective(
                _script_path(self, script_file),
                nproc=self._num_of_devices,
                timeout=timeout,
                env=env,
                log_dir=None,
            )
        except unittest.SkipTest as e:
            self.skipTest(str(e))
