# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/apply_patch.sh: applies the series (git am) or the single patch, its rows in each PR's own diff,
all or nothing, and says what fits on a mismatch.

Trees are checkout-like (``test/patch/checkout_tree.py``: python/ from the installed wheels in
``.venv-test/paddle-<version>``, this project's stand-ins for upstream's test/ files, the release's test
base, no generator unless a test writes one); tests skip with the reason when a venv is missing. The
committed patches: the 3.3.1 series and the 2.6.2 single patch.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import checkout_tree
from checkout_tree import FLEET, make_patch

SCRIPT = os.path.join(ROOT, "tools", "apply_patch.sh")
SERIES = make_patch.series_dir("3.3.1")
SINGLE = make_patch.patch_path("2.6.2")
CSV = f"{FLEET}/testslist.csv"


def tree_for(version, path):
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    tree = str(path / f"Paddle-{version}")
    try:
        checkout_tree.build(venv, tree)
    except make_patch.PatchError as e:
        pytest.skip(f"Paddle {version} wheel not installed: {e}")
    return tree


def apply(*args, **env):
    return subprocess.run(
        ["bash", SCRIPT, *args], capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable, **env)
    )


def state(tree):
    """Everything git sees in the tree: unchanged means the same string."""
    return make_patch.git(tree, "rev-parse", "HEAD") + make_patch.git(
        tree, "status", "--porcelain", "--untracked-files=all") + make_patch.git(tree, "diff")


def commit(tree, message):
    make_patch.git(tree, "add", "-A")
    make_patch.git(tree, "commit", "-qm", message)


def add_generator(tree, text):
    """Commit ``text`` as the tree's ``tools/gen_ut_cmakelists.py``."""
    os.makedirs(os.path.join(tree, "tools"), exist_ok=True)
    with open(os.path.join(tree, "tools", "gen_ut_cmakelists.py"), "w") as f:
        f.write(text)
    commit(tree, "a generator")


def rows():
    return "".join(r + "\n" for r in make_patch.testslist_rows())


@pytest.mark.parametrize("version,patch", [("3.3.1", SERIES), ("2.6.2", SINGLE)])
def test_committed_patch_applies_with_its_rows(version, patch, tmp_path):
    tree = tree_for(version, tmp_path)
    before = checkout_tree.snapshot(tree)
    head = make_patch.git(tree, "rev-parse", "HEAD").strip()
    proc = apply(tree, patch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "applied" in proc.stdout
    if os.path.isdir(patch):  # one commit per PR, the titles as Paddle's PRs have them, each with its rows
        titles = make_patch.git(tree, "log", "--format=%s", f"{head}..HEAD").splitlines()[::-1]
        assert titles == [pr["title"] for pr in make_patch.patch_series.PRS]
        assert make_patch.git(tree, "status", "--porcelain") == ""
        for sha in make_patch.git(tree, "log", "--format=%H", f"{head}..HEAD").split():
            files = make_patch.git(tree, "show", "--name-only", "--format=", sha).split()
            drivers = [f for f in files if os.path.basename(f).startswith("test_")]
            assert (CSV in files) == bool(drivers), (sha, files)  # a PR registers the drivers it adds
    else:
        make_patch.git(tree, "apply", "--reverse", "--check", patch)  # fully applied
    after = checkout_tree.snapshot(tree)
    assert after[CSV].decode() == before[CSV].decode() + rows()
    for rel in checkout_tree.UPSTREAM_FILES[:2]:
        assert after[rel] == before[rel], rel
    assert after[f"{FLEET}/CMakeLists.txt"] == before[f"{FLEET}/CMakeLists.txt"]  # no generator in the tree
    assert (f"the tree has no tools/gen_ut_cmakelists.py, so {FLEET}/CMakeLists.txt is unchanged; run Paddle's "
            f"generator in the tree: python3 tools/gen_ut_cmakelists.py -f {CSV}") in proc.stdout
    assert f"registered in {CSV}:\n" in proc.stdout


def test_no_register_is_plain_git_am_or_git_apply(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    add_generator(tree, "import sys\nsys.exit('never run with --no-register')\n")
    proc = apply("--no-register", tree, SERIES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert make_patch.git(tree, "status", "--porcelain") == "" and "registered" not in proc.stdout
    single = tree_for("2.6.2", tmp_path / "single")
    before = checkout_tree.snapshot(single)[CSV].decode()
    proc = apply("--no-register", single, SINGLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checkout_tree.snapshot(single)[CSV].decode() == before + rows()  # the rows are in the diff


@pytest.mark.parametrize("version,patch", [("3.3.1", SERIES), ("2.6.2", SINGLE)])
def test_failing_generator_leaves_the_tree_as_it_was(version, patch, tmp_path):
    tree = tree_for(version, tmp_path)
    add_generator(tree, "import sys\nsys.exit('generator broke')\n")
    before = state(tree)
    proc = apply(tree, patch)
    assert proc.returncode == 1
    assert "registering the tests failed" in proc.stderr and "the tree is as it was" in proc.stderr
    assert "generator broke" in proc.stderr
    assert state(tree) == before


# A stand-in for upstream's generator: run in the tree with -f LIST, it adds an entry for each row
# not in the CMakeLists.txt beside LIST yet, unformatted as upstream's writes it.
RAW_GENERATOR = """
import csv, os, re, sys
listed = sys.argv[sys.argv.index("-f") + 1]
path = os.path.join(os.path.dirname(listed), "CMakeLists.txt")
text = open(path).read()
for row in list(csv.reader(open(listed)))[1:]:
    if not re.search(rf"\\b{row[0]}\\b", text):
        text += f'if(LOCAL_ALL_ARCH AND LOCAL_ALL_PLAT)\\nbash_test_modules(\\n{row[0]}\\nSTART_BASH\\n{row[5]}\\nENVS\\n"{row[8]}")\\nendif()\\n'
open(path, "w").write(text)
"""


def test_trees_generator_regenerates_into_each_prs_commit(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    add_generator(tree, RAW_GENERATOR)
    head = make_patch.git(tree, "rev-parse", "HEAD").strip()
    before = checkout_tree.snapshot(tree)[f"{FLEET}/CMakeLists.txt"].decode()
    proc = apply(tree, SERIES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "regenerated test/collective/fleet/CMakeLists.txt with the tree's tools/gen_ut_cmakelists.py" in proc.stdout
    assert "registered in test/collective/fleet/testslist.csv and CMakeLists.txt:" in proc.stdout
    assert "pre-commit run cmake-format --files test/collective/fleet/CMakeLists.txt" in proc.stdout
    assert make_patch.git(tree, "status", "--porcelain") == ""
    with open(os.path.join(tree, FLEET, "CMakeLists.txt")) as f:
        after = f.read()
    assert after.startswith(before)  # upstream's entries as they were
    for row in make_patch.testslist_rows():
        assert re.search(rf"\bbash_test_modules\(\s+{row.split(',')[0]}\s", after[len(before) :])
    for sha in make_patch.git(tree, "log", "--format=%H", f"{head}..HEAD").split():
        files = make_patch.git(tree, "show", "--name-only", "--format=", sha).split()
        assert (f"{FLEET}/CMakeLists.txt" in files) == (CSV in files), files


@pytest.mark.parametrize("version,patch", [("3.3.1", SERIES), ("2.6.2", SINGLE)])
def test_a_list_that_ends_otherwise_gets_the_rows_appended(version, patch, tmp_path):
    """The rows' hunk needs the list the patch was made against; at another commit of Paddle the list ends
    otherwise: the PR is applied without that hunk and its rows appended, in the same commit."""
    tree = tree_for(version, tmp_path)
    with open(os.path.join(tree, CSV), "a") as f:
        f.write("test_a_later_upstream_row,,,120,DIST,../../legacy_test/dist_test.sh,2,,PYTHONPATH=../..,\n")
    commit(tree, "a later commit of the list")
    listed = checkout_tree.snapshot(tree)[CSV].decode()
    head = make_patch.git(tree, "rev-parse", "HEAD").strip()
    proc = apply(tree, patch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "its rows' hunk did not fit" in proc.stdout
    assert checkout_tree.snapshot(tree)[CSV].decode() == listed + rows()
    if os.path.isdir(patch):
        assert make_patch.git(tree, "status", "--porcelain") == ""
        assert len(make_patch.git(tree, "log", "--format=%H", f"{head}..HEAD").split()) == len(make_patch.PR_KEYS)


def test_the_committed_patch_is_chosen_when_none_is_given(tmp_path):
    proc = apply(tree_for("2.6.2", tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using patches/paddle-v2.6.2-stage1-broadcast-overlap.patch (the committed patch that applies" in proc.stdout
    proc = apply(tree_for("3.3.1", tmp_path / "b"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using patches/3.3.1/ (the committed patch that applies" in proc.stdout


@pytest.mark.parametrize("version,other,patch", [("3.3.1", "2.6.2", SINGLE), ("2.6.2", "3.3.1", SERIES)])
def test_wrong_version_changes_nothing_and_names_the_tag_to_check_out(version, other, patch, tmp_path):
    tree = tree_for(version, tmp_path)
    before = state(tree)
    proc = apply(tree, patch)
    assert proc.returncode == 1
    assert state(tree) == before
    assert f"does not apply to {tree}; nothing was changed. Check out the matching tag (v{other}: " in proc.stderr
    assert f"make_patch.py --paddle-src {tree} --series" in proc.stderr
    shown = f"patches/{other}/ says:\n  000" if os.path.isdir(patch) else f"{os.path.basename(patch)} says:\n  "
    assert shown in proc.stderr


def test_a_second_application_changes_nothing(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    assert apply(tree, SERIES).returncode == 0
    before = state(tree)
    for args in ((tree, SERIES), (tree,)):
        proc = apply(*args)
        assert proc.returncode == 1
        assert "already exists in index" in proc.stderr  # git apply's own message
        assert state(tree) == before
    assert "no committed patch in patches/ applies" in proc.stderr and "v2.6.2 or v3.3.1: " in proc.stderr


def test_usage_errors(tmp_path):
    assert apply().returncode == 2
    assert apply(str(tmp_path / "missing")).returncode == 2
    proc = apply(str(tmp_path))
    assert proc.returncode == 2 and "no python/paddle folder" in proc.stderr


def test_a_tree_naming_its_test_base_otherwise_is_told_to_generate(tmp_path):
    """The committed 3.3.1 series imports TestMultipleAccelerators; a tree whose test base is
    TestMultipleGpus (2.6's name) is refused, and the series made for that tree follows its name."""
    tree = tree_for("3.3.1", tmp_path)
    legacy = os.path.join(tree, make_patch.LEGACY_BASE)
    with open(legacy, "w") as f:
        f.write("import unittest\n\n\nclass TestMultipleGpus(unittest.TestCase):\n"
                "    def run_mnist_2gpu(self, target_file_name):\n        pass\n")
    commit(tree, "another release's test base")
    before = state(tree)
    proc = apply(tree, SERIES)
    assert proc.returncode == 1
    assert state(tree) == before
    assert "use TestMultipleAccelerators, which this tree's" in proc.stderr
    assert f"make_patch.py --paddle-src {tree}" in proc.stderr
    out = tmp_path / "for-tree"
    gen = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "make_patch.py"), "--paddle-src", tree, "--series", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    text = "".join(p.read_text() for p in sorted(out.iterdir()))
    assert "+from legacy_test.test_parallel_dygraph_dataparallel import TestMultipleGpus\n" in text
    assert "run_mnist_2accelerators" not in text
    proc = apply(tree, str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
