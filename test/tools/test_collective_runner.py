# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/collective_runner.py and tools/run_collective_tests.sh without Paddle: selection, the
pytest plugin (requirements, per-test timeout, row envs, log folders), and the cheap commands
that must answer without building a venv."""

pytest_plugins = ["pytester"]

import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import collective_runner  # noqa: E402

SUPPORTED = "2.6.2 3.0.0 3.1.0 3.1.1 3.2.0 3.2.1 3.2.2 3.3.0 3.3.1"


HEADER = "name,os,arch,timeout,run_type,launcher,num_port,run_serial,envs,conditions\n"


def write_list(folder, *lines):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "testslist.csv").write_text(HEADER + "".join(line + "\n" for line in lines))
    return str(folder / "testslist.csv")


def test_select_with_exclude(tmp_path):
    rows = collective_runner.read_rows([write_list(tmp_path, *(f"{n},,,60,DIST,x.sh,2,1,," for n in (
        "test_a_overlap", "test_b_fault", "test_c_overlap")))])
    names = lambda rs: [r.name for r in rs.values()]  # noqa: E731
    assert names(collective_runner.select(rows, "overlap")) == ["test_a_overlap", "test_c_overlap"]
    assert names(collective_runner.select(rows, None, "^test_b_fault$")) == ["test_a_overlap", "test_c_overlap"]
    assert names(collective_runner.select(rows, "test_", "_c_")) == ["test_a_overlap", "test_b_fault"]
    assert list(rows) == [str(tmp_path / f"{n}.py") for n in ("test_a_overlap", "test_b_fault", "test_c_overlap")]


def test_a_name_in_two_lists_is_refused(tmp_path):
    lists = [write_list(tmp_path / f, "test_same,,,60,DIST,x.sh,2,1,,") for f in ("one", "two")]
    with pytest.raises(ValueError, match="test_same is listed in both"):
        collective_runner.read_rows(lists)


DRIVERS = {
    # (row cells after the name, driver body)
    "test_fake_pass": (",,,5,DIST,x.sh,2,1,FAKE_ROW_ENV=set_by_row;PYTHONPATH=../..,", """
        import os, unittest
        class T(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                cls.seen = os.environ.get("FAKE_ROW_ENV")
            def test_row_env_and_log_folder(self):
                assert self.seen == "set_by_row"
                assert os.environ["PADDLE_OVERLAY_RUN_DIR"].endswith("test_fake_pass")
                assert os.environ.get("PYTHONPATH") != "../.."
    """),
    "test_fake_gpu": (",,GPU,60,DIST,x.sh,2,1,,WITH_NCCL", """
        def test_never_runs_here():
            raise AssertionError("a GPU row ran on the CPU")
    """),
    "test_fake_hang": (",,,2,DIST,x.sh,2,1,,", """
        import time
        def test_hangs():
            time.sleep(60)
    """),
}


def test_plugin_skips_unmet_rows_times_out_per_test_and_sets_row_envs(tmp_path, pytester, monkeypatch):
    import textwrap

    rows = collective_runner.read_rows([write_list(tmp_path, *(name + cells for name, (cells, _) in DRIVERS.items()))])
    for name, (_, body) in DRIVERS.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.delenv("FAKE_ROW_ENV", raising=False)
    before = dict(os.environ)
    plugin = collective_runner.CollectivePlugin(rows, "cpu", collective_runner.testslist.platform_facts(),
                                                str(tmp_path / "runs"), "fake header")
    result = pytester.runpytest_inprocess("-v", "-rs", *rows, plugins=[plugin])
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    out = result.stdout.str()
    assert "fake header" in out
    assert "needs arch GPU, running on cpu; condition WITH_NCCL is false here" in out
    assert "Timeout (>2.0s) from pytest-timeout" in out
    assert "test_fake_hang.py::test_hangs: Failed: Timeout (>2.0s) from pytest-timeout." in out
    assert f"     logs: {tmp_path / 'runs' / 'test_fake_hang'}" in out
    assert dict(os.environ) == before
    assert not plugin.all_skipped


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


def run_script(clone, *args, env=None, timeout=120):
    full_env = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", str(clone / "tools" / "run_collective_tests.sh"), *args],
                          capture_output=True, text=True, env=full_env, timeout=timeout)


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
        (["--paddle"], 2, "argument --paddle: expected one argument"),
        (["--coverage", "--cov-fail-under"], 2, "expected one argument"),
    ],
)
def test_cheap_commands_answer_without_a_venv(fresh_clone, args, rc, expected):
    out = run_script(fresh_clone, *args)
    assert out.returncode == rc, out.stdout + out.stderr
    assert expected in " ".join((out.stdout + out.stderr).split())  # argparse wraps the help
    assert not (fresh_clone / ".venv-test").exists()


def test_failed_venv_build_leaves_nothing(fresh_clone):
    no_wheels = fresh_clone / "no-wheels"
    no_wheels.mkdir(exist_ok=True)
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(no_wheels)}
    out = run_script(fresh_clone, "--paddle", "3.0.0", "--venv-only", env=env, timeout=600)  # venv + pip: slow when loaded
    assert out.returncode != 0
    assert "pip could not install paddlepaddle==3.0.0 protobuf<6 for Paddle 3.0.0" in out.stderr
    assert "nothing was kept" in out.stderr
    assert os.listdir(fresh_clone / ".venv-test") == []


def test_sigterm_after_paddle_is_imported_ends_the_session_through_its_cleanup(fresh_clone, tmp_path):
    """Importing Paddle replaces the SIGTERM handler at C level (it aborts the process): the runner
    installs its own again after the import, so a launch in progress still kills its tree."""
    pytest.importorskip("paddle")
    mark = tmp_path / "mark"
    folder = fresh_clone / "test" / "fake_sigterm"
    write_list(folder, "test_fake_sigterm,,,300,DIST,x.sh,2,1,,")
    (folder / "test_fake_sigterm.py").write_text(
        "import os, time\n"
        "def test_sleeps_until_terminated():\n"
        f"    open({str(mark)!r} + '.started', 'w').close()\n"
        "    try:\n"
        "        time.sleep(300)\n"
        "    finally:  # what a launch's own cleanup does on the way out\n"
        f"        open({str(mark)!r} + '.cleaned-up', 'w').close()\n")
    cmd = [sys.executable, str(fresh_clone / "tools" / "collective_runner.py"), "-k", "^test_fake_sigterm$",
           "--run-dir", str(tmp_path / "runs")]
    runner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(1200):  # readiness: the test has started (Paddle imported), however slow the machine
            if os.path.exists(f"{mark}.started") or runner.poll() is not None:
                break
            time.sleep(0.1)
        assert os.path.exists(f"{mark}.started"), runner.communicate()[0]
        runner.terminate()
        out = runner.communicate(timeout=120)[0]
    finally:
        runner.kill()
    assert os.path.exists(f"{mark}.cleaned-up"), out
    assert runner.returncode == 2 and "KeyboardInterrupt: signal 15" in out, out
