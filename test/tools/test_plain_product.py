# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The product is plain Python (issue 34): no preprocessor dialect for the series and no commented-out code.

The series takes whole definitions from ``paddle_overlay/`` (``tools/patch_series.py`` says which PR adds
each), so nothing in the product marks text for one PR or another: no fence comment (``# series: KEY`` or
any ``# series:`` line) anywhere in a module, function or class body, signature or docstring, and ruff's
commented-out-code rule (ERA001) finds nothing in the product or in the test files the series carries.
"""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import make_patch  # noqa: E402

# what a fence looked like (and anything like it: a marker naming a PR or a series)
FENCE = re.compile(r"#\s*(series|pr|patch)\s*:|\bseries:\s*(until\s+)?[a-z0-9_]+\b", re.I)


def product_files():
    out = []
    for folder, dirs, names in os.walk(os.path.join(ROOT, "paddle_overlay")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    return sorted(out)


def carried_test_files():
    return [os.path.join(make_patch.TEST_DIR, n) for n in make_patch.TEST_FILES]


def fences(text, filename="<text>"):
    """['line: text'] of every comment, docstring or string of ``text`` that holds a fence."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING) and FENCE.search(token.string):
            found.append(f"{token.start[0]}: {token.string.strip()[:80]}")
    ast.parse(text, filename)  # and it is plain Python
    return found


def test_fences_are_found_where_they_would_hide():
    sample = '''def f(a,  # series: buckets
      b):
    """Doc.

    # series: until reads
    """
    # series: v2
    return a
'''
    assert [f.split(":")[0] for f in fences(sample)] == ["1", "3", "7"]
    assert fences("x = 1  # the series of PRs is in tools/patch_series.py\n") == []


@pytest.mark.parametrize("path", product_files() + carried_test_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_fence_in_the_product_or_the_carried_tests(path):
    assert fences(make_patch._read(path), path) == []


def test_no_commented_out_code():
    """ruff's ERA001 (eradicate) over the product and the carried tests, ruff's defaults otherwise."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "ERA001",
         "--output-format", "concise", os.path.join(ROOT, "paddle_overlay"), *carried_test_files()],
        capture_output=True, text=True)
    if "No module named ruff" in proc.stderr:
        pytest.fail(f"ruff is needed ({make_patch.FORMATTER_PINS['ruff']}, the [test] extra): {proc.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_finds_commented_out_code(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text("x = 1\n# y = x + 1\n# a plain comment\n")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "ERA001",
                           str(path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "ERA001" in proc.stdout, proc.stdout + proc.stderr
