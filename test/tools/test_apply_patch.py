# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/apply_patch.sh: applies the series (git am) or the single patch and registers all or nothing, and
says what fits on a mismatch.

Trees are checkout-like (``test/patch/checkout_tree.py``: python/ from the installed wheels in
``.venv-test/paddle-<version>``, this project's stand-ins for upstream's test/ files, no
generator unless a test writes one); tests skip with the reason when a venv is missing.
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
PATCH = {v: make_patch.patch_path(v) for v in ("2.6.2", "3.3.1")}
SERIES = {v: make_patch.series_dir(v) for v in ("2.6.2", "3.3.1")}


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


def add_generator(tree, text):
    """Commit ``text`` as the tree's ``tools/gen_ut_cmakelists.py``."""
    os.makedirs(os.path.join(tree, "tools"), exist_ok=True)
    with open(os.path.join(tree, "tools", "gen_ut_cmakelists.py"), "w") as f:
        f.write(text)
    make_patch.git(tree, "add", "-A")
    make_patch.git(tree, "commit", "-qm", "a generator")


@pytest.mark.parametrize("version,kind", [("2.6.2", "series"), ("3.3.1", "series"), ("3.3.1", "single")])
def test_fitting_patch_is_applied_and_its_tests_registered(version, kind, tmp_path):
    tree = tree_for(version, tmp_path)
    before = checkout_tree.snapshot(tree)
    head = make_patch.git(tree, "rev-parse", "HEAD").strip()
    proc = apply(tree, SERIES[version] if kind == "series" else PATCH[version])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "applied" in proc.stdout
    if kind == "series":  # one commit per PR, the titles as Paddle's PRs have them
        titles = make_patch.git(tree, "log", "--format=%s", f"{head}..HEAD").splitlines()[::-1]
        assert titles == [pr["title"] for pr in make_patch.patch_series.PRS]
        make_patch.git(tree, "diff", "--quiet", "HEAD", "--", "python")  # everything of python/ committed
    else:
        make_patch.git(tree, "apply", "--reverse", "--check", PATCH[version])  # fully applied
    after = checkout_tree.snapshot(tree)
    rows = make_patch.testslist_rows()
    csv_rel = f"{FLEET}/testslist.csv"
    assert after[csv_rel].decode() == before[csv_rel].decode() + "".join(r + "\n" for r in rows)
    for rel in checkout_tree.UPSTREAM_FILES[:2]:
        assert after[rel] == before[rel], rel
    assert after[f"{FLEET}/CMakeLists.txt"] == before[f"{FLEET}/CMakeLists.txt"]  # no generator in the tree
    assert (f"the tree has no tools/gen_ut_cmakelists.py, so {FLEET}/CMakeLists.txt is unchanged; run Paddle's "
            f"generator in the tree: python3 tools/gen_ut_cmakelists.py -f {csv_rel}") in proc.stdout
    assert f"registered in {csv_rel}:\n" in proc.stdout
    changed = sorted(line[3:] for line in make_patch.git(tree, "status", "--porcelain").splitlines() if line[:2] == " M")
    edited = sorted({make_patch.tree_path(m) for m, _ in make_patch.SPLICED})
    assert changed == sorted([csv_rel] + ([] if kind == "series" else edited))


def test_no_register_is_plain_git_am_or_git_apply(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    before = checkout_tree.snapshot(tree)
    proc = apply("--no-register", tree, SERIES["3.3.1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checkout_tree.snapshot(tree) == before
    assert make_patch.git(tree, "status", "--porcelain") == ""
    make_patch.git(tree, "apply", "--reverse", "--check", PATCH["3.3.1"])  # the series' sum
    single = tree_for("3.3.1", tmp_path / "single")
    proc = apply("--no-register", single, PATCH["3.3.1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    make_patch.git(single, "apply", "--reverse", "--check", PATCH["3.3.1"])


@pytest.mark.parametrize("kind", ["series", "single"])
def test_failing_generator_leaves_the_tree_as_it_was(kind, tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    add_generator(tree, "import sys\nsys.exit('generator broke')\n")
    before = state(tree)
    proc = apply(tree, SERIES["3.3.1"] if kind == "series" else PATCH["3.3.1"])
    assert proc.returncode == 1
    assert "registering the tests failed; the tree is as it was" in proc.stderr
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


def test_trees_generator_regenerates_and_keeps_upstreams_entries(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    add_generator(tree, RAW_GENERATOR)
    before = checkout_tree.snapshot(tree)[f"{FLEET}/CMakeLists.txt"].decode()
    proc = apply(tree, SERIES["3.3.1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "regenerating test/collective/fleet/CMakeLists.txt with the tree's tools/gen_ut_cmakelists.py" in proc.stdout
    assert "registered in test/collective/fleet/testslist.csv and CMakeLists.txt:" in proc.stdout
    assert "pre-commit run cmake-format --files test/collective/fleet/CMakeLists.txt" in proc.stdout
    with open(os.path.join(tree, FLEET, "CMakeLists.txt")) as f:
        after = f.read()
    assert after.startswith(before)  # upstream's entries as they were
    for row in make_patch.testslist_rows():
        assert re.search(rf"\bbash_test_modules\(\s+{row.split(',')[0]}\s", after[len(before) :])


def test_the_series_is_chosen_when_none_is_given(tmp_path):
    tree = tree_for("2.6.2", tmp_path)
    proc = apply(tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using patches/2.6.2/ (the committed series that applies to this tree)" in proc.stdout


@pytest.mark.parametrize("version,other", [("3.3.1", "2.6.2"), ("2.6.2", "3.3.1")])
def test_wrong_version_changes_nothing_and_names_the_tag_to_check_out(version, other, tmp_path):
    tree = tree_for(version, tmp_path)
    before = state(tree)
    proc = apply(tree, SERIES[other])
    assert proc.returncode == 1
    assert state(tree) == before
    assert f"does not apply to {tree}; nothing was changed. Check out the matching tag (v{other}: " in proc.stderr
    assert f"checking patches/{other}/ says:\n  0001-" in proc.stderr
    assert f"make_patch.py --paddle-src {tree} --series" in proc.stderr
    proc = apply(tree, PATCH[other])
    assert proc.returncode == 1 and state(tree) == before
    assert f"checking patches/paddle-v{other}-stage1-broadcast-overlap.patch says:\n  error: " in proc.stderr


def test_no_committed_series_fitting_names_every_tag(tmp_path):
    tree = tree_for("3.3.1", tmp_path)
    assert apply(tree, SERIES["3.3.1"]).returncode == 0
    before = state(tree)
    for args in ((tree, SERIES["3.3.1"]), (tree,)):  # a second application changes nothing either
        proc = apply(*args)
        assert proc.returncode == 1
        assert "already exists in index" in proc.stderr  # git apply's own message
        assert state(tree) == before
    assert "no committed series in patches/ applies" in proc.stderr and "(v2.6.2 or v3.3.1: " in proc.stderr


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
    proc = apply(tree, SERIES["3.3.1"])
    assert proc.returncode == 1
    assert state(tree) == before
    assert "does not define (a later Paddle names it" in proc.stderr
    assert f"make_patch.py --paddle-src {tree}" in proc.stderr
    # the series made for that tree uses the newer name and applies
    out = tmp_path / "for-tree"
    gen = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "make_patch.py"), "--paddle-src", tree, "--series", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    assert "import (\n+    TestMultipleAccelerators,\n+)" in "".join(p.read_text() for p in sorted(out.iterdir()))
    proc = apply(tree, str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
