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
"""Per-rank script: the parameters HybridParallelOptimizer syncs across its
model- or pipeline-parallel group after the update go into the first units
(``plan_hybrid_synced_first``) and are waited one by one before each such
sync (``wait_before_hybrid_sync``), driven directly on 2 ranks.

The lead is agreed with the order (rank 0's wins), planned first, and the
wait before a hybrid sync finishes exactly that parameter's unit. Run with
``python -m paddle.distributed.launch --nproc_per_node 2``; a failed check
raises, so the rank exits non-zero.
"""

import types

from sharding_param_sync_utils import init_sharding_group

import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import unit_plan
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
    ParamSyncOverlap,
    plan_hybrid_synced_first,
    wait_before_hybrid_sync,
)


def case_lead_agreed_planned_first_and_waited_alone(group):
    paddle.seed(5)
    net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    params = net.parameters()
    src = [group.ranks[i % 2] for i in range(len(params))]
    owner = ParamSyncOverlap(
        params,
        group,
        net,
        unit_plan.PerParameter(src),
        "_set_broadcast_overlap",
    )
    owner.open()
    # an optimizer whose overlap this owner is (what get_param_sync_overlap
    # finds on a sharding optimizer)
    optimizer = types.SimpleNamespace(_param_sync_overlap=owner)
    net(paddle.ones([2, 8]))  # records forward's order
    head, first = net[2].parameters(), net[0].parameters()
    # each rank proposes another lead: rank 0's is the one planned
    plan_hybrid_synced_first(
        optimizer, lambda: head if dist.get_rank() == 0 else first
    )
    owner.launch()
    lead = [params[i].name for i in owner.lead]
    assert lead == [p.name for p in head], lead
    assert [u.label for u in owner.units[:2]] == lead, owner.units
    plan_hybrid_synced_first(
        optimizer, first
    )  # after the first launch: nothing
    assert [params[i].name for i in owner.lead] == lead
    # the lead's units were waited before the launch returned
    assert owner.num_pending == len(params) - len(head)
    assert owner.stats["waited_for_hybrid_sync"] == len(head), owner.stats
    wait_before_hybrid_sync(first[0])  # outside the lead: its unit only
    assert owner.num_pending == len(params) - len(head) - 1
    assert owner.stats["waited_for_hybrid_sync"] == len(head) + 1
    wait_before_hybrid_sync(paddle.ones([1]))  # not a managed parameter
    assert owner.num_pending == len(params) - len(head) - 1
    owner.close()
    assert owner.num_pending == 0 and owner.num_hooks == 0


if __name__ == "__main__":
    group = init_sharding_group()
    case_lead_agreed_planned_first_and_waited_alone(group)
    print("1 passed", flush=True)
