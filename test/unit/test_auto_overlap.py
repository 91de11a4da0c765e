"""PADDLE_OVERLAY=overlap (paddle_overlay/auto_overlap.py) in one process: the setting's parsing,
apply()/remove() installing and taking off its patches, and its decisions on fake optimizers and
wrapped models (the real optimizers on real ranks: test/collective/fleet's
test_dygraph_sharding_stage1_auto_overlap)."""

import contextlib
import copy
import gc
import io
import os
from unittest import mock

import paddle
import pytest

import paddle_overlay
from paddle_overlay import _startup, auto_overlap
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)
from paddle.distributed.fleet.meta_parallel.meta_parallel_base import MetaParallelBase

pytestmark = pytest.mark.overlay_off  # the tests apply and remove the overlay themselves
CLASSES = (DygraphShardingOptimizer, DygraphShardingOptimizerV2, MetaParallelBase)
PREFIX = "paddle_overlay: rank 0: "


@pytest.fixture(autouse=True)
def clean():
    auto_overlap.forget()
    # fleet is not initialized in this process: no strategy (the note's cases give one)
    with mock.patch.object(auto_overlap, "_strategy", return_value=None):
        yield
    paddle_overlay.remove()
    auto_overlap.forget()


# ----------------------------------------------------------------------
# the setting
@pytest.mark.parametrize("value", ["overlap", " Overlap ", "OVERLAP"])
def test_overlap_value_applies_and_turns_the_overlap_on(value):
    assert _startup.mode(value) == "overlap"
    assert _startup.parse(value) is True


@pytest.mark.parametrize("value", ["1", "true", "yes", "on"])
def test_on_values_keep_meaning_apply_only(value):
    assert _startup.mode(value) == "apply"


@pytest.mark.parametrize("value", ["overlaps", "auto", "1 overlap", "overlap=1"])
def test_near_misses_are_refused_naming_the_accepted_values(value):
    with pytest.raises(ValueError) as raised:
        _startup.mode(value)
    message = str(raised.value)
    assert f"PADDLE_OVERLAY={value!r} is not understood" in message
    assert "PADDLE_OVERLAY=overlap to apply it and also turn the parameter-sync overlap on" in message
    assert "Accepted: 1, true, yes, on / overlap / 0, false, no, off." in message


def snapshot():
    return {cls: dict(vars(cls)) for cls in CLASSES}


def apply_with(value):
    """apply() with PADDLE_OVERLAY=value; returns what it printed."""
    err = io.StringIO()
    with mock.patch.dict(os.environ, {"PADDLE_OVERLAY": value, "PADDLE_TRAINER_ID": "0"}):
        with contextlib.redirect_stderr(err):
            paddle_overlay.apply()
    return err.getvalue()


def test_apply_installs_the_patches_and_remove_restores_the_exact_attributes():
    before = snapshot()
    said = apply_with("overlap")
    assert said == (
        f"paddle_overlay: applied to Paddle {paddle.__version__} (rank 0); PADDLE_OVERLAY=overlap: the "
        "parameter-sync overlap of every sharding stage 1 optimizer is turned on with its wrapped model "
        "(one line per optimizer)\n"
    )
    for cls in CLASSES:
        assert vars(cls)["__init__"] is not before[cls]["__init__"], cls
        assert vars(cls)["__init__"].__wrapped__ is before[cls]["__init__"], cls
    # the explicit-call wrapper wraps the overlay's switch (its name and docstring kept)
    switch = vars(DygraphShardingOptimizer)["_set_broadcast_overlap"]
    assert switch.__wrapped__ is auto_overlap.KINDS["V1"].switch
    assert switch.__doc__ == auto_overlap.KINDS["V1"].switch.__doc__
    # step() checks first, then runs the overlay's edit of Paddle's step
    assert vars(DygraphShardingOptimizer)["step"].__wrapped__.__qualname__ == "DygraphShardingOptimizer.step"
    paddle_overlay.remove()
    after = snapshot()
    for cls in CLASSES:
        assert after[cls].keys() == before[cls].keys(), cls
        assert all(after[cls][k] is v for k, v in before[cls].items()), cls


def test_apply_only_leaves_the_classes_alone():
    before = snapshot()
    said = apply_with("1")
    assert said == f"paddle_overlay: applied to Paddle {paddle.__version__} (rank 0)\n"
    assert vars(MetaParallelBase)["__init__"] is before[MetaParallelBase]["__init__"]
    assert vars(DygraphShardingOptimizer)["__init__"] is before[DygraphShardingOptimizer]["__init__"]


def test_bad_value_is_refused_before_anything_is_patched():
    before = snapshot()
    with pytest.raises(ValueError, match="PADDLE_OVERLAY='overlapp' is not understood"):
        apply_with("overlapp")
    assert not paddle_overlay.is_applied()
    assert snapshot() == before


def test_missing_wrapper_class_is_refused_before_anything_is_patched():
    before = snapshot()
    missing = (None, "paddle.distributed.fleet.meta_parallel.meta_parallel_base.MetaParallelBase is missing")
    with mock.patch.object(auto_overlap, "paddle_class", return_value=missing):
        with pytest.raises(paddle_overlay.PaddleInternalsChanged, match="MetaParallelBase is missing"):
            apply_with("overlap")
    assert not paddle_overlay.is_applied()
    assert snapshot() == before


# ----------------------------------------------------------------------
# decisions, on fakes
class FakeWrapper(paddle.nn.Layer):
    """A wrapped model: ``_layers`` as MetaParallelBase keeps it."""

    def __init__(self, layers):
        super().__init__()
        self._layers = layers


class FakeOptimizer:
    """A sharding stage 1 optimizer: its parameter list, and the overlap owner (if any) where
    get_param_sync_overlap finds it."""

    def __init__(self, params):
        self._origin_parameter_list = list(params)
        self._param_sync_overlap = None


class Switch:
    """The optimizer's switch: records each call; raises ``error`` if set."""

    def __init__(self, error=None):
        self.calls, self.error = [], error

    def __call__(self, optimizer, flag, layers=None, **kwargs):
        if self.error is not None:
            raise self.error
        self.calls.append((optimizer, flag, layers))
        optimizer._param_sync_overlap = object() if flag else None


@pytest.fixture
def v1():
    kind = copy.copy(auto_overlap.KINDS["V1"])
    kind.switch = Switch()
    return kind


def said(block):
    """Run ``block()``; the lines it printed."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        block()
    return err.getvalue().splitlines()


def label(serial, count):
    return f"{PREFIX}FakeOptimizer #{serial} (V1, {count} parameters): "


ON = (
    "broadcast overlap on with FakeWrapper(Linear), turned on by PADDLE_OVERLAY=overlap as "
    "optimizer._set_broadcast_overlap(True, layers=model) (the trainer's own call of _set_broadcast_overlap "
    "replaces it)."
)


def test_optimizer_first_then_its_model(v1):
    net = paddle.nn.Linear(2, 2)
    opt = FakeOptimizer(net.parameters())
    assert said(lambda: auto_overlap.optimizer_built(opt, v1)) == []
    assert v1.switch.calls == []
    model = FakeWrapper(net)
    assert said(lambda: auto_overlap.wrapper_built(model)) == [label(1, 2) + ON]
    assert v1.switch.calls == [(opt, True, model)]
    # decided: neither the next update nor another model changes it
    assert said(lambda: auto_overlap.before_update(opt)) == []
    another = FakeWrapper(net)  # (kept: the registry holds models weakly)
    assert said(lambda: auto_overlap.wrapper_built(another)) == []
    assert len(v1.switch.calls) == 1


def test_model_first_then_its_optimizer(v1):
    net = paddle.nn.Linear(2, 2)
    model = FakeWrapper(net)
    auto_overlap.wrapper_built(model)
    opt = FakeOptimizer(net.parameters())
    assert said(lambda: auto_overlap.optimizer_built(opt, v1)) == [label(1, 2) + ON]
    assert v1.switch.calls == [(opt, True, model)]


def test_two_models_holding_the_parameters_are_not_chosen_between(v1):
    net = paddle.nn.Linear(2, 2)
    models = [FakeWrapper(net), FakeWrapper(net)]  # (kept: the registry holds them weakly)
    for model in models:
        auto_overlap.wrapper_built(model)
    opt = FakeOptimizer(net.parameters())
    assert said(lambda: auto_overlap.optimizer_built(opt, v1)) == [
        label(1, 2) + "no broadcast overlap, training without it: 2 wrapped models hold all of its parameters "
        "(FakeWrapper(Linear), FakeWrapper(Linear)), so PADDLE_OVERLAY=overlap does not choose; call "
        "optimizer._set_broadcast_overlap(True, layers=model) with the one that trains."
    ]
    assert v1.switch.calls == []


def test_a_model_wrapped_in_another_is_not_chosen(v1):
    net = paddle.nn.Linear(2, 2)
    inner = FakeWrapper(net)  # ERNIEKit's TensorParallel(model), then fleet.distributed_model of it
    outer = FakeWrapper(inner)
    auto_overlap.wrapper_built(inner)
    auto_overlap.wrapper_built(outer)
    opt = FakeOptimizer(net.parameters())
    assert said(lambda: auto_overlap.optimizer_built(opt, v1)) == [
        label(1, 2) + ON.replace("FakeWrapper(Linear)", "FakeWrapper(FakeWrapper)")
    ]
    assert v1.switch.calls == [(opt, True, outer)]


def test_no_model_holds_them_all_by_the_first_update(v1):
    net, head = paddle.nn.Linear(2, 2), paddle.nn.Linear(2, 2)
    model = FakeWrapper(net)  # holds 2 of the 4
    auto_overlap.wrapper_built(model)
    opt = FakeOptimizer(net.parameters() + head.parameters())
    auto_overlap.optimizer_built(opt, v1)
    assert said(lambda: auto_overlap.before_update(opt)) == [
        label(1, 4) + "no broadcast overlap, training without it: no wrapped model (fleet.distributed_model's "
        "result or a PipelineParallel) holds all of its 4 parameters at its first update; the closest, "
        "FakeWrapper(Linear), holds 2. Call optimizer._set_broadcast_overlap(True, layers=model) yourself, "
        "with the model whose forward uses them."
    ]
    # decided at the first update: a model built later does not turn it on
    whole = FakeWrapper(paddle.nn.Sequential(net, head))
    assert said(lambda: auto_overlap.wrapper_built(whole)) == []
    assert said(lambda: auto_overlap.before_update(opt)) == []
    assert v1.switch.calls == []


def test_refusal_of_the_switch_is_said_and_training_goes_on(v1):
    v1.switch.error = ValueError("the all-gather overlap is not tested with sharding_configs.release_gradients")
    net = paddle.nn.Linear(2, 2)
    model = FakeWrapper(net)
    auto_overlap.wrapper_built(model)
    opt = FakeOptimizer(net.parameters())
    assert said(lambda: auto_overlap.optimizer_built(opt, v1)) == [
        label(1, 2) + "no broadcast overlap, training without it: _set_broadcast_overlap refuses this "
        "configuration: the all-gather overlap is not tested with sharding_configs.release_gradients"
    ]
    assert said(lambda: auto_overlap.before_update(opt)) == []


def test_an_error_that_is_not_a_refusal_is_not_hidden(v1):
    v1.switch.error = TypeError("a bug")
    net = paddle.nn.Linear(2, 2)
    model = FakeWrapper(net)
    auto_overlap.wrapper_built(model)
    with pytest.raises(TypeError, match="a bug"):
        auto_overlap.optimizer_built(FakeOptimizer(net.parameters()), v1)


def test_explicit_off_before_the_model_stays_off(v1):
    net = paddle.nn.Linear(2, 2)
    opt = FakeOptimizer(net.parameters())
    auto_overlap.optimizer_built(opt, v1)
    explicit = auto_overlap._explicit(Switch(), "_set_broadcast_overlap")
    assert said(lambda: explicit(opt, False)) == [
        label(1, 2) + "the trainer's own _set_broadcast_overlap call turned the broadcast overlap off; "
        "PADDLE_OVERLAY=overlap leaves this optimizer to the trainer."
    ]
    assert said(lambda: explicit(opt, False)) == []  # said once
    model = FakeWrapper(net)
    assert said(lambda: auto_overlap.wrapper_built(model)) == []
    assert said(lambda: auto_overlap.before_update(opt)) == []
    assert v1.switch.calls == [] and opt._param_sync_overlap is None


def test_explicit_on_after_the_setting_is_said(v1):
    net = paddle.nn.Linear(2, 2)
    model = FakeWrapper(net)
    auto_overlap.wrapper_built(model)
    opt = FakeOptimizer(net.parameters())
    auto_overlap.optimizer_built(opt, v1)
    explicit = auto_overlap._explicit(Switch(), "_set_broadcast_overlap")
    assert said(lambda: explicit(opt, True, layers=net)) == [
        label(1, 2) + "the trainer's own _set_broadcast_overlap call turned the broadcast overlap on; "
        "PADDLE_OVERLAY=overlap leaves this optimizer to the trainer."
    ]


def test_explicit_call_that_raises_changes_nothing(v1):
    net = paddle.nn.Linear(2, 2)
    opt = FakeOptimizer(net.parameters())
    auto_overlap.optimizer_built(opt, v1)
    explicit = auto_overlap._explicit(Switch(ValueError("refused")), "_set_broadcast_overlap")
    with pytest.raises(ValueError, match="refused"):
        explicit(opt, True, layers=net)
    # still undecided: the model, once wrapped, turns it on
    model = FakeWrapper(net)
    assert said(lambda: auto_overlap.wrapper_built(model)) == [label(1, 2) + ON]
    assert v1.switch.calls == [(opt, True, model)]


def test_optimizers_built_before_the_overlay_are_left_alone():
    opt = FakeOptimizer(paddle.nn.Linear(2, 2).parameters())
    explicit = auto_overlap._explicit(Switch(), "_set_broadcast_overlap")
    assert said(lambda: explicit(opt, False)) == []
    assert said(lambda: auto_overlap.before_update(opt)) == []


def test_the_registry_keeps_nothing_alive(v1):
    net = paddle.nn.Linear(2, 2)
    opt = FakeOptimizer(net.parameters())
    auto_overlap.optimizer_built(opt, v1)
    model = FakeWrapper(paddle.nn.Linear(2, 2))
    auto_overlap.wrapper_built(model)
    del opt, model
    gc.collect()
    assert auto_overlap._live(auto_overlap._state.undecided) == []
    assert auto_overlap._live(auto_overlap._state.wrappers) == []


class Section:
    def __init__(self, **fields):
        vars(self).update(fields)


class Strategy:
    def __init__(self, comm_overlap=False, sharding_comm_overlap=False):
        self.hybrid_configs = {
            "sharding_configs": Section(comm_overlap=comm_overlap),
            "pp_configs": Section(sharding_comm_overlap=sharding_comm_overlap),
        }


def test_gradient_overlap_note():
    assert auto_overlap.gradient_overlap_note(None) == ""
    assert auto_overlap.gradient_overlap_note(Strategy()) == ""
    assert auto_overlap.gradient_overlap_note(Strategy(comm_overlap=True)) == (
        " Note: sharding_configs.comm_overlap is on: that is the gradient overlap (the reduce of gradients "
        "during backward; PaddleFormers --stage1_overlap, PaddleNLP --sharding_parallel_config "
        "enable_stage1_overlap), not this parameter sync."
    )
    both = auto_overlap.gradient_overlap_note(Strategy(True, True))
    assert both.startswith(" Note: sharding_configs.comm_overlap and pp_configs.sharding_comm_overlap are on:")


def test_the_note_ends_a_line_without_overlap_only(v1):
    net = paddle.nn.Linear(2, 2)
    opt = FakeOptimizer(net.parameters())
    auto_overlap.optimizer_built(opt, v1)
    with mock.patch.object(auto_overlap, "_strategy", return_value=Strategy(comm_overlap=True)):
        lines = said(lambda: auto_overlap.before_update(opt))
        assert lines[0].endswith("not this parameter sync.")
        other = FakeOptimizer(net.parameters())
        auto_overlap.optimizer_built(other, v1)
        model = FakeWrapper(net)
        assert said(lambda: auto_overlap.wrapper_built(model)) == [label(2, 2) + ON]
