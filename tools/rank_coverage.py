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


if __name__ == "__main__":
    if sys.argv[1:] == ["install-pth"]:
        print(install_pth())
    else:
        sys.exit("usage: python tools/rank_coverage.py install-pth")
