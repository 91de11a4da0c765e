# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.
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

import json
import unittest

from legacy_test.test_parallel_dygraph_dataparallel import TestMultipleGpus

import paddle

MODELS = "dygraph_sharding_stage1_broadcast_overlap_models.py"
BUCKETS = "dygraph_sharding_stage1_broadcast_overlap_buckets.py"
READS = "dygraph_sharding_stage1_broadcast_overlap_reads.py"
GRAD_COMM = "dygraph_sharding_stage1_grad_comm_overlap.py"
SCHEDULE = "dygraph_sharding_stage1_broadcast_overlap_schedule.py"
NO_HOST_SYNC = "dygraph_sharding_stage1_no_host_sync.py"
# the patch script's bf16 case as far as a CPU allows (O1 runs in float32)
BF16_CPU = "dygraph_sharding_stage1_broadcast_overlap_bf16_cpu.py"
# runs several scripts' case groups in one launch (env
# BROADCAST_OVERLAP_GROUPS: [script, cases ("" = every case of the
# script's launch), env the script is imported with])
GROUPS = "dygraph_sharding_stage1_broadcast_overlap_groups.py"

# Every group of 2 ranks with sharding degree 2 in one launch: Paddle
# start-up costs seconds per rank and launch.
SHARDING2_GROUPS = [
    # reads through every path, one broadcast per parameter
    # (bucket_size_mb=0); the foundation cases (on vs off, order, waits,
    # hooks) run in both modes in test_dygraph_sharding_stage1_broadcast_overlap
    [READS, ""],
    # model kinds and state, and training loops that break naive overlap,
    # with 2 KB buckets (and per parameter where an assertion holds in that
    # mode only); sharding degree 1 is refused in-process:
    # test/unit/test_hybrid_overlap_delegation.py
    [MODELS, ""],
    # bucket storage itself: tied, frozen, dtypes, sizes, checkpoints, ...
    [BUCKETS, ""],
    # with Paddle's gradient-communication overlap
    # (sharding_configs.comm_overlap): V1 with tensor_fusion + comm_overlap
    # and comm_overlap alone, with and without gradient accumulation, in
    # every bucket mode; V2 with comm_overlap (Paddle 3.x; on 2.6 Paddle's
    # own refusal); collectives per step counted
    [GRAD_COMM, ""],
    [BF16_CPU, ""],
    # one rank saves, evaluates, reads parameters or runs a compiled
    # program between steps while the others go on to a collective, V1
    # with 2 KB buckets (the schedule script's set-up v1: this fleet.init;
    # V2's, the all-gather script's fleet.init, is a group of the
    # all-gather row's launch); its cases assert the race checker on, so
    # the whole launch runs under it
    [SCHEDULE, "", {"SCHEDULE_SETUP": "v1"}],
]
if not paddle.__version__.startswith("2."):
    # the overlap adds no host synchronisation and no blocking collective
    # to the steady-state step, in every mode: the owner's logic, the same
    # on every release (docs/harness.md, "Which rows run where")
    SHARDING2_GROUPS.append([NO_HOST_SYNC, ""])


class TestDygraphShardingStage1BroadcastOverlapCatalogue(TestMultipleGpus):
    # One launch on 2 ranks running every group of cases (start-up costs
    # seconds): broadcast overlap on vs off bitwise equal, waits checked by
    # instrumentation, hooks, orders and misuse, buckets, with Paddle's
    # gradient-communication overlap, ranks whose control flow between
    # steps differs; under paddle_overlay's race checker.
    def test_sharding2_groups(self):
        self.run_mnist_2gpu(
            GROUPS,
            need_envs={
                "BROADCAST_OVERLAP_GROUPS": json.dumps(SHARDING2_GROUPS),
                "PADDLE_OVERLAY_CHECK": "1",
            },
        )


if __name__ == "__main__":
    unittest.main()
