"""In-process tests of ParamSyncOverlap with broadcast buckets (and fused
slices): planning, waits, replaced memory rebound locally, dtype or size
changes refused before anything is sent.

Fakes of ``owner_fakes.py`` (fake group, recording comm, exact event
lists); bucket buffers are named ``bucket0``, ``bucket1``, ... in the order
the comm first sees them.
"""

import numpy as np
import paddle
import pytest
from owner_fakes import (
    V1,
    Net,
    X,
    in_buffer,
    make_bucket_owner,
    make_fused_owner,
    next_step,
    record_forwards,
    unit_of_param,
    wait_before_update,
)

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    param_sync_overlap as pso,
)
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.broadcast_buckets import (
    dtype_name,
)


def launch_after_forward(model, owner, comm):
    model(X)
    owner.launch()
    return comm.take()


def test_one_broadcast_per_bucket_in_forward_order():
    model = Net()  # params: second.w [3,2], second.b, first.w [4,3], first.b
    # 64-byte windows: first.weight (48 B) + first.bias (12 B) + second.weight
    # (24 B) close the first window; second.bias is alone in the second
    owner, comm = make_bucket_owner(model, 64 / 2**20, src_ranks=[1, 1, 0, 0])
    events = launch_after_forward(model, owner, comm)
    assert events == [
        ("agree", [4]),
        ("agree", [2, 3, 0, 1]),
        ("broadcast", "bucket0", 0),  # first.weight, first.bias
        ("broadcast", "bucket1", 1),  # second.weight
        ("broadcast", "bucket2", 1),  # second.bias
    ]
    assert [(u.label, u.src, u.indices) for u in owner.units] == [
        ("bucket0", 0, (2, 3)),
        ("bucket1", 1, (0,)),
        ("bucket2", 1, (1,)),
    ]


def test_layer_waits_for_every_bucket_holding_its_parameters():
    model = Net()
    owner, comm = make_bucket_owner(model, 64 / 2**20, src_ranks=[1, 1, 0, 0])
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
    owner, comm = make_bucket_owner(model, 64 / 2**20, src_ranks=[1, 1, 0, 0])
    launch_after_forward(model, owner, comm)
    model.second.bias  # attribute read between steps
    assert comm.take() == [("wait", "bucket2")]
    assert owner.num_pending == 2


def test_parameters_become_views_and_values_survive():
    model = Net()
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    owner, comm = make_bucket_owner(model, 1)
    launch_after_forward(model, owner, comm)
    owner.wait_all()
    (unit,) = owner.units
    for p in model.parameters():
        assert in_buffer(unit.tensor, p)
    for k, v in model.state_dict().items():
        assert v.numpy().tobytes() == before[k].tobytes(), k


def test_unfrozen_after_planning_is_sent_alone():
    model = Net()
    model.first.bias.stop_gradient = True
    owner, comm = make_bucket_owner(model, 1)
    assert [e for e in launch_after_forward(model, owner, comm) if e[0] == "broadcast"] == [
        ("broadcast", "bucket0", 0)
    ]
    model.first.bias.stop_gradient = False
    assert next_step(owner, comm) == [
        ("broadcast", "bucket0", 0),
        ("broadcast", "first.bias", 0),
    ]


def test_zero_keeps_one_broadcast_per_parameter():
    model = Net()
    owner, comm = make_bucket_owner(model, 0)  # check_bucket_size_mb(0) == 0
    events = launch_after_forward(model, owner, comm)
    assert [e[1] for e in events if e[0] == "broadcast"] == [
        "first.weight", "first.bias", "second.weight", "second.bias"
    ]
    assert all(u.tensor is u.params[0] for u in owner.units)  # no buffer


# ----------------------------------------------------------------------
# Memory replaced under a parameter: rebound into its slot, locally.
def share_buffer(fresh, param):
    fresh._share_buffer_to(param)


def share_data(fresh, param):  # a loader that hands tensors
    param.get_tensor()._share_data_with(fresh.get_tensor())


MAKERS = {
    "buckets": lambda model: (*make_bucket_owner(model, 1), None),
    "fused": lambda model: make_fused_owner(model, 1, layout=[3, 2, 1, 0]),
}


@pytest.mark.parametrize("replace", [share_buffer, share_data])
@pytest.mark.parametrize("mode", sorted(MAKERS))
def test_replaced_memory_is_rebound_into_its_slot_and_sent_by_its_bucket(mode, replace):
    model = Net()
    owner, comm, fused = MAKERS[mode](model)
    launch_after_forward(model, owner, comm)
    w = model.first.weight
    slot = w.data_ptr()
    before = next_step(owner, comm)
    fresh = paddle.full([4, 3], 5.0)  # kept alive while its memory is shared
    wait_before_update(owner)
    comm.take()
    replace(fresh, w)
    assert w.data_ptr() == fresh.data_ptr() != slot
    owner.launch()
    assert comm.take() == before  # the same broadcasts, nothing else
    assert owner.stats["rebound"] == 1
    assert w.data_ptr() == slot and (w.numpy() == 5.0).all()
    unit = unit_of_param(owner, w)
    assert in_buffer(unit.tensor, w)
    if fused is not None:
        assert in_buffer(fused, w)
    # what the bucket sends is the parameter's value
    offset = (w.data_ptr() - unit.tensor.data_ptr()) // 4
    np.testing.assert_array_equal(unit.tensor.numpy()[offset : offset + 12], np.full(12, 5.0, "float32"))
    next_step(owner, comm)
    assert owner.stats["rebound"] == 1  # nothing more to rebind


def changed_dtype(model):
    model.to(dtype="float64")
    return list(model.parameters())


def changed_dtype_of_one(model):
    model.first.to(dtype="float16")
    return [model.first.weight, model.first.bias]


def grown_in_place(model):
    with paddle.no_grad():
        paddle.assign(paddle.full([5, 3], 7.0), model.first.weight)
    assert model.first.weight.shape == [5, 3]
    return [model.first.weight]


CHANGES = {
    "model.to(float64)": changed_dtype,
    "first.to(float16)": changed_dtype_of_one,
    "assign(bigger)": grown_in_place,
}


@pytest.mark.parametrize("entry", ["before_update", "launch"])  # step()'s start; a launch
@pytest.mark.parametrize("mode", sorted(MAKERS) + ["per_parameter"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_dtype_or_size_change_is_refused_before_anything_is_sent(mode, change, entry):
    model = Net()
    if mode == "per_parameter":
        owner, comm = make_bucket_owner(model, 0)
    else:
        owner, comm, _ = MAKERS[mode](model)
    launch_after_forward(model, owner, comm)
    wait_before_update(owner)
    comm.take()
    was = {p.name: p._numel() for p in model.parameters()}
    changed = {
        p.name: f"changed from float32 x {was[p.name]} elements to "
        f"{dtype_name(p.dtype)} x {p._numel()} elements after the first step"
        for p in CHANGES[change](model)
    }
    stats = dict(owner.stats)
    with pytest.raises(ValueError) as error:
        getattr(owner, entry)()
    message = str(error.value)
    named = [n for n in changed if f"parameter {n} " in message]
    assert len(named) == 1 and changed[named[0]] in message, message
    assert f"optimizer.{V1}(False)" in message and "Nothing was sent" in message
    assert comm.take() == []
    assert owner.num_pending == 0 and owner.stats == stats
    assert owner.state is pso.ParamSyncState.ORDERED


def test_frozen_parameter_changed_is_no_error_in_per_parameter_mode():
    model = Net()
    owner, comm = make_bucket_owner(model, 0)
    launch_after_forward(model, owner, comm)
    model.second.to(dtype="float64")
    model.second.weight.stop_gradient = model.second.bias.stop_gradient = True
    assert [e[1] for e in next_step(owner, comm) if e[0] == "broadcast"] == [
        "first.weight", "first.bias"
    ]


def test_refusal_leaves_the_other_replaced_parameter_unbound():
    """The check runs over every slot before anything is rebound."""
    model = Net()
    owner, comm = make_bucket_owner(model, 1)
    launch_after_forward(model, owner, comm)
    wait_before_update(owner)
    w = model.first.weight
    fresh = paddle.full([4, 3], 5.0)
    share_buffer(fresh, w)
    model.second.to(dtype="float64")
    with pytest.raises(ValueError, match=model.second.weight.name):
        owner.launch()
    assert w.data_ptr() == fresh.data_ptr() and owner.stats["rebound"] == 0


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (float("nan"), ValueError), ("1", TypeError)])
def test_bad_bucket_size_raises_before_anything_changes(bad, error):
    model = Net()
    with pytest.raises(error, match="bucket_size_mb"):
        make_bucket_owner(model, bad)
    assert sum(len(l._forward_pre_hooks) for l in model.sublayers(include_self=True)) == 0
