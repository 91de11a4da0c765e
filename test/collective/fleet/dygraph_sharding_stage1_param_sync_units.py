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
"""Per-rank script: the units of the parameter sync (``comm_unit.py``) and
their planners (``unit_plan.py``), on 2 ranks.

Per parameter and in buckets, the units every rank starts (sync_op=False)
and finishes deliver the owners' values; a unit of frozen parameters is
skipped; a unit started twice and a parameter changed after planning are
refused. Run with ``python -m paddle.distributed.launch --nproc_per_node
2``; a failed check raises, so the rank exits non-zero.
"""

import numpy as np
from sharding_param_sync_utils import (
    init_sharding_group,
    make_ranks_differ,
    rank_values,
)

import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import unit_plan
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.comm_unit import (
    PaddleComm,
    UnitState,
)

METHOD = "_set_broadcast_overlap"


def params_and_values(group):
    """Parameters that differ on each rank, and every rank's values."""
    paddle.seed(7)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    params = model.parameters()
    make_ranks_differ(params)
    return model, params, [rank_values(p, group) for p in params]


def planned(planner_of, group):
    model, params, values = params_and_values(group)
    src_ranks = [group.ranks[i % 2] for i in range(len(params))]
    order = list(reversed(range(len(params))))
    plan = planner_of(src_ranks).plan(order, params, group)
    plan.prepare(METHOD)
    return model, params, values, src_ranks, plan.units(), plan


def sync(units):
    comm = PaddleComm()
    started = [u for u in units if u.needs_sync()]
    for unit in started:
        unit.start(comm)
        assert unit.state is UnitState.IN_FLIGHT
    for unit in started:
        assert unit.finish() and unit.state is UnitState.SYNCED
    return started


def check_owners_values(params, values, src_ranks, group, skip=()):
    rank = group.ranks.index(dist.get_rank())
    for i, (p, v, src) in enumerate(zip(params, values, src_ranks)):
        want = v[rank] if i in skip else v[group.ranks.index(src)]
        np.testing.assert_array_equal(p.numpy(), want, err_msg=p.name)


def case_per_parameter(group):
    _, params, values, src, units, _ = planned(unit_plan.PerParameter, group)
    assert len(units) == len(params)
    assert [u.indices for u in units] == [
        (i,) for i in reversed(range(len(params)))
    ]
    sync(units)
    check_owners_values(params, values, src, group)


def case_buckets(group):
    def planner(src_ranks):
        return unit_plan.Buckets(src_ranks, 1024)

    _, params, values, src, units, _ = planned(planner, group)
    assert 1 < len(units) < len(params), units
    assert sorted(i for u in units for i in u.indices) == list(
        range(len(params))
    )
    sync(units)
    check_owners_values(params, values, src, group)


def case_frozen_unit_skipped_and_refusals(group):
    model, params, values, src, units, plan = planned(
        unit_plan.PerParameter, group
    )
    params[1].stop_gradient = True
    started = sync(units)
    assert len(started) == len(units) - 1 and all(
        1 not in u.indices for u in started
    )
    check_owners_values(params, values, src, group, skip={1})
    unit = started[0]
    unit.start(PaddleComm())
    try:
        unit.start(PaddleComm())
    except RuntimeError as e:
        assert "started twice" in str(e), e
    else:
        raise AssertionError("a unit started twice was not refused")
    unit.finish()
    model[2].to(dtype="float64")  # a dtype change after planning
    try:
        plan.prepare(METHOD)
    except ValueError as e:
        assert any(p.name in str(e) for p in model[2].parameters()), e
    else:
        raise AssertionError(
            "a parameter changed after planning was not refused"
        )


if __name__ == "__main__":
    group = init_sharding_group()
    case_per_parameter(group)
    case_buckets(group)
    case_frozen_unit_skipped_and_refusals(group)
    print("3 passed", flush=True)
