# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Run one collective driver test (``python -m pytest -q -rs DRIVER``) with a hard timeout.

The driver runs in its own session with its output in ``<out_dir>/pytest.log`` and a JUnit
file ``<out_dir>/pytest-junit.xml``. On timeout its whole process tree (driver, Paddle
launcher, ranks; collected with psutil before killing) gets SIGTERM, then SIGKILL.
The outcome is PASS (no failure, at least one case passed), SKIP (every case skipped) or
FAIL (anything else, including a timeout, a crash or no cases collected).

The timeout counts the driver's own time minus the start-up of its ranks: every launch of
``collective_launch`` writes ``rank-startup.json`` under ``out_dir`` (seconds until every rank
had imported Paddle), and the deadline moves out by their sum, up to ``max_startup_extension``
seconds, so a slow machine never turns into a timeout verdict.
"""

import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS_DIR = os.path.join(ROOT, "tools", "collective")
sys.path.insert(0, HARNESS_DIR)
from collective_launch import kill_process_tree, tree_of  # noqa: E402

_POLL_SECONDS = 0.5
# pytest's message for a failed launch starts "collective_launch.CollectiveLaunchError: collective launch of ...".
_LAUNCH_ERROR_PREFIX = re.compile(r"^(?:\w+\.)*CollectiveLaunchError: ")
MAX_STARTUP_EXTENSION = 1800.0  # seconds: the most rank start-up that may extend a driver's deadline


def startup_seconds(out_dir, now=None):
    """Seconds of rank start-up recorded under ``out_dir`` by ``collective_launch``: the sum over
    every ``rank-startup.json`` of its ``startup_seconds``, or, for a launch still starting,
    ``now - started_at`` (wall-clock seconds; ``now`` defaults to ``time.time()``). 0.0 if none."""
    import json

    now = time.time() if now is None else now
    total = 0.0
    for folder, _, files in os.walk(out_dir):
        if "rank-startup.json" in files:
            try:
                with open(os.path.join(folder, "rank-startup.json")) as f:
                    record = json.load(f)
                done = record.get("startup_seconds")
                total += float(done) if done is not None else max(0.0, now - float(record["started_at"]))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
    return total


@dataclass
class DriverResult:
    """``outcome`` PASS/FAIL/SKIP; ``seconds`` wall time; ``counts`` from JUnit (tests, failures,
    errors, skipped); ``skip_reasons`` and ``problems`` (str lists); ``log_path`` pytest output."""

    outcome: str
    seconds: float
    returncode: int
    timed_out: bool
    log_path: str
    counts: dict = field(default_factory=dict)
    skip_reasons: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    def summary(self):
        """Short text such as ``2 passed, 1 skipped``."""
        c = self.counts
        if not c:
            return ""
        passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
        parts = [f"{passed} passed"]
        parts += [f"{c[k]} {k}" for k in ("failures", "errors", "skipped") if c[k]]
        return ", ".join(parts)


def _read_junit(path):
    """(counts, skip reasons, failure messages) from pytest's JUnit XML; raises OSError/ParseError."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    skips, problems = [], []
    for case in root.iter("testcase"):
        label = case.get("name", "?")
        for s in case.findall("skipped"):
            skips.append(f"{label}: {s.get('message', '')}")
        for f in case.findall("failure") + case.findall("error"):
            message = _LAUNCH_ERROR_PREFIX.sub("", (f.get("message") or f.tag).strip())
            problems.append(f"{label}: {message}")
    return counts, skips, problems


def run_driver(driver, *, timeout, env, out_dir, python=sys.executable, heartbeat=None, heartbeat_every=60.0,
               max_startup_extension=MAX_STARTUP_EXTENSION):
    """Run ``driver`` (path of a ``test_*.py``) under pytest; return a :class:`DriverResult`.

    ``timeout``: seconds for the driver, not counting its ranks' start-up (at most
    ``max_startup_extension`` seconds of it). ``env``: full environment for it. ``out_dir``:
    created if needed. ``heartbeat(elapsed_seconds)`` is called every ``heartbeat_every``
    seconds while it runs. Never raises for a failing driver; raises OSError if the
    interpreter cannot be started.
    """
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "pytest.log")
    junit = os.path.join(out_dir, "pytest-junit.xml")
    if os.path.exists(junit):
        os.remove(junit)
    cmd = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junit-xml={junit}", driver]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=os.path.dirname(driver), env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    tracked, timed_out, next_beat = {}, False, heartbeat_every
    extension, next_scan = 0.0, 0.0
    try:
        while proc.poll() is None:
            for p in tree_of(proc.pid):
                tracked.setdefault(p.pid, p)
            elapsed = time.monotonic() - start
            if elapsed >= next_scan or elapsed >= timeout + extension:  # rescan before any verdict
                extension = min(startup_seconds(out_dir), max_startup_extension)
                next_scan = elapsed + 5.0
            if elapsed >= timeout + extension:
                timed_out = True
                break
            if heartbeat and elapsed >= next_beat:
                heartbeat(elapsed)
                next_beat += heartbeat_every
            time.sleep(_POLL_SECONDS)
    finally:
        # On success this only reaps leftovers; on timeout or Ctrl-C it kills the whole tree.
        for p in tree_of(proc.pid):
            tracked.setdefault(p.pid, p)
        kill_process_tree(list(tracked.values()))
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    seconds = time.monotonic() - start

    result = DriverResult("FAIL", seconds, proc.returncode, timed_out, log_path)
    try:
        result.counts, result.skip_reasons, result.problems = _read_junit(junit)
    except (OSError, ET.ParseError):
        result.problems.append("pytest wrote no JUnit report (crashed or killed)")
    if timed_out:
        result.problems.insert(0, f"timeout after {timeout:.0f}s (+{extension:.0f}s of rank start-up): "
                                  "driver process tree killed")
    elif proc.returncode == 5:
        result.problems.insert(0, "no test cases collected")
    elif proc.returncode == 0 and result.counts:
        c = result.counts
        result.outcome = "SKIP" if c["tests"] and c["skipped"] == c["tests"] else "PASS"
    elif proc.returncode != 0 and not result.problems:
        result.problems.append(f"pytest exit code {proc.returncode}")
    return result


def log_tail(path, lines=80):
    """Last ``lines`` lines of a text file ('' if missing)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
