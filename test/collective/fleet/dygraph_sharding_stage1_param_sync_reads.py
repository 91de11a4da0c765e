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
"""Per-rank script: reads of a parameter whose sync is in flight wait for it
(``read_interception.py``, ``sync_registry.py`` and the pre-call hooks of
``paddle.jit.dy2static``), on 2 ranks.

A small stand-in owner starts real broadcasts from rank 0 (``sync_op=False``)
and registers them as pending; an attribute, ``parameters()``,
``state_dict()`` and a ``paddle.jit.to_static`` call then return rank 0's
values, each waiting only for what it reads; releasing the owner removes
every guard and the hook. Run with ``python -m paddle.distributed.launch
--nproc_per_node 2``; a failed check raises, so the rank exits non-zero.
"""

from collections import OrderedDict

import numpy as np
from sharding_param_sync_utils import (
    init_sharding_group,
    make_ranks_differ,
    rank_values,
)

import paddle
from paddle import nn
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    read_interception,
    sync_registry,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.comm_unit import (
    CommUnit,
    PaddleComm,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.sync_stats import (
    SyncStat,
)


class PendingBroadcasts:
    """What the reads need of an owner: ``serial``, ``owning_layers``,
    ``wait(units, reason, path)`` and ``wait_all(reason)``."""

    def __init__(self, model, group):
        self.serial = sync_registry.next_serial()
        self.owning_layers = model.sublayers(include_self=True)
        self.group, self.units, self.waits = group, [], []

    def start(self, params):
        """Broadcast ``params`` from the group's first rank, in flight."""
        for i, p in enumerate(params):
            unit = CommUnit(
                "broadcast",
                p,
                (i,),
                [p],
                self.group,
                src=self.group.ranks[0],
                label=p.name,
            )
            unit.start(PaddleComm())
            sync_registry.PENDING[id(p)] = (self, unit)
            self.units.append(unit)

    def wait(self, units, reason, path=None):
        for unit in units:
            if unit.finish():
                for p in unit.params:
                    del sync_registry.PENDING[id(p)]
                self.waits.append((reason, path, unit.label))

    def wait_all(self, reason):
        self.wait(self.units, reason)


def model_and_rank0(group):
    """A model whose parameters differ on each rank, and rank 0's values."""
    paddle.seed(11)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    make_ranks_differ(model.parameters())
    return model, {p.name: rank_values(p, group)[0] for p in model.parameters()}


def open_owner(model, group):
    owner = PendingBroadcasts(model, group)
    sync_registry.add(owner)
    read_interception.acquire(owner)
    return owner


def close_owner(owner):
    sync_registry.discard(owner)
    read_interception.release(owner)


def case_attribute_waits_for_its_own_unit(group):
    model, rank0 = model_and_rank0(group)
    owner = open_owner(model, group)
    owner.start(model.parameters())
    weight = model[2].weight  # an attribute read
    np.testing.assert_array_equal(weight.numpy(), rank0[weight.name])
    assert owner.waits == [
        (SyncStat.ON_READ, "attribute", weight.name)
    ], owner.waits
    assert len(sync_registry.PENDING) == 3  # the others are still in flight
    state = model.state_dict()  # iteration: everything it returns
    for p in model.parameters():
        np.testing.assert_array_equal(p.numpy(), rank0[p.name])
    assert {w[1] for w in owner.waits[1:]} == {"iteration"}, owner.waits
    assert not sync_registry.PENDING and len(state) == 4
    close_owner(owner)


def case_compiled_program_waits_for_everything(group):
    model, rank0 = model_and_rank0(group)
    x = paddle.ones([1, 8])
    compiled = paddle.jit.to_static(model.forward, full_graph=True)
    owner = open_owner(model, group)
    assert read_interception.is_installed()
    owner.start(model.parameters())
    out = compiled(x)
    assert {w[0] for w in owner.waits} == {SyncStat.IN_PROGRAM}, owner.waits
    assert len(owner.waits) == 4 and not sync_registry.PENDING
    with paddle.no_grad():
        for p in model.parameters():
            p.set_value(paddle.to_tensor(rank0[p.name]))
    np.testing.assert_allclose(out.numpy(), model(x).numpy(), rtol=1e-6)
    close_owner(owner)


def case_release_removes_every_guard(group):
    model, _ = model_and_rank0(group)
    owner = open_owner(model, group)
    kinds = {
        type(m.__dict__["_parameters"]).__name__ for m in model.sublayers(True)
    }
    assert kinds == {"GuardedParameters"}, kinds
    close_owner(owner)
    assert {type(m.__dict__["_parameters"]) for m in model.sublayers(True)} == {
        OrderedDict
    }
    assert not read_interception.is_installed()


if __name__ == "__main__":
    group = init_sharding_group()
    case_attribute_waits_for_its_own_unit(group)
    case_compiled_program_waits_for_everything(group)
    case_release_removes_every_guard(group)
    print("3 passed", flush=True)
