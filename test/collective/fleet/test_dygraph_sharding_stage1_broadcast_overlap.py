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
from parameterized import parameterized

FOUNDATION = "dygraph_sharding_stage1_broadcast_overlap.py"
MODELS = "dygraph_sharding_stage1_broadcast_overlap_models.py"
LOOPS = "dygraph_sharding_stage1_broadcast_overlap_loops.py"
BUCKETS = "dygraph_sharding_stage1_broadcast_overlap_buckets.py"
READS = "dygraph_sharding_stage1_broadcast_overlap_reads.py"

# (launch name, per-rank script, cases run in that launch, extra env)
# 2 KB buckets: several windows per model, so bucket boundaries fall
# inside layers (the default 256 MB puts these small models in one window).
SMALL_BUCKETS = {"BROADCAST_OVERLAP_BUCKET_MB": "0.002"}

# (launch name, per-rank script, cases run in that launch ("" = all of the
# script's cases), extra env). One launch per script and mode: Paddle
# start-up costs seconds, so cases share a launch.
LAUNCHES = [
    # one broadcast per parameter (bucket_size_mb=0)
    ("per_parameter_foundation", FOUNDATION, "", {}),
    ("per_parameter_reads", READS, "", {}),
    # every case again with buckets: bitwise equal to off, no read of a
    # pending bucket (the checker maps bucket broadcasts to parameters)
    ("buckets_foundation", FOUNDATION, "", SMALL_BUCKETS),
    (
        "buckets_model_kinds_and_state",
        MODELS,
        "root_owned_parameter,tied_weights,built_out_of_forward_order,"
        "custom_parameter_names,unreachable_parameters_waited_and_named,"
        "frozen_and_gradless_parameters,amp_o2_main_grad,"
        "user_pre_hook_reads_waited_parameters,parameter_list_waited_by_parent,"
        "layer_not_run_and_eval_between_steps,"
        "state_dict_and_save_without_synchronize,checkpoint_resume,"
        "load_into_inner_model_or_sublayer_waits,"
        "bad_input_raises_before_any_change",
        SMALL_BUCKETS,
    ),
    ("buckets_loops", LOOPS, "", SMALL_BUCKETS),
    # bucket storage itself: tied, frozen, dtypes, sizes, checkpoints, ...
    ("bucket_storage", BUCKETS, "", {}),
    (
        "sharding_degree_1_refused",
        MODELS,
        "without_sharding_refused",
        {"BROADCAST_OVERLAP_SHARDING_DEGREE": "1"},
    ),
]


class TestDygraphShardingStage1BroadcastOverlap(TestMultipleGpus):
    # Each case is one launch of a per-rank script on 2 ranks running a group
    # of cases (chosen by BROADCAST_OVERLAP_CASES; start-up costs seconds, so
    # cases share a launch): broadcast overlap on vs off bitwise equal, waits
    # checked by instrumentation, hooks, orders and misuse.
    @parameterized.expand(LAUNCHES)
    def test_launch(self, _name, script, cases, env):
        self.run_mnist_2gpu(
            script, need_envs={"BROADCAST_OVERLAP_CASES": cases, **env}
        )


if __name__ == "__main__":
    unittest.main()
