"""In-process tests of StageOneBroadcastOverlap: order, waits, state machine.

No ranks: the owner gets a fake sharding group and a recording ``comm``
whose broadcasts return tasks that log their ``wait()``. Each test compares
the exact list of events (agree, broadcast, wait, forward of a layer) with
the expected one, the way PyTorch FSDP's tests compare event lists. What
needs real ranks (bitwise equality, agreement across ranks, Paddle's
optimizer internals) stays in the collective tests.
"""

import copy
import gc
import warnings
from collections import OrderedDict

import paddle
import pytest

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_overlap as bo,
)
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    read_interception as guard,
)

State = bo.BroadcastOverlapState


class FakeGroup:
    ranks = [0, 1]


class FakeTask:
    def __init__(self, events, name):
        self._events = events
        self._name = name

    def wait(self):
        self._events.append(("wait", self._name))


class RecordingComm:
    """Records ("agree", message) and ("broadcast", name, src); async
    broadcasts return a FakeTask that records ("wait", name).

    ``first_rank_messages``: what the group's first rank sends at each
    blocking broadcast of the agreement (None: this rank's own values, as
    if it were rank 0)."""

    def __init__(self, names, first_rank_messages=None):
        self.events = []
        self.reductions = []
        self.others_max = [0]
        self._names = names
        self._first_rank_messages = list(first_rank_messages or [])

    def broadcast(self, tensor, src, group, sync_op):
        if sync_op:
            if self._first_rank_messages:
                tensor.set_value(
                    paddle.to_tensor(
                        self._first_rank_messages.pop(0), dtype="int64"
                    )
                )
            self.events.append(("agree", tensor.numpy().tolist()))
            return None
        self.events.append(("broadcast", self._names[id(tensor)], src))
        return FakeTask(self.events, self._names[id(tensor)])

    def all_reduce_max(self, values, group):
        """The per-launch agreement of bucket mode: recorded apart from
        ``events``; ``others_max`` is what the other ranks contribute."""
        self.reductions.append(list(values))
        return [max(v, o) for v, o in zip(values, self.others_max)]

    def rank(self):
        return 1

    def take(self):
        events = list(self.events)
        self.events.clear()
        return events


class Net(paddle.nn.Layer):
    """Two linears built in the opposite of their forward order."""

    def __init__(self):
        super().__init__()
        self.second = paddle.nn.Linear(3, 2)
        self.first = paddle.nn.Linear(4, 3)

    def forward(self, x):
        return self.second(self.first(x))


class TiedHead(paddle.nn.Layer):
    """Pipeline-style tie: the head reads the embedding's weight without
    calling the embedding layer (PaddleNLP's SharedLayerDesc forward_func)."""

    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(5, 4)
        self.block = paddle.nn.Linear(4, 4)

    def forward(self, ids):
        h = self.block(self.embed(ids))
        return paddle.matmul(h, self.embed.weight, transpose_y=True)

    def head_only(self, h):
        return paddle.matmul(h, self.embed.weight, transpose_y=True)


def names_of(model):
    return {id(p): n for n, p in model.named_parameters()}


def make_owner(model, strict=False, src_ranks=None, messages=None):
    params = list(model.parameters())
    comm = RecordingComm(names_of(model), messages)
    owner = bo.StageOneBroadcastOverlap(
        params,
        src_ranks or [0] * len(params),
        FakeGroup(),
        model,
        strict,
        comm=comm,
    )
    owner.open()
    return owner, comm


def record_forwards(model, comm):
    """A user pre-hook on every sublayer, registered after the overlay's:
    logs ("forward", name) after the overlay's waits for that layer."""
    handles = []
    for name, layer in model.named_sublayers(include_self=True):
        handles.append(
            layer.register_forward_pre_hook(
                lambda _l, _i, name=name or "<root>": comm.events.append(
                    ("forward", name)
                )
            )
        )
    return handles


def first_step(model, owner, comm, x):
    """Forward (records the order), then the first launch."""
    model(x)
    owner.launch()
    return comm.take()


X = paddle.ones([2, 4])
# Net's forward after the first step: each layer's waits, then the layer's user pre-hook
NET_FORWARD = [
    ("wait", "first.weight"),
    ("wait", "first.bias"),
    ("forward", "first"),
    ("wait", "second.weight"),
    ("wait", "second.bias"),
    ("forward", "second"),
]
IDS = paddle.to_tensor([[1, 2]], dtype="int64")


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    gc.collect()
    for owner in bo.open_overlaps():
        owner.close()
    assert bo.PENDING == {}


def test_order_is_forward_order_and_agreed_once():
    model = Net()
    owner, comm = make_owner(model)
    names = list(names_of(model).values())
    assert names == ["second.weight", "second.bias", "first.weight", "first.bias"]
    events = first_step(model, owner, comm, X)
    # position list: first.* (2, 3) before second.* (0, 1)
    assert events == [
        ("agree", [4]),
        ("agree", [2, 3, 0, 1]),
        ("broadcast", "first.weight", 0),
        ("broadcast", "first.bias", 0),
        ("broadcast", "second.weight", 0),
        ("broadcast", "second.bias", 0),
    ]
    assert owner.state is State.ORDERED and owner.order == [2, 3, 0, 1]
    owner.wait_before_update()
    owner.launch()  # no second agreement
    assert [e[0] for e in comm.take()] == ["wait"] * 4 + ["broadcast"] * 4


def test_forward_waits_each_layer_for_its_own_tasks_just_before_it_runs():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    record_forwards(model, comm)
    model(X)
    assert comm.take() == [("forward", "<root>")] + NET_FORWARD
    assert owner.stats["waited_in_forward"] == 4
    assert owner.stats["waited_out_of_order"] == 0
    assert owner.stats["waited_on_read"] == 0


@pytest.mark.parametrize("has_prepend", [True, False], ids=["prepend", "paddle_2_6_move_to_front"])
def test_pre_hook_a_user_registered_first_still_runs_after_the_waits(has_prepend, monkeypatch):
    # Paddle 2.6's register_forward_pre_hook has no prepend=: the owner moves
    # its hook to the front of the layer's hook dict itself.
    monkeypatch.setattr(bo, "_HAS_PREPEND", has_prepend)
    model = Net()
    box = []
    for name, layer in (("first", model.first), ("second", model.second)):
        layer.register_forward_pre_hook(lambda _l, _i, name=name: box[0].events.append(("forward", name)))
    owner, comm = make_owner(model)
    box.append(comm)
    first_step(model, owner, comm, X)
    model(X)
    assert comm.take() == NET_FORWARD


def test_attribute_read_outside_forward_waits_only_that_parameter():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    norm = paddle.linalg.norm(model.second.weight)  # logging between steps
    assert comm.take() == [("wait", "second.weight")]
    assert owner.num_pending == 3
    assert owner.read_paths == {"attribute": 1}
    float(norm)
    model.second.weight  # already waited: nothing more
    assert comm.take() == []


def test_direct_sublayer_forward_outside_model_call_waits_its_parameters():
    model = Net()
    owner, comm = make_owner(model, strict=True)
    first_step(model, owner, comm, X)
    with paddle.no_grad():
        model.first.forward(X)  # an encode()/generate()-style helper
    assert comm.take() == [("wait", "first.weight"), ("wait", "first.bias")]
    assert owner.num_pending == 2


def test_parameters_iteration_waits_exactly_what_it_hands_out():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    list(model.second.named_parameters())
    assert comm.take() == [("wait", "second.weight"), ("wait", "second.bias")]
    params = model.parameters()  # EMA / parameters_to_vector / grad-norm
    assert len(params) == 4
    assert comm.take() == [("wait", "first.weight"), ("wait", "first.bias")]
    assert owner.read_paths == {"iteration": 4}
    assert owner.num_pending == 0


def test_tied_weight_read_without_calling_its_layer_is_waited():
    model = TiedHead()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, IDS)
    h = paddle.ones([1, 2, 4])
    model.head_only(h)  # the last pipeline stage: embed is never called
    assert comm.take() == [("wait", "embed.weight")]


def test_state_dict_and_set_state_dict_wait_first():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    state = model.first.state_dict()
    assert sorted(comm.take()) == [("wait", "first.bias"), ("wait", "first.weight")]
    model.second.set_state_dict(
        {k: v.numpy() for k, v in Net().second.state_dict().items()}
    )
    assert sorted(comm.take()) == [
        ("wait", "second.bias"),
        ("wait", "second.weight"),
    ]
    assert set(state) == {"weight", "bias"}


def test_step_waits_whatever_is_left_in_launch_order():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    model.second.bias
    comm.take()
    owner.wait_before_update()
    assert comm.take() == [
        ("wait", "first.weight"),
        ("wait", "first.bias"),
        ("wait", "second.weight"),
    ]
    assert owner.stats["waited_before_update"] == 3
    assert owner.wait_all() == 0  # safe to call again


def test_strict_first_hooked_layer_waits_everything():
    model = Net()
    owner, comm = make_owner(model, strict=True)
    first_step(model, owner, comm, X)
    record_forwards(model, comm)
    model(X)
    events = comm.take()
    assert events[:5] == [
        ("wait", "first.weight"),
        ("wait", "first.bias"),
        ("wait", "second.weight"),
        ("wait", "second.bias"),
        ("forward", "<root>"),
    ]


def test_compiled_layer_waits_everything_at_its_entry():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    kwargs = {"full_graph": True} if paddle.__version__ >= "3" else {}
    paddle.jit.to_static(model.first, **kwargs)
    owner.wait_before_update()
    comm.take()
    owner.launch()  # finds the compiled layer
    comm.take()
    model(X)
    assert [e for e in comm.take() if e[0] == "wait"][:4] == [
        ("wait", "first.weight"),
        ("wait", "first.bias"),
        ("wait", "second.weight"),
        ("wait", "second.bias"),
    ]


def test_reference_taken_before_step_is_not_intercepted():
    """Documented limit: a tensor held across step() is read as is; the
    fix is to read ``layer.weight`` again after step()."""
    model = Net()
    owner, comm = make_owner(model)
    held = model.first.weight
    first_step(model, owner, comm, X)
    held.numpy()
    assert comm.take() == []
    model.first.weight.numpy()
    assert comm.take() == [("wait", "first.weight")]


def test_layer_that_did_not_run_gives_no_warning():
    class Skip(Net):
        def forward(self, x):
            return self.first(x)

    model = Skip()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(X)
    assert owner.num_pending == 2  # the next step() waits for them


def test_pending_task_at_launch_is_a_runtime_error_naming_the_rank():
    model = Net()
    owner, _ = make_owner(model)
    model(X)
    owner.launch()
    with pytest.raises(RuntimeError, match="rank 1: .* 4 unit"):
        owner.launch()


def test_disagreeing_parameter_lists_raise_naming_the_rank():
    model = Net()
    owner, _ = make_owner(model, messages=[[5]])
    model(X)
    with pytest.raises(RuntimeError, match="rank 1: .*4 parameters here, 5"):
        owner.launch()
    owner2, _ = make_owner(Net(), messages=[[4], [0, 1, 1, 2]])
    owner2._layers(X)
    with pytest.raises(RuntimeError, match="rank 1: .* not a permutation"):
        owner2.launch()


def test_hooks_and_guards_constant_then_all_removed_on_close():
    model = Net()
    owner, comm = make_owner(model)
    hooks = sum(len(l._forward_pre_hooks) for l in model.sublayers(True))
    for _ in range(5):
        model(X)
        owner.wait_before_update()
        owner.launch()
    assert sum(len(l._forward_pre_hooks) for l in model.sublayers(True)) == hooks
    assert type(model.first._parameters) is guard.GuardedParameters
    owner.close()
    assert owner.state is State.CLOSED and owner.num_pending == 0
    assert sum(len(l._forward_pre_hooks) for l in model.sublayers(True)) == 0
    assert type(model.first._parameters) is OrderedDict
    owner.close()  # idempotent


def test_replaced_parameter_dict_is_guarded_again_at_launch():
    model = Net()
    owner, comm = make_owner(model)
    model(X)
    owner.launch()
    owner.wait_before_update()
    model.first.__dict__["_parameters"] = OrderedDict(model.first._parameters)
    owner.launch()
    comm.take()
    model.first.weight
    assert comm.take() == [("wait", "first.weight")]


def test_garbage_collected_optimizer_marks_closed_hooks_removed_later():
    class Optimizer:
        pass

    model = Net()
    owner, comm = make_owner(model)
    opt = Optimizer()
    owner.close_with(opt)
    first_step(model, owner, comm, X)
    comm.take()
    del opt
    gc.collect()
    # closed inside gc, but nothing waited there (a finalizer never waits
    # on a collective) and no hook touched (no mutation in gc)
    assert comm.take() == []
    assert owner.state is State.CLOSED and owner.num_pending == 4
    assert owner.num_hooks == 3  # root, first, second
    model.first.weight  # a read still waits for its own unit
    assert comm.take() == [("wait", "first.weight")]
    bo.open_overlaps()  # the next explicit call waits and sweeps
    assert sorted(comm.take()) == [("wait", n) for n in ("first.bias", "second.bias", "second.weight")]
    assert owner.num_pending == 0 and owner.num_hooks == 0
    model(X)
    assert comm.take() == []
    assert type(model.first._parameters) is OrderedDict


def test_deepcopy_waits_and_carries_no_guard_or_hook():
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    clone = copy.deepcopy(model)
    assert len([e for e in comm.take() if e[0] == "wait"]) == 4
    assert type(clone.first._parameters) is OrderedDict
    clone(X)  # copied hooks are no-ops
    assert comm.take() == []


def test_two_owners_share_one_model_guard_kept_until_last_closes():
    model = Net()
    comm = RecordingComm(names_of(model))
    owners = []
    for sub in (model.first, model):
        params = list(sub.parameters())
        owner = bo.StageOneBroadcastOverlap(
            params, [0] * len(params), FakeGroup(), model, comm=comm
        )
        owner.open()
        owners.append(owner)
    owners[0].close()
    assert type(model.first._parameters) is guard.GuardedParameters
    owners[1].close()
    assert type(model.first._parameters) is OrderedDict


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (dict(layers=None), ValueError, "needs the model"),
        (dict(layers="model"), TypeError, "paddle.nn.Layer"),
        (dict(strict=1), TypeError, "strict must be a bool"),
        (dict(src_ranks=[0]), ValueError, "source ranks"),
        (dict(layers=paddle.nn.Linear(1, 1)), ValueError, "owns none"),
    ],
)
def test_bad_input_raises_before_anything_changes(bad, error, match):
    model = Net()
    params = list(model.parameters())
    args = dict(
        params=params,
        src_ranks=[0] * 4,
        group=FakeGroup(),
        layers=model,
        strict=False,
    )
    args.update(bad)
    with pytest.raises(error, match=match):
        bo.StageOneBroadcastOverlap(**args, comm=RecordingComm({}))
    assert sum(len(l._forward_pre_hooks) for l in model.sublayers(True)) == 0
    assert type(model.first._parameters) is OrderedDict


def test_get_broadcast_overlap_follows_inner_optimizers():
    class Opt:
        pass

    inner, outer = Opt(), Opt()
    outer._inner_opt = inner
    assert bo.get_broadcast_overlap(outer) is None
    vars(inner)[bo._OWNER_ATTR] = "owner"
    assert bo.get_broadcast_overlap(outer) == "owner"


@pytest.mark.parametrize(
    "sabotage",
    ["forward_pre_hook", "attribute_read", "iteration_read"],
)
def test_these_tests_fail_when_a_wait_is_removed(sabotage, monkeypatch):
    """Mutation check: remove one wait site; a scenario above must fail."""
    scenario = {
        "forward_pre_hook": (
            test_forward_waits_each_layer_for_its_own_tasks_just_before_it_runs
        ),
        "attribute_read": (
            test_attribute_read_outside_forward_waits_only_that_parameter
        ),
        "iteration_read": (
            test_parameters_iteration_waits_exactly_what_it_hands_out
        ),
    }[sabotage]
    if sabotage == "forward_pre_hook":
        monkeypatch.setattr(
            bo.StageOneBroadcastOverlap, "_on_forward_pre", lambda *a: None
        )
    elif sabotage == "attribute_read":
        monkeypatch.setattr(
            guard.GuardedParameters, "__getitem__", OrderedDict.__getitem__
        )
    else:
        monkeypatch.setattr(guard.GuardedParameters, "items", OrderedDict.items)
        monkeypatch.setattr(
            guard.GuardedParameters, "values", OrderedDict.values
        )
    with pytest.raises(AssertionError):
        scenario()
    for owner in bo.open_overlaps():
        owner.close()


def test_remove_refused_while_an_owner_is_open():
    import paddle_overlay

    model = Net()
    owner, _ = make_owner(model)
    paddle_overlay.apply()
    try:
        with pytest.raises(RuntimeError, match="_set_broadcast_overlap\\(False\\)"):
            paddle_overlay.remove()
        assert paddle_overlay.is_applied()
        owner.close()
    finally:
        paddle_overlay.remove()
    assert not paddle_overlay.is_applied()


def test_layer_outside_layers_sharing_a_parameter_is_not_guarded():
    """Documented limit: a layer outside ``layers`` that holds one of its
    parameters reads it without waiting; the model's own path waits."""
    model = Net()
    outside = paddle.nn.Linear(4, 3)
    outside.weight = model.first.weight  # shared, but not under `model`
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    outside.weight
    assert comm.take() == []
    model.first.weight
    assert comm.take() == [("wait", "first.weight")]
