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

from legacy_test.test_parallel_dygraph_dataparallel import TestMultipleGpus

SCRIPT = "dygraph_sharding_stage1_broadcast_overlap_schedule.py"


class TestDygraphShardingStage1BroadcastOverlapSchedule(TestMultipleGpus):
    # One rank saves, evaluates, reads parameters or runs a compiled
    # program between steps while the others go on, then a collective:
    # overlap on equals off bitwise, and no rank issues a collective the
    # others do not. V2 (the all-gather script's fleet.init), every case;
    # the race checker on (the EMA case's reads must be named, no other).
    # V1's cases run in the catalogue row's launch (the same fleet.init),
    # the 4-rank set-ups in the hybrid row's launches of their topology.
    def test_schedule_v2(self):
        self.run_mnist_2gpu(
            SCRIPT,
            need_envs={"SCHEDULE_SETUP": "v2", "PADDLE_OVERLAY_CHECK": "1"},
        )


if __name__ == "__main__":
    unittest.main()
