#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Run the collective tests listed in ``testslist.csv`` files, one pytest session per Paddle (docs/harness.md).

``bash tools/run_collective_tests.sh`` starts this file with any python3 (``--bootstrap``): it answers
``--help``, ``--list`` and bad arguments at once, then runs itself again in ``.venv-test/paddle-V``'s
python (several releases: one after the other, then a table). Started directly (ctest does), it runs
the selected drivers in one pytest session with :class:`CollectivePlugin`.
"""

import argparse
import datetime
import glob
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS_DIR = os.path.join(ROOT, "tools", "collective")
COVERAGERC = os.path.join(ROOT, "tools", "coveragerc")
# test/: the stand-ins of upstream's test bases (legacy_test, collective), found there as upstream's
# fleet rows find them (PYTHONPATH=../..)
sys.path[:0] = [os.path.join(ROOT, "tools"), HARNESS_DIR, ROOT, os.path.join(ROOT, "test")]
import rank_signals  # noqa: E402
import testslist  # noqa: E402
from paddle_overlay._patching import PADDLE_PINS, TESTED_PADDLE  # noqa: E402  (the one list of releases)


def parse_args(argv=None):
    p = argparse.ArgumentParser(  # no abbreviations: run_releases passes argv on, less the release options
        prog="run_collective_tests.sh", allow_abbrev=False,
        description="Run the collective (multi-rank) tests of paddle_overlay under Paddle's launcher.", epilog="Environment: PYTHON (the python3 that makes the venvs), PIP_INDEX_URL, "
        "PIP_FIND_LINKS (where pip finds wheels). docs/harness.md says more.")
    p.add_argument("--paddle", action="append", metavar="VERSION[,VERSION]", help="tested release(s) to run, one of: "
                   f"{' '.join(TESTED_PADDLE)} (default {TESTED_PADDLE[-1]}); several run in turn, then a table")
    p.add_argument("--matrix", action="store_true", help="every tested release (slow: a venv each)")
    p.add_argument("--rebuild-venv", action="store_true", help="reinstall the venv even if its stamp matches")
    p.add_argument("--venv-only", action="store_true", help="make or reuse the venv(s), print each python path")
    p.add_argument("-k", dest="pattern", metavar="PATTERN", help="run tests whose name matches this regular expression")
    p.add_argument("--exclude", metavar="PATTERN", help="leave out tests whose name matches this regular expression")
    p.add_argument("--list", action="store_true", help="list the tests (name, timeout, requirements) and exit")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run each selected test N times (flake hunting)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto (default): gpu if Paddle has CUDA and >= NPROC GPUs are visible, else cpu (gloo)")
    p.add_argument("--nproc", type=int, default=2, metavar="N",
                   help="ranks per node available to tests (default 2); tests needing more are skipped")
    for flag, what in (("--master", "IP:PORT"), ("--nnodes", "N"), ("--rank", "R")):
        p.add_argument(flag, metavar=what, help="passed to paddle.distributed.launch (multi-node)")
    p.add_argument("--host", metavar="IP", help="passed to paddle.distributed.launch: this node's IP, which its ranks "
                   "use instead of the detected one (multi-node; 127.0.0.1 for nodes on one machine)")
    p.add_argument("--run-dir", metavar="DIR", help="keep logs here (default .test-out/collective-runs/<timestamp>); {paddle} -> version")
    p.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report; {paddle} -> Paddle version")
    p.add_argument("--coverage", action="store_true", help="measure paddle_overlay in every rank and report")
    p.add_argument("--cov-fail-under", type=float, metavar="PCT", help="with --coverage: fail under PCT percent")
    p.add_argument("--slow-start", type=float, metavar="SECONDS", help="delay every rank of every launch by SECONDS "
                   "at start-up, as a loaded machine does (where a fixed start-up time once failed a test)")
    p.add_argument("--skip-exit-code", type=int, default=0, metavar="CODE",
                   help="exit with CODE when every selected test was skipped (ctest uses 77)")
    p.add_argument("--bootstrap", action="store_true", help=argparse.SUPPRESS)  # run_collective_tests.sh
    args = p.parse_args(argv)
    named = [v for a in args.paddle or [] for v in a.split(",") if v]
    args.versions = TESTED_PADDLE if args.matrix else list(dict.fromkeys(named))  # each release once
    for v in set(args.versions) - set(TESTED_PADDLE):
        p.error(f"Paddle {v} is not a supported release; use one of: {' '.join(TESTED_PADDLE)}")
    for bad, message in ((len(args.versions) > 1 and "{paddle}" not in (args.junit_xml or "{paddle}"),
                          "with several --paddle versions, put {paddle} in the --junit-xml path"),
                         (args.repeat < 1, "--repeat must be >= 1"), (args.nproc < 1, "--nproc must be >= 1"),
                         (args.cov_fail_under is not None and not args.coverage, "--cov-fail-under needs --coverage"),
                         (args.cov_fail_under is not None and not 0 <= args.cov_fail_under <= 100,
                          "--cov-fail-under must be a percentage from 0 to 100"),
                         (args.slow_start is not None and not 0 < args.slow_start < math.inf,
                          "--slow-start must be a positive, finite number of seconds")):
        if bad:
            p.error(message)
    for flag, pattern in (("-k", args.pattern), ("--exclude", args.exclude)):
        try:
            re.compile(pattern or "")
        except re.error as e:
            p.error(f"{flag} {pattern!r} is not a regular expression: {e}")
    return args


def read_rows(paths=None):
    """{driver path: row} of every list, in list order; ValueError for a name in two lists."""
    paths = paths or [os.path.join(ROOT, "test", "collective", "fleet", "testslist.csv")] + sorted(
        glob.glob(os.path.join(ROOT, "test", "*", "testslist.csv")))
    rows, seen = {}, {}
    for path in paths:
        folder = os.path.dirname(os.path.abspath(path))
        for row in testslist.read_testslist(path):
            if seen.setdefault(row.name, folder) != folder:
                raise ValueError(f"{row.name} is listed in both {seen[row.name]} and {folder}")
            rows[os.path.join(folder, row.name + ".py")] = row
    return rows


def select(rows, pattern=None, exclude=None):
    return {d: r for d, r in rows.items()
            if (not pattern or re.search(pattern, r.name)) and not (exclude and re.search(exclude, r.name))}


def list_rows(rows):
    width = max([len("name")] + [len(r.name) for r in rows.values()])
    print(f"{'name':{width}} {'timeout':>8}  requires (of the row; a driver may skip more) / driver")
    for driver, r in rows.items():
        req = " ".join(filter(None, [";".join(r.os), ";".join(r.arch), ";".join(r.conditions)])) or "-"
        print(f"{r.name:{width}} {r.timeout_seconds:>7}s  {req}{'' if os.path.isfile(driver) else '  (driver MISSING)'}")
    lists = sorted({os.path.relpath(os.path.dirname(d), ROOT) + "/testslist.csv" for d in rows})
    print(f"{len(rows)} test(s) in {', '.join(lists) or 'no list'}")


class CollectivePlugin:
    """The pytest side: requirements, per-row timeout, envs and log folder, one-line results."""

    def __init__(self, rows, device, facts, run_dir, header):
        self.rows, self.device, self.facts, self.run_dir, self.header = rows, device, facts, run_dir, header
        self.by_nodeid, self.environ = {}, None

    def pytest_sessionstart(self):  # the environment, put back after each test (pytest-cov has set its part)
        self.environ = dict(os.environ)

    def pytest_report_header(self):
        return self.header

    def pytest_collection_modifyitems(self, items):
        import pytest  # not at the top: the bootstrap runs with any python3

        for item in items:
            row = self.by_nodeid[item.nodeid] = self.rows[str(item.path)]
            if unmet := testslist.unmet_requirements(row, self.device, self.facts):
                item.add_marker(pytest.mark.skip(reason="; ".join(unmet)))
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(row.timeout_seconds, method="signal"))

    def pytest_runtest_logstart(self, nodeid):  # before setup: unittest's setUpClass sees the row's envs
        row = self.by_nodeid[nodeid]
        os.environ.update({k: v for k, v in row.env_dict().items() if k != "PYTHONPATH"})
        os.environ["PADDLE_OVERLAY_RUN_DIR"] = os.path.join(self.run_dir, row.name)
        os.makedirs(os.environ["PADDLE_OVERLAY_RUN_DIR"], exist_ok=True)

    def pytest_runtest_logfinish(self):
        os.environ.clear()
        os.environ.update(self.environ)

    def pytest_report_teststatus(self, report):
        if hasattr(report, "wasxfail"):
            return None
        if report.when == "call" or (report.when == "setup" and report.skipped):
            word = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[report.outcome]
            seconds = "" if report.skipped else f" {report.duration:.1f}s"
            return report.outcome, word[0] if word != "PASS" else ".", word + seconds

    def pytest_terminal_summary(self, terminalreporter):
        stats = terminalreporter.stats
        self.all_skipped = bool(stats.get("skipped")) and not any(stats.get(k) for k in ("passed", "failed", "error"))
        for report in stats.get("failed", []) + stats.get("error", []):  # one line each, then its logs
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = next((l.strip() for l in (crash.message if crash else str(report.longrepr)).splitlines() if l.strip()), "")
            terminalreporter.write_line(f"FAIL {report.nodeid}: {reason[:160]}")
            row = self.by_nodeid.get(report.nodeid)
            if row:
                terminalreporter.write_line(f"     logs: {os.path.join(self.run_dir, row.name)}")
        terminalreporter.write_line(f"logs: {self.run_dir}")


def _read(path):
    with open(path) as f:
        return f.read()


def pins(version):
    """What pip must install for ``version`` to work (its ``PADDLE_PINS`` in one resolve)."""
    return [f"paddlepaddle=={version}", *PADDLE_PINS[version]]


def ensure_venv(version, rebuild=False):
    """Python of ``.venv-test/paddle-VERSION``, made first if missing or stale (nothing is kept
    of a build that failed or was interrupted). Stale: other pins, another ``pyproject.toml``, or built for
    another checkout (its editable install would import that checkout's ``paddle_overlay``, e.g. a venv
    linked from another worktree). Raises SystemExit(1) when pip fails or when a linked venv is stale."""
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    py, stamp = os.path.join(venv, "bin", "python"), os.path.join(venv, ".paddle-overlay-stamp")
    want = (f"{' '.join(pins(version))} | "
            f"{hashlib.sha256(_read(os.path.join(ROOT, 'pyproject.toml')).encode()).hexdigest()[:16]} | {ROOT}")
    if not rebuild and os.access(py, os.X_OK) and os.path.isfile(stamp) and _read(stamp) == want:
        print(f"venv: reusing {venv}", file=sys.stderr)
        return py
    linked = [p for p in (os.path.dirname(venv), venv) if os.path.islink(p)]
    if linked and os.path.isfile(stamp):  # rebuilding would replace the other checkout's venv
        sys.exit(f"error: {linked[0]} links to {os.path.realpath(linked[0])}, whose venv was built for another "
                 f"checkout or other pins (its stamp: {_read(stamp)!r}; this checkout: {ROOT}): its editable "
                 "install would test that checkout's paddle_overlay. Remove the link; each checkout makes its own.")
    tmp = os.path.join(ROOT, ".venv-test", f".paddle-{version}.partial-{os.getpid()}")
    print(f"venv: building {venv} (in {tmp}): {' '.join(pins(version))} and -e {ROOT}[test]", file=sys.stderr)
    try:  # built aside, moved into place when pip succeeded (its scripts name tmp: run `python -m`)
        subprocess.run([sys.executable, "-m", "venv", tmp], check=True)
        if subprocess.run([os.path.join(tmp, "bin", "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", *pins(version), "-e", f"{ROOT}[test]"],
                          stdout=sys.stderr).returncode:
            sys.exit(f"error: pip could not install {' '.join(pins(version))} for Paddle {version} (see above); "
                     "nothing was kept")
        with open(os.path.join(tmp, ".paddle-overlay-stamp"), "w") as f:
            f.write(want)
        shutil.rmtree(venv, ignore_errors=True)
        os.rename(tmp, venv)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return py


def run_release(py, passed):
    """Exit code of this runner in ``py`` (one release); a SIGTERM here is passed on, so that it ends its launches."""
    with subprocess.Popen([py, os.path.abspath(__file__), *passed]) as proc:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise


def run_releases(args, argv):
    """``--bootstrap``: each release in its venv; with several, a table of results at the end."""
    passed = [a for i, a in enumerate(argv) if a not in ("--bootstrap", "--matrix", "--rebuild-venv")
              and not a.startswith("--paddle") and not (i and argv[i - 1] == "--paddle")]
    versions = args.versions or [TESTED_PADDLE[-1]]
    if len(versions) == 1 and not args.venv_only:
        py = ensure_venv(versions[0], args.rebuild_venv)
        os.execv(py, [py, os.path.abspath(__file__), *passed])
    table, status = [], 0
    for version in versions:
        start = time.monotonic()
        try:
            py = ensure_venv(version, args.rebuild_venv)
            rc = 0 if args.venv_only else run_release(py, passed)
            result = "PASS" if rc == 0 else f"FAIL (exit {rc})"
        except SystemExit as e:
            print(e, file=sys.stderr)
            py, rc, result = None, 1, "VENV FAILED (pip could not install it)"
        if args.venv_only and py:
            print(py)
        status = status or int(rc != 0)
        table.append(f"Paddle {version:8} {result:40} {time.monotonic() - start:5.0f}s")
    if len(versions) > 1 and not args.venv_only:
        print("\nrelease results:", *table, sep="\n  ")
    return status


def _interrupt(signum, frame):  # a launch in progress kills its tree on the way out (coverage's handler calls this)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        rows = select(read_rows(), args.pattern, args.exclude)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        list_rows(rows)
        return 0
    if not rows:
        names = ", ".join(r.name for r in read_rows().values())
        print(f"error: no test matches -k {args.pattern!r}" + (f" --exclude {args.exclude!r}" if args.exclude else "")
              + f"; the tests are: {names}", file=sys.stderr)
        return 2
    if args.bootstrap or args.venv_only:
        try:
            return run_releases(args, argv)
        except KeyboardInterrupt as e:
            print(f"interrupted ({e}): the release being run ended its launches", file=sys.stderr)
            return 130
    import paddle
    import pytest
    from collective_launch import resolve_device

    signal.signal(signal.SIGTERM, _interrupt)  # again: importing Paddle replaced it at C level

    version = paddle.__version__
    if args.versions and args.versions != [version]:
        print(f"error: --paddle {','.join(args.versions)} asked for, {sys.executable} has Paddle {version} "
              "(run through tools/run_collective_tests.sh to pick the venv)", file=sys.stderr)
        return 2
    os.environ["PADDLE_OVERLAY_TEST_NPROC"] = str(args.nproc)
    device = os.environ["PADDLE_OVERLAY_TEST_DEVICE"] = resolve_device(args.device, args.nproc)
    launch = os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", "").split()
    launch += [a for f in ("master", "nnodes", "rank", "host") if getattr(args, f)
               for a in (f"--{f}", getattr(args, f))]
    os.environ["PADDLE_OVERLAY_LAUNCH_ARGS"] = " ".join(launch)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_root = (args.run_dir or os.path.join(ROOT, ".test-out", "collective-runs", stamp)).replace("{paddle}", version)
    run_dir = os.path.join(os.path.abspath(run_root), f"paddle-{version}")
    os.makedirs(run_dir, exist_ok=True)
    if args.slow_start:
        os.environ[rank_signals.SLOW_START_ENV] = str(args.slow_start)
        print(f"slow start: every rank sleeps {args.slow_start:g}s at start-up")
    cuda = paddle.is_compiled_with_cuda()
    header = (f"Paddle {version} ({'CUDA' if cuda else 'CPU build'}), device {device}, "
              f"{args.nproc} ranks per node, logs in {run_dir}")
    plugin = CollectivePlugin(rows, device, testslist.platform_facts(cuda=cuda), run_dir, header)
    pytest_args = ["-v", "-rfEs", "-p", "no:cacheprovider", "--rootdir", ROOT, "--tb=short",
                   "-o", f"junit_suite_name=collective.paddle-{version}", "--keep-duplicates"]
    if args.junit_xml:
        pytest_args.append("--junit-xml=" + args.junit_xml.replace("{paddle}", version))
    if args.coverage:  # pytest-cov; the ranks' data joins through `patch = subprocess` (tools/coveragerc)
        os.makedirs(os.path.join(run_dir, "coverage"), exist_ok=True)
        os.environ["COVERAGE_FILE"] = os.path.join(run_dir, "coverage", ".coverage")
        pytest_args += ["--cov", f"--cov-config={COVERAGERC}", "--cov-report=term-missing",
                        f"--cov-report=xml:{os.path.join(run_dir, 'coverage.xml')}"]
        pytest_args += [f"--cov-fail-under={args.cov_fail_under}"] if args.cov_fail_under is not None else []
    pytest_args += [d for d in rows for _ in range(args.repeat)]
    rc = int(pytest.main(pytest_args, plugins=[plugin]))
    return args.skip_exit_code if rc == 0 and args.skip_exit_code and getattr(plugin, "all_skipped", False) else rc


if __name__ == "__main__":
    sys.exit(main())
