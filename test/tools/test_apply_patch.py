# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/apply_patch.sh: applies and registers all or nothing, and says what fits on a mismatch.

Trees are checkout-like (``test/patch/checkout_tree.py``: python/ from the installed wheels in
``.venv-test/paddle-<version>``, this project's stand-ins for upstream's test/ files and
generator); tests skip with the reason when a venv is missing.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test", "patch"))
import checkout_tree  # noqa: E402
from checkout_tree import FLEET, make_patch  # noqa: E402

SCRIPT = os.path.join(ROOT, "tools", "apply_patch.sh")
PATCH = {v: make_patch.patch_path(v) for v in ("2.6.2", "3.3.1")}


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
    return make_patch.git(tree, "status", "--porcelain", "--untracked-files=all") + make_patch.git(tree, "diff")


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_fitting_patch_is_applied_and_its_tests_registered(version, tmp_path):
    tree = tree_for(version, tmp_path)
    before = checkout_tree.snapshot(tree)
    proc = apply(tree, PATCH[version])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "applied" in proc.stdout
    make_patch.git(tree, "apply", "--reverse", "--check", PATCH[version])  # fully applied
    after = checkout_tree.snapshot(tree)
    rows = make_patch.testslist_rows()
    csv_rel = f"{FLEET}/testslist.csv"
    assert after[csv_rel].decode() == before[csv_rel].decode() + "".join(r + "\n" for r in rows)
    for rel in checkout_tree.UPSTREAM_FILES[:2]:
        assert after[rel] == before[rel], rel
    cmake_rel = f"{FLEET}/CMakeLists.txt"
    assert after[cmake_rel].startswith(before[cmake_rel]) and len(after[cmake_rel]) > len(before[cmake_rel])
    changed = sorted(line[3:] for line in make_patch.git(tree, "status", "--porcelain").splitlines() if line[:2] == " M")
    assert changed == sorted([cmake_rel, csv_rel] + sorted({f"{make_patch.TREE_OPT_DIR}/{n}" for n, _ in make_patch.SPLICED}))


def test_no_register_is_plain_git_apply(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    before = checkout_tree.snapshot(tree)
    proc = apply("--no-register", tree, PATCH["3.3.1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checkout_tree.snapshot(tree) == before
    make_patch.git(tree, "apply", "--reverse", "--check", PATCH["3.3.1"])


def test_failing_generator_leaves_the_tree_as_it_was(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    with open(os.path.join(tree, "tools", "gen_ut_cmakelists.py"), "w") as f:
        f.write("import sys\nsys.exit('generator broke')\n")
    make_patch.git(tree, "commit", "-qam", "broken generator")
    before = state(tree)
    proc = apply(tree, PATCH["3.3.1"])
    assert proc.returncode == 1
    assert "registering the tests failed; the tree is as it was" in proc.stderr
    assert "generator broke" in proc.stderr
    assert state(tree) == before


def test_tree_without_generator_uses_ours(tmp_path):
    tree = tree_for("2.6.2", tmp_path)
    make_patch.git(tree, "rm", "-q", "tools/gen_ut_cmakelists.py", "tools/testslist.py")
    make_patch.git(tree, "commit", "-qm", "no generator")
    proc = apply(tree, PATCH["2.6.2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the tree has no tools/gen_ut_cmakelists.py" in proc.stdout
    with open(os.path.join(tree, FLEET, "CMakeLists.txt")) as f:
        text = f.read()
    for row in make_patch.testslist_rows():
        assert f"    {row.split(',')[0]}\n" in text


# A generator that writes upstream's unformatted text, as upstream's gen_ut_cmakelists.py does.
RAW_GENERATOR = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import formatted_gen as g
from testslist import read_testslist
csv = sys.argv[sys.argv.index("-f") + 1]
rows = read_testslist(csv)
path = os.path.join(os.path.dirname(csv), "CMakeLists.txt")
open(path, "w").write(g.raw_text(rows, open(path).read()))
"""


@pytest.mark.parametrize("with_config", [True, False])
def test_unformatted_generator_output_is_cmake_formatted_with_the_trees_config(with_config, tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    tools = os.path.join(tree, "tools")
    os.rename(os.path.join(tools, "gen_ut_cmakelists.py"), os.path.join(tools, "formatted_gen.py"))
    with open(os.path.join(tools, "gen_ut_cmakelists.py"), "w") as f:
        f.write(RAW_GENERATOR)
    if not with_config:
        os.remove(os.path.join(tree, ".cmake-format.py"))
    make_patch.git(tree, "add", "-A")
    make_patch.git(tree, "commit", "-qm", "generator writes raw text")
    before = checkout_tree.snapshot(tree)[f"{FLEET}/CMakeLists.txt"]
    proc = apply(tree, PATCH["3.3.1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(tree, FLEET, "CMakeLists.txt"), "rb") as f:
        after = f.read()
    fresh = subprocess.run(
        [sys.executable, "tools/formatted_gen.py", "--check", "-f", f"{FLEET}/testslist.csv"], cwd=tree
    )
    if with_config:
        assert fresh.returncode == 0  # formatted: what the formatting generator writes
        assert after.startswith(before)  # upstream's entries as they were
    else:
        assert fresh.returncode == 1 and "bash_test_modules(\ntest_dygraph" in after.decode()
        assert "the tree has no .cmake-format.py" in proc.stdout


def test_patch_is_chosen_when_not_given(tmp_path):
    tree = tree_for("2.6.2", tmp_path)
    proc = apply(tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using patches/paddle-v2.6.2-stage1-broadcast-overlap.patch" in proc.stdout


@pytest.mark.parametrize("version,other", [("3.3.1", "2.6.2"), ("2.6.2", "3.3.1")])
def test_wrong_version_changes_nothing_and_names_the_tag_to_check_out(version, other, tmp_path):
    tree = tree_for(version, tmp_path)
    before = state(tree)
    proc = apply(tree, PATCH[other])
    assert proc.returncode == 1
    assert state(tree) == before
    assert f"does not apply to {tree}; nothing was changed. Check out the matching tag (v{other}: " in proc.stderr
    assert f"git apply --check patches/paddle-v{other}-stage1-broadcast-overlap.patch says:\n  error: " in proc.stderr
    assert f"make_patch.py --paddle-src {tree}" in proc.stderr


def test_no_committed_patch_fitting_names_every_tag(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    assert apply(tree, PATCH["3.3.1"]).returncode == 0
    before = state(tree)
    for args in ((tree, PATCH["3.3.1"]), (tree,)):  # a second application changes nothing either
        proc = apply(*args)
        assert proc.returncode == 1
        assert "already exists in working directory" in proc.stderr  # git apply's own message
        assert state(tree) == before
    assert "no single committed patch in patches/ applies" in proc.stderr and "(v2.6.2 or v3.3.1: " in proc.stderr


def test_usage_errors(tmp_path):
    assert apply().returncode == 2
    assert apply(str(tmp_path / "missing")).returncode == 2
    proc = apply(str(tmp_path))
    assert proc.returncode == 2 and "no python/paddle folder" in proc.stderr


def test_checkout_naming_the_base_test_multiple_accelerators_is_told_to_generate(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    legacy = os.path.join(tree, "test", "legacy_test", "test_parallel_dygraph_dataparallel.py")
    with open(legacy, "w") as f:
        f.write("import unittest\n\n\nclass TestMultipleAccelerators(unittest.TestCase):\n    pass\n")
    make_patch.git(tree, "add", "-A")
    make_patch.git(tree, "commit", "-qm", "later Paddle's test base")
    before = state(tree)
    proc = apply(tree, PATCH["3.3.1"])
    assert proc.returncode == 1
    assert state(tree) == before
    assert "does not define (a later Paddle names it" in proc.stderr
    assert f"make_patch.py --paddle-src {tree}" in proc.stderr
    # the patch made for that tree uses the newer name and applies
    out = tmp_path / "for-tree.patch"
    gen = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "make_patch.py"), "--paddle-src", tree, "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    assert "import (\n+    TestMultipleAccelerators,\n+)" in out.read_text()
    proc = apply(tree, str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
