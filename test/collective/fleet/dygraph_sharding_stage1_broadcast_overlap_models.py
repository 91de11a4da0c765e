# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Per-rank script: the kinds of model and state handling users have.

Each case: overlap on vs off bitwise equal (numpy copies), and the wait
checker sees no parameter used while its broadcast is pending. Cases run by
env ``BROADCAST_OVERLAP_CASES`` (all by default) under
``python -m paddle.distributed.launch --nproc_per_node 2``.
"""

import functools
import inspect
import os
import sys
import tempfile
import types
import warnings

import broadcast_overlap_training as training
import numpy as np
from broadcast_overlap_checker import BroadcastWaitChecker
from broadcast_overlap_training import (
    HIDDEN,
    SEQ,
    STEPS,
    VOCAB,
    Block,
    TinyLM,
    adamw,
    assert_bitwise_equal,
    assert_lost_overlap_warning,
    batch,
    cases_of,
    default_micro_step,
    lost_overlap_warnings,
    optimizer_parameters,
    order_warnings,
    overlap_impl,
    rank,
    run_cases,
)

import paddle
from paddle.distributed import fleet

# 2 KB buckets: several windows per model, so bucket boundaries fall inside
# layers (the default 256 MB puts these small models in one window); cases
# whose assertions hold per parameter also run with 0
BUCKET_MB = 0.002
compare_on_off = functools.partial(training.compare_on_off, bucket_mb=BUCKET_MB)
train = functools.partial(training.train, bucket_mb=BUCKET_MB)


# ----------------------------------------------------------------------
# models
class RootParamLM(TinyLM):
    """A position-embedding parameter owned by the root (which also has
    sublayers), added in its forward."""

    def __init__(self):
        super().__init__()
        self.pos = self.create_parameter([SEQ, HIDDEN])

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TiedLM(TinyLM):
    """Two Linear layers sharing one weight object, both called."""

    def __init__(self):
        super().__init__()
        self.mix_a = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.mix_b = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.mix_b.weight = self.mix_a.weight

    def forward(self, tokens):
        x = self.mix_b(self.mix_a(self.embed(tokens)))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class BuiltOutOfOrderLM(paddle.nn.Layer):
    """Head and last block built first, run last: creation order is not
    forward order."""

    def __init__(self):
        super().__init__()
        self.head = paddle.nn.Linear(HIDDEN, VOCAB)
        self.late = Block()
        self.early = Block()
        self.embed = paddle.nn.Embedding(VOCAB, HIDDEN)

    def forward(self, tokens):
        return self.head(self.late(self.early(self.embed(tokens))))


_custom_name_builds = [0]


class CustomNamesLM(paddle.nn.Layer):
    """Parameters named by ParamAttr(name=...), no integer suffix."""

    def __init__(self):
        super().__init__()
        _custom_name_builds[0] += 1
        tag = f"v{_custom_name_builds[0]}r"

        def attr(name):
            return paddle.ParamAttr(name=f"custom_{name}_{tag}")

        self.embed = paddle.nn.Embedding(VOCAB, HIDDEN, weight_attr=attr("emb"))
        self.proj = paddle.nn.Linear(
            HIDDEN, HIDDEN, weight_attr=attr("proj_w"), bias_attr=attr("proj_b")
        )
        self.norm = paddle.nn.LayerNorm(
            HIDDEN, weight_attr=attr("ln_w"), bias_attr=attr("ln_b")
        )
        self.head = paddle.nn.Linear(
            HIDDEN, VOCAB, weight_attr=attr("head_w"), bias_attr=attr("head_b")
        )

    def forward(self, tokens):
        return self.head(self.norm(self.proj(self.embed(tokens))))


class SometimesSkipLM(TinyLM):
    """Block 1 does not run on odd steps (deterministic, same on all ranks)."""

    skip = False

    def forward(self, tokens):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            if not (self.skip and i == 1):
                x = block(x)
        return self.head(x)


class WeightNormLM(TinyLM):
    """head under paddle.nn.utils.weight_norm: its forward pre-hook (made
    before overlap is enabled) computes weight from weight_g and weight_v."""

    def __init__(self):
        super().__init__()
        paddle.nn.utils.weight_norm(self.head)


class ParameterListLM(TinyLM):
    """Extra parameters in a ParameterList, read by the parent's forward
    (a ParameterList has no forward of its own)."""

    def __init__(self, read_check=None):
        super().__init__()
        self.scales = paddle.nn.ParameterList(
            [self.create_parameter([HIDDEN]) for _ in range(2)]
        )
        # called with the parameters a forward is about to read (a case
        # passes the wait checker's check)
        self.read_check = read_check

    def forward(self, tokens):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            if self.read_check is not None:
                self.read_check([self.scales[i]])
            x = block(x) * self.scales[i]
        return self.head(x)


# ----------------------------------------------------------------------
# cases: models
def case_root_owned_parameter():
    checker, info = compare_on_off(RootParamLM)
    model = info["model"]
    impl = overlap_impl(info["opt"])
    params = optimizer_parameters(info["opt"])
    # the root-owned parameter is waited at the root's pre-hook, first
    assert params[impl.order[0]] is model._layers.pos
    assert impl.index_of(model._layers.pos) == impl.order[0]


def case_tied_weights():
    compare_on_off(TiedLM)
    compare_on_off(TiedLM, acc_steps=2)


def case_built_out_of_forward_order():
    _, info = compare_on_off(BuiltOutOfOrderLM)
    impl = overlap_impl(info["opt"])
    inner = info["model"]._layers
    params = optimizer_parameters(info["opt"])
    first = params[impl.order[0]]
    last = params[impl.order[-1]]
    assert first is inner.embed.weight, first.name
    assert any(last is p for p in inner.head.parameters()), last.name


def case_custom_parameter_names():
    _, info = compare_on_off(CustomNamesLM)
    impl = overlap_impl(info["opt"])
    inner = info["model"]._layers
    params = optimizer_parameters(info["opt"])
    assert params[impl.order[0]] is inner.embed.weight


def case_unreachable_parameters_waited_and_named():
    extra_holder = {}

    def parameters(model):
        extra = paddle.create_parameter(
            [HIDDEN], "float32", name=f"outside_model_{len(extra_holder)}"
        )
        extra_holder["p"] = extra
        return list(model.parameters()) + [extra]

    def micro_step(model, step, micro, acc_steps):
        tokens, labels = batch(step, micro)
        logits = model(tokens)
        loss = paddle.nn.functional.cross_entropy(logits, labels).mean()
        loss = loss + (extra_holder["p"] ** 2).mean()
        (loss / acc_steps).backward()
        return loss

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checker, info = compare_on_off(
            parameters=parameters, micro_step=micro_step
        )
    name = extra_holder["p"].name
    named = [str(w.message) for w in caught if name in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    impl = overlap_impl(info["opt"])
    assert impl.stats["waited_unreachable"] == STEPS, impl.stats
    checker.check([extra_holder["p"]], "after-step")
    assert checker.violations == []


def case_layer_not_run_and_eval_between_steps():
    def micro_step(model, step, micro, acc_steps):
        model._layers.skip = step % 2 == 1
        return default_micro_step(model, step, micro, acc_steps)

    def on_step(step, model, opt):
        # evaluate only before the steps that run every block, so block 1's
        # broadcasts stay pending across the steps that skip it
        if step % 2 == 1:
            model.eval()
            with paddle.no_grad():
                model(batch(100 + step)[0])
            model.train()

    for mb in (BUCKET_MB, 0):
        with order_warnings() as order:
            _, info = compare_on_off(
                SometimesSkipLM,
                bucket_mb=mb,
                steps=5,
                micro_step=micro_step,
                on_step=on_step,
            )
        assert len(order) <= 1, order  # shown once
        if mb == 0:  # (a bucket shared with a layer that ran is waited in
            # forward) block 1's tasks of the odd steps were waited before
            # the next update; the head needs its own while they are pending
            stats = overlap_impl(info["opt"]).stats
            assert stats["waited_before_update"] > 0, stats
            assert len(order) == 1, order


def case_state_dict_and_save_without_synchronize():
    """model.state_dict(), paddle.save and the optimizer's state_dict()
    right after step(): every task waited by them, not by the user."""
    saved = {}

    def on_step(step, model, opt, checker=None):
        if checker is None:
            return
        assert checker.num_unwaited() > 0  # launched, not yet waited
        state = model.state_dict()
        checker.check(list(state.values()), "model.state_dict")
        assert checker.num_unwaited() == 0
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"model_rank{rank()}.pdparams")
            paddle.save(state, path)
            saved[step] = paddle.load(path)
        opt_state = opt.state_dict()
        assert len(opt_state) > 0
        # Paddle 3.x state_dict(keep_vars=False) returns detached copies:
        # it must wait all the same
        impl_params = inspect.signature(
            paddle.nn.Layer._state_dict_impl
        ).parameters
        impl = overlap_impl(opt)
        if "keep_vars" in impl_params:
            relaunch(impl)
            assert checker.num_unwaited() > 0
            model._layers.state_dict(keep_vars=False)
            assert checker.num_unwaited() == 0
        # the optimizer's state_dict() waits too (launch again to check)
        relaunch(impl)
        assert checker.num_unwaited() > 0
        opt.state_dict()
        assert checker.num_unwaited() == 0

    def relaunch(impl):
        # what step() does around its update: wait, then launch every unit
        # again (the same values: a second launch on every rank)
        impl.wait_all("waited_before_update")
        impl.launch()
        assert impl.num_pending == len(impl.units), impl.num_pending

    off = train(TinyLM, overlap=False)
    with BroadcastWaitChecker() as checker:
        # (no lost-overlap warning although model.state_dict() reads every
        # parameter: the relaunch above starts a new count, and the last
        # wait before the next forward is the optimizer's state_dict(), a
        # wait on demand, not a read; run_cases fails the case on a warning)
        on = train(
            TinyLM,
            overlap=True,
            checker=checker,
            on_step=functools.partial(on_step, checker=checker),
        )
    assert_bitwise_equal(off[:2], on[:2], "save")
    assert checker.violations == [], checker.violations
    last = saved[STEPS - 1]
    for k, v in on[1].items():
        assert np.asarray(last[k]).tobytes() == v.tobytes(), k


def case_frozen_and_gradless_parameters():
    def build():
        model = TinyLM()
        for p in model.blocks[0].parameters():
            p.stop_gradient = True
        return model

    def micro_step(model, step, micro, acc_steps):
        # blocks[1] is trainable but unused: it never gets a gradient
        tokens, labels = batch(step, micro)
        inner = model._layers
        x = inner.blocks[0](inner.embed(tokens))
        loss = paddle.nn.functional.cross_entropy(inner.head(x), labels).mean()
        (loss / acc_steps).backward()
        return loss

    checker, info = compare_on_off(build, micro_step=micro_step)
    frozen = {id(p) for p in info["model"]._layers.blocks[0].parameters()}
    assert not frozen & set(checker._latest), "a frozen parameter was broadcast"


def case_checkpoint_resume():
    """N steps with overlap on, save, load into a fresh run, continue: the
    same as an uninterrupted run with overlap off."""
    total, cut = STEPS + 2, 3
    off_losses, off_params, _ = train(TinyLM, overlap=False, steps=total)
    first_losses, _, info = train(TinyLM, overlap=True, steps=cut)
    with tempfile.TemporaryDirectory() as tmp:
        mpath = os.path.join(tmp, f"m{rank()}.pdparams")
        opath = os.path.join(tmp, f"o{rank()}.pdopt")
        # no synchronize: state_dict() waits for pending broadcasts
        paddle.save(info["model"]._layers.state_dict(), mpath)
        paddle.save(info["opt"].state_dict(), opath)
        model_state, opt_state = paddle.load(mpath), paddle.load(opath)
    paddle.distributed.barrier()
    fresh = TinyLM()
    fresh.set_state_dict(model_state)
    opt = fleet.distributed_optimizer(adamw(fresh.parameters()))
    # A fresh process would rebuild the same parameter names; in this one
    # process the new model's names differ, so rename the state's keys.
    old_names = {k: p.name for k, p in info["model"]._layers.named_parameters()}
    renames = {old_names[k]: p.name for k, p in fresh.named_parameters()}
    opt.set_state_dict(rename_state_keys(opt_state, renames))
    fresh = fleet.distributed_model(fresh)
    opt._set_broadcast_overlap(True, layers=fresh)
    with BroadcastWaitChecker() as checker:
        rest_losses, rest_params, _ = train(
            model=fresh,
            opt=opt,
            steps=total - cut,
            first_step=cut,
            checker=checker,
        )
    assert checker.violations == [] and checker.counts["launched"] > 0
    assert_bitwise_equal(
        (off_losses, off_params),
        (first_losses + rest_losses, rest_params),
        "resume",
    )


def rename_state_keys(state, renames):
    """Optimizer state keys start with a parameter name: rename them."""
    by_length = sorted(renames, key=len, reverse=True)
    renamed = {}
    for key, value in state.items():
        if isinstance(value, dict):
            value = rename_state_keys(value, renames)
        for old in by_length:
            if key == old or key.startswith(old + "_"):
                key = renames[old] + key[len(old) :]
                break
        renamed[key] = value
    return renamed


def case_amp_o2_main_grad():
    """MixPrecisionLayer/MixPrecisionOptimizer: main_grad accumulation and
    the sharding optimizer's main_grad paths. Paddle's CPU build has no
    bfloat16/float16 matmul or layer_norm kernels, so the parameters stay
    float32 here; the reduced-precision dtype is covered by the GPU test
    dygraph_group_sharded_stage1_bf16.py (skipped without CUDA)."""
    from paddle.distributed.fleet.utils.mix_precision_utils import (
        MixPrecisionLayer,
        MixPrecisionOptimizer,
    )

    def wrap(model):
        return MixPrecisionLayer(model, dtype="bfloat16")

    def make_optimizer(params):
        return MixPrecisionOptimizer(adamw(params))

    for acc_steps in (1, 2):
        _, info = compare_on_off(
            wrap_model=wrap, make_optimizer=make_optimizer, acc_steps=acc_steps
        )
    params = list(info["model"].parameters())
    assert all(hasattr(p, "main_grad") for p in params)
    assert info["opt"]._inner_opt._use_main_grad


def case_user_pre_hook_reads_waited_parameters():
    """A user's pre-hook registered before overlap is enabled (here
    weight_norm's) runs after the overlay's wait."""
    compare_on_off(WeightNormLM)
    with BroadcastWaitChecker() as checker:

        def wrap(model):
            def user_hook(layer, _inputs):
                checker.check(
                    layer.parameters(include_sublayers=False), "user hook"
                )

            for layer in model.sublayers(include_self=True):
                layer.register_forward_pre_hook(user_hook)
            return model

        train(TinyLM, overlap=True, checker=checker, wrap_model=wrap)
    assert (
        checker.counts["launched"] > 0 and checker.violations == []
    ), checker.violations[:5]


def case_parameter_list_waited_by_parent():
    compare_on_off(ParameterListLM)
    with BroadcastWaitChecker() as checker:
        build = functools.partial(
            ParameterListLM,
            read_check=lambda ps: checker.check(ps, "ParameterList read"),
        )
        train(build, overlap=True, checker=checker)
    assert checker.violations == [], checker.violations[:5]


def case_load_into_inner_model_or_sublayer_waits():
    """set_state_dict on the unwrapped model or a sublayer right after
    step(): every parameter it writes is waited before the write."""
    for mb in (BUCKET_MB, 0):
        check_loads_into_inner_model_or_sublayer(mb)


def check_loads_into_inner_model_or_sublayer(bucket_mb):
    loads, snapshots, custom_loads = [], {}, {}

    def with_custom_load(model):
        """The user's own set_state_dict on two instances, set before
        overlap is enabled: it must still run, and survive disabling."""
        for name, layer in (("inner", model), ("block", model.blocks[1])):

            def custom(self, state, *args, _name=name, **kwargs):
                custom_loads[_name] = custom_loads.get(_name, 0) + 1
                return type(self).set_state_dict(self, state, *args, **kwargs)

            custom_loads[name] = 0
            layer.set_state_dict = types.MethodType(custom, layer)
        return model

    def on_step(step, model, opt, checker=None):
        inner = model._layers
        targets = {"inner": inner, "block": inner.blocks[1]}
        if step == 0:  # state_dict() waits: safe to copy
            for name, layer in targets.items():
                snapshots[name] = {
                    k: v.clone() for k, v in layer.state_dict().items()
                }
            return
        name = "inner" if step % 2 == 0 else "block"
        if checker is not None:
            assert checker.num_unwaited() > 0
        before = custom_loads[name]
        targets[name].set_state_dict(snapshots[name])  # roll back
        assert custom_loads[name] == before + 1  # the user's own override ran
        if checker is not None:
            loads.append((name, checker.num_unwaited()))

    off = train(
        TinyLM,
        overlap=False,
        on_step=on_step,
        wrap_model=with_custom_load,
        bucket_mb=bucket_mb,
    )
    with BroadcastWaitChecker() as checker, lost_overlap_warnings() as lost:
        on = train(
            TinyLM,
            overlap=True,
            checker=checker,
            on_step=functools.partial(on_step, checker=checker),
            wrap_model=with_custom_load,
            bucket_mb=bucket_mb,
        )
    assert_bitwise_equal(off[:2], on[:2], "loads")
    # step 0's snapshots read every parameter before the next forward:
    # said once (the later loads do not repeat it)
    assert_lost_overlap_warning(lost, "iteration")
    # a load waits for exactly the parameters it writes (checked at each
    # Tensor.set_value): the whole model's load leaves nothing pending, a
    # block's load leaves the other layers' broadcasts in flight
    assert {n for n, _ in loads} == {"inner", "block"}, loads
    assert all(left == 0 for n, left in loads if n == "inner"), loads
    if bucket_mb == 0:  # (buckets span the block and the rest)
        assert all(left > 0 for n, left in loads if n == "block"), loads
    assert checker.counts["writes"] > 0, checker.counts
    assert checker.violations == []
    model, opt = on[2]["model"], on[2]["opt"]
    opt._set_broadcast_overlap(False)
    before = dict(custom_loads)
    model._layers.set_state_dict(snapshots["inner"])
    assert custom_loads["inner"] == before["inner"] + 1  # restored


def case_bad_input_raises_before_any_change():
    model = fleet.distributed_model(TinyLM())
    opt = fleet.distributed_optimizer(adamw(model.parameters()))
    inner = opt._inner_opt
    hooks_before = sum(
        len(l._forward_pre_hooks) for l in model.sublayers(include_self=True)
    )
    other = TinyLM()
    bad = [
        (dict(broadcast_overlap=True, layers=None), ValueError, "layers=model"),
        (
            dict(broadcast_overlap=True, layers="model"),
            TypeError,
            "paddle.nn.Layer",
        ),
        (dict(broadcast_overlap=True, layers=other), ValueError, "owns none"),
        (dict(broadcast_overlap="yes", layers=model), TypeError, "bool"),
        (
            dict(broadcast_overlap=True, layers=model, strict=1),
            TypeError,
            "strict",
        ),
    ]
    for target in (opt, inner):
        for kwargs, error, text in bad:
            try:
                target._set_broadcast_overlap(**kwargs)
            except error as e:
                assert text in str(e), (kwargs, str(e))
            else:
                raise AssertionError(f"no {error.__name__} for {kwargs}")
    # comm_overlap is supported (gradient-overlap script); with the
    # pipeline's sharding_comm_overlap it is Paddle's own limit
    pp = fleet.fleet._user_defined_strategy.hybrid_configs["pp_configs"]
    saved = inner.comm_overlap
    inner.comm_overlap, pp.sharding_comm_overlap = True, True
    try:
        opt._set_broadcast_overlap(True, layers=model)
    except ValueError as e:
        assert "Paddle cannot combine" in str(e) and "comm_overlap" in str(
            e
        ), str(e)
    else:
        raise AssertionError(
            "comm_overlap + pp sharding_comm_overlap was not refused"
        )
    finally:
        inner.comm_overlap, pp.sharding_comm_overlap = saved, False
    assert overlap_impl(inner) is None
    hooks_after = sum(
        len(l._forward_pre_hooks) for l in model.sublayers(include_self=True)
    )
    assert hooks_after == hooks_before
    # turning off what was never on is a no-op
    opt._set_broadcast_overlap(False)


if __name__ == "__main__":
    sys.exit(run_cases(cases_of(globals())))
