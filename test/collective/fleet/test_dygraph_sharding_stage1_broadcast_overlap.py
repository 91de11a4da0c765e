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
_PER_PARAMETER = [
    (
        "on_off_bitwise_equal",
        FOUNDATION,
        "equal_acc1,equal_acc2,equal_minimize,checker_catches_missing_wait",
        {},
    ),
    (
        "order_and_hooks",
        FOUNDATION,
        "forward_order_recorded,hooks_constant_and_removed,"
        "hybrid_step_launches_after_its_parameter_syncs",
        {},
    ),
    (
        "model_kinds",
        MODELS,
        "root_owned_parameter,tied_weights,built_out_of_forward_order,"
        "custom_parameter_names,unreachable_parameters_waited_and_named,"
        "frozen_and_gradless_parameters,amp_o2_main_grad,"
        "user_pre_hook_reads_waited_parameters,parameter_list_waited_by_parent",
        {},
    ),
    (
        "state_and_misuse",
        MODELS,
        "layer_not_run_and_eval_between_steps,"
        "state_dict_and_save_without_synchronize,checkpoint_resume,"
        "load_into_inner_model_or_sublayer_waits,"
        "bad_input_raises_before_any_change",
        {},
    ),
    (
        "rank_dependent_loops",
        LOOPS,
        "forward_order_differs_between_ranks_and_steps,"
        "expert_routing_leaves_experts_unused,"
        "ranks_run_different_forward_counts,"
        "forwards_without_backward_tables_bounded",
        {},
    ),
    (
        "loop_shapes",
        LOOPS,
        "recompute_reentrant_and_not,"
        "layer_called_twice_and_two_forwards_per_backward,"
        "skipped_steps_first_included,weights_replaced_between_steps,"
        "parameters_read_without_call,trainability_changed_mid_training",
        {},
    ),
    (
        "reads_outside_model_call",
        READS,
        "helper_forward_outside_model_call,weight_norm_logging_between_steps,"
        "parameters_loop_between_steps,guard_removed_reads_are_caught,"
        "held_reference_is_documented_limit",
        {},
    ),
    (
        "lifecycle",
        LOOPS,
        "two_optimizers_share_one_model,toggle_on_off_on_mid_training,"
        "deepcopy_loads_copy_and_collected_optimizer_closed,"
        "error_after_update_then_training_continues",
        {},
    ),
]
LAUNCHES = [
    *_PER_PARAMETER,
    (
        "buckets",
        BUCKETS,
        "on_off_bitwise_with_buckets,checker_catches_a_pending_bucket,"
        "tied_parameter_one_slot,"
        "frozen_and_trainable_share_windows_under_weight_decay,"
        "mixed_dtypes_never_share_a_buffer,odd_sizes_ranks_agree_on_lengths,"
        "layer_spanning_two_buckets_waits_for_both,"
        "optimizer_state_and_decay_selection_on_views,"
        "checkpoint_across_bucket_modes,bucket_size_zero_is_per_parameter,"
        "bad_bucket_size_raises_before_any_change,"
        "pp_sharding_comm_overlap_refused,tensor_fusion_slices_bitwise_equal",
        {},
    ),
    # Every launch above (but the refusal) again with 2 KB buckets: several
    # windows per model, all cases bitwise equal to off with no read of a
    # pending bucket (the checker maps bucket broadcasts to parameters).
    *[
        (
            f"{name}_in_buckets",
            script,
            cases,
            {**env, "BROADCAST_OVERLAP_BUCKET_MB": "0.002"},
        )
        for name, script, cases, env in _PER_PARAMETER
    ],
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
