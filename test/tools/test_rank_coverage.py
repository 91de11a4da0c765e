# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/rank_coverage.py merge: data of separate processes (ranks, releases, the in-process
tests) becomes one figure, with the threshold applied to it."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import rank_coverage  # noqa: E402

PACKAGE = '''def half_a(x):
    if x:
        return 1
    return 2


def half_b(x):
    if x:
        return 3
    return 4
'''


def record(tmp_path, name, call):
    """Run ``call`` on a stand-in ``paddle_overlay`` package under coverage; return the data folder."""
    rc = rank_coverage.write_rcfile(str(tmp_path / name))
    script = tmp_path / "src" / f"run_{name}.py"
    script.write_text(f"import paddle_overlay as p\n{call}\n")
    subprocess.run([sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", str(script)],
                   cwd=tmp_path / "src", check=True, capture_output=True)
    return str(tmp_path / name / "coverage")


def test_merge_reports_one_figure_over_every_process(tmp_path):
    (tmp_path / "src" / "paddle_overlay").mkdir(parents=True)
    (tmp_path / "src" / "paddle_overlay" / "__init__.py").write_text(PACKAGE)
    first = record(tmp_path, "ranks", "p.half_a(0); p.half_a(1)")
    second = record(tmp_path, "unit", "p.half_b(0); p.half_b(1)")

    ok, text = rank_coverage.merge(str(tmp_path / "one"), [first], fail_under=100)
    assert not ok and "TOTAL" in text  # half the package: under the threshold
    ok, text = rank_coverage.merge(str(tmp_path / "both"), [first, second], fail_under=100)
    assert ok, text
    assert text.splitlines()[-1].split()[-1] == "100.0%"
    with open(tmp_path / "both" / "coverage-report.txt") as f:
        assert f.read() == text + "\n"
    assert os.path.isfile(tmp_path / "both" / "coverage.xml")
