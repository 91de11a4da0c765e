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
"""Per-rank script: the parameter-sync overlap when one rank's control
flow between steps differs from the others'.

Right after every ``optimizer.step()`` some ranks do what the others do
not (save, an eval forward, read ``parameters()``, run a compiled program,
evaluate longer), then every rank joins one collective. A sync unit left
to start after ``step()`` would be started by the reading ranks alone: the
ranks would issue different collectives and hang or mix data. Each case
trains with the overlap off and on from the same weights and data and
asserts bitwise-equal losses, values read between steps and final
parameters, equal parameters on the ranks that hold the same ones, at
least 3 sync units, and (with the race checker on, env
``PADDLE_OVERLAY_CHECK``) no read of a parameter whose sync is pending but
the EMA case's reads of the parameter list it keeps, which the checker
must name. The test harness records every rank's collectives and checks
after the launch that they form one schedule.

Env ``SCHEDULE_SETUP``: ``v1`` (2 ranks, ``_set_broadcast_overlap`` with
``bucket_size_mb=0``), ``v2`` (2 ranks, ``split_param``,
``_set_all_gather_overlap_forward``, comm buffers of 1 MB), and on 4 ranks
with V1 and the hybrid script's set-up (``BROADCAST_OVERLAP_TOPOLOGY`` set
to the same) ``dp2_sharding2`` and ``pp2_sharding2``.
``BROADCAST_OVERLAP_CASES`` picks cases (default: every case of the
set-up); the first case that fails ends the launch.
"""

import os
import sys
import tempfile
import types
import zlib

import broadcast_overlap_training as training
import hybrid_parallel_cpu_shim
import numpy as np
from broadcast_overlap_training import adamw, overlap_impl, rank

import paddle
from paddle.distributed import fleet

SETUP = os.environ.get("SCHEDULE_SETUP", "v1")
if SETUP in ("dp2_sharding2", "pp2_sharding2"):
    import dygraph_sharding_stage1_broadcast_overlap_hybrid as hybrid
if SETUP == "v2":
    import dygraph_sharding_stage1_allgather_overlap as allgather


def race_checker():
    """paddle_overlay's race checker when the launch turned it on (env
    PADDLE_OVERLAY_CHECK, read where the overlay was applied), else None."""
    if os.environ.get("PADDLE_OVERLAY_CHECK", "0") in ("", "0"):
        return None
    checker = sys.modules.get("paddle_overlay.race_check")
    assert checker is not None and checker.is_enabled(), "race check off"
    return checker


def init_fleet():
    if SETUP == "v2":
        allgather.init_fleet()
    elif SETUP == "v1":
        training.init_fleet()
    else:
        hybrid.init_fleet()


class Optimizers:
    """Optimizers stepped one after the other as one (``training.train``
    steps one)."""

    def __init__(self, opts):
        self.opts = opts

    def step(self):
        for opt in self.opts:
            opt.step()

    def clear_grad(self):
        for opt in self.opts:
            opt.clear_grad()


def build(overlap, split):
    """This set-up's model and optimizers (one per list ``split(raw)``
    returns), the overlap on each when ``overlap``."""
    if SETUP == "v2":
        raw = training.build_with_initial_state(allgather.LM)
        with hybrid_parallel_cpu_shim.cpu_sharding_v2(allgather.BUFFER_MB):
            opts = [fleet.distributed_optimizer(adamw(p)) for p in split(raw)]
            model = fleet.distributed_model(raw)
        for opt in opts if overlap else ():
            opt._set_all_gather_overlap_forward(True, model)
        return raw, model, opts
    if SETUP == "v1":
        raw = training.build_with_initial_state(training.TinyLM)
    elif SETUP == "dp2_sharding2":
        raw = hybrid.build_same(hybrid.flat_model)
    else:
        raw = hybrid.build_same(lambda: hybrid.pipeline_model(tied=False))
    opts = [fleet.distributed_optimizer(adamw(p)) for p in split(raw)]
    model = fleet.distributed_model(raw)
    for opt in opts if overlap else ():
        opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=0)
    return raw, model, opts


def one_list(raw):
    return [raw.parameters()]


def train(overlap, after_step, split=one_list, prepare=None):
    """``training.train`` of this set-up; ``after_step(step, run)`` right
    after each step returns the values it read (compared with overlap off);
    ``prepare(run)`` before the first step. Returns ``run``."""
    raw, model, opts = build(overlap, split)
    run = types.SimpleNamespace(
        raw=raw, model=model, opts=opts, overlap=overlap, reads=[]
    )
    run.params = [p for ps in split(raw) for p in ps]
    if prepare is not None:
        prepare(run)
    opt = opts[0] if len(opts) == 1 else Optimizers(opts)
    kwargs = {}
    if SETUP == "pp2_sharding2":  # train_batch runs the optimizer

        def micro_step(model, step, micro, acc_steps):
            return model.train_batch(list(hybrid.data(step)), opt)

        kwargs = dict(micro_step=micro_step, skip_update=lambda step: True)

    def on_step(step, model, opt):
        run.reads += [np.array(v).copy() for v in after_step(step, run)]

    run.losses, run.state, _ = training.train(
        model=model, opt=opt, on_step=on_step, **kwargs
    )
    return run


def replica_group():
    """The ranks that hold the same parameters (None: every rank)."""
    if SETUP != "pp2_sharding2":
        return None
    return fleet.get_hybrid_communicate_group().get_sharding_parallel_group()


def compare(after_step, split=one_list, prepare=None, lost=None):
    """Off, then on: bitwise-equal losses, reads and final parameters,
    equal parameters on the replicas, >= 3 sync units, no racing read.
    ``lost``: the first read's path (``"iteration"``, ``"compiled
    program"``) of the product's lost-overlap warning on global rank 0,
    whose reads alone wait for every sync of a step (every other rank: no
    warning)."""
    checker = race_checker()
    before = checker.races() if checker else {}
    off = train(False, after_step, split, prepare)
    with training.lost_overlap_warnings() as said:
        on = train(True, after_step, split, prepare)
    digests = [zlib.crc32(v.tobytes()) for _, v in sorted(on.state.items())]
    if replica_group() is None:
        replicas_equal = training.all_ranks_equal(digests)
    else:
        replicas_equal = hybrid.equal_in_group(digests, replica_group())
    what = f"{SETUP} {sys._getframe(1).f_code.co_name}"  # the case
    training.assert_bitwise_equal(
        (off.losses, off.state), (on.losses, on.state), what
    )
    assert len(off.reads) == len(on.reads), (what, len(off.reads))
    for i, (a, b) in enumerate(zip(off.reads, on.reads)):
        assert (
            a.dtype == b.dtype and a.tobytes() == b.tobytes()
        ), f"{what}: value {i} read between steps differs from overlap off"
    assert replicas_equal, f"{what}: parameters differ across the replicas"
    units = [len(overlap_impl(opt).units) for opt in on.opts]
    assert units[0] >= 3, f"{what}: sync units {units}"
    if lost is None or rank() != 0:
        assert said == [], (what, said)
    elif len(on.opts) == 1:
        training.assert_lost_overlap_warning(said, lost, units[0], units[0])
    else:  # once per owner, each naming its own count
        assert len(said) == len(on.opts), (what, said)
        assert all(f"(first: {lost} at " in m for m in said), (what, said)
        for n in units:  # this owner's units, all waited by the reads
            assert any(f"{n} of the {n} " in m for m in said), (what, said)
    races = {}
    if checker:
        races = {k: n - before.get(k, 0) for k, n in checker.races().items()}
        races = {k: n for k, n in races.items() if n}
    print(
        f"rank {rank()} {what}: sync units {units}, {len(on.reads)} values "
        f"read, stats {overlap_impl(on.opts[0]).stats}, racing reads "
        f"{sum(races.values()) if checker else '(race check off)'}",
        flush=True,
    )
    return on, races


def assert_no_race(races):
    assert races == {}, f"reads of a parameter with a pending sync: {races}"


def all_reduce_group():
    """dp2_sharding2: the data-parallel group; else the world."""
    if SETUP != "dp2_sharding2":
        return None
    return fleet.get_hybrid_communicate_group().get_data_parallel_group()


# ----------------------------------------------------------------------
# cases
def save_on_rank0_then_barrier(folder):
    def after_step(step, run):
        values = []
        if rank() == 0:
            path = os.path.join(folder, "model.pdparams")
            paddle.save(run.model.state_dict(), path)
            values = list(paddle.load(path).values())
        paddle.distributed.barrier()
        return values

    return after_step


def case_rank0_save_then_barrier():
    """P1: ``if rank == 0: paddle.save(model.state_dict())``, then a
    barrier (the world)."""
    with tempfile.TemporaryDirectory(prefix=f"schedule_r{rank()}_") as d:
        assert_no_race(
            compare(save_on_rank0_then_barrier(d), lost="iteration")[1]
        )


def case_rank0_forward_then_all_reduce():
    """P2: rank 0 alone runs a no-grad forward, then every rank all-reduces
    a loss (dp2_sharding2: over the data-parallel group)."""

    def after_step(step, run):
        loss = paddle.zeros([1])
        if rank() == 0:
            with paddle.no_grad():
                loss = training.lm_loss(run.model, 50 + step).reshape([1])
        paddle.distributed.all_reduce(loss, group=all_reduce_group())
        return [loss]

    assert_no_race(compare(after_step)[1])


def case_rank0_parameters_then_all_gather_object():
    """P3: rank 0 alone reads ``model.parameters()`` (the first one's
    dtype), then every rank all-gathers an object."""

    def after_step(step, run):
        mine = str(run.model.parameters()[0].dtype) if rank() == 0 else None
        gathered = []
        paddle.distributed.all_gather_object(gathered, [step, mine])
        return [np.frombuffer(repr(gathered).encode(), dtype=np.uint8)]

    assert_no_race(compare(after_step, lost="iteration")[1])


def case_rank0_to_static_then_all_reduce():
    """P4: rank 0 alone runs a ``paddle.jit.to_static`` program of the
    model's forward between steps, then an all-reduce."""
    tokens = training.batch(60)[0]

    def prepare(run):
        if rank() == 0:
            run.static = paddle.jit.to_static(run.raw.forward, full_graph=True)

    def after_step(step, run):
        value = paddle.zeros([1])
        if rank() == 0:
            with paddle.no_grad():
                value = run.static(tokens).mean().reshape([1])
        paddle.distributed.all_reduce(value)
        return [value]

    assert_no_race(
        compare(after_step, prepare=prepare, lost="compiled program")[1]
    )


def case_eval_lengths_differ_then_all_reduce():
    """P5: rank r runs r + 1 eval forwards under no_grad, then the metric
    is all-reduced."""

    def after_step(step, run):
        metric = paddle.zeros([1])
        run.model.eval()
        with paddle.no_grad():
            for i in range(rank() + 1):
                metric += training.lm_loss(run.model, 70 + i).reshape([1])
        run.model.train()
        paddle.distributed.all_reduce(metric)
        return [metric]

    assert_no_race(compare(after_step)[1])


def case_two_optimizers_rank0_save_then_barrier():
    """P6: two optimizers over two parameter subsets of one model, both
    overlapped, and P1's rank-0 save."""

    def split(raw):
        body = [
            p for n, p in raw.named_parameters() if not n.startswith("head")
        ]
        return [body, raw.head.parameters()]

    with tempfile.TemporaryDirectory(prefix=f"schedule_r{rank()}_") as d:
        assert_no_race(
            compare(save_on_rank0_then_barrier(d), split, lost="iteration")[1]
        )


def case_ema_of_the_optimizers_parameters():
    """P7: an EMA of the list handed to the optimizer, kept from before
    training (``ema = [p.clone() for p in params]``), updated right after
    each step (``e.set_value(e * 0.9 + p * 0.1)``): equal to overlap off.
    These are reads no hook sees: the race checker must name them (on gloo
    the values are right: the collective has finished when it returns)."""

    def prepare(run):
        run.ema = [p.clone() for p in run.params]

    def after_step(step, run):
        for e, p in zip(run.ema, run.params):
            e.set_value(e * 0.9 + p * 0.1)
        return [e.numpy() for e in run.ema]

    on, races = compare(after_step, prepare=prepare)
    if race_checker() is None:
        return
    names = {p.name for p in on.params}
    named = {name for name, _, _ in races}
    assert named <= names, f"racing reads beside the EMA's: {races}"
    assert named == names, f"EMA reads not named: {sorted(names - named)}"
    print(f"rank {rank()} race check named the EMA reads of {sorted(named)}")


def case_pipeline_of_sharding_rank0_eval_batch_then_barrier():
    """pp2_sharding2: the pipeline of sharding rank 0 (global ranks 0 and
    2) alone runs ``eval_batch``, then every rank a barrier."""
    hcg = fleet.get_hybrid_communicate_group()
    evaluates = hcg.get_sharding_parallel_rank() == 0
    pipe = hcg.get_pipe_parallel_group().ranks
    assert pipe == ([0, 2] if evaluates else [1, 3]), pipe

    def after_step(step, run):
        values = []
        if evaluates:
            data = list(hybrid.data(100 + step))
            loss = run.model.eval_batch(data, compute_loss=True)
            values = [loss if loss is not None else np.zeros([1])]
        paddle.distributed.barrier()
        return values

    assert_no_race(compare(after_step)[1])


CASES = {
    "v1": "rank0_save_then_barrier,rank0_forward_then_all_reduce,"
    "rank0_parameters_then_all_gather_object,"
    "rank0_to_static_then_all_reduce,eval_lengths_differ_then_all_reduce,"
    "two_optimizers_rank0_save_then_barrier,ema_of_the_optimizers_parameters",
    "dp2_sharding2": "rank0_save_then_barrier,rank0_forward_then_all_reduce",
    "pp2_sharding2": "pipeline_of_sharding_rank0_eval_batch_then_barrier",
}
CASES["v2"] = CASES["v1"]


def launch_cases():
    cases = training.cases_of(globals())
    return {n: cases[n] for n in CASES[SETUP].split(",")}


def main():
    """Run the cases; stop at the first that fails (its ranks are out of
    step: later cases would only add collectives after the one that broke,
    and each rank's last collective would not show where)."""
    init_fleet()
    cases = launch_cases()
    wanted = os.environ.get("BROADCAST_OVERLAP_CASES", "")
    names = [n for n in wanted.split(",") if n] or list(cases)
    for i, name in enumerate(names):
        if training.run_named(cases, [name]):
            print(
                f"stopped: {name} failed, not run: {names[i + 1 :]}", flush=True
            )
            return 1
    print(f"{len(names)} passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
