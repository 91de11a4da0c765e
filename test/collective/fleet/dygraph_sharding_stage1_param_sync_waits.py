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
"""Per-rank script: which layer's forward pre-hook waits for which units of
the parameter sync (``wait_map.LayerWaits``), on 2 ranks (the checks are
local; each rank makes them).

Every layer that owns parameters waits for its own units; a container
without forward (``ParameterList``) is waited by its parent; parameters no
layer owns are unreachable; a forward that needs a unit while an earlier
one is pending is counted out of order and warns once. Run with
``python -m paddle.distributed.launch --nproc_per_node 2``; a failed check
raises, so the rank exits non-zero.
"""

import warnings

from sharding_param_sync_utils import init_sharding_group

import paddle
from paddle import nn
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.comm_unit import (
    CommUnit,
    UnitState,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.wait_map import (
    LayerWaits,
)


class Block(nn.Layer):
    """Owns a parameter itself and has a sublayer that owns two."""

    def __init__(self):
        super().__init__()
        self.scale = self.create_parameter([4])
        self.fc = nn.Linear(4, 4)
        self.extra = nn.ParameterList([self.create_parameter([4])])

    def forward(self, x):
        return self.fc(x) * self.scale + self.extra[0]


def per_parameter_units(params, index_of, group):
    return [
        CommUnit(
            "broadcast", p, (index_of[id(p)],), [p], group, src=0, label=p.name
        )
        for p in params
    ]


def case_each_owning_layer_waits_for_its_own(group):
    root = nn.Sequential(Block(), nn.Linear(4, 2))
    outside = paddle.create_parameter([3], "float32")  # no layer owns it
    params = root.parameters() + [outside]
    index_of = {id(p): i for i, p in enumerate(params)}
    waits = LayerWaits(root, index_of)
    block, head = root[0], root[1]
    assert waits.unreachable == (len(params) - 1,)
    # the root is hooked first; the ParameterList is waited by its parent
    assert waits.hooked_layers[0] is root
    assert {id(l) for l in waits.hooked_layers} == {
        id(root),
        id(block),
        id(block.fc),
        id(head),
    }
    assert set(waits.positions_of(block)) == {
        index_of[id(block.scale)],
        index_of[id(block.extra[0])],
    }
    units = per_parameter_units(params, index_of, group)
    waits.use(units)
    assert {u.label for u in waits.units_of(block.fc)} == {
        p.name for p in block.fc.parameters()
    }
    assert [u.label for u in waits.unreachable_units] == [outside.name]
    assert waits.units_of(root) == ()


def case_out_of_order_is_counted_and_warned_once(group):
    root = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    params = root.parameters()
    index_of = {id(p): i for i, p in enumerate(params)}
    waits = LayerWaits(root, index_of)
    units = per_parameter_units(params, index_of, group)
    waits.use(units)
    for unit in units:
        unit.state = UnitState.IN_FLIGHT  # as after a launch
    waits.arm()
    waits.enter_root()
    root.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        late = waits.units_of(root[1])
        assert waits.out_of_order(root[1], late, "_set_broadcast_overlap")
        assert waits.out_of_order(root[1], late, "_set_broadcast_overlap")
    assert len(caught) == 1 and "some overlap is lost" in str(caught[0].message)
    for unit in units:
        unit.state = UnitState.SYNCED
    assert not waits.out_of_order(root[1], late, "_set_broadcast_overlap")


if __name__ == "__main__":
    group = init_sharding_group()
    case_each_owning_layer_waits_for_its_own(group)
    case_out_of_order_is_counted_and_warned_once(group)
    print("2 passed", flush=True)
