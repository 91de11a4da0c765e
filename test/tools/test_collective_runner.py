# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/collective_runner.py and tools/run_collective_tests.sh without Paddle: the summary a
person reads, selection, and the cheap commands that must answer without building a venv."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import collective_runner  # noqa: E402
from testslist import parse_row  # noqa: E402

SUPPORTED = "2.6.2 3.0.0 3.1.0 3.1.1 3.2.0 3.2.1 3.2.2 3.3.0 3.3.1"


def row(name):
    return parse_row([name, "", "", "60", "DIST", "x.sh", "2", "1", "", ""])


def test_failure_summary_is_one_short_line_then_the_log_folder(capsys):
    reason = ("test_launch_0: collective launch of a.py failed: rank 1 failed first (sys.exit(3)); "
              + "x" * 300 + "\nlogs: /somewhere\n----- rank 1 -----\nTraceback ...")
    results = [
        dict(label="test_a", paddle="3.3.1", outcome="FAIL", note=reason, out_dir="/runs/paddle-3.3.1/test_a"),
        dict(label="test_b", paddle="3.3.1", outcome="PASS", note="2 passed", out_dir="/runs/paddle-3.3.1/test_b"),
    ]
    collective_runner.print_failures(results)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "",
        "1 failed:",
        "FAIL test_a (paddle 3.3.1): " + collective_runner.first_line(reason),
        "     logs: /runs/paddle-3.3.1/test_a",
    ]
    assert len(collective_runner.first_line(reason)) == collective_runner.NOTE_WIDTH
    assert collective_runner.first_line(reason).endswith("...")
    assert collective_runner.first_line("\n  short reason  \nmore") == "short reason"


def test_select_rows_with_exclude():
    rows = [row("test_a_overlap"), row("test_b_fault"), row("test_c_overlap")]
    names = lambda rs: [r.name for r in rs]  # noqa: E731
    assert names(collective_runner.select_rows(rows, "overlap")) == ["test_a_overlap", "test_c_overlap"]
    assert names(collective_runner.select_rows(rows, None, "^test_b_fault$")) == ["test_a_overlap", "test_c_overlap"]
    assert names(collective_runner.select_rows(rows, "test_", "_c_")) == ["test_a_overlap", "test_b_fault"]


def test_a_name_in_two_lists_is_refused(tmp_path):
    header = "name,os,arch,timeout,run_type,launcher,num_port,run_serial,envs,conditions\n"
    line = "test_same,,,60,DIST,x.sh,2,1,,\n"
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "testslist.csv").write_text(header + line)
    with pytest.raises(ValueError, match="test_same is listed in both"):
        collective_runner.read_rows([str(tmp_path / "one" / "testslist.csv"), str(tmp_path / "two" / "testslist.csv")])


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory):
    """What a fresh clone holds that the scripts read (no venv, no outputs)."""
    dest = tmp_path_factory.mktemp("clone")
    shutil.copytree(os.path.join(ROOT, "tools"), dest / "tools",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "paddle_overlay"), dest / "paddle_overlay",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), dest / "pyproject.toml")
    for folder, _, files in os.walk(os.path.join(ROOT, "test")):
        if "testslist.csv" in files:
            target = dest / os.path.relpath(folder, ROOT)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(folder, "testslist.csv"), target / "testslist.csv")
    return dest


def run_script(clone, *args, env=None):
    full_env = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", str(clone / "tools" / "run_collective_tests.sh"), *args],
                          capture_output=True, text=True, env=full_env, timeout=120)


@pytest.mark.parametrize(
    "args, rc, expected",
    [
        (["--help"], 0, f"one of: {SUPPORTED}"),
        (["--list"], 0, "test_dygraph_sharding_stage1_broadcast_overlap"),
        (["--bogus"], 2, "unrecognized arguments: --bogus"),
        (["-k", "nosuchtest"], 2, "no test matches -k 'nosuchtest'; the tests are: "),
        (["-k", "("], 2, "-k '(' is not a regular expression"),
        (["--paddle", "9.9.9"], 2, f"Paddle 9.9.9 is not a supported release; use one of: {SUPPORTED}"),
        (["--paddle", "3.3.1,2.6.1"], 2, "Paddle 2.6.1 is not a supported release"),
        (["--paddle"], 2, "--paddle needs a version"),
        (["--coverage", "--cov-fail-under"], 2, "expected one argument"),
    ],
)
def test_cheap_commands_answer_without_a_venv(fresh_clone, args, rc, expected):
    out = run_script(fresh_clone, *args)
    assert out.returncode == rc, out.stdout + out.stderr
    assert expected in out.stdout + out.stderr
    assert not (fresh_clone / ".venv-test").exists()


def test_failed_venv_build_leaves_nothing(fresh_clone):
    no_wheels = fresh_clone / "no-wheels"
    no_wheels.mkdir(exist_ok=True)
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(no_wheels)}
    out = run_script(fresh_clone, "--paddle", "3.0.0", "--venv-only", env=env)
    assert out.returncode != 0
    assert "pip could not install paddlepaddle==3.0.0 protobuf<6 for Paddle 3.0.0" in out.stderr
    assert "nothing was kept" in out.stderr
    assert os.listdir(fresh_clone / ".venv-test") == []
