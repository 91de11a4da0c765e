# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Launch a per-rank script under ``python -m paddle.distributed.launch`` from a driver test.

The project's launcher wrapper (test harness, never shipped upstream). Drivers reach it through
the stand-in ``legacy_test.test_parallel_dygraph_dataparallel`` (upstream's form) or directly
(:func:`launch_collective`, :class:`CollectiveTestCase`). The launcher runs in its own session;
on a timeout or a failing rank its whole process tree is killed (SIGTERM, then SIGKILL after a
grace period), so no rank is left holding a port or a core, and the test fails with
:class:`CollectiveLaunchError`, whose message carries every rank's log tail.

Two clocks, so that no verdict depends on how fast a loaded machine starts Python and Paddle:
*start-up* runs until every local rank has imported Paddle (signalled through
:mod:`rank_signals`), under a generous limit; the launch's *timeout* counts the behaviour after
that. Start-up seconds are written to ``<log_dir>/rank-startup.json`` (the runner extends its
own driver deadline by them) and excluded from the ``TEST_TIMEOUT`` budget.

Environment read here (set by ``tools/collective_runner.py``, or by hand):

* ``PADDLE_OVERLAY_TEST_DEVICE``  ``cpu`` | ``gpu`` | ``auto`` (default ``auto``).
* ``PADDLE_OVERLAY_TEST_NPROC``   ranks the machine may use; a launch needing more is skipped.
* ``PADDLE_OVERLAY_LAUNCH_ARGS``  extra launcher arguments, e.g. ``--master 10.0.0.1:8090 --nnodes 2 --rank 0``.
* ``PADDLE_OVERLAY_RUN_DIR``      keep each launch's logs under this folder.
* ``PADDLE_OVERLAY_LAUNCH_LOCK``  a file path: launches holding it take turns (see :func:`_launch_lock`).
* ``PADDLE_OVERLAY_STARTUP_TIMEOUT`` seconds every rank may take to start and import Paddle
  (default 300).
* ``TEST_TIMEOUT``                (set by upstream ``bash_test_modules``, seconds) the behaviour
  time of all launches of one driver (rank start-up excluded) stays inside this budget.

Everything else in the environment, including ``PADDLE_OVERLAY_*`` and ``COVERAGE_*``,
reaches the ranks unchanged.
"""

import contextlib
import fcntl
import json
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
import rank_signals

_TAIL_LINES = 60
_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.5
_DRIVER_START = time.monotonic()
_DEFAULT_STARTUP_TIMEOUT = 300.0  # seconds for every rank to start and import Paddle
_startup_seconds_total = 0.0  # rank start-up of this process's launches, outside the TEST_TIMEOUT budget
# Launcher trees currently running in this process, killed by the SIGTERM handler.
_LIVE_TREES = {}


class CollectiveLaunchError(AssertionError):
    """A collective launch timed out or a rank exited non-zero; the message holds the rank log tails."""


class LaunchResult:
    """Outcome of a successful launch.

    Attributes: ``returncode`` (int, 0), ``seconds`` (float, wall time), ``log_dir`` (str),
    ``rank_logs`` (list of str, full text of ``workerlog.N`` for N = 0..nproc-1),
    ``startup_seconds`` (float, until every rank had imported Paddle; None if they finished
    before signalling).
    """

    def __init__(self, returncode, seconds, log_dir, rank_logs, startup_seconds=None):
        self.returncode = returncode
        self.seconds = seconds
        self.log_dir = log_dir
        self.rank_logs = rank_logs
        self.startup_seconds = startup_seconds

    def __repr__(self):
        return (f"LaunchResult(returncode={self.returncode}, seconds={self.seconds:.1f}, "
                f"startup_seconds={self.startup_seconds}, log_dir={self.log_dir!r})")


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
    """Behaviour seconds left of an outer ``TEST_TIMEOUT`` (minus a margin), or None.

    Rank start-up of earlier launches is not charged to the budget.
    """
    outer = os.environ.get("TEST_TIMEOUT")
    if not outer:
        return None
    # Keep 30 s to kill the tree and report before the outer limit.
    return float(outer) - 30.0 - (time.monotonic() - _DRIVER_START - _startup_seconds_total)


def _positive_seconds(value, name):
    """``value`` as float seconds; raises ValueError naming ``name`` unless it is > 0."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def _startup_limit(startup_timeout):
    if startup_timeout is not None:
        return _positive_seconds(startup_timeout, "startup_timeout")
    raw = os.environ.get("PADDLE_OVERLAY_STARTUP_TIMEOUT")
    return _positive_seconds(raw, "PADDLE_OVERLAY_STARTUP_TIMEOUT") if raw else _DEFAULT_STARTUP_TIMEOUT


def _ensure_ready_hook():
    """Install the readiness ``.pth`` into this interpreter's venv; RuntimeError says what to do if it cannot."""
    try:
        rank_signals.install_pth()
    except OSError as e:
        raise RuntimeError(
            f"cannot install the rank readiness hook ({e}); run the tests with a venv's python "
            "(tools/run_collective_tests.sh makes one) or run `python tools/collective/rank_signals.py install-pth` "
            "with write access to site-packages"
        ) from None


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


@contextlib.contextmanager
def _launch_lock():
    """Hold ``$PADDLE_OVERLAY_LAUNCH_LOCK`` (a file path; unset: no lock) for one launch.

    For runs that share a machine with other launches and want them to take turns (one
    launch at a time never competes for ports or cores). ``tools/run_tests.sh`` does not set
    it: its two suites use disjoint ``PORT_RANGE``s instead (the lock made ``.ci/run`` take
    484 s instead of 326-341 s). Waiting here is before any rank starts, so neither clock
    counts it.
    """
    path = os.environ.get("PADDLE_OVERLAY_LAUNCH_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def launch_collective(script, *, nproc=2, timeout=300, env=None, args=(), log_dir=None, device=None,
                      startup_timeout=None):
    """Run ``script`` on ``nproc`` ranks with ``python -m paddle.distributed.launch``.

    With ``$PADDLE_OVERLAY_LAUNCH_LOCK`` set, one launch at a time on the machine
    (:func:`_launch_lock`).

    ``script``: path of the per-rank script (run from its own folder). ``timeout``: seconds of
    behaviour, counted from the moment every local rank has imported Paddle (capped by the
    ``TEST_TIMEOUT`` budget when set). ``startup_timeout``: seconds every rank may take to get
    there (default ``$PADDLE_OVERLAY_STARTUP_TIMEOUT`` or 300). ``env``: extra environment
    entries. ``args``: arguments after the script. ``log_dir``: where the launcher writes
    ``workerlog.N`` (default: a fresh folder under ``$PADDLE_OVERLAY_RUN_DIR`` or the temp dir).
    ``device``: ``cpu`` | ``gpu`` | ``auto`` (default: ``$PADDLE_OVERLAY_TEST_DEVICE`` or auto).

    Returns a :class:`LaunchResult` when every rank exits 0.
    Raises :class:`unittest.SkipTest` when the ranks or GPUs are not available,
    :class:`CollectiveLaunchError` on a start-up or behaviour timeout or a non-zero rank (after
    the launcher's whole process tree was killed), ``FileNotFoundError`` if the script does not
    exist, ``ValueError`` for a timeout that is not a positive number, ``RuntimeError`` when the
    readiness hook cannot be installed.
    """
    with _launch_lock():
        return _launch_collective(script, nproc=nproc, timeout=timeout, env=env, args=args,
                                  log_dir=log_dir, device=device, startup_timeout=startup_timeout)


def _launch_collective(script, *, nproc, timeout, env, args, log_dir, device, startup_timeout):
    global _startup_seconds_total
    script = os.path.abspath(script)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"per-rank script not found: {script}")
    timeout = _positive_seconds(timeout, "timeout")
    startup_limit = _startup_limit(startup_timeout)
    device = resolve_device(device, nproc)
    reason = skip_reason(nproc, device)
    if reason:
        raise unittest.SkipTest(reason)
    budget = _deadline_budget()
    if budget is not None and budget < timeout:
        timeout = max(budget, 1.0)

    _ensure_ready_hook()
    log_dir = _log_dir_for(script, log_dir)
    ready_dir = os.path.join(log_dir, "rank-signals")
    if os.path.isdir(ready_dir):
        for name in os.listdir(ready_dir):
            os.remove(os.path.join(ready_dir, name))
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc)]
    if device == "gpu":
        cmd += ["--devices", ",".join(str(i) for i in range(nproc))]
    cmd += shlex.split(os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", ""))
    cmd += ["--log_dir", log_dir, script, *map(str, args)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PADDLE_OVERLAY_TEST_DEVICE"] = device
    full_env[rank_signals.DIR_ENV] = ready_dir

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
    startup_record = os.path.join(log_dir, "rank-startup.json")
    _write_json(startup_record, {"started_at": time.time(), "startup_seconds": None})
    try:
        timed_out, startup_seconds = _wait(proc, timeout, startup_limit, ready_dir, nproc, tracked, startup_record)
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
    charged = startup_seconds if startup_seconds is not None else (startup_limit if timed_out == "startup" else 0.0)
    _startup_seconds_total += charged
    _write_json(startup_record, {"startup_seconds": round(charged, 3), "ready_ranks": rank_signals.ready_ranks(ready_dir)})

    rank_logs = [_read(os.path.join(log_dir, f"workerlog.{r}")) for r in range(nproc)]
    if not timed_out and proc.returncode == 0:
        return LaunchResult(0, seconds, log_dir, rank_logs, startup_seconds)
    clocks = dict(timeout=timeout, startup_limit=startup_limit, startup_seconds=startup_seconds,
                  ready=rank_signals.ready_ranks(ready_dir), exits=rank_signals.exit_order(ready_dir))
    raise CollectiveLaunchError(
        _failure_message(script, nproc, clocks, timed_out, proc.returncode, seconds, log_dir, rank_logs)
    )


def _write_json(path, record):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)  # readers (tools/run_driver.py) never see half a file


def _wait(proc, timeout, startup_limit, ready_dir, nproc, tracked, startup_record):
    """Poll ``proc`` until it exits or a limit passes, recording its descendants.

    Start-up: up to ``startup_limit`` seconds until ``nproc`` ranks signalled in ``ready_dir``;
    then ``timeout`` seconds of behaviour. Returns ``(timed_out, startup_seconds)``:
    ``timed_out`` is False, ``"startup"`` or ``"behaviour"``; ``startup_seconds`` is None when
    the ranks never all signalled, and is written to ``startup_record`` as soon as known.
    ``tracked`` (pid -> psutil.Process) is filled in place and also published in ``_LIVE_TREES``
    for the SIGTERM handler.
    """
    start = time.monotonic()
    deadline = start + startup_limit
    startup_seconds = None
    while True:
        for p in tree_of(proc.pid):
            tracked.setdefault(p.pid, p)
        _LIVE_TREES[proc.pid] = list(tracked.values())
        now = time.monotonic()
        if startup_seconds is None and len(rank_signals.ready_ranks(ready_dir)) >= nproc:
            startup_seconds = now - start
            deadline = now + timeout
            _write_json(startup_record, {"startup_seconds": round(startup_seconds, 3)})
        if proc.poll() is not None:
            return False, startup_seconds
        if now >= deadline:
            return ("startup" if startup_seconds is None else "behaviour"), startup_seconds
        time.sleep(_POLL_SECONDS)


def _first_failure(exits):
    """``(rank, how)`` of the earliest rank that exited abnormally per its own record, or None."""
    for _, rank, how in exits:
        if how not in ("ended", "sys.exit(0)", "sys.exit(None)"):
            return rank, how
    return None


def _failure_reason(nproc, clocks, timed_out, returncode, launcher_blame, first):
    if timed_out == "startup":
        missing = sorted(set(range(nproc)) - set(clocks["ready"])) or "?"
        return (f"start-up timeout after {clocks['startup_limit']:.0f}s: rank(s) {missing} had not finished "
                f"importing Paddle (ready: {clocks['ready']})")
    if timed_out:
        return (f"timeout after {clocks['timeout']:.0f}s of behaviour "
                f"(every rank ready after {clocks['startup_seconds']:.1f}s of start-up)")
    blame = (f"launcher reports rank {launcher_blame[0]} exit code {launcher_blame[1]}" if launcher_blame
             else f"launcher exit code {returncode}")
    if first:
        return f"rank {first[0]} failed first ({first[1]}); {blame}"
    return blame


def _failure_message(script, nproc, clocks, timed_out, returncode, seconds, log_dir, rank_logs):
    launcher_text = _read(os.path.join(log_dir, "launcher.log"))
    launcher_blame = None if timed_out else _failed_rank(launcher_text)
    first = None if timed_out else _first_failure(clocks["exits"])
    reason = _failure_reason(nproc, clocks, timed_out, returncode, launcher_blame, first)
    lines = [
        f"collective launch of {os.path.basename(script)} failed: {reason}, {nproc} ranks, {seconds:.1f}s",
        f"logs: {log_dir}",
    ]
    notes = {}
    if launcher_blame:
        notes[launcher_blame[0]] = f" (launcher: exit code {launcher_blame[1]})"
    if first:
        notes[first[0]] = f" (failed first: {first[1]})"
    # Blamed ranks first: the one that failed first, then the one the launcher names.
    order = sorted(range(nproc), key=lambda r: (first is None or r != first[0],
                                                launcher_blame is None or r != launcher_blame[0], r))
    for r in order:
        lines.append(f"----- rank {r}{notes.get(r, '')}: last {_TAIL_LINES} lines of workerlog.{r} -----")
        lines.append(_tail(rank_logs[r]) or "(empty)")
    # The launcher echoes the failed rank's log; keep only its own lines. A launcher that died
    # before any (e.g. a traceback at `import paddle`) shows its plain tail instead.
    own = "\n".join(l for l in launcher_text.splitlines() if l.startswith(("LAUNCH", "Container")))
    if own:
        lines.append("----- launcher: last 15 LAUNCH lines of launcher.log -----")
        lines.append(_tail(own, 15))
    else:
        lines.append("----- launcher: last 30 lines of launcher.log (no LAUNCH line) -----")
        lines.append(_tail(launcher_text, 30) or "(empty)")
    return "\n".join(lines)


class CollectiveTestCase(unittest.TestCase):
    """unittest base for drivers: ``self.run_collective(script)`` launches, skips or fails."""

    def run_collective(self, script, *, nproc=2, timeout=None, env=None, args=()):
        """Launch ``script`` (relative to the driver's folder, or absolute) on ``nproc`` ranks.

        ``timeout``: seconds of behaviour after rank start-up (default 300). Skips the test with
        its reason when the ranks or GPUs are not available; raises
        :class:`CollectiveLaunchError` on failure. Returns the :class:`LaunchResult`.
        """
        if not os.path.isabs(script):
            driver = getattr(sys.modules.get(type(self).__module__), "__file__", None) or os.getcwd()
            script = os.path.join(os.path.dirname(os.path.abspath(driver)), script)
        try:
            return launch_collective(script, nproc=nproc, timeout=timeout or 300, env=env, args=args)
        except unittest.SkipTest as e:
            self.skipTest(str(e))
