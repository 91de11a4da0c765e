# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: broadcast buckets (``bucket_size_mb``), the ways public reports show flat or bucketed parameter storage
breaking. Each case runs ``compare_on_off`` with buckets (the checker maps a bucket's broadcast to the parameters in its
buffer) and checks the owner's bucket units (``buckets``); caps of a few KB give these tiny models several windows."""

import functools
import math
import sys
import types

import dygraph_sharding_stage1_broadcast_overlap_models as models
import numpy as np
import sharding_cases as cases
from hybrid_parallel_cpu_shim import cpu_tensor_fusion
from param_sync_checker import ParamSyncWaitChecker

import paddle
from paddle.distributed import fleet

KB, STEPS, HIDDEN, VOCAB = cases.KB, cases.STEPS, cases.HIDDEN, cases.VOCAB
impl_of = cases.overlap_impl


def dtype_name(tensor):
    name = str(tensor.dtype).rsplit(".", 1)[-1].lower()
    return {"fp32": "float32", "fp64": "float64"}.get(name, name)


def buckets(opt):
    """The owner's bucket units in launch order: ``unit``, ``buffer`` (its 1-D ``tensor``), ``src``, ``dtype``, ``length``,
    ``params`` (slot order), ``indices``, ``offsets`` (elements) and ``numels``."""
    found, index_of = [], impl_of(opt).index_of
    for u in cases.bucket_units(opt):
        b = types.SimpleNamespace(unit=u, buffer=u.tensor, src=u.src)
        b.params, b.offsets = list(u.params), cases.slot_offsets(u)
        b.dtype, b.length = dtype_name(u.tensor), int(u.tensor.shape[0])
        b.indices = [index_of(p) for p in u.params]
        b.numels = [math.prod(p.shape) for p in u.params]
        found.append(b)
    return found


def bucket_of(opt, param):
    """Index in ``buckets(opt)`` of the bucket holding ``param``, or None."""
    members = [{id(p) for p in b.params} for b in buckets(opt)]
    holding = [k for k, ids in enumerate(members) if id(param) in ids]
    assert len(holding) <= 1, (param.name, holding)
    return holding[0] if holding else None


def owner_rank(opt, param):
    """Global rank owning ``param`` (Paddle's V1 ``_rank2params``)."""
    hcg = fleet.get_hybrid_communicate_group()
    (r,) = [r for r, ps in cases.sharding_optimizer(opt)._rank2params.items() if any(p is param for p in ps)]
    return hcg.get_sharding_parallel_group().ranks[r]


def planned_windows(opt, cap_mb):
    """The windows (positions) the test expects: in ``order``, trainable, untied, non-empty parameters, each closed at
    ``cap_mb`` MB or more."""
    cap, params = int(cap_mb * (1 << 20)), cases.optimizer_parameters(opt)
    windows, window, size, placed = [], [], 0, set()
    for i in impl_of(opt).order:
        p = params[i]
        if p.stop_gradient or id(p) in placed or not math.prod(p.shape):
            continue
        placed.add(id(p))
        window.append(i)
        size += math.prod(p.shape) * p.element_size()
        if size >= cap:
            windows.append(window)
            window, size = [], 0
    return windows + [window] if window else windows


def assert_views_of_buffers(opt):
    """Every bucketed parameter is a slot of its bucket's 1-D buffer, of its dtype, in slot order, inside it, never
    overlapping, in one bucket."""
    seen = []
    for b in buckets(opt):
        assert len(b.buffer.shape) == 1, b.buffer.shape
        end = 0
        for p, off, n in zip(b.params, b.offsets, b.numels):
            assert dtype_name(p) == b.dtype, (p.name, b.dtype)
            assert off >= end, (b.unit.label, p.name, off, end)
            end = off + n
            seen.append(id(p))
        assert end <= b.length, (b.unit.label, end, b.length)
    assert len(seen) == len(set(seen)), "a parameter in two buckets"


def new_memory(model):
    """Block 0's up weight given new memory (same values): the parameter and the tensor whose memory it now shares."""
    p = model._layers.blocks[0].up.weight
    fresh = paddle.to_tensor(p.numpy())
    p.get_tensor()._share_data_with(fresh.get_tensor())
    return p, fresh


def compare_buckets(build=cases.TinyLM, cap=2 * KB, **kwargs):
    """``compare_on_off`` with buckets of ``cap``, then the buckets' memory checked; returns ``(checker, on run, its
    optimizer)``."""
    checker, on = cases.compare_on_off(build, enable=cases.v1(cap), **kwargs)
    assert_views_of_buffers(on.opt)
    return checker, on, on.opt


def assert_launched_per_bucket(checker, opt):
    """Each unit a bucket of several parameters, launched once per step (no broadcast per parameter); the ranks agree on
    every bucket's owner, length, offsets and sizes."""
    specs, n = buckets(opt), len(cases.optimizer_parameters(opt))
    assert specs and len(specs) < n, (len(specs), n)
    assert len(impl_of(opt).units) == len(specs)
    launched = checker.counts["launched"]
    assert launched == STEPS * len(specs), (launched, len(specs))
    layout = [v for s in specs for v in (s.src, s.length, *s.offsets, *s.numels)]
    assert cases.equal_in_group(layout), layout
    return specs


def check_per_parameter():
    """bucket_size_mb=0 on and off bitwise: no bucket, one unit per parameter, one broadcast per trainable parameter and
    step."""
    checker, on = cases.compare_on_off(enable=cases.v1(0))
    params = cases.optimizer_parameters(on.opt)
    cases.assert_per_parameter(on.opt)
    assert checker.counts["launched"] == STEPS * sum(not p.stop_gradient for p in params)


def head_wait_sabotaged(cap, keep_first=False):
    """The checker's violations in 3 steps after step 0 removed the head's overlap pre-hook (``keep_first``: replaced,
    ahead of the checker's, by one waiting for the first of the head's two units only)."""
    with ParamSyncWaitChecker() as checker:

        def sabotage(run):
            step, impl, head = run.step, impl_of(run.opt), run.raw.head
            mine = cases.overlap_hook_ids(head, checker)
            # one at step 0, none registered again (but the replacement)
            assert len(mine) == (1 if step == 0 else keep_first), (step, mine)
            if step != 0:
                return
            del head._forward_pre_hooks[mine[0]]
            units = impl.units_of_layer(head)
            assert len(units) == 2, units
            if keep_first:
                first = units[:1]

                def wait_first(_layer, _inputs):
                    impl.wait(first, "waited_in_forward")

                hook_id = head.register_forward_pre_hook(wait_first)._hook_id
                head._forward_pre_hooks.move_to_end(hook_id, last=False)

        cases.train(cases.TinyLM, True, enable=cases.v1(cap), steps=3, checker=checker, after_step=sabotage)
    return checker.violations


def frozen_inside_lm():
    """Block 0's up weight (not its bias) and block 1's norm weight frozen, between trainable neighbours in forward order."""
    model = cases.TinyLM()
    model.blocks[0].up.weight.stop_gradient = True
    model.blocks[1].norm.weight.stop_gradient = True
    return model


class Gate(paddle.nn.Layer):
    """x times a float64 scale of ones (cast to float32)."""

    def __init__(self):
        super().__init__()
        ones = paddle.nn.initializer.Constant(1.0)
        self.scale = self.create_parameter([HIDDEN], dtype="float64", default_initializer=ones)

    def forward(self, x):
        return x * self.scale.astype("float32")


class MixedDtypeLM(cases.TinyLM):
    """A float64 gate after each block."""

    def __init__(self):
        super().__init__()
        self.gates = paddle.nn.LayerList([Gate() for _ in self.blocks])

    def run_block(self, i, x):
        return self.gates[i](self.blocks[i](x))


class OddSizesLM(cases.TinyLM):
    """One-element, odd-length and column parameters (no 0-d one: Paddle's V1 partition fails on an empty shape; the unit
    tests cover 0-d slots)."""

    def __init__(self):
        super().__init__()
        for name, shape, value in (
            ("one", [1], 1.0),
            ("scalar", [1, 1], 0.5),
            ("odd", [7], 0.1),
            ("col", [HIDDEN, 1], 0.2),
        ):
            setattr(self, name, self.create_parameter(shape, default_initializer=paddle.nn.initializer.Constant(value)))

    def embedded(self, tokens):
        x = self.embed(tokens) * self.one * self.scalar
        return x + paddle.matmul(x, self.col) * self.odd.sum()


def decay_by_name(params):
    """AdamW decaying only the parameters named ``*w_0*``."""
    return cases.adamw(params, learning_rate=0.02, weight_decay=0.1, apply_decay_param_fun=lambda name: "w_0" in name)


def head_learning_rate_3():
    model = cases.TinyLM()
    model.head.weight.optimize_attr["learning_rate"] = 3.0
    return model


def case_on_off_bitwise_with_buckets():
    """Several windows (2 KB; also AdamW with a decay filter and a per-parameter learning rate: V1 has no dict groups; acc
    2 and minimize: the patch's script, dygraph_sharding_stage1_broadcast_overlap.py), one window (256 MB), float32 and
    float64 parameters, odd sizes: bitwise equal to off (the optimizer's state too: it moves the parameters); one
    broadcast per bucket of one (window, owner, dtype), each read waited; 0 is one broadcast per parameter."""
    for model, cap, optimizer in (
        (cases.TinyLM, 2 * KB, cases.adamw),
        (head_learning_rate_3, 2 * KB, decay_by_name),
        (cases.TinyLM, 256, cases.adamw),
        # SGD: Paddle's CPU AdamW has no float64 path with a float32 rate
        (MixedDtypeLM, 2 * KB, cases.sgd),
        (OddSizesLM, 0.25 * KB, cases.adamw),
        (OddSizesLM, 2 * KB, cases.adamw),
    ):
        build = cases.Build(model, optimizer=optimizer)
        checker, _, opt = compare_buckets(build, cap)
        specs = assert_launched_per_bucket(checker, opt)
        params = cases.optimizer_parameters(opt)
        dtypes = {s.dtype for s in specs}
        assert len(dtypes) == 1 + (model is MixedDtypeLM), dtypes
        n = len(params)  # every parameter in a bucket:
        assert sorted(i for s in specs for i in s.indices) == list(range(n))
        # one bucket per (window, owner, dtype) holding parameters
        windows = planned_windows(opt, cap)
        window_of = {i: w for w, ps in enumerate(windows) for i in ps}
        keys = []
        for s in specs:
            (window,) = {window_of[i] for i in s.indices}
            assert {owner_rank(opt, p) for p in s.params} == {s.src}, s.src
            keys.append((window, s.src, s.dtype))
        assert len(keys) == len(set(keys)), keys
        wanted = {(window_of[i], owner_rank(opt, p), dtype_name(p)) for i, p in enumerate(params)}
        assert set(keys) == wanted, (keys, wanted)
        assert (len(windows) == 1) == (cap == 256), windows
    check_per_parameter()


def case_checker_catches_a_pending_bucket():
    """Negative control: the head's overlap pre-hook removed (per parameter), or replaced by one waiting for the first of
    its buckets only (a cap of exactly the head's weight puts its bias in the next window's): the checker reports the
    head's read of a pending broadcast (the wait itself: unit tests)."""
    head_weight_mb = HIDDEN * VOCAB * 4 / (1 << 20)
    for cap, keep_first in ((0, False), (head_weight_mb, True)):
        violations = head_wait_sabotaged(cap, keep_first)
        assert any(w.startswith("forward:") and "head" in w for w, _ in violations), violations[:5]


def case_tied_parameter_one_slot():
    """A weight two called layers share (bitwise, also under accumulation) has one slot, in one bucket of its owner, whose
    unit both wait for."""
    compare_buckets(models.TiedLM, acc_steps=2)
    _, on, opt = compare_buckets(models.TiedLM)
    inner, specs, impl = on.raw, buckets(opt), impl_of(opt)
    tied = inner.mix_a.weight
    assert tied is inner.mix_b.weight
    (i,) = [i for i, p in enumerate(cases.optimizer_parameters(opt)) if p is tied]
    # one slot: in one bucket, once
    assert [j for s in specs for j in s.indices if j == i] == [i]
    spec = specs[bucket_of(opt, tied)]
    assert sum(p is tied for p in spec.params) == 1
    assert spec.src == owner_rank(opt, tied)
    (unit,) = [u for u in impl.units if i in u.indices]
    assert unit is spec.unit
    for layer in (inner.mix_a, inner.mix_b):
        assert any(u is unit for u in impl.units_of_layer(layer))


def case_frozen_and_trainable_share_windows_under_weight_decay():
    """Frozen parameters get no slot and stay bit-identical under weight decay; one frozen after planning keeps its slot
    and stays so too."""
    decaying = functools.partial(cases.adamw, learning_rate=0.05, weight_decay=0.5)

    def frozen(model):
        return model.blocks[0].up.weight, model.blocks[1].norm.weight

    def freeze_later(run):
        if run.step == 1:
            p = run.raw.blocks[1].down.weight
            p.stop_gradient = True
            freeze_later.value = p.numpy().copy()

    initial = cases.seeded(frozen_inside_lm)
    values = [p.numpy().copy() for p in frozen(initial)]
    _, on, opt = compare_buckets(cases.Build(frozen_inside_lm, optimizer=decaying), after_step=freeze_later, steps=4)
    for p, value in zip(frozen(on.raw), values):
        assert p.numpy().tobytes() == value.tobytes(), p.name
        assert bucket_of(opt, p) is None, p.name
    p = on.raw.blocks[1].down.weight
    assert p.numpy().tobytes() == freeze_later.value.tobytes()
    assert bucket_of(opt, p) is not None


def case_checkpoint_across_bucket_modes():
    """Saved and loaded with or without buckets: bitwise equal to one run; a load handing new memory is rebound locally
    (``stats["rebound"]``)."""
    total, cut = STEPS + 2, 2
    base, shapes = cases.train(steps=total), {}
    for saved, loaded in ((2 * KB, None), (None, 2 * KB), (2 * KB, 2 * KB)):
        first = cases.train(cases.TinyLM, saved is not None, enable=cases.v1(saved), steps=cut)
        fresh, opt, state = cases.save_and_load_fresh(first.model, first.opt)
        shapes[saved] = {k: list(v.shape) for k, v in state.items()}
        handed = []

        def loads(run):
            if run.step == cut:  # by copy, right after a launch
                run.raw.set_state_dict({k: v.clone() for k, v in run.raw.state_dict().items()})
            if run.step == cut + 1:  # by handing a new tensor
                handed.append(new_memory(run.model)[0])

        with cases.lost_overlap_warnings() as lost:
            with ParamSyncWaitChecker() as checker:
                rest = cases.train(
                    cases.Build.of(fresh, opt),
                    loaded is not None,
                    enable=cases.v1(loaded),
                    steps=total - cut,
                    first_step=cut,
                    checker=checker,
                    after_step=loads if loaded is not None else None,
                )
        assert checker.violations == [], checker.violations[:5]
        cases.assert_bitwise_equal(
            (base.losses, base.params),
            (first.losses + rest.losses, rest.params),
            f"saved with {saved} MB, loaded with {loaded} MB",
        )
        if loaded is None:
            assert lost == [], lost
            continue
        # the load by copy read every parameter right after a step: lost
        cases.assert_overlap_lost(lost, opt, "iteration")
        impl = impl_of(opt)
        # replaced on every rank: rebound into its slot once, at the next launch, and it lives in its bucket again
        assert impl.stats["rebound"] == 1, impl.stats
        assert bucket_of(opt, handed[0]) is not None
        assert_views_of_buffers(opt)
        stats = [impl.stats["launched"], len(impl.units)]
        assert cases.equal_in_group(stats), stats
    assert shapes[2 * KB] == shapes[None]


def case_tensor_fusion_slices_bitwise_equal():
    """With tensor fusion (and the TEST-ONLY CPU shim that lets Paddle build fused buffers here) each window sends slices
    of Paddle's fused buffers, bitwise equal to off; bucket_size_mb=0 sends one per parameter there."""
    with cases.sharding_configs(tensor_fusion=True), cpu_tensor_fusion():
        for cap in (2 * KB, 256):
            checker, _, opt = compare_buckets(cap=cap)
            inner = cases.sharding_optimizer(opt)
            assert inner.tensor_fusion and inner._rank2fused
            specs = assert_launched_per_bucket(checker, opt)
            cases.assert_slices_of_fused(opt, [s.unit for s in specs])
        check_per_parameter()


def case_memory_replaced_on_one_rank_or_every_rank_rebound_locally():
    """New memory for a bucketed parameter, on rank 1 or on every rank: put back into its slot locally
    (``stats["rebound"]``), bitwise equal."""
    for ranks in ({1}, {0, 1}):
        replaced = []

        def replace(run, ranks=ranks, replaced=replaced):
            if run.step == 1 and cases.rank() in ranks:
                p, fresh = new_memory(run.model)
                assert p.data_ptr() == fresh.data_ptr()  # out of its slot
                if impl_of(run.opt) is not None:  # (the off run too)
                    assert bucket_of(run.opt, p) is not None
                    replaced.append((p, fresh))  # keep the new memory alive

        _, _, opt = compare_buckets(after_step=replace)
        impl = impl_of(opt)
        assert impl.stats["rebound"] == int(cases.rank() in ranks), (ranks, impl.stats)
        if replaced:  # back in its slot: no longer the fresh memory
            p, fresh = replaced[0]
            assert p.data_ptr() != fresh.data_ptr()
        stats = [impl.stats["launched"], len(buckets(opt))]
        assert cases.equal_in_group(stats), stats
        assert stats[0] == STEPS * len(impl.units), impl.stats


def case_dtype_change_refused_on_every_rank_then_retrained():
    """``model.to(dtype="float64")`` between steps: step() raises on every rank before any broadcast; off and on again, it
    plans anew and trains."""
    for cap in (0, 2 * KB):
        checker = ParamSyncWaitChecker()
        with checker, cases.lost_overlap_warnings() as lost:
            # (train() ends with model.state_dict(): every unit waited by that read, so the next forward finds that
            # step's overlap lost)
            on = cases.train(cases.Build(optimizer=cases.sgd), True, enable=cases.v1(cap), steps=2, checker=checker)
            model, opt, impl = on.model, on.opt, impl_of(on.opt)
            sent = checker.counts["launched"]
            assert sent == impl.stats["launched"] == 2 * len(impl.units) > 0
            model._layers.to(dtype="float64")
            cases.lm_loss(model, 2).backward()
            with cases.raises(ValueError, "_set_broadcast_overlap(False)", "float32", "float64") as refused:
                opt.step()
            opt.clear_grad()
            assert checker.counts["launched"] == sent, checker.counts
        cases.assert_overlap_lost(lost, opt, "iteration")
        named = [p.name for p in cases.optimizer_parameters(opt) if f" {p.name} " in refused.message]
        assert len(named) == 1, (named, refused.message)
        assert impl.stats["launched"] == 2 * len(impl.units), impl.stats
        assert impl.num_pending == 0
        # every rank refused it: the next collective still pairs up
        assert cases.equal_in_group([1])
        opt._set_broadcast_overlap(False)
        opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=cap)
        with ParamSyncWaitChecker() as checker:
            run = cases.train(cases.Build.of(model, opt), steps=2, first_step=3, checker=checker)
        assert checker.violations == [], checker.violations[:5]
        assert checker.counts["launched"] > 0 and checker.num_unwaited() == 0
        for v in run.params.values():
            assert v.dtype == np.float64 and np.isfinite(v).all(), v.dtype
        assert cases.equal_in_group(cases.digests(run.params))
        assert {s.dtype for s in buckets(opt)} <= {"float64"}
        assert_views_of_buffers(opt)
        opt._set_broadcast_overlap(False)


if __name__ == "__main__":
    sys.exit(cases.run_cases(cases.cases_of(globals())))
