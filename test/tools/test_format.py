# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The formatting of the patch: each release's series is formatted with that tree's own formatter, the
choice is proven on the wheel's files, every file the patch adds has upstream's header, and
tools/format.sh keeps the overlay source (the text the patch takes) black/isort clean.

Paddle 3.3.1's tree is formatted by ruff (ruff format, and ruff's import sorting; Paddle's settings: line
length 80, quotes preserved), 2.6.2's by black 23.3.0 and isort 5.12.0 (line length 80, strings not
normalized, ``paddle`` first party): the proof is that this formatter leaves the wheel's own modules the
series edits exactly as they are, and the other one does not (``make_patch.FORMATTERS``).
"""

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


def wheel_tree(version, tmp_path):
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    try:
        pkg = make_patch.paddle_package_dir(venv)
    except make_patch.PatchError as e:
        pytest.skip(f"Paddle {version} wheel not installed: {e}")
    tree = str(tmp_path / "tree")
    make_patch.layout_wheel_tree(pkg, tree)
    return tree


def edited_upstream(tree):
    """{tree path: text} of the wheel's modules the series edits, as the wheel has them."""
    rels = {make_patch.tree_path(m) for m, _ in make_patch.SPLICED} | {
        make_patch.tree_path(m) for m in make_patch.superseded_elsewhere()}
    return {rel: make_patch._read(os.path.join(tree, rel)) for rel in sorted(rels)}


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_the_releases_formatter_leaves_its_untouched_files_as_they_are(version, tmp_path):
    """The proof of the choice: the release's formatter (3.3.1: ruff; 2.6.2: black and isort) changes not a
    byte of the wheel's dygraph_sharding_optimizer.py, hybrid_parallel_optimizer.py and the other modules
    the series edits; the other formatter would change them (so the choice is not a coincidence)."""
    tree = wheel_tree(version, tmp_path)
    ours = make_patch.FORMATTERS[version]
    assert make_patch.formatter_for(tree) == ours
    upstream = edited_upstream(tree)
    assert {"dygraph_sharding_optimizer.py", "hybrid_parallel_optimizer.py"} <= {
        os.path.basename(r) for r in upstream}
    assert make_patch.format_files(upstream, ours) == upstream
    other = {"ruff": "black", "black": "ruff"}[ours]
    changed = [rel for rel, text in make_patch.format_files(upstream, other).items() if text != upstream[rel]]
    assert "python/paddle/distributed/fleet/meta_optimizers/dygraph_optimizer/dygraph_sharding_optimizer.py" in \
        changed, (other, changed)


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_every_pr_of_the_series_is_formatted_by_its_releases_formatter(version, tmp_path):
    """After each PR, every Python file it writes is as the release's formatter leaves it (and, by the proof
    above, the edited modules' upstream lines are untouched by it)."""
    tree = wheel_tree(version, tmp_path)
    formatter = make_patch.FORMATTERS[version]
    states = [make_patch.patched_files(tree, k) for k in range(len(make_patch.PR_KEYS))]
    for k, (state, again) in enumerate(zip(states, make_patch.format_many(states, formatter))):
        assert again == state, k
    assert sorted(make_patch.FORMATTERS) == ["2.6.2", "3.3.1"]


def test_a_checkout_says_its_formatter_in_its_pre_commit_config(tmp_path):
    (tmp_path / ".pre-commit-config.yaml").write_text("repos:\n-   repo: x\n    hooks:\n    -   id: ruff-format\n")
    assert make_patch.formatter_for(str(tmp_path), "2.6.2") == "ruff"
    (tmp_path / ".pre-commit-config.yaml").write_text("repos:\n-   repo: x\n    hooks:\n    -   id: black\n")
    assert make_patch.formatter_for(str(tmp_path), "3.3.1") == "black"
    os.remove(tmp_path / ".pre-commit-config.yaml")
    with pytest.raises(make_patch.PatchError, match="--formatter"):
        make_patch.formatter_for(str(tmp_path), "3.0.0")
