# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/paddle_format.py (tools/format.sh): the patch's files pass Paddle's formatting.

Fails when black 23.3.0 or isort 5.12.0 (Paddle's settings) would reformat a file the patch
adds or changes, or a file it adds lacks upstream's Apache-2.0 header. The tool itself is
checked against the black and isort command lines, and the spliced Paddle modules against
the formatter's view of upstream's own files.
"""

import collections
import difflib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_patch  # noqa: E402
import paddle_format  # noqa: E402

SAMPLE = '''# Copyright (c) 2026 someone. Licensed under the Apache License, Version 2.0.
"""Sample."""
import sys
import paddle
import numpy as np
from paddle.distributed import fleet
from broadcast_overlap_checker import BroadcastWaitChecker
x = {"a": 'b', 'c': [1,2,3]}
def f(a_very_long_argument_name_one, a_very_long_argument_name_two, another_one=None):
    return np, sys, paddle, fleet, BroadcastWaitChecker
'''


def test_every_file_of_the_patch_is_formatted_and_has_the_header():
    changed = paddle_format.run(make_patch.patch_source_files(), fix=False)
    assert changed == [], f"run: bash tools/format.sh --fix (would reformat {changed})"


def test_tool_matches_the_black_and_isort_command_lines(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    # python -m: a venv moved into place after pip ran has scripts whose shebang names the old path
    subprocess.run([sys.executable, "-m", "isort", "-q", "--profile", "black", "-l", "80", "-p", "paddle",
                    str(path)], cwd=tmp_path, check=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "black", "-q", "-l", "80", "-S", str(path)], cwd=tmp_path, check=True)
    assert paddle_format.formatted(SAMPLE, "sample.py", header=False) == path.read_text()


def test_header_is_replaced_keeping_the_year_or_inserted():
    out = paddle_format.with_header(SAMPLE)
    assert out.startswith("# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.\n#\n# Licensed")
    assert paddle_format.has_header(out) and not paddle_format.has_header(SAMPLE)
    assert out.endswith(SAMPLE.split("\n", 1)[1]) and "someone" not in out
    bare = paddle_format.with_header("import os\n")
    assert bare.endswith("limitations under the License.\n\nimport os\n") and paddle_format.has_header(bare)
    assert paddle_format.with_header(out) == out


def test_check_and_fix_modes(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    script = os.path.join(ROOT, "tools", "format.sh")
    env = dict(os.environ, PYTHON=sys.executable)
    check = subprocess.run(["bash", script, str(path)], capture_output=True, text=True, env=env)
    assert check.returncode == 1 and f"would reformat {path}" in check.stdout
    assert path.read_text() == SAMPLE
    fix = subprocess.run(["bash", script, "--fix", str(path)], capture_output=True, text=True, env=env)
    assert fix.returncode == 0 and f"reformatted {path}" in fix.stdout
    again = subprocess.run(["bash", script, "--check", str(path)], capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stdout + again.stderr


def changed_lines(text):
    """Lines the formatter removes or adds, as a sorted list (a multiset)."""
    new = paddle_format.formatted(text, "<x>", header=False, fast=True)
    diff = difflib.ndiff(text.splitlines(), new.splitlines())
    return sorted(line for line in diff if line[:2] in ("- ", "+ "))


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_spliced_modules_add_no_formatting_change_of_their_own(version, tmp_path):
    """Every line the formatter would change in a spliced file, it would change in upstream's
    own file too (3.x formats with another tool, so upstream's 3.3.1 files are not all black-23
    clean; the splice may replace some of those lines)."""
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    try:
        pkg = make_patch.paddle_package_dir(venv)
    except make_patch.PatchError as e:
        pytest.skip(f"Paddle {version} wheel not installed: {e}")
    tree = str(tmp_path / "tree")
    make_patch.layout_wheel_tree(pkg, tree)
    files = make_patch.patched_files(tree)
    for name in sorted({name for name, _ in make_patch.SPLICED}):  # a module spliced with two classes once
        rel = f"{make_patch.TREE_OPT_DIR}/{name}"
        ours = collections.Counter(changed_lines(files[rel]))
        upstream = collections.Counter(changed_lines(make_patch._read(os.path.join(tree, rel))))
        assert ours - upstream == collections.Counter(), rel
