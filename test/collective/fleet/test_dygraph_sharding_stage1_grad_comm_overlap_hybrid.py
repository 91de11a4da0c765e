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


class TestDygraphShardingStage1GradCommOverlapHybrid(CommunicationTestDistBase):
    # The parameter-sync overlap together with the pipeline's gradient-
    # communication overlap (pp_configs.sharding_comm_overlap) on 4 ranks,
    # pp2 x sharding2, in one launch: V1 and V2, plain and with a tied
    # embedding/head; each bitwise equal to the same configuration without
    # the parameter-sync overlap, waits checked, collectives per step
    # counted.
    def setUp(self):
        super().setUp(num_of_devices=4, timeout=300)

    def test_pipeline_sharding_comm_overlap(self):
        self.run_test_case(
            "dygraph_sharding_stage1_grad_comm_overlap_pipeline.py",
            user_defined_envs={
                "BROADCAST_OVERLAP_TOPOLOGY": "pp2_sharding2",
                "BROADCAST_OVERLAP_CASES": "",
            },
        )


if __name__ == "__main__":
    unittest.main()
