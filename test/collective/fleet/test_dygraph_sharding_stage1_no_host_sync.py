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

SCRIPT = "dygraph_sharding_stage1_no_host_sync.py"


class TestDygraphShardingStage1NoHostSync(TestMultipleGpus):
    # One launch on 2 ranks: every parameter-sync mode (V1 per parameter,
    # buckets, fused slices; V2 comm buffers), overlap off vs on: inside
    # step(), after the first step, the same host synchronisations and the
    # same collectives except the parameter sync's own, which are the
    # owner's units, all asynchronous; bitwise equal results.
    def test_no_host_sync_in_step(self):
        self.run_mnist_2gpu(SCRIPT)


if __name__ == "__main__":
    unittest.main()
