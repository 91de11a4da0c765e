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

"""The one planner: the communication units of every mode, from the agreed
order.

:func:`plan_units` turns the agreed order (positions in the optimizer's
parameter list, the order forward first uses them) into a plan whose
:meth:`units` are the :class:`~.comm_unit.CommUnit` s of one launch, in that
order:

* one broadcast per parameter (``bucket_size_mb=0``; upstream PR #63945's
  unit);
* one broadcast per bucket of parameters moved into contiguous storage
  (``broadcast_buckets.py``), or per slice of Paddle's fused buffers when
  ``sharding_configs.tensor_fusion`` (or ``comm_overlap``) already placed
  the parameters there;
* one all-gather per comm buffer of sharding stage 1 V2
  (``DygraphShardingOptimizerV2._comm_buffer_list``, Paddle's
  ``FusedCommBuffer``). Paddle's layout is kept exactly (it fixes each
  rank's slice, the optimizer state and the checkpoints): only the order and
  the time of the gathers change. A buffer is first used when forward first
  uses any of its parameters.

A plan never communicates. :meth:`replaced` says which parameters of this
rank no longer live where the plan put them (bucket modes only); the owner
agrees across the group before it plans again.
"""

from .broadcast_buckets import (
    BucketStorage,
    itemsize,
    plan_buckets,
    plan_fused_slices,
)
from .comm_unit import CommUnit

__all__ = ["plan_units"]


def plan_units(
    order,
    params,
    src_ranks,
    group,
    cap_bytes=0,
    fused_storages=None,
    comm_buffers=None,
    alone=(),
):
    """The plan of one mode.

    Args:
        order (list[int]): the agreed order, a permutation of
            ``range(len(params))``.
        params (list[paddle.Tensor]): the optimizer's parameter list.
        src_ranks (list[int] | None): owner rank of each parameter
            (broadcast modes; None with ``comm_buffers``).
        group: the sharding process group.
        cap_bytes (int): bucket window in bytes; 0: one unit per parameter.
        fused_storages (list[paddle.Tensor] | None): Paddle's fused 1-D
            buffers the parameters live in (send slices, never move).
        comm_buffers (list | None): V2's ``FusedCommBuffer`` list (one
            all-gather each); excludes the other arguments' modes.
        alone (iterable[int]): positions never bucketed (no layer waits
            for them).

    Returns:
        a plan with ``units()`` (list[CommUnit], the same list while nothing
        changed), ``replaced()`` (list[int]) and ``can_go_stale`` (bool).

    Raises:
        ValueError: from the bucket planners (see ``broadcast_buckets.py``).
    """
    if comm_buffers is not None:
        return _CommBufferPlan(order, params, comm_buffers)
    if not cap_bytes:
        return _ParameterPlan(order, params, src_ranks, group)
    if fused_storages is not None:
        outside = _outside(fused_storages, params)
        plan = plan_fused_slices(
            order,
            params,
            src_ranks,
            cap_bytes,
            fused_storages,
            alone=set(alone) | outside,
        )
        storage = BucketStorage(
            [spec for spec, _, _ in plan], params, src_ranks, order
        )
        storage.use_views(
            [
                fused_storages[k]._slice(begin, begin + spec.length)
                for spec, k, begin in plan
            ]
        )
    else:
        specs = plan_buckets(order, params, src_ranks, cap_bytes, alone=alone)
        storage = BucketStorage(specs, params, src_ranks, order)
        storage.materialize()
    return _BucketPlan(storage, group)


def _outside(storages, params):
    """set[int]: trainable positions whose memory lies in none of
    ``storages`` (replaced since Paddle fused them): sent on their own."""
    bounds = [
        (t.data_ptr(), t.data_ptr() + int(t._numel()) * itemsize(t.dtype))
        for t in storages
    ]
    return {
        i
        for i, p in enumerate(params)
        if not p.stop_gradient
        and p._numel() > 0
        and not any(lo <= p.data_ptr() < hi for lo, hi in bounds)
    }


class _ParameterPlan:
    """One broadcast per parameter, in the agreed order."""

    can_go_stale = False

    def __init__(self, order, params, src_ranks, group):
        self._units = [
            CommUnit(
                "broadcast",
                params[i],
                (i,),
                [params[i]],
                group,
                src=src_ranks[i],
                label=params[i].name,
            )
            for i in order
        ]

    def units(self):
        return self._units

    def replaced(self):
        return []


class _BucketPlan:
    """Buckets (or fused slices) of :class:`BucketStorage`."""

    can_go_stale = True

    def __init__(self, storage, group):
        self.storage = storage
        self._group = group

    def units(self):
        return self.storage.units(self._group)

    def replaced(self):
        return self.storage.replaced()


class _CommBufferPlan:
    """One all-gather per V2 comm buffer, ordered by first use."""

    can_go_stale = False

    def __init__(self, order, params, buffers):
        index_of = {id(p): i for i, p in enumerate(params)}
        rank_of = {i: k for k, i in enumerate(order)}
        ranked = []
        for b, buffer in enumerate(buffers):
            group = buffer._comm_group
            indices = [
                index_of[id(p)] for p in buffer._params if id(p) in index_of
            ]
            if group.nranks <= 1 or not indices:
                continue
            full = buffer.param_storage
            shard = int(full._numel()) // group.nranks
            begin = shard * max(group.rank, 0)
            unit = CommUnit(
                "all_gather",
                full,
                indices,
                [params[i] for i in indices],
                group,
                shard_range=(begin, begin + shard),
                label=f"comm_buffer{b}",
            )
            ranked.append((min(rank_of[i] for i in indices), b, unit))
        ranked.sort(key=lambda item: item[:2])
        self._units = [unit for _, _, unit in ranked]

    def units(self):
        return self._units

    def replaced(self):
        return []
