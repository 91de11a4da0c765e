"""HybridParallelOptimizer's overlap methods: delegation to the wrapped sharding
optimizer, and the refusals that name what to set (one process, no ranks)."""

import types

import pytest

from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    dygraph_sharding_optimizer as sharding_overlay,
)
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelOptimizer,
)


def fake(cls, calls):
    """An instance of ``cls`` (V1, V2 or a plain class) built without Paddle's
    constructor, whose overlay methods record their calls."""
    inner = cls.__new__(cls)
    inner._set_broadcast_overlap = lambda *a, **k: calls.append(("broadcast", a, k))
    inner._set_all_gather_overlap_forward = lambda *a, **k: calls.append(("all_gather", a, k))
    return inner


def hybrid(inner):
    opt = HybridParallelOptimizer.__new__(HybridParallelOptimizer)
    opt._inner_opt = inner
    return opt


def test_each_method_reaches_its_kind_with_every_argument():
    calls = []
    opt = hybrid(fake(DygraphShardingOptimizer, calls))
    HybridParallelOptimizer._set_broadcast_overlap(opt, True, "model", strict=True, bucket_size_mb=0)
    assert calls == [("broadcast", (True, "model"), dict(strict=True, bucket_size_mb=0))]
    calls.clear()
    opt = hybrid(fake(DygraphShardingOptimizerV2, calls))
    HybridParallelOptimizer._set_all_gather_overlap_forward(opt, True, "model")
    assert calls == [("all_gather", (True, "model"), dict(strict=None))]
    HybridParallelOptimizer._set_all_gather_overlap_forward(opt, False)
    # no flag of its own: the wrapped optimizer's owner is the one state (issue 34: no write-only flag)
    assert not {"_broadcast_overlap", "_all_gather_overlap_forward", "_layers"} & set(vars(opt))


@pytest.mark.parametrize(
    "inner_cls, method, expected",
    [
        (DygraphShardingOptimizer, "_set_all_gather_overlap_forward",
         "needs sharding stage 1 V2: set strategy.hybrid_configs['sharding_degree'] >= 2 and "
         "sharding_configs.split_param = True; the wrapped optimizer is a DygraphShardingOptimizer: "
         "use _set_broadcast_overlap(True, layers=model)."),
        (object, "_set_broadcast_overlap",
         "needs sharding stage 1 V1: set strategy.hybrid_configs['sharding_degree'] >= 2 and "
         "sharding_configs.split_param = False; the wrapped optimizer is a object."),
    ],
)
def test_turning_on_around_another_kind_is_refused_by_name(inner_cls, method, expected):
    calls = []
    inner = inner_cls() if inner_cls is object else fake(inner_cls, calls)
    opt = hybrid(inner)
    with pytest.raises(ValueError) as error:
        getattr(HybridParallelOptimizer, method)(opt, True, "model")
    assert str(error.value) == method + " " + expected
    assert calls == [] and not hasattr(opt, "_layers")
    getattr(HybridParallelOptimizer, method)(opt, False)  # off: a no-op


def test_v1_method_around_v2_names_the_setting():
    inner = DygraphShardingOptimizerV2.__new__(DygraphShardingOptimizerV2)
    inner._set_broadcast_overlap = types.MethodType(
        sharding_overlay.DygraphShardingOptimizerV2._set_broadcast_overlap, inner)
    with pytest.raises(ValueError, match=r"split_param = False; the wrapped optimizer is a DygraphShardingOptimizerV2\.$"):
        HybridParallelOptimizer._set_broadcast_overlap(hybrid(inner), True, "model")


@pytest.mark.parametrize(
    "owner, method, argument",
    [
        (HybridParallelOptimizer, "_set_broadcast_overlap", "broadcast_overlap"),
        (HybridParallelOptimizer, "_set_all_gather_overlap_forward", "all_gather_overlap_forward"),
        (sharding_overlay.DygraphShardingOptimizer, "_set_broadcast_overlap", "broadcast_overlap"),
        (sharding_overlay.DygraphShardingOptimizerV2, "_set_all_gather_overlap_forward", "all_gather_overlap_forward"),
        (sharding_overlay.DygraphShardingOptimizerV2, "_set_broadcast_overlap", "broadcast_overlap"),
    ],
)
def test_flag_must_be_a_bool_named_with_its_method(owner, method, argument):
    import numpy as np

    for flag in (1, np.bool_(True), "True"):
        with pytest.raises(TypeError) as error:
            getattr(owner, method)(hybrid(object()), flag, "model")
        assert str(error.value).startswith(f"{method}: {argument} must be a Python bool, got {flag!r} of type ")


@pytest.mark.parametrize(
    "call",
    [
        lambda: HybridParallelOptimizer._set_broadcast_overlap(hybrid(object()), True, "m", max_in_flight=2),
        lambda: HybridParallelOptimizer._set_all_gather_overlap_forward(hybrid(object()), True, "m", max_in_flight=2),
        lambda: sharding_overlay.DygraphShardingOptimizer._set_broadcast_overlap(object(), True, "m", max_in_flight=2),
    ],
    ids=["hybrid V1", "hybrid V2", "sharding V1"],
)
def test_the_removed_launch_depth_argument_is_refused(call):
    with pytest.raises(TypeError, match="max_in_flight"):
        call()


@pytest.mark.parametrize(
    "cls, method, expected",
    [
        (DygraphShardingOptimizer, "_set_broadcast_overlap",
         "broadcast overlap needs sharding stage 1 with sharding_degree >= 2; this optimizer's sharding "
         "degree is 1. Set strategy.hybrid_configs['sharding_degree'] to the number of sharding ranks."),
        (DygraphShardingOptimizerV2, "_set_all_gather_overlap_forward",
         "the all-gather overlap needs sharding stage 1 with sharding_degree >= 2; this optimizer's "
         "sharding degree is 1."),
    ],
)
def test_sharding_degree_1_is_refused_before_anything_changes(cls, method, expected):
    """Data parallel only (hybrid_configs sharding_degree 1): the sharding optimizer refuses
    turning the overlap on, with no hook registered and no owner made."""
    import paddle

    opt = cls.__new__(cls)
    opt._sharding_world_size = 1
    model = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.Linear(2, 2))
    with pytest.raises(ValueError) as error:
        getattr(getattr(sharding_overlay, cls.__name__), method)(opt, True, layers=model)
    assert str(error.value) == expected
    assert sum(len(layer._forward_pre_hooks) for layer in model.sublayers(include_self=True)) == 0
    assert vars(opt) == {"_sharding_world_size": 1}
