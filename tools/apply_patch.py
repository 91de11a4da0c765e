#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Apply the Paddle patch (the series of pull requests, or the single patch) to a Paddle source tree,
all or nothing.

A series (a folder such as ``patches/3.3.1``): checked PR by PR on a throw-away index (``git apply
--cached``, nothing in the tree changes), then applied with ``git am`` (one commit per PR). The single
patch (a file): ``git apply --check``, then ``git apply``. Each PR appends its tests' rows to
``test/collective/fleet/testslist.csv`` in its own diff; that hunk's context is the last lines of the list
the patch was made against, so on a tree whose list ends otherwise (another commit) it is the one hunk that
does not apply: the PR is then applied without it and its rows are appended here, in the same commit.
Then, if the tree has Paddle's ``tools/gen_ut_cmakelists.py``, the ``CMakeLists.txt`` beside the list is
regenerated with it (in each PR's commit); a tree without it keeps its ``CMakeLists.txt`` and a line says
what to run. If a step fails the tree is put back. On a mismatch it says which tag the patch fits, with
git's message. Exit codes: 0 applied, 1 does not apply or registration failed (tree unchanged), 2 usage
error. Run as ``bash tools/apply_patch.sh [--no-register] PADDLE_SRC [PATCH | SERIES]``; without either,
the committed patch that applies (a series, else a single patch); ``--no-register``: plain ``git am`` /
``git apply``, nothing else.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

import make_patch
from make_patch import ROOT, TREE_TEST_DIR, TREE_TESTSLIST, _read, _write

MAKE_OWN = ("make the series for this tree:\n"
            "  python3 tools/make_patch.py --paddle-src {src} --series paddle-stage1-overlap-series\n"
            "  tools/apply_patch.sh {src} paddle-stage1-overlap-series")
LIST, CMAKE = TREE_TESTSLIST, f"{TREE_TEST_DIR}/CMakeLists.txt"  # in the tree


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


def rows_of(patch_file):
    """The rows a patch file appends to the testslist.csv (the ``+`` lines of that file's hunks)."""
    rows = []
    for block in _read(patch_file).split("\ndiff --git a/")[1:]:
        if block.startswith(f"{LIST} "):
            rows += [line[1:] for line in block.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return rows


def check(src, patch):
    """(finished process, {patch file: True when only its rows' hunk fails}): whether ``patch`` applies to
    the tree (stderr: git's message). A series is tried PR by PR on a copy of the index; nothing in the tree
    changes."""
    files = patch_files(patch)
    if not files:
        return subprocess.CompletedProcess([], 1, "", f"error: no 0001-*.patch files in {patch}"), {}
    rebase = {}
    with tempfile.TemporaryDirectory(prefix="apply_patch-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        proc = git(src, "read-tree", "HEAD", env=env)
        for name in files:
            if proc.returncode:
                break
            proc = git(src, "apply", "--cached", name, env=env)
            if proc.returncode and rows_of(name):
                retry = git(src, "apply", "--cached", f"--exclude={LIST}", name, env=env)
                if retry.returncode == 0:
                    rebase[name] = True
                    proc = retry
                    _append_rows(src, rows_of(name), env)
            if proc.returncode:
                proc.stderr = f"{os.path.basename(name)}: {proc.stderr}"
    return proc, rebase


def _append_rows(src, rows, env=None):
    """Append ``rows`` to the tree's list (in the index ``env`` names, or the work tree)."""
    if env:  # the throw-away index: later PRs' checks see the rows
        listed = git(src, "show", f":{LIST}", env=env)
        text = listed.stdout if listed.returncode == 0 else ""
        text += ("" if not text or text.endswith("\n") else "\n") + "".join(r + "\n" for r in rows)
        blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=src, input=text, capture_output=True,
                              text=True).stdout.strip()
        git(src, "update-index", "--add", "--cacheinfo", f"100644,{blob},{LIST}", env=env)
        return
    path = os.path.join(src, LIST)
    text = _read(path) if os.path.isfile(path) else ",".join(make_patch.testslist.FIELDS) + "\n"
    _write(path, text + ("" if not text or text.endswith("\n") else "\n") + "".join(r + "\n" for r in rows))


def regenerate(src):
    """Regenerate CMakeLists.txt with the tree's generator: its finished process (output in ``stdout``), or
    None when the tree has none."""
    if not os.path.isfile(os.path.join(src, "tools", "gen_ut_cmakelists.py")):
        return None
    return subprocess.run([sys.executable, "tools/gen_ut_cmakelists.py", "-f", LIST], cwd=src,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


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


def base_classes_needed(patch):
    """The test-base classes the patch's drivers import from legacy_test."""
    text = text_of(patch)
    found = set(re.findall(r"^\+from legacy_test\.test_parallel_dygraph_dataparallel import (\w+)$", text, re.M))
    found |= set(re.findall(r"^\+from legacy_test\.test_parallel_dygraph_dataparallel import \(\n\+\s+(\w+),",
                            text, re.M))
    return found


def missing_base(src, patch):
    """The classes the patch's drivers import that the tree's test base lacks (none when it has no file)."""
    path = os.path.join(src, make_patch.LEGACY_BASE)
    if not os.path.isfile(path):
        return []
    legacy = _read(path)
    return sorted(c for c in base_classes_needed(patch) if not re.search(rf"^class {c}\b", legacy, re.M))


class Failed(Exception):
    pass


def apply(src, patch, rebase, register):
    """Apply ``patch`` (checked already), appending the rows of the PRs in ``rebase`` and, with
    ``register``, regenerating CMakeLists.txt into each PR; Failed with the message when a step fails."""
    env = None
    if git(src, "var", "GIT_COMMITTER_IDENT").returncode:  # no identity configured: the patches' author
        env = {"GIT_COMMITTER_NAME": make_patch.AUTHOR[0], "GIT_COMMITTER_EMAIL": make_patch.AUTHOR[1]}
    for name in patch_files(patch):
        exclude = [f"--exclude={LIST}"] if rebase.get(name) else []
        if os.path.isdir(patch):
            # --keep-non-patch: the titles' "[Distributed]" stays
            proc = git(src, "am", "--quiet", "--keep-non-patch", *exclude, name, capture=False, env=env)
            if proc.returncode:
                git(src, "am", "--abort")
                raise Failed("applying failed after the check passed (local changes to the files it edits?); "
                             "see above")
        elif git(src, "apply", *exclude, name, capture=False).returncode:
            raise Failed("applying failed after the check passed (local changes to the files it edits?); see above")
        if exclude:
            _append_rows(src, rows_of(name))
            print(f"{os.path.basename(name)}: its rows' hunk did not fit this tree's {LIST}; appended them")
        generator = regenerate(src) if register else None
        if generator is not None and generator.returncode:
            raise Failed("registering the tests failed:\n" + "\n".join("  " + line for line in
                                                                      generator.stdout.splitlines()))
        if os.path.isdir(patch) and (exclude or generator is not None):
            git(src, "add", LIST, CMAKE)
            git(src, "commit", "--quiet", "--amend", "--no-edit", env=env)
    return True


def revert(src, patch, head, rebase, backup):
    """Put the tree back: the series' commits reset; the single patch reversed and the list and
    CMakeLists.txt as they were (``backup``)."""
    if os.path.isdir(patch):
        return git(src, "reset", "--quiet", "--keep", head)
    exclude = [f"--exclude={LIST}"] if rebase.get(patch) else []
    git(src, "apply", "--reverse", *exclude, patch)
    for path, text in backup.items():
        if text is not None:
            _write(path, text)
        elif os.path.exists(path):
            os.remove(path)


def summary(src, patch, head):
    if os.path.isdir(patch):
        return git(src, "log", "--format=  %s", f"{head}..HEAD").stdout + git(
            src, "diff", "--stat", head, "HEAD").stdout
    return git(src, "apply", "--stat", patch).stdout


def main(argv=None):
    parser = argparse.ArgumentParser(prog="apply_patch.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-register", action="store_true", help="plain git am / git apply, nothing else")
    parser.add_argument("src", metavar="PADDLE_SRC", help="a Paddle tree laid out as python/paddle/... (a checkout)")
    parser.add_argument("patch", metavar="PATCH", nargs="?",
                        help="a series folder (patches/VERSION) or a single patch file; default: the committed "
                             "patch that applies to PADDLE_SRC")
    args = parser.parse_args(argv)
    src = os.path.abspath(args.src)
    if not os.path.isdir(os.path.join(src, "python", "paddle")):
        parser.exit(2, f"error: {src} is not a Paddle tree: no python/paddle folder\n")
    if args.patch and not os.path.exists(args.patch):
        parser.exit(2, f"error: patch {args.patch} not found\n")
    candidates = [os.path.abspath(args.patch)] if args.patch else committed()
    checks = {}
    for p in candidates:
        proc, rebase = check(src, p)
        if args.no_register and rebase:  # plain git: the rows' hunk must fit
            proc = subprocess.CompletedProcess([], 1, "", f"error: {LIST}: the rows' hunk does not apply")
        checks[p] = (proc, rebase)
        if proc.returncode == 0 and not args.patch:
            break
    fitting = [p for p, (c, _) in checks.items() if c.returncode == 0]
    if len(fitting) != 1:  # a mismatch: nothing was changed
        tags = " or ".join(sorted(set(filter(None, map(tag, checks))))) or "the tree it was made for"
        what = f"{rel(args.patch)} does not apply" if args.patch else \
            f"no committed patch in {rel(make_patch.PATCH_DIR)}/ applies"
        err(f"error: {what} to {src}; nothing was changed. Check out the matching tag "
            f"({tags}: git checkout TAG), or {MAKE_OWN.format(src=src)}",
            *(f"checking {rel(p)}{'/' if os.path.isdir(p) else ''} says:\n  " + "\n  ".join(
                c.stderr.strip().splitlines()[:10]) for p, (c, _) in checks.items()))
        return 1
    patch = fitting[0]
    if not args.patch:
        print(f"using {rel(patch)}{'/' if os.path.isdir(patch) else ''} (the committed patch that applies to this "
              "tree)")
    missing = missing_base(src, patch)
    if missing:
        err(f"error: {rel(patch)}'s drivers use {', '.join(missing)}, which this tree's {make_patch.LEGACY_BASE} "
            "does not define (another release names its test base otherwise); nothing was changed. Its drivers "
            f"follow the tree's name if you {MAKE_OWN.format(src=src)}")
        return 1
    head = git(src, "rev-parse", "HEAD").stdout.strip()
    paths = [os.path.join(src, LIST), os.path.join(src, CMAKE)]
    backup = {path: _read(path) if os.path.isfile(path) else None for path in paths}
    try:
        apply(src, patch, checks[patch][1], not args.no_register)
    except Failed as e:
        revert(src, patch, head, checks[patch][1], backup)
        err(f"error: {e}", "the tree is as it was")
        return 1
    print(f"applied {rel(patch)} to {src}:\n" + summary(src, patch, head), end="")
    if not args.no_register:
        rows = [r for name in patch_files(patch) for r in rows_of(name)]
        if os.path.isfile(os.path.join(src, "tools", "gen_ut_cmakelists.py")):
            print(f"regenerated {CMAKE} with the tree's tools/gen_ut_cmakelists.py; format it as Paddle's "
                  f"pre-commit does: pre-commit run cmake-format --files {CMAKE}")
            where = f"{LIST} and CMakeLists.txt"
        else:
            print(f"note: the tree has no tools/gen_ut_cmakelists.py, so {CMAKE} is unchanged; run Paddle's "
                  f"generator in the tree: python3 tools/gen_ut_cmakelists.py -f {LIST}")
            where = LIST
        print(f"registered in {where}:", *("  " + row.split(",")[0] for row in rows), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
