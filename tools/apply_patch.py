#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Apply a paddle_overlay patch to a Paddle source tree and register its tests, all or nothing.

``git apply --check``, then ``git apply``; then the patch header's rows not in the tree's
``test/collective/fleet/testslist.csv`` yet are appended to it and the ``CMakeLists.txt`` beside it
is regenerated with the tree's ``tools/gen_ut_cmakelists.py`` (this repository's if it has none)
and cmake-format with the tree's ``.cmake-format.py``; if a step fails the tree is put back. On a
mismatch it says what the tree looks like, which committed patches fit, and whether the patch is
applied already. Exit codes: 0 applied, 1 does not apply or registration failed (tree unchanged),
2 usage error. Run as ``bash tools/apply_patch.sh [--no-register] PADDLE_SRC [PATCH]``.
"""

import argparse
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import make_patch
from make_patch import ROOT, ROW_PREFIX, TREE_OPT_DIR, TREE_TEST_DIR

MAKE_OWN = ("  python3 tools/make_patch.py --paddle-src {src} --out paddle-stage1-broadcast-overlap.patch\n"
            "  tools/apply_patch.sh {src} paddle-stage1-broadcast-overlap.patch")


def rel(path):
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def err(*lines):
    print(*lines, sep="\n", file=sys.stderr)


class Tree:
    def __init__(self, src):
        self.src = src
        self.csv = os.path.join(src, TREE_TEST_DIR, "testslist.csv")
        self.cmake = os.path.join(src, TREE_TEST_DIR, "CMakeLists.txt")

    def git(self, *args, capture=True):
        """git in the tree only, never in a repository above it (the patch paths are relative to it)."""
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(self.src))
        return subprocess.run(["git", *args], cwd=self.src, env=env, capture_output=capture, text=True)

    def fits(self, patch, *options):
        return self.git("apply", "--check", *options, patch).returncode == 0

    def describe(self):  # one line per clue
        out = []
        try:
            out.append(f"  Paddle {make_patch.wheel_version(os.path.join(self.src, 'python', 'paddle'))[0]} "
                       "(python/paddle/version/__init__.py)")
        except (OSError, make_patch.PatchError):
            pass
        tag = self.git("describe", "--tags", "--abbrev=0").stdout.strip()
        if tag:
            out.append(f"  Paddle {tag[1:] if tag.startswith('v') else tag} (nearest git tag {tag})")
        dso = os.path.join(self.src, TREE_OPT_DIR, "dygraph_sharding_optimizer.py")
        text = make_patch._read(dso) if os.path.isfile(dso) else None
        if text is None:
            return out + [f"  no {TREE_OPT_DIR}/dygraph_sharding_optimizer.py: not a Paddle 2.6+ tree"]
        if os.path.isfile(os.path.join(self.src, TREE_OPT_DIR, "broadcast_overlap.py")) or "_origin_step" in text:
            return out + [f"  already patched: has {TREE_OPT_DIR}/broadcast_overlap.py or "
                          "DygraphShardingOptimizer._origin_step"]
        if "_broadcast_order_params" in text:
            return out + ["  Paddle 3.x: dygraph_sharding_optimizer.py has upstream's broadcast overlap (PR #63945, "
                          "_broadcast_order_params)"]
        return out + ["  Paddle 2.6: dygraph_sharding_optimizer.py has no upstream broadcast overlap"]

    def new_rows(self, patch):
        """The header rows of ``patch`` whose test is not in the tree's testslist.csv yet."""
        listed = set()
        if os.path.isfile(self.csv):
            listed = {line.split(",")[0].replace(" ", "") for line in make_patch._read(self.csv).splitlines()}
        rows = [line[len(ROW_PREFIX):] for line in make_patch._read(patch).splitlines() if line.startswith(ROW_PREFIX)]
        return [row for row in rows if row.split(",")[0] not in listed]

    def run(self, log, *cmd):
        proc = subprocess.run(cmd, cwd=self.src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.append(proc.stdout)
        return proc.returncode == 0

    def register(self, rows, log):
        """Append ``rows`` to testslist.csv and regenerate (and format) CMakeLists.txt; False on failure."""
        text = make_patch._read(self.csv) if os.path.isfile(self.csv) else ",".join(make_patch.testslist.FIELDS) + "\n"
        with open(self.csv, "w", encoding="utf-8", newline="") as f:
            f.write(text + ("\n" if text and not text.endswith("\n") else "") + "".join(r + "\n" for r in rows))
        fleet_cmake = f"{TREE_TEST_DIR}/CMakeLists.txt"
        if not os.path.isfile(os.path.join(self.src, "tools", "gen_ut_cmakelists.py")):
            print(f"the tree has no tools/gen_ut_cmakelists.py: regenerating {fleet_cmake} with tools/gen_ut_cmakelists.py")
            return self.run(log, sys.executable, os.path.join(ROOT, "tools", "gen_ut_cmakelists.py"), "-f", self.csv)
        print(f"regenerating {fleet_cmake} with the tree's tools/gen_ut_cmakelists.py")
        if not self.run(log, sys.executable, "tools/gen_ut_cmakelists.py", "-f", f"{TREE_TEST_DIR}/testslist.csv"):
            return False
        # cmake-format as Paddle's pre-commit does (upstream's generator writes it unformatted)
        cfg = [c for c in (os.path.join(self.src, ".cmake-format" + e) for e in (".json", ".py", ".yaml"))
               if os.path.isfile(c)]
        if not cfg:
            print(f"note: the tree has no .cmake-format.py: {fleet_cmake} is left as its generator wrote it")
        elif importlib.util.find_spec("cmakelang"):
            return self.run(log, sys.executable, "-m", "cmakelang.format", "-c", cfg[0], "-i", fleet_cmake)
        elif shutil.which("cmake-format"):
            return self.run(log, "cmake-format", "-c", cfg[0], "-i", fleet_cmake)
        else:
            print(f"note: no cmake-format here: run Paddle's pre-commit (cmake-format) on {fleet_cmake}")
        return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="apply_patch.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-register", action="store_true", help="apply the diff only (same as plain git apply)")
    parser.add_argument("src", metavar="PADDLE_SRC", help="a Paddle tree laid out as python/paddle/... (a checkout)")
    parser.add_argument("patch", metavar="PATCH", nargs="?",
                        help="default: the one file of patches/*.patch that applies to PADDLE_SRC")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.src):
        parser.exit(2, f"error: {args.src} is not a folder\n")
    tree = Tree(os.path.abspath(args.src))
    if not os.path.isdir(os.path.join(tree.src, "python", "paddle")):
        parser.exit(2, f"error: {tree.src} is not a Paddle tree: no python/paddle folder\n")
    if args.patch and not os.path.isfile(args.patch):
        parser.exit(2, f"error: patch {args.patch} not found\n")
    patch = args.patch and os.path.abspath(args.patch)
    committed = sorted(glob.glob(os.path.join(make_patch.PATCH_DIR, "*.patch")))
    if not patch:
        fitting = [p for p in committed if tree.fits(p)]
        if len(fitting) == 1:
            patch = fitting[0]
            print(f"using {rel(patch)} (the committed patch that applies to this tree)")
    old_base = re.compile(r"^\+from legacy_test\.test_parallel_dygraph_dataparallel import TestMultipleGpus$", re.M)
    legacy = os.path.join(tree.src, make_patch.LEGACY_BASE)
    if patch and os.path.isfile(legacy) and not re.search(r"^class TestMultipleGpus\b", make_patch._read(legacy), re.M) \
            and old_base.search(make_patch._read(patch)):  # drivers that could not import: refuse
        err(f"error: {rel(patch)}'s drivers use TestMultipleGpus, which this tree's",
            f"{make_patch.LEGACY_BASE} does not define (a later Paddle names it",
            "TestMultipleAccelerators); nothing was changed. Make a patch for this tree (its drivers follow the name):",
            MAKE_OWN.format(src=tree.src))
        return 1
    check = patch and tree.git("apply", "--check", patch)
    if check and check.returncode == 0:
        rows = [] if args.no_register else tree.new_rows(patch)
        if tree.git("apply", patch, capture=False).returncode:
            err("error: git apply failed after --check passed; see above")
            return 1
        print(f"applied {rel(patch)} to {tree.src}:\n" + tree.git("apply", "--stat", patch).stdout, end="")
        if rows:
            backup = {p: make_patch._read(p) if os.path.isfile(p) else None for p in (tree.csv, tree.cmake)}
            log = []
            if not tree.register(rows, log):
                for path, text in backup.items():
                    if text is not None:
                        with open(path, "w", encoding="utf-8", newline="") as f:
                            f.write(text)
                    elif os.path.exists(path):
                        os.remove(path)
                tree.git("apply", "--reverse", patch)
                err("error: registering the tests failed; the tree is as it was (patch reverted):",
                    *("  " + line for line in "".join(log).splitlines()))
                return 1
            print(f"registered in {TREE_TEST_DIR}/testslist.csv and CMakeLists.txt:",
                  *("  " + row.split(",")[0] for row in rows), sep="\n")
        return 0
    # Mismatch: nothing was changed. Say why and what would fit.
    if patch:
        err(f"error: {rel(patch)} does not apply to {tree.src}; nothing was changed (git apply is all-or-nothing).",
            "git apply --check says:", *("  " + line for line in (check.stderr + check.stdout).splitlines()[:20]))
    else:
        err(f"error: no committed patch in {rel(make_patch.PATCH_DIR)}/ applies to {tree.src}; nothing was changed.")
    err("The tree looks like:", *tree.describe())
    for p in [patch] if patch else committed:
        if tree.fits(p, "--reverse"):
            err(f"{rel(p)} is already applied to this tree (git apply --reverse --check passes).")
            return 1
    fitting = [p for p in committed if tree.fits(p)]
    if fitting:
        err("Patches that fit this tree (git apply --check passes):", *("  " + rel(p) for p in fitting))
        return 1
    python_part = [p for p in committed if tree.fits(p, "--include=python/*")]
    for p in python_part:
        err(f"The python/ part of {rel(p)} fits; a test file it adds is already in the tree",
            "(git apply says which). Rename ours, or make a patch for this exact tree:")
    if not python_part:
        err("Make a patch for this exact tree (a checkout at another commit):")
    err(MAKE_OWN.format(src=tree.src))
    return 1


if __name__ == "__main__":
    sys.exit(main())
