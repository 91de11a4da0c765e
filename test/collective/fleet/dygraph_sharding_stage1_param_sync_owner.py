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
"""Per-rank script: the owner of the overlapped parameter sync
(``ParamSyncOverlap``, ``param_sync_overlap.py``), driven directly on 2
ranks.

Forward's first use is recorded and agreed (the same order on both ranks);
after each local update the owner launches every unit and each layer's
forward waits for its own units only, so forward sees the owners' values;
hooks are constant over steps and removed by ``close()``;
``FLAGS_sharding_overlap_strict=1`` makes the first hooked layer wait for
everything. Run with ``python -m paddle.distributed.launch
--nproc_per_node 2``; a failed check raises, so the rank exits non-zero.
"""

import os

import numpy as np
from sharding_param_sync_utils import init_sharding_group, rank_values

import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import unit_plan
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
    ParamSyncOverlap,
)

STEPS = 3


class HeadFirst(nn.Layer):
    """Its head is built first: the parameter list is not forward's order."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.fc = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.head(self.norm(self.fc(x)))


def open_owner(group, strict=None):
    paddle.seed(3)
    net = HeadFirst()
    params = net.parameters()
    src = [group.ranks[i % 2] for i in range(len(params))]
    planner = unit_plan.PerParameter(src)
    owner = ParamSyncOverlap(
        params, group, net, planner, "_set_broadcast_overlap", strict
    )
    owner.open()
    return net, params, src, owner


def update(params, src):
    """A sharded update: each rank writes only the parameters it owns."""
    with paddle.no_grad():
        for p, s in zip(params, src):
            if s == dist.get_rank():
                p.set_value(p * 0.5 + 1.0)


def equal_on_every_rank(tensor, group):
    values = rank_values(tensor, group)
    return all(np.array_equal(v, values[0]) for v in values)


def num_pre_hooks(net):
    return sum(len(m._forward_pre_hooks) for m in net.sublayers(True))


def case_agreed_order_launch_and_layer_waits(group):
    before = None
    net, params, src, owner = open_owner(group)
    x = paddle.ones([2, 8])
    hooks = num_pre_hooks(net)
    # forward's first use (read now: parameters() waits for pending units)
    first_use = [
        p.name for m in (net.fc, net.norm, net.head) for p in m.parameters()
    ]
    for _ in range(STEPS):
        net(x)  # the first records the order; the others wait per layer
        assert owner.num_pending == 0
        assert all(equal_on_every_rank(p, group) for p in params)
        assert num_pre_hooks(net) == hooks
        owner.before_update()
        update(params, src)
        owner.launch()
        assert owner.num_pending == len(params)
    names = [params[i].name for i in owner.order]
    assert names == first_use, (names, first_use)
    assert equal_on_every_rank(paddle.to_tensor(owner.order), group)
    net.fc(x)  # one layer waits for its own units only
    assert owner.num_pending == len(params) - 2
    stats = owner.stats
    assert stats["launched"] == STEPS * len(params), stats
    assert stats["waited_in_forward"] == (STEPS - 1) * len(params) + 2, stats
    before = num_pre_hooks(HeadFirst())
    owner.close()  # waits for the rest, removes every hook
    assert owner.num_pending == 0 and owner.num_hooks == 0
    assert num_pre_hooks(net) == before
    assert all(equal_on_every_rank(p, group) for p in params)


def case_strict_flag_waits_at_the_first_layer(group):
    os.environ["FLAGS_sharding_overlap_strict"] = "1"
    try:
        net, params, src, owner = open_owner(group)
    finally:
        del os.environ["FLAGS_sharding_overlap_strict"]
    x = paddle.ones([2, 8])
    net(x)
    owner.before_update()
    update(params, src)
    owner.launch()
    net.fc(x)  # strict: everything, not just fc's units
    assert owner.num_pending == 0
    owner.close()


if __name__ == "__main__":
    group = init_sharding_group()
    case_agreed_order_launch_and_layer_waits(group)
    case_strict_flag_waits_at_the_first_layer(group)
    print("2 passed", flush=True)
