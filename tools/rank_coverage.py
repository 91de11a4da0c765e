# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Coverage of ``paddle_overlay`` across every launched rank (the ``coverage`` package).

Each rank is a fresh interpreter started by Paddle's launcher, so it is measured through
coverage's documented sub-process support: a ``.pth`` file in the venv's site-packages calls
``coverage.process_startup()``, which starts measuring when ``COVERAGE_PROCESS_START`` names
a config file. ``tools/run_collective_tests.sh`` installs the ``.pth`` (``python
tools/rank_coverage.py install-pth``); the runner writes the config with ``parallel = True``
so each process leaves its own data file, then combines them and reports.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "collective"))
import site_pth  # noqa: E402

PTH_NAME = "paddle_overlay_coverage.pth"
# One line; a .pth line starting with "import" is executed at interpreter start-up.
# Inert (and free of a coverage import) unless COVERAGE_PROCESS_START is set.
PTH_TEXT = (
    "import os; os.environ.get('COVERAGE_PROCESS_START') and "
    "__import__('coverage').process_startup()\n"
)


def pth_path():
    """Where the ``.pth`` belongs for this interpreter (its purelib site-packages)."""
    return site_pth.pth_path(PTH_NAME)


def install_pth():
    """Write the ``.pth`` if missing or different (idempotent). Returns its path."""
    return site_pth.install(PTH_NAME, PTH_TEXT)


def pth_installed():
    return site_pth.installed(PTH_NAME, PTH_TEXT)


def write_rcfile(run_dir, source="paddle_overlay"):
    """Write ``<run_dir>/.coveragerc`` (data under ``<run_dir>/coverage/``); return its path."""
    data_dir = os.path.join(os.path.abspath(run_dir), "coverage")
    os.makedirs(data_dir, exist_ok=True)
    rc = os.path.join(os.path.abspath(run_dir), ".coveragerc")
    with open(rc, "w") as f:
        f.write(
            "[run]\n"
            "parallel = True\n"
            "branch = True\n"
            f"source = {source}\n"
            "# the import-guard stub of the patched-tree test is not project code\n"
            "omit = */.test-out/*\n"
            f"data_file = {os.path.join(data_dir, '.coverage')}\n"
            "# ranks stopped by the launcher with SIGTERM still save their data\n"
            "sigterm = True\n"
            "\n[report]\n"
            "show_missing = True\n"
            "precision = 1\n"
        )
    return rc


def combine_and_report(rcfile, fail_under=None, python=sys.executable):
    """``coverage combine`` + ``report`` (+ ``xml`` next to the rc file).

    Returns (ok, text): ``ok`` False when nothing was recorded or the total is under
    ``fail_under`` (percent). ``text`` is coverage's output, to print.
    """
    run = lambda *a: subprocess.run([python, "-m", "coverage", *a, f"--rcfile={rcfile}"],
                                    capture_output=True, text=True)
    out = []
    combined = run("combine")
    out.append(combined.stdout + combined.stderr)
    report = run("report", *([f"--fail-under={fail_under}"] if fail_under is not None else []))
    out.append(report.stdout + report.stderr)
    if report.returncode == 0 or report.returncode == 2:
        run("xml", "-o", os.path.join(os.path.dirname(rcfile), "coverage.xml"))
    ok = combined.returncode == 0 and report.returncode == 0
    return ok, "".join(out).strip()


def merge(out_dir, data_dirs, fail_under=None, python=sys.executable):
    """Combine the coverage data found in ``data_dirs`` (files ``.coverage`` and ``.coverage.*``,
    e.g. the ranks of each Paddle release and the in-process unit tests) into ``out_dir``, then
    report as :func:`combine_and_report` does; also writes ``out_dir/coverage-report.txt``.

    Returns (ok, text). Raises FileNotFoundError when no data file is found.
    """
    import glob
    import shutil

    rc = write_rcfile(out_dir)
    data_dir = os.path.join(os.path.abspath(out_dir), "coverage")
    copied = 0
    for i, folder in enumerate(data_dirs):
        for path in glob.glob(os.path.join(folder, ".coverage")) + glob.glob(os.path.join(folder, ".coverage.*")):
            shutil.copyfile(path, os.path.join(data_dir, f".coverage.merge{i}-{os.path.basename(path)}"))
            copied += 1
    if not copied:
        raise FileNotFoundError(f"no coverage data in {', '.join(data_dirs)}")
    ok, text = combine_and_report(rc, fail_under, python)
    with open(os.path.join(out_dir, "coverage-report.txt"), "w") as f:
        f.write(text + "\n")
    return ok, text


def _main(argv):
    import argparse

    p = argparse.ArgumentParser(prog="rank_coverage.py")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("install-pth", help="install the coverage start-up hook into this interpreter's venv")
    r = sub.add_parser("rcfile", help="write DIR/.coveragerc (data in DIR/coverage) and print its path")
    r.add_argument("dir", metavar="DIR")
    m = sub.add_parser("merge", help="combine coverage data folders into OUT and report")
    m.add_argument("out", metavar="OUT")
    m.add_argument("data_dirs", metavar="DATA_DIR", nargs="+")
    m.add_argument("--fail-under", type=float, metavar="PCT")
    args = p.parse_args(argv)
    if args.command == "install-pth":
        print(install_pth())
        return 0
    if args.command == "rcfile":
        print(write_rcfile(args.dir))
        return 0
    ok, text = merge(args.out, args.data_dirs, args.fail_under)
    print(text)
    print(f"coverage report: {os.path.join(args.out, 'coverage-report.txt')} "
          f"(XML: {os.path.join(args.out, 'coverage.xml')})")
    if not ok:
        print(f"COVERAGE FAILED (threshold {args.fail_under}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
