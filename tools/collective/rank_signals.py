# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Rank signals: each rank says when it is ready (Paddle imported) and how it exited.

``paddle_overlay_rank_signals.pth`` (put in the venv by :func:`install_pth`, which
:func:`collective_launch.launch_collective` calls) runs this file at interpreter start-up. In a
process with ``PADDLE_OVERLAY_RANK_SIGNAL_DIR`` and ``PADDLE_TRAINER_ID`` set (a rank started by
Paddle's launcher) it starts a daemon thread that writes ``<dir>/rank-<id>`` once ``import paddle``
has finished (the script under test runs unchanged), and at exit records ``<dir>/exit-<id>.<pid>``:
the time and how the rank ended (``sys.exit(3)``, ``uncaught RuntimeError``, ``ended``; a rank
killed by a signal leaves none). Paddle's launcher blames whichever failed rank it polls first,
often the peer that failed *because* another died; :func:`first_failure` tells who went first.
Elsewhere the ``.pth`` line costs two ``os.environ`` lookups.
"""

import atexit
import os
import re
import sys
import sysconfig
import threading
import time

DIR_ENV = "PADDLE_OVERLAY_RANK_SIGNAL_DIR"
RANK_ENV = "PADDLE_TRAINER_ID"
PTH_NAME = "paddle_overlay_rank_signals.pth"
_POLL_SECONDS = 0.1
_HOOK_RUN_NAME = "__paddle_overlay_rank_signals__"
_THREAD_NAME = "paddle_overlay_rank_signals"


def pth_text():
    """The ``.pth`` line: run this file as the hook when both variables are set."""
    here = os.path.abspath(__file__)
    return (
        f"import os; os.environ.get({DIR_ENV!r}) and os.environ.get({RANK_ENV!r}) is not None and "
        f"__import__('runpy').run_path({here!r}, run_name={_HOOK_RUN_NAME!r})\n"
    )


def install_pth():
    """Install the hook into this interpreter's site-packages (idempotent; a venv's, so that
    every rank of it runs the hook). Returns its path; raises OSError if it is not writable."""
    path = os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)
    if not os.path.isfile(path) or open(path).read() != pth_text():
        with open(path, "w") as f:
            f.write(pth_text())
    return path


def ready_ranks(ready_dir):
    """Sorted global ranks (ints) that have signalled readiness in ``ready_dir``."""
    try:
        names = os.listdir(ready_dir)
    except OSError:
        return []
    return sorted(int(n[5:]) for n in names if n.startswith("rank-") and n[5:].isdigit())


def exit_order(signal_dir):
    """``[(wall time, rank, how)]`` of the ranks that exited through Python, earliest first.

    ``how`` is ``"sys.exit(CODE)"``, ``"uncaught EXCEPTION"`` or ``"ended"``. When a rank's
    children also recorded, the rank's last record counts.
    """
    last = {}
    try:
        names = os.listdir(signal_dir)
    except OSError:
        return []
    for name in names:
        m = re.match(r"exit-(\d+)\.\d+$", name)
        if not m:
            continue
        try:
            with open(os.path.join(signal_dir, name)) as f:
                stamp, how = f.read().strip().split(" ", 1)
        except (OSError, ValueError):
            continue
        rank = int(m.group(1))
        if rank not in last or float(stamp) > last[rank][0]:
            last[rank] = (float(stamp), rank, how)
    return sorted(last.values())


def first_failure(signal_dir):
    """``(rank, how)`` of the earliest rank that exited abnormally by its own record, or None."""
    for _, rank, how in exit_order(signal_dir):
        if how not in ("ended", "sys.exit(0)", "sys.exit(None)"):
            return rank, how
    return None


def _paddle_imported():
    module = sys.modules.get("paddle")
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def _signal_when_paddle_imported(ready_dir, rank):
    while not _paddle_imported():
        time.sleep(_POLL_SECONDS)
    # The launcher only looks at the name; a rank's child that imports Paddle too finds it there.
    try:
        fd = os.open(os.path.join(ready_dir, f"rank-{rank}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {time.time():.3f}\n")


def _record_exit(signal_dir, rank):
    """Wrap ``sys.exit`` and ``sys.excepthook`` to learn how the rank ends; write it at exit."""
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


def _start():
    # site may process a venv's site-packages twice (Python 3.11 with a lib64 link): hook once.
    if any(t.name == _THREAD_NAME for t in threading.enumerate()):
        return
    signal_dir, rank = os.environ[DIR_ENV], os.environ[RANK_ENV]
    os.makedirs(signal_dir, exist_ok=True)
    _record_exit(signal_dir, rank)
    threading.Thread(
        target=_signal_when_paddle_imported, args=(signal_dir, rank), name=_THREAD_NAME, daemon=True
    ).start()


if __name__ == _HOOK_RUN_NAME:
    _start()
