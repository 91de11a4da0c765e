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

"""The units of every mode, in the agreed order: one broadcast per parameter
(upstream PR #63945's unit), bucket or fused slice; V2: one all-gather per
``FusedCommBuffer``, in Paddle's layout. A plan never communicates.
"""

from .broadcast_buckets import (
    BucketStorage,
    end_ptr,
    param_unit,
    plan_buckets,
    plan_fused_slices,
)
from .comm_unit import CommUnit

__all__ = []


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
    """A plan: ``units()`` (list[CommUnit], the same list while nothing
    changed), ``replaced()`` (positions whose memory moved), ``can_go_stale``.
    ``cap_bytes`` 0: one unit per parameter; ValueError from the planners."""
    if comm_buffers is not None:
        return _Plan(_comm_buffer_units(order, params, comm_buffers))
    if not cap_bytes:
        return _Plan(
            [param_unit(params[i], (i,), group, src_ranks[i]) for i in order]
        )
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
    return _Plan(storage=storage, group=group)


def _outside(storages, params):
    # trainable positions whose memory left the fused buffers: sent alone
    bounds = [(t.data_ptr(), end_ptr(t)) for t in storages]
    return {
        i
        for i, p in enumerate(params)
        if not p.stop_gradient
        and p._numel() > 0
        and not any(lo <= p.data_ptr() < hi for lo, hi in bounds)
    }


def _comm_buffer_units(order, params, buffers):
    # one all-gather per comm buffer of >= 2 ranks holding managed parameters
    index_of = {id(p): i for i, p in enumerate(params)}
    rank_of = {i: k for k, i in enumerate(order)}
    ranked = []
    for b, buffer in enumerate(buffers):
        group = buffer._comm_group
        indices = [index_of[id(p)] for p in buffer._params if id(p) in index_of]
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
    return [unit for *_, unit in sorted(ranked, key=lambda r: r[:2])]


class _Plan:
    """Fixed units, or those of a ``BucketStorage`` (buckets, fused slices)."""

    def __init__(self, units=None, storage=None, group=None):
        self._units, self.storage, self._group = units, storage, group
        self.can_go_stale = storage is not None

    def units(self):
        if self.storage is None:
            return self._units
        return self.storage.units(self._group)

    def replaced(self):
        return [] if self.storage is None else self.storage.replaced()
