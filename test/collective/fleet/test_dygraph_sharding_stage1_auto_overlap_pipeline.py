# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""``PADDLE_OVERLAY=overlap`` on a pipeline (pp2 x sharding2, 4 ranks) that never calls the overlap's
switch: ``fleet.distributed_model``'s ``PipelineParallel`` is the wrapped model, ``train_batch`` runs the
update; launched and checked as the sharding-degree-2 row does (test_dygraph_sharding_stage1_auto_overlap:
each case bitwise equal to its baseline, run in the same process with the overlay as ``PADDLE_OVERLAY=1``
applies it). A row of its own: what it adds to that row is the product's choice of the wrapped model, the
same on every release, so it runs on the newest release only (docs/harness.md, "Which rows run where")."""

import unittest

import test_dygraph_sharding_stage1_auto_overlap as auto_overlap


class TestDygraphShardingStage1AutoOverlapPipeline(auto_overlap.AutoOverlapLaunch):
    def test_pipeline_four_ranks(self):
        self.launch("pp2_sharding2", 4)


if __name__ == "__main__":
    unittest.main()
