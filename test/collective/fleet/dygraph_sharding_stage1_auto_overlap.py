# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: ``PADDLE_OVERLAY=overlap`` on training code that never calls the overlap's switch
(``paddle_overlay/auto_overlap.py``; overlay only, never in the patches).

Launched with ``PADDLE_OVERLAY=overlap`` (the driver: ``test_dygraph_sharding_stage1_auto_overlap.py``). Each case
runs its training twice in this process, from the same weights and data: first with the overlay as
``PADDLE_OVERLAY=1`` applies it (``paddle_overlay.remove()``, then ``apply()`` without the setting: nothing turns the
overlap on; the baseline, which asserts that no overlap owner exists and that nothing printed an overlap line), then
as ``PADDLE_OVERLAY=overlap`` applies it (``remove()``, ``apply()`` with the setting); the two runs' losses and final
parameters must be bitwise equal.

With the setting each case also checks, on each rank: the exact line printed for its optimizer; where the overlap is
on, the owner's switch, the agreed order equal to the order the first forward used the parameters, its units waited by
forward pre-hooks (``waited_in_forward`` > 0, none out of order; a lost-overlap warning fails the case) and the wait
checker's verdict (no read of a pending sync, every sync started inside ``step()``); where it is off, that no owner
exists.

Env ``AUTO_OVERLAP_TOPOLOGY``: ``sharding2`` (2 ranks; default) or ``pp2_sharding2`` (4 ranks)."""

import contextlib
import io
import itertools
import os
import sys
import unittest.mock

import hybrid_parallel_cpu_shim
import numpy as np
import paddle_overlay
import sharding_cases as cases
from param_sync_checker import ParamSyncWaitChecker

import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import HybridParallelOptimizer

AUTO = False  # whether the overlay is applied with PADDLE_OVERLAY=overlap's setting now (applied_as)
PIPELINE = os.environ.get("AUTO_OVERLAP_TOPOLOGY", "sharding2") == "pp2_sharding2"
STEPS = 3
SETTING = "turned on by PADDLE_OVERLAY=overlap as"
V1 = ("V1", "broadcast", "_set_broadcast_overlap", "optimizer._set_broadcast_overlap(True, layers=model)")
V2 = ("V2", "all-gather", "_set_all_gather_overlap_forward", "optimizer._set_all_gather_overlap_forward(True, model)")
GRADIENT_NOTE = (
    " Note: sharding_configs.comm_overlap is on: that is the gradient overlap (the reduce of gradients "
    "during backward; PaddleFormers --stage1_overlap, PaddleNLP --sharding_parallel_config "
    "enable_stage1_overlap), not this parameter sync."
)
BUILT = itertools.count(1)  # sharding stage 1 optimizers built since the overlay was applied: the lines' "#n"
SERIAL = {}  # id(sharding optimizer) -> its "#n"


@contextlib.contextmanager
def applied_as(setting):
    """The overlay applied as ``PADDLE_OVERLAY=<setting>`` applies it at start-up (``1``: without auto_overlap,
    ``overlap``: with it): ``paddle_overlay.remove()``, then ``apply()`` with the variable set. The optimizers built
    under it count their "#n" from 1, as the product's lines do (``remove()`` forgets its records); those trained
    under it (the list it yields) have their overlap turned off at its end."""
    global AUTO, BUILT
    paddle_overlay.remove()
    with unittest.mock.patch.dict(os.environ, {"PADDLE_OVERLAY": setting}):
        paddle_overlay.apply()
    AUTO, BUILT = setting == "overlap", itertools.count(1)
    built = []  # the optimizers trained under it
    yield built
    for opt in built:  # remove() refuses while an overlap is on (a pipeline keeps its optimizer alive)
        if cases.overlap_impl(opt) is not None:
            if isinstance(cases.sharding_optimizer(opt), DygraphShardingOptimizerV2):
                opt._set_all_gather_overlap_forward(False)
            else:
                opt._set_broadcast_overlap(False)


# ----------------------------------------------------------------------
# what a case checks
class FirstUse:
    """The order in which the first forward of ``raw`` uses its parameters (pre-hooks on every layer owning parameters,
    registered before anything wraps it)."""

    def __init__(self, raw):
        self.layers = []
        self.handles = [
            layer.register_forward_pre_hook(self.hook)
            for layer in raw.sublayers(include_self=True)
            if layer.parameters(include_sublayers=False)
        ]

    def hook(self, layer, _inputs):
        if all(layer is not seen for seen in self.layers):
            self.layers.append(layer)

    def order(self, params):
        """Positions in ``params``: first use, then the unused ones in list order (the owner's rule)."""
        index = {id(p): i for i, p in enumerate(params)}
        used = {}
        for layer in self.layers:
            for p in layer.parameters(include_sublayers=False):
                if id(p) in index:
                    used.setdefault(index[id(p)])
        return list(used) + [i for i in range(len(params)) if i not in used]


def line(opt, kind, text):
    """The exact line auto_overlap prints for the sharding optimizer of ``opt``."""
    inner = cases.sharding_optimizer(opt)
    count = len(cases.optimizer_parameters(opt))
    name = f"{type(inner).__name__} #{SERIAL[id(inner)]}"
    return f"paddle_overlay: rank {cases.rank()}: {name} ({kind[0]}, {count} parameters): {text}"


def on_line(opt, kind, model):
    wrapper = f"{type(model).__name__}({type(model._sub_layers['_layers']).__name__})"
    replaced = f"(the trainer's own call of {kind[2]} replaces it)."
    return line(opt, kind, f"{kind[1]} overlap on with {wrapper}, {SETTING} {kind[3]} {replaced}")


class Case:
    """One training run: ``build()`` returns (raw layer, forward model, optimizer); ``expect(opt, model)`` returns the
    lines this rank must print (checked with ``overlap``); ``on``: the overlap is on then (owner checks) or off (no
    owner); ``baseline_on``: the trainer's own call turns it on under ``PADDLE_OVERLAY=1`` too."""

    def __init__(self, build, expect, on, train_step=None, baseline_on=False):
        self.build, self.expect, self.on = build, expect, on
        self.train_step = train_step or lm_step
        self.baseline_on = baseline_on

    def __call__(self):
        """The baseline, then the setting; bitwise-equal losses and final parameters."""
        with applied_as("1") as built:
            base = self.run(built)
        with applied_as("overlap") as built:
            on = self.run(built)
        cases.assert_bitwise_equal(base, on, "PADDLE_OVERLAY=1 vs PADDLE_OVERLAY=overlap")

    def run(self, built):
        """One training run with the overlay as it is applied now, its optimizer appended to ``built``; returns
        (losses, {parameter name: array}) as :func:`cases.assert_bitwise_equal` compares them."""
        printed = io.StringIO()
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stderr(Tee(printed)))
            checker = stack.enter_context(ParamSyncWaitChecker()) if AUTO and self.on else None
            raw, model, opt = self.build()
            SERIAL[id(cases.sharding_optimizer(opt))] = next(BUILT)
            built.append(opt)
            if checker is not None:
                checker.watch(model, opt)
            losses = [self.train_step(model, opt, step) for step in range(STEPS)]
            impl = cases.overlap_impl(opt)
            stats = None if impl is None else dict(impl.stats)  # before the final read waits
            params = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        lines = [l for l in printed.getvalue().splitlines() if l.startswith("paddle_overlay: rank")]
        results = losses, params
        if not AUTO:
            assert (impl is not None) == self.baseline_on and lines == [], (impl, lines)
            return results
        assert lines == self.expect(opt, model), f"\n{lines}\n!=\n{self.expect(opt, model)}"
        if not self.on:
            assert impl is None, impl
            return results
        assert impl.order == raw.first_use.order(cases.optimizer_parameters(opt)), impl.order
        # every unit of every step but the last waited by the forward pre-hook that needs it
        waited = sum(v for k, v in stats.items() if k.startswith("waited_") and k != "waited_out_of_order")
        assert stats["waited_in_forward"] == waited == stats["launched"] - len(impl.units) > 0, stats
        assert stats["waited_out_of_order"] == 0, stats
        assert checker.violations == [] and checker.outside_step == [], (checker.violations, checker.outside_step)
        assert checker.counts["launched"] > 0, checker.counts
        units = len(impl.units)
        print(f"rank {cases.rank()}: {lines}, stats {stats}, units {units}, checker {checker.counts}", flush=True)
        return results


class Tee(io.TextIOBase):
    """Writes to ``copy`` and to the real stderr."""

    def __init__(self, copy):
        self.copy, self.real = copy, sys.stderr

    def write(self, text):
        self.copy.write(text)
        return self.real.write(text)

    def flush(self):
        self.real.flush()


def lm_step(model, opt, step):
    loss = cases.lm_loss(model, step)
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss.numpy().copy()


def raw_model(build=cases.TinyLM):
    raw = cases.seeded(build)
    raw.first_use = FirstUse(raw)
    return raw


# ----------------------------------------------------------------------
# builds, as trainers write them (none calls the switch)
def script_model_first(build=cases.TinyLM):
    """The README's order: fleet.distributed_model, then fleet.distributed_optimizer."""
    raw = raw_model(build)
    model = fleet.distributed_model(raw)
    return raw, model, fleet.distributed_optimizer(cases.adamw(raw.parameters()))


def script_optimizer_first():
    """Paddle's own docs' order (and sharding_cases.train's): the optimizer first."""
    raw = raw_model()
    opt = fleet.distributed_optimizer(cases.adamw(raw.parameters()))
    return raw, fleet.distributed_model(raw), opt


def v2(build):
    """``build`` with sharding stage 1 V2 (split_param, 1 MB comm buffers) for its optimizer."""

    def built():
        with cases.sharding_v2():
            return build()

    return built


class DirectHybridOptimizer(HybridParallelOptimizer):
    """ERNIE 4.5's MoE pattern (ernie/moe/distributed/hybrid_parallel_optimizer.py): a HybridParallelOptimizer subclass
    built directly, whose __init__ builds the sharding optimizer itself and never calls
    HybridParallelOptimizer.__init__."""

    def __init__(self, optimizer, hcg, strategy):
        split = strategy.hybrid_configs["sharding_configs"].split_param
        optimizer = (DygraphShardingOptimizerV2 if split else DygraphShardingOptimizer)(optimizer, hcg)
        self._enable_timer, self._timers = False, None
        self._inner_opt, self._strategy, self._hcg = optimizer, strategy, hcg
        self._use_dp_mode = False
        self._need_dp = hcg.get_data_parallel_world_size() > 1
        self._dp_enable = self._need_dp
        self._sharding_enable = hcg.get_sharding_parallel_world_size() > 1
        self._sep_enable = hcg.get_sep_parallel_world_size() > 1
        self.processed_steps = 0


def direct_subclass():
    raw = raw_model(cases.WideLM)
    model = fleet.distributed_model(raw)
    hcg = fleet.get_hybrid_communicate_group()
    opt = DirectHybridOptimizer(cases.adamw(raw.parameters()), hcg, fleet.fleet._user_defined_strategy)
    return raw, model, opt


def wrap_model_style():
    """PaddleFormers' / ERNIEKit's Trainer._wrap_model for sharding stage 1 with amp_master_grad: MixPrecisionLayer,
    fleet.distributed_model, MixPrecisionOptimizer, fleet.distributed_optimizer, and no overlap switch."""
    from paddle.distributed.fleet.utils import mix_precision_utils as mpu

    raw = raw_model(cases.WideLM)
    optimizer = cases.adamw(raw.parameters())  # the trainer's create_optimizer, before wrapping
    mpu.MixPrecisionLayer(raw, dtype="bfloat16")
    model = fleet.distributed_model(raw)
    opt = fleet.distributed_optimizer(mpu.MixPrecisionOptimizer(optimizer))
    return raw, model, opt


def erniekit_tensor_parallel_inside():
    """ERNIEKit's SFT Trainer._wrap_model for sharding stage 1 with tensor parallelism: it builds TensorParallel(model)
    itself, then fleet.distributed_model wraps that (here mp degree 1: ShardingParallel(TensorParallel)); both hold
    every parameter, the outer one trains."""
    from paddle.distributed.fleet.meta_parallel import TensorParallel

    raw = raw_model()
    model = TensorParallel(raw, fleet.get_hybrid_communicate_group(), strategy=None)
    model = fleet.distributed_model(model)
    return raw, model, fleet.distributed_optimizer(cases.adamw(raw.parameters()))


def no_wrapped_model():
    """A loop that trains the layer itself: nothing holds the optimizer's parameters."""
    raw = raw_model()
    return raw, raw, fleet.distributed_optimizer(cases.adamw(raw.parameters()))


def explicit_off_before_the_model():
    """The optimizer first, the trainer turns the overlap off, then the model is wrapped (which would otherwise turn it
    on); the gradient overlap (comm_overlap) is on."""
    raw = raw_model()
    with cases.sharding_configs(comm_overlap=True):
        with hybrid_parallel_cpu_shim.cpu_tensor_fusion():
            opt = fleet.distributed_optimizer(cases.adamw(raw.parameters()))
        opt._set_broadcast_overlap(False)
        return raw, fleet.distributed_model(raw), opt


def explicit_on_after_the_setting():
    """The setting turned it on (buckets); the trainer's own call (one broadcast per parameter) replaces it before the
    first forward."""
    raw, model, opt = script_model_first()
    assert cases.overlap_impl(opt) is not None or not AUTO
    opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=0)
    return raw, model, opt


def v2_release_gradients():
    """ERNIE's large SFT configs: V2 with release_gradients and amp_master_grad (Paddle's V2 releases only main_grad
    gradients), the _wrap_model above."""
    with cases.sharding_configs(release_gradients=True):
        return v2(wrap_model_style)()


# ----------------------------------------------------------------------
# pipeline (pp2 x sharding2)
def pipeline_build():
    from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

    hcg = fleet.get_hybrid_communicate_group()
    descs = [LayerDesc(paddle.nn.Linear, 8, 16), LayerDesc(paddle.nn.Tanh), LayerDesc(paddle.nn.Linear, 16, 16)]
    descs += [LayerDesc(paddle.nn.Linear, 16, 16), LayerDesc(paddle.nn.Tanh), LayerDesc(paddle.nn.Linear, 16, 4)]
    paddle.seed(2026 + hcg.get_stage_id())
    raw = PipelineLayer(layers=descs, topology=hcg.topology(), loss_fn=paddle.nn.MSELoss())
    raw.first_use = FirstUse(raw)
    model = fleet.distributed_model(raw)
    return raw, model, fleet.distributed_optimizer(cases.adamw(raw.parameters()))


def pipeline_step(model, opt, step):
    hcg = fleet.get_hybrid_communicate_group()
    rng = np.random.RandomState(1000 * step + hcg.get_sharding_parallel_rank())
    x = paddle.to_tensor(rng.rand(4, 8).astype("float32"))
    y = paddle.to_tensor(rng.rand(4, 4).astype("float32"))
    return np.array(model.train_batch([x, y], opt).numpy()).copy()


# ----------------------------------------------------------------------
def on(kind):
    return lambda opt, model: [on_line(opt, kind, model)]


def off(kind, text, note=""):
    def expect(opt, model):
        return [line(opt, kind, f"no {kind[1]} overlap, training without it: {text(opt, model)}{note}")]

    return expect


def no_model_text(opt, model):
    count = len(cases.optimizer_parameters(opt))
    return (
        "no wrapped model (fleet.distributed_model's result or a PipelineParallel) holds all of its "
        f"{count} parameters at its first update. Call {V1[3]} yourself, with the model whose forward uses them."
    )


def refusal_text(opt, model):
    return (
        "_set_all_gather_overlap_forward refuses this configuration: the all-gather overlap is not tested "
        "with sharding_configs.release_gradients (it frees gradients); set it to its default or leave the "
        "all-gather overlap off."
    )


def explicit(kind, state, note=""):
    text = f"the trainer's own {kind[2]} call turned the {kind[1]} overlap {state}; PADDLE_OVERLAY=overlap leaves"
    return lambda opt, model: [line(opt, kind, f"{text} this optimizer to the trainer.{note}")]


def explicit_on_expected(opt, model):
    impl = cases.overlap_impl(opt)
    assert all(len(u.params) == 1 for u in impl.units), "the trainer's bucket_size_mb=0 did not win"
    return on(V1)(opt, model) + explicit(V1, "on")(opt, model)


CASES = {
    "script_v1": Case(script_model_first, on(V1), True),
    "script_v1_optimizer_first": Case(script_optimizer_first, on(V1), True),
    "script_v2": Case(v2(lambda: script_model_first(cases.WideLM)), on(V2), True),
    "direct_hybrid_subclass_v1": Case(direct_subclass, on(V1), True),
    "direct_hybrid_subclass_v2": Case(v2(direct_subclass), on(V2), True),
    "wrap_model_v2": Case(v2(wrap_model_style), on(V2), True),
    "erniekit_tensor_parallel_inside": Case(erniekit_tensor_parallel_inside, on(V1), True),
    "no_wrapped_model": Case(no_wrapped_model, off(V1, no_model_text), False),
    "explicit_off_before_the_model": Case(explicit_off_before_the_model, explicit(V1, "off", GRADIENT_NOTE), False),
    "explicit_on_after_the_setting": Case(explicit_on_after_the_setting, explicit_on_expected, True, baseline_on=True),
}
if not cases.PADDLE_2:  # Paddle 2.6 has no sharding_configs.release_gradients
    CASES["v2_release_gradients_refused"] = Case(v2_release_gradients, off(V2, refusal_text), False)
PIPELINE_CASES = {
    "pipeline_v1": Case(pipeline_build, on(V1), True, train_step=pipeline_step),
    "pipeline_v2": Case(v2(pipeline_build), on(V2), True, train_step=pipeline_step),
}


def init():
    if PIPELINE:
        cases.init_fleet({"pp_degree": 2, "sharding_degree": 2}, micro_batch=2)
    else:
        cases.init_fleet()


# Paddle's own notice when TensorParallel is built with model-parallel degree 1 (the ERNIEKit case): its parameter
# broadcasts skip the groups this rank is not in
NOTICES = (r"^Current global rank \d+ is not in group ",)

if __name__ == "__main__":
    chosen = PIPELINE_CASES if PIPELINE else CASES
    sys.exit(cases.run_cases(chosen, init=init, notices=NOTICES))
