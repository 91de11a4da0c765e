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
"""Per-rank script: the parameter-sync overlap together with the pipeline's
gradient-communication overlap (``pp_configs.sharding_comm_overlap``), on 4
ranks, ``pp2 x sharding2``.

Run under ``python -m paddle.distributed.launch --nproc_per_node 4``; cases
chosen with env ``BROADCAST_OVERLAP_CASES`` (all when unset). The pipeline
models (plain, and a tied embedding/head built from ``SharedLayerDesc``)
and the topology come from ``dygraph_sharding_stage1_broadcast_overlap_hybrid.py``
(``train_batch`` with 2 micro-batches). With ``sharding_comm_overlap`` the
pipeline builds its own comm buffers per model chunk at the first
``train_batch`` and reduces them during the last micro-batches' backward;
``fleet.distributed_optimizer`` turns the optimizer's own gradient reduce
off. Every case trains twice in the same configuration, without and with
the parameter-sync overlap (V1: ``_set_broadcast_overlap(True,
layers=model)``, V2: ``_set_all_gather_overlap_forward(True, model)``), and
asserts:

- losses and final parameters bitwise equal to the run without it;
- the wait checker saw no read or update of a parameter whose broadcast /
  all-gather was pending (the tied head on the last stage reads the shared
  weight outside the shared layer), none left unwaited at the end;
- the final parameters equal on both ranks of each sharding group;
- the collectives per step, counted on each rank (its pipeline stage):

  * parameter sync (the checker's ``launched``): V1 default
    ``bucket_size_mb`` (256): one broadcast per bucket of the overlap's own
    storage (the pipeline's V1 buffers hold gradients only), i.e. one per
    owner rank with parameters on this stage: 2; ``bucket_size_mb=0``: one
    per parameter of the stage (3 on stage 0, 4 on stage 1, plain; tied:
    3 and 3); V2: one all-gather per pipeline comm buffer of the stage
    (V2 takes the pipeline's buffers at the first step: 1 per stage here);
    every one started inside ``step()``;
  * gradient reduce (``paddle.distributed.reduce``, V1, or
    ``reduce_scatter``, V2, what the pipeline's ``FusedCommBuffer`` s
    issue): one per pipeline comm buffer of the stage per step (V1: one
    per destination rank, 2; V2: 1), all before the update (during
    ``train_batch``'s backward), none inside the optimizer's ``step()``,
    the same with and without the parameter-sync overlap.

Paddle's own limits: ``sharding_comm_overlap`` needs ``main_grad``
(PaddleFormers allows ``--pp_sharding_comm_overlap`` only with
``amp_master_grad``; without it Paddle stops at the second step: ``The
address of the grad/main_grad of param ... has been changed during
training``), so the model is wrapped in ``MixPrecisionLayer(model,
"bfloat16")`` and the optimizer in ``MixPrecisionOptimizer`` (fp32
parameters). Paddle refuses ``sharding_comm_overlap`` together with
``tensor_fusion`` or ``comm_overlap`` itself (tested in
``dygraph_sharding_stage1_broadcast_overlap_buckets.py``).

CPU ranks: ``hybrid_parallel_cpu_shim`` items 1-5 (pipeline on gloo), 6
and 8 around building the model and the optimizer, 10 for the pipeline's
comm buffers built at the first ``train_batch``.
"""

import contextlib
import os
import sys

os.environ.setdefault("BROADCAST_OVERLAP_TOPOLOGY", "pp2_sharding2")

import broadcast_overlap_training as training  # noqa: E402
import dygraph_sharding_stage1_broadcast_overlap_hybrid as hybrid  # noqa: E402
import dygraph_sharding_stage1_grad_comm_overlap as grad_comm_overlap  # noqa: E402
import hybrid_parallel_cpu_shim  # noqa: E402
from broadcast_overlap_training import (  # noqa: E402
    bucket_units,
    cases_of,
    per_parameter,
    rank,
    run_cases,
)

import paddle  # noqa: E402
from paddle.distributed import fleet  # noqa: E402

STEPS = hybrid.STEPS


@contextlib.contextmanager
def settings(split_param):
    """``pp_configs.sharding_comm_overlap`` on and V1 or V2 for the block
    (Paddle reads both when it builds the pipeline and the optimizer)."""
    hybrid_configs = fleet.fleet._user_defined_strategy.hybrid_configs
    pp, sharding = (
        hybrid_configs["pp_configs"],
        hybrid_configs["sharding_configs"],
    )
    saved = pp.sharding_comm_overlap, sharding.split_param
    pp.sharding_comm_overlap, sharding.split_param = True, split_param
    try:
        yield
    finally:
        pp.sharding_comm_overlap, sharding.split_param = saved


class GradCommCounter(grad_comm_overlap.GradCommCounter):
    """The 2-rank script's counter of ``paddle.distributed.reduce`` and
    ``reduce_scatter`` calls (here the pipeline's
    ``FusedCommBuffer._comm_grads``), plus ``at_update``: the running total
    when each ``step()`` of the sharding optimizer began."""

    def __enter__(self):
        self.at_update = []
        return super().__enter__()

    def watch_updates(self, opt):
        inner = opt._inner_opt  # V1 or V2, called by HybridParallelOptimizer
        step = inner.step

        def counted_step(*args, **kwargs):
            self.at_update.append(self.calls)
            return step(*args, **kwargs)

        inner.step = counted_step


def cpu_buffers():
    stack = contextlib.ExitStack()
    stack.enter_context(hybrid_parallel_cpu_shim.cpu_tensor_fusion())  # 6
    stack.enter_context(hybrid_parallel_cpu_shim.cpu_sharding_v2())  # 8
    return stack


def train(tied, overlap=False, *, split_param, enable=None, checker=None):
    """``training.train`` of the pipeline (``train_batch`` runs the update);
    the run also holds ``grad`` (per step: (gradient collectives before the
    update, inside it)) and ``launched`` (per step: parameter-sync
    collectives the checker saw)."""
    from paddle.distributed.fleet.utils import mix_precision_utils as mpu

    with settings(split_param), GradCommCounter() as counter:
        raw = hybrid.build_same(lambda: hybrid.pipeline_model(tied))
        base = paddle.optimizer.AdamW(
            learning_rate=0.01, parameters=raw.parameters(), weight_decay=0.01
        )
        # PaddleNLP's amp_master_grad: the layer's return value is unused
        mpu.MixPrecisionLayer(raw, dtype="bfloat16")
        base = mpu.MixPrecisionOptimizer(base)
        with cpu_buffers():
            model = fleet.distributed_model(raw)
            opt = fleet.distributed_optimizer(base)
        if overlap:
            enable(model, opt)
        counter.watch_updates(opt)
        starts, ends = [], []

        def micro_step(model, step, micro, acc_steps):
            starts.append(counter.calls)
            loss = model.train_batch(list(hybrid.data(step)), opt)
            ends.append(counter.calls)
            return loss

        run = training.train(
            model=model,
            opt=opt,
            checker=checker,
            steps=STEPS,
            micro_step=micro_step,
            skip_update=lambda step: True,
        )
    run.grad = [
        (at - start, end - at)
        for start, at, end in zip(starts, counter.at_update, ends)
    ]
    assert len(counter.at_update) == STEPS, counter.at_update
    run.launched = [r["launched"] for r in run.reports]
    return run


def compare(tied, split_param, enable):
    """``training.compare_on_off`` of the pipeline (final parameters equal
    across the sharding group) and its gradient collectives: one per
    pipeline comm buffer per step, before the update, unchanged by the
    parameter-sync overlap."""
    group = fleet.get_hybrid_communicate_group().get_sharding_parallel_group()
    checker, on = training.compare_on_off(
        tied,
        run=train,
        replicas=group,
        split_param=split_param,
        enable=enable,
    )
    off = on.off
    what = f"{'V2' if split_param else 'V1'} tied={tied}"
    model, inner = on.model, on.opt._inner_opt
    assert type(inner).__name__ == (
        "DygraphShardingOptimizerV2"
        if split_param
        else "DygraphShardingOptimizer"
    )
    # the pipeline's own comm buffers did the gradient reduce, before the
    # update, one collective each, unchanged by the parameter-sync overlap
    assert model._sharding_comm_overlap
    buffers = [b for bs in model._chunk_2_comm_buffers.values() for b in bs]
    assert buffers, "the pipeline built no comm buffers"
    n = len(buffers)
    impl, units = grad_comm_overlap.assert_collective_counts(
        off, on, checker, n, STEPS
    )
    print(
        f"rank {rank()} {what}: stage {model._layers._stage_id}, pipeline "
        f"comm buffers {n}, units {units}, parameter-sync collectives per "
        f"step {on.launched}, gradient collectives per step (before the "
        f"update, inside it) {on.grad}",
        flush=True,
    )
    return on, checker, impl, buffers


def check_v1(tied):
    for bucket_mb in (None, 0):

        def enable(model, opt, bucket_mb=bucket_mb):
            kwargs = {} if bucket_mb is None else {"bucket_size_mb": bucket_mb}
            opt._set_broadcast_overlap(True, layers=model, **kwargs)

        on, checker, impl, buffers = compare(tied, False, enable)
        # V1's pipeline buffers hold gradients only (no parameter storage)
        assert all(b.param_storage is None for b in buffers)
        assert not getattr(on.opt._inner_opt, "_rank2fused", None)
        units = len(impl.units)
        if bucket_mb == 0:
            assert per_parameter(on.opt) and not bucket_units(on.opt)
            assert units == len(on.opt._inner_opt._origin_parameter_list), units
        else:  # one bucket per owner rank (one dtype, all under 256 MB)
            assert units == 2, units
            slices = bucket_units(on.opt)
            assert len(slices) == 2, slices
            assert len({u.src for u in slices}) == 2, [u.src for u in slices]
        assert on.launched == [units] * STEPS, on.launched
        if tied and fleet.get_hybrid_communicate_group().is_last_stage:
            # the tied head read the shared weight while pending: waited
            assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def check_v2(tied):
    def enable(model, opt):
        opt._set_all_gather_overlap_forward(True, model)

    on, checker, impl, buffers = compare(tied, True, enable)
    inner = on.opt._inner_opt
    # V2 adopted the pipeline's buffers: one all-gather each
    assert [id(b) for b in inner._comm_buffer_list] == [id(b) for b in buffers]
    units = len(impl.units)
    assert units == len(buffers), (units, len(buffers))
    assert checker.counts["gathers"] == STEPS * units, checker.counts
    # every gather started inside its step (train_batch's update)
    assert on.launched == [units] * STEPS, on.launched


def case_v1_sharding_comm_overlap_plain():
    check_v1(tied=False)


def case_v1_sharding_comm_overlap_tied_embedding_head():
    check_v1(tied=True)


def case_v2_sharding_comm_overlap_plain():
    check_v2(tied=False)


def case_v2_sharding_comm_overlap_tied_embedding_head():
    check_v2(tied=True)


init_fleet = hybrid.init_fleet  # pp2 x sharding2


if __name__ == "__main__":
    sys.exit(run_cases(cases_of(globals()), init=init_fleet))
