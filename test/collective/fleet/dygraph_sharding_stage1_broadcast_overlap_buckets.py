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

"""Per-rank script: broadcast buckets (``bucket_size_mb``), the ways public
reports show flat or bucketed parameter storage breaking.

Each case: overlap with buckets on vs overlap off bitwise equal (numpy
copies), no read of a parameter whose bucket is still pending (the wait
checker maps a bucket's broadcast to the parameters living in its buffer),
and the buckets checked directly, from the owner's public units (each
bucket unit's ``tensor`` is its 1-D buffer, ``params`` its members, ``src``
its owner rank). Small caps (a few KB) give these tiny models several
windows. Cases run by env ``BROADCAST_OVERLAP_CASES`` (all by
default) under ``python -m paddle.distributed.launch --nproc_per_node 2``.
"""

import contextlib
import math
import os
import sys
import tempfile
import types
import zlib

import numpy as np
from broadcast_overlap_checker import BroadcastWaitChecker
from broadcast_overlap_training import (
    HIDDEN,
    STEPS,
    TinyLM,
    adamw,
    all_ranks_equal,
    assert_bitwise_equal,
    assert_lost_overlap_warning,
    bucket_units,
    build_with_initial_state,
    cases_of,
    compare_on_off,
    lm_loss,
    lost_overlap_warnings,
    optimizer_parameters,
    overlap_impl,
    per_parameter,
    rank,
    run_cases,
    sharding_optimizer,
    slot_offsets,
    train,
)
from dygraph_sharding_stage1_broadcast_overlap_models import (
    TiedLM,
    rename_state_keys,
)
from hybrid_parallel_cpu_shim import cpu_tensor_fusion

import paddle
from paddle.distributed import fleet

KB = 1.0 / 1024  # in MB


# ----------------------------------------------------------------------
# set-up
def bucketed(build, bucket_size_mb, **kwargs):
    """(model, opt) as ``train`` builds them, overlap on with buckets."""
    run = train(
        build, overlap=True, bucket_mb=bucket_size_mb, steps=0, **kwargs
    )
    return run.model, run.opt


def compare_buckets(build=TinyLM, bucket_size_mb=2 * KB, **kwargs):
    """``compare_on_off`` with buckets. Returns ``(checker, model, opt,
    off run)``."""
    checker, on = compare_on_off(build, bucket_mb=bucket_size_mb, **kwargs)
    return checker, on.model, on.opt, on.off


def params_of(opt):
    """The optimizer's parameter list (positions of the overlap's units)."""
    return optimizer_parameters(opt)


def dtype_name(tensor):
    name = str(tensor.dtype).rsplit(".", 1)[-1].lower()
    return {"fp32": "float32", "fp64": "float64"}.get(name, name)


def numel(param):
    return math.prod(int(d) for d in param.shape)


def buckets(opt):
    """The owner's buckets, in launch order, from its public units: per
    bucket unit its ``buffer`` (the unit's 1-D ``tensor``), ``src`` (owner
    rank), ``dtype``, ``length``, ``params`` (members, in slot order),
    ``indices`` (their positions), ``offsets`` (where each member's memory
    starts in the buffer, in elements) and ``numels``; [] per parameter."""
    impl = overlap_impl(opt)
    found = []
    for unit in bucket_units(opt):
        buf = unit.tensor
        found.append(
            types.SimpleNamespace(
                unit=unit,
                buffer=buf,
                src=unit.src,
                dtype=dtype_name(buf),
                length=int(buf.shape[0]),
                params=list(unit.params),
                indices=[impl.index_of(p) for p in unit.params],
                offsets=slot_offsets(unit),
                numels=[numel(p) for p in unit.params],
            )
        )
    return found


def bucket_of(opt, param):
    """Index in ``buckets(opt)`` of the bucket holding ``param``, or None."""
    holding = [
        k
        for k, b in enumerate(buckets(opt))
        if any(p is param for p in b.params)
    ]
    assert len(holding) <= 1, (param.name, holding)
    return holding[0] if holding else None


def owner_rank(opt, param):
    """Global rank that owns ``param`` (Paddle's V1 partition,
    ``_rank2params``, in the sharding group's ranks)."""
    from paddle.distributed import fleet as _fleet

    group = _fleet.get_hybrid_communicate_group().get_sharding_parallel_group()
    inner = sharding_optimizer(opt)
    (r,) = [
        r for r, ps in inner._rank2params.items() if any(p is param for p in ps)
    ]
    return group.ranks[r]


def planned_windows(opt, cap_mb):
    """The windows of the agreed order, reconstructed by the test: in
    ``order``, the trainable, untied, non-empty parameters, a window closed
    once it holds ``cap_mb`` MB or more (positions, per window)."""
    cap, params = int(cap_mb * (1 << 20)), params_of(opt)
    windows, window, size, placed = [], [], 0, set()
    for i in overlap_impl(opt).order:
        p = params[i]
        if p.stop_gradient or id(p) in placed or not numel(p):
            continue
        placed.add(id(p))
        window.append(i)
        size += numel(p) * p.element_size()
        if size >= cap:
            windows.append(window)
            window, size = [], 0
    return windows + [window] if window else windows


def assert_views_of_buffers(opt):
    """Every bucketed parameter's memory is a slot of its bucket's 1-D
    buffer, of the buffer's dtype, members in slot order, slots inside the
    buffer and never overlapping; no parameter in two buckets."""
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


def digest(params):
    return [zlib.crc32(params[k].tobytes()) for k in sorted(params)]


# ----------------------------------------------------------------------
# models
class FrozenInsideLM(TinyLM):
    """Block 0's up-projection weight frozen, its bias trainable, between
    trainable neighbours in forward order."""

    def __init__(self):
        super().__init__()
        self.blocks[0].up.weight.stop_gradient = True
        self.blocks[1].norm.weight.stop_gradient = True


class MixedDtypeLM(TinyLM):
    """A float64 gate per block next to float32 parameters."""

    def __init__(self):
        super().__init__()
        self.gates = paddle.nn.LayerList(
            [_Gate() for _ in range(len(self.blocks))]
        )

    def forward(self, tokens):
        x = self.embed(tokens)
        for block, gate in zip(self.blocks, self.gates):
            x = gate(block(x))
        return self.head(x)


class _Gate(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.scale = self.create_parameter(
            [HIDDEN],
            dtype="float64",
            default_initializer=paddle.nn.initializer.Constant(1.0),
        )

    def forward(self, x):
        return x * self.scale.astype("float32")


class OddSizesLM(TinyLM):
    """One-element, odd-length and column parameters (no 0-d parameter:
    Paddle's V1 partition multiplies the shape's dims with reduce() and
    fails on an empty shape; the unit tests cover 0-d slots)."""

    def __init__(self):
        super().__init__()
        self.one = self.create_parameter(
            [1], default_initializer=paddle.nn.initializer.Constant(1.0)
        )
        self.scalar = self.create_parameter(
            [1, 1], default_initializer=paddle.nn.initializer.Constant(0.5)
        )
        self.odd = self.create_parameter(
            [7], default_initializer=paddle.nn.initializer.Constant(0.1)
        )
        self.col = self.create_parameter(
            [HIDDEN, 1], default_initializer=paddle.nn.initializer.Constant(0.2)
        )

    def forward(self, tokens):
        x = self.embed(tokens) * self.one * self.scalar
        x = x + paddle.matmul(x, self.col) * self.odd.sum()
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# ----------------------------------------------------------------------
# cases
def case_on_off_bitwise_with_buckets():
    """Several windows (2 KB), one window (default cap), acc 2, minimize:
    bitwise equal to off; one broadcast per bucket, each read waited."""
    for cap, kwargs in (
        (2 * KB, {}),
        (2 * KB, {"acc_steps": 2}),
        (2 * KB, {"use_minimize": True}),
        (256, {}),
    ):
        checker, model, opt, _ = compare_buckets(TinyLM, cap, **kwargs)
        specs, params = buckets(opt), params_of(opt)
        n = len(params)
        assert specs and len(specs) < n, (len(specs), n)
        # every parameter in a bucket: the units are the buckets
        assert len(overlap_impl(opt).units) == len(specs)
        assert sorted(i for s in specs for i in s.indices) == list(range(n))
        # one bucket per (window, owner, dtype) holding parameters: each
        # bucket's members lie in one window, have its owner and dtype
        windows = planned_windows(opt, cap)
        window_of = {i: w for w, ps in enumerate(windows) for i in ps}
        keys = []
        for s in specs:
            (window,) = {window_of[i] for i in s.indices}
            assert {owner_rank(opt, p) for p in s.params} == {s.src}, s.src
            keys.append((window, s.src, s.dtype))
        assert len(keys) == len(set(keys)), keys
        wanted = {
            (window_of[i], owner_rank(opt, p), dtype_name(p))
            for i, p in enumerate(params)
        }
        assert set(keys) == wanted, (keys, wanted)
        # the launches were the buckets, nothing per parameter
        assert checker.counts["launched"] == STEPS * len(specs), (
            checker.counts,
            len(specs),
        )
        assert_views_of_buffers(opt)
        assert all_ranks_equal([s.length for s in specs])
        if cap == 256:
            assert len(windows) == 1, windows
        else:
            assert len(windows) > 1, windows


def case_checker_catches_a_pending_bucket():
    """Negative control: a layer whose wait is removed reads its pending
    bucket, and the checker reports it."""
    model, opt = bucketed(TinyLM, 2 * KB)
    with BroadcastWaitChecker() as checker:

        def drop_head_wait(step, model, opt):
            # remove the overlap's pre-hook of the head (every pre-hook of
            # the head but the checker's): the head's forward no longer
            # waits before the checker's hook looks
            head = model._layers.head
            hooks = head._forward_pre_hooks
            mine = [h for h in hooks if not checker.owns_hook(head, h)]
            assert len(mine) == (1 if step == 0 else 0), (step, mine)
            for hook_id in mine:
                del hooks[hook_id]

        train(
            model=model,
            opt=opt,
            steps=3,
            checker=checker,
            on_step=drop_head_wait,
        )
    assert any(
        w == "forward:head" or w.startswith("forward:") and "head" in w
        for w, _ in checker.violations
    ), checker.violations[:5]


def case_tied_parameter_one_slot():
    checker, model, opt, _ = compare_buckets(TiedLM, 2 * KB)
    inner = model._layers
    params, specs = params_of(opt), buckets(opt)
    tied = inner.mix_a.weight
    assert tied is inner.mix_b.weight
    position = [i for i, p in enumerate(params) if p is tied]
    assert len(position) == 1, position
    # one slot: in one bucket, once
    slots = [i for s in specs for i in s.indices if i == position[0]]
    assert slots == position, slots
    spec = specs[bucket_of(opt, tied)]
    assert sum(p is tied for p in spec.params) == 1
    assert spec.src == owner_rank(opt, tied)
    assert_views_of_buffers(opt)
    impl = overlap_impl(opt)
    units_a = impl.units_of_layer(inner.mix_a)
    units_b = impl.units_of_layer(inner.mix_b)
    (unit,) = [u for u in impl.units if position[0] in u.indices]
    assert unit is spec.unit
    assert any(u is unit for u in units_a) and any(u is unit for u in units_b)


def case_frozen_and_trainable_share_windows_under_weight_decay():
    """Frozen parameters between trainable ones get no slot and stay
    bit-identical under weight decay; one frozen after planning stays in
    its bucket and bit-identical too."""

    def decaying(params):
        return paddle.optimizer.AdamW(
            learning_rate=0.05, parameters=params, weight_decay=0.5
        )

    def freeze_later(step, model, opt):
        if step == 1:
            model._layers.blocks[1].down.weight.stop_gradient = True
            freeze_later.value = (
                model._layers.blocks[1].down.weight.numpy().copy()
            )

    initial = build_with_initial_state(FrozenInsideLM)
    frozen_init = {
        "up.w": initial.blocks[0].up.weight.numpy().copy(),
        "norm.w": initial.blocks[1].norm.weight.numpy().copy(),
    }
    _, model, opt, _ = compare_buckets(
        FrozenInsideLM,
        2 * KB,
        make_optimizer=decaying,
        on_step=freeze_later,
        steps=4,
    )
    inner = model._layers
    for name, p in (
        ("up.w", inner.blocks[0].up.weight),
        ("norm.w", inner.blocks[1].norm.weight),
    ):
        assert p.numpy().tobytes() == frozen_init[name].tobytes(), name
        assert bucket_of(opt, p) is None, name
    later = inner.blocks[1].down.weight
    assert later.numpy().tobytes() == freeze_later.value.tobytes()
    assert bucket_of(opt, later) is not None


def case_mixed_dtypes_never_share_a_buffer():
    """float32 and float64 parameters (SGD: Paddle's CPU AdamW has no
    float64-parameter path with a float32 learning rate, and no float16 or
    bfloat16 kernel)."""

    def sgd(params):
        return paddle.optimizer.SGD(learning_rate=0.05, parameters=params)

    _, model, opt, _ = compare_buckets(MixedDtypeLM, 2 * KB, make_optimizer=sgd)
    dtypes = set()
    for spec in buckets(opt):
        for p in spec.params:
            assert str(p.dtype) == str(spec.buffer.dtype), (
                p.name,
                spec.buffer.dtype,
            )
        dtypes.add(spec.dtype)
    assert dtypes == {"float32", "float64"}, dtypes
    assert all(
        str(g.scale.dtype).endswith("float64") for g in model._layers.gates
    )
    assert_views_of_buffers(opt)


def case_odd_sizes_ranks_agree_on_lengths():
    for cap in (0.25 * KB, 2 * KB):
        _, model, opt, _ = compare_buckets(OddSizesLM, cap)
        assert_views_of_buffers(opt)
        layout = [
            v
            for s in buckets(opt)
            for v in (s.src, s.length, *s.offsets, *s.numels)
        ]
        assert all_ranks_equal(layout), layout
        inner = model._layers
        assert (
            inner.scalar.shape == [1, 1]
            and inner.one.shape == [1]
            and inner.col.shape == [HIDDEN, 1]
        )


def case_layer_spanning_two_buckets_waits_for_both():
    """A cap of exactly the head's weight closes the window after it, so the
    head's bias lands in the next window's bucket: the head waits for both
    (and a sabotaged head that waits only for the first is caught)."""
    head_weight_mb = (
        HIDDEN * 32 * 4 / float(1 << 20)
    )  # Linear(HIDDEN, VOCAB=32) float32
    _, model, opt, _ = compare_buckets(TinyLM, head_weight_mb)
    impl, head = overlap_impl(opt), model._layers.head
    units = impl.units_of_layer(head)
    assert len(units) == 2, units
    holding = {bucket_of(opt, p) for p in head.parameters()}
    assert len(holding) == 2 and None not in holding, holding
    assert {id(buckets(opt)[k].unit) for k in holding} == {id(u) for u in units}

    model2, opt2 = bucketed(TinyLM, head_weight_mb)
    with BroadcastWaitChecker() as checker:

        def first_only(step, model, opt):
            # the head's pre-hook replaced by one that waits for its first
            # unit only, ahead of the checker's hook
            if step != 0:
                return
            impl, head = overlap_impl(opt), model._layers.head
            hooks = head._forward_pre_hooks
            mine = [h for h in hooks if not checker.owns_hook(head, h)]
            assert len(mine) == 1, mine
            del hooks[mine[0]]
            first = impl.units_of_layer(head)[:1]

            def wait_first(_layer, _inputs):
                impl.wait(first, "waited_in_forward")

            handle = head.register_forward_pre_hook(wait_first)
            hooks.move_to_end(handle._hook_id, last=False)

        train(
            model=model2, opt=opt2, steps=3, checker=checker, on_step=first_only
        )
    assert any("head" in w for w, _ in checker.violations), checker.violations[
        :5
    ]


def case_optimizer_state_and_decay_selection_on_views():
    """AdamW moments keyed by name, a decay filter and per-parameter learning
    rates work on views: the optimizer's state equals the off run's, key by
    key (V1 refuses dict parameter groups upstream: 'Do not support
    param_groups now')."""

    def make(params):
        return paddle.optimizer.AdamW(
            learning_rate=0.02,
            parameters=params,
            weight_decay=0.1,
            apply_decay_param_fun=lambda name: "w_0" in name,
        )

    def build():
        model = TinyLM()
        model.head.weight.optimize_attr["learning_rate"] = 3.0
        return model

    off_losses, off_params, off_info = train(
        build, overlap=False, make_optimizer=make
    )
    model, opt = bucketed(build, 2 * KB, make_optimizer=make)
    with BroadcastWaitChecker() as checker:
        on_losses, on_params, _ = train(model=model, opt=opt, checker=checker)
    assert_bitwise_equal(
        (off_losses, off_params), (on_losses, on_params), "optimizer state"
    )
    assert checker.violations == []
    rename = {
        p.name: q.name
        for p, q in zip(off_info["model"].parameters(), model.parameters())
    }
    off_state, on_state = off_info["opt"].state_dict(), opt.state_dict()
    for key, value in off_state.items():
        if not hasattr(value, "numpy"):
            continue
        owner = max(
            (n for n in rename if key.startswith(n)), key=len, default=None
        )
        if owner is None:
            continue
        other = rename[owner] + key[len(owner) :]
        assert other in on_state, other
        assert value.numpy().tobytes() == on_state[other].numpy().tobytes(), key
    assert_views_of_buffers(opt)


def case_checkpoint_across_bucket_modes():
    """Saved with buckets, loaded without (and the other way round): same
    keys, shapes and values; training continues bitwise equal to an
    uninterrupted run. Loads into bucketed parameters: set_state_dict copies
    into the views; a load that hands new tensors (shares a fresh tensor's
    memory into a parameter) is found at the next launch and the parameter
    is put back into its slot there, locally, with no collective and no
    warning (``stats["rebound"]``)."""
    total, cut = STEPS + 2, 2
    base_losses, base_params, _ = train(TinyLM, overlap=False, steps=total)
    states = {}
    for saved_with, loaded_with in (
        (2 * KB, None),
        (None, 2 * KB),
        (2 * KB, 2 * KB),
    ):
        if saved_with is None:
            first_losses, _, info = train(TinyLM, overlap=False, steps=cut)
            model, opt = info["model"], info["opt"]
        else:
            model, opt = bucketed(TinyLM, saved_with)
            first_losses, _, _ = train(model=model, opt=opt, steps=cut)
        with tempfile.TemporaryDirectory() as tmp:
            mpath = os.path.join(tmp, f"m{rank()}.pdparams")
            opath = os.path.join(tmp, f"o{rank()}.pdopt")
            paddle.save(model._layers.state_dict(), mpath)
            paddle.save(opt.state_dict(), opath)
            model_state, opt_state = paddle.load(mpath), paddle.load(opath)
        paddle.distributed.barrier()
        states[saved_with] = {k: list(v.shape) for k, v in model_state.items()}
        names = {k: p.name for k, p in model._layers.named_parameters()}
        fresh = TinyLM()
        fresh.set_state_dict(model_state)
        fresh_opt = fleet.distributed_optimizer(adamw(fresh.parameters()))
        renames = {names[k]: p.name for k, p in fresh.named_parameters()}
        fresh_opt.set_state_dict(rename_state_keys(opt_state, renames))
        fresh = fleet.distributed_model(fresh)
        handed = []

        def loads(step, model, opt):
            inner = model._layers
            if step == cut:  # by copy, right after a launch
                inner.set_state_dict(
                    {k: v.clone() for k, v in inner.state_dict().items()}
                )
            if step == cut + 1:  # by handing a new tensor
                p = inner.blocks[0].up.weight
                new = paddle.to_tensor(p.numpy())
                p.get_tensor()._share_data_with(new.get_tensor())
                handed.append(p)

        if loaded_with is not None:
            fresh_opt._set_broadcast_overlap(
                True, layers=fresh, bucket_size_mb=loaded_with
            )
        with lost_overlap_warnings() as lost, BroadcastWaitChecker() as checker:
            rest_losses, rest_params, _ = train(
                model=fresh,
                opt=fresh_opt,
                steps=total - cut,
                first_step=cut,
                checker=checker,
                on_step=loads if loaded_with is not None else None,
            )
        what = f"saved with {saved_with} MB, loaded with {loaded_with} MB"
        assert checker.violations == [], checker.violations[:5]
        assert_bitwise_equal(
            (base_losses, base_params),
            (first_losses + rest_losses, rest_params),
            what,
        )
        if loaded_with is not None:
            # the load by copy read every parameter right after a step (its
            # state_dict()): said once; no other warning (run_cases)
            assert_lost_overlap_warning(lost, "iteration")
            impl = overlap_impl(fresh_opt)
            # replaced on every rank: rebound into its slot once, at the
            # next launch, and it lives in its bucket again
            assert impl.stats["rebound"] == 1, impl.stats
            assert bucket_of(fresh_opt, handed[0]) is not None
            assert_views_of_buffers(fresh_opt)
            assert all_ranks_equal([impl.stats["launched"], len(impl.units)])
        else:
            assert lost == [], lost
    assert states[2 * KB] == states[None]


def case_bucket_size_zero_is_per_parameter():
    checker, model, opt, _ = compare_buckets(TinyLM, 0)
    assert per_parameter(opt) and buckets(opt) == []
    n = sum(1 for p in params_of(opt) if not p.stop_gradient)
    assert len(overlap_impl(opt).units) == len(params_of(opt))
    assert checker.counts["launched"] == STEPS * n


def case_bad_bucket_size_raises_before_any_change():
    model = fleet.distributed_model(TinyLM())
    opt = fleet.distributed_optimizer(adamw(model.parameters()))
    hooks = sum(
        len(l._forward_pre_hooks) for l in model.sublayers(include_self=True)
    )
    for bad, error in (
        (-1, ValueError),
        (float("nan"), ValueError),
        ("256", TypeError),
        (True, TypeError),
    ):
        try:
            opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=bad)
        except error as e:
            assert "bucket_size_mb" in str(e), str(e)
        else:
            raise AssertionError(f"bucket_size_mb={bad!r} accepted")
    assert overlap_impl(opt) is None
    assert (
        sum(
            len(l._forward_pre_hooks)
            for l in model.sublayers(include_self=True)
        )
        == hooks
    )


@contextlib.contextmanager
def tensor_fusion():
    """sharding_configs.tensor_fusion = True for the optimizers built inside,
    with the TEST-ONLY CPU shim that lets Paddle build fused buffers here."""
    config = fleet.fleet._user_defined_strategy.hybrid_configs[
        "sharding_configs"
    ]
    config.tensor_fusion = True
    try:
        with cpu_tensor_fusion():
            yield
    finally:
        config.tensor_fusion = False


def case_tensor_fusion_with_pp_sharding_comm_overlap_refused_as_paddle_does():
    """Paddle itself cannot combine pp_configs.sharding_comm_overlap with
    tensor fusion: it refuses when it builds the optimizer (a bare
    AssertionError); if the strategy changes after the build, the overlay
    refuses the same combination with a ValueError worded as Paddle's limit,
    before anything changes."""
    strategy = fleet.fleet._user_defined_strategy
    pp = strategy.hybrid_configs["pp_configs"]
    model = fleet.distributed_model(TinyLM())
    with tensor_fusion():
        pp.sharding_comm_overlap = True
        try:
            fleet.distributed_optimizer(adamw(model.parameters()))
        except AssertionError as e:
            assert "sharding_comm_overlap" in str(e), str(e)
        else:
            raise AssertionError(
                "Paddle built tensor_fusion with pp sharding_comm_overlap"
            )
        finally:
            pp.sharding_comm_overlap = False
        opt = fleet.distributed_optimizer(adamw(model.parameters()))
        pp.sharding_comm_overlap = True
        try:
            opt._set_broadcast_overlap(True, layers=model)
        except ValueError as e:
            assert (
                "Paddle cannot combine pp_configs.sharding_comm_overlap"
                in str(e)
            ), str(
                e
            )
        else:
            raise AssertionError("the combination was not refused")
        finally:
            pp.sharding_comm_overlap = False
    assert overlap_impl(opt) is None
    assert (
        sum(
            len(l._forward_pre_hooks)
            for l in model.sublayers(include_self=True)
        )
        == 0
    )


def case_tensor_fusion_slices_bitwise_equal():
    """With tensor fusion the parameters already live in per-rank fused
    buffers: each window sends slices of them (no buffer of ours), bitwise
    equal to tensor fusion with overlap off; bucket_size_mb=0 sends one
    broadcast per parameter as upstream does there."""
    with tensor_fusion():
        for cap in (2 * KB, 256):
            checker, model, opt, _ = compare_buckets(TinyLM, cap)
            inner = opt._inner_opt
            assert inner.tensor_fusion and inner._rank2fused
            fused = [t for ts in inner._rank2fused.values() for t in ts]
            spans = [
                (t.data_ptr(), t.data_ptr() + 4 * int(t._numel()))
                for t in fused
            ]
            specs = buckets(opt)
            assert specs and len(specs) < len(params_of(opt))
            assert len(overlap_impl(opt).units) == len(specs)
            for spec in specs:  # slices of the fused buffers, nothing new
                buf = spec.buffer
                assert any(
                    lo <= buf.data_ptr() < hi for lo, hi in spans
                ), buf.data_ptr()
                end = buf.data_ptr() + spec.length * buf.element_size()
                assert any(lo < end <= hi for lo, hi in spans), end
            assert_views_of_buffers(opt)
            assert checker.counts["launched"] == STEPS * len(
                specs
            ), checker.counts
            assert all_ranks_equal(
                [v for s in specs for v in (s.length, *s.offsets)]
            )
        checker, model, opt, _ = compare_buckets(TinyLM, 0)
        assert per_parameter(opt) and buckets(opt) == []
        assert checker.counts["launched"] == STEPS * len(params_of(opt))


def case_memory_replaced_on_one_rank_or_every_rank_rebound_locally():
    """A bucketed parameter given new memory (same dtype and size, same
    values) after a step, on rank 1 alone or on every rank: at the next
    launch each rank that saw it puts the parameter back into its slot
    locally (``stats["rebound"]``, no collective, no warning), so the ranks
    keep issuing the same broadcasts (no hang, no mismatched collectives)
    and training stays bitwise equal to overlap off."""
    for ranks in ({1}, {0, 1}):
        replaced = []

        def replace(step, model, opt, ranks=ranks, replaced=replaced):
            if step == 1 and rank() in ranks:
                p = model._layers.blocks[0].up.weight
                fresh = paddle.to_tensor(p.numpy())
                p.get_tensor()._share_data_with(fresh.get_tensor())
                assert p.data_ptr() == fresh.data_ptr()  # out of its slot
                if overlap_impl(opt) is not None:  # (the off run too)
                    assert bucket_of(opt, p) is not None
                    replaced.append((p, fresh))  # keep the new memory alive

        checker, model, opt, _ = compare_buckets(
            TinyLM, 2 * KB, on_step=replace
        )
        impl = overlap_impl(opt)
        assert impl.stats["rebound"] == (1 if rank() in ranks else 0), (
            ranks,
            impl.stats,
        )
        if replaced:  # back in its slot: no longer the fresh memory
            p, fresh = replaced[0]
            assert p.data_ptr() != fresh.data_ptr()
        assert all_ranks_equal([impl.stats["launched"], len(buckets(opt))])
        assert impl.stats["launched"] == STEPS * len(impl.units), impl.stats
        assert_views_of_buffers(opt)


def case_dtype_change_refused_on_every_rank_then_retrained():
    """``model.to(dtype="float64")`` on every rank between steps (per
    parameter and with buckets): the next step() raises ValueError on every
    rank, naming a parameter and ``_set_broadcast_overlap(False)``, before
    any broadcast is sent; then overlap off and on again plans from the
    converted model and trains (ranks agree, every read waited). SGD: no
    optimizer state of the old dtype."""

    def sgd(params):
        return paddle.optimizer.SGD(learning_rate=0.05, parameters=params)

    for cap in (0, 2 * KB):
        model, opt = bucketed(TinyLM, cap, make_optimizer=sgd)
        with BroadcastWaitChecker() as checker, lost_overlap_warnings() as lost:
            # (train() ends with model.state_dict(): every unit waited by
            # that read, so the next forward says the overlap was lost)
            train(model=model, opt=opt, steps=2, checker=checker)
            impl = overlap_impl(opt)
            sent = checker.counts["launched"]
            assert sent == impl.stats["launched"] == 2 * len(impl.units) > 0
            model._layers.to(dtype="float64")
            loss = lm_loss(model, 2)
            loss.backward()
            try:
                opt.step()
            except ValueError as e:
                message = str(e)
            else:
                raise AssertionError(f"cap {cap}: the dtype change was sent")
            opt.clear_grad()
            assert checker.counts["launched"] == sent, checker.counts
        assert_lost_overlap_warning(lost, "iteration")
        assert "_set_broadcast_overlap(False)" in message, message
        named = [p.name for p in params_of(opt) if f" {p.name} " in message]
        assert len(named) == 1, (named, message)
        assert "float32" in message and "float64" in message, message
        assert impl.stats["launched"] == 2 * len(impl.units), impl.stats
        assert impl.num_pending == 0
        # every rank refused it: the next collective still pairs up
        assert all_ranks_equal([1])
        opt._set_broadcast_overlap(False)
        opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=cap)
        with BroadcastWaitChecker() as checker:
            _, params, _ = train(
                model=model, opt=opt, steps=2, first_step=3, checker=checker
            )
        assert checker.violations == [], checker.violations[:5]
        assert checker.counts["launched"] > 0 and checker.num_unwaited() == 0
        assert all(v.dtype == np.float64 for v in params.values()), {
            k: v.dtype for k, v in params.items()
        }
        assert all(np.isfinite(v).all() for v in params.values())
        assert all_ranks_equal(digest(params))
        assert {s.dtype for s in buckets(opt)} <= {"float64"}
        assert_views_of_buffers(opt)
        opt._set_broadcast_overlap(False)


def case_collected_optimizer_hooks_removed_by_another_optimizers_false():
    """An optimizer garbage-collected with overlap on leaves its hooks (the
    finalizer neither waits nor touches hooks); the next
    _set_broadcast_overlap call of any optimizer, here False on another one
    that never had overlap on, waits for its units and removes them."""
    import gc

    model = fleet.distributed_model(TinyLM())

    def hooks():
        return sum(
            len(l._forward_pre_hooks)
            for l in model.sublayers(include_self=True)
        )

    opt = fleet.distributed_optimizer(adamw(model.parameters()))
    opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=2 * KB)
    model(paddle.zeros([2, 8], dtype="int64")).mean().backward()
    opt.step()  # units launched and pending
    assert hooks() > 0
    del opt
    gc.collect()
    assert hooks() > 0  # nothing removed inside garbage collection
    other = fleet.distributed_optimizer(adamw(model.parameters()))
    other._set_broadcast_overlap(False)
    assert hooks() == 0
    assert (
        type(model._layers.blocks[0].up._parameters).__name__ == "OrderedDict"
    )


def case_rank0_only_save_then_barrier():
    """Rank 0 alone reads the whole model right after every step (the
    README's save pattern), then every rank meets at a barrier: step()
    started every bucket on every rank, reads only wait, so the barrier
    pairs up (no hang) and rank 0 reads no stale value; rank 0's reads took
    the overlap away from its next forward: said once, there only."""
    saved = []
    pending_after_step = []

    def rank0_reads(step, model, opt):
        impl = overlap_impl(opt)
        if impl is not None:
            # every unit in flight right after step(), nothing started since
            due = sum(u.needs_sync() for u in impl.units)
            pending_after_step.append((impl.num_pending, due))
        if rank() == 0:
            saved.append(
                {k: v.numpy().copy() for k, v in model.state_dict().items()}
            )
        paddle.distributed.barrier()

    with lost_overlap_warnings() as lost:
        checker, model, opt, off = compare_buckets(
            TinyLM, 2 * KB, on_step=rank0_reads
        )
    impl = overlap_impl(opt)
    units = len(impl.units)
    assert len(buckets(opt)) > 2  # several buckets in flight at once
    assert pending_after_step == [(units, units)] * STEPS, pending_after_step
    # reads and forwards started nothing: one launch of each unit per step
    assert impl.stats["launched"] == STEPS * units, impl.stats
    assert all_ranks_equal([impl.stats["launched"]])
    if rank() == 0:
        # the off run reads too: 2 * STEPS reads on rank 0
        assert (
            len(saved) == 2 * STEPS and impl.stats["waited_on_read"] > 0
        ), impl.stats
        final = {k: v.numpy() for k, v in model.state_dict().items()}
        for k, v in saved[-1].items():
            assert v.tobytes() == final[k].tobytes(), k
        assert_lost_overlap_warning(lost, "iteration", units, units)
        # every unit of every step waited by rank 0's reads (the final
        # state_dict() of train() found nothing pending)
        assert impl.stats["waited_on_read"] == STEPS * units, impl.stats
    else:
        # only train()'s final state_dict() read here
        assert impl.stats["waited_on_read"] == units, impl.stats
        assert lost == [], lost


if __name__ == "__main__":
    sys.exit(run_cases(cases_of(globals())))
