# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/apply_patch.sh: applies all or nothing, and says what fits on a mismatch.

Trees are laid out from the installed wheels in ``.venv-test/paddle-<version>`` (tests
skip with the reason when a venv is missing).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_patch  # noqa: E402

SCRIPT = os.path.join(ROOT, "tools", "apply_patch.sh")
PATCH = {v: make_patch.patch_path(v) for v in ("2.6.2", "3.3.1")}


def wheel_tree(version, path):
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    try:
        pkg = make_patch.paddle_package_dir(venv)
    except make_patch.PatchError as e:
        pytest.skip(f"Paddle {version} wheel not installed: {e}")
    tree = str(path / f"Paddle-{version}")
    make_patch.layout_wheel_tree(pkg, tree)
    return tree


def apply(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)


def state(tree):
    """Everything git sees in the tree: unchanged means the same string."""
    return make_patch.git(tree, "status", "--porcelain", "--untracked-files=all") + make_patch.git(tree, "diff")


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_fitting_patch_is_applied(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    proc = apply(tree, PATCH[version])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "applied" in proc.stdout
    make_patch.git(tree, "apply", "--reverse", "--check", PATCH[version])  # fully applied


def test_patch_is_chosen_when_not_given(tmp_path):
    tree = wheel_tree("2.6.2", tmp_path)
    proc = apply(tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using patches/paddle-v2.6.2-stage1-broadcast-overlap.patch" in proc.stdout


@pytest.mark.parametrize("version,other", [("3.3.1", "2.6.2"), ("2.6.2", "3.3.1")])
def test_wrong_version_changes_nothing_and_names_the_fitting_patch(version, other, tmp_path):
    tree = wheel_tree(version, tmp_path)
    before = state(tree)
    proc = apply(tree, PATCH[other])
    assert proc.returncode == 1
    assert state(tree) == before
    assert "nothing was changed" in proc.stderr
    assert f"Paddle {version} (nearest git tag v{version})" in proc.stderr
    expect = "Paddle 3.x" if version.startswith("3") else "Paddle 2.6"
    assert expect in proc.stderr
    assert f"Patches that fit this tree (git apply --check passes):\n  patches/paddle-v{version}-" in proc.stderr


def test_second_application_says_already_applied(tmp_path):
    tree = wheel_tree("3.3.1", tmp_path)
    assert apply(tree, PATCH["3.3.1"]).returncode == 0
    before = state(tree)
    for args in ((tree, PATCH["3.3.1"]), (tree,)):
        proc = apply(*args)
        assert proc.returncode == 1
        assert "is already applied to this tree" in proc.stderr
        assert "already patched" in proc.stderr
        assert state(tree) == before


def test_checkout_with_its_own_test_files_gets_told_to_generate(tmp_path):
    tree = wheel_tree("3.3.1", tmp_path)
    fleet = os.path.join(tree, make_patch.TREE_TEST_DIR)
    os.makedirs(fleet)
    with open(os.path.join(fleet, "dygraph_group_sharded_stage1_bf16.py"), "w") as f:
        f.write("# upstream's version\n")
    before = state(tree)
    proc = apply(tree, PATCH["3.3.1"])
    assert proc.returncode == 1
    assert state(tree) == before
    assert "The python/ part of patches/paddle-v3.3.1-" in proc.stderr
    assert f"make_patch.py --paddle-src {tree}" in proc.stderr


def test_usage_errors(tmp_path):
    assert apply().returncode == 2
    assert apply(str(tmp_path / "missing")).returncode == 2
    proc = apply(str(tmp_path))
    assert proc.returncode == 2 and "no python/paddle folder" in proc.stderr
