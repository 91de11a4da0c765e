#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Apply the Paddle patch (the series of pull requests, or the single patch) to a Paddle source tree and
register its tests, all or nothing.

A series (a folder such as ``patches/3.3.1``): checked PR by PR on a throw-away index (``git apply
--cached``, nothing in the tree changes), then applied with ``git am`` (one commit per PR). The single
patch (a file): ``git apply --check``, then ``git apply``. Then the rows of the tests (after ``---`` in each
PR, in the single patch's header) not in the tree's ``test/collective/fleet/testslist.csv`` yet are
appended to it and the ``CMakeLists.txt`` beside it is regenerated with the tree's
``tools/gen_ut_cmakelists.py`` (a tree without one: a line says what to run; its output is formatted by
Paddle's pre-commit, as upstream's always is); if a step fails the tree is put back. On a mismatch it says
which tag the patch fits, with git's message. Exit codes: 0 applied, 1 does not apply or registration
failed (tree unchanged), 2 usage error. Run as ``bash tools/apply_patch.sh [--no-register] PADDLE_SRC
[PATCH | SERIES]``; without either, the committed series that applies.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

import make_patch
from make_patch import ROOT, ROW_PREFIX, TREE_TEST_DIR, _read, _write

MAKE_OWN = ("make the series for this tree:\n"
            "  python3 tools/make_patch.py --paddle-src {src} --series paddle-stage1-overlap-series\n"
            "  tools/apply_patch.sh {src} paddle-stage1-overlap-series")
LIST, CMAKE = f"{TREE_TEST_DIR}/testslist.csv", f"{TREE_TEST_DIR}/CMakeLists.txt"  # in the tree


def rel(path):
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def err(*lines):
    print(*lines, sep="\n", file=sys.stderr)


def git(src, *args, capture=True, env=None):
    """git in the tree only, never in a repository above it (the patch paths are relative to it)."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(src), **(env or {}))
    return subprocess.run(["git", *args], cwd=src, env=env, capture_output=capture, text=True)


def patch_files(patch):
    """The files of a patch argument: the series' PRs in order (a folder), or the file itself."""
    return make_patch.series_files(patch) if os.path.isdir(patch) else [patch]


def text_of(patch):
    return "".join(_read(p) for p in patch_files(patch))


def new_rows(src, patch):
    """The rows ``patch`` (file or series) carries whose test is not in the tree's testslist.csv yet."""
    path = os.path.join(src, LIST)
    listed = {line.split(",")[0].replace(" ", "") for line in _read(path).splitlines()} if os.path.isfile(path) else ()
    rows = [line[len(ROW_PREFIX):] for line in text_of(patch).splitlines() if line.startswith(ROW_PREFIX)]
    return [row for row in rows if row.split(",")[0] not in listed]


def check(src, patch):
    """A finished process whose returncode says whether ``patch`` applies to the tree (stderr: git's
    message). A series is tried PR by PR on a copy of the index; nothing in the tree changes."""
    if not os.path.isdir(patch):
        return git(src, "apply", "--check", patch)
    files = patch_files(patch)
    if not files:
        return subprocess.CompletedProcess([], 1, "", f"error: no 0001-*.patch files in {patch}")
    with tempfile.TemporaryDirectory(prefix="apply_patch-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        proc = git(src, "read-tree", "HEAD", env=env)
        for name in files:
            if proc.returncode:
                break
            proc = git(src, "apply", "--cached", name, env=env)
            if proc.returncode:
                proc.stderr = f"{os.path.basename(name)}: {proc.stderr}"
    return proc


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
    """The release tag a committed patch fits: a series' folder name, or from the single patch's header
    (``for Paddle 3.3.1 (commit ...)``)."""
    if os.path.isdir(patch):
        name = os.path.basename(os.path.normpath(patch))
        return "v" + name if re.match(r"\d+\.\d+", name) else None
    m = re.search(r"\bfor Paddle (\d[^ (]*)", " ".join(_read(patch).split("diff --git", 1)[0].split()))
    return m and "v" + m.group(1).rstrip(".")


def committed():
    """The committed series (one folder per version), then the single patches."""
    series = sorted(d for d in glob.glob(os.path.join(make_patch.PATCH_DIR, "*")) if make_patch.series_files(d))
    return series + sorted(glob.glob(os.path.join(make_patch.PATCH_DIR, "*.patch")))


def apply(src, patch):
    """Apply ``patch`` (checked already); the finished process."""
    if os.path.isdir(patch):
        env = None
        if git(src, "var", "GIT_COMMITTER_IDENT").returncode:  # no identity configured: the patches' author
            env = {"GIT_COMMITTER_NAME": make_patch.AUTHOR[0], "GIT_COMMITTER_EMAIL": make_patch.AUTHOR[1]}
        # --keep-non-patch: the titles' "[Distributed]" stays
        proc = git(src, "am", "--quiet", "--keep-non-patch", *patch_files(patch), capture=False, env=env)
        if proc.returncode:
            git(src, "am", "--abort")
        return proc
    return git(src, "apply", patch, capture=False)


def revert(src, patch, head):
    if os.path.isdir(patch):
        return git(src, "reset", "--quiet", "--keep", head)
    return git(src, "apply", "--reverse", patch)


def summary(src, patch, head):
    if os.path.isdir(patch):
        return git(src, "log", "--format=  %s", f"{head}..HEAD").stdout + git(
            src, "diff", "--stat", head, "HEAD").stdout
    return git(src, "apply", "--stat", patch).stdout


def main(argv=None):
    parser = argparse.ArgumentParser(prog="apply_patch.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-register", action="store_true", help="apply only (plain git am / git apply)")
    parser.add_argument("src", metavar="PADDLE_SRC", help="a Paddle tree laid out as python/paddle/... (a checkout)")
    parser.add_argument("patch", metavar="PATCH", nargs="?",
                        help="a series folder (patches/VERSION) or a single patch file; default: the committed "
                             "series that applies to PADDLE_SRC")
    args = parser.parse_args(argv)
    src = os.path.abspath(args.src)
    if not os.path.isdir(os.path.join(src, "python", "paddle")):
        parser.exit(2, f"error: {src} is not a Paddle tree: no python/paddle folder\n")
    if args.patch and not os.path.exists(args.patch):
        parser.exit(2, f"error: patch {args.patch} not found\n")
    candidates = [os.path.abspath(args.patch)] if args.patch else [p for p in committed() if os.path.isdir(p)]
    checks = {}
    for p in candidates:
        checks[p] = check(src, p)
        if checks[p].returncode == 0 and not args.patch:
            break
    fitting = [p for p, c in checks.items() if c.returncode == 0]
    if len(fitting) != 1:  # a mismatch: nothing was changed
        tags = " or ".join(filter(None, map(tag, checks))) or "the tree it was made for"
        what = f"{rel(args.patch)} does not apply" if args.patch else \
            f"no committed series in {rel(make_patch.PATCH_DIR)}/ applies"
        err(f"error: {what} to {src}; nothing was changed. Check out the matching tag "
            f"({tags}: git checkout TAG), or {MAKE_OWN.format(src=src)}",
            *(f"checking {rel(p)}{'/' if os.path.isdir(p) else ''} says:\n  " + "\n  ".join(
                c.stderr.strip().splitlines()[:10]) for p, c in checks.items()))
        return 1
    patch = fitting[0]
    if not args.patch:
        print(f"using {rel(patch)}/ (the committed series that applies to this tree)")
    legacy = os.path.join(src, make_patch.LEGACY_BASE)
    if os.path.isfile(legacy) and "TestMultipleGpus" not in make_patch.base_classes(src) and re.search(
            r"^\+from legacy_test\.test_parallel_dygraph_dataparallel import TestMultipleGpus$", text_of(patch), re.M):
        err(f"error: {rel(patch)}'s drivers use TestMultipleGpus, which this tree's {make_patch.LEGACY_BASE} does "
            "not define (a later Paddle names it TestMultipleAccelerators); nothing was changed. Its drivers follow "
            f"the name if you {MAKE_OWN.format(src=src)}")
        return 1
    rows = [] if args.no_register else new_rows(src, patch)
    head = git(src, "rev-parse", "HEAD").stdout.strip()
    if apply(src, patch).returncode:
        err("error: applying failed after the check passed (local changes to the files it edits?); see above; "
            "nothing was changed")
        return 1
    print(f"applied {rel(patch)} to {src}:\n" + summary(src, patch, head), end="")
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
            revert(src, patch, head)
            err("error: registering the tests failed; the tree is as it was (patch reverted):",
                *("  " + line for line in generator.stdout.splitlines()))
            return 1
        print(f"registered in {LIST}{' and CMakeLists.txt' * (generator is not None)}:",
              *("  " + row.split(",")[0] for row in rows), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
