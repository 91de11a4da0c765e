# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The committed patches, applied to a checkout-like tree of the running Paddle, pass their tests there.

For the running Paddle's version (the runner runs this once per version) this test

1. builds a checkout-like tree (``checkout_tree.build``: python/ from the installed wheel, this project's
   stand-ins for upstream's test/ files, the release's own test base as ``make_patch.test_base_stand_in``
   emits it, no generator), tagged ``v<version>``;
2. the committed series (``patches/<version>/``, 3.3.1): applies it PR by PR with ``git am``; after PR k:
   the commit changes python/ files, appends its rows to ``testslist.csv`` and adds new files only, its
   tree is the generated state k, the ranks import Paddle and the patched modules from a site folder built
   from the tree (links to the installed package, patched copies, and a ``paddle_overlay`` stub that fails
   on import) with no ``_origin_`` method anywhere (``chained_scripts.probe``), and the drivers of PRs 1..k
   run as Paddle's CI runs them (``python -m unittest`` in the tree's test folder,
   ``PYTHONPATH=../..``): through the release's test base, which collects their per-rank scripts, then
   launched, in the same process, in one chained launch on 2 CPU ranks
   (``stand_in_launch.collect_and_launch``), every script's
   closing ``N passed`` line with N > 0 and every ``case_*`` function it defines run, on every rank (a
   driver that ran nothing, or a case dropped from a script, fails). The test-only
   CPU shim is not part of the patch: the stand-in gives it to CPU ranks from outside;
3. the committed single patch (``patches/paddle-v<version>-...patch``, 2.6.2): plain ``git apply``, the
   generated final state, and every driver passes the same way;
4. ``tools/apply_patch.sh`` applies the committed patch to a fresh tree: every row registered once.

Not part of the patch: this checks the patch itself.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
import checkout_tree  # test/patch, on pytest's pythonpath (pyproject.toml)
from checkout_tree import FLEET, make_patch

STUB = '''raise ImportError(
    "paddle_overlay must not be imported in a patched-Paddle run: "
    "the overlay is in the Paddle sources"
)
'''


def git_status(tree):
    return make_patch.git(tree, "status", "--porcelain", "--untracked-files=all").splitlines()


def module_of(rel):
    """``python/paddle/a/b.py`` -> ``paddle.a.b``."""
    return rel[len("python/") : -len(".py")].replace("/", ".")


def drivers_at(k):
    """The drivers (test names) of PRs 1..k+1, and the per-rank scripts they name."""
    files = make_patch.test_files_at(k)
    drivers = sorted(n[:-3] for n in files if n.startswith("test_"))
    scripts = set()
    for name in drivers:
        text = make_patch._read(os.path.join(make_patch.TEST_DIR, name + ".py"))
        scripts |= {s for s in re.findall(r"[\"']([\w.]+\.py)[\"']", text) if s in files}
    return drivers, sorted(scripts)


class TestPatchedTreeBroadcastOverlap(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import paddle

        cls.pkg = make_patch.paddle_package_dir(os.path.dirname(paddle.__file__))
        cls.version, _ = make_patch.wheel_version(cls.pkg)
        cls.patch = make_patch.patch_path(cls.version)
        cls.series = make_patch.series_files(cls.version)
        if not os.path.isfile(cls.patch) and not cls.series:
            raise unittest.SkipTest(f"no committed patch for Paddle {cls.version}: {cls.patch}, "
                                    f"{make_patch.series_dir(cls.version)}/")
        cls.work = os.path.join(ROOT, ".test-out", f"patched-paddle-{cls.version}")
        if os.path.lexists(cls.work):
            shutil.rmtree(cls.work)
        os.makedirs(cls.work)
        cls.tree = os.path.join(cls.work, "tree")
        checkout_tree.build(cls.pkg, cls.tree)
        cls.before = checkout_tree.snapshot(cls.tree)
        cls.pristine = os.path.join(cls.work, "at-the-tag")  # what the states are made from
        shutil.copytree(cls.tree, cls.pristine, symlinks=True)
        cls.registered = os.path.join(cls.work, "registered")
        shutil.copytree(cls.tree, cls.registered, symlinks=True)

    def build_site(self, tree, name):
        site = os.path.join(self.work, name)
        checkout_tree.build_patched_package(self.pkg, tree, site)
        os.makedirs(os.path.join(site, "paddle_overlay"))
        with open(os.path.join(site, "paddle_overlay", "__init__.py"), "w") as f:
            f.write(STUB)
        return site

    def check_imports(self, site, what, launches):
        """Every rank of every launch imported Paddle from ``site``, the patched modules as copies in it, no
        ``_origin_`` method and no paddle_overlay (``chained_scripts.probe``, recorded in ``launches``)."""
        probes = [r["probe"] for r in launches if "probe" in r]
        self.assertTrue(probes, f"{what}: no launch recorded what its ranks imported")
        for ranks in probes:
            for info in ranks:
                self.assertIsNotNone(info, f"{what}: a rank printed no probe line")
                self.assertEqual(info["version"], self.version)
                self.assertEqual(info["paddle"], os.path.join(site, "paddle", "__init__.py"))
                for name, path in info["files"].items():
                    self.assertEqual(path, os.path.join(site, *name.split(".")) + ".py", name)
                    self.assertFalse(os.path.islink(path), f"{path} must be a patched copy")
                self.assertEqual(info["origin"], [], f"{what}: methods renamed _origin_* in the patched classes")
                self.assertFalse(info["overlay"])

    def run_drivers(self, tree, site, what, k, modules):
        """Run the drivers of PRs 1..k+1 as Paddle's CI does (``python -m unittest``) in the tree's test
        folder, the stand-in test base collecting their per-rank scripts; then, in the same process, those
        scripts in one chained 2-rank launch (``stand_in_launch.collect_and_launch``): each launched and
        passing cases on both ranks."""
        drivers, scripts = drivers_at(k)
        name = what.replace(" ", "-")
        record = os.path.join(self.work, f"launches-{name}.jsonl")
        collect = os.path.join(self.work, f"collected-{name}.jsonl")
        for path in (record, collect):
            if os.path.exists(path):
                os.remove(path)
        env = {key: value for key, value in os.environ.items() if not key.startswith("PADDLE_OVERLAY")}
        # ../.. (the tree's test/) as the rows' PYTHONPATH=../..; then the patched Paddle, and what the
        # stand-in test base launches with (test/patch, tools/collective), never this project's test/
        path = [os.path.join(tree, "test"), site, HERE, os.path.join(ROOT, "tools", "collective")]
        env.update(PYTHONPATH=os.pathsep.join(path), PATCHED_TREE_RECORD=record, PATCHED_TREE_COLLECT=collect,
                   PATCHED_TREE_PROBE_MODULES=os.pathsep.join(modules), PADDLE_OVERLAY_RUN_DIR=os.path.join(self.work, "runs"))
        # the drivers as `python -m unittest -v` runs them, then their collected scripts, in one process
        proc = subprocess.run([sys.executable, os.path.join(HERE, "stand_in_launch.py"), *drivers],
                              cwd=os.path.join(tree, FLEET), env=env, capture_output=True, text=True, timeout=1200)
        output = proc.stdout + proc.stderr
        # unittest's own verdict (a failed driver's test counts as run), then how many ran
        self.assertRegex(output, r"(?m)^OK( \(skipped=\d+\))?$", f"{what}: the drivers fail:\n{output[-6000:]}")
        ran = re.search(r"^Ran (\d+) tests?", output, re.M)
        skipped = re.search(r"^OK \(skipped=(\d+)\)", output, re.M)
        self.assertTrue(ran and int(ran.group(1)) - int(skipped.group(1) if skipped else 0) >= len(drivers), output)
        self.assertEqual(proc.returncode, 0, f"{what}: the drivers' scripts fail:\n{output[-6000:]}")
        self.assertTrue(os.path.isfile(record), f"{what}: nothing was launched:\n{output[-6000:]}")
        with open(record) as f:
            launches = [json.loads(line) for line in f]
        script_runs = [r for r in launches if "script" in r]
        self.assertEqual(sorted({r["script"] for r in script_runs}), scripts, f"{what}: the per-rank scripts launched")
        for launch in script_runs:
            self.assertTrue(all(launch["passed"]), f"{what}: {launch}")
            # every case the script defines ran on every rank (bf16: GPU only, its driver skips it here)
            with open(os.path.join(tree, FLEET, launch["script"])) as f:
                defined = {n.name for n in ast.parse(f.read()).body
                           if isinstance(n, ast.FunctionDef) and n.name.startswith("case_")} - {"case_bf16"}
            for rank, called in enumerate(launch["called"]):
                self.assertEqual(defined - set(called), set(), f"{what}: {launch['script']} rank {rank}: cases not run")
        return launches

    def test_series_applies_pr_by_pr_and_the_tests_pass_after_each(self):
        if not self.series:
            self.skipTest(f"no committed series for Paddle {self.version} (generated on demand)")
        tree = self.tree
        present = set(make_patch.wheel_tree_files()) | {make_patch.TREE_TESTSLIST}
        titles = [pr["title"] for pr in make_patch.patch_series.PRS]
        rows_before = []
        for patch in self.series:
            head = make_patch.git(tree, "rev-parse", "HEAD").strip()
            make_patch.git(tree, "am", "--quiet", "--keep-non-patch", patch)
            title = make_patch.git(tree, "log", "-1", "--format=%s").strip()
            k = titles.index(title)
            what = f"PR {k + 1} ({make_patch.PR_KEYS[k]})"
            changed = make_patch.git(tree, "diff", "--name-status", "--no-renames", head, "HEAD").splitlines()
            state = make_patch.patched_files(self.pristine, k)
            for line in changed:
                status, rel = line.split("\t")
                self.assertIn(rel, state, f"{what} touches {rel}")
                self.assertEqual(status, "M" if rel in present else "A", line)
            present |= set(state)
            for rel, text in state.items():  # PR k's tree is the generated state k
                self.assertEqual(make_patch._read(os.path.join(tree, rel)), text, f"after {what}: {rel}")
            rows = make_patch.testslist_rows(k)
            csv = make_patch._read(os.path.join(tree, make_patch.TREE_TESTSLIST))
            self.assertTrue(csv.endswith("".join(r + "\n" for r in rows)), f"{what}: rows appended")
            self.assertEqual(rows[: len(rows_before)], rows_before, f"{what}: earlier rows kept")
            new_rows = rows[len(rows_before):]
            rows_before = rows
            for row in new_rows:  # a PR registers the drivers it adds
                self.assertIn(f"A\t{FLEET}/{row.split(',')[0]}.py", changed)
            site = self.build_site(tree, f"site-pr{k + 1}")
            launches = self.run_drivers(tree, site, what, k,
                                        [module_of(rel) for rel in state if rel.startswith(make_patch.TREE_PY)])
            self.check_imports(site, what, launches)
        self.assertEqual(make_patch.git(tree, "log", "-1", "--format=%s").strip(), titles[-1])

    def test_single_patch_applies_with_plain_git_apply_and_its_tests_pass(self):
        if not os.path.isfile(self.patch):
            self.skipTest(f"no committed single patch for Paddle {self.version} (generated on demand)")
        plain = os.path.join(self.work, "plain-git-apply")
        shutil.copytree(self.pristine, plain, symlinks=True)
        make_patch.git(plain, "apply", "--check", self.patch)
        make_patch.git(plain, "apply", self.patch)
        final = make_patch.patched_files(self.pristine)
        status = git_status(plain)
        modified = sorted(line[3:] for line in status if not line.startswith("??"))
        added = sorted(line[3:] for line in status if line.startswith("??"))
        self.assertEqual(sorted(modified + added), sorted(final), f"{self.patch} is stale: run tools/update_generated.sh")
        for rel, text in final.items():
            self.assertEqual(make_patch._read(os.path.join(plain, rel)), text, rel)
        snapshot = checkout_tree.snapshot(plain)
        for rel in checkout_tree.UPSTREAM_FILES[:2]:
            self.assertEqual(snapshot[rel], self.before[rel], rel)
        site = self.build_site(plain, "site-single")
        launches = self.run_drivers(plain, site, "the single patch", len(make_patch.PR_KEYS) - 1,
                                    [module_of(r) for r in final if r.startswith(make_patch.TREE_PY)])
        self.check_imports(site, "the single patch", launches)

    def test_apply_patch_sh_applies_and_registers_every_row_once(self):
        patch = make_patch.series_dir(self.version) if self.series else self.patch
        proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "apply_patch.sh"), self.registered, patch],
                              capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable), timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        after = checkout_tree.snapshot(self.registered)
        for rel in checkout_tree.UPSTREAM_FILES[:2]:  # upstream's bf16 files, byte for byte
            self.assertEqual(after[rel], self.before[rel], rel)
        old_csv = self.before[f"{FLEET}/testslist.csv"].decode()
        rows = make_patch.testslist_rows()
        self.assertEqual(after[f"{FLEET}/testslist.csv"].decode(), old_csv + "".join(r + "\n" for r in rows))
        self.assertEqual(after[f"{FLEET}/CMakeLists.txt"], self.before[f"{FLEET}/CMakeLists.txt"])  # no generator


if __name__ == "__main__":
    unittest.main()
