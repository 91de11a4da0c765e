# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/format.sh: the patch's files pass Paddle's formatting, and every file it adds has upstream's header.

Fails when black 23.3.0 or isort 5.12.0 (Paddle's settings, through tools/format.sh) would reformat
a file the patch adds or changes, as of the last PR of the series and as of every earlier one (the
fences of later PRs left out), or a file it adds lacks upstream's Apache-2.0 header; the spliced
Paddle modules are checked against the formatter's view of upstream's own files.
"""

import collections
import difflib
import os
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import make_patch  # noqa: E402

FORMAT = os.path.join(ROOT, "tools", "format.sh")
# upstream's header, as Paddle's files start (any year)
HEADER = re.compile(r"# Copyright \(c\) \d{4} PaddlePaddle Authors\. All Rights Reserved\.\n" + re.escape("""\
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""))
SAMPLE = '''# Copyright (c) 2026 someone. Licensed under the Apache License, Version 2.0.
"""Sample."""
import sys
import paddle
import numpy as np
from paddle.distributed import fleet
from param_sync_checker import ParamSyncWaitChecker
x = {"a": 'b', 'c': [1,2,3]}
def f(a_very_long_argument_name_one, a_very_long_argument_name_two, another_one=None):
    return np, sys, paddle, fleet, ParamSyncWaitChecker
'''
# what black and isort with Paddle's settings make of SAMPLE: single quotes kept, paddle first party
SAMPLE_FORMATTED = '''# Copyright (c) 2026 someone. Licensed under the Apache License, Version 2.0.
"""Sample."""
import sys

import numpy as np
from param_sync_checker import ParamSyncWaitChecker

import paddle
from paddle.distributed import fleet

x = {"a": 'b', 'c': [1, 2, 3]}


def f(
    a_very_long_argument_name_one,
    a_very_long_argument_name_two,
    another_one=None,
):
    return np, sys, paddle, fleet, ParamSyncWaitChecker
'''


def format_sh(*args):
    return subprocess.run(["bash", FORMAT, *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable))


def formatted(texts):
    """{name: text} as ``tools/format.sh --fix`` leaves them (one run for all)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: os.path.join(tmp, name) for name in texts}
        for name, text in texts.items():
            with open(paths[name], "w", encoding="utf-8", newline="") as f:
                f.write(text)
        proc = format_sh("--fix", *paths.values())
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return {name: make_patch._read(path) for name, path in paths.items()}


def test_every_file_of_the_patch_is_formatted():
    proc = format_sh()
    assert proc.returncode == 0, f"run: bash tools/format.sh --fix\n{proc.stdout}{proc.stderr}"


def test_every_file_the_patch_adds_has_upstreams_header():
    added = [make_patch.overlay_path(m) for m in make_patch.NEW_MODULES]
    added += [os.path.join(make_patch.TEST_DIR, n) for n in make_patch.TEST_FILES]
    assert [os.path.relpath(p, ROOT) for p in added if not HEADER.match(make_patch._read(p))] == []
    assert not HEADER.match(SAMPLE) and HEADER.match(make_patch._read(added[0]).replace("2026", "2024", 1))


def test_check_and_fix_modes(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    check = format_sh(str(path))
    assert check.returncode == 1 and f"would reformat {path}" in check.stderr
    assert path.read_text() == SAMPLE
    fix = format_sh("--fix", str(path))
    assert fix.returncode == 0 and f"reformatted {path}" in fix.stderr
    assert path.read_text() == SAMPLE_FORMATTED
    again = format_sh("--check", str(path))
    assert again.returncode == 0, again.stdout + again.stderr


def changed_lines(text, new):
    """Lines the formatter removes or adds, as a sorted list (a multiset)."""
    return sorted(line for line in difflib.ndiff(text.splitlines(), new.splitlines()) if line[:2] in ("- ", "+ "))


def wheel_tree(version, tmp_path):
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    try:
        pkg = make_patch.paddle_package_dir(venv)
    except make_patch.PatchError as e:
        pytest.skip(f"Paddle {version} wheel not installed: {e}")
    tree = str(tmp_path / "tree")
    make_patch.layout_wheel_tree(pkg, tree)
    return tree


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_every_pr_of_the_series_is_formatted_and_its_edits_add_no_formatting_change(version, tmp_path):
    """After each PR: the files it adds are black/isort clean, and every line the formatter would
    change in an edited Paddle module, it would change in upstream's own file too (3.x formats
    with another tool, so upstream's 3.3.1 files are not all black-23 clean; an edit may replace
    some of those lines)."""
    tree = wheel_tree(version, tmp_path)
    texts, spliced = {}, sorted({make_patch.tree_path(m) for m, _ in make_patch.SPLICED})
    for rel in spliced:
        texts[f"upstream/{rel}"] = make_patch._read(os.path.join(tree, rel))
    for k in range(len(make_patch.PR_KEYS)):
        for rel, text in make_patch.patched_files(tree, k).items():
            texts[f"pr{k + 1}/{rel}"] = text
    flat = {name.replace("/", "__"): text for name, text in texts.items()}
    new = {name: flat_new for name, flat_new in zip(texts, formatted(flat).values())}
    for name, text in texts.items():
        if name.startswith("upstream/"):
            continue
        rel = name.split("/", 1)[1]
        if rel in spliced:
            ours = collections.Counter(changed_lines(text, new[name]))
            upstream = collections.Counter(changed_lines(texts[f"upstream/{rel}"], new[f"upstream/{rel}"]))
            assert ours - upstream == collections.Counter(), name
        else:
            assert text == new[name], f"{name} is not formatted as Paddle wants (a fence placed badly?)"
