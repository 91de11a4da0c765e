"""In-process tests of StageOneBroadcastOverlap with broadcast buckets.

Same recording set-up as ``test_broadcast_overlap_owner.py`` (fake group,
recording comm, exact event lists); bucket buffers are named ``bucket0``,
``bucket1``, ... in the order the comm first sees them.
"""

import warnings

import paddle
import pytest

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_overlap as bo,
)
from test_broadcast_overlap_owner import (
    FakeGroup,
    Net,
    RecordingComm,
    names_of,
    no_leftovers,  # noqa: F401  (autouse: closes owners, checks the registry)
    record_forwards,
)

X = paddle.ones([2, 4])
KB = 1.0 / 1024


class BucketComm(RecordingComm):
    """Names a tensor it was not told about ``bucket<k>``."""

    def broadcast(self, tensor, src, group, sync_op):
        if not sync_op and id(tensor) not in self._names:
            self._names[id(tensor)] = f"bucket{sum(n.startswith('bucket') for n in self._names.values())}"
        return super().broadcast(tensor, src, group, sync_op)


def make_owner(model, bucket_size_mb, src_ranks=None):
    params = list(model.parameters())
    comm = BucketComm(names_of(model))
    owner = bo.StageOneBroadcastOverlap(
        params, src_ranks or [0] * len(params), FakeGroup(), model, comm=comm,
        bucket_size_mb=bucket_size_mb,
    )
    owner.open()
    return owner, comm


def launch_after_forward(model, owner, comm):
    model(X)
    owner.launch()
    return comm.take()


def test_one_broadcast_per_bucket_in_forward_order():
    model = Net()  # params: second.w [3,2], second.b, first.w [4,3], first.b
    # 64-byte windows: first.weight (48 B) + first.bias (12 B) + second.weight
    # (24 B) close the first window; second.bias is alone in the second
    owner, comm = make_owner(model, 64 / 2**20, src_ranks=[1, 1, 0, 0])
    events = launch_after_forward(model, owner, comm)
    assert events == [
        ("agree", [4]),
        ("agree", [2, 3, 0, 1]),
        ("broadcast", "bucket0", 0),  # first.weight, first.bias
        ("broadcast", "bucket1", 1),  # second.weight
        ("broadcast", "bucket2", 1),  # second.bias
    ]
    specs = owner.bucket_storage.specs
    assert [(s.window, s.src, s.indices) for s in specs] == [(0, 0, (2, 3)), (0, 1, (0,)), (1, 1, (1,))]


def test_layer_waits_for_every_bucket_holding_its_parameters():
    model = Net()
    owner, comm = make_owner(model, 64 / 2**20, src_ranks=[1, 1, 0, 0])
    launch_after_forward(model, owner, comm)
    record_forwards(model, comm)
    model(X)
    assert comm.take() == [
        ("forward", "<root>"),
        ("wait", "bucket0"),
        ("forward", "first"),
        ("wait", "bucket1"),
        ("wait", "bucket2"),
        ("forward", "second"),
    ]


def test_read_of_a_parameter_waits_its_bucket_only():
    model = Net()
    owner, comm = make_owner(model, 64 / 2**20, src_ranks=[1, 1, 0, 0])
    launch_after_forward(model, owner, comm)
    model.second.bias  # attribute read between steps
    assert comm.take() == [("wait", "bucket2")]
    assert owner.num_pending == 2


def test_parameters_become_views_and_values_survive():
    model = Net()
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    owner, comm = make_owner(model, 1)
    launch_after_forward(model, owner, comm)
    owner.wait_all()
    (buf,) = owner.bucket_storage.buffers
    for p in model.parameters():
        assert buf.data_ptr() <= p.data_ptr() < buf.data_ptr() + 4 * buf.shape[0]
    for k, v in model.state_dict().items():
        assert v.numpy().tobytes() == before[k].tobytes(), k


def test_unfrozen_after_planning_is_sent_alone():
    model = Net()
    model.first.bias.stop_gradient = True
    owner, comm = make_owner(model, 1)
    assert [e for e in launch_after_forward(model, owner, comm) if e[0] == "broadcast"] == [
        ("broadcast", "bucket0", 0)
    ]
    owner.wait_before_update()
    comm.take()
    model.first.bias.stop_gradient = False
    owner.launch()
    assert comm.take() == [("broadcast", "bucket0", 0), ("broadcast", "first.bias", 0)]


def test_replaced_storage_is_replanned_on_every_rank_with_one_warning():
    model = Net()
    owner, comm = make_owner(model, 1)
    launch_after_forward(model, owner, comm)
    owner.wait_before_update()
    comm.take()
    (old,) = owner.bucket_storage.buffers
    w = model.first.weight
    fresh = paddle.ones([4, 3])  # kept alive while its memory is shared
    w.get_tensor()._share_data_with(fresh.get_tensor())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        owner.launch()
        owner.wait_before_update()
        owner.launch()
    assert [w.name in str(c.message) for c in caught] == [True]
    # one max-reduce per launch says whether any rank saw a replacement
    assert comm.reductions == [[1], [0]]
    assert owner.stats["replanned"] == 1
    # a new plan: one bucket again, holding the replaced parameter's value
    (new,) = owner.bucket_storage.buffers
    assert new is not old
    assert [e for e in comm.take() if e[0] == "broadcast"] == [("broadcast", "bucket1", 0)] * 2
    assert buf_holds(new, w) and (w.numpy() == 1).all()


def test_replacement_on_another_rank_only_replans_here_too():
    model = Net()
    owner, comm = make_owner(model, 1)
    launch_after_forward(model, owner, comm)
    owner.wait_before_update()
    comm.take()
    comm.others_max = [1]  # another rank of the group saw a replacement
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        owner.launch()
    assert ["another rank" in str(c.message) for c in caught] == [True]
    assert owner.stats["replanned"] == 1
    assert [e[1] for e in comm.take() if e[0] == "broadcast"] == ["bucket1"]


def buf_holds(buf, param):
    return buf.data_ptr() <= param.data_ptr() < buf.data_ptr() + 4 * buf.shape[0]


def test_zero_keeps_one_broadcast_per_parameter():
    model = Net()
    owner, comm = make_owner(model, 0)
    events = launch_after_forward(model, owner, comm)
    assert [e[1] for e in events if e[0] == "broadcast"] == [
        "first.weight", "first.bias", "second.weight", "second.bias"
    ]
    assert owner.bucket_storage is None


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (float("nan"), ValueError), ("1", TypeError)])
def test_bad_bucket_size_raises_before_anything_changes(bad, error):
    model = Net()
    hooks = sum(len(l._forward_pre_hooks) for l in model.sublayers(include_self=True))
    with pytest.raises(error, match="bucket_size_mb"):
        bo.StageOneBroadcastOverlap(list(model.parameters()), [0] * 4, FakeGroup(), model,
                                    bucket_size_mb=bad)
    assert sum(len(l._forward_pre_hooks) for l in model.sublayers(include_self=True)) == hooks
