# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/collective without Paddle: the per-rank hooks (readiness once ``paddle`` is imported, exit
records), the legacy_test stand-in's choices, and how the launcher reads and ends a launch's processes."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(ROOT, "tools", "collective")
import rank_signals  # noqa: E402
from legacy_test import test_parallel_dygraph_dataparallel as stand_in  # noqa: E402


def run_rank(tmp_path, rank, body, **env):
    """Run ``body`` as a fake rank: the hook installed as the .pth would, a fake ``paddle``."""
    fake = tmp_path / "fake_site"
    (fake / "paddle").mkdir(parents=True, exist_ok=True)
    (fake / "paddle" / "__init__.py").write_text("import time\ntime.sleep(0.3)\n__version__ = 'fake'\n")
    code = textwrap.dedent(f"""
        import runpy, sys
        runpy.run_path({os.path.join(HARNESS, 'rank_signals.py')!r}, run_name={rank_signals._HOOK_RUN_NAME!r})
        runpy.run_path({os.path.join(HARNESS, 'rank_signals.py')!r}, run_name={rank_signals._HOOK_RUN_NAME!r})
    """) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=str(fake), PADDLE_TRAINER_ID=str(rank),
               PADDLE_OVERLAY_RANK_SIGNAL_DIR=str(tmp_path / "signals"), **env)
    return subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_ready_after_paddle_import_and_exit_records(tmp_path):
    wait_ready = textwrap.dedent("""
        import os, time
        assert "rank-{rank}" not in os.listdir(os.environ["PADDLE_OVERLAY_RANK_SIGNAL_DIR"])  # not before import
        import paddle
        while "rank-{rank}" not in os.listdir(os.environ["PADDLE_OVERLAY_RANK_SIGNAL_DIR"]):
            time.sleep(0.05)
    """)
    first = run_rank(tmp_path, 1, wait_ready.format(rank=1) + "sys.exit(3)\n")
    assert first.returncode == 3, first.stderr
    second = run_rank(tmp_path, 0, wait_ready.format(rank=0) + "raise RuntimeError('peer gone')\n")
    assert second.returncode == 1 and "peer gone" in second.stderr
    third = run_rank(tmp_path, 2, "pass\n")  # never imports paddle: ends, never ready
    assert third.returncode == 0, third.stderr
    signals = str(tmp_path / "signals")
    assert rank_signals.ready_ranks(signals) == [0, 1]
    order = [(rank, how) for _, rank, how in rank_signals.exit_order(signals)]
    assert order == [(1, "sys.exit(3)"), (0, "uncaught RuntimeError"), (2, "ended")]
    assert rank_signals.first_failure(signals) == (1, "sys.exit(3)")


def test_a_rank_killed_by_sigsegv_leaves_its_python_stack(tmp_path):
    """A segfault after Paddle's import (whose own handler prints only a C++ trace) names the Python frames
    of every thread in the rank's log."""
    crash = textwrap.dedent("""
        import ctypes, os, time
        import paddle
        while "rank-0" not in os.listdir(os.environ["PADDLE_OVERLAY_RANK_SIGNAL_DIR"]):
            time.sleep(0.05)
        def crashing_collective():
            ctypes.string_at(0)
        crashing_collective()
    """)
    done = run_rank(tmp_path, 0, crash)
    assert done.returncode == -11, (done.returncode, done.stderr)
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert "in crashing_collective" in done.stderr, done.stderr


def test_slow_start_delays_the_rank_before_it_imports_paddle(tmp_path):
    started = time.time()
    done = run_rank(tmp_path, 0, "import paddle, time\ntime.sleep(0.5)\n", **{rank_signals.SLOW_START_ENV: "2"})
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "signals" / "rank-0") as f:
        ready_at = float(f.read().split()[1])
    assert ready_at - started >= 2.0  # the sleep came before the import: a lower bound, not a timing


def test_pth_line_is_inert_without_the_variables():
    text = rank_signals.pth_text()
    assert text.startswith("import os; os.environ.get('PADDLE_OVERLAY_RANK_SIGNAL_DIR') and ")
    assert text.count("\n") == 1
    exec(text, {})  # neither variable set here: runs nothing


@pytest.mark.parametrize(
    "need_envs, outer, expected",
    [
        ({"CASES": "a"}, {}, {"CASES": "a", "PADDLE_OVERLAY": "1"}),
        ({"PADDLE_OVERLAY_MODE": "patched"}, {}, {"PADDLE_OVERLAY_MODE": "patched"}),
        ({}, {"PADDLE_OVERLAY_MODE": "patched"}, {}),
        ({"PADDLE_OVERLAY": "0"}, {}, {"PADDLE_OVERLAY": "0"}),
    ],
)
def test_stand_in_rank_env(monkeypatch, need_envs, outer, expected):
    monkeypatch.delenv("PADDLE_OVERLAY", raising=False)
    monkeypatch.delenv("PADDLE_OVERLAY_MODE", raising=False)
    for k, v in outer.items():
        monkeypatch.setenv(k, v)
    env = stand_in.rank_env("auto_growth", need_envs)
    assert env == {"FLAGS_allocator_strategy": "auto_growth", **expected}


def test_stand_in_signature_matches_upstream():
    import inspect

    sig = inspect.signature(stand_in.TestMultipleGpus.run_mnist_2gpu)
    assert list(sig.parameters) == ["self", "target_file_name", "allocator_strategy", "need_envs"]
    assert sig.parameters["allocator_strategy"].default == "auto_growth"


def test_stand_in_resolves_script_next_to_the_driver(tmp_path, monkeypatch):
    driver = tmp_path / "test_fake_driver.py"
    driver.write_text("")
    (tmp_path / "per_rank.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("test_fake_driver")
    case = type("TestFake", (stand_in.TestMultipleGpus,), {"__module__": module.__name__})()
    monkeypatch.chdir(ROOT)
    assert stand_in.script_path(case, "per_rank.py") == str(tmp_path / "per_rank.py")
    assert stand_in.script_path(case, "elsewhere.py") == os.path.join(ROOT, "elsewhere.py")


def test_ranks_the_launcher_reports_killed_by_a_signal_are_named():
    import collective_launch

    log = ("LAUNCH ERROR 2026-12-02 01:09:54,751 Container failed !!!\n"
           "Container rank 2 status failed cmd ['python', '-u', 'x.py'] code -11 log /logs/workerlog.2\n"
           "Container rank 3 status failed cmd ['python', '-u', 'x.py'] code -99 log /logs/workerlog.3\n"
           "Container rank 1 status failed cmd ['python', '-u', 'x.py'] code 1 log /logs/workerlog.1\n")
    assert collective_launch.killed_ranks(log) == [(2, "SIGSEGV"), (3, "signal 99")]
    assert collective_launch.killed_ranks("LAUNCH INFO Pod failed\n") == []


def test_kill_marked_ends_a_process_started_while_the_others_end(tmp_path):
    """A marked process that starts another when SIGTERM reaches it, as Paddle's launcher does when the
    signal comes while it forks a rank: the late one is in no earlier scan, and is ended too."""
    import collective_launch
    import psutil

    name, marker, late = "KILL_MARKED_TEST", f"{os.getpid()}-{time.monotonic_ns()}", tmp_path / "late.pid"
    forks_on_sigterm = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        def fork_then_exit(*_):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            open({str(late)!r}, "w").write(str(child.pid))
            sys.exit(0)
        signal.signal(signal.SIGTERM, fork_then_exit)
        print("ready", flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", forks_on_sigterm], env={**os.environ, name: marker},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "ready\n"
        assert [p.pid for p in collective_launch.marked(name, marker)] == [parent.pid]
        assert collective_launch.kill_marked(name, marker, grace=10) == []
        child = int(late.read_text())  # the late process was started, after the first scan
        try:
            assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE, f"{child} still runs"
        except psutil.NoSuchProcess:
            pass
    finally:
        for p in collective_launch.marked(name, marker):
            p.kill()
        parent.kill()
        parent.wait()
