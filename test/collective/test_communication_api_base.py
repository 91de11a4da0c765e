# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test-only stand-in for upstream Paddle's ``test/collective/test_communication_api_base.py``, at the same path:
``CommunicationTestDistBase`` (``setUp(num_of_devices=N, timeout=T)``, ``run_test_case(script,
user_defined_envs)``) run as in the ``legacy_test`` stand-in; multi-node cases are skipped.
"""

import unittest

from legacy_test.test_parallel_dygraph_dataparallel import rank_env, run

__all__ = ["CommunicationTestDistBase"]


class CommunicationTestDistBase(unittest.TestCase):
    def setUp(self, save_log_dir=None, num_of_devices=2, timeout=120, nnode=1):
        self._num_of_devices, self._timeout, self._nnode = num_of_devices, timeout, nnode

    def run_test_case(self, script_file, user_defined_envs=None):
        if self._nnode > 1:
            self.skipTest("multi-node cases are not run by the test stand-in")
        return run(self, script_file, self._num_of_devices, rank_env("auto_growth", user_defined_envs), self._timeout)
