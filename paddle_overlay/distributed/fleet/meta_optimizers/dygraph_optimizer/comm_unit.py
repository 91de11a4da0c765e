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

"""One communication unit of the post-update parameter sync, and the one
registry of parameters whose sync is not finished.

A :class:`CommUnit` is one collective that brings some parameters up to date
after an update: a broadcast from the owner rank (V1: a parameter, a bucket
of ``broadcast_buckets.py`` or a slice of Paddle's fused buffer) or an
all-gather of a V2 comm buffer (``FusedCommBuffer.param_storage``). It owns
its task: :meth:`~CommUnit.start` launches with ``sync_op=False`` and
:meth:`~CommUnit.finish` waits, both safe to call again (Megatron-LM's
``start_param_sync``/``finish_param_sync``, FSDP2's
``unshard``/``wait_for_unshard``). States (:class:`UnitState`): ``SYNCED``
-> ``DUE`` (:meth:`~CommUnit.mark_due`) -> ``IN_FLIGHT`` -> ``SYNCED``. From
``DUE`` on, its parameters are in :data:`PENDING`, the only record of
pending syncs, where a read (``read_interception.py``) finds the unit to
wait for; with nothing pending a read costs one truth test of an empty dict.
"""

import enum

import paddle

__all__ = []

# id(parameter) -> the CommUnit whose sync of it is due or in flight.
# Filled by CommUnit.mark_due, emptied by CommUnit.finish.
PENDING = {}


class UnitState(enum.Enum):
    """Where a :class:`CommUnit` is in one update's sync."""

    SYNCED = "synced"  # the parameters hold the latest values here
    DUE = "due"  # updated at the source; waiting for its turn to start
    IN_FLIGHT = "in_flight"  # launched; its task is not waited yet


class PaddleComm:
    """The collectives a unit launches, looked up at call time (so test
    instrumentation that wraps ``paddle.distributed.broadcast`` or the
    process group's ``all_gather`` sees them). Unit tests pass a fake with
    the same methods."""

    @staticmethod
    def broadcast(tensor, src, group, sync_op):
        return paddle.distributed.broadcast(
            tensor, src=src, group=group, sync_op=sync_op
        )

    @staticmethod
    def all_gather(shard, full, group):
        """Gather every rank's ``shard`` (a slice of ``full``) into ``full``
        (V2's comm buffer layout; the same call as Paddle's
        ``FusedCommBuffer.sync_params``). Returns the async task."""
        return group.process_group.all_gather(shard, full)

    @staticmethod
    def all_reduce_max(values, group):
        """Element-wise max of ``values`` (list[int]) over ``group``,
        blocking."""
        message = paddle.to_tensor(values, dtype="int64")
        paddle.distributed.all_reduce(
            message, op=paddle.distributed.ReduceOp.MAX, group=group
        )
        return [int(v) for v in message.numpy().tolist()]

    @staticmethod
    def rank():
        return paddle.distributed.get_rank()


class CommUnit:
    """One collective of the parameter sync, with its task.

    Args:
        kind (str): ``"broadcast"`` (``tensor`` from global rank ``src``) or
            ``"all_gather"`` (every rank's slice ``shard_range`` of
            ``tensor`` gathered into ``tensor``).
        tensor (paddle.Tensor): what it writes: a parameter, a 1-D bucket
            buffer or slice, or a V2 buffer's 1-D ``param_storage``.
        indices (tuple[int]): positions in the optimizer's parameter list of
            the parameters it delivers.
        params (list[paddle.Tensor]): those parameters.
        group: the process group (``.ranks``: global ranks).
        src (int | None): a broadcast's global source rank.
        shard_range (tuple[int, int] | None): ``[begin, end)`` elements of
            ``tensor`` this rank contributes to an all-gather (sliced at
            :meth:`start`, so storage Paddle reset meanwhile is fresh).
        always (bool): sync even when every parameter is frozen (a bucket is
            sent whole); otherwise skipped while all are frozen (as Paddle's
            V2 skips such a buffer, ``need_reduce_scale_sync``).
        label (str): a short name for profiler spans and messages.
    """

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
        if kind not in ("broadcast", "all_gather"):
            raise ValueError(f"unknown collective kind {kind!r}")
        self.kind, self.tensor, self.group = kind, tensor, group
        self.indices, self.params = tuple(indices), list(params)
        self.src, self.shard_range = src, shard_range
        self.always, self.label = always, label
        self.owner = None  # the owner that launches it (set at mark_due)
        self.state = UnitState.SYNCED
        self._task = None

    def needs_sync(self):
        """bool: whether an update can have changed what this unit sends."""
        return self.always or any(not p.stop_gradient for p in self.params)

    def mark_due(self, owner):
        """The update changed the source: register the parameters as
        pending on ``owner`` (a second owner with one of them pending is
        waited for first)."""
        assert (
            self.state is UnitState.SYNCED
        ), f"unit {self.label} marked due while {self.state.value}"
        self.owner = owner
        for param in self.params:
            previous = PENDING.get(id(param))
            if previous is not None and previous is not self:
                previous.owner.wait((previous,), "waited_on_read", "launch")
            PENDING[id(param)] = self
        self.state = UnitState.DUE

    def start(self, comm):
        """Launch the collective (``sync_op=False``). Safe to call again.

        Returns:
            bool: True if it was launched now.
        """
        if self.state is not UnitState.DUE:
            return False
        if self.kind == "broadcast":
            self._task = comm.broadcast(
                self.tensor, src=self.src, group=self.group, sync_op=False
            )
        else:
            if not self.tensor._is_initialized():
                raise RuntimeError(
                    f"parameter all-gather: the storage of comm buffer "
                    f"{self.label} was freed (clear_param_storage) while its "
                    "parameters were due; call the optimizer's "
                    "reset_param_storage() (or step()) before reading them."
                )
            begin, end = self.shard_range
            shard = self.tensor._slice(begin, end)
            self._task = comm.all_gather(shard, self.tensor, self.group)
        self.state = UnitState.IN_FLIGHT
        return True

    def finish(self):
        """Wait for the task and clear the parameters' pending entries.
        Safe to call again; the caller starts a ``DUE`` unit first.

        Returns:
            bool: True if a task was waited now.
        """
        if self.state is UnitState.SYNCED:
            return False
        assert (
            self.state is UnitState.IN_FLIGHT
        ), f"unit {self.label} finished before it was started"
        task, self._task = self._task, None
        if task is not None:
            task.wait()
        self.state = UnitState.SYNCED
        for param in self.params:
            if PENDING.get(id(param)) is self:
                del PENDING[id(param)]
        return True

    def __repr__(self):
        return (
            f"CommUnit({self.kind} {self.label}, {len(self.params)} "
            f"parameter(s), {self.state.value})"
        )
