# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Paddle's launcher (``python -m paddle.distributed.launch`` with the same arguments) in which the
SIGTERM that ends the launch comes while the launcher forks its first rank.

CPython holds a signal that arrives during the fork+exec C call of ``subprocess.Popen`` until the call
has returned; Paddle's handler then raises SystemExit out of ``Popen``, so the rank's ``Container`` never
gets a handle on it and ``pod.stop()`` does not end it. That moment lasts milliseconds; here the first
rank's fork+exec waits for the SIGTERM (writing ``forking`` in the launch's signal folder when it starts
to wait), then runs (writing the rank's pid in ``forked``), and only then gives the signal to Paddle's
handler. The rank is forked after the SIGTERM, so after the scan of the processes that sent it. Used by
test_collective_launch_fault_injection.py.
"""

import _posixsubprocess
import os
import runpy
import signal
import subprocess
import sys
import time

# What Popen._execute_child calls to fork and exec: subprocess._fork_exec from CPython 3.11 on, before it
# _posixsubprocess.fork_exec.
OWNER = subprocess if hasattr(subprocess, "_fork_exec") else _posixsubprocess
NAME = "_fork_exec" if OWNER is subprocess else "fork_exec"
fork_exec = getattr(OWNER, NAME)
held = []


def fork_exec_after_sigterm(args, *rest):
    if held or not any("collective_slow_start" in os.fsdecode(a) for a in args):  # the first rank only
        return fork_exec(args, *rest)
    paddle_handler = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    signal_dir = os.environ["PADDLE_OVERLAY_RANK_SIGNAL_DIR"]
    open(os.path.join(signal_dir, "forking"), "w").close()
    while not held:
        time.sleep(0.01)
    pid = fork_exec(args, *rest)
    with open(os.path.join(signal_dir, "forked"), "w") as f:
        f.write(str(pid))
    signal.signal(signal.SIGTERM, paddle_handler)
    paddle_handler(signal.SIGTERM, None)
    return pid


setattr(OWNER, NAME, fork_exec_after_sigterm)
sys.argv[0] = "paddle.distributed.launch"
runpy.run_module("paddle.distributed.launch", run_name="__main__")
