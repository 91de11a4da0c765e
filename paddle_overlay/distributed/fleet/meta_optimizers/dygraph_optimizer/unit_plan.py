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

"""The planners of the parameter sync: the one place units are built.

A planner turns the agreed order into a plan, locally and the same on every
rank; a plan never communicates. ``plan(order, params, group, alone, lead)``:
``order`` puts first the ``lead`` positions that Paddle's own step code
reads after the update, then the rest, each part in forward's first-use
order; no unit spans the two parts. Each launch calls the plan's
``prepare()``: it checks the parameters locally (and puts replaced memory
back in its slot), so nothing has to be agreed across ranks after the first
step. Each planner class says what its units are; ``collective`` names what
they send.
"""

import collections

from . import broadcast_buckets
from .broadcast_buckets import changed_param_error, dtype_name, numel_of
from .comm_unit import CommUnit

__all__ = []


def _check_sources(params, src_ranks):
    if len(src_ranks) != len(params):
        raise ValueError(
            f"got {len(params)} parameters but {len(src_ranks)} source ranks."
        )


def _param_unit(param, covered, group, src):
    return CommUnit(
        "broadcast", param, covered, [param], group, src=src, label=param.name
    )


class PerParameter:
    """V1: one broadcast per parameter from global rank ``src_ranks[i]``."""

    collective = "broadcast"

    def __init__(self, src_ranks):
        self.src_ranks = list(src_ranks)

    def plan(self, order, params, group, alone=(), lead=0):
        _check_sources(params, self.src_ranks)
        units = [
            _param_unit(params[i], (i,), group, self.src_ranks[i])
            for i in order
        ]
        return _FixedPlan(units, [params[i] for i in order])


class Buckets:
    """V1: one broadcast per (window of ``cap_bytes`` in the agreed order,
    owner rank, dtype), the parameters moved once into contiguous storage;
    ValueError from ``broadcast_buckets.check_bucket_size_mb`` rules."""

    collective = "broadcast"

    def __init__(self, src_ranks, cap_bytes):
        if not isinstance(cap_bytes, int) or cap_bytes <= 0:
            raise ValueError(
                f"cap_bytes must be a positive int, got {cap_bytes!r}."
            )
        self.src_ranks, self.cap_bytes = list(src_ranks), cap_bytes

    def plan(self, order, params, group, alone=(), lead=0):
        _check_sources(params, self.src_ranks)
        specs = broadcast_buckets.plan_buckets(
            order,
            params,
            self.src_ranks,
            self.cap_bytes,
            alone=alone,
            lead=lead,
        )
        storage = broadcast_buckets.BucketStorage(
            specs, params, self.src_ranks, order
        )
        storage.materialize()
        return _StoragePlan(storage, group)


class FusedSlices(Buckets):
    """V1 with Paddle's tensor fusion: the buckets are slices of the fused
    buffers ``storages`` (list of 1-D tensors) the parameters live in."""

    def __init__(self, src_ranks, cap_bytes, storages):
        super().__init__(src_ranks, cap_bytes)
        self.storages = list(storages)

    def plan(self, order, params, group, alone=(), lead=0):
        _check_sources(params, self.src_ranks)
        outside = _outside(self.storages, params)
        plan = broadcast_buckets.plan_fused_slices(
            order,
            params,
            self.src_ranks,
            self.cap_bytes,
            self.storages,
            alone=set(alone) | outside,
            lead=lead,
        )
        specs = [spec for spec, _, _ in plan]
        storage = broadcast_buckets.BucketStorage(
            specs, params, self.src_ranks, order
        )
        storage.use_views(
            [
                self.storages[k]._slice(begin, begin + spec.length)
                for spec, k, begin in plan
            ]
        )
        return _StoragePlan(storage, group)


class CommBuffers:
    """V2: one all-gather per comm buffer (``FusedCommBuffer``) of >= 2
    ranks holding managed parameters; ``buffers``: a list, or a callable
    returning the optimizer's current list (V2 builds them with the
    optimizer, and ``rebuild()`` replaces them: the plan follows)."""

    collective = "all_gather"

    def __init__(self, buffers):
        self.buffers = buffers

    def plan(self, order, params, group, alone=(), lead=0):
        return _CommBufferPlan(self.buffers, order, params)


def _outside(storages, params):
    # trainable positions whose memory left the fused buffers: sent alone
    bounds = [(t.data_ptr(), broadcast_buckets.end_ptr(t)) for t in storages]
    return {
        i
        for i, p in enumerate(params)
        if not p.stop_gradient
        and p._numel() > 0
        and not any(lo <= p.data_ptr() < hi for lo, hi in bounds)
    }


def _comm_buffer_units(order, params, buffers):
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


class _CommBufferPlan:
    """V2's units, made again at a launch whose comm buffers are not the
    planned ones (``DygraphShardingOptimizerV2.rebuild()`` replaced them):
    local, from the agreed order, the same on every rank."""

    def __init__(self, buffers, order, params):
        self._source, self._order, self._params = buffers, order, params
        self._planned, self._units = (), []
        self.prepare(None)

    def prepare(self, method):
        """Plan again if the comm buffers changed; returns 0 (nothing
        rebound). RuntimeError, before anything is sent, if a buffer's
        parameter storage holds no memory."""
        buffers = self._source() if callable(self._source) else self._source
        same = len(buffers) == len(self._planned) and all(
            a is b for a, b in zip(buffers, self._planned)
        )
        if not same:
            self._units = _comm_buffer_units(self._order, self._params, buffers)
            self._planned = tuple(buffers)
        for unit in self._units:
            if not unit.tensor._is_initialized():
                raise RuntimeError(
                    f"parameter all-gather: the parameter storage of "
                    f"{unit.label} holds no memory at its launch (freed "
                    "since the last step, e.g. by _clear_to_zero_allocation"
                    "(), which V2's step() does not undo); call the "
                    "optimizer's rebuild() after freeing its comm buffers. "
                    "Nothing was sent."
                )
        return 0

    def units(self):
        return self._units


class _FixedPlan:
    """Units fixed at planning; ``checked`` parameters keep their dtype and
    size (V1 per parameter: each broadcast sends the parameter itself)."""

    def __init__(self, units, checked):
        self._units = units
        self._checked = _as_planned(checked)

    def units(self):
        return self._units

    def prepare(self, method):
        """Local checks before a launch; returns 0 (nothing rebound)."""
        _check_as_planned(self._checked, method)
        return 0


def _as_planned(params):
    return [(p, (dtype_name(p.dtype), numel_of(p))) for p in params]


def _check_as_planned(checked, method):
    # a trainable parameter that changed dtype or size: ValueError
    for param, was in checked:
        now = (dtype_name(param.dtype), numel_of(param))
        if now != was and not param.stop_gradient:
            raise changed_param_error(param, was, now, method)


class _StoragePlan:
    """The units of a ``BucketStorage``: one broadcast per bucket (always
    sent) and per unslotted parameter trainable now, in the agreed order;
    the same list while the trainable set is unchanged."""

    def __init__(self, storage, group):
        self.storage, self._group = storage, group
        self._units, self._loose = None, None
        # sent alone while trainable: as per parameter, dtype and size kept
        self._unslotted = _as_planned(
            [storage.params[i] for i in storage.unslotted]
        )

    def prepare(self, method):
        """Check the parameters sent alone, rebind replaced memory into
        its slots (local); the count rebound."""
        _check_as_planned(self._unslotted, method)
        return len(self.storage.rebind(method))

    def units(self):
        storage = self.storage
        params = storage.params
        loose = tuple(
            i for i in storage.unslotted if not params[i].stop_gradient
        )
        if self._units is None or loose != self._loose:
            self._units, self._loose = self._build(loose), loose
        return self._units

    def _build(self, loose):
        storage, group = self.storage, self._group
        rank_of = storage.rank_in_order.get
        aliases = collections.defaultdict(list)  # slot position -> repeats
        for i, j in sorted(
            storage.alias_of.items(), key=lambda a: rank_of(a[0])
        ):
            aliases[j].append(i)
        params, units = storage.params, []
        for b, (spec, buffer) in enumerate(zip(storage.specs, storage.buffers)):
            covered = [k for i in spec.indices for k in [i, *aliases[i]]]
            unit = CommUnit(
                "broadcast",
                buffer,
                covered,
                [params[i] for i in spec.indices],
                group,
                src=spec.src,
                always=True,
                label=f"bucket{b}",
            )
            units.append((rank_of(spec.indices[0]), unit))
        for i in loose:
            unit = _param_unit(
                params[i], [i, *aliases[i]], group, storage.src_ranks[i]
            )
            units.append((rank_of(i), unit))
        units.sort(key=lambda item: item[0])
        return [unit for _, unit in units]
