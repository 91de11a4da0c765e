# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Rank signals: each rank says when it is ready (Paddle imported) and how it exited (docs/harness.md).

:func:`install_pth` puts a ``.pth`` line in the venv that runs :func:`_start` in each rank of a launch: a
thread writes ``<dir>/rank-<id>`` once ``import paddle`` has finished, and at exit ``<dir>/exit-<id>.<pid>``
records the time and how the rank ended (``sys.exit(3)``, ``uncaught RuntimeError``, ``ended``). Once Paddle
is imported, a rank killed by a fatal signal (SIGSEGV) writes every thread's Python stack to its log
(:mod:`faulthandler`), and :mod:`collective_recorder` records each collective in
``<dir>/collectives-<id>.jsonl``. With
``$PADDLE_OVERLAY_SLOW_START`` set (``run_collective_tests.sh --slow-start``), each rank first sleeps that
many seconds, as a loaded machine delays Paddle's import.
"""

import atexit
import faulthandler
import importlib.util
import os
import re
import sys
import sysconfig
import threading
import time

DIR_ENV = "PADDLE_OVERLAY_RANK_SIGNAL_DIR"
# coverage's subprocess configuration (``COVERAGE_PROCESS_CONFIG``), renamed by launch_collective so
# that Paddle's launcher, which runs none of paddle_overlay, starts no coverage; ranks start it here
COVERAGE_ENV = "PADDLE_OVERLAY_RANK_COVERAGE"
RANK_ENV = "PADDLE_TRAINER_ID"
SLOW_START_ENV = "PADDLE_OVERLAY_SLOW_START"
_HOOK_RUN_NAME = "__paddle_overlay_rank_signals__"
_THREAD_NAME = "paddle_overlay_rank_signals"


def pth_text():
    """The ``.pth`` line: run this file as the hook when both variables are set."""
    return (f"import os; os.environ.get({DIR_ENV!r}) and os.environ.get({RANK_ENV!r}) is not None and "
            f"__import__('runpy').run_path({os.path.abspath(__file__)!r}, run_name={_HOOK_RUN_NAME!r})\n")


def install_pth():
    """Install the hook in this interpreter's site-packages (idempotent); returns its path."""
    path = os.path.join(sysconfig.get_paths()["purelib"], "paddle_overlay_rank_signals.pth")
    if not os.path.isfile(path) or open(path).read() != pth_text():
        with open(path, "w") as f:
            f.write(pth_text())
    return path


def _matches(folder, pattern):
    try:
        return [m for m in map(re.compile(pattern).fullmatch, os.listdir(folder)) if m]
    except OSError:
        return []


def ready_ranks(ready_dir):
    """Sorted ranks that have signalled readiness in ``ready_dir``."""
    return sorted(int(m.group(1)) for m in _matches(ready_dir, r"rank-(\d+)"))


def exit_order(signal_dir):
    """``[(wall time, rank, how)]`` of the ranks that exited through Python, earliest first (a rank's last
    record counts when its children recorded too)."""
    last = {}
    for m in _matches(signal_dir, r"exit-(\d+)\.\d+"):
        try:
            with open(os.path.join(signal_dir, m.group())) as f:
                stamp, how = f.read().strip().split(" ", 1)
            record = (float(stamp), int(m.group(1)), how)
        except (OSError, ValueError):
            continue
        last[record[1]] = max(last.get(record[1], record), record)
    return sorted(last.values())


def first_failure(signal_dir):
    """``(rank, how)`` of the earliest rank that exited abnormally by its own record, or None."""
    return next(((rank, how) for _, rank, how in exit_order(signal_dir)
                 if how not in ("ended", "sys.exit(0)", "sys.exit(None)")), None)


def _signal_when_paddle_imported(ready_dir, rank):
    while "paddle" not in sys.modules or getattr(sys.modules["paddle"].__spec__, "_initializing", False):
        time.sleep(0.1)
    # Paddle's import installs its own fatal-signal handler (a C++ trace, mostly "No stack trace in paddle");
    # installed after it, faulthandler first writes every thread's Python stack to the rank's log, then
    # hands the signal on to Paddle's handler.
    faulthandler.enable(all_threads=True)
    try:  # a rank's child that imports Paddle too finds the file there
        fd = os.open(os.path.join(ready_dir, f"rank-{rank}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {time.time():.3f}\n")


def _recorder():
    """collective_recorder, beside this file (the hook runs before any folder of the launcher's is on sys.path)."""
    if "collective_recorder" not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collective_recorder.py")
        spec = importlib.util.spec_from_file_location("collective_recorder", path)
        module = sys.modules["collective_recorder"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["collective_recorder"]


def _start():
    # site may process a venv's site-packages twice (Python 3.11 with a lib64 link): hook once.
    if any(t.name == _THREAD_NAME for t in threading.enumerate()):
        return
    signal_dir, rank = os.environ[DIR_ENV], os.environ[RANK_ENV]
    os.makedirs(signal_dir, exist_ok=True)
    state = {"how": "ended"}
    original_exit, original_hook = sys.exit, sys.excepthook

    def exit_(code=None):
        state["how"] = f"sys.exit({code!r})"
        original_exit(code)

    def excepthook(kind, value, tb):
        state["how"] = f"uncaught {kind.__name__}"
        original_hook(kind, value, tb)

    def write():
        with open(os.path.join(signal_dir, f"exit-{rank}.{os.getpid()}"), "w") as f:
            f.write(f"{time.time():.6f} {state['how']}\n")

    sys.exit, sys.excepthook = exit_, excepthook
    atexit.register(write)
    _recorder().install_after_import(signal_dir, rank)
    threading.Thread(target=_signal_when_paddle_imported, args=(signal_dir, rank), name=_THREAD_NAME,
                     daemon=True).start()


if __name__ == _HOOK_RUN_NAME:
    time.sleep(float(os.environ.get(SLOW_START_ENV) or 0))
    if os.environ.get(COVERAGE_ENV):
        os.environ["COVERAGE_PROCESS_CONFIG"] = os.environ.pop(COVERAGE_ENV)
        __import__("coverage").process_startup()
    _start()
