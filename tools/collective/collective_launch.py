# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Launch a per-rank script on N ranks with ``python -m paddle.distributed.launch``.

The project's launcher wrapper (test harness, never shipped upstream), used by the stand-ins of
upstream's test bases (``legacy_test``, ``collective``) and directly by the project's own tests.

One timeout per launch, and rank start-up never counts against it. Start-up lasts until every
local rank has imported Paddle (each rank signals it, :mod:`rank_signals`) and has a generous
limit of its own (``$PADDLE_OVERLAY_STARTUP_TIMEOUT``, default 300 s: it is about the machine,
not the test). The launch's *timeout* counts from then on; by default it is what is left of the
test's own pytest-timeout (the runner sets one per test from its ``testslist.csv`` row), less a
margin to report, so the launch, not pytest, gives the verdict and names the rank. While the
ranks start, that pytest-timeout clock is paused (moved out by the start-up time).

On a timeout or a failing rank the launch's whole process tree is killed (SIGTERM, then SIGKILL:
every process carrying this launch's signal folder in its environment, so ranks re-parented
after the launcher died are found too) and :class:`CollectiveLaunchError` is raised; its message
names the rank that failed first (from the ranks' own exit records) and holds every rank's log
tail, that rank first.

Environment read here: ``PADDLE_OVERLAY_TEST_DEVICE`` (``cpu``/``gpu``/``auto``),
``PADDLE_OVERLAY_TEST_NPROC`` (ranks allowed; a launch needing more is skipped),
``PADDLE_OVERLAY_LAUNCH_ARGS`` (extra launcher arguments, e.g. multi-node ``--master ...``),
``PADDLE_OVERLAY_RUN_DIR`` (where each launch's log folder goes), ``PADDLE_OVERLAY_STARTUP_TIMEOUT``.
Everything else reaches the ranks unchanged.
"""

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import psutil
import rank_signals

TAIL_LINES = 60
DEFAULT_TIMEOUT = 300.0  # seconds of behaviour when no test clock runs
REPORT_MARGIN = 15.0  # seconds of the test's clock kept to kill the tree and report
_POLL = 0.5


class CollectiveLaunchError(AssertionError):
    """A launch timed out or a rank exited non-zero; the message holds the rank log tails."""


class LaunchResult:
    """A launch whose ranks all exited 0: ``seconds``, ``log_dir``, ``rank_logs`` (text of
    ``workerlog.N``), ``startup_seconds`` (until every rank had imported Paddle, or None)."""

    returncode = 0

    def __init__(self, seconds, log_dir, rank_logs, startup_seconds):
        self.seconds, self.log_dir, self.rank_logs, self.startup_seconds = seconds, log_dir, rank_logs, startup_seconds


def _positive(value, name):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def resolve_device(device=None, nproc=2):
    """``device`` or ``$PADDLE_OVERLAY_TEST_DEVICE`` or auto (``gpu`` if >= nproc GPUs, else ``cpu``)."""
    device = (device or os.environ.get("PADDLE_OVERLAY_TEST_DEVICE") or "auto").lower()
    if device not in ("cpu", "gpu", "auto"):
        raise ValueError(f"device must be cpu, gpu or auto, got {device!r}")
    if device == "auto":
        import paddle

        gpus = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
        device = "gpu" if gpus >= nproc else "cpu"
    return device


def skip_reason(nproc, device):
    """Why ``nproc`` ranks on ``device`` cannot run here, or None."""
    limit = os.environ.get("PADDLE_OVERLAY_TEST_NPROC")
    if limit and int(limit) < nproc:
        return f"needs {nproc} ranks, PADDLE_OVERLAY_TEST_NPROC={limit}"
    if device == "gpu":
        import paddle

        gpus = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
        if gpus < nproc:
            return f"needs {nproc} GPUs, {gpus} visible to Paddle {paddle.__version__}"
    return None


def _test_clock():
    """Seconds left on the test's pytest-timeout (its signal method's ITIMER_REAL), or 0."""
    return signal.getitimer(signal.ITIMER_REAL)[0]


def _set_test_clock(seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)


def kill_processes(procs, grace=5.0):
    """SIGTERM ``procs`` (psutil.Process), then SIGKILL those alive ``grace`` seconds later."""
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
    psutil.wait_procs(alive, timeout=grace)


def _processes_with_env(name, value):
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(name) == value:
                found.append(p)
        except psutil.Error:
            continue
    return found


def launch_collective(script, *, nproc=2, timeout=None, env=None, args=(), log_dir=None, device=None,
                      startup_timeout=None):
    """Run ``script`` on ``nproc`` ranks; return a :class:`LaunchResult` when every rank exits 0.

    ``timeout``: seconds of behaviour after every rank is ready (default: what the test's
    pytest-timeout has left, less :data:`REPORT_MARGIN` (at most a quarter of it), else
    :data:`DEFAULT_TIMEOUT`).
    ``startup_timeout``: seconds every rank may take to import Paddle (default
    ``$PADDLE_OVERLAY_STARTUP_TIMEOUT`` or 300). ``env``: extra environment for the ranks;
    ``args``: after the script; ``log_dir``: default a new folder under ``$PADDLE_OVERLAY_RUN_DIR``
    (or the temp folder); ``device``: ``cpu``/``gpu``/``auto``.

    Raises :class:`unittest.SkipTest` when the ranks or GPUs are not available here,
    :class:`CollectiveLaunchError` on a timeout or a failing rank (after killing the tree),
    ``FileNotFoundError`` for a missing script, ``ValueError`` for a bad timeout.
    """
    script = os.path.abspath(script)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"per-rank script not found: {script}")
    startup_limit = _positive(startup_timeout or os.environ.get("PADDLE_OVERLAY_STARTUP_TIMEOUT") or 300,
                              "startup_timeout (PADDLE_OVERLAY_STARTUP_TIMEOUT)")
    clock = _test_clock()
    if timeout is None:
        timeout = clock - min(REPORT_MARGIN, clock / 4) if clock else DEFAULT_TIMEOUT
    timeout = _positive(timeout, "timeout")
    device = resolve_device(device, nproc)
    reason = skip_reason(nproc, device)
    if reason:
        raise unittest.SkipTest(reason)
    rank_signals.install_pth()
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    else:
        parent = os.environ.get("PADDLE_OVERLAY_RUN_DIR")
        if parent:
            os.makedirs(parent, exist_ok=True)
        log_dir = tempfile.mkdtemp(prefix=os.path.splitext(os.path.basename(script))[0] + "-", dir=parent or None)
    log_dir = os.path.abspath(log_dir)
    signal_dir = os.path.join(log_dir, "rank-signals")
    if os.path.isdir(signal_dir):
        for name in os.listdir(signal_dir):
            os.remove(os.path.join(signal_dir, name))
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc)]
    if device == "gpu":
        cmd += ["--devices", ",".join(map(str, range(nproc)))]
    cmd += shlex.split(os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", ""))
    cmd += ["--log_dir", log_dir, script, *map(str, args)]
    full_env = {**os.environ, **(env or {}), "PADDLE_OVERLAY_TEST_DEVICE": device, rank_signals.DIR_ENV: signal_dir}

    start = time.monotonic()
    if clock:
        _set_test_clock(clock + startup_limit)  # the test's clock stands still while ranks start
    with open(os.path.join(log_dir, "launcher.log"), "wb") as out:
        proc = subprocess.Popen(cmd, cwd=os.path.dirname(script), env=full_env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    startup, timed_out, deadline = None, None, start + startup_limit
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if startup is None and len(rank_signals.ready_ranks(signal_dir)) >= nproc:
                startup, deadline = now - start, now + timeout
                if clock:
                    _set_test_clock(clock)
            if now >= deadline:
                timed_out = "behaviour" if startup is not None else "startup"
                break
            time.sleep(_POLL)
    finally:
        if clock and startup is None:
            _set_test_clock(clock)
        kill_processes(_processes_with_env(rank_signals.DIR_ENV, signal_dir))
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    seconds = time.monotonic() - start
    rank_logs = [_read(os.path.join(log_dir, f"workerlog.{r}")) for r in range(nproc)]
    if not timed_out and proc.returncode == 0:
        return LaunchResult(seconds, log_dir, rank_logs, startup)
    if timed_out == "startup":
        ready = rank_signals.ready_ranks(signal_dir)
        missing = sorted(set(range(nproc)) - set(ready))
        why = f"start-up timeout after {startup_limit:.0f}s: rank(s) {missing} had not finished importing Paddle"
    elif timed_out:
        why = f"timeout after {timeout:.0f}s of behaviour (every rank ready after {startup:.1f}s of start-up)"
    else:
        why = f"launcher exit code {proc.returncode}"
    first = None if timed_out else rank_signals.first_failure(signal_dir)
    if first:
        why = f"rank {first[0]} failed first ({first[1]}); {why}"
    raise CollectiveLaunchError(_message(script, nproc, why, seconds, log_dir, rank_logs, first))


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _tail(text, lines=TAIL_LINES):
    return "\n".join(text.splitlines()[-lines:])


def _message(script, nproc, why, seconds, log_dir, rank_logs, first):
    lines = [f"collective launch of {os.path.basename(script)} failed: {why}, {nproc} ranks, {seconds:.1f}s",
             f"logs: {log_dir}"]
    for r in sorted(range(nproc), key=lambda r: (first is None or r != first[0], r)):
        note = f" (failed first: {first[1]})" if first and r == first[0] else ""
        lines += [f"----- rank {r}{note}: last {TAIL_LINES} lines of workerlog.{r} -----", _tail(rank_logs[r]) or "(empty)"]
    # The launcher echoes a failed rank's log: keep its own lines, or its plain tail if it has none.
    launcher = _read(os.path.join(log_dir, "launcher.log"))
    own = "\n".join(l for l in launcher.splitlines() if l.startswith(("LAUNCH", "Container")))
    lines += ["----- launcher.log -----", _tail(own or launcher, 15 if own else 30) or "(empty)"]
    return "\n".join(lines)
