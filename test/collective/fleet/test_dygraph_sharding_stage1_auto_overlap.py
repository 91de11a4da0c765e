# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""``PADDLE_OVERLAY=overlap`` (paddle_overlay/auto_overlap.py, overlay only) on training code that
never calls the overlap's switch: the per-rank script launched with ``PADDLE_OVERLAY=1`` (the
baseline: overlay applied, overlap off, no overlap line) and with ``PADDLE_OVERLAY=overlap``;
every case's losses and final parameters bitwise equal across the two launches, on every rank.
The per-rank script checks each case's lines and owner (its docstring says what)."""

import glob
import json
import os
import tempfile
import unittest

import numpy as np
from legacy_test.test_parallel_dygraph_dataparallel import rank_env, run

SCRIPT = "dygraph_sharding_stage1_auto_overlap.py"
# the end of each rank's start-up line, per setting
STARTUP_ENDS = {
    "1": "(rank {rank})",
    "overlap": "(rank {rank}); PADDLE_OVERLAY=overlap: the parameter-sync overlap of every sharding stage 1 "
    "optimizer is turned on with its wrapped model (one line per optimizer)",
}


def results(folder):
    """{file name: (losses and parameters as {key: array}, or the lines)} of one launch."""
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.rank*.*"))):
        name = os.path.basename(path)
        if name.endswith(".npz"):
            with np.load(path) as data:
                found[name] = {k: data[k] for k in data.files}
        else:
            with open(path) as f:
                found[name] = json.load(f)
    return found


class AutoOverlapLaunches(unittest.TestCase):
    """Both launches of a topology and their comparison (this row's and the
    pipeline row's, test_dygraph_sharding_stage1_auto_overlap_pipeline)."""

    def launch_both(self, topology, nproc):
        """Both launches of ``topology``; returns {setting: results}."""
        out = {}
        base = tempfile.mkdtemp(prefix="auto-overlap-", dir=os.environ.get("PADDLE_OVERLAY_RUN_DIR"))
        for setting in ("1", "overlap"):
            folder = os.path.join(base, f"{topology}-{setting}")
            os.makedirs(folder)
            env = {"PADDLE_OVERLAY": setting, "AUTO_OVERLAP_RESULTS": folder, "AUTO_OVERLAP_TOPOLOGY": topology}
            launched = run(self, SCRIPT, nproc, rank_env("auto_growth", env))
            for rank, log in enumerate(launched.rank_logs):
                said = [l for l in log.splitlines() if l.startswith("paddle_overlay: applied to Paddle ")]
                self.assertEqual(len(said), 1, said)
                self.assertTrue(said[0].endswith(STARTUP_ENDS[setting].format(rank=rank)), said[0])
            out[setting] = results(folder)
        return out

    def check(self, out, nproc):
        off, on = out["1"], out["overlap"]
        self.assertEqual(sorted(off), sorted(on))
        arrays = [n for n in on if n.endswith(".npz")]
        self.assertEqual(len(arrays) % nproc, 0, arrays)
        for name in arrays:
            self.assertEqual(sorted(off[name]), sorted(on[name]), name)
            for key in on[name]:
                a, b = off[name][key], on[name][key]
                self.assertEqual((a.dtype, a.shape, a.tobytes()), (b.dtype, b.shape, b.tobytes()), f"{name} {key}")
        for name in on:
            if name.endswith(".lines.json"):
                self.assertEqual(off[name], [], name)  # PADDLE_OVERLAY=1 prints no overlap line
                self.assertTrue(on[name], name)
                print(f"{name}: {on[name]}")



class TestDygraphShardingStage1AutoOverlap(AutoOverlapLaunches):
    def test_two_ranks(self):
        # V1 and V2 scripts (model or optimizer first), an ERNIE-style HybridParallelOptimizer
        # subclass built directly, a PaddleFormers-style _wrap_model, the refused and off cases
        self.check(self.launch_both("sharding2", 2), 2)


if __name__ == "__main__":
    unittest.main()
