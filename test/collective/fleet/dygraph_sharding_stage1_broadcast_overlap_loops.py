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

"""Per-rank script: training loops that break naive broadcast overlap.

Collectives must be issued in the same order on every rank; these loops
make ranks (or steps) differ in forward order and count, run forwards
without backward, recompute, replace weights, read parameters without
calling their layer, change trainability. Checks as in ``..._models.py``.
"""

import copy
import gc
import sys
import types
import warnings

from broadcast_overlap_training import (
    HIDDEN,
    TinyLM,
    VariantLM,
    adamw,
    all_ranks_equal,
    assert_bitwise_equal,
    assert_lost_overlap_warning,
    assert_order_agreed,
    batch,
    build_with_initial_state,
    cases_of,
    default_micro_step,
    lm_loss,
    lost_overlap_warnings,
    optimizer_parameters,
    overlap_impl,
    rank,
    run_cases,
    sync_registry_module,
    total_forward_pre_hooks,
    train_with_checker,
)
from dygraph_sharding_stage1_broadcast_overlap_models import (
    check_order_warned_per_parameter,
    compare_on_off,
    train,
    train_checking_reads,
)

import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.utils import recompute


class RankOrderLM(VariantLM):
    """Two parallel branches whose call order depends on rank and step
    (the sum is the same either way)."""

    def build(self):
        self.branch_a = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.branch_b = paddle.nn.Linear(HIDDEN, HIDDEN)

    def front(self, x):
        if (rank() + self.step) % 2 == 0:
            a = self.branch_a(x)
            b = self.branch_b(x)
        else:
            b = self.branch_b(x)
            a = self.branch_a(x)
        return x + a + b


class ExpertLM(VariantLM):
    """Three experts; from step 1 on, each rank leaves a different expert
    unused (rank- and step-dependent routing)."""

    def build(self):
        experts = [paddle.nn.Linear(HIDDEN, HIDDEN) for _ in range(3)]
        self.experts = paddle.nn.LayerList(experts)

    def front(self, x):
        unused = (self.step + rank()) % 3 if self.step > 0 else None
        for i, expert in enumerate(self.experts):
            x = x + expert(x) if i != unused else x
        return x


class RecomputeLM(VariantLM):
    use_reentrant = True

    def run_block(self, i, x):
        # no dropout here; Paddle 2.6 cannot preserve RNG state on the CPU
        kw = dict(use_reentrant=self.use_reentrant, preserve_rng_state=False)
        return recompute(self.blocks[i], x, **kw)


class ReuseLM(VariantLM):
    """One block called twice in one forward."""

    def run_block(self, i, x):
        return self.blocks[i](self.blocks[0](x) if i == 0 else x)


class DirectReadLM(VariantLM):
    """Reads parameters without their owner's __call__: ``proj.forward(x)``
    and ``F.linear(x, head.weight, head.bias)``."""

    def build(self):
        self.proj = paddle.nn.Linear(HIDDEN, HIDDEN)

    def front(self, x):
        self.read_check(self.proj.parameters() + self.head.parameters())
        return self.proj.forward(x)

    def logits(self, x):
        return paddle.nn.functional.linear(x, self.head.weight, self.head.bias)


def case_forward_order_differs_between_ranks_and_steps():
    """Rank 0 recorded branch_a first; whoever runs branch_b first waits
    for a task launched after a pending one, and is told once."""
    check_order_warned_per_parameter(RankOrderLM, "waited_out_of_order")


def case_expert_routing_leaves_experts_unused():
    """The unused expert's tasks wait for the next update; the layer after
    it needs its own while they are pending (told once)."""
    check_order_warned_per_parameter(ExpertLM, "waited_before_update", 6)


def case_ranks_run_different_forward_counts():
    """Eval and "generation" forwards on rank 0 only: one agreed order."""

    def on_step(step, model, opt):
        if rank() == 0:
            with paddle.no_grad():
                for i in range(1 + step % 3):
                    model(batch(200 + i)[0])

    assert_order_agreed(compare_on_off(steps=5, on_step=on_step)[1])


def case_forwards_without_backward_tables_bounded():
    """Eval before the first step, several evals between steps, no_grad
    forwards in train() mode and grad-enabled forwards in eval() mode,
    over 10 steps: internal tables keep their size (they would grow by a
    fixed amount every step if anything leaked)."""
    sizes = []
    registry = sync_registry_module()

    def extra_forwards(model):
        model.eval()
        with paddle.no_grad():
            model(batch(300)[0])
            model(batch(301)[0])
        lm_loss(model, 302)  # grad-enabled in eval mode, no backward
        model.train()
        with paddle.no_grad():
            model(batch(303)[0])

    def micro_step(model, step, micro, acc_steps):
        if step == 0 and micro == 0:
            extra_forwards(model)  # before the first step
        return default_micro_step(model, step, micro, acc_steps)

    def on_step(step, model, opt):
        extra_forwards(model)
        impl = overlap_impl(opt)
        if impl is not None:
            assert impl in registry.open_owners()
            # PENDING: the parameters with a pending sync
            tables = (impl.order, impl.units, registry.PENDING)
            counts = (impl.num_pending, sum(impl.read_paths.values()))
            hooks = (impl.num_hooks, total_forward_pre_hooks(model))
            sizes.append(tuple(map(len, tables)) + counts + hooks)

    _, info = compare_on_off(steps=10, micro_step=micro_step, on_step=on_step)
    assert len(sizes) == 10 and len(set(sizes)) == 1, sorted(set(sizes))
    n = len(optimizer_parameters(info["opt"]))
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

    def two_forwards(model, step, micro, acc_steps):
        first = lm_loss(model, step, micro)
        second = lm_loss(model, step, micro + 50)
        loss = (first + second) / 2
        (loss / acc_steps).backward()
        return loss

    compare_on_off(micro_step=two_forwards, acc_steps=2)


def case_skipped_steps_first_included():
    """Steps without an update (the first among them): one agreed order."""
    skipped = compare_on_off(steps=6, skip_update=lambda s: s in (0, 3))
    assert_order_agreed(skipped[1])


def case_weights_replaced_between_steps():
    """Swap in averaged weights for evaluation and back with
    set_state_dict: no broadcast may still be pending at the load."""
    unwaited_at_load, pending_after_step, snapshot = [], [], {}

    def on_step(step, model, opt, checker):
        def load(state):
            if checker is not None:
                unwaited_at_load.append(checker.num_unwaited())
            model.set_state_dict(state)

        if checker is not None:  # launched and not yet waited
            pending_after_step.append(checker.num_unwaited())
        if step == 0:
            snapshot.clear()
            snapshot.update(
                {k: v.clone() for k, v in model.state_dict().items()}
            )
        elif step % 3 == 1:
            # roll back to an earlier snapshot right after step(): the
            # broadcasts are still pending when set_state_dict is called
            load(snapshot)
        elif step % 3 == 2:
            # swap in averaged weights for evaluation, then back
            trained = {k: v.clone() for k, v in model.state_dict().items()}
            load({k: (v + snapshot[k]) * 0.5 for k, v in trained.items()})
            with paddle.no_grad():
                model(batch(400 + step)[0])
            load(trained)

    with lost_overlap_warnings() as lost:
        checker, _ = compare_on_off(
            run=train_with_checker, on_step=on_step, steps=6
        )
    assert checker.violations == []
    assert max(pending_after_step) > 0, pending_after_step
    # loads came while broadcasts were pending; each parameter's write
    # (Tensor.set_value inside set_state_dict) found its task waited
    assert unwaited_at_load and max(unwaited_at_load) > 0, unwaited_at_load
    assert checker.counts["writes"] > 0, checker.counts
    # step 0's snapshot reads every parameter right after the step: said
    # once (the later loads and swaps do not repeat it)
    assert_lost_overlap_warning(lost, "iteration")


def case_parameters_read_without_call():
    """proj.forward(x) and F.linear(x, head.weight, head.bias) inside the
    model's forward: each read waits for that parameter (attribute access
    waits), with and without strict, checked at the read; no warning."""
    for strict in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            checker, info = compare_on_off(DirectReadLM, strict=strict)
        overlay_warnings = [w for w in caught if "broadcast" in str(w.message)]
        assert overlay_warnings == [], [str(w.message) for w in caught]
        reads = [v for v in checker.violations if v[0].startswith("read:")]
        assert reads == [], reads
        assert checker.counts["checked"] > 0, checker.counts
    train_checking_reads("direct read", DirectReadLM)


def case_trainability_changed_mid_training():
    """Block 0 frozen after step 1, trainable again after step 3."""

    def on_step(step, model, opt):
        if step in (1, 3):
            for p in model._layers.blocks[0].parameters():
                p.stop_gradient = step == 1

    assert_order_agreed(compare_on_off(steps=5, on_step=on_step)[1])


def case_two_optimizers_share_one_model():
    """Two sharding optimizers over disjoint parameters of one model (V1
    has no parameter groups), both overlapped; turned off in either order."""

    def run(overlap, off_order=()):
        model = build_with_initial_state(TinyLM)
        body = [p for n, p in model.named_parameters() if n[:4] != "head"]
        sgd = paddle.optimizer.SGD(0.05, parameters=model.head.parameters())
        opts = [fleet.distributed_optimizer(o) for o in (adamw(body), sgd)]
        model = fleet.distributed_model(model)
        base = total_forward_pre_hooks(model)
        for opt in opts if overlap else ():
            opt._set_broadcast_overlap(True, layers=model)
        both = types.SimpleNamespace(
            step=lambda: [opt.step() for opt in opts],
            clear_grad=lambda: [opt.clear_grad() for opt in opts],
        )
        losses, params, _ = train(model=model, opt=both)
        for i in off_order:
            opts[i]._set_broadcast_overlap(False)
        if overlap:
            assert total_forward_pre_hooks(model) == base
            layers = model.sublayers(include_self=True)
            assert not any("set_state_dict" in vars(l) for l in layers)
        return losses, params

    off = run(False)
    for order in ((0, 1), (1, 0)):
        assert_bitwise_equal(off, run(True, order), f"two optimizers {order}")


def case_toggle_on_off_on_mid_training():
    """Overlap turned off, on, and on again (replacing) between steps."""

    def on_step(step, model, opt):
        if step == 1:
            opt._set_broadcast_overlap(False)
        elif step in (2, 3):  # at 3 again: replaces
            opt._set_broadcast_overlap(True, layers=model)

    assert_order_agreed(compare_on_off(steps=6, on_step=on_step)[1])


def case_deepcopy_loads_copy_and_collected_optimizer_closed():
    """A deepcopy loads into itself with no-op hooks; an optimizer deleted
    with overlap on is closed (silent hooks, removed at the next call)."""
    _, _, info = train(TinyLM, overlap=True, steps=2)
    model, opt = info["model"], info["opt"]
    # a deepcopy (e.g. for EMA) loads into itself, not into the original
    twin = copy.deepcopy(model._layers)
    zeros = {k: paddle.zeros_like(v) for k, v in twin.state_dict().items()}
    twin.set_state_dict(zeros)
    assert all(float(v.abs().sum()) == 0 for v in twin.state_dict().values())
    assert any(float(v.abs().sum()) > 0 for v in model.state_dict().values())
    # the copy keeps no reference to this overlap: its hooks are no-ops
    layers = twin.sublayers(include_self=True)
    hook_dicts = [l._forward_pre_hooks for l in layers]
    hook_dicts += [l._state_dict_hooks for l in layers]
    twin_hooks = [h for hooks in hook_dicts for h in hooks.values()]
    assert twin_hooks and all(h.__name__ == "_noop_hook" for h in twin_hooks)

    _, _, other = train(TinyLM, overlap=True, steps=1)
    other_model = other["model"]
    hooked = total_forward_pre_hooks(other_model)
    del other
    gc.collect()
    # the finalizer only marks it closed (no hook-dict mutation inside gc):
    # its hooks are no-ops until the next explicit call removes them
    assert hooked > 0 and total_forward_pre_hooks(other_model) == hooked
    # (train() ended with model.state_dict(), a read of every parameter
    # after the last step: an open owner would warn at this forward that
    # the overlap was lost; a closed one says nothing)
    with lost_overlap_warnings() as lost, paddle.no_grad():
        other_model(batch(0)[0])
    assert lost == [], f"a collected optimizer's no-op hooks warned: {lost}"
    registry = sync_registry_module()
    assert registry.open_owners() == [overlap_impl(opt)]
    assert total_forward_pre_hooks(other_model) == 0

    opt._set_broadcast_overlap(False)
    assert registry.open_owners() == []


def case_error_after_update_is_refused_at_the_next_step():
    """An error raised inside the hybrid optimizer's step after the update,
    caught by the user: without overlap training goes on; with overlap the
    held-back sync never started, so the next step() refuses on every rank
    naming the fix (no silent divergence, no hang), which lets it go on."""

    def on_step(step, model, opt):
        inner = opt._inner_opt
        cls_step = type(inner).step

        def step_then_fail():
            cls_step(inner)
            if on_step.calls == 0:
                on_step.calls += 1
                raise RuntimeError("injected after the update")

        inner.step = step_then_fail

    for overlap in (False, True):
        on_step.calls = 0
        _, _, info = train(TinyLM, overlap=overlap, steps=1, on_step=on_step)
        model, opt, errors = info["model"], info["opt"], []
        # train() ends with model.state_dict(), right after the step: the
        # next forward overlapped nothing (said once)
        with lost_overlap_warnings() as lost:
            for step in range(1, 4):
                lm_loss(model, step).backward()
                try:
                    opt.step()
                except RuntimeError as e:
                    errors.append(str(e))
                    if overlap and len(errors) == 2:  # the fix it names
                        opt._set_broadcast_overlap(False)
                        opt._set_broadcast_overlap(True, layers=model)
                opt.clear_grad()
        assert on_step.calls == 1 and "injected" in errors[0], errors
        if overlap:
            assert_lost_overlap_warning(lost, "iteration")
            assert len(errors) == 2, errors
            assert (
                "stopped after its update and before its parameter "
                in (errors[1])
                and "_set_broadcast_overlap(False)" in errors[1]
            ), errors[1]
        else:
            assert lost == [] and len(errors) == 1, (lost, errors)
        assert all_ranks_equal([len(errors)])


if __name__ == "__main__":
    sys.exit(run_cases(cases_of(globals())))
