# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: the parameter-sync overlap when one rank's control flow between steps differs from the others'.

Right after every ``optimizer.step()`` some ranks do what the others do not (save, an eval forward, read
``parameters()``, run a compiled program, evaluate longer), then every rank joins one collective: a sync unit left to
start after ``step()`` would be started by the reading ranks alone (a hang or mixed data; the launcher checks after the
launch that the ranks' collectives form one schedule). Each case is :func:`compare`.

Env ``SCHEDULE_SETUP``: ``v1`` (2 ranks, ``_set_broadcast_overlap`` with 2 KB buckets; a group of the catalogue's
launch), ``v2`` (2 ranks, the all-gather script's V2 set-up; a group of its launch), and on 4 ranks with the hybrid
script's set-up (a group of its launch of the topology ``BROADCAST_OVERLAP_TOPOLOGY``) V1 ``dp2_sharding2`` and
``pp2_sharding2`` (one broadcast per parameter) and V2 ``v2_dp2_sharding2`` (1 MB comm buffers). ``BROADCAST_OVERLAP_CASES`` picks cases (default: the
set-up's); the first case that fails ends the launch. Each case asserts its topology and the race checker on."""

import contextlib
import os
import sys
import tempfile

import numpy as np
import sharding_cases as cases

import paddle
from paddle.distributed import fleet

SETUP = os.environ.get("SCHEDULE_SETUP", "v1")
V2 = SETUP.startswith("v2")  # "v2" (2 ranks) or "v2_dp2_sharding2" (4)
init_fleet = cases.init_fleet  # the set-up's fleet.init (groups of one launch must have the same)
if SETUP in ("dp2_sharding2", "pp2_sharding2", "v2_dp2_sharding2"):
    import dygraph_sharding_stage1_broadcast_overlap_hybrid as hybrid

    init_fleet = hybrid.init_fleet
if SETUP == "v2":
    import dygraph_sharding_stage1_allgather_overlap as allgather

    init_fleet = allgather.init_fleet
# fleet's (dp, pp, mp, sharding) degrees in the set-up's topology
DEGREES = {"dp2_sharding2": [2, 1, 1, 2], "pp2_sharding2": [1, 2, 1, 2]}.get(SETUP.replace("v2_", ""), [1, 1, 1, 2])


def build_model():
    if SETUP in ("v1", "v2"):
        return cases.seeded(allgather.LM if V2 else cases.TinyLM)
    models = {"dp2_sharding2": hybrid.flat_model, "v2_dp2_sharding2": hybrid.v2_model}  # V2: 4 comm buffers of 1 MB
    return hybrid.build_same(models.get(SETUP, lambda: hybrid.pipeline_model(tied=False)))


def one_list(raw):
    return [raw.parameters()]


def train(overlap, after_step, split=one_list, prepare=None, checker=None):
    """``cases.train`` of this set-up's model with one optimizer per list ``split(raw)`` returns (``run.held``: their
    parameters), the overlap on each when ``overlap``; ``after_step(run)`` returns the values it read (``run.extras``);
    ``prepare(run)`` before the first step; the wait checker ``checker`` watches each optimizer."""
    raw = build_model()
    # the V2 set-ups' comm buffers of 1 MB
    with cases.sharding_v2() if V2 else contextlib.nullcontext():
        opts = [fleet.distributed_optimizer(cases.adamw(p)) for p in split(raw)]
        model = fleet.distributed_model(raw)
    enable = cases.v2 if V2 else cases.v1(2 * cases.KB if SETUP == "v1" else 0)
    for opt in opts if overlap else ():
        enable(cases.Run(model=model, opt=opt))
    for opt in opts if checker is not None else ():
        checker.watch(model, opt)
    opt = opts[0] if len(opts) == 1 else cases.Optimizers(opts)
    # pp2_sharding2: train_batch runs the optimizer
    kwargs = dict(micro_step=hybrid.train_batch, update=cases.no_update) if SETUP == "pp2_sharding2" else {}

    def set_up(run):
        run.opts, run.held = opts, [p for ps in split(raw) for p in ps]
        if prepare is not None:
            prepare(run)

    return cases.train(cases.Build.of(model, opt), prepare=set_up, after_step=after_step, **kwargs)


def compare(after_step, split=one_list, prepare=None, lost=None, race=False):
    """Off, then on: bitwise-equal losses, reads and final parameters, equal parameters on the replicas (pp2_sharding2: the
    sharding group), >= 3 sync units, no racing read unless ``race`` (returns the races seen). ``lost``: the path of the
    reads on global rank 0 alone that wait for every sync of a step: each owner's steps lost there (no warning in these
    short runs), on no other rank. The schedule of the on run: every sync started inside a step (the wait checker's
    ``outside_step``), every unit of each owner pending right after each step (before ``after_step``), each launched
    once per step, as often on every rank of the sharding group."""
    checker = sys.modules.get("paddle_overlay.race_check")  # on: the launch's PADDLE_OVERLAY_CHECK, read at start-up
    assert checker is not None and checker.is_enabled(), "race check off"
    before = checker.races()
    hcg = fleet.get_hybrid_communicate_group()
    degrees = [getattr(hcg, f"get_{k}_parallel_world_size")() for k in ("data", "pipe", "model", "sharding")]
    assert degrees == DEGREES, f"{SETUP}: fleet's (dp, pp, mp, sharding) degrees {degrees}, not {DEGREES}"
    pending = []

    def checked_after_step(run):
        impls = [cases.overlap_impl(opt) for opt in run.opts]
        if impls[0] is not None:
            due = [sum(u.needs_sync() for u in i.units) for i in impls]
            pending.append([(i.num_pending, n) for i, n in zip(impls, due)])
        return after_step(run)

    off = train(False, after_step, split, prepare)
    with cases.lost_overlap_warnings() as said:
        with cases.ParamSyncWaitChecker() as waits:
            on = train(True, checked_after_step, split, prepare, waits)
    impls = [cases.overlap_impl(opt) for opt in on.opts]
    units = [len(impl.units) for impl in impls]
    launched = [impl.stats["launched"] for impl in impls]
    # pp2: the sharding group; V2 in dp2: the sharding group too (Paddle's V2 leaves the data-parallel replicas unequal,
    # off and on alike)
    by_group = SETUP in ("pp2_sharding2", "v2_dp2_sharding2")
    group = hcg.get_sharding_parallel_group() if by_group else None
    replicas_equal = cases.equal_in_group(cases.digests(on.params), group)
    sharding = hcg.get_sharding_parallel_group()
    launched_equal = cases.equal_in_group(launched, sharding)
    frame = sys._getframe(1)
    while not frame.f_code.co_name.startswith("case_"):
        frame = frame.f_back
    what = f"{SETUP} {frame.f_code.co_name}"  # the case
    assert waits.counts["launched"] > 0, (what, waits.counts)
    assert waits.outside_step == [], (what, waits.outside_step[:8])
    cases.assert_runs_equal(off, on, what)
    assert replicas_equal, f"{what}: parameters differ across the replicas"
    assert units[0] >= 3, f"{what}: sync units {units}"
    steps = cases.STEPS
    assert pending == [[(n, n) for n in units]] * steps, (what, pending)
    assert launched == [steps * n for n in units], (what, launched, units)
    assert launched_equal, f"{what}: launches differ across the group"
    if lost is None or cases.rank() != 0:
        assert said == [], (what, said)
        history = [cases.lost_steps_of(opt) for opt in on.opts]
        assert not any(map(any, history)), (what, history)
    else:  # every owner's steps, each followed by a training forward
        for opt in on.opts:
            cases.assert_overlap_lost(said, opt, lost, steps - 1)
    races = {k: n - before.get(k, 0) for k, n in checker.races().items()}
    races = {k: n for k, n in races.items() if n}
    stats = f"sync units {units}, {len(on.extras)} values read, {impls[0].stats}, racing reads {sum(races.values())}"
    print(f"rank {cases.rank()} {what}: {stats}", flush=True)
    assert race or races == {}, f"reads of a parameter with a pending sync: {races}"
    return on, races


# ----------------------------------------------------------------------
# cases
def rank0_save_then_barrier(split=one_list):
    """Rank 0 alone saves ``state_dict()`` right after each step (and loads it: the values compared off and on), then a
    barrier of the world: rank 0's reads waited for every unit of every step, the last file holds the final parameters;
    every other rank waited on a read only at the final ``state_dict()``, once per unit."""
    with tempfile.TemporaryDirectory(prefix=f"schedule_r{cases.rank()}_") as d:

        def after_step(run):
            values = []
            if cases.rank() == 0:
                path = os.path.join(d, "model.pdparams")
                paddle.save(run.model.state_dict(), path)
                run.saved = paddle.load(path)
                values = list(run.saved.values())
            paddle.distributed.barrier()
            return values

        on, _ = compare(after_step, split, lost="iteration")
    steps = cases.STEPS if cases.rank() == 0 else 1
    for impl in map(cases.overlap_impl, on.opts):
        waited = impl.stats["waited_on_read"]
        assert waited == steps * len(impl.units), (waited, dict(impl.stats))
    for k, v in getattr(on, "saved", {}).items():
        assert np.array(v).tobytes() == on.params[k].tobytes(), k


def case_rank0_save_then_barrier():
    """P1: ``if rank == 0: paddle.save(model.state_dict())``, then a barrier (the world)."""
    rank0_save_then_barrier()


def case_rank0_forward_then_all_reduce():
    """P2: rank 0 alone runs a no-grad forward, then every rank all-reduces a loss (dp2_sharding2: over the data-parallel
    group)."""

    hcg = fleet.get_hybrid_communicate_group()
    group = hcg.get_data_parallel_group() if "dp2" in SETUP else None

    def after_step(run):
        loss = paddle.zeros([1])
        if cases.rank() == 0:
            with paddle.no_grad():
                loss = cases.lm_loss(run.model, 50 + run.step).reshape([1])
        paddle.distributed.all_reduce(loss, group=group)
        return [loss]

    compare(after_step)


def case_rank0_parameters_then_all_gather_object():
    """P3: rank 0 alone reads ``model.parameters()`` (the first one's dtype), then every rank all-gathers an object."""

    def after_step(run):
        mine = str(run.model.parameters()[0].dtype) if cases.rank() == 0 else None
        gathered = []
        paddle.distributed.all_gather_object(gathered, [run.step, mine])
        return [np.frombuffer(repr(gathered).encode(), dtype=np.uint8)]

    compare(after_step, lost="iteration")


def case_rank0_to_static_then_all_reduce():
    """P4: rank 0 alone runs a ``paddle.jit.to_static`` program of the model's forward between steps, then an all-reduce."""
    tokens = cases.batch(60)[0]

    def prepare(run):
        if cases.rank() == 0:
            run.static = paddle.jit.to_static(run.raw.forward, full_graph=True)

    def after_step(run):
        value = paddle.zeros([1])
        if cases.rank() == 0:
            with paddle.no_grad():
                value = run.static(tokens).mean().reshape([1])
        paddle.distributed.all_reduce(value)
        return [value]

    compare(after_step, prepare=prepare, lost="compiled program")


def case_eval_lengths_differ_then_all_reduce():
    """P5: rank r runs r + 1 eval forwards under no_grad, then the metric is all-reduced."""

    def after_step(run):
        metric = paddle.zeros([1])
        run.model.eval()
        with paddle.no_grad():
            for i in range(cases.rank() + 1):
                metric += cases.lm_loss(run.model, 70 + i).reshape([1])
        run.model.train()
        paddle.distributed.all_reduce(metric)
        return [metric]

    compare(after_step)


def case_two_optimizers_rank0_save_then_barrier():
    """P6: two optimizers over two parameter subsets of one model, both overlapped, and P1's rank-0 save."""

    def split(raw):
        body = [p for n, p in raw.named_parameters() if not n.startswith("head")]
        return [body, raw.head.parameters()]

    rank0_save_then_barrier(split)


def case_ema_of_the_optimizers_parameters():
    """P7: an EMA of the list handed to the optimizer, kept from before training (``ema = [p.clone() for p in params]``),
    updated right after each step (``e.set_value(e * 0.9 + p * 0.1)``): equal to overlap off. These are reads no hook
    sees: the race checker must name them (on gloo the values are right: the collective has finished when it returns).
    """

    def prepare(run):
        run.ema = [p.clone() for p in run.held]

    def after_step(run):
        for e, p in zip(run.ema, run.held):
            e.set_value(e * 0.9 + p * 0.1)
        return [e.numpy() for e in run.ema]

    on, races = compare(after_step, prepare=prepare, race=True)
    names = {p.name for p in on.held}
    named = {name for name, _, _ in races}
    assert named <= names, f"racing reads beside the EMA's: {races}"
    assert named == names, f"EMA reads not named: {sorted(names - named)}"
    print(f"rank {cases.rank()} race check named the EMA reads of {sorted(named)}")


def case_pipeline_of_sharding_rank0_eval_batch_then_barrier():
    """pp2_sharding2: the pipeline of sharding rank 0 (global ranks 0 and 2) alone runs ``eval_batch``, then every rank a
    barrier."""
    hcg = fleet.get_hybrid_communicate_group()
    evaluates = hcg.get_sharding_parallel_rank() == 0
    pipe = hcg.get_pipe_parallel_group().ranks
    assert pipe == ([0, 2] if evaluates else [1, 3]), pipe

    def after_step(run):
        values = []
        if evaluates:
            data = list(hybrid.data(100 + run.step))
            loss = run.model.eval_batch(data, compute_loss=True)
            values = [loss if loss is not None else np.zeros([1])]
        paddle.distributed.barrier()
        return values

    compare(after_step)


def launch_cases():
    found = cases.cases_of(globals())
    names = list(found)  # the pipeline case last
    pick = {"dp2_sharding2": names[:2], "pp2_sharding2": names[-1:], "v2_dp2_sharding2": names[:2]}
    return {n: found[n] for n in pick.get(SETUP, names[:-1])}


if __name__ == "__main__":
    sys.exit(cases.run_cases(launch_cases(), init=init_fleet, stop_at_first_failure=True))
