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


class TestDygraphShardingStage1GradCommOverlap(TestMultipleGpus):
    # Sharding stage 1 parameter-sync overlap together with Paddle's
    # gradient-communication overlap (sharding_configs.comm_overlap) on 2
    # ranks, in one launch (start-up costs seconds): V1 with tensor_fusion
    # + comm_overlap and with comm_overlap alone, with and without gradient
    # accumulation, in every bucket mode; V2 with comm_overlap (Paddle 3.x;
    # on 2.6 Paddle's own refusal). Each bitwise equal to the same
    # configuration without the parameter-sync overlap, waits checked by
    # instrumentation, collectives per step counted.
    def test_grad_comm_overlap(self):
        self.run_mnist_2gpu(
            "dygraph_sharding_stage1_grad_comm_overlap.py",
            need_envs={"BROADCAST_OVERLAP_CASES": ""},
        )


if __name__ == "__main__":
    unittest.main()
