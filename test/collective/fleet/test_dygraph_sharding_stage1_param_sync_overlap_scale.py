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

SCRIPT = "dygraph_sharding_stage1_param_sync_overlap_scale.py"


class TestDygraphShardingStage1ParamSyncOverlapScale(CommunicationTestDistBase):
    # The parameter sync overlap on 8 ranks, one launch per topology (fleet
    # initializes once per process), every case overlap off vs on bitwise
    # equal with the waits checked: sharding degree 8 (V1 with small
    # buckets and per parameter, uneven owners and a rank owning only
    # frozen parameters; V2 with tiny and odd sizes, a frozen comm buffer
    # and uneven per-rank padding), and pp2 x sharding4 with a tied
    # embedding/head.
    def setUp(self):
        super().setUp(num_of_devices=8, timeout=600)

    @parameterized.expand([("sharding8",), ("pp2_sharding4",)])
    def test_topology(self, topology):
        self.run_test_case(
            SCRIPT, user_defined_envs={"PARAM_SYNC_SCALE_TOPOLOGY": topology}
        )


if __name__ == "__main__":
    unittest.main()
