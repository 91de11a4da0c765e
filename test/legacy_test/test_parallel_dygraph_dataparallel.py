# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test-only stand-in for upstream Paddle's ``test/legacy_test/test_parallel_dygraph_dataparallel.py``, at
the same path (docs/harness.md): both releases' names and signatures (2.6's ``TestMultipleGpus.run_mnist_2gpu``,
3.x's ``TestMultipleAccelerators.run_mnist_2accelerators``; a checkout-like tree gets only its release's, emitted
by ``tools/make_patch.py``), the script run on 2 ranks by
:func:`collective_launch.launch_collective`, on the CPU too. In overlay mode (default;
``PADDLE_OVERLAY_MODE=patched`` turns it off) the ranks get ``PADDLE_OVERLAY=1``. Never shipped upstream.
"""

import os
import sys
import unittest

from collective_launch import launch_collective

__all__ = ["TestMultipleAccelerators", "TestMultipleGpus"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_SITE = os.path.join(ROOT, "tools", "collective", "cpu_site")


def script_path(test_case, target_file_name):
    """``target_file_name`` next to the driver (as upstream's ``dist_test.sh``), else from the working directory."""
    driver = getattr(sys.modules.get(type(test_case).__module__), "__file__", None)
    beside = driver and os.path.join(os.path.dirname(os.path.abspath(driver)), target_file_name)
    return beside if beside and os.path.isfile(beside) else os.path.abspath(target_file_name)


def rank_env(allocator_strategy, need_envs):
    """Upstream's allocator flag, ``need_envs``, and in overlay mode ``PADDLE_OVERLAY=1`` (unless set)."""
    env = {"FLAGS_allocator_strategy": allocator_strategy, **(need_envs or {})}
    mode = env.get("PADDLE_OVERLAY_MODE", os.environ.get("PADDLE_OVERLAY_MODE", "overlay"))
    if mode == "overlay" and "PADDLE_OVERLAY" not in env and "PADDLE_OVERLAY" not in os.environ:
        env["PADDLE_OVERLAY"] = "1"
    return env


def cpu_shim_env(env):
    """``env`` plus what has each CPU rank install the test-only CPU shim's site items before the script runs
    (``tools/collective/cpu_site/sitecustomize.py``: ``hybrid_parallel_cpu_shim.install_site()``)."""
    path = [CPU_SITE, env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))]
    return {**env, "PADDLE_OVERLAY_CPU_SHIM": "1", "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def run(test_case, script, nproc, env, timeout=None):
    """``script`` on ``nproc`` ranks, each CPU rank with the shim's site items (:func:`cpu_shim_env`)."""
    script = script_path(test_case, script)
    return launch_collective(script, nproc=nproc, env=cpu_shim_env(env), timeout=timeout)  # SkipTest: a skip


class TestMultipleGpus(unittest.TestCase):
    """Upstream's base for 2-process collective drivers (Paddle 2.6 to 3.x name)."""

    def run_mnist_2gpu(self, target_file_name, allocator_strategy="auto_growth", need_envs={}):  # noqa: B006
        return run(self, target_file_name, 2, rank_env(allocator_strategy, need_envs))


class TestMultipleAccelerators(unittest.TestCase):
    """Upstream's base for 2-process drivers (the Paddle 3.x name)."""

    def run_mnist_2accelerators(self, target_file_name, allocator_strategy="auto_growth", need_envs={},  # noqa: B006
                                accelerator_type="gpu"):
        return run(self, target_file_name, 2, rank_env(allocator_strategy, need_envs))
