#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Run the collective tests listed in ``testslist.csv`` files.

The lists: ``test/collective/fleet/testslist.csv`` (what goes upstream to Paddle) and the
project's own ``test/*/testslist.csv`` (e.g. ``test/harness``: the launcher's fault injection),
same columns; a row's driver lives next to its list. Each selected row runs its driver
``<list folder>/<name>.py`` as
``python -m pytest -q -rs DRIVER`` with the row's timeout (seconds), in its own session;
on timeout its whole process tree is killed. Rows whose arch/os/conditions do not hold
here are reported SKIP with the reason. Logs of every rank stay under the run directory:
``<run-dir>/paddle-<version>/<test>/`` (``pytest.log``, and one folder per launch holding
``launcher.log`` and ``workerlog.N``).

Normally started by tools/run_collective_tests.sh with the interpreter of the matching venv.
Exit code: 0 when nothing failed (and coverage met --cov-fail-under), 1 otherwise,
or --skip-exit-code when every selected test was skipped.
"""

import argparse
import datetime
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLEET_DIR = os.path.join(ROOT, "test", "collective", "fleet")
TESTSLIST = os.path.join(FLEET_DIR, "testslist.csv")


def default_testslists():
    """Upstream's list first, then the project's ``test/*/testslist.csv`` in name order."""
    import glob

    return [TESTSLIST] + sorted(glob.glob(os.path.join(ROOT, "test", "*", "testslist.csv")))

# The project's launcher wrapper (collective_launch.py) and the test-only stand-in for upstream's
# legacy_test.test_parallel_dygraph_dataparallel: first on every driver's PYTHONPATH.
HARNESS_DIR = os.path.join(ROOT, "tools", "collective")
# Every test output goes under this one folder (pip and setuptools use build/).
OUT_ROOT = os.path.join(ROOT, ".test-out")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="run_collective_tests.sh",
        description="Run the collective (multi-rank) tests of paddle_overlay under Paddle's launcher.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  run_collective_tests.sh --list\n"
            "  run_collective_tests.sh -k broadcast_overlap --repeat 5\n"
            "  run_collective_tests.sh --paddle 3.3.1,2.6.2 --coverage --cov-fail-under 90 \\\n"
            "      --junit-xml .test-out/junit-{paddle}.xml\n"
            "  run_collective_tests.sh --device gpu --nproc 8 --master 10.0.0.1:8090 --nnodes 2 --rank 0"
        ),
    )
    p.add_argument("-k", dest="pattern", metavar="PATTERN", help="run tests whose name matches this regular expression")
    p.add_argument("--exclude", metavar="PATTERN", help="leave out tests whose name matches this regular expression")
    p.add_argument("--list", action="store_true", help="list the tests (name, timeout, requirements) and exit")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run each selected test N times (flake hunting)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto (default): gpu if Paddle has CUDA and >= NPROC GPUs are visible, else cpu (gloo)")
    p.add_argument("--nproc", type=int, default=2, metavar="N",
                   help="ranks per node available to tests (default 2); tests needing more are skipped")
    p.add_argument("--master", metavar="IP:PORT", help="passed to paddle.distributed.launch (multi-node)")
    p.add_argument("--nnodes", metavar="N", help="passed to paddle.distributed.launch (multi-node)")
    p.add_argument("--rank", metavar="R", help="node rank, passed to paddle.distributed.launch (multi-node)")
    p.add_argument("--run-dir", metavar="DIR",
                   help="keep logs here (default .test-out/collective-runs/<timestamp>); {paddle} -> version")
    p.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report; {paddle} -> Paddle version")
    p.add_argument("--coverage", action="store_true", help="measure paddle_overlay in every rank and report")
    p.add_argument("--cov-fail-under", type=float, metavar="PCT", help="with --coverage: fail under PCT percent")
    p.add_argument("--slow-start", type=float, metavar="SECONDS",
                   help="delay every process running a test script by SECONDS at start-up (a sitecustomize.py "
                        "first on PYTHONPATH), as a loaded machine does: issue 13's reproduction")
    p.add_argument("--skip-exit-code", type=int, default=0, metavar="CODE",
                   help="exit with CODE when every selected test was skipped (ctest uses 77)")
    p.add_argument("--testslist", action="append", help=argparse.SUPPRESS)
    # Used by run_collective_tests.sh before it builds a venv: validate the selection and exit.
    p.add_argument("--check-selection", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1 or args.nproc < 1:
        p.error("--repeat and --nproc must be >= 1")
    if args.cov_fail_under is not None and not args.coverage:
        p.error("--cov-fail-under needs --coverage")
    if args.slow_start is not None and args.slow_start <= 0:
        p.error("--slow-start must be a positive number of seconds")
    for flag, pattern in (("-k", args.pattern), ("--exclude", args.exclude)):
        try:
            re.compile(pattern or "")
        except re.error as e:
            p.error(f"{flag} {pattern!r} is not a regular expression: {e}")
    return args


def select_rows(rows, pattern, exclude=None):
    """Rows whose name matches ``pattern`` and not ``exclude`` (regular expressions searched in the name)."""
    rx = re.compile(pattern) if pattern else None
    ex = re.compile(exclude) if exclude else None
    return [r for r in rows if (rx is None or rx.search(r.name)) and (ex is None or not ex.search(r.name))]


_ROW_DIRS = {}  # test name -> folder of the testslist.csv that lists it


def read_rows(paths):
    """Rows of every list in ``paths``, in order. Raises ValueError on a malformed row or a
    name listed twice (naming both lists)."""
    import testslist

    rows = []
    for path in paths:
        for row in testslist.read_testslist(path):
            folder = os.path.dirname(os.path.abspath(path))
            if _ROW_DIRS.get(row.name, folder) != folder:
                raise ValueError(f"{row.name} is listed in both {_ROW_DIRS[row.name]} and {folder}")
            _ROW_DIRS[row.name] = folder
            rows.append(row)
    return rows


def driver_path(row):
    return os.path.join(_ROW_DIRS.get(row.name, FLEET_DIR), row.name + ".py")


def probe_paddle(python):
    """Version and CUDA facts of the Paddle that ``python`` imports (run in a child process).

    Returns dict(version=str, cuda=bool, gpus=int); raises RuntimeError if Paddle cannot be imported.
    """
    import json
    import subprocess

    code = (
        "import json, paddle\n"
        "cuda = paddle.is_compiled_with_cuda()\n"
        "gpus = paddle.device.cuda.device_count() if cuda else 0\n"
        "print('PROBE' + json.dumps(dict(version=paddle.__version__, cuda=cuda, gpus=gpus)))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("PROBE"):
            return json.loads(line[5:])
    raise RuntimeError(f"cannot import paddle with {python}:\n{out.stderr[-2000:]}")


def choose_device(requested, paddle, nproc):
    if requested != "auto":
        return requested
    return "gpu" if paddle["cuda"] and paddle["gpus"] >= nproc else "cpu"


def launch_args(args):
    extra = os.environ.get("PADDLE_OVERLAY_LAUNCH_ARGS", "").split()
    for flag in ("master", "nnodes", "rank"):
        if getattr(args, flag) is not None:
            extra += [f"--{flag}", str(getattr(args, flag))]
    return " ".join(extra)


def driver_env(row, args, device, out_dir, cov_rc, first_paths=()):
    """Environment of one driver run: ours on top of the caller's and the row's ``envs``.

    ``first_paths``: folders put before the harness on ``PYTHONPATH`` (the slow-start hook)."""
    env = dict(os.environ)
    for k, v in row.env_dict().items():
        if k != "PYTHONPATH":  # upstream's PYTHONPATH=../.. points into a Paddle build tree
            env[k] = v
    env.update(
        PYTHONPATH=os.pathsep.join([*first_paths, HARNESS_DIR]
                                   + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        PADDLE_OVERLAY_TEST_DEVICE=device,
        PADDLE_OVERLAY_TEST_NPROC=str(args.nproc),
        PADDLE_OVERLAY_RUN_DIR=out_dir,
        PADDLE_OVERLAY_LAUNCH_ARGS=launch_args(args),
        TEST_TARGET_NAME=row.name,
        TEST_TIMEOUT=str(row.timeout_seconds),  # as upstream's bash_test_modules: launches stay inside it
    )
    if cov_rc:
        env["COVERAGE_PROCESS_START"] = cov_rc
    return env


def fmt_seconds(s):
    return f"{s:.1f}s" if s < 120 else f"{int(s // 60)}m{int(s % 60):02d}s"


def list_rows(rows):
    print(f"{'name':52} {'timeout':>8}  requires / driver")
    for r in rows:
        req = " ".join(filter(None, [";".join(r.os), ";".join(r.arch), ";".join(r.conditions)])) or "-"
        present = "" if os.path.isfile(driver_path(r)) else "  (driver MISSING)"
        print(f"{r.name:52} {r.timeout_seconds:>7}s  {req}{present}")
    lists = sorted({os.path.relpath(os.path.join(_ROW_DIRS.get(r.name, FLEET_DIR), "testslist.csv"), ROOT) for r in rows})
    print(f"{len(rows)} tests in {', '.join(lists) or 'no list'}")


def write_junit(path, results, paddle_version):
    """JUnit XML: one testsuite per Paddle version, one testcase per run."""
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name=f"collective.paddle-{paddle_version}", tests=str(len(results)),
                       failures=str(sum(r["outcome"] == "FAIL" for r in results)),
                       skipped=str(sum(r["outcome"] == "SKIP" for r in results)),
                       time=f"{sum(r['seconds'] for r in results):.1f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"collective.paddle-{paddle_version}",
                             name=r["label"], time=f"{r['seconds']:.1f}")
        if r["outcome"] == "FAIL":
            ET.SubElement(case, "failure", message=r["note"]).text = r["detail"]
        elif r["outcome"] == "SKIP":
            ET.SubElement(case, "skipped", message=r["note"])
        ET.SubElement(case, "system-out").text = f"logs: {r['out_dir']}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


NOTE_WIDTH = 160  # characters of a reason shown on one summary line


def first_line(text, width=NOTE_WIDTH):
    """The first non-empty line of ``text``, cut to ``width`` characters (with ``...``)."""
    line = next((l.strip() for l in text.splitlines() if l.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def print_failures(results):
    """One short line per FAIL (the reason's first line), the folder of its logs on the next."""
    failed = [r for r in results if r["outcome"] == "FAIL"]
    if not failed:
        return
    print(f"\n{len(failed)} failed:")
    for r in failed:
        print(f"FAIL {r['label']} (paddle {r['paddle']}): {first_line(r['note'])}")
        print(f"     logs: {r['out_dir']}")


def print_table(results):
    cols = ("test", "paddle", "ranks", "device", "result", "seconds", "note")
    rows = [(r["label"], r["paddle"], str(r["ranks"]), r["device"], r["outcome"], fmt_seconds(r["seconds"]),
             first_line(r["note"], 70)) for r in results]
    widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    print("\n" + line(cols))
    print(line(["-" * w for w in widths]))
    for x in rows:
        print(line(x))


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, HARNESS_DIR)
    import time

    import testslist

    all_rows = read_rows(args.testslist or default_testslists())
    rows = select_rows(all_rows, args.pattern, args.exclude)
    if args.list:
        list_rows(rows)
        return 0
    if not rows:
        print(f"error: no test matches -k {args.pattern!r}" + (f" --exclude {args.exclude!r}" if args.exclude else "")
              + f"; the tests are: {', '.join(r.name for r in all_rows)}", file=sys.stderr)
        return 2
    if args.check_selection:
        return 0

    from run_driver import log_tail, run_driver

    paddle = probe_paddle(sys.executable)
    device = choose_device(args.device, paddle, args.nproc)
    facts = testslist.platform_facts(cuda=paddle["cuda"])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_root = os.path.abspath((args.run_dir or os.path.join(OUT_ROOT, "collective-runs", stamp))
                               .replace("{paddle}", paddle["version"]))
    run_dir = os.path.join(run_root, f"paddle-{paddle['version']}")
    os.makedirs(run_dir, exist_ok=True)
    cov_rc = None
    if args.coverage:
        import rank_coverage

        if not rank_coverage.pth_installed():
            print(f"error: --coverage needs {rank_coverage.pth_path()} so that every rank records; "
                  "run through tools/run_collective_tests.sh or `python tools/rank_coverage.py install-pth`",
                  file=sys.stderr)
            return 1
        cov_rc = rank_coverage.write_rcfile(run_dir)

    first_paths = []
    if args.slow_start:
        import slow_start

        first_paths.append(slow_start.write_sitecustomize(os.path.join(run_dir, "slow-start"), args.slow_start,
                                                          os.path.join(ROOT, "test") + os.sep))
        print(f"slow start: every process running a script under test/ sleeps {args.slow_start:g}s at start-up",
              flush=True)
    plan = [(row, k) for row in rows for k in range(args.repeat)]
    print(f"Paddle {paddle['version']} ({'CUDA, %d GPUs' % paddle['gpus'] if paddle['cuda'] else 'CPU build'}), "
          f"device {device}, {args.nproc} ranks, {len(plan)} runs; logs in {run_dir}", flush=True)
    suite_start = time.monotonic()
    results = []
    for i, (row, k) in enumerate(plan, start=1):
        label = row.name if args.repeat == 1 else f"{row.name}#{k + 1}"
        out_dir = os.path.join(run_dir, label.replace("#", "-rep"))
        print(f"[{i}/{len(plan)}] {label} ... (suite elapsed {fmt_seconds(time.monotonic() - suite_start)}, "
              f"timeout {row.timeout_seconds}s)", flush=True)
        rec = dict(label=label, paddle=paddle["version"], ranks=args.nproc, device=device, out_dir=out_dir,
                   outcome="FAIL", seconds=0.0, note="", detail="")
        unmet = testslist.unmet_requirements(row, device, facts)
        driver = driver_path(row)
        if unmet:
            rec.update(outcome="SKIP", note="; ".join(unmet))
        elif not os.path.isfile(driver):
            rec.update(note=f"driver missing: {os.path.relpath(driver, ROOT)}")
        else:
            beat = lambda s, name=label: print(f"    ... {name} still running ({fmt_seconds(s)})", flush=True)
            res = run_driver(driver, timeout=row.timeout_seconds, env=driver_env(row, args, device, out_dir, cov_rc, first_paths),
                             out_dir=out_dir, heartbeat=beat)
            note = "; ".join(res.problems) if res.outcome == "FAIL" else res.summary()
            if res.outcome == "SKIP":
                note = "; ".join(res.skip_reasons) or note
            rec.update(outcome=res.outcome, seconds=res.seconds, note=note,
                       detail=log_tail(res.log_path, 200) if res.outcome == "FAIL" else "")
        results.append(rec)
        print(f"{label}  paddle {rec['paddle']}  ranks {rec['ranks']}  {device}  {rec['outcome']}  "
              f"{fmt_seconds(rec['seconds'])}" + (f"  ({first_line(rec['note'])})" if rec["note"] else ""), flush=True)
        if rec["outcome"] == "FAIL" and rec["detail"]:
            print(f"---- {label}: last lines of {os.path.join(out_dir, 'pytest.log')} ----")
            print(rec["detail"].rstrip())
            print("----", flush=True)

    print_table(results)
    cov_ok = True
    if args.coverage:
        import rank_coverage

        cov_ok, text = rank_coverage.combine_and_report(cov_rc, args.cov_fail_under)
        report = os.path.join(run_dir, "coverage-report.txt")
        with open(report, "w") as f:
            f.write(text + "\n")
        print(f"\nCoverage of paddle_overlay across all ranks (Paddle {paddle['version']}):\n{text}")
        print(f"coverage report: {report} (XML: {os.path.join(run_dir, 'coverage.xml')})")
        if not cov_ok:
            print(f"COVERAGE FAILED (threshold {args.cov_fail_under}%)")
    if args.junit_xml:
        path = args.junit_xml.replace("{paddle}", paddle["version"])
        write_junit(path, results, paddle["version"])
        print(f"JUnit XML: {path}")
    n = {o: sum(r["outcome"] == o for r in results) for o in ("PASS", "FAIL", "SKIP")}
    print_failures(results)
    print(f"logs: {run_dir}")
    print(f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped", flush=True)
    if n["FAIL"] or not cov_ok:
        return 1
    if args.skip_exit_code and n["SKIP"] == len(results):
        return args.skip_exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
