# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: the kinds of model and state handling users have, and training loops that break naive broadcast overlap
(ranks or steps that differ in forward order and count, forwards without backward, recompute, weights replaced,
parameters read without calling their layer, changing trainability). Each case: overlap on vs off bitwise equal, no
parameter read while its broadcast is pending (``compare_on_off``), 2 ranks."""

import copy
import functools
import gc
import inspect
import itertools
import operator
import sys
import types
from unittest import mock

import numpy as np
import sharding_cases as cases

import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.utils import recompute

HIDDEN, VOCAB, SEQ = cases.HIDDEN, cases.VOCAB, cases.SEQ
# 2 KB buckets: several windows per model, so bucket boundaries fall inside layers (the default 256 MB puts these small
# models in one window); cases whose assertions hold per parameter also run with 0
BUCKET_MB = 0.002
compare_on_off = functools.partial(cases.compare_on_off, enable=cases.v1(BUCKET_MB))
train = functools.partial(cases.train, enable=cases.v1(BUCKET_MB))


def check_order_warned_per_parameter(build, stat, steps=cases.STEPS, **kwargs):
    """With 2 KB buckets and per parameter: one agreed order, the order warning at most once; per parameter (buckets may
    join the layers involved) the ``stat`` wait happened and the warning was shown."""
    kwargs.update(steps=steps, micro_step=cases.step_aware_micro_step)
    for mb in (BUCKET_MB, 0):
        with cases.order_warnings() as order:
            _, info = compare_on_off(build, enable=cases.v1(mb), **kwargs)
        cases.assert_order_agreed(info)
        assert len(order) <= 1, order  # shown once
        if mb == 0:
            stats = cases.overlap_impl(info.opt).stats
            assert stats[stat] > 0 and len(order) == 1, (stats, order)


def cloned_state(layer):
    """Clones of ``layer.state_dict()``'s values (which waits for them)."""
    return {k: v.clone() for k, v in layer.state_dict().items()}


class RootParamLM(cases.VariantLM):
    """A position-embedding parameter owned by the root (which also has sublayers), added in its forward."""

    def build(self):
        self.pos = self.create_parameter([SEQ, HIDDEN])

    def front(self, x):
        return x + self.pos


class TiedLM(cases.VariantLM):
    """Two Linear layers sharing one weight object, both called."""

    def build(self):
        self.mix_a = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.mix_b = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.mix_b.weight = self.mix_a.weight

    def front(self, x):
        return self.mix_b(self.mix_a(x))


class BuiltOutOfOrderLM(paddle.nn.Layer):
    """Head and last block built first, run last: creation order is not forward order."""

    def __init__(self):
        super().__init__()
        self.head, self.late = (paddle.nn.Linear(HIDDEN, VOCAB), cases.Block())
        self.early, self.embed = cases.Block(), paddle.nn.Embedding(VOCAB, HIDDEN)

    def forward(self, tokens):
        return self.head(self.late(self.early(self.embed(tokens))))


_custom_name_builds = itertools.count(1)


class CustomNamesLM(paddle.nn.Layer):
    """Parameters named by ParamAttr(name=...), no integer suffix."""

    def __init__(self):
        super().__init__()
        tag = f"v{next(_custom_name_builds)}r"

        def attr(name):
            return paddle.ParamAttr(name=f"custom_{name}_{tag}")

        def wb(n):
            return dict(weight_attr=attr(n + "_w"), bias_attr=attr(n + "_b"))

        self.embed = paddle.nn.Embedding(VOCAB, HIDDEN, weight_attr=attr("emb"))
        self.proj = paddle.nn.Linear(HIDDEN, HIDDEN, **wb("proj"))
        self.norm = paddle.nn.LayerNorm(HIDDEN, **wb("ln"))
        self.head = paddle.nn.Linear(HIDDEN, VOCAB, **wb("head"))

    def forward(self, tokens):
        return self.head(self.norm(self.proj(self.embed(tokens))))


class SometimesSkipLM(cases.VariantLM):
    """Block 1 does not run on odd steps (deterministic, same on all ranks)."""

    def run_block(self, i, x):
        return x if i == 1 and self.step % 2 == 1 else self.blocks[i](x)


class WeightNormLM(cases.VariantLM):
    """head under paddle.nn.utils.weight_norm: its forward pre-hook (made before overlap is enabled) computes weight from
    weight_g and weight_v."""

    def build(self):
        paddle.nn.utils.weight_norm(self.head)


class ParameterListLM(cases.VariantLM):
    """Extra parameters in a ParameterList, read by the parent's forward (a ParameterList has no forward of its own)."""

    def build(self):
        self.scales = paddle.nn.ParameterList([self.create_parameter([HIDDEN]) for _ in range(2)])

    def run_block(self, i, x):
        self.read_check([self.scales[i]])
        return self.blocks[i](x) * self.scales[i]


def check_order_ends(build, first, last=None):
    """The agreed order starts with the user's layer's parameter ``first`` (a dotted name) and, if given, ends with one of
    sublayer ``last``'s."""
    _, info = compare_on_off(build)
    impl, inner = cases.overlap_impl(info.opt), info.raw
    params = cases.optimizer_parameters(info.opt)  # (checks index_of)
    head, tail = params[impl.order[0]], params[impl.order[-1]]
    assert head is operator.attrgetter(first)(inner), head.name
    assert last is None or any(tail is p for p in getattr(inner, last).parameters()), tail.name


def case_root_owned_parameter():
    """The root-owned parameter is waited at the root's pre-hook, first."""
    check_order_ends(RootParamLM, "pos")


def case_built_out_of_forward_order():
    """The order is the forward's, not the creation order."""
    check_order_ends(BuiltOutOfOrderLM, "embed.weight", "head")


def case_custom_parameter_names():
    """Names without an integer suffix do not decide the order."""
    check_order_ends(CustomNamesLM, "embed.weight")


def case_layer_not_run_and_eval_between_steps():
    """A block skipped on odd steps, eval forwards before the others: its pending tasks are waited before the next update
    (and warned once)."""

    def after_step(run):
        # eval only before the steps that run every block, so block 1's broadcasts stay pending across the steps that
        # skip it
        if run.step % 2 == 1:
            run.model.eval()
            with paddle.no_grad():
                run.model(cases.batch(100 + run.step)[0])
            run.model.train()

    check_order_warned_per_parameter(SometimesSkipLM, "waited_before_update", 5, after_step=after_step)


def case_state_dict_and_save_without_synchronize():
    """model.state_dict(), paddle.save and the optimizer's state_dict() right after step(): every task waited by them, not
    by the user."""
    saved = {}
    # Paddle 3.x state_dict(keep_vars=False) returns detached copies
    impl_args = inspect.signature(paddle.nn.Layer._state_dict_impl).parameters

    def after_step(run):
        checker = run.checker
        if checker is None:
            return
        assert checker.num_unwaited() > 0  # launched, not yet waited
        state = run.model.state_dict()
        assert checker.num_unwaited() == 0
        saved[run.step] = cases.reloaded(state)
        impl = cases.overlap_impl(run.opt)
        waits = [run.opt.state_dict]  # the optimizer's waits too
        if "keep_vars" in impl_args:
            waits.insert(0, lambda: run.raw.state_dict(keep_vars=False))
        for wait in waits:
            # what step() does around its update: wait, then launch every unit again (the same values: a second launch
            # on every rank)
            impl.wait_all("waited_before_update")
            with checker.as_step():
                impl.launch()
            assert impl.num_pending == len(impl.units), impl.num_pending
            assert checker.num_unwaited() > 0
            wait()
            assert checker.num_unwaited() == 0

    # no lost-overlap warning (run_cases fails the case on one) although model.state_dict() reads every parameter: the
    # relaunch starts a new count, and the last wait before the next forward is on demand
    _, on = compare_on_off(after_step=after_step)
    for k, v in on.params.items():
        assert np.asarray(saved[cases.STEPS - 1][k]).tobytes() == v.tobytes(), k


def case_frozen_and_gradless_parameters():
    """Frozen parameters are never broadcast; a trainable one without a gradient is harmless."""

    def build():
        model = cases.TinyLM()
        for p in model.blocks[0].parameters():
            p.stop_gradient = True
        return model

    def micro_step(run):
        # blocks[1] is trainable but unused: it never gets a gradient
        tokens, labels = cases.batch(run.step, run.micro)
        inner = run.raw
        x = inner.blocks[0](inner.embed(tokens))
        loss = paddle.nn.functional.cross_entropy(inner.head(x), labels).mean()
        (loss / run.acc_steps).backward()
        return loss

    checker, info = compare_on_off(build, micro_step=micro_step)
    frozen = {id(p) for p in info.raw.blocks[0].parameters()}
    assert not frozen & checker.synced_ids(), "a frozen parameter was broadcast"


def case_amp_o2_main_grad():
    """MixPrecisionLayer/MixPrecisionOptimizer: main_grad accumulation and the sharding optimizer's main_grad paths
    (float32 parameters: the CPU has no reduced-precision matmul or layer_norm kernels; the dtype is covered by
    dygraph_group_sharded_stage1_bf16.py on CUDA)."""
    from paddle.distributed.fleet.utils import mix_precision_utils as mpu

    build = cases.Build(
        wrap=lambda m: mpu.MixPrecisionLayer(m, dtype="bfloat16"),
        optimizer=lambda ps: mpu.MixPrecisionOptimizer(cases.adamw(ps)),
    )
    for acc_steps in (1, 2):
        _, info = compare_on_off(build, acc_steps=acc_steps)
    assert all(hasattr(p, "main_grad") for p in info.model.parameters())
    assert info.opt._inner_opt._use_main_grad


def case_user_pre_hook_reads_waited_parameters():
    """weight_norm's pre-hook, registered before overlap is enabled, computes head.weight from weight_g and weight_v after
    the overlay's wait (a user's hook runs after the waits: unit tests)."""
    compare_on_off(WeightNormLM)


def case_parameter_list_waited_by_parent():
    """A ParameterList read by its parent's forward is waited before the read (the wait checker checks it there)."""

    def run(build, overlap, checker=None, **kwargs):
        model = functools.partial(ParameterListLM, checker and functools.partial(checker.check, where="scales"))
        return train(model, overlap, checker=checker, **kwargs)

    compare_on_off(train=run)


def case_bad_input_raises_before_any_change():
    """Bad arguments (on the fleet and the sharding optimizer: a negative, NaN, string or bool bucket_size_mb among them)
    and Paddle's own limit on comm_overlap or tensor_fusion with the pipeline's sharding_comm_overlap are refused before
    any owner or hook exists."""
    model = fleet.distributed_model(cases.TinyLM())
    opt = fleet.distributed_optimizer(cases.adamw(model.parameters()))
    inner = opt._inner_opt
    hooks_before = cases.total_forward_pre_hooks(model)
    bad = [
        (dict(layers=None), ValueError, "layers=model"),
        (dict(layers="model"), TypeError, "paddle.nn.Layer"),
        (dict(layers=cases.TinyLM()), ValueError, "owns none"),
        (dict(broadcast_overlap="yes"), TypeError, "bool"),
        (dict(strict=1), TypeError, "strict"),
        (dict(bucket_size_mb=-1), ValueError, "bucket_size_mb"),
        (dict(bucket_size_mb=float("nan")), ValueError, "bucket_size_mb"),
        (dict(bucket_size_mb="256"), TypeError, "bucket_size_mb"),
        (dict(bucket_size_mb=True), TypeError, "bucket_size_mb"),
    ]
    for target in (opt, inner):
        for kwargs, error, text in bad:
            kwargs = dict(dict(broadcast_overlap=True, layers=model), **kwargs)
            with cases.raises(error, text):
                target._set_broadcast_overlap(**kwargs)
    # comm_overlap and tensor_fusion are supported (gradient-overlap script, buckets script); with the pipeline's
    # sharding_comm_overlap it is Paddle's own limit (which Paddle checks at the build only)
    limit = ("Paddle cannot combine", "sharding_comm_overlap")
    for flag in ("comm_overlap", "tensor_fusion"):
        with mock.patch.object(inner, flag, True), cases.raises(ValueError, *limit):
            with cases.pp_configs(sharding_comm_overlap=True):
                opt._set_broadcast_overlap(True, layers=model)
    assert cases.overlap_impl(inner) is None
    assert cases.total_forward_pre_hooks(model) == hooks_before
    # turning off what was never on is a no-op
    opt._set_broadcast_overlap(False)


# ---- training loops that break naive overlap: collectives must be issued in
# the same order on every rank
class RankOrderLM(cases.VariantLM):
    """Two parallel branches whose call order depends on rank and step (the sum is the same either way)."""

    def build(self):
        self.branch_a = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.branch_b = paddle.nn.Linear(HIDDEN, HIDDEN)

    def front(self, x):
        if (cases.rank() + self.step) % 2 == 0:
            a = self.branch_a(x)
            b = self.branch_b(x)
        else:
            b = self.branch_b(x)
            a = self.branch_a(x)
        return x + a + b


class ExpertLM(cases.VariantLM):
    """Three experts; from step 1 on, each rank leaves a different expert unused (rank- and step-dependent routing)."""

    def build(self):
        self.experts = paddle.nn.LayerList([paddle.nn.Linear(HIDDEN, HIDDEN) for _ in range(3)])

    def front(self, x):
        unused = (self.step + cases.rank()) % 3 if self.step > 0 else None
        for i, expert in enumerate(self.experts):
            x = x + expert(x) if i != unused else x
        return x


class RecomputeLM(cases.VariantLM):
    use_reentrant = True

    def run_block(self, i, x):
        # no dropout here; Paddle 2.6 cannot preserve RNG state on the CPU
        return recompute(self.blocks[i], x, use_reentrant=self.use_reentrant, preserve_rng_state=False)


class ReuseLM(cases.VariantLM):
    """One block called twice in one forward."""

    def run_block(self, i, x):
        return self.blocks[i](self.blocks[0](x) if i == 0 else x)


class DirectReadLM(cases.VariantLM):
    """Reads parameters without their owner's __call__: ``proj.forward(x)`` and ``F.linear(x, head.weight, head.bias)``."""

    def build(self):
        self.proj = paddle.nn.Linear(HIDDEN, HIDDEN)

    def front(self, x):
        return self.proj.forward(x)

    def logits(self, x):
        return paddle.nn.functional.linear(x, self.head.weight, self.head.bias)


def case_forward_order_differs_between_ranks_and_steps():
    """Rank 0 recorded branch_a first; whoever runs branch_b first waits for a task launched after a pending one, and is
    told once."""
    check_order_warned_per_parameter(RankOrderLM, "waited_out_of_order")


def case_expert_routing_leaves_experts_unused():
    """The unused expert's tasks wait for the next update; the layer after it needs its own while they are pending (told
    once)."""
    check_order_warned_per_parameter(ExpertLM, "waited_before_update", 6)


def case_ranks_run_different_forward_counts():
    """Eval and "generation" forwards on rank 0 only: one agreed order."""

    def after_step(run):
        if cases.rank() == 0:
            with paddle.no_grad():
                for i in range(1 + run.step % 3):
                    run.model(cases.batch(200 + i)[0])

    cases.assert_order_agreed(compare_on_off(steps=5, after_step=after_step)[1])


def case_forwards_without_backward_tables_bounded():
    """Eval before the first step and between steps, no_grad forwards in train() mode, grad-enabled ones in eval() mode,
    over 10 steps: internal tables keep their size (a leak would grow them every step)."""
    sizes = []
    registry = cases.overlap_module("sync_registry")

    def extra_forwards(model):
        model.eval()
        with paddle.no_grad():
            model(cases.batch(300)[0])
            model(cases.batch(301)[0])
        cases.lm_loss(model, 302)  # grad-enabled in eval mode, no backward
        model.train()
        with paddle.no_grad():
            model(cases.batch(303)[0])

    def micro_step(run):
        if run.step == 0 and run.micro == 0:
            extra_forwards(run.model)  # before the first step
        return cases.default_micro_step(run)

    def after_step(run):
        extra_forwards(run.model)
        impl = cases.overlap_impl(run.opt)
        if impl is not None:
            assert impl in registry.open_owners()
            # PENDING: the parameters with a pending sync
            tables = (impl.order, impl.units, registry.PENDING)
            counts = (impl.num_pending, sum(impl.read_paths.values()))
            hooks = (impl.num_hooks, cases.total_forward_pre_hooks(run.model))
            sizes.append(tuple(map(len, tables)) + counts + hooks)

    _, info = compare_on_off(steps=10, micro_step=micro_step, after_step=after_step)
    assert len(sizes) == 10 and len(set(sizes)) == 1, sorted(set(sizes))
    n = len(cases.optimizer_parameters(info.opt))
    order, units, registered, pending, reads, _, _ = sizes[0]
    assert order == n and 0 < units <= n, sizes[0]
    # the extra forwards waited for every unit: nothing pending, no read
    assert (pending, registered, reads) == (0, 0, 0), sizes[0]


def case_recompute_reentrant_and_not():
    """Blocks under recompute, reentrant and not."""
    for reentrant in (True, False):
        RecomputeLM.use_reentrant = reentrant
        compare_on_off(RecomputeLM)


def case_layer_called_twice_and_two_forwards_per_backward():
    """One block called twice per forward; two forwards per backward."""
    compare_on_off(ReuseLM)

    def two_forwards(run):
        first = cases.lm_loss(run.model, run.step, run.micro)
        second = cases.lm_loss(run.model, run.step, run.micro + 50)
        loss = (first + second) / 2
        (loss / run.acc_steps).backward()
        return loss

    compare_on_off(micro_step=two_forwards, acc_steps=2)


def case_skipped_steps_first_included():
    """Steps without an update (the first among them): one agreed order."""

    def update(run):
        if run.step not in (0, 3):
            run.opt.step()

    cases.assert_order_agreed(compare_on_off(steps=6, update=update)[1])


def case_weights_replaced_between_steps():
    """set_state_dict right after step() (broadcasts pending) on fleet's model, the user's or a sublayer, and averaged
    weights swapped in for an eval forward and back: a load waits for exactly the parameters it writes, before the
    write; the user's set_state_dict overrides run and survive disabling."""
    for bucket_mb in (BUCKET_MB, 0):
        loads, snapshots, custom_loads = [], {}, {"inner": 0, "block": 0}

        def with_custom_load(model):
            for name, layer in (("inner", model), ("block", model.blocks[1])):

                def custom(self, *args, _name=name, **kwargs):
                    custom_loads[_name] += 1
                    return type(self).set_state_dict(self, *args, **kwargs)

                layer.set_state_dict = types.MethodType(custom, layer)
            return model

        def after_step(run):
            model, checker, step, inner = run.model, run.checker, run.step, run.raw
            targets = {"fleet": model, "inner": inner, "block": inner.blocks[1]}
            if step == 0:  # state_dict() waits: safe to copy
                for name, layer in targets.items():
                    snapshots[name] = cloned_state(layer)
                return
            name = ("inner", "block", "fleet")[step % 3]
            assert checker is None or checker.num_unwaited() > 0
            before = dict(custom_loads)
            targets[name].set_state_dict(snapshots[name])  # roll back
            if name in custom_loads:  # the user's override ran
                assert custom_loads[name] == before[name] + 1, custom_loads
            if checker is not None:
                loads.append((name, checker.num_unwaited()))
            if name == "fleet":  # averaged weights for an eval, then back
                trained, old = cloned_state(model), snapshots[name]
                model.set_state_dict({k: (v + old[k]) * 0.5 for k, v in trained.items()})
                with paddle.no_grad():
                    model(cases.batch(400 + step)[0])
                model.set_state_dict(trained)

        with cases.lost_overlap_warnings() as lost:
            checker, on = compare_on_off(
                cases.Build(wrap=with_custom_load), enable=cases.v1(bucket_mb), after_step=after_step, steps=6
            )
        # the snapshots and loads read every parameter before the next forward in 3 of the 5 decided steps (no warning:
        # fewer than 4)
        cases.assert_overlap_lost(lost, on.opt, "iteration", lost_steps=3)
        # a model's load leaves nothing pending, a block's the others'
        assert {n for n, _ in loads} == {"fleet", "inner", "block"}, loads
        assert all(left == 0 for n, left in loads if n != "block"), loads
        if bucket_mb == 0:  # (buckets span the block and the rest)
            assert all(left > 0 for n, left in loads if n == "block"), loads
        # each parameter's write (Tensor.set_value) found its task waited
        assert checker.counts["writes"] > 0, checker.counts
        on.opt._set_broadcast_overlap(False)
        before = custom_loads["inner"]
        on.raw.set_state_dict(snapshots["inner"])
        assert custom_loads["inner"] == before + 1  # restored


def case_parameters_read_without_call():
    """proj.forward(x) and F.linear(x, head.weight, head.bias) inside the model's forward: each read waits for that
    parameter (attribute access waits), with and without strict, checked at the F.linear; no warning (run_cases fails a
    case on one)."""
    for strict in (False, True):
        checker, _ = compare_on_off(DirectReadLM, enable=cases.v1(BUCKET_MB, strict))
        assert checker.counts["checked"] > 0, checker.counts


def case_trainability_changed_mid_training():
    """Block 0 frozen after step 1, trainable again after step 3."""

    def after_step(run):
        if run.step in (1, 3):
            for p in run.raw.blocks[0].parameters():
                p.stop_gradient = run.step == 1

    cases.assert_order_agreed(compare_on_off(steps=5, after_step=after_step)[1])


def case_two_optimizers_share_one_model():
    """Two sharding optimizers over disjoint parameters of one model (V1 has no parameter groups), both overlapped; turned
    off in either order."""

    def run(overlap, off_order=()):
        model = cases.seeded(cases.TinyLM)
        body = [p for n, p in model.named_parameters() if n[:4] != "head"]
        opts = [fleet.distributed_optimizer(o) for o in (cases.adamw(body), cases.sgd(model.head.parameters()))]
        model = fleet.distributed_model(model)
        base = cases.total_forward_pre_hooks(model)
        for opt in opts if overlap else ():
            opt._set_broadcast_overlap(True, layers=model)
        done = train(cases.Build.of(model, cases.Optimizers(opts)))
        for i in off_order:
            opts[i]._set_broadcast_overlap(False)
        if overlap:
            assert cases.total_forward_pre_hooks(model) == base
            assert not any("set_state_dict" in vars(l) for l in model.sublayers(include_self=True))
        return done.losses, done.params

    off = run(False)
    for order in ((0, 1), (1, 0)):
        cases.assert_bitwise_equal(off, run(True, order), f"two optimizers {order}")


def case_toggle_on_off_on_mid_training():
    """Overlap turned off, on, and on again (replacing) between steps."""

    def after_step(run):
        if run.step == 1:
            run.opt._set_broadcast_overlap(False)
        elif run.step in (2, 3):  # at 3 again: replaces
            run.opt._set_broadcast_overlap(True, layers=run.model)

    cases.assert_order_agreed(compare_on_off(steps=6, after_step=after_step)[1])


def case_deepcopy_loads_copy_and_collected_optimizer_closed():
    """A deepcopy loads into itself with no-op hooks; an optimizer deleted with overlap on is closed: silent hooks, removed
    by the next _set_broadcast_overlap call (False, on another optimizer)."""
    info = train(cases.TinyLM, True, steps=2)
    model, opt = info.model, info.opt
    # a deepcopy (e.g. for EMA) loads into itself, not into the original
    twin = copy.deepcopy(model._layers)
    twin.set_state_dict({k: paddle.zeros_like(v) for k, v in twin.state_dict().items()})
    assert all(float(v.abs().sum()) == 0 for v in twin.state_dict().values())
    assert any(float(v.abs().sum()) > 0 for v in model.state_dict().values())
    # the copy keeps no reference to this overlap: its hooks are no-ops
    layers = twin.sublayers(include_self=True)
    twin_hooks = [h for l in layers for hooks in (l._forward_pre_hooks, l._state_dict_hooks) for h in hooks.values()]
    assert twin_hooks and all(h.__name__ == "_noop_hook" for h in twin_hooks)

    other = train(cases.TinyLM, True, steps=1)
    other_model = other.model
    hooked = cases.total_forward_pre_hooks(other_model)
    del other
    gc.collect()
    # the finalizer only marks it closed (no hook-dict mutation inside gc): its hooks are no-ops until the next explicit
    # call removes them
    assert hooked > 0 and cases.total_forward_pre_hooks(other_model) == hooked
    # (train() ended with model.state_dict(), a read of every parameter after the last step: an open owner would warn at
    # this forward that the overlap was lost; a closed one says nothing)
    with cases.lost_overlap_warnings() as lost, paddle.no_grad():
        other_model(cases.batch(0)[0])
    assert lost == [], f"a collected optimizer's no-op hooks warned: {lost}"
    third = fleet.distributed_optimizer(cases.adamw(other_model.parameters()))
    third._set_broadcast_overlap(False)
    assert cases.total_forward_pre_hooks(other_model) == 0
    assert type(other_model._layers.blocks[0].up._parameters).__name__ == "OrderedDict"  # unguarded
    registry = cases.overlap_module("sync_registry")
    assert registry.open_owners() == [cases.overlap_impl(opt)]

    opt._set_broadcast_overlap(False)
    assert registry.open_owners() == []


def case_error_after_update_keeps_the_ranks_in_step():
    """An error raised inside the hybrid optimizer's step after the update (after the inner step, where Paddle's mp/pp
    syncs run), caught by the user: the sync started at Paddle's own sync point inside the inner step, so with overlap
    on training goes on with the values of overlap off, on every rank (no refusal, no divergence)."""
    results = []
    for overlap in (False, True):
        info = train(cases.TinyLM, overlap, steps=1)
        model, opt, errors, calls, losses = info.model, info.opt, [], [], []
        inner = opt._inner_opt

        def step_then_fail():
            type(inner).step(inner)
            if not calls:
                calls.append("raised")
                raise RuntimeError("injected after the update")

        inner.step = step_then_fail
        # train() ends with model.state_dict(), right after the step: the next forward overlapped nothing (that step
        # lost)
        with cases.lost_overlap_warnings() as lost:
            for step in range(1, 4):
                loss = cases.lm_loss(model, step)
                losses.append(loss.numpy().tobytes())
                loss.backward()
                try:
                    opt.step()
                except RuntimeError as e:
                    errors.append(str(e))
                opt.clear_grad()
        if overlap:
            cases.assert_overlap_lost(lost, opt, "iteration")
        else:
            assert lost == [], lost
        assert len(calls) == 1 and errors == ["injected after the update"], errors
        results.append((losses, cases.digests(cases.snapshot(model))))
    assert results[0] == results[1], "overlap on differs from off after the error"
    assert cases.equal_in_group(results[1][1])


if __name__ == "__main__":
    sys.exit(cases.run_cases(cases.cases_of(globals())))
