# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The committed patch, applied to a checkout-like tree, passes the collective tests there.

For the running Paddle's version (the runner runs this once per version) this test

1. builds a checkout-like tree (``checkout_tree.build``: python/ from the installed wheel,
   this project's stand-ins for upstream's test/ files, no generator), tagged
   ``v<version>``;
2. on a copy, applies ``patches/paddle-v<version>-stage1-broadcast-overlap.patch`` with
   plain ``git apply``: only python/ files change, everything under test/ is new;
3. on the tree, runs ``tools/apply_patch.sh``: our rows are appended to ``testslist.csv``,
   upstream's bf16 row and files and ``CMakeLists.txt`` are untouched (the tree has no
   generator: a line says what to run);
4. builds ``.test-out/patched-paddle-<version>/site/paddle`` (links to the installed package except
   the patched ``dygraph_optimizer`` files; next to it a ``paddle_overlay`` stub that fails on
   import) and checks that Paddle imports the patched modules;
5. runs the driver ``test_dygraph_sharding_stage1_broadcast_overlap.py`` from the tree (through
   the ``TestMultipleGpus`` stand-in) for case groups that exercise the patched code, in one
   launch: overlap on vs off bitwise equal with the wait checker, and the forward order, hooks
   and hybrid-optimizer syncs. What those launches need that the patch does not carry (the driver and per-rank
   scripts of the wider catalogue, the wait checker, the CPU shim for fused buffers on the CPU)
   is brought from this project's ``test/collective/fleet`` into the tree, beside the patch's
   own files, after the patch is applied; the patch's own drivers run there too.

Not part of the patch: this checks the patch itself.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import checkout_tree  # noqa: E402
from checkout_tree import FLEET, make_patch  # noqa: E402

CATALOGUE = "test_dygraph_sharding_stage1_broadcast_overlap_catalogue"
# (script, bucket_size_mb) of the catalogue's SHARDING2_GROUPS run from the tree, in one launch
# (the patch's own driver runs the foundation cases in both modes: the test below)
REPRESENTATIVE = (("dygraph_sharding_stage1_broadcast_overlap_reads.py", 0),)
STUB = '''raise ImportError(
    "paddle_overlay must not be imported in a patched-Paddle run: "
    "the overlay is in the Paddle sources"
)
'''
PROBE = r"""
import json
import paddle
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    param_sync_overlap, dygraph_sharding_optimizer as dso, hybrid_parallel_optimizer as hpo,
)
print(json.dumps({
    "version": paddle.__version__,
    "paddle": paddle.__file__,
    "dso": dso.__file__,
    "hpo": hpo.__file__,
    "param_sync_overlap": param_sync_overlap.__file__,
    "origin_step": hasattr(dso.DygraphShardingOptimizer, "_origin_step"),
    "hpo_set_broadcast_overlap": hpo.HybridParallelOptimizer._set_broadcast_overlap.__code__.co_filename,
}))
"""


def git_status(tree):
    return make_patch.git(tree, "status", "--porcelain", "--untracked-files=all").splitlines()


class TestPatchedTreeBroadcastOverlap(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import paddle

        cls.pkg = make_patch.paddle_package_dir(os.path.dirname(paddle.__file__))
        cls.version, _ = make_patch.wheel_version(cls.pkg)
        cls.patch = make_patch.patch_path(cls.version)
        if not os.path.isfile(cls.patch):
            raise unittest.SkipTest(f"no committed patch for Paddle {cls.version}: {cls.patch}")
        work = os.path.join(ROOT, ".test-out", f"patched-paddle-{cls.version}")
        if os.path.lexists(work):
            shutil.rmtree(work)
        os.makedirs(work)
        cls.tree = os.path.join(work, "tree")
        checkout_tree.build(cls.pkg, cls.tree)
        cls.before = checkout_tree.snapshot(cls.tree)
        cls.plain = os.path.join(work, "plain-git-apply")
        shutil.copytree(cls.tree, cls.plain, symlinks=True)

        cls.apply = subprocess.run(
            ["bash", os.path.join(ROOT, "tools", "apply_patch.sh"), cls.tree, cls.patch],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHON=sys.executable),
            timeout=300,
        )
        if cls.apply.returncode != 0:
            raise AssertionError(f"apply_patch.sh failed:\n{cls.apply.stdout}\n{cls.apply.stderr}")
        fleet = os.path.join(cls.tree, FLEET)
        cls.brought = sorted(n for n in os.listdir(make_patch.TEST_DIR) if n.endswith(".py")
                             and not os.path.exists(os.path.join(fleet, n)))
        for name in cls.brought:  # from outside the patch: never part of it
            shutil.copyfile(os.path.join(make_patch.TEST_DIR, name), os.path.join(fleet, name))
        cls.site = os.path.join(work, "site")
        checkout_tree.build_patched_package(cls.pkg, cls.tree, cls.site)
        os.makedirs(os.path.join(cls.site, "paddle_overlay"))
        with open(os.path.join(cls.site, "paddle_overlay", "__init__.py"), "w") as f:
            f.write(STUB)

    def test_plain_git_apply_changes_python_and_adds_test_files(self):
        make_patch.git(self.plain, "apply", "--check", self.patch)
        make_patch.git(self.plain, "apply", self.patch)
        status = git_status(self.plain)
        modified = sorted(line[3:] for line in status if not line.startswith("??"))
        added = sorted(line[3:] for line in status if line.startswith("??"))
        self.assertEqual(
            modified,
            sorted({f"{make_patch.TREE_OPT_DIR}/{name}" for name, _ in make_patch.SPLICED}),
        )
        expected_new = [f"{make_patch.TREE_OPT_DIR}/{n}" for n in make_patch.NEW_MODULES]
        expected_new += [f"{FLEET}/{n}" for n in make_patch.TEST_FILES]
        self.assertEqual(added, sorted(expected_new), f"{self.patch} is stale: run tools/update_generated.sh")
        self.assertEqual(checkout_tree.snapshot(self.plain)[f"{FLEET}/testslist.csv"], self.before[f"{FLEET}/testslist.csv"])

    def test_registration_appends_rows_and_keeps_upstream_entries(self):
        after = checkout_tree.snapshot(self.tree)
        for rel in checkout_tree.UPSTREAM_FILES[:2]:  # upstream's bf16 files, byte for byte
            self.assertEqual(after[rel], self.before[rel], rel)
        rows = make_patch.testslist_rows()
        self.assertTrue(rows)
        old_csv = self.before[f"{FLEET}/testslist.csv"].decode()
        self.assertEqual(after[f"{FLEET}/testslist.csv"].decode(), old_csv + "".join(r + "\n" for r in rows))
        self.assertIn(f"\n{checkout_tree.UPSTREAM_ROW},", old_csv)
        self.assertEqual(after[f"{FLEET}/CMakeLists.txt"], self.before[f"{FLEET}/CMakeLists.txt"])
        self.assertIn(f"run Paddle's generator in the tree: python3 tools/gen_ut_cmakelists.py -f {FLEET}/testslist.csv",
                      self.apply.stdout)
        self.assertIn(f"registered in {FLEET}/testslist.csv:\n", self.apply.stdout)

    def test_patched_modules_are_imported(self):
        env = dict(os.environ, PYTHONPATH=self.site)
        env.pop("PADDLE_OVERLAY", None)
        out = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, cwd=self.site, capture_output=True, text=True, timeout=120
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        info = json.loads(out.stdout.strip().splitlines()[-1])
        opt_dir = os.path.join(self.site, "paddle", *make_patch.TREE_OPT_DIR.split("/")[2:])
        self.assertEqual(info["version"], self.version)
        self.assertEqual(info["paddle"], os.path.join(self.site, "paddle", "__init__.py"))
        for key in ("dso", "hpo", "param_sync_overlap", "hpo_set_broadcast_overlap"):
            self.assertEqual(os.path.dirname(info[key]), opt_dir, key)
            self.assertFalse(os.path.islink(info[key]), f"{info[key]} must be a patched copy")
        self.assertTrue(info["origin_step"], "DygraphShardingOptimizer._origin_step missing: not the patched module")

    def load_driver(self, name):
        """The driver ``name`` (no ``.py``) of the tree's test folder, imported from there."""
        spec = importlib.util.spec_from_file_location(f"patched_tree_{name}", os.path.join(self.tree, FLEET, name + ".py"))
        driver = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = driver  # the stand-in finds the per-rank scripts next to it
        spec.loader.exec_module(driver)
        return driver

    def run_patched(self, suite):
        """Run ``suite`` with the ranks importing the patched package first, never the overlay."""
        saved = dict(os.environ)
        try:
            os.environ["PYTHONPATH"] = os.pathsep.join([self.site] + [p for p in saved.get("PYTHONPATH", "").split(os.pathsep) if p])
            os.environ["PADDLE_OVERLAY_MODE"] = "patched"
            os.environ.pop("PADDLE_OVERLAY", None)
            return unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_collective_launches_from_the_patched_tree(self):
        self.assertIn(CATALOGUE + ".py", self.brought)
        driver = self.load_driver(CATALOGUE)
        groups = [g for g in driver.SHARDING2_GROUPS if (g[0], g[2]) in REPRESENTATIVE and g[1] == ""]
        self.assertEqual(len(groups), len(REPRESENTATIVE), f"{CATALOGUE}.SHARDING2_GROUPS lacks some of {REPRESENTATIVE}: update REPRESENTATIVE")
        cls = driver.TestDygraphShardingStage1BroadcastOverlapCatalogue
        case = cls(unittest.TestLoader().getTestCaseNames(cls)[0])  # the driver's base finds the scripts
        env = {"BROADCAST_OVERLAP_GROUPS": json.dumps(groups)}
        launch = unittest.FunctionTestCase(lambda: case.run_mnist_2gpu(driver.GROUPS, need_envs=env))
        result = self.run_patched(unittest.TestSuite([launch]))
        problems = [f"{t}: {tb}" for t, tb in result.failures + result.errors]
        problems += [f"{t}: skipped: {why}" for t, why in result.skipped]
        self.assertEqual(problems, [])
        self.assertEqual(result.testsRun, 1)

    def test_the_patchs_own_drivers_run_from_the_tree(self):
        drivers = [n[:-3] for n in make_patch.TEST_FILES if n.startswith("test_")]
        self.assertTrue(drivers)
        suite = unittest.TestSuite(unittest.TestLoader().loadTestsFromModule(self.load_driver(n)) for n in drivers)
        result = self.run_patched(suite)
        self.assertEqual([f"{t}: {tb}" for t, tb in result.failures + result.errors], [])
        self.assertGreater(result.testsRun, 0)  # skipped with its reason where it needs GPUs


if __name__ == "__main__":
    unittest.main()
