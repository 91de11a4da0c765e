# Copyright (c) 2026 paddle_overlay authors. All Rights Reserved.
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
"""Driver: sharding stage 1 bf16 (O1 vs O2 main_grad, overlap on vs off) on 2 GPUs.

Launches ``dygraph_group_sharded_stage1_bf16.py`` on 2 GPUs. Unlike upstream's
driver, which returns at once (and passes) on a Paddle without CUDA, this test
says skipped with the reason when Paddle lacks CUDA, fewer than 2 GPUs are
visible, or the GPU lacks bf16.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collective_launch import CollectiveTestCase, launch_collective, skip_reason  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dygraph_group_sharded_stage1_bf16.py")
NPROC = 2


def bf16_skip_reason(nproc=NPROC):
    """Why the bf16 GPU test cannot run here, or None."""
    reason = skip_reason(nproc, "gpu")
    if reason:
        return reason
    import paddle

    if not paddle.amp.is_bfloat16_supported("gpu:0"):
        return "needs bf16 on the GPU (compute capability 8.0 or newer)"
    return None


class TestDygraphGroupShardedStage1BF16(CollectiveTestCase):
    def test_stage1_bf16(self):
        reason = bf16_skip_reason()
        if reason:
            self.skipTest(reason)
        try:
            launch_collective(SCRIPT, nproc=NPROC, timeout=180, device="gpu")
        except unittest.SkipTest as e:
            self.skipTest(str(e))


if __name__ == "__main__":
    unittest.main()
