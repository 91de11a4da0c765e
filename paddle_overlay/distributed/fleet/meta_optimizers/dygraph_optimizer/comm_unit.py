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

"""One collective of the post-update parameter sync, owning its task: start
and finish are safe to call again (Megatron-LM's ``start_param_sync`` /
``finish_param_sync``, FSDP2's ``unshard`` / ``wait_for_unshard``). A unit
knows nothing of who launched it: the owner (``param_sync_overlap``) records
its pending parameters in ``sync_registry.PENDING``.
"""

import enum

import paddle

__all__ = []


class UnitState(enum.Enum):
    SYNCED = "synced"  # the parameters hold the latest values here
    IN_FLIGHT = "in_flight"  # launched; its task is not waited yet


class PaddleComm:
    """The collectives, looked up at call time (tests may wrap them)."""

    @staticmethod
    def broadcast(tensor, src, group, sync_op):
        return paddle.distributed.broadcast(
            tensor, src=src, group=group, sync_op=sync_op
        )

    @staticmethod
    def all_gather(shard, full, group):
        # as Paddle's FusedCommBuffer.sync_params; returns the async task
        return group.process_group.all_gather(shard, full)

    @staticmethod
    def rank():
        return paddle.distributed.get_rank()


def _start_broadcast(unit, comm):
    """``unit.tensor`` from global rank ``unit.src``."""
    return comm.broadcast(
        unit.tensor, src=unit.src, group=unit.group, sync_op=False
    )


def _start_all_gather(unit, comm):
    """Every rank's ``unit.shard_range`` (elements ``[begin, end)``) of the
    1-D ``unit.tensor``, a comm buffer's parameter storage (the plan checks
    that it holds memory)."""
    begin, end = unit.shard_range
    shard = unit.tensor._slice(begin, end)
    return comm.all_gather(shard, unit.tensor, unit.group)


# the collective of each kind of unit: start(unit, comm) -> task
_STARTS = {"broadcast": _start_broadcast}
_STARTS["all_gather"] = _start_all_gather


class CommUnit:
    """One collective of the parameter sync, with its task: ``kind`` is a
    key of ``_STARTS`` (each start function says what it sends). It
    delivers ``params`` (positions ``indices`` in the optimizer's parameter
    list); skipped while all are frozen (as Paddle V2's
    ``need_reduce_scale_sync``) unless ``always``. ValueError: an unknown
    ``kind``."""

    def __init__(
        self,
        kind,
        tensor,
        indices,
        params,
        group,
        src=None,
        shard_range=None,
        always=False,
        label="",
    ):
        if kind not in _STARTS:
            raise ValueError(f"unknown collective kind {kind!r}")
        self.kind, self.tensor, self.group = kind, tensor, group
        self.indices, self.params = tuple(indices), list(params)
        self.src = src
        self.shard_range = shard_range
        self.always, self.label = always, label
        self.state = UnitState.SYNCED
        self._task = None

    def needs_sync(self):
        return self.always or any(not p.stop_gradient for p in self.params)

    def start(self, comm):
        """Launch (``sync_op=False``); RuntimeError if already in flight."""
        if self.state is not UnitState.SYNCED:
            raise RuntimeError(f"unit {self.label} started twice")
        self._task = _STARTS[self.kind](self, comm)
        self.state = UnitState.IN_FLIGHT

    def finish(self):
        """Wait for the task; True if it was in flight."""
        if self.state is UnitState.SYNCED:
            return False
        if self._task is not None:
            self._task.wait()  # may raise: the unit stays in flight
        self._task = None
        self.state = UnitState.SYNCED
        return True

    def __repr__(self):
        return (
            f"CommUnit({self.kind} {self.label}, {len(self.params)} "
            f"parameter(s), {self.state.value})"
        )
