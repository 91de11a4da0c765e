# Copyright (c) 2026 paddle_overlay authors. All Rights Reserved.
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
"""Driver: the patch path passes the same collective tests as the overlay path.

For the running Paddle's version this test

1. lays out the installed wheel's optimizer files as a git tree tagged
   ``v<version>`` (``tools/make_patch.py``), applies the committed
   ``patches/paddle-v<version>-stage1-broadcast-overlap.patch`` to it with
   ``git apply --check`` then ``git apply`` (a version without a committed
   patch gets one generated from the current overlay source);
2. builds ``build/patched-paddle-<version>/site/paddle``: every file and
   folder links to the installed package except the patched files of
   ``dygraph_optimizer``, which are copies from the patched tree; next to it a
   ``paddle_overlay`` stub that fails on import, so nothing of the overlay can
   leak into the run;
3. runs every launch of ``test_dygraph_sharding_stage1_broadcast_overlap.py``
   with the per-rank scripts the patch added to the tree, under the real
   launcher, with that folder first on PYTHONPATH and
   ``PADDLE_OVERLAY_MODE=patched``.

This file checks this repository's patch; it is not part of the patch.
"""

import os
import shutil
import subprocess
import sys
import unittest

from parameterized import parameterized

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_patch  # noqa: E402
import test_dygraph_sharding_stage1_broadcast_overlap as overlay_driver  # noqa: E402
from collective_launch import CollectiveTestCase  # noqa: E402

STUB = '''raise ImportError(
    "paddle_overlay must not be imported in a patched-Paddle run "
    "(PADDLE_OVERLAY_MODE=patched): the overlay is in the Paddle sources"
)
'''

PROBE = r"""
import json
import paddle
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_overlap, dygraph_sharding_optimizer as dso, hybrid_parallel_optimizer as hpo,
)
print(json.dumps({
    "version": paddle.__version__,
    "paddle": paddle.__file__,
    "dso": dso.__file__,
    "hpo": hpo.__file__,
    "broadcast_overlap": broadcast_overlap.__file__,
    "origin_step": hasattr(dso.DygraphShardingOptimizer, "_origin_step"),
    "hpo_set_broadcast_overlap": hpo.HybridParallelOptimizer._set_broadcast_overlap.__code__.co_filename,
}))
"""


class TestPatchedTreeBroadcastOverlap(CollectiveTestCase):
    @classmethod
    def setUpClass(cls):
        import paddle

        cls.pkg = make_patch.paddle_package_dir(os.path.dirname(paddle.__file__))
        cls.version, _ = make_patch.wheel_version(cls.pkg)
        work = os.path.join(ROOT, "build", f"patched-paddle-{cls.version}")
        if os.path.lexists(work):
            shutil.rmtree(work)
        os.makedirs(work)
        cls.tree = os.path.join(work, "tree")
        make_patch.layout_wheel_tree(cls.pkg, cls.tree)

        cls.patch = make_patch.patch_path(cls.version)
        if not os.path.isfile(cls.patch):
            text, _ = make_patch.make_wheel_patch(cls.pkg, cls.version)
            cls.patch = os.path.join(work, os.path.basename(cls.patch))
            with open(cls.patch, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            print(f"no committed patch for Paddle {cls.version}; generated {cls.patch}", file=sys.stderr)
        for args in (("apply", "--check", cls.patch), ("apply", cls.patch)):
            make_patch.git(cls.tree, *args)

        cls.site = os.path.join(work, "site")
        make_patch.build_patched_package(cls.pkg, cls.tree, cls.site)
        os.makedirs(os.path.join(cls.site, "paddle_overlay"))
        with open(os.path.join(cls.site, "paddle_overlay", "__init__.py"), "w") as f:
            f.write(STUB)
        path = [cls.site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        cls.env = {"PYTHONPATH": os.pathsep.join(path), "PADDLE_OVERLAY_MODE": "patched"}

    def test_patched_modules_are_imported(self):
        env = dict(os.environ, **self.env)
        out = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, cwd=self.site, capture_output=True, text=True, timeout=120
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        import json

        info = json.loads(out.stdout.strip().splitlines()[-1])
        opt_dir = os.path.join(self.site, "paddle", *make_patch.TREE_OPT_DIR.split("/")[2:])
        self.assertEqual(info["version"], self.version)
        self.assertEqual(info["paddle"], os.path.join(self.site, "paddle", "__init__.py"))
        for key in ("dso", "hpo", "broadcast_overlap", "hpo_set_broadcast_overlap"):
            self.assertEqual(os.path.dirname(info[key]), opt_dir, key)
            self.assertFalse(os.path.islink(info[key]), f"{info[key]} must be a patched copy")
        self.assertTrue(info["origin_step"], "DygraphShardingOptimizer._origin_step missing: not the patched module")
        # the per-rank scripts come from the patched tree, byte for byte those of this folder
        for launch in overlay_driver.LAUNCHES:
            script = launch[1]
            with open(os.path.join(self.tree, make_patch.TREE_TEST_DIR, script), "rb") as a:
                with open(os.path.join(HERE, script), "rb") as b:
                    self.assertTrue(
                        a.read() == b.read(),
                        f"{script} of {self.patch} differs from this folder's: the patch is stale; "
                        "regenerate it (docs/patches.md)",
                    )

    @parameterized.expand(overlay_driver.LAUNCHES)
    def test_launch(self, _name, script, cases, env):
        self.run_collective(
            os.path.join(self.tree, make_patch.TREE_TEST_DIR, script),
            nproc=2,
            timeout=240,
            env={"BROADCAST_OVERLAP_CASES": cases, **env, **self.env},
        )


if __name__ == "__main__":
    unittest.main()
