"""After the first step the owner never blocks the host: a steady-state
step (wait before the update, launch, the forward's waits) makes no host
read of a tensor, no device synchronize and no collective but its units'
own async ones, for every planner. The first launch (the order agreement:
two int64 broadcasts, each read back) shows the counter counts.

The owner runs with the product's ``PaddleComm``; the collectives it
reaches (``paddle.distributed.*``, the group's ``process_group``) are fakes
that record the call."""

import paddle
import pytest
from owner_fakes import (
    V2,
    Chain,
    FakeTask,
    GatherGroup,
    Net,
    X,
    chain_buffers,
    make_bucket_owner,
    make_fused_owner,
    make_owner,
    wait_before_update,
)

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    unit_plan,
)
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.comm_unit import (
    PaddleComm,
)

HOST_READS = ("numpy", "item", "tolist", "__array__", "__bool__", "__float__", "__int__")
COLLECTIVES = (
    "all_reduce broadcast all_gather all_gather_object barrier reduce scatter "
    "send recv isend irecv alltoall alltoall_single reduce_scatter "
    "broadcast_object_list scatter_object_list gather wait"
).split()


@pytest.fixture
def calls(monkeypatch):
    """Every call of a blocking entry point, in order: "Tensor.<method>",
    "synchronize", or (collective, sync_op)."""
    log = []

    def counted(name, original):
        def method(self, *args, **kwargs):
            log.append(f"Tensor.{name}")
            return original(self, *args, **kwargs)

        return method

    def collective(name):
        def call(*args, **kwargs):
            sync_op = kwargs.get("sync_op", True)
            log.append((name, sync_op))
            return None if sync_op else FakeTask([], name)

        return call

    for name in HOST_READS:
        monkeypatch.setattr(paddle.Tensor, name, counted(name, getattr(paddle.Tensor, name)))
    for module in (paddle.device, paddle.device.cuda):
        monkeypatch.setattr(module, "synchronize", lambda *a, **k: log.append("synchronize"))
    for module, prefix in ((paddle.distributed, ""), (paddle.distributed.stream, "stream.")):
        for name in COLLECTIVES:
            if callable(getattr(module, name, None)):
                monkeypatch.setattr(module, name, collective(prefix + name))
    return log


class ProcessGroup:
    def __init__(self, log):
        self._log = log

    def all_gather(self, shard, full):
        self._log.append(("process_group.all_gather", False))
        return FakeTask([], "all_gather")


def per_parameter(model, log):
    return make_owner(model, comm=PaddleComm())[0]


def buckets(model, log):
    return make_bucket_owner(model, 1, comm=PaddleComm())[0]


def fused(model, log):
    return make_fused_owner(model, 1, layout=[3, 2, 1, 0], comm=PaddleComm())[0]


def comm_buffers(model, log):
    buffers = chain_buffers(model)
    buffers[0]._comm_group.process_group = ProcessGroup(log)  # all three's
    planner = unit_plan.CommBuffers(lambda: buffers)
    return make_owner(model, planner=planner, comm=PaddleComm(), method=V2, group=GatherGroup())[0]


def replace_memory(model):
    """A loader handing new memory (same dtype and size): rebound locally."""
    for p in model.parameters():
        paddle.full(p.shape, 0.5)._share_buffer_to(p)


PLANNERS = {
    "per parameter": (Net, per_parameter, 4, None),
    "buckets": (Net, buckets, 1, None),
    "buckets, memory replaced": (Net, buckets, 1, replace_memory),
    "fused slices": (Net, fused, 1, None),
    "fused slices, memory replaced": (Net, fused, 1, replace_memory),
    "comm buffers": (Chain, comm_buffers, 3, None),
}


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_steady_state_step_makes_no_blocking_call(calls, planner):
    model_cls, make, units, between = PLANNERS[planner]
    model = model_cls()
    owner = make(model, calls)
    own = [("process_group.all_gather" if owner.method == V2 else "broadcast", False)] * units
    model(X)
    owner.launch()  # the first: agrees the order
    agreement = [("broadcast", True), "Tensor.numpy"] * 2
    assert calls == agreement + own
    model(X)
    calls.clear()
    for _ in range(2):
        if between is not None:
            between(model)
        wait_before_update(owner)
        owner.launch()
        model(X)
    assert calls == own * 2  # the units' own async collectives, nothing else
    assert owner.num_pending == 0 and owner.stats["waited_in_forward"] == 3 * units
    if between is not None:
        assert owner.stats["rebound"] == 2 * len(list(model.parameters()))
