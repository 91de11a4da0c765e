# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Reproduce a slow machine: a ``sitecustomize.py`` that delays the start of test processes.

Issue 13's deterministic reproduction of a loaded CI machine: every Python process whose
command line runs a script under ``test/`` sleeps a fixed number of seconds at interpreter
start-up, before the script (and Paddle) is imported. ``tools/collective_runner.py
--slow-start SECONDS`` writes the file into the run directory and puts its folder first on
the drivers' ``PYTHONPATH`` (the ranks inherit it). With it every collective test must still
pass, and the fault-injection test must still name the rank that hung or crashed.
"""

import os

TEMPLATE = '''\
# Written by tools/collective/slow_start.py: delay test processes as a loaded machine does.
import sys
import time

_argv = sys.argv or []
try:
    with open("/proc/self/cmdline", "rb") as _f:
        _argv = [a.decode(errors="replace") for a in _f.read().split(b"\\0")]
except OSError:
    pass
if any({marker!r} in a for a in _argv):
    time.sleep({seconds!r})
'''


def write_sitecustomize(folder, seconds, marker):
    """Write ``<folder>/sitecustomize.py`` sleeping ``seconds`` (float > 0) in processes whose
    command line contains ``marker`` (e.g. the repository's ``test/`` path). Returns ``folder``.

    Raises ValueError when ``seconds`` is not a positive number.
    """
    seconds = float(seconds)
    if seconds <= 0:
        raise ValueError(f"slow-start seconds must be positive, got {seconds}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(TEMPLATE.format(marker=marker, seconds=seconds))
    return folder
