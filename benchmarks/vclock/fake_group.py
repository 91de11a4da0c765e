"""Sharding groups of N ranks inside one process, for the virtual clock (no data moves).

:class:`FakeProcessGroup` answers every collective at once with a finished task and moves no data: this
process plays one rank of the group, so the parameters the other ranks own are never updated here
(values are not checked in a fake group; the 2-rank launches check them). Paddle's own code paths run
unchanged on top: ``paddle.distributed.broadcast`` / ``all_reduce`` / ``reduce`` / ``reduce_scatter``
reach the group's ``process_group`` as on real ranks, and V2's ``FusedCommBuffer.sync_params`` calls
``process_group.all_gather`` itself.

:func:`sharding_optimizer` builds Paddle's ``DygraphShardingOptimizer`` (V1) or
``DygraphShardingOptimizerV2`` (``split_param``) around an AdamW for a :class:`FakeHcg` of degree N,
inside :func:`sharding_strategy` (``fleet.fleet``'s strategy, as ``fleet.init`` would set it).
"""

import contextlib
import itertools
import os
import sys

import paddle
from paddle.distributed import fleet
from paddle.distributed.communication.group import Group

__all__ = ["FakeProcessGroup", "FakeHcg", "fake_group", "sharding_strategy", "sharding_optimizer", "cpu_v2"]

_SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "collective", "fleet")

_GROUP_IDS = itertools.count(10_000)


class FakeProcessGroup:
    """A process group of ``nranks`` ranks in which this process is rank ``rank``: every collective
    returns a finished task at once and moves no data."""

    def __init__(self, rank, nranks, gid):
        self._rank, self._nranks, self._gid = rank, nranks, gid

    def rank(self):
        return self._rank

    def size(self):
        return self._nranks

    def name(self):
        return "FAKE"

    def id(self):
        return self._gid



def _finished(self, *args, **kwargs):
    return _shim()._FinishedTask()


# the collective methods Paddle's communication functions call on a process group
COLLECTIVES = ("broadcast", "all_gather", "all_gather_into_tensor", "all_reduce", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "barrier", "all_to_all", "scatter", "send", "recv")
for _name in COLLECTIVES:
    setattr(FakeProcessGroup, _name, _finished)


def fake_group(nranks, rank=0):
    """A Paddle ``Group`` of global ranks 0..nranks-1 over a :class:`FakeProcessGroup`; this process is
    ``rank`` of it (and global rank 0 of the job). ValueError: ``rank`` outside the group."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is not in a group of {nranks}")
    gid = next(_GROUP_IDS)
    return Group(rank, gid, list(range(nranks)), pg=FakeProcessGroup(rank, nranks, gid), name=f"fake_sharding_{gid}")


class FakeHcg:
    """The hybrid communicate group of a job that is sharding only: ``group`` the sharding group."""

    def __init__(self, group):
        self._group = group

    def get_sharding_parallel_group(self):
        return self._group

    def get_sharding_parallel_world_size(self):
        return self._group.nranks

    def get_sharding_parallel_rank(self):
        return self._group.rank

    def get_data_parallel_world_size(self):
        return 1

    def get_model_parallel_world_size(self):
        return 1

    def get_pipe_parallel_world_size(self):
        return 1


@contextlib.contextmanager
def sharding_strategy(split_param=False, comm_buffer_size_mb=256):
    """``fleet.fleet``'s strategy for the block, as ``fleet.init`` would set it: ``sharding_configs`` with
    ``split_param`` and ``comm_buffer_size_MB`` (int MB); on V2 also the CPU shim's comm buffers
    (:func:`cpu_v2`). Paddle reads it when it builds the optimizer, the overlay when it turns the overlap
    on. Restored on exit."""
    strategy = fleet.DistributedStrategy()
    configs = strategy.hybrid_configs["sharding_configs"]
    configs.split_param, configs.comm_buffer_size_MB = split_param, int(comm_buffer_size_mb)
    missing = object()
    saved = getattr(fleet.fleet, "_user_defined_strategy", missing)
    fleet.fleet._user_defined_strategy = strategy
    try:
        with cpu_v2() if split_param else contextlib.nullcontext():
            yield strategy
    finally:
        if saved is missing:
            del fleet.fleet._user_defined_strategy
        else:
            fleet.fleet._user_defined_strategy = saved


def sharding_optimizer(parameters, group, split_param=False, lr=1e-3):
    """Paddle's V1 (or, with ``split_param``, V2) sharding optimizer around AdamW over ``group``; inside
    :func:`sharding_strategy`."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import dygraph_sharding_optimizer as dso

    inner = paddle.optimizer.AdamW(learning_rate=lr, parameters=parameters)
    cls = dso.DygraphShardingOptimizerV2 if split_param else dso.DygraphShardingOptimizer
    return cls(inner, FakeHcg(group))


def cpu_v2():
    """The test-only CPU shim's ``cpu_sharding_v2()`` (item 8): V2's comm buffers built on the CPU with
    the GPU's alignment. A context manager."""
    return _shim().cpu_sharding_v2()


def _shim():
    """``test/collective/fleet/hybrid_parallel_cpu_shim.py`` (its finished task, its V2 comm buffers)."""
    if _SHIM_DIR not in sys.path:
        sys.path.insert(0, _SHIM_DIR)
    import hybrid_parallel_cpu_shim

    return hybrid_parallel_cpu_shim
