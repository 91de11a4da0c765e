"""The lost-overlap warning (``paddle_overlay.overlap_monitor``): a step
whose units were mostly waited by reads before the next training forward
lost its overlap; the owner's warning comes once, when at least
LOST_STEPS of the last WINDOW decided steps lost it, naming the first
read's path, the user's line and, where the read ran in an installed
package, that package's line. ``paddle_overlay.overlap_report`` gives the
overlap a run got."""

import inspect
import os
import sys
import warnings

import paddle
import pytest
from owner_fakes import V1, Net, X, first_step, make_bucket_owner, next_step

import paddle_overlay
from paddle_overlay import overlap_monitor

FAKE_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_site")


@pytest.fixture
def fake_trainer(monkeypatch):
    """``fake_trainer`` imported from a folder counted as installed."""
    installed = overlap_monitor._installed_dirs() + (FAKE_SITE + os.sep,)
    monkeypatch.setattr(overlap_monitor, "_installed_dirs", lambda: installed)
    monkeypatch.syspath_prepend(FAKE_SITE)
    import fake_trainer

    yield fake_trainer
    sys.modules.pop("fake_trainer", None)


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


def steps_with(model, owner, comm, read, steps):
    """``steps`` steps, each followed by ``read(model)`` (None: no read)
    and a training forward; returns the lines ``read`` returned."""
    lines = []
    for _ in range(steps):
        if read is not None:
            lines.append(read(model))
        model(X)
        next_step(owner, comm)
    return lines


@pytest.mark.parametrize("bucket_size_mb, units", [(0, 4), (1, 1)], ids=["per parameter", "buckets"])
@pytest.mark.parametrize(
    "read, path",
    [(grad_norm_loop, "iteration"), (compiled_call, "compiled program")],
    ids=["grad-norm loop", "compiled program"],
)
def test_reads_after_every_step_warn_once_at_the_fourth_naming_the_line(read, path, bucket_size_mb, units):
    model, owner, comm = one_step_in(bucket_size_mb)
    assert lost_warnings(lambda: steps_with(model, owner, comm, read, 3)) == []
    messages, lines = [], []
    messages = lost_warnings(lambda: lines.extend(steps_with(model, owner, comm, read, 1)))
    (message,) = messages
    assert message.startswith(
        f"parameter sync overlap ({V1}): in 4 of the last 4 steps most of the broadcasts "
        f"launched by step() were waited by reads before the next forward (latest: {units} "
        f"of {units}; first read: {path} at {__file__}:{lines[0]}), so they did not overlap it."
    )
    assert "paddle_overlay.overlap_report(optimizer)" in message
    assert lost_warnings(lambda: steps_with(model, owner, comm, read, 8)) == []  # once per owner
    assert overlap_monitor.MONITOR.history(owner) == [True] * overlap_monitor.WINDOW


@pytest.mark.parametrize("every, warns", [(2, True), (3, False)])
def test_the_threshold_is_half_of_the_last_eight_steps(every, warns):
    """Every 2nd step lost: 4 of the last 8 at the 8th step (warns); every
    3rd: at most 3 of any 8 (never, however long it runs)."""
    model, owner, comm = one_step_in()
    done = []

    def run():
        for step in range(1, 25):
            if step % every == 0:
                grad_norm_loop(model)
            model(X)
            next_step(owner, comm)
            done.append(step)

    assert len(lost_warnings(run)) == int(warns)
    history = overlap_monitor.MONITOR.history(owner)
    assert len(history) == 8 and sum(history) == (4 if every == 2 else 2 + (24 % 3 == 0))


@pytest.mark.parametrize("reads, lost", [(2, False), (3, True)])
def test_a_step_is_lost_when_reads_waited_more_than_half_of_its_units(reads, lost):
    model, owner, comm = one_step_in()
    for layer, name in [(model.first, "weight"), (model.first, "bias"), (model.second, "weight")][:reads]:
        getattr(layer, name)
    model(X)
    assert overlap_monitor.MONITOR.history(owner) == [lost]
    assert owner.stats["waited_on_read"] == reads


def test_periodic_checkpoint_of_an_installed_trainer_never_warns(fake_trainer):
    model, owner, comm = one_step_in()

    def run():
        fake_trainer.train(model, owner, comm, 24, 4, lambda: next_step(owner, comm), lambda: model(X))

    assert lost_warnings(run) == []
    report = paddle_overlay.overlap_report(_Optimizer(owner))
    assert report.steps_decided == 8 and report.steps_lost == 2, report
    assert report.read_paths == {"iteration": 6 * 4}, report


def test_every_step_checkpoint_of_an_installed_trainer_names_its_line_and_the_callers(fake_trainer):
    model, owner, comm = one_step_in()
    caller = inspect.currentframe().f_lineno + 2
    messages = lost_warnings(
        lambda: fake_trainer.train(model, owner, comm, 5, 1, lambda: next_step(owner, comm), lambda: model(X))
    )
    (message,) = messages
    package = os.path.join(FAKE_SITE, "fake_trainer", "__init__.py")
    saving = _line_of(package, "return {name: param.numpy()")
    assert f"first read: iteration by an installed package at {package}:{saving}, called from " in message
    assert f"{__file__}:{caller}" in message, message


def _line_of(path, text):
    with open(path) as f:
        return next(n for n, line in enumerate(f, 1) if text in line)


def eval_forward(model):
    with paddle.no_grad():
        model(X)


def helper_calling_a_sublayer(model):
    model.first(X)
    model.second(X[:, :3])


@pytest.mark.parametrize("between", [eval_forward, helper_calling_a_sublayer])
def test_hook_waits_between_steps_never_lose_a_step(between):
    model, owner, comm = one_step_in()
    warned = lost_warnings(lambda: steps_with(model, owner, comm, between, 8))
    assert warned == [] and not any(overlap_monitor.MONITOR.history(owner))
    assert owner.stats["waited_on_read"] == 0


def test_final_state_dict_with_no_forward_after_it_is_not_decided():
    model, owner, comm = one_step_in()

    def checkpoint_and_stop():
        model.state_dict()  # the last step's checkpoint
        owner.close()

    assert lost_warnings(checkpoint_and_stop) == []
    assert owner.stats["waited_on_read"] == 4
    assert overlap_monitor.MONITOR.history(owner) == []


class _Optimizer:
    """An optimizer-like holder of ``owner`` (the report walks _inner_opt)."""

    def __init__(self, owner):
        vars(self)["_param_sync_overlap"] = owner


def test_report_counts_who_waited_first():
    model, owner, comm = one_step_in()
    model.first.weight  # noqa: B018 (a read)
    model(X)
    report = paddle_overlay.overlap_report(_Optimizer(owner))
    assert report.collective == "broadcast" and report.launched == 4 and report.pending == 0
    assert report.waited["on_read"] == 1 and report.waited["in_forward"] == 3
    assert report.overlapped == 0.75 and report.read_paths == {"attribute": 1}


def test_report_without_an_overlap_says_how_to_turn_it_on():
    with pytest.raises(ValueError, match="no parameter sync overlap on.*_set_broadcast_overlap"):
        paddle_overlay.overlap_report(object())
