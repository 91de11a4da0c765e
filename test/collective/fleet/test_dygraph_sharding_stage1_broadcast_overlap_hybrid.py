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

import unittest

from collective.test_communication_api_base import CommunicationTestDistBase
from parameterized import parameterized

HYBRID = "dygraph_sharding_stage1_broadcast_overlap_hybrid.py"

# (topology, per-rank script, env): one 4-rank launch each; fleet.init runs
# once per process.
LAUNCHES = [
    # train_batch, tied embedding/head, eval_batch, save; with the
    # pipeline's gradient-communication overlap (pp_configs.
    # sharding_comm_overlap): V1 and V2, plain and with a tied
    # embedding/head, collectives per step counted
    ("pp2_sharding2", HYBRID, {}),
    # v2_*: sharding stage 1 V2 (split_param set around building the
    # optimizer) with the all-gather overlap, in the same launches
    (
        "dp2_sharding2",
        HYBRID,
        {
            "BROADCAST_OVERLAP_CASES": "sharding_group_layout,"
            "v2_allgather_overlap_on_off"
        },
    ),
    (
        "mp2_sharding2",
        HYBRID,
        {
            "BROADCAST_OVERLAP_CASES": "sharding_group_layout,"
            "mp_step_launches_after_parameter_syncs,"
            "v2_allgather_overlap_on_off,"
            "mp_v2_step_launches_after_parameter_syncs"
        },
    ),
]


class TestDygraphShardingStage1BroadcastOverlapHybrid(
    CommunicationTestDistBase
):
    # Sharding stage 1 broadcast overlap inside hybrid topologies on 4 ranks:
    # pipeline (train_batch, tied embedding/head, eval_batch, save, with and
    # without the pipeline's gradient-communication overlap), data and model
    # parallel with sharding groups that do not start at rank 0; in the last
    # two also V2's all-gather overlap.
    def setUp(self):
        super().setUp(num_of_devices=4, timeout=300)

    @parameterized.expand(LAUNCHES)
    def test_topology(self, topology, script, env):
        self.run_test_case(
            script,
            user_defined_envs={"BROADCAST_OVERLAP_TOPOLOGY": topology, **env},
        )


if __name__ == "__main__":
    unittest.main()
