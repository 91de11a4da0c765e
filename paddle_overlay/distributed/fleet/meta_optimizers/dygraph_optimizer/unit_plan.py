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
order (positions in the optimizer's parameter list, in forward first use).

:func:`plan_units` returns a plan whose ``units()`` are one launch's
``CommUnit`` s in that order: one broadcast per parameter
(``bucket_size_mb=0``, upstream PR #63945's unit), per bucket of parameters
moved into contiguous storage (``broadcast_buckets.py``), or per slice of
Paddle's fused buffers (``tensor_fusion``/``comm_overlap``); or, for sharding
stage 1 V2, one all-gather per ``FusedCommBuffer`` in Paddle's exact layout
(only the order and time of the gathers change), first used when forward
first uses any of its parameters. A plan never communicates; ``replaced()``
lists this rank's parameters whose memory moved (bucket modes), which the
owner agrees across the group before it plans again.
"""

from .broadcast_buckets import (
    BucketStorage,
    end_ptr,
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
    """The plan of one mode.

    Args:
        order (list[int]): the agreed order, a permutation of
            ``range(len(params))``.
        params (list[paddle.Tensor]): the optimizer's parameter list.
        src_ranks (list[int] | None): owner rank of each (None for V2).
        group: the sharding process group.
        cap_bytes (int): bucket window in bytes; 0: one unit per parameter.
        fused_storages (list[paddle.Tensor] | None): Paddle's fused 1-D
            buffers the parameters live in (slices are sent, nothing moves).
        comm_buffers (list | None): V2's ``FusedCommBuffer`` list.
        alone (iterable[int]): positions never bucketed.

    Returns:
        a plan: ``units()`` (list[CommUnit], the same list while nothing
        changed), ``replaced()`` (list[int]), ``can_go_stale`` (bool).

    Raises:
        ValueError: from the bucket planners (``broadcast_buckets.py``).
    """
    if comm_buffers is not None:
        return _FixedPlan(_comm_buffer_units(order, params, comm_buffers))
    if not cap_bytes:
        return _FixedPlan(
            [
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
    return _BucketPlan(storage, group)


def _outside(storages, params):
    """set[int]: trainable positions whose memory lies in none of
    ``storages`` (replaced since Paddle fused them): sent on their own."""
    bounds = [(t.data_ptr(), end_ptr(t)) for t in storages]
    return {
        i
        for i, p in enumerate(params)
        if not p.stop_gradient
        and p._numel() > 0
        and not any(lo <= p.data_ptr() < hi for lo, hi in bounds)
    }


def _comm_buffer_units(order, params, buffers):
    """One all-gather per V2 comm buffer (of >= 2 ranks, holding managed
    parameters), ordered by its first parameter in ``order``."""
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


class _FixedPlan:
    """Units that never change: per parameter, or per V2 comm buffer."""

    can_go_stale = False

    def __init__(self, units):
        self._units = units

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
