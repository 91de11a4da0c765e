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
"""Per-rank script: the parameter-sync overlap together with Paddle's
gradient-communication overlap (``sharding_configs.comm_overlap``), 2 ranks.

Run under ``python -m paddle.distributed.launch --nproc_per_node 2``; cases
chosen with env ``BROADCAST_OVERLAP_CASES`` (all when unset). Every case
trains the same model from the same initial weights and data twice, in the
same Paddle configuration: once without the parameter-sync overlap, once
with it (V1: ``optimizer._set_broadcast_overlap(True, layers=model)``, V2:
``optimizer._set_all_gather_overlap_forward(True, model)``, the calls
PaddleFormers makes), and asserts:

- losses and final parameters bitwise equal to the run without it;
- the wait checker (``broadcast_overlap_checker.py``) saw no read or update
  of a parameter whose broadcast / all-gather was pending, and none is left
  unwaited after the final ``state_dict()``;
- the final parameters equal on every rank;
- the collectives per step, counted:

  * parameter sync (the checker's ``launched``: async broadcasts, V1, or
    all-gathers, V2), per step = the owner's units: V1 default
    ``bucket_size_mb`` (256): one broadcast per Paddle fused buffer
    (``_rank2fused``: 2 for TinyLM, one per owner rank), 2 KB: one per
    slice of those buffers (the bucket units, each unit's ``tensor`` a
    slice), 0: one per parameter (15); V2: one all-gather per Paddle comm
    buffer (``_comm_buffer_list``, 1 MB each: 4 for WideLM); every one
    started inside ``step()``, none by a hook or a read;
  * gradient reduce (``paddle.distributed.reduce`` for V1,
    ``reduce_scatter`` for V2, what Paddle's ``FusedCommBuffer`` issues),
    per step = one per Paddle comm buffer, all issued during backward (the
    gradient overlap) and none in ``step()``, the same with and without
    the parameter-sync overlap, with and without gradient accumulation.

V1 (``DygraphShardingOptimizer``, TinyLM): ``tensor_fusion`` +
``comm_overlap``, and ``comm_overlap`` alone (Paddle fuses the parameters
for it too: the overlap must send slices of Paddle's fused storage and
never move a parameter out of it: every parameter's memory is checked to
lie inside ``_rank2fused``'s buffers), each with ``accumulate_steps`` 1
and 2. V2 (``DygraphShardingOptimizerV2``, ``split_param``, WideLM) with
``comm_overlap``: Paddle 3.x only; Paddle 2.6 refuses it itself
(``AssertionError: not supported yet`` when it builds the optimizer), which
the case shows there.

Paddle's own limit: V2 ``comm_overlap`` needs ``main_grad``
(PaddleFormers' ``amp_master_grad``): without it Paddle fails at the
second step (``ValueError: The address of the grad/main_grad of param ...
has been changed during training``, shown by
``v2_comm_overlap_without_main_grad_fails_in_paddle``), so the V2 cases
wrap the model in ``MixPrecisionLayer(model, "bfloat16")`` and the
optimizer in ``MixPrecisionOptimizer`` (fp32 parameters: the hook only
keeps an fp32 ``main_grad``).

CPU ranks: ``hybrid_parallel_cpu_shim`` item 6 (``cpu_tensor_fusion``)
around building the V1 optimizer, items 7 and 8 (``cpu_sharding_v2``) for
V2.
"""

import contextlib
import sys
import traceback

import broadcast_overlap_training as training
import hybrid_parallel_cpu_shim  # noqa: I001 (before fleet.init)
from broadcast_overlap_training import (
    TinyLM,
    adamw,
    bucket_units,
    build_with_initial_state,
    cases_of,
    lm_loss,
    overlap_impl,
    per_parameter,
    rank,
    run_cases,
)

import paddle
from paddle.distributed import fleet

STEPS = 3
KB = 1 / 1024  # bucket_size_mb of 2 KB buckets: 2 * KB
# V2 comm buffer size (sharding_configs.comm_buffer_size_MB, an int on 3.x)
BUFFER_MB = 1
PADDLE_2 = paddle.__version__.startswith("2.")


def WideLM():
    """TinyLM with 3 blocks of width 256, about 3.2 MB of fp32 parameters:
    4 V2 comm buffers of 1 MB."""
    return TinyLM(num_blocks=3, hidden=256)


# ----------------------------------------------------------------------
# set-up
def v2_settings(acc):
    return training.sharding_configs(
        ("comm_buffer_size_MB",),
        split_param=True,
        comm_overlap=True,
        accumulate_steps=acc,
        comm_buffer_size_MB=BUFFER_MB,
    )


class GradCommCounter:
    """Counts Paddle's gradient collectives: ``paddle.distributed.reduce``
    and ``reduce_scatter`` (what ``FusedCommBuffer._comm_grads`` calls;
    ``reduce_scatter`` is the CPU shim's item 7 here). ``calls``: running
    total."""

    NAMES = ("reduce", "reduce_scatter")

    def __enter__(self):
        self.calls = 0
        self._saved = []
        for name in self.NAMES:
            original = getattr(paddle.distributed, name)
            self._saved.append((name, original))

            def counting(*args, _original=original, **kwargs):
                self.calls += 1
                return _original(*args, **kwargs)

            setattr(paddle.distributed, name, counting)
        return self

    def __exit__(self, *exc):
        for name, original in self._saved:
            setattr(paddle.distributed, name, original)
        return False


def inner_of(opt):
    """The sharding optimizer inside fleet's HybridParallelOptimizer."""
    return opt._inner_opt


def build_v1():
    """TinyLM and V1 with the fleet strategy's current settings."""
    model = build_with_initial_state(TinyLM)
    with hybrid_parallel_cpu_shim.cpu_tensor_fusion():  # item 6
        opt = fleet.distributed_optimizer(adamw(model.parameters()))
    return fleet.distributed_model(model), opt


def build_v2(main_grad=True):
    """WideLM and V2 (optionally with main_grad, PaddleFormers'
    amp_master_grad)."""
    from paddle.distributed.fleet.utils import mix_precision_utils as mpu

    raw = build_with_initial_state(WideLM)
    base = adamw(raw.parameters())
    if main_grad:
        # as PaddleNLP's trainer does: the layer's return value is unused
        # (its grad hooks on the parameters keep the fp32 main_grad)
        mpu.MixPrecisionLayer(raw, dtype="bfloat16")
        base = mpu.MixPrecisionOptimizer(base)
    with hybrid_parallel_cpu_shim.cpu_sharding_v2(BUFFER_MB):  # items 8, 9
        model = fleet.distributed_model(raw)
        opt = fleet.distributed_optimizer(base)
    return model, opt


def train(build, overlap=False, *, enable=None, acc=1, checker=None):
    """``training.train`` of ``build()``'s model and optimizer;
    ``enable(model, opt)`` turns the overlap on. The run also holds
    ``grad`` (per step: (gradient collectives during backward, during
    ``step()``)) and ``launched`` (per step: parameter-sync collectives the
    checker saw since the previous step)."""
    with GradCommCounter() as counter:
        model, opt = build()
        if overlap:
            enable(model, opt)
        marks = []  # per step: calls at its start, after backward, at its end

        def micro_step(model, step, micro, acc_steps):
            if micro == 0:
                marks.append(counter.calls)
            loss = lm_loss(model, step, micro)
            (loss / acc_steps).backward()
            if micro == acc_steps - 1:
                marks.append(counter.calls)
            return loss

        run = training.train(
            model=model,
            opt=opt,
            checker=checker,
            steps=STEPS,
            acc_steps=acc,
            micro_step=micro_step,
            on_step=lambda *_: marks.append(counter.calls),
        )
    run.grad = [(b - a, c - b) for a, b, c in zip(*[iter(marks)] * 3)]
    run.launched = [r["launched"] for r in run.reports]
    return run


def assert_collective_counts(off, on, checker, n, steps):
    """Runs ``off`` and ``on`` (overlap off and on) each did ``n`` gradient
    collectives per step, all before the update, and the overlap launched
    every one of its units once per step (its own count and the checker's);
    returns the overlap and its number of units."""
    assert off.grad == on.grad == [(n, 0)] * steps, (off.grad, on.grad, n)
    impl = overlap_impl(on.opt)
    assert impl is not None and impl.num_pending == 0
    units = len(impl.units)
    assert impl.stats["launched"] == steps * units, (impl.stats, units)
    assert checker.counts["launched"] == steps * units, (checker.counts, units)
    return impl, units


def compare(build, enable, grad_buffers, *, acc=1):
    """``training.compare_on_off`` (final parameters equal on every rank)
    and the gradient collectives: one per Paddle comm buffer
    (``grad_buffers(opt)``) per step, all in backward, unchanged by the
    parameter-sync overlap. Returns ``(on, checker, impl)``."""
    checker, on = training.compare_on_off(
        build, run=train, replicas="world", enable=enable, acc=acc
    )
    n = grad_buffers(on.opt)
    assert n >= 1, n
    impl, units = assert_collective_counts(on.off, on, checker, n, STEPS)
    print(
        f"rank {rank()} {build.__name__} acc={acc}: units {units}, "
        f"parameter-sync collectives per step {on.launched} (total "
        f"{checker.counts['launched']}), gradient collectives per step "
        f"(backward, step) {on.grad}",
        flush=True,
    )
    return on, checker, impl


# ----------------------------------------------------------------------
# V1
def fused_spans(inner):
    return [
        (t.data_ptr(), t.data_ptr() + 4 * int(t._numel()))
        for ts in inner._rank2fused.values()
        for t in ts
    ]


def inside(spans, ptr):
    return any(lo <= ptr < hi for lo, hi in spans)


def check_v1_fused(tensor_fusion, acc):
    """V1 with comm_overlap (and tensor_fusion or not): Paddle fused the
    parameters; every bucket mode sends only Paddle's storage."""
    num_params = len(list(TinyLM().parameters()))
    for bucket_mb in (None, 2 * KB, 0):

        def enable(model, opt, bucket_mb=bucket_mb):
            kwargs = {} if bucket_mb is None else {"bucket_size_mb": bucket_mb}
            opt._set_broadcast_overlap(True, layers=model, **kwargs)

        with training.sharding_configs(
            tensor_fusion=tensor_fusion, comm_overlap=True, accumulate_steps=acc
        ):
            on, checker, impl = compare(
                build_v1,
                enable,
                lambda opt: len(inner_of(opt)._comm_buffers),
                acc=acc,
            )
        inner = inner_of(on.opt)
        assert inner.comm_overlap and bool(inner.tensor_fusion) == tensor_fusion
        assert inner._rank2fused, "Paddle fused nothing"
        spans = fused_spans(inner)
        num_fused = len(spans)
        params = list(inner._origin_parameter_list)
        assert len(params) == num_params
        # not one parameter moved out of Paddle's fused storage
        outside = [p.name for p in params if not inside(spans, p.data_ptr())]
        assert outside == [], f"moved out of Paddle's fused storage: {outside}"
        units = len(impl.units)
        slices = bucket_units(on.opt)
        if bucket_mb == 0:  # one broadcast per parameter
            assert per_parameter(on.opt) and not slices, slices
            assert units == num_params, units
        else:  # slices of Paddle's fused buffers, none of ours
            assert slices
            for unit in slices:
                buffer = unit.tensor
                assert inside(spans, buffer.data_ptr()), buffer.data_ptr()
                last = buffer.data_ptr() + 4 * (int(buffer._numel()) - 1)
                assert inside(spans, last), (unit.label, last)
            assert units == len(slices), (units, len(slices))
            if bucket_mb is None:  # default 256 MB: one per fused buffer
                assert units == num_fused, (units, num_fused)
            else:
                assert num_fused < units < num_params, (units, num_fused)
        # every step launched all its units at the step (no depth limit)
        assert on.launched == [units] * STEPS, on.launched


def case_v1_tensor_fusion_comm_overlap():
    check_v1_fused(tensor_fusion=True, acc=1)


def case_v1_tensor_fusion_comm_overlap_accumulate():
    check_v1_fused(tensor_fusion=True, acc=2)


def case_v1_comm_overlap_alone():
    check_v1_fused(tensor_fusion=False, acc=1)


def case_v1_comm_overlap_alone_accumulate():
    check_v1_fused(tensor_fusion=False, acc=2)


# ----------------------------------------------------------------------
# V2
def check_v2(acc):
    def enable(model, opt):  # PaddleFormers' two-argument call
        opt._set_all_gather_overlap_forward(True, model)

    with v2_settings(acc):
        on, checker, impl = compare(
            build_v2,
            enable,
            lambda opt: len(inner_of(opt)._comm_buffer_list),
            acc=acc,
        )
    inner = inner_of(on.opt)
    assert type(inner).__name__ == "DygraphShardingOptimizerV2"
    assert inner.comm_overlap
    buffers = len(inner._comm_buffer_list)
    units = len(impl.units)
    assert buffers >= 3 and units == buffers, (units, buffers)
    assert all(u.kind == "all_gather" for u in impl.units), impl.units
    assert checker.counts["gathers"] == STEPS * units, checker.counts
    # every gather started inside its step(), none by the next forward's
    # hooks or a read (step_report() right after each step)
    assert on.launched == [units] * STEPS, on.launched


def case_v2_comm_overlap():
    """Paddle 3.x: V2 with comm_overlap, with and without gradient
    accumulation. Paddle 2.6: Paddle itself refuses V2 with comm_overlap
    when it builds the optimizer."""
    if PADDLE_2:
        with v2_settings(1):
            try:
                build_v2()
            except AssertionError as e:
                assert "not supported yet" in str(e), str(e)
            else:
                raise AssertionError(
                    f"Paddle {paddle.__version__} built V2 with comm_overlap"
                )
        print(
            f"rank {rank()} Paddle {paddle.__version__} refuses V2 "
            "comm_overlap: AssertionError 'not supported yet'",
            flush=True,
        )
        return
    for acc in (1, 2):
        check_v2(acc)


def case_v2_comm_overlap_without_main_grad_fails_in_paddle():
    """Paddle's own limit, without any overlap: V2 comm_overlap without
    main_grad fails in backward at the second step (ranks fail alike, before
    any collective of that step). Not run on Paddle 2.6, which has no V2
    comm_overlap."""
    with v2_settings(1):
        try:
            train(lambda: build_v2(main_grad=False), acc=1)
        except Exception:
            message = traceback.format_exc()
            assert "has been changed during training" in message, message
        else:
            raise AssertionError("V2 comm_overlap trained without main_grad")


def launch_cases():
    cases = cases_of(globals())
    if PADDLE_2:  # no V2 comm_overlap: case_v2_comm_overlap shows the refusal
        del cases["v2_comm_overlap_without_main_grad_fails_in_paddle"]
    return cases


if __name__ == "__main__":
    sys.exit(run_cases(launch_cases()))
