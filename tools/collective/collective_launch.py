# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The launcher of the collective tests (test only): a per-rank script on N ranks with
``python -m paddle.distributed.launch``.

One timeout per launch, rank start-up not counted (docs/harness.md, "Timeouts"): while the ranks import
Paddle (:mod:`rank_signals`; limit ``$PADDLE_OVERLAY_STARTUP_TIMEOUT``, 300 s) the test's pytest-timeout
clock stands still. On a timeout or a failing rank the launch's processes are killed and
:class:`CollectiveLaunchError` names the rank that failed first and each rank's last collective, with every
rank's log tail. A launch whose ranks all exit 0 fails too when the collectives they issued
(:mod:`collective_recorder`) do not form one schedule. Every rank gets this folder first on its ``PYTHONPATH``
(:data:`HERE`): the test-only modules beside this file (``hybrid_parallel_cpu_shim``, ``blocking_calls``) are
imported by name there, as under pytest.
Environment: ``PADDLE_OVERLAY_TEST_DEVICE``, ``PADDLE_OVERLAY_TEST_NPROC`` (ranks allowed),
``PADDLE_OVERLAY_LAUNCH_ARGS`` (extra launcher arguments), ``PADDLE_OVERLAY_RUN_DIR`` (log folders).
"""

import collections
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import collective_recorder
import psutil
import rank_signals

HERE = os.path.dirname(os.path.abspath(__file__))
TAIL_LINES = 60
DEFAULT_TIMEOUT = 300.0  # seconds of behaviour when no test clock runs
REPORT_MARGIN = 15.0  # seconds of the test's clock kept to kill the tree and report
# A launch whose ranks all exited 0; startup_seconds: until every rank had imported Paddle.
LaunchResult = collections.namedtuple("LaunchResult", "seconds log_dir rank_logs startup_seconds returncode",
                                      defaults=(0,))


class CollectiveLaunchError(AssertionError):
    """A launch timed out or a rank exited non-zero; the message holds the rank log tails."""


def _gpus():
    import paddle

    return paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0


def resolve_device(device=None, nproc=2):
    """``device`` or ``$PADDLE_OVERLAY_TEST_DEVICE`` or auto (``gpu`` if >= nproc GPUs, else ``cpu``)."""
    device = (device or os.environ.get("PADDLE_OVERLAY_TEST_DEVICE") or "auto").lower()
    if device not in ("cpu", "gpu", "auto"):
        raise ValueError(f"device must be cpu, gpu or auto, got {device!r}")
    return ("gpu" if _gpus() >= nproc else "cpu") if device == "auto" else device


def _seconds(value, name):
    try:
        if 0 < float(value) < math.inf:
            return float(value)
    except (TypeError, ValueError):
        pass
    raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")


def marked(name, value, spare=()):
    """The processes (but this one and the pids in ``spare``) whose environment has ``name=value``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.pid not in spare and p.environ().get(name) == value:
                found.append(p)
        except psutil.Error:
            continue
    return found


def kill_marked(name, value, grace=5.0, spare=(), rounds=10):
    """SIGTERM, then SIGKILL ``grace`` seconds later, every :func:`marked` process; ``spare``: children
    whose exit status their ``Popen`` must collect.

    Scans again after each round until a scan finds none (at most ``rounds`` rounds): a process started
    while the others were ending, such as a rank that Paddle's launcher was forking when its SIGTERM came,
    is not in the round's scan. Returns the marked processes left after the last round (normally none)."""
    for _ in range(rounds):
        procs = marked(name, value, spare)
        if not procs:
            return []
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        for p in psutil.wait_procs(procs, timeout=grace)[1]:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=grace)
    return marked(name, value, spare)


def launch_collective(script, *, nproc=2, timeout=None, env=None, log_dir=None, startup_timeout=None):
    """Run ``script`` on ``nproc`` ranks; a :class:`LaunchResult` when every rank exits 0, else
    :class:`CollectiveLaunchError`; :class:`unittest.SkipTest` when the ranks or GPUs are not there.

    ``timeout``: seconds after every rank is ready (default: what the test's pytest-timeout has left less
    :data:`REPORT_MARGIN`, at most a quarter of it, else :data:`DEFAULT_TIMEOUT`); ``env``: added to the
    ranks'; ``log_dir``: default a new folder under ``$PADDLE_OVERLAY_RUN_DIR`` (or the temp folder).
    """
    script = os.path.abspath(script)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"per-rank script not found: {script}")
    startup_limit = _seconds(startup_timeout or os.environ.get("PADDLE_OVERLAY_STARTUP_TIMEOUT") or 300,
                             "startup_timeout (PADDLE_OVERLAY_STARTUP_TIMEOUT)")
    clock = signal.getitimer(signal.ITIMER_REAL)[0]  # what pytest-timeout (signal method) has left, or 0
    if timeout is None:
        timeout = clock - min(REPORT_MARGIN, clock / 4) if clock else DEFAULT_TIMEOUT
    timeout = _seconds(timeout, "timeout")
    if os.environ.get(rank_signals.SLOW_START_ENV):  # read by every rank's hook: refused here, not there
        _seconds(os.environ[rank_signals.SLOW_START_ENV], rank_signals.SLOW_START_ENV)
    device, limit = resolve_device(None, nproc), os.environ.get("PADDLE_OVERLAY_TEST_NPROC")
    if limit and int(limit) < nproc:
        raise unittest.SkipTest(f"needs {nproc} ranks, PADDLE_OVERLAY_TEST_NPROC={limit}")
    if device == "gpu" and _gpus() < nproc:
        raise unittest.SkipTest(f"needs {nproc} GPUs, {_gpus()} visible to Paddle {sys.modules['paddle'].__version__}")
    rank_signals.install_pth()
    parent = os.environ.get("PADDLE_OVERLAY_RUN_DIR")
    os.makedirs(log_dir or parent or tempfile.gettempdir(), exist_ok=True)
    log_dir = os.path.abspath(log_dir or tempfile.mkdtemp(prefix=os.path.splitext(os.path.basename(script))[0] + "-", dir=parent))
    signal_dir = os.path.join(log_dir, "rank-signals")
    for name in os.listdir(signal_dir) if os.path.isdir(signal_dir) else ():  # of an earlier launch
        os.remove(os.path.join(signal_dir, name))
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc)]
    cmd += ["--devices", ",".join(map(str, range(nproc)))] if device == "gpu" else []
    cmd += shlex.split(os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", "")) + ["--log_dir", log_dir, script]
    full_env = {**os.environ, **(env or {}), "PADDLE_OVERLAY_TEST_DEVICE": device, rank_signals.DIR_ENV: signal_dir}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, full_env.get("PYTHONPATH")) if p)
    if "COVERAGE_PROCESS_CONFIG" in full_env:  # measured in the ranks only (rank_signals.COVERAGE_ENV)
        full_env[rank_signals.COVERAGE_ENV] = full_env.pop("COVERAGE_PROCESS_CONFIG")

    start, start_wall = time.monotonic(), time.time()
    if clock:
        signal.setitimer(signal.ITIMER_REAL, clock + startup_limit)  # the test's clock stands still
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
                    signal.setitimer(signal.ITIMER_REAL, clock)
            if now >= deadline:
                timed_out = "behaviour" if startup is not None else "startup"
                break
            time.sleep(0.5)
    finally:
        if clock and startup is None:
            signal.setitimer(signal.ITIMER_REAL, clock)
        kill_marked(rank_signals.DIR_ENV, signal_dir)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    seconds = time.monotonic() - start
    if startup is None and not timed_out and len(rank_signals.ready_ranks(signal_dir)) >= nproc:
        startup = _ready_seconds(signal_dir, start_wall)  # the ranks ended between two polls
    rank_logs = [_read(os.path.join(log_dir, f"workerlog.{r}")) for r in range(nproc)]
    records = collective_recorder.load(signal_dir)
    ok = not timed_out and proc.returncode == 0
    nnodes = cmd[cmd.index("--nnodes") + 1] if "--nnodes" in cmd[:-1] else "1"  # other nodes' ranks: not here
    problems = collective_recorder.schedule_problems(records, complete=ok and nnodes == "1")
    recorded = ["last collective of each rank (rank-signals/collectives-N.jsonl):",
                *collective_recorder.last_collectives(records, nproc)]
    recorded += [f"the collectives recorded do not form one schedule: {p}" for p in problems]
    if ok and not problems:
        return LaunchResult(seconds, log_dir, rank_logs, startup)
    if ok:
        raise CollectiveLaunchError("\n".join(
            [f"collective launch of {os.path.basename(script)}: every rank exited 0, {nproc} ranks, {seconds:.1f}s, "
             "but the ranks' collectives would deadlock or mismatch elsewhere (e.g. on NCCL)", *recorded,
             f"logs: {log_dir}"]))
    if timed_out == "startup":
        missing = sorted(set(range(nproc)) - set(rank_signals.ready_ranks(signal_dir)))
        why = f"start-up timeout after {startup_limit:.0f}s: rank(s) {missing} had not finished importing Paddle"
    elif timed_out:
        why = f"timeout after {timeout:.0f}s of behaviour (every rank ready after {startup:.1f}s of start-up)"
    else:
        why = f"launcher exit code {proc.returncode}"
    first = None if timed_out else rank_signals.first_failure(signal_dir)
    if first:
        why = f"rank {first[0]} failed first ({first[1]}); {why}"
    launcher = _read(os.path.join(log_dir, "launcher.log"))
    killed = killed_ranks(launcher)
    if killed:
        why += "; " + ", ".join(f"rank {r} killed by {name}" for r, name in killed)
    lines = [f"collective launch of {os.path.basename(script)} failed: {why}, {nproc} ranks, {seconds:.1f}s",
             *recorded, f"logs: {log_dir}"]
    for r in sorted(range(nproc), key=lambda r: (first is None or r != first[0], r)):  # the first failure first
        note = f" (failed first: {first[1]})" if first and r == first[0] else ""
        lines += [f"----- rank {r}{note}: last {TAIL_LINES} lines of workerlog.{r} -----", _tail(rank_logs[r])]
    # The launcher echoes a failed rank's log: keep its own lines, or its plain tail if it has none.
    own = "\n".join(line for line in launcher.splitlines() if line.startswith(("LAUNCH", "Container")))
    lines += ["----- launcher.log -----", _tail(own or launcher, 15 if own else 30)]
    raise CollectiveLaunchError("\n".join(lines))


def killed_ranks(launcher_log):
    """``[(rank, signal name)]`` of the ranks Paddle's launcher reports ended by a signal (``Container rank 2
    status failed cmd [...] code -11``): such a rank writes no exit record (no Python runs after SIGSEGV)."""
    killed = {}
    for m in re.finditer(r"Container rank (\d+) status failed .*? code -(\d+)", launcher_log):
        number = int(m.group(2))
        try:
            killed[int(m.group(1))] = signal.Signals(number).name
        except ValueError:  # not a signal number
            killed[int(m.group(1))] = f"signal {number}"
    return sorted(killed.items())


def _ready_seconds(signal_dir, since):
    """Seconds from ``since`` (wall time) until the last rank signalled readiness (its file's time)."""
    times = [since]
    for rank in rank_signals.ready_ranks(signal_dir):
        try:
            times.append(float(_read(os.path.join(signal_dir, f"rank-{rank}")).split()[1]))
        except (IndexError, ValueError):
            pass
    return max(times) - since


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _tail(text, lines=TAIL_LINES):
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"
