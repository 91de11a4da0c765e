# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Launch a per-rank script under ``python -m paddle.distributed.launch`` from a driver test.

Every collective driver test in this folder uses :func:`launch_collective` (or
:class:`CollectiveTestCase`). The launcher runs in its own session; on a timeout or a
failing rank its whole process tree is killed (SIGTERM, then SIGKILL after a grace period),
so no rank is left holding a port or a core, and the test fails with
:class:`CollectiveLaunchError`, whose message carries every rank's log tail.

Environment read here (set by ``tools/collective_runner.py``, or by hand):

* ``PADDLE_OVERLAY_TEST_DEVICE``  ``cpu`` | ``gpu`` | ``auto`` (default ``auto``).
* ``PADDLE_OVERLAY_TEST_NPROC``   ranks the machine may use; a launch needing more is skipped.
* ``PADDLE_OVERLAY_LAUNCH_ARGS``  extra launcher arguments, e.g. ``--master 10.0.0.1:8090 --nnodes 2 --rank 0``.
* ``PADDLE_OVERLAY_RUN_DIR``      keep each launch's logs under this folder.
* ``TEST_TIMEOUT``                (set by upstream ``bash_test_modules``, seconds) a launch never
  outlives this budget, so the driver fails cleanly before ``dist_test.sh`` SIGKILLs it.

Everything else in the environment, including ``PADDLE_OVERLAY_*`` and ``COVERAGE_*``,
reaches the ranks unchanged.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import psutil

_TAIL_LINES = 60
_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.5
_DRIVER_START = time.monotonic()
# Launcher trees currently running in this process, killed by the SIGTERM handler.
_LIVE_TREES = {}


class CollectiveLaunchError(AssertionError):
    """A collective launch timed out or a rank exited non-zero; the message holds the rank log tails."""


class LaunchResult:
    """Outcome of a successful launch.

    Attributes: ``returncode`` (int, 0), ``seconds`` (float, wall time), ``log_dir`` (str),
    ``rank_logs`` (list of str, full text of ``workerlog.N`` for N = 0..nproc-1).
    """

    def __init__(self, returncode, seconds, log_dir, rank_logs):
        self.returncode = returncode
        self.seconds = seconds
        self.log_dir = log_dir
        self.rank_logs = rank_logs

    def __repr__(self):
        return f"LaunchResult(returncode={self.returncode}, seconds={self.seconds:.1f}, log_dir={self.log_dir!r})"


# --------------------------------------------------------------------------- process trees


def kill_process_tree(procs, grace=_GRACE_SECONDS):
    """SIGTERM every process in ``procs`` (psutil.Process objects), then SIGKILL survivors.

    ``grace`` is seconds to wait between the two signals. Returns the list of processes
    still alive afterwards (normally empty). Processes that already exited are ignored.
    """
    procs = [p for p in procs if _alive(p)]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace)
    return alive


def tree_of(root_pid):
    """Return [root] + all its descendants as psutil.Process objects (empty if root is gone)."""
    try:
        root = psutil.Process(root_pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def processes_with_env(name, value):
    """Processes of this user whose environment has ``name=value`` (catches re-parented ranks)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(name) == value:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _alive(p):
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_all_trees(signum, frame):
    """SIGTERM handler of the driver: kill every live launcher tree, then exit 128+signum."""
    for tracked in list(_LIVE_TREES.values()):
        kill_process_tree(tracked, grace=2.0)
    _LIVE_TREES.clear()
    sys.exit(128 + signum)


def _install_sigterm_handler():
    try:
        if signal.getsignal(signal.SIGTERM) is not _kill_all_trees:
            signal.signal(signal.SIGTERM, _kill_all_trees)
    except ValueError:  # not the main thread: the caller must clean up itself
        pass


# --------------------------------------------------------------------------- device / skip


def gpu_count():
    """Visible GPUs Paddle can use (0 when Paddle is not compiled with CUDA)."""
    import paddle

    if not paddle.is_compiled_with_cuda():
        return 0
    return paddle.device.cuda.device_count()


def resolve_device(device=None, nproc=2):
    """``device`` or ``$PADDLE_OVERLAY_TEST_DEVICE`` or auto: ``gpu`` if >= nproc GPUs, else ``cpu``."""
    device = (device or os.environ.get("PADDLE_OVERLAY_TEST_DEVICE") or "auto").lower()
    if device not in ("cpu", "gpu", "auto"):
        raise ValueError(f"device must be cpu, gpu or auto, got {device!r}")
    if device == "auto":
        device = "gpu" if gpu_count() >= nproc else "cpu"
    return device


def skip_reason(nproc, device):
    """Why a launch of ``nproc`` ranks on ``device`` cannot run here, or None if it can."""
    limit = os.environ.get("PADDLE_OVERLAY_TEST_NPROC")
    if limit and int(limit) < nproc:
        return f"needs {nproc} ranks, PADDLE_OVERLAY_TEST_NPROC={limit}"
    if device == "gpu":
        import paddle

        if not paddle.is_compiled_with_cuda():
            return f"needs {nproc} GPUs, Paddle {paddle.__version__} is not compiled with CUDA"
        n = gpu_count()
        if n < nproc:
            return f"needs {nproc} GPUs, {n} visible"
    return None


# --------------------------------------------------------------------------- launching


def _log_dir_for(script, log_dir):
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        return os.path.abspath(log_dir)
    stem = os.path.splitext(os.path.basename(script))[0]
    parent = os.environ.get("PADDLE_OVERLAY_RUN_DIR")
    if parent:
        os.makedirs(parent, exist_ok=True)
    return os.path.abspath(tempfile.mkdtemp(prefix=f"{stem}-", dir=parent or None))


def _deadline_budget():
    """Seconds left before an outer ``TEST_TIMEOUT`` (minus a margin), or None."""
    outer = os.environ.get("TEST_TIMEOUT")
    if not outer:
        return None
    # dist_test.sh kills at TEST_TIMEOUT - 10 s; keep 20 s more to kill the tree and report.
    return float(outer) - 30.0 - (time.monotonic() - _DRIVER_START)


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _tail(text, lines=_TAIL_LINES):
    return "\n".join(text.splitlines()[-lines:])


def _failed_rank(launcher_text):
    """(rank, exit code) of the container the Paddle launcher reported failed, or None."""
    m = re.search(r"Container rank (\d+) status failed .*? code (-?\d+)", launcher_text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def launch_collective(script, *, nproc=2, timeout=300, env=None, args=(), log_dir=None, device=None):
    """Run ``script`` on ``nproc`` ranks with ``python -m paddle.distributed.launch``.

    ``script``: path of the per-rank script (run from its own folder). ``timeout``: seconds
    for the whole launch (capped by ``TEST_TIMEOUT`` when set). ``env``: extra environment
    entries. ``args``: arguments after the script. ``log_dir``: where the launcher writes
    ``workerlog.N`` (default: a fresh folder under ``$PADDLE_OVERLAY_RUN_DIR`` or the temp dir).
    ``device``: ``cpu`` | ``gpu`` | ``auto`` (default: ``$PADDLE_OVERLAY_TEST_DEVICE`` or auto).

    Returns a :class:`LaunchResult` when every rank exits 0.
    Raises :class:`unittest.SkipTest` when the ranks or GPUs are not available,
    :class:`CollectiveLaunchError` on timeout or a non-zero rank (after the launcher's whole
    process tree was killed), ``FileNotFoundError`` if the script does not exist.
    """
    script = os.path.abspath(script)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"per-rank script not found: {script}")
    device = resolve_device(device, nproc)
    reason = skip_reason(nproc, device)
    if reason:
        raise unittest.SkipTest(reason)
    budget = _deadline_budget()
    if budget is not None and budget < timeout:
        timeout = max(budget, 1.0)

    log_dir = _log_dir_for(script, log_dir)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc)]
    if device == "gpu":
        cmd += ["--devices", ",".join(str(i) for i in range(nproc))]
    cmd += shlex.split(os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", ""))
    cmd += ["--log_dir", log_dir, script, *map(str, args)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PADDLE_OVERLAY_TEST_DEVICE"] = device

    _install_sigterm_handler()
    launcher_log = os.path.join(log_dir, "launcher.log")
    start = time.monotonic()
    with open(launcher_log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=os.path.dirname(script), env=full_env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    tracked = {}  # pid -> psutil.Process: every descendant ever seen, even after re-parenting
    _LIVE_TREES[proc.pid] = []
    try:
        timed_out = _wait(proc, timeout, tracked)
    finally:
        # Ranks are re-parented when the launcher dies first: find them by their log dir too.
        for p in processes_with_env("PADDLE_LOG_DIR", log_dir):
            tracked.setdefault(p.pid, p)
        kill_process_tree(list(tracked.values()))
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _LIVE_TREES.pop(proc.pid, None)
    seconds = time.monotonic() - start

    rank_logs = [_read(os.path.join(log_dir, f"workerlog.{r}")) for r in range(nproc)]
    if not timed_out and proc.returncode == 0:
        return LaunchResult(0, seconds, log_dir, rank_logs)
    raise CollectiveLaunchError(
        _failure_message(script, nproc, timeout, timed_out, proc.returncode, seconds, log_dir, rank_logs)
    )


def _wait(proc, timeout, tracked):
    """Poll ``proc`` until it exits or ``timeout`` seconds pass, recording its descendants.

    Returns True on timeout. ``tracked`` (pid -> psutil.Process) is filled in place and also
    published in ``_LIVE_TREES`` for the SIGTERM handler.
    """
    deadline = time.monotonic() + timeout
    while True:
        for p in tree_of(proc.pid):
            tracked.setdefault(p.pid, p)
        _LIVE_TREES[proc.pid] = list(tracked.values())
        if proc.poll() is not None:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(_POLL_SECONDS)


def _failure_message(script, nproc, timeout, timed_out, returncode, seconds, log_dir, rank_logs):
    launcher_text = _read(os.path.join(log_dir, "launcher.log"))
    failed = None if timed_out else _failed_rank(launcher_text)
    if timed_out:
        reason = f"timeout after {timeout:.0f}s"
    elif failed:
        reason = f"launcher reports rank {failed[0]} exit code {failed[1]} (launcher exit code {returncode})"
    else:
        reason = f"launcher exit code {returncode}"
    lines = [
        f"collective launch of {os.path.basename(script)} failed: {reason}, {nproc} ranks, {seconds:.1f}s",
        f"logs: {log_dir}",
    ]
    order = list(range(nproc))
    if failed and failed[0] in order:  # the rank the launcher blamed first
        order.remove(failed[0])
        order.insert(0, failed[0])
    for r in order:
        note = f" (exit code {failed[1]})" if failed and failed[0] == r else ""
        lines.append(f"----- rank {r}{note}: last {_TAIL_LINES} lines of workerlog.{r} -----")
        lines.append(_tail(rank_logs[r]) or "(empty)")
    # The launcher echoes the failed rank's log; keep only its own lines.
    own = "\n".join(l for l in launcher_text.splitlines() if l.startswith(("LAUNCH", "Container")))
    lines.append("----- launcher: last 15 LAUNCH lines of launcher.log -----")
    lines.append(_tail(own, 15) or "(empty)")
    return "\n".join(lines)


class CollectiveTestCase(unittest.TestCase):
    """unittest base for drivers: ``self.run_collective(script)`` launches, skips or fails."""

    def run_collective(self, script, *, nproc=2, timeout=None, env=None, args=()):
        """Launch ``script`` (relative to this folder or absolute) on ``nproc`` ranks.

        ``timeout`` seconds (default 300). Skips the test with its reason when the ranks or
        GPUs are not available; raises :class:`CollectiveLaunchError` on failure.
        Returns the :class:`LaunchResult`.
        """
        if not os.path.isabs(script):
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
        try:
            return launch_collective(script, nproc=nproc, timeout=timeout or 300, env=env, args=args)
        except unittest.SkipTest as e:
            self.skipTest(str(e))
