# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""``PADDLE_OVERLAY=overlap`` (paddle_overlay/auto_overlap.py, overlay only) on training code that
never calls the overlap's switch: the per-rank script launched with ``PADDLE_OVERLAY=overlap``; each
case trains first with the overlay as ``PADDLE_OVERLAY=1`` applies it (the baseline: overlap off, no
overlap line) and then as ``PADDLE_OVERLAY=overlap`` does, in the same process
(``paddle_overlay.remove()`` and ``apply()`` between them), its losses and final parameters bitwise
equal, on every rank. The per-rank script checks each case's lines and owner (its docstring says
what); here, each rank's start-up line and the applications that follow it."""

import unittest

from legacy_test.test_parallel_dygraph_dataparallel import rank_env, run

SCRIPT = "dygraph_sharding_stage1_auto_overlap.py"
APPLIED = "paddle_overlay: applied to Paddle "
# the end of the line apply() prints, per setting: at start-up (overlap), then per case 1 and overlap
ENDS = {
    "1": "(rank {rank})",
    "overlap": "(rank {rank}); PADDLE_OVERLAY=overlap: the parameter-sync overlap of every sharding stage 1 "
    "optimizer is turned on with its wrapped model (one line per optimizer)",
}


class AutoOverlapLaunch(unittest.TestCase):
    """One launch of a topology and its start-up lines (this row's and the pipeline row's,
    test_dygraph_sharding_stage1_auto_overlap_pipeline)."""

    def launch(self, topology, nproc):
        env = {"PADDLE_OVERLAY": "overlap", "AUTO_OVERLAP_TOPOLOGY": topology}
        launched = run(self, SCRIPT, nproc, rank_env("auto_growth", env))
        for rank, log in enumerate(launched.rank_logs):
            said = [l for l in log.splitlines() if l.startswith(APPLIED)]
            cases = (len(said) - 1) // 2
            self.assertGreater(cases, 0, said)
            settings = ["overlap"] + ["1", "overlap"] * cases
            self.assertEqual(len(said), len(settings), said)
            for line, setting in zip(said, settings):
                self.assertTrue(line.endswith(ENDS[setting].format(rank=rank)), line)


class TestDygraphShardingStage1AutoOverlap(AutoOverlapLaunch):
    def test_two_ranks(self):
        # V1 and V2 scripts (model or optimizer first), an ERNIE-style HybridParallelOptimizer
        # subclass built directly, a PaddleFormers-style _wrap_model, the refused and off cases
        self.launch("sharding2", 2)


if __name__ == "__main__":
    unittest.main()
