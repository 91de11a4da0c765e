# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The committed series (and single patch), applied to a checkout-like tree, pass their tests there.

For the running Paddle's version (the runner runs this once per version) this test

1. builds a checkout-like tree (``checkout_tree.build``: python/ from the installed wheel,
   this project's stand-ins for upstream's test/ files, no generator), tagged ``v<version>``;
2. on a copy, applies the single patch ``patches/paddle-v<version>-stage1-broadcast-overlap.patch``
   with plain ``git apply``: only the edited python/ files change, everything else is new, and the
   result is the series' last state;
3. on the tree, applies ``patches/<version>/`` PR by PR with ``git am``; after PR k: the commit
   changes python/ files and adds new files only, Paddle imports the patched modules from a site
   folder built from the tree (links to the installed package, patched copies, and a
   ``paddle_overlay`` stub that fails on import) with no ``_origin_`` method anywhere, and the
   tree's drivers (the tests of PRs 1..k, as PR k left them) pass through the ``TestMultipleGpus``
   stand-in, one launch per driver. The test-only CPU shim (V2's comm buffers on gloo) is not part of the
   patch: the stand-in's site hook installs it in CPU ranks (``hybrid_parallel_cpu_shim.install_site``);
4. registers the series' tests with ``tools/apply_patch.sh`` on a fresh tree: the rows of every PR
   appended, upstream's rows, files and ``CMakeLists.txt`` untouched.

Not part of the patch: this checks the patch itself.
"""

import json
import os
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
PROBE = r"""
import importlib, json, sys
import paddle
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    dygraph_sharding_optimizer as dso, hybrid_parallel_optimizer as hpo,
)
from paddle.jit.dy2static import program_translator as pt
files = {name: importlib.import_module(name).__file__ for name in sys.argv[1:]}
classes = (dso.DygraphShardingOptimizer, dso.DygraphShardingOptimizerV2,
           hpo.HybridParallelOptimizer, pt.StaticFunction)
print(json.dumps({
    "version": paddle.__version__,
    "paddle": paddle.__file__,
    "files": files,
    "origin": sorted(f"{c.__name__}.{a}" for c in classes for a in vars(c) if a.startswith("_origin_")),
    "overlay": "paddle_overlay" in sys.modules,
}))
"""


def git_status(tree):
    return make_patch.git(tree, "status", "--porcelain", "--untracked-files=all").splitlines()


def module_of(rel):
    """``python/paddle/a/b.py`` -> ``paddle.a.b``."""
    return rel[len("python/") : -len(".py")].replace("/", ".")


class TestPatchedTreeBroadcastOverlap(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import paddle

        cls.pkg = make_patch.paddle_package_dir(os.path.dirname(paddle.__file__))
        cls.version, _ = make_patch.wheel_version(cls.pkg)
        cls.patch = make_patch.patch_path(cls.version)
        cls.series = make_patch.series_files(cls.version)
        if not os.path.isfile(cls.patch) or not cls.series:
            raise unittest.SkipTest(f"no committed patches for Paddle {cls.version}: {cls.patch}, "
                                    f"{make_patch.series_dir(cls.version)}/")
        cls.work = os.path.join(ROOT, ".test-out", f"patched-paddle-{cls.version}")
        if os.path.lexists(cls.work):
            shutil.rmtree(cls.work)
        os.makedirs(cls.work)
        cls.tree = os.path.join(cls.work, "tree")
        checkout_tree.build(cls.pkg, cls.tree)
        cls.before = checkout_tree.snapshot(cls.tree)
        cls.plain = os.path.join(cls.work, "plain-git-apply")
        shutil.copytree(cls.tree, cls.plain, symlinks=True)
        cls.registered = os.path.join(cls.work, "registered")
        shutil.copytree(cls.tree, cls.registered, symlinks=True)
        cls.pristine = os.path.join(cls.work, "at-the-tag")  # what the states are made from
        shutil.copytree(cls.tree, cls.pristine, symlinks=True)

    def test_single_patch_applies_with_plain_git_apply(self):
        make_patch.git(self.plain, "apply", "--check", self.patch)
        make_patch.git(self.plain, "apply", self.patch)
        status = git_status(self.plain)
        modified = sorted(line[3:] for line in status if not line.startswith("??"))
        added = sorted(line[3:] for line in status if line.startswith("??"))
        self.assertEqual(modified, sorted({make_patch.tree_path(m) for m, _ in make_patch.SPLICED}))
        expected_new = [make_patch.tree_path(m) for m in make_patch.NEW_MODULES]
        expected_new += [f"{FLEET}/{n}" for n in make_patch.TEST_FILES]
        self.assertEqual(added, sorted(expected_new), f"{self.patch} is stale: run tools/update_generated.sh")
        self.assertEqual(checkout_tree.snapshot(self.plain), self.before)

    def run_patched(self, suite):
        """Run ``suite`` with the ranks importing the patched package first, never the overlay."""
        saved = dict(os.environ)
        try:
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [self.site] + [p for p in saved.get("PYTHONPATH", "").split(os.pathsep) if p])
            os.environ["PADDLE_OVERLAY_MODE"] = "patched"
            os.environ.pop("PADDLE_OVERLAY", None)
            return unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def load_driver(self, name, k):
        import importlib.util

        path = os.path.join(self.tree, FLEET, name + ".py")
        spec = importlib.util.spec_from_file_location(f"patched_tree_pr{k}_{name}", path)
        driver = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = driver  # the stand-in finds the per-rank scripts next to it
        spec.loader.exec_module(driver)
        return driver

    def test_series_applies_pr_by_pr_and_the_tests_pass_after_each(self):
        tree = self.tree
        fleet = os.path.join(tree, FLEET)
        present = set(make_patch.wheel_tree_files())
        for k, patch in enumerate(self.series):
            head = make_patch.git(tree, "rev-parse", "HEAD").strip()
            make_patch.git(tree, "am", "--quiet", "--keep-non-patch", patch)
            changed = make_patch.git(tree, "diff", "--name-status", "--no-renames", head, "HEAD").splitlines()
            state = make_patch.patched_files(self.pristine, k)
            for line in changed:
                status, rel = line.split("\t")
                self.assertIn(rel, state, f"PR {k + 1} ({os.path.basename(patch)}) touches {rel}")
                self.assertEqual(status, "M" if rel in present else "A", line)
            present |= set(state)
            for rel, text in state.items():  # PR k's tree is the generated state k
                self.assertEqual(make_patch._read(os.path.join(tree, rel)), text, f"after PR {k + 1}: {rel}")
            self.site = os.path.join(self.work, f"site-pr{k + 1}")
            checkout_tree.build_patched_package(self.pkg, tree, self.site)
            os.makedirs(os.path.join(self.site, "paddle_overlay"))
            with open(os.path.join(self.site, "paddle_overlay", "__init__.py"), "w") as f:
                f.write(STUB)
            self.check_imports(k, [module_of(rel) for rel in state if rel.startswith(make_patch.TREE_PY)])
            drivers = sorted(n[:-3] for n in os.listdir(fleet)
                             if n.startswith("test_") and n[:-3] in {r.split(",")[0] for r in
                                                                     make_patch.testslist_rows(k)})
            self.assertTrue(drivers)
            suite = unittest.TestSuite(unittest.TestLoader().loadTestsFromModule(self.load_driver(n, k))
                                       for n in drivers)
            result = self.run_patched(suite)
            self.assertEqual([f"PR {k + 1}: {t}: {tb}" for t, tb in result.failures + result.errors], [])
            self.assertGreater(result.testsRun - len(result.skipped), 0, f"PR {k + 1}: nothing ran")

    def check_imports(self, k, modules):
        env = dict(os.environ, PYTHONPATH=self.site)
        env.pop("PADDLE_OVERLAY", None)
        out = subprocess.run([sys.executable, "-c", PROBE, *modules], env=env, cwd=self.site,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, f"PR {k + 1} does not import:\n{out.stderr}")
        info = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(info["version"], self.version)
        self.assertEqual(info["paddle"], os.path.join(self.site, "paddle", "__init__.py"))
        for name, path in info["files"].items():
            self.assertEqual(path, os.path.join(self.site, *name.split(".")) + ".py", name)
            self.assertFalse(os.path.islink(path), f"{path} must be a patched copy")
        self.assertEqual(info["origin"], [], f"PR {k + 1}: methods renamed _origin_* in the patched classes")
        self.assertFalse(info["overlay"])

    def test_apply_patch_sh_applies_the_series_and_registers_every_pr(self):
        proc = subprocess.run(
            ["bash", os.path.join(ROOT, "tools", "apply_patch.sh"), self.registered,
             make_patch.series_dir(self.version)],
            capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable), timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        after = checkout_tree.snapshot(self.registered)
        for rel in checkout_tree.UPSTREAM_FILES[:2]:  # upstream's bf16 files, byte for byte
            self.assertEqual(after[rel], self.before[rel], rel)
        rows = make_patch.testslist_rows()
        old_csv = self.before[f"{FLEET}/testslist.csv"].decode()
        self.assertEqual(after[f"{FLEET}/testslist.csv"].decode(), old_csv + "".join(r + "\n" for r in rows))
        self.assertEqual(after[f"{FLEET}/CMakeLists.txt"], self.before[f"{FLEET}/CMakeLists.txt"])
        log = make_patch.git(self.registered, "log", "--format=%s", f"v{self.version}..HEAD").splitlines()
        self.assertEqual(log[::-1], [pr["title"] for pr in make_patch.patch_series.PRS])


if __name__ == "__main__":
    unittest.main()
