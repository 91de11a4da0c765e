# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/run_driver.py without Paddle: outcomes from pytest, and the timeout kills the tree."""

import os
import sys
import textwrap
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from run_driver import run_driver  # noqa: E402


def _driver(tmp_path, body):
    path = tmp_path / "test_fake_driver.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(tmp_path, body, timeout=60):
    return run_driver(_driver(tmp_path, body), timeout=timeout, env=dict(os.environ), out_dir=str(tmp_path / "out"))


def test_pass_skip_fail(tmp_path):
    res = _run(tmp_path, "def test_a(): pass\n")
    assert (res.outcome, res.summary()) == ("PASS", "1 passed")
    res = _run(tmp_path, "import pytest\ndef test_a(): pytest.skip('no GPU here')\n")
    assert res.outcome == "SKIP" and "no GPU here" in res.skip_reasons[0]
    res = _run(tmp_path, "def test_a(): assert 1 == 2\n")
    assert res.outcome == "FAIL" and res.counts["failures"] == 1
    res = _run(tmp_path, "X = 1\n")
    assert res.outcome == "FAIL" and "no test cases collected" in res.problems


def test_timeout_kills_process_tree(tmp_path):
    marker = f"fake-rank-{os.getpid()}-{time.time_ns()}"
    body = f"""
        import subprocess, sys, time
        def test_hangs():
            # a grandchild in its own session, like a Paddle rank
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"],
                             start_new_session=True)
            time.sleep(600)
    """
    start = time.monotonic()
    res = _run(tmp_path, body, timeout=5)
    assert time.monotonic() - start < 20
    assert res.outcome == "FAIL" and res.timed_out
    assert res.problems[0].startswith("timeout after 5s")
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert left == []


def test_rank_startup_extends_the_deadline(tmp_path):
    # The driver's "launch" reports 60 s of rank start-up at once, then runs 20 s: with a 10 s
    # timeout (room for Python and pytest to start on a loaded machine before the record is
    # written) it passes only because start-up is not charged to the driver.
    out = tmp_path / "out"
    body = f"""
        import json, os, time
        def test_launch():
            os.makedirs({str(out / "launch")!r}, exist_ok=True)
            with open({str(out / "launch" / "rank-startup.json")!r}, "w") as f:
                json.dump({{"startup_seconds": 60.0}}, f)
            time.sleep(20)
    """
    res = run_driver(_driver(tmp_path, body), timeout=10, env=dict(os.environ), out_dir=str(out))
    assert (res.outcome, res.timed_out) == ("PASS", False), res.problems


def test_startup_seconds_counts_launches_still_starting(tmp_path):
    from run_driver import startup_seconds

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "rank-startup.json").write_text('{"startup_seconds": 12.5}')
    (tmp_path / "b" / "rank-startup.json").write_text('{"started_at": 1000.0, "startup_seconds": null}')
    assert startup_seconds(str(tmp_path), now=1004.0) == 16.5
    assert startup_seconds(str(tmp_path / "missing")) == 0.0


def test_failure_reason_keeps_its_newlines_without_the_launch_error_prefix(tmp_path):
    body = """
        class CollectiveLaunchError(AssertionError):
            pass
        CollectiveLaunchError.__module__ = "collective_launch"
        def test_launch():
            raise CollectiveLaunchError("collective launch of a.py failed: rank 1 failed first\\nlogs: /x")
    """
    res = _run(tmp_path, body)
    assert res.outcome == "FAIL"
    assert res.problems == ["test_launch: collective launch of a.py failed: rank 1 failed first\nlogs: /x"]
