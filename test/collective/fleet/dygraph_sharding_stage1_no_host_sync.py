# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script (2 ranks): the parameter-sync overlap adds no host synchronisation and no blocking collective to the
steady-state step, in every mode (one case each).

Each mode trains the same model from the same weights and data overlap off (Paddle's blocking sync; the overlay applied)
and on for :data:`STEPS` steps, counting with ``blocking_calls.BlockingCallCounter`` in each ``step()`` of the fleet
optimizer and each forward + backward; collectives inside the sharding optimizer's ``_sharding_sync_parameters``
(Paddle's sync) and the owner's ``launch`` (the overlap's, which fleet's ``HybridParallelOptimizer`` defers to the end
of its step) carry the phase ``param_sync``. :func:`check_step` lists what holds in each step; after every step every
unit is in flight. Losses and final parameters are bitwise equal on vs off and equal on every rank. The optimizer is
AdamW with ``ClipGradByGlobalNorm`` (fleet's hybrid clip all-reduces the norm inside ``step()``: a collective that must
not change). ``case_counter_sees_every_name`` first checks the counter itself on this release."""

import collections
import contextlib
import operator
import sys
import warnings

import hybrid_parallel_cpu_shim
import numpy as np
import sharding_cases as cases
from blocking_calls import BlockingCallCounter, core

import paddle

STEPS = 4  # step 0 agrees the order; steps 1.. are the steady state
PARAM_SYNC = "param_sync"

Mode = collections.namedtuple("Mode", "v2 bucket_mb tensor_fusion")


def make_optimizer(parameters):
    return cases.adamw(parameters, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))


def enable(mode):
    """Overlap on as PaddleFormers calls it."""

    def on(run):  # (bucket_mb None: the default)
        (cases.v2 if mode.v2 else cases.v1(mode.bucket_mb))(run)
        assert cases.overlap_impl(run.opt) is not None, "no overlap owner"

    return on


def paddle_sync_count(mode, inner):
    """The collectives of Paddle's own blocking parameter sync per step."""
    if mode.v2:
        return len(inner._comm_buffer_list)
    valid = inner._rank2fused if inner.tensor_fusion else inner._rank2params
    return sum(len(v) for v in valid.values())


def train(mode, overlap):
    """One counted ``cases.train`` run; adds ``steps`` (a ``Region`` per ``step()``), ``fwd_bwd`` (per forward + backward),
    ``pending`` (after each step, on only: the owner's units in flight and units needing a sync), ``paddle`` (Paddle's
    blocking sync count), ``inner``, ``owner``."""
    if mode.v2:
        settings, around = cases.sharding_v2(), contextlib.nullcontext
    else:
        settings = cases.sharding_configs(tensor_fusion=mode.tensor_fusion)
        around = hybrid_parallel_cpu_shim.cpu_tensor_fusion  # item 6
    pending = []
    with settings, BlockingCallCounter() as counter:

        def prepare(run):
            run.inner = cases.sharding_optimizer(run.opt)
            run.paddle = paddle_sync_count(mode, run.inner)
            counter.tag_phase(run.inner, "_sharding_sync_parameters", PARAM_SYNC)
            if overlap:  # its launch may be deferred to the end of step()
                counter.tag_phase(cases.overlap_impl(run.opt), "launch", PARAM_SYNC)
            counter.count_calls_of(run.opt, "step")

        def micro_step(run):
            with counter.counting("fwd_bwd"):
                loss = cases.lm_loss(run.model, run.step)
                loss.backward()
            return loss

        def after_step(run):
            if overlap:
                owner = cases.overlap_impl(run.opt)
                pending.append((owner.num_pending, sum(u.needs_sync() for u in owner.units)))

        model = cases.WideLM if mode.v2 else cases.TinyLM
        run = cases.train(
            cases.Build(model, optimizer=make_optimizer, around=around),
            overlap,
            steps=STEPS,
            enable=enable(mode),
            prepare=prepare,
            micro_step=micro_step,
            after_step=after_step,
        )
        run.steps, run.fwd_bwd = counter.regions["step"], counter.regions["fwd_bwd"]
        run.owner, run.pending = cases.overlap_impl(run.opt), pending
    assert len(run.steps) == STEPS, len(run.steps)
    return run


# ----------------------------------------------------------------------
# checks
def outside_phase(region):
    """Counter of the collectives outside ``param_sync``."""
    return collections.Counter(c.key for c in region.collectives_of(phase=None))


def diff(on, off):
    """``on - off`` per key, the non-zero ones."""
    d = {k: on.get(k, 0) - off.get(k, 0) for k in set(on) | set(off)}
    return {k: v for k, v in d.items() if v}


def check_step(name, s, mode, off, on):
    """Step ``s``, on vs off: 1. the same count of every host synchronisation name, but at step 0 the order agreement's two
    ``.numpy()``; 2. the same collectives outside ``param_sync`` (gradient reduce, the clip's all-reduce), per name and
    blocking/async; 3. on, ``param_sync`` is exactly one asynchronous process-group collective per unit, not waited
    inside ``step()`` (at step 0 after the agreement's two blocking int64 broadcasts of the group), nothing else; 4.
    off, it is Paddle's: one blocking ``pg.broadcast`` per entry of ``_rank2params`` (``_rank2fused``) or
    ``pg.all_gather`` per comm buffer; 5. no task of before ``step()`` waited in it; 6. forward + backward: the same
    host syncs and collectives (the overlap's pre-hooks only wait)."""
    a, b = off.steps[s], on.steps[s]
    what = f"{name} step {s}"
    host = diff(b.host_syncs, a.host_syncs)
    agreement = {"tensor.numpy": 2} if s == 0 else {}
    assert host == agreement, f"{what}: host syncs in step() on - off: {host}"
    other = diff(outside_phase(b), outside_phase(a))
    assert not other, f"{what}: collectives outside the parameter sync, on - off: {other}"
    kind = "all_gather" if mode.v2 else "broadcast"
    mine = sorted(c.key for c in b.collectives_of(phase=PARAM_SYNC))
    units = len(on.owner.units)
    expected = ["pg.broadcast blocking"] * len(agreement) * 2
    expected += [f"pg.{kind} async"] * units
    assert mine == sorted(expected), (
        f"{what}: on, param_sync issued {mine}, expected {units} x " f"pg.{kind} async (one per unit)"
    )
    theirs = [c.key for c in a.collectives_of(phase=PARAM_SYNC)]
    assert theirs == [f"pg.{kind} blocking"] * off.paddle, (
        f"{what}: off, param_sync issued {theirs}, Paddle syncs with " f"{off.paddle} x pg.{kind} blocking"
    )
    assert b.waits["task.wait earlier"] == 0, b.waits
    f_off, f_on = off.fwd_bwd[s], on.fwd_bwd[s]
    host = diff(f_on.host_syncs, f_off.host_syncs)
    coll = diff(outside_phase(f_on), outside_phase(f_off))
    assert not host and not coll, f"{what}: forward + backward on - off: host syncs {host}, " f"collectives {coll}"


# ----------------------------------------------------------------------
# the counter itself, on this release
def case_counter_sees_every_name():
    """Every name the counter wraps is counted once per call, only inside a region, nested host syncs once; waits mark
    their collective blocking."""
    group = paddle.distributed.collective._get_default_group()
    originals = (vars(core.task)["wait"], vars(paddle.Tensor)["numpy"])
    x, i, t = paddle.to_tensor(1.5), paddle.to_tensor(2), paddle.ones([4])
    full, shard = paddle.zeros([4]), paddle.ones([2])
    calls = {  # each host-sync method of this release, by what calls it
        "numpy": lambda: x.numpy(),
        "item": lambda: x.item(),
        "tolist": lambda: x.tolist(),
        "__array__": lambda: np.asarray(x),
        "__bool__": lambda: bool(x),
        "__float__": lambda: float(x),
        "__int__": lambda: int(i),
        "__index__": lambda: operator.index(i),
        "__complex__": lambda: complex(x),
        "cpu": lambda: x.cpu(),
        "__repr__": lambda: repr(x),
        "__str__": lambda: str(x),
        "__format__": lambda: format(x, ""),
    }
    calls = {m: c for m, c in calls.items() if m in vars(paddle.Tensor)}
    with BlockingCallCounter() as counter:
        x.numpy()  # outside any region: not counted
        with counter.counting("probe") as region:
            for call in calls.values():
                call()
            for device in (paddle.device, paddle.device.cuda):
                with contextlib.suppress(Exception), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # cuda's is deprecated
                    device.synchronize()  # the CPU build may refuse: counted
            paddle.distributed.all_reduce(t)  # sync_op=True: Paddle waits
            # waited in the region: blocking
            paddle.distributed.broadcast(t, src=0, sync_op=False).wait()
            late = paddle.distributed.broadcast(t, src=0, sync_op=False)
            gather = group.process_group.all_gather(shard, full)
        late.wait()
        gather.wait()
        with counter.counting("barrier") as barrier:
            paddle.distributed.barrier()
    expected = collections.Counter(f"tensor.{m}" for m in calls)
    expected.update(["device.synchronize", "device.cuda.synchronize"])
    expected.update(["pg.all_reduce blocking", "pg.broadcast blocking"])
    expected.update(["pg.broadcast async", "pg.all_gather async"])
    expected.update(["task.wait"] * 2)
    got = region.counts()
    assert got == expected, diff(got, expected)
    assert counter.regions["probe"] == [region]
    # the barrier's process-group call and waits are the release's own
    assert barrier.collectives_of(), "no process-group call seen"
    now = (vars(core.task)["wait"], vars(paddle.Tensor)["numpy"])
    assert all(a is b for a, b in zip(now, originals)), "not restored"
    if cases.rank() == 0:
        print(f"counter probe on Paddle {paddle.__version__}: {dict(got)}")


def check_mode(name, *mode):
    """The checks of the module docstring for ``Mode(*mode)``; returns ``(off, on, the owner's number of units)``."""
    mode = Mode(*mode)
    off, on = (train(mode, overlap) for overlap in (False, True))
    same_on_ranks = cases.equal_in_group(cases.digests(on.params))
    cases.assert_bitwise_equal((off.losses, off.params), (on.losses, on.params), name)
    assert same_on_ranks, f"{name}: final parameters differ across ranks"
    units = len(on.owner.units)
    # after each step every unit needs a sync and is left in flight
    assert on.pending == [(units, units)] * STEPS, (on.pending, units)
    for s in range(STEPS):
        check_step(name, s, mode, off, on)
    return off, on, units


def case_v1_per_parameter():
    """V1, one broadcast per parameter (bucket_size_mb=0): a unit each."""
    off, on, units = check_mode("v1_per_parameter", False, 0, False)
    assert units == len(cases.optimizer_parameters(on.opt)), units


def case_v1_buckets_default():
    """V1, default buckets (256 MB): one per owner rank."""
    off, on, units = check_mode("v1_buckets_default", False, None, False)
    assert units == 2, units


def case_v1_buckets_small():
    """V1, 2 KB buckets: several, fewer than the parameters."""
    off, on, units = check_mode("v1_buckets_small", False, 2 * cases.KB, False)
    assert 2 < units < len(cases.optimizer_parameters(off.opt)), units


def case_v1_fused_slices_default():
    """V1 fused slices (``tensor_fusion``, shim's ``cpu_tensor_fusion``), default cap: a unit per Paddle fused buffer."""
    off, on, units = check_mode("v1_fused_slices_default", False, None, True)
    assert off.inner.tensor_fusion and off.inner._rank2fused
    assert units == off.paddle, (units, off.paddle)


def case_v1_fused_slices_small():
    """V1 fused slices, 2 KB cap: more units than Paddle's fused buffers."""
    off, on, units = check_mode("v1_fused_slices_small", False, 2 * cases.KB, True)
    assert off.inner.tensor_fusion
    assert units > off.paddle, (units, off.paddle)


def case_v2_comm_buffers():
    """V2 (``split_param``, 1 MB comm buffers: 4 for WideLM; shim items 7 to 9): a unit per comm buffer."""
    off, on, units = check_mode("v2_comm_buffers", True, None, False)
    cases.assert_v2(on.opt)
    assert units == off.paddle >= 3, (units, off.paddle)


if __name__ == "__main__":
    sys.exit(cases.run_cases(cases.cases_of(globals())))
