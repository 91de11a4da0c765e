"""The lost-overlap warning: at the first root forward after a launch, if
reads (not hooks) already waited more than half of the units that launch
started, the owner says so once, naming the first read's path and line."""

import inspect
import warnings

import paddle
import pytest
from owner_fakes import (
    V1,
    Net,
    X,
    first_step,
    make_bucket_owner,
    next_step,
)


def lost_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "did not overlap" in str(w.message)]


def one_step_in(bucket_size_mb=0):
    model = Net()
    owner, comm = make_bucket_owner(model, bucket_size_mb)
    first_step(model, owner, comm)
    return model, owner, comm


def grad_norm_loop(model):
    """The user's logging between step() and the next forward; returns the
    line of the read."""
    total = 0.0
    line = inspect.currentframe().f_lineno + 1
    for p in model.parameters():
        total += float((p * p).sum())
    return line


def double(x):
    return x * 2


def compiled_call(model):
    compiled = paddle.jit.to_static(double, full_graph=True)
    line = inspect.currentframe().f_lineno + 1
    compiled(X)
    return line


@pytest.mark.parametrize("bucket_size_mb, units", [(0, 4), (1, 1)], ids=["per parameter", "buckets"])
@pytest.mark.parametrize(
    "read, path",
    [(grad_norm_loop, "iteration"), (compiled_call, "compiled program")],
    ids=["grad-norm loop", "compiled program"],
)
def test_reads_before_the_forward_warn_once_naming_the_path_and_line(read, path, bucket_size_mb, units):
    model, owner, comm = one_step_in(bucket_size_mb)
    line = read(model)
    (message,) = lost_warnings(lambda: model(X))
    assert message.startswith(
        f"parameter sync overlap ({V1}): {units} of the {units} broadcasts launched "
        f"by the last step() were waited by reads before this forward (first: {path} at "
        f"{__file__}:{line}), so they did not overlap the forward."
    )
    assert "read the parameters after the forward" in message
    for _ in range(2):  # once per owner
        next_step(owner, comm)
        read(model)
        assert lost_warnings(lambda: model(X)) == []


@pytest.mark.parametrize("reads, warns", [(2, False), (3, True)])
def test_more_than_half_of_the_units_read_is_the_threshold(reads, warns):
    model, owner, comm = one_step_in()
    for layer, name in [(model.first, "weight"), (model.first, "bias"), (model.second, "weight")][:reads]:
        getattr(layer, name)
    assert len(lost_warnings(lambda: model(X))) == int(warns)
    assert owner.stats["waited_on_read"] == reads


def eval_forward(model):
    with paddle.no_grad():
        model(X)


def helper_calling_a_sublayer(model):
    model.first(X)
    model.second(X[:, :3])


@pytest.mark.parametrize("between", [eval_forward, helper_calling_a_sublayer])
def test_hook_waits_between_steps_never_warn(between):
    model, owner, comm = one_step_in()
    warned = lost_warnings(lambda: (between(model), model(X)))
    assert warned == []
    assert owner.stats["waited_in_forward"] == 4 and owner.stats["waited_on_read"] == 0


def test_final_state_dict_with_no_forward_after_it_never_warns():
    model, owner, comm = one_step_in()

    def checkpoint_and_stop():
        model.state_dict()  # the last step's checkpoint
        owner.close()

    assert lost_warnings(checkpoint_and_stop) == []
    assert owner.stats["waited_on_read"] == 4


def test_state_dict_then_the_next_step_never_warns():
    model, owner, comm = one_step_in()

    def checkpoint_then_train():
        model.state_dict()  # every N steps, then step() launches again
        next_step(owner, comm)
        model(X)

    assert lost_warnings(checkpoint_then_train) == []
    assert owner.stats["waited_on_read"] == 4
