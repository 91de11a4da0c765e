# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The multi-node path of the runner (``run_collective_tests.sh --master/--nnodes/--rank/--host``): two
node-launches on this machine, each a runner of its own running this row as one node, join through Paddle's
launcher (``--nnodes 2``, a loopback master on a free port, one rank per node, ``--host 127.0.0.1``) and
run one collective case across them (``collective_multinode_overlap.py``: V1 and V2 overlap on == off).

Two tests, one per role, so the one row serves both: ``test_two_nodes_through_the_runner`` starts the two
runners (it skips inside a multi-node run, where it would be a node itself); ``test_node`` is what each
node's runner runs (it skips unless the runner was given ``--nnodes``). Timeouts as in
``collective_launch`` (docs/harness.md): until both nodes' ranks have imported Paddle (their rank signals)
the test's pytest-timeout clock stands still, up to a start-up limit; then each node's launch has
``NODE_TIMEOUT`` seconds and this test what is left of its clock. A node's runner that fails, or any limit
reached, ends both nodes' process trees (every process carrying this test's marker in its environment).
"""

import glob
import math
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import unittest
import uuid

from collective_launch import kill_marked, launch_collective, marked

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUNNER = os.path.join(ROOT, "tools", "collective_runner.py")
ROW = os.path.splitext(os.path.basename(__file__))[0]
SCRIPT = os.path.join(HERE, "collective_multinode_overlap.py")
FLEET = os.path.join(ROOT, "test", "collective", "fleet")  # the case module SCRIPT imports
NODES = 2
NODE_TIMEOUT = 120  # seconds of behaviour of each node's launch, after its rank is ready
MARKER_ENV = "PADDLE_OVERLAY_MULTINODE_TEST"  # in every process of the two node trees
RUNNER_GRACE = 15.0  # seconds a runner has to end its launch on SIGTERM (its own kill waits up to 10)
REPORT_MARGIN = 15.0  # seconds of the test's clock kept to end the trees and report
TAIL_LINES = 40


def launch_args():
    return shlex.split(os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", ""))


def is_node():
    return "--nnodes" in launch_args()


def free_port():
    """A port free now: from ``$PORT_RANGE`` (``LOW:HIGH``, as Paddle's launcher reads it; the suite sets
    ranges below the ephemeral ports, which the ranks' own connections take) when set, else any."""
    low, _, high = os.environ.get("PORT_RANGE", "").partition(":")
    ports = range(int(low), int(high) + 1) if high else range(0)
    candidates = random.sample(ports, min(50, len(ports))) if high else [0]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in PORT_RANGE={os.environ['PORT_RANGE']}")


def end_trees(marker, spare=(), grace=5.0):
    """End every process whose environment carries ``marker`` but the pids in ``spare``."""
    kill_marked(MARKER_ENV, marker, grace, spare)


def tail(path, lines=TAIL_LINES):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:]) or "(empty)"
    except OSError:
        return "(missing)"


class Node:
    """One node-launch: a runner of this row with the multi-node options, its output and log folders."""

    def __init__(self, rank, master, run_root, marker):
        self.rank, self.run_dir = rank, os.path.join(run_root, f"node-{rank}")
        os.makedirs(self.run_dir, exist_ok=True)
        self.output = os.path.join(self.run_dir, "runner.log")
        self.cmd = [sys.executable, RUNNER, "-k", f"^{ROW}$", "--device", "cpu", "--nproc", "1",
                    "--nnodes", str(NODES), "--master", master, "--rank", str(rank), "--host", "127.0.0.1",
                    "--run-dir", self.run_dir]
        env = {**os.environ, MARKER_ENV: marker}
        env.pop("PADDLE_OVERLAY_LAUNCH_ARGS", None)  # the runner makes it from its options
        env.pop("PYTEST_CURRENT_TEST", None)
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def launch_dirs(self):
        return sorted(d for d in glob.glob(os.path.join(self.run_dir, "paddle-*", ROW, "*")) if os.path.isdir(d))

    def ready(self):
        """True once this node's rank has imported Paddle (its rank signal ``rank-<node rank>``)."""
        return any(os.path.exists(os.path.join(d, "rank-signals", f"rank-{self.rank}")) for d in self.launch_dirs())

    def report(self):
        lines = [f"----- node {self.rank}: exit {self.proc.poll()}, {' '.join(map(shlex.quote, self.cmd))}",
                 f"----- node {self.rank}: last {TAIL_LINES} lines of {self.output}", tail(self.output)]
        for d in self.launch_dirs():
            lines += [f"----- node {self.rank}: {d}/workerlog.0", tail(os.path.join(d, "workerlog.0"))]
        return "\n".join(lines)


def startup_limit():
    """Seconds the two nodes may take to start: a runner's own start (it imports Paddle) and its launch's
    start-up, each bounded by ``PADDLE_OVERLAY_STARTUP_TIMEOUT`` (default 300)."""
    limit = float(os.environ.get("PADDLE_OVERLAY_STARTUP_TIMEOUT") or 300)
    if not 0 < limit < math.inf:
        raise ValueError(f"PADDLE_OVERLAY_STARTUP_TIMEOUT must be a positive number of seconds, got {limit}")
    return 2 * limit


class TestCollectiveLaunchMultinode(unittest.TestCase):
    longMessage = False

    def test_node(self):
        if not is_node():
            self.skipTest("one node of test_two_nodes_through_the_runner: runs when the runner is given --nnodes")
        from legacy_test.test_parallel_dygraph_dataparallel import rank_env

        args = launch_args()
        path = os.pathsep.join(p for p in (FLEET, os.environ.get("PYTHONPATH")) if p)  # the case module first
        env = rank_env("auto_growth", {"PYTHONPATH": path})
        result = launch_collective(SCRIPT, nproc=1, timeout=NODE_TIMEOUT, env=env)
        log = result.rank_logs[0]
        for text in (f"MULTINODE rank {args[args.index('--rank') + 1]} of 2, node", "3 passed, 0 failed"):
            self.assertIn(text, log, f"{text!r} not in the rank's log:\n{log[-4000:]}")
        launcher = tail(os.path.join(result.log_dir, "launcher.log"), 10**6)
        for option in ("nnodes", "master", "rank", "host"):  # what the launcher was given
            value = args[args.index(f"--{option}") + 1]
            self.assertRegex(launcher, rf"LAUNCH INFO .* {option}: {re.escape(value)}\n", f"launcher.log: {option}")

    def test_two_nodes_through_the_runner(self):
        if is_node():
            self.skipTest("inside a multi-node run (--nnodes given): this process is one of its nodes")
        marker = uuid.uuid4().hex
        run_root = os.environ.get("PADDLE_OVERLAY_RUN_DIR") or os.path.join(ROOT, ".test-out", "multinode")
        run_root = os.path.join(run_root, f"two-nodes-{marker[:8]}")
        master = f"127.0.0.1:{free_port()}"
        clock = signal.getitimer(signal.ITIMER_REAL)[0]  # pytest-timeout's, or 0
        limit = startup_limit()
        if clock:
            signal.setitimer(signal.ITIMER_REAL, clock + limit)  # the test's clock stands still
        start, nodes, verdict, started = time.monotonic(), [], None, False
        try:
            nodes = [Node(rank, master, run_root, marker) for rank in range(NODES)]
            deadline = start + limit
            while verdict is None:
                now, codes = time.monotonic(), [n.proc.poll() for n in nodes]
                if not started and all(n.ready() for n in nodes):
                    started = True
                    budget = clock - min(REPORT_MARGIN, clock / 4) if clock else 2 * NODE_TIMEOUT + 60
                    deadline = now + budget
                    if clock:
                        signal.setitimer(signal.ITIMER_REAL, clock)
                if all(c == 0 for c in codes):
                    verdict = "ok"
                elif any(c not in (None, 0) for c in codes):
                    failed = [n.rank for n, c in zip(nodes, codes) if c not in (None, 0)]
                    verdict = f"node(s) {failed} failed (runner exit {[codes[r] for r in failed]})"
                elif now >= deadline:
                    waiting = [n.rank for n in nodes if not n.ready()]
                    verdict = (f"timeout: {budget:.0f}s after both nodes' ranks were ready" if started else
                               f"start-up timeout after {limit:.0f}s: node(s) {waiting} had no rank ready")
                else:
                    time.sleep(0.5)
        finally:
            if clock and not started:
                signal.setitimer(signal.ITIMER_REAL, clock)
            for n in nodes:  # a runner ends its own launch on SIGTERM (its exit status says so)
                if n.proc.poll() is None:
                    n.proc.terminate()
            for n in nodes:
                try:
                    n.proc.wait(timeout=RUNNER_GRACE)
                except subprocess.TimeoutExpired:
                    pass
            end_trees(marker, spare={n.proc.pid for n in nodes})
            for n in nodes:
                if n.proc.poll() is None:
                    n.proc.kill()
                n.proc.wait()
        seconds = time.monotonic() - start
        message = "\n".join([f"two-node launch ({master}, {seconds:.1f}s): {verdict}", f"logs: {run_root}",
                             *(n.report() for n in nodes)])
        self.assertEqual(verdict, "ok", message)
        for n in nodes:  # each runner ran its node (PASS), not skipped it
            self.assertRegex(tail(n.output, 10**6), r"::test_node PASS", message)
        left = marked(MARKER_ENV, marker)
        self.assertEqual(left, [], f"processes left behind: {left}")
        print(f"two nodes through the runner: {seconds:.1f}s, logs {run_root}")


if __name__ == "__main__":
    unittest.main()
