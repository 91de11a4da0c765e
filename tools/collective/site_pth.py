# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Install a one-line ``.pth`` start-up hook into this interpreter's site-packages.

``site`` executes a ``.pth`` line that starts with ``import`` in every interpreter start-up of
that environment (a venv's ranks included), so the test harness uses it for per-rank hooks that
must run before the script under test: coverage (``tools/rank_coverage.py``) and the rank
readiness and exit signals (``rank_signals.py``). Each hook's line does nothing unless its environment
variable is set.
"""

import os
import sysconfig


def pth_path(name):
    """Path of ``name`` (e.g. ``"x.pth"``) in this interpreter's purelib site-packages."""
    return os.path.join(sysconfig.get_paths()["purelib"], name)


def installed(name, text):
    """Whether ``name`` exists there with exactly ``text``."""
    try:
        with open(pth_path(name)) as f:
            return f.read() == text
    except OSError:
        return False


def install(name, text):
    """Write ``text`` to ``name`` unless it is already there (idempotent). Returns the path.

    Raises PermissionError/OSError when site-packages is not writable (e.g. a system Python):
    use a venv (``tools/run_collective_tests.sh`` makes one).
    """
    path = pth_path(name)
    if not installed(name, text):
        with open(path, "w") as f:
            f.write(text)
    return path
