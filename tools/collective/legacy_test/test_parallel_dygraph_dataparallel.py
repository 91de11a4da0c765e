# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test-only stand-in for upstream Paddle's ``test/legacy_test/test_parallel_dygraph_dataparallel.py``.

What it replaces, and why: the drivers in ``test/collective/fleet/test_*.py`` are written in
upstream Paddle's form, ``from legacy_test.test_parallel_dygraph_dataparallel import
TestMultipleGpus`` and ``self.run_mnist_2gpu("per_rank_script.py", need_envs={...})``, so the
same files run inside a Paddle source tree. Upstream's base starts one process per *GPU* and
returns at once (the test passes having run nothing) when Paddle has no CUDA, which is every
machine this project is tested on. ``tools/collective_runner.py`` puts this folder's parent
(``tools/collective``) first on ``PYTHONPATH`` of every driver, so the drivers import this module
instead. It keeps upstream's class and method names and signatures, and runs the script with
:func:`collective_launch.launch_collective`: 2 ranks under ``python -m paddle.distributed.launch``
(gloo on the CPU, NCCL when enough GPUs are visible), a rank start-up limit separate from the
behaviour timeout, the launcher's whole process tree killed on timeout or a failing rank, and
every rank's log tail in the failure. Where ranks cannot run here (fewer ranks allowed, GPUs
asked for and absent) the test is *skipped* with the reason, never passed silently.

Never shipped upstream: ``tools/make_patch.py`` only takes files of ``test/collective/fleet``.

Environment: as :mod:`collective_launch`, plus ``PADDLE_OVERLAY_LAUNCH_TIMEOUT`` (seconds of
behaviour allowed per launch after every rank is ready, default 300; always capped by the
``TEST_TIMEOUT`` budget) and ``PADDLE_OVERLAY_MODE`` (``overlay``, the default: the ranks get
``PADDLE_OVERLAY=1`` so the package's start-up hook applies the overlay; ``patched``: they
do not).
"""

import os
import sys
import unittest

from collective_launch import launch_collective

__all__ = ["TestMultipleGpus", "TestMultipleAccelerators"]

_DEFAULT_LAUNCH_TIMEOUT = 300.0  # seconds of behaviour per launch, after rank start-up


def _launch_timeout():
    """Seconds of behaviour per launch: ``$PADDLE_OVERLAY_LAUNCH_TIMEOUT`` or 300.

    Raises ValueError when the variable is set but is not a positive number.
    """
    raw = os.environ.get("PADDLE_OVERLAY_LAUNCH_TIMEOUT")
    if not raw:
        return _DEFAULT_LAUNCH_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"PADDLE_OVERLAY_LAUNCH_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


def _script_path(test_case, target_file_name):
    """``target_file_name`` as an absolute path: as given if absolute, else next to the driver
    (where upstream's ``dist_test.sh`` runs it from), else relative to the working directory."""
    if os.path.isabs(target_file_name):
        return target_file_name
    module = sys.modules.get(type(test_case).__module__)
    driver_file = getattr(module, "__file__", None)
    if driver_file:
        beside = os.path.join(os.path.dirname(os.path.abspath(driver_file)), target_file_name)
        if os.path.isfile(beside):
            return beside
    return os.path.abspath(target_file_name)


def _rank_env(allocator_strategy, need_envs, device):
    """Environment added for the ranks: upstream's allocator flags, ``need_envs``, and in overlay
    mode (``PADDLE_OVERLAY_MODE`` unset or ``overlay``) ``PADDLE_OVERLAY=1``, so the installed
    start-up hook applies paddle_overlay in every rank and the per-rank scripts, which go
    upstream, never import it. A ``PADDLE_OVERLAY`` already set by the caller is kept."""
    env = {"FLAGS_allocator_strategy": allocator_strategy}
    if device == "gpu" and allocator_strategy == "auto_growth":
        env["FLAGS_fraction_of_gpu_memory_to_use"] = "0.1"  # as upstream
    env.update(need_envs or {})
    mode = env.get("PADDLE_OVERLAY_MODE", os.environ.get("PADDLE_OVERLAY_MODE", "overlay"))
    if mode == "overlay" and "PADDLE_OVERLAY" not in env and "PADDLE_OVERLAY" not in os.environ:
        env["PADDLE_OVERLAY"] = "1"
    return env


def _run_two_ranks(test_case, target_file_name, allocator_strategy, need_envs, device):
    env = _rank_env(allocator_strategy, need_envs, device)
    try:
        return launch_collective(
            _script_path(test_case, target_file_name), nproc=2, timeout=_launch_timeout(), env=env, device=device
        )
    except unittest.SkipTest as e:
        test_case.skipTest(str(e))


class TestMultipleGpus(unittest.TestCase):
    """Upstream's base for 2-process collective drivers (Paddle 2.6 to 3.0 name)."""

    def run_mnist_2gpu(self, target_file_name, allocator_strategy="auto_growth", need_envs={}):  # noqa: B006
        """Run ``target_file_name`` on 2 ranks; ``need_envs`` (dict) is added to the ranks' environment.

        Device: ``$PADDLE_OVERLAY_TEST_DEVICE`` (``auto`` default: GPUs when 2 are visible,
        else the CPU with gloo). Returns the :class:`collective_launch.LaunchResult`.
        Raises :class:`collective_launch.CollectiveLaunchError` on a timeout, a rank that did
        not start, or a rank that exited non-zero; skips the test when 2 ranks cannot run here.
        """
        return _run_two_ranks(self, target_file_name, allocator_strategy, need_envs, device=None)


class TestMultipleAccelerators(unittest.TestCase):
    """Upstream's newer name for the same base (``accelerator_type`` selects the device kind)."""

    def run_mnist_2accelerators(
        self, target_file_name, allocator_strategy="auto_growth", need_envs={}, accelerator_type="gpu"  # noqa: B006
    ):
        """As :meth:`TestMultipleGpus.run_mnist_2gpu`. ``accelerator_type`` ``"gpu"`` means "GPUs when
        2 are visible, else the CPU" here; another kind (``"xpu"``, custom devices) is skipped
        with the reason, since the stand-in only launches on GPUs or the CPU."""
        if accelerator_type != "gpu":
            self.skipTest(f"accelerator_type {accelerator_type!r}: the test stand-in runs on GPUs or the CPU only")
        return _run_two_ranks(self, target_file_name, allocator_strategy, need_envs, device=None)
