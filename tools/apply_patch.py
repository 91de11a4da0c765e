#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Apply a paddle_overlay patch to a Paddle source tree and register its tests, all or nothing.

``git apply --check``, then ``git apply``; then the patch header's rows not in the tree's
``test/collective/fleet/testslist.csv`` yet are appended to it and the ``CMakeLists.txt`` beside it
is regenerated with the tree's ``tools/gen_ut_cmakelists.py`` (a tree without one: a line says
what to run; its output is formatted by Paddle's pre-commit, as upstream's always is); if a step
fails the tree is put back. On a mismatch it says which tag the patch fits, with git apply's message. Exit codes: 0
applied, 1 does not apply or registration failed (tree unchanged), 2 usage error.
Run as ``bash tools/apply_patch.sh [--no-register] PADDLE_SRC [PATCH]``.
"""

import argparse
import glob
import os
import re
import subprocess
import sys

import make_patch
from make_patch import ROOT, ROW_PREFIX, TREE_TEST_DIR, _read, _write

MAKE_OWN = ("make a patch for this tree:\n"
            "  python3 tools/make_patch.py --paddle-src {src} --out paddle-stage1-broadcast-overlap.patch\n"
            "  tools/apply_patch.sh {src} paddle-stage1-broadcast-overlap.patch")
LIST, CMAKE = f"{TREE_TEST_DIR}/testslist.csv", f"{TREE_TEST_DIR}/CMakeLists.txt"  # in the tree


def rel(path):
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def err(*lines):
    print(*lines, sep="\n", file=sys.stderr)


def git(src, *args, capture=True):
    """git in the tree only, never in a repository above it (the patch paths are relative to it)."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(src))
    return subprocess.run(["git", *args], cwd=src, env=env, capture_output=capture, text=True)


def new_rows(src, patch):
    """The header rows of ``patch`` whose test is not in the tree's testslist.csv yet."""
    path = os.path.join(src, LIST)
    listed = {line.split(",")[0].replace(" ", "") for line in _read(path).splitlines()} if os.path.isfile(path) else ()
    rows = [line[len(ROW_PREFIX):] for line in _read(patch).splitlines() if line.startswith(ROW_PREFIX)]
    return [row for row in rows if row.split(",")[0] not in listed]


def register(src, rows):
    """Append ``rows`` to testslist.csv, then regenerate CMakeLists.txt with the tree's generator:
    its finished process (output in ``stdout``), or None when the tree has no generator."""
    path = os.path.join(src, LIST)
    text = _read(path) if os.path.isfile(path) else ",".join(make_patch.testslist.FIELDS) + "\n"
    _write(path, text + ("\n" if text and not text.endswith("\n") else "") + "".join(r + "\n" for r in rows))
    if not os.path.isfile(os.path.join(src, "tools", "gen_ut_cmakelists.py")):
        print(f"note: the tree has no tools/gen_ut_cmakelists.py, so {CMAKE} is unchanged; run Paddle's "
              f"generator in the tree: python3 tools/gen_ut_cmakelists.py -f {LIST}")
        return None
    print(f"regenerating {CMAKE} with the tree's tools/gen_ut_cmakelists.py")
    proc = subprocess.run([sys.executable, "tools/gen_ut_cmakelists.py", "-f", LIST], cwd=src,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode == 0:
        print(f"note: format it as Paddle's pre-commit does: pre-commit run cmake-format --files {CMAKE}")
    return proc


def tag(patch):
    """The release tag a committed patch fits, from its header (``for Paddle 3.3.1 (commit ...)``)."""
    m = re.search(r"\bfor Paddle (\d[^ (]*)", " ".join(_read(patch).split("diff --git", 1)[0].split()))
    return m and "v" + m.group(1).rstrip(".")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="apply_patch.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-register", action="store_true", help="apply the diff only (same as plain git apply)")
    parser.add_argument("src", metavar="PADDLE_SRC", help="a Paddle tree laid out as python/paddle/... (a checkout)")
    parser.add_argument("patch", metavar="PATCH", nargs="?",
                        help="default: the one file of patches/*.patch that applies to PADDLE_SRC")
    args = parser.parse_args(argv)
    src = os.path.abspath(args.src)
    if not os.path.isdir(os.path.join(src, "python", "paddle")):
        parser.exit(2, f"error: {src} is not a Paddle tree: no python/paddle folder\n")
    if args.patch and not os.path.isfile(args.patch):
        parser.exit(2, f"error: patch {args.patch} not found\n")
    committed = sorted(glob.glob(os.path.join(make_patch.PATCH_DIR, "*.patch")))
    checks = {p: git(src, "apply", "--check", p) for p in ([os.path.abspath(args.patch)] if args.patch else committed)}
    fitting = [p for p, check in checks.items() if check.returncode == 0]
    if len(fitting) != 1:  # a mismatch: nothing was changed
        tags = " or ".join(filter(None, map(tag, checks))) or "the tree it was made for"
        what = f"{rel(args.patch)} does not apply" if args.patch else \
            f"no single committed patch in {rel(make_patch.PATCH_DIR)}/ applies"
        err(f"error: {what} to {src}; nothing was changed. Check out the matching tag "
            f"({tags}: git checkout TAG), or {MAKE_OWN.format(src=src)}",
            *(f"git apply --check {rel(p)} says:\n  " + "\n  ".join(c.stderr.strip().splitlines()[:10])
              for p, c in checks.items()))
        return 1
    patch = fitting[0]
    if not args.patch:
        print(f"using {rel(patch)} (the committed patch that applies to this tree)")
    legacy = os.path.join(src, make_patch.LEGACY_BASE)
    if os.path.isfile(legacy) and "TestMultipleGpus" not in make_patch.base_classes(src) and re.search(
            r"^\+from legacy_test\.test_parallel_dygraph_dataparallel import TestMultipleGpus$", _read(patch), re.M):
        err(f"error: {rel(patch)}'s drivers use TestMultipleGpus, which this tree's {make_patch.LEGACY_BASE} does "
            "not define (a later Paddle names it TestMultipleAccelerators); nothing was changed. Its drivers follow "
            f"the name if you {MAKE_OWN.format(src=src)}")
        return 1
    rows = [] if args.no_register else new_rows(src, patch)
    if git(src, "apply", patch, capture=False).returncode:
        err("error: git apply failed after --check passed; see above")
        return 1
    print(f"applied {rel(patch)} to {src}:\n" + git(src, "apply", "--stat", patch).stdout, end="")
    if rows:
        paths = [os.path.join(src, LIST), os.path.join(src, CMAKE)]
        backup = {path: _read(path) if os.path.isfile(path) else None for path in paths}
        generator = register(src, rows)
        if generator is not None and generator.returncode:
            for path, text in backup.items():
                if text is not None:
                    _write(path, text)
                elif os.path.exists(path):
                    os.remove(path)
            git(src, "apply", "--reverse", patch)
            err("error: registering the tests failed; the tree is as it was (patch reverted):",
                *("  " + line for line in generator.stdout.splitlines()))
            return 1
        print(f"registered in {LIST}{' and CMakeLists.txt' * (generator is not None)}:",
              *("  " + row.split(",")[0] for row in rows), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
