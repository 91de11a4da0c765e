"""In-process tests of ParamSyncOverlap: order, waits, state machine.

No ranks: fakes of ``owner_fakes.py`` (fake group, recording comm whose
tasks log their ``wait()``); each test compares exact event lists.
"""

import copy
import gc
import warnings
from collections import OrderedDict

import paddle
import pytest
from owner_fakes import (
    IDS,
    NET_FORWARD,
    NET_NAMES,
    V1,
    FakeGroup,
    Net,
    RecordingComm,
    TiedHead,
    X,
    first_step,
    make_owner,
    names_of,
    num_hooks,
    num_post_hooks,
    record_forwards,
    wait_before_update,
)

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_overlap,
    param_sync_overlap as pso,
    read_interception as guard,
    sync_registry,
    unit_plan,
)

State = pso.ParamSyncState


def test_order_is_forward_order_and_agreed_once():
    model = Net()
    owner, comm = make_owner(model)
    assert list(names_of(model).values()) == NET_NAMES
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
    wait_before_update(owner)
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


# prepend=: where this Paddle has it (3.x); the move to the front: everywhere
@pytest.mark.parametrize(
    "has_prepend",
    [False] + [True] * pso._HAS_PREPEND,
    ids=["paddle_2_6_move_to_front"] + ["prepend"] * pso._HAS_PREPEND,
)
def test_pre_hook_a_user_registered_first_still_runs_after_the_waits(has_prepend, monkeypatch):
    # Paddle 2.6's register_forward_pre_hook has no prepend=: the owner moves
    # its hook to the front of the layer's hook dict itself.
    monkeypatch.setattr(pso, "_HAS_PREPEND", has_prepend)
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
    wait_before_update(owner)
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
    wait_before_update(owner)
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
    # its layer's pre-hook waits first, then the program waits the rest
    assert owner.stats["waited_in_forward"] == 2
    assert owner.stats["waited_in_program"] == 2


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
    model2 = Net()
    owner2, _ = make_owner(model2, messages=[[4], [0, 1, 1, 2]])
    model2(X)
    with pytest.raises(RuntimeError, match="rank 1: .* not a permutation"):
        owner2.launch()


def test_every_rank_launches_in_the_first_ranks_order_not_its_own_recording():
    # This rank (1) records first.* then second.* (positions 2, 3, 0, 1 of the
    # parameter list); the group's first rank sends another permutation: the
    # broadcasts follow the order received, so every rank issues the same
    # collectives in the same order even where their first forwards differed.
    model = Net()
    received = [1, 0, 3, 2]
    owner, comm = make_owner(model, messages=[[4], received])
    model(X)
    owner.launch()
    events = comm.take()
    assert events[:2] == [("agree", [4]), ("agree", received)]
    names = ["second.weight", "second.bias", "first.weight", "first.bias"]
    assert [e for e in events if e[0] == "broadcast"] == [("broadcast", names[i], 0) for i in received]


def test_hooks_and_guards_constant_then_all_removed_on_close():
    model = Net()
    owner, comm = make_owner(model)
    counts = []  # (pre-hooks, post-hooks) after each launch
    for _ in range(5):
        model(X)
        wait_before_update(owner)
        owner.launch()
        counts.append((num_hooks(model), num_post_hooks(model)))
    assert counts == [counts[0]] * 5 and counts[0][1] == 1, counts
    assert type(model.first._parameters) is guard.GuardedParameters
    owner.close()
    assert owner.state is State.CLOSED and owner.num_pending == 0
    assert (num_hooks(model), num_post_hooks(model)) == (0, 0)
    assert type(model.first._parameters) is OrderedDict
    owner.close()  # idempotent


def test_replaced_parameter_dict_is_guarded_again_at_launch():
    model = Net()
    owner, comm = make_owner(model)
    model(X)
    owner.launch()
    wait_before_update(owner)
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
    assert sync_registry.open_owners() == []  # the next explicit call waits and sweeps
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
    owners = [
        make_owner(model, params=list(sub.parameters()), comm=comm)[0]
        for sub in (model.first, model)
    ]
    owners[0].close()
    assert type(model.first._parameters) is guard.GuardedParameters
    owners[1].close()
    assert type(model.first._parameters) is OrderedDict


def owner_args(model):
    return dict(
        params=list(model.parameters()),
        group=FakeGroup(),
        layers=model,
        planner=unit_plan.PerParameter([0] * 4),
        method=V1,
        strict=False,
    )


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (dict(layers=None), ValueError, "needs the model"),
        (dict(layers="model"), TypeError, "paddle.nn.Layer"),
        (dict(strict=1), TypeError, "strict must be a bool"),
        (dict(layers=paddle.nn.Linear(1, 1)), ValueError, "owns none"),
    ],
)
def test_bad_input_raises_before_anything_changes(bad, error, match):
    model = Net()
    args = owner_args(model)
    args.update(bad)
    with pytest.raises(error, match=match):
        pso.ParamSyncOverlap(**args, comm=RecordingComm({}))
    assert num_hooks(model) == 0
    assert type(model.first._parameters) is OrderedDict


@pytest.mark.parametrize("value, strict", [(None, False), ("0", False), ("1", True), ("true", True), ("False", False)])
def test_strict_none_reads_its_flag_as_paddle_reads_its_sharding_knobs(value, strict, monkeypatch):
    if value is None:
        monkeypatch.delenv("FLAGS_sharding_overlap_strict", raising=False)
    else:
        monkeypatch.setenv("FLAGS_sharding_overlap_strict", value)
    model = Net()
    args = dict(owner_args(model), strict=None)
    owner = pso.ParamSyncOverlap(**args, comm=RecordingComm({}))
    assert owner._strict is strict
    monkeypatch.setenv("FLAGS_sharding_overlap_strict", "1")
    assert pso.ParamSyncOverlap(**dict(args, strict=False), comm=RecordingComm({}))._strict is False  # given wins


def test_a_bad_strict_flag_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("FLAGS_sharding_overlap_strict", "yes please")
    model = Net()
    with pytest.raises(ValueError, match="FLAGS_sharding_overlap_strict must be 0, 1, false or true"):
        pso.ParamSyncOverlap(**dict(owner_args(model), strict=None), comm=RecordingComm({}))
    assert num_hooks(model) == 0


@pytest.mark.parametrize("cap", [0, -1, 1.5])
def test_bucket_planner_refuses_a_cap_that_is_not_a_positive_int(cap):
    with pytest.raises(ValueError, match=f"cap_bytes must be a positive int, got {cap}"):
        unit_plan.Buckets([0] * 4, cap)


def test_wrong_number_of_source_ranks_is_refused_at_planning_before_any_sync():
    model = Net()
    owner, comm = make_owner(model, planner=unit_plan.PerParameter([0]))
    model(X)
    with pytest.raises(ValueError, match="4 parameters but 1 source ranks"):
        owner.launch()
    assert [e[0] for e in comm.take()] == ["agree", "agree"]  # no broadcast
    assert owner.num_pending == 0 and owner.stats["launched"] == 0


def test_public_views():
    model = Net()
    owner, comm = make_owner(model)
    params = list(model.parameters())
    assert (owner.method, owner.collective) == (V1, "broadcast")
    assert [owner.index_of(p) for p in params] == [0, 1, 2, 3]
    assert owner.index_of(paddle.ones([1])) is None
    assert [id(l) for l in owner.owning_layers] == [id(model.second), id(model.first)]
    assert owner.units == [] and owner.units_of_layer(model.first) == ()
    first_step(model, owner, comm)
    first = [model.first.weight, model.first.bias]
    assert [[id(p) for p in u.params] for u in owner.units_of_layer(model.first)] == [
        [id(p)] for p in first
    ]
    assert owner.units_of_layer(model) == ()  # the root owns no parameter
    assert set(owner.stats) == set(
        "launched waited_in_forward waited_in_program waited_before_update "
        "waited_unreachable waited_on_read waited_on_demand "
        "waited_by_other_owner waited_for_hybrid_sync waited_out_of_order "
        "rebound".split()
    )
    assert owner.stats["launched"] == 4


def test_old_names_stay_importable_and_are_the_new_ones():
    assert broadcast_overlap.StageOneBroadcastOverlap is pso.ParamSyncOverlap
    assert broadcast_overlap.BroadcastOverlapState is pso.ParamSyncState
    assert broadcast_overlap.get_broadcast_overlap is pso.get_param_sync_overlap
    model = Net()
    owner = broadcast_overlap.StageOneBroadcastOverlap(
        **owner_args(model), comm=RecordingComm(names_of(model))
    )
    assert owner.state is broadcast_overlap.BroadcastOverlapState.RECORDING


@pytest.mark.parametrize(
    "get", [pso.get_param_sync_overlap, broadcast_overlap.get_broadcast_overlap]
)
def test_get_param_sync_overlap_follows_inner_optimizers(get):
    class Opt:
        pass

    inner, outer = Opt(), Opt()
    outer._inner_opt = inner
    assert get(outer) is None
    vars(inner)["_param_sync_overlap"] = "owner"
    assert get(outer) == "owner"
    vars(outer)["_param_sync_overlap"] = "outer's"
    assert get(outer) == "outer's"


@pytest.mark.parametrize("bucket_size_mb", [0, 1])
def test_parameter_no_layer_owns_is_named_then_waited_at_launch(bucket_size_mb):
    model = Net()
    stray = paddle.create_parameter([2], "float32")
    params = list(model.parameters()) + [stray]
    n = len(params)
    if bucket_size_mb:
        planner = unit_plan.Buckets([0] * n, bucket_size_mb << 20)
    else:
        planner = unit_plan.PerParameter([0] * n)
    comm = RecordingComm({**names_of(model), id(stray): "stray"})
    with pytest.warns(UserWarning) as caught:
        owner, _ = make_owner(model, params=params, planner=planner, comm=comm)
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(f"parameter sync overlap ({V1}): 1 optimizer")
    assert stray.name in message and "after their broadcast is launched" in message
    events = first_step(model, owner, comm)
    assert events[-2:] == [("broadcast", "stray", 0), ("wait", "stray")]
    assert owner.stats["waited_unreachable"] == 1


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
        monkeypatch.setattr(pso.ParamSyncOverlap, "_on_forward_pre", lambda *a: None)
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
