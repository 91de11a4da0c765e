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
"""Per-rank script: the parameter-sync overlap adds no host synchronisation
and no blocking collective to the steady-state step, in every mode.

Run under ``python -m paddle.distributed.launch --nproc_per_node 2``; cases
chosen with env ``BROADCAST_OVERLAP_CASES`` (all when unset). Each mode
case trains the same model from the same weights and data twice, overlap
off (Paddle's blocking parameter sync; the overlay applied) and on, for
:data:`STEPS` steps, counting with ``blocking_calls.BlockingCallCounter``
inside the fleet optimizer's ``step()`` (each call one region) and inside
forward + backward; the collectives issued inside the sharding optimizer's
``_sharding_sync_parameters`` (Paddle's blocking sync) and inside the
owner's ``launch`` (the overlap's; fleet's ``HybridParallelOptimizer``
defers it to the end of its step) carry the phase ``param_sync``. For every step after
the first (which agrees the order), on vs off:

- every host-synchronisation name (``tensor.numpy``, ``tensor.item``, ...,
  ``device.synchronize``, ``task.synchronize``): the same count;
- every collective outside ``param_sync`` (gradient reduce, the global-norm
  clip's all-reduce), per level (``dist.*``, ``pg.*``), name and
  blocking/async: the same count;
- ``param_sync``, on: exactly one ``pg.<collective>`` per unit needing a
  sync (``get_param_sync_overlap(opt).units``), each asynchronous and not
  waited inside ``step()``; for V1 each through ``paddle.distributed.
  broadcast(sync_op=False)``; nothing else (no host sync, no other
  collective);
- ``param_sync``, off: what Paddle does: one blocking ``pg.broadcast`` per
  entry of ``_rank2params`` (``_rank2fused`` with ``tensor_fusion``), V1,
  or ``pg.all_gather`` per comm buffer, V2;
- forward + backward: the same host syncs and collectives (the overlap's
  pre-hooks only wait).

And, as the other scripts: losses and final parameters bitwise equal on vs
off, the final parameters equal on every rank. The first step's extra work
(the order agreement: two blocking int64 broadcasts and their reads) is
printed and checked as documented.

Modes (:data:`MODES`): V1 per parameter (``bucket_size_mb=0``), V1 buckets
(default 256 MB: one per owner rank; 2 KB: several), V1 fused slices
(``sharding_configs.tensor_fusion``, default and 2 KB caps;
``hybrid_parallel_cpu_shim.cpu_tensor_fusion`` on the CPU), V2
(``split_param``, 1 MB comm buffers: 4 for WideLM; shim items 7 to 9).
The optimizer is AdamW with ``ClipGradByGlobalNorm`` (fleet's hybrid clip
all-reduces the norm inside ``step()``: a collective that must not change).
``case_counter_sees_every_name`` first checks the counter itself on this
release. Rank 0 prints a table per mode.
"""

import collections
import contextlib
import operator
import sys
import types
import warnings
import zlib

import broadcast_overlap_training as training
import hybrid_parallel_cpu_shim  # noqa: I001 (before fleet.init)
import numpy as np
from blocking_calls import BlockingCallCounter, is_host_sync
from broadcast_overlap_training import (
    TinyLM,
    all_ranks_equal,
    assert_bitwise_equal,
    build_with_initial_state,
    cases_of,
    lm_loss,
    overlap_impl,
    rank,
    run_cases,
)

import paddle
from paddle.distributed import all_reduce as all_reduce_imported_by_name
from paddle.distributed import fleet

STEPS = 4  # step 0 agrees the order; steps 1.. are the steady state
KB = 1 / 1024  # in MB
BUFFER_MB = 1  # V2 comm buffers (comm_buffer_size_MB, shim item 9 on 2.6)
PARAM_SYNC = "param_sync"

Mode = collections.namedtuple("Mode", "v2 bucket_mb tensor_fusion")
MODES = {
    "v1_per_parameter": Mode(False, 0, False),
    "v1_buckets_default": Mode(False, None, False),  # 256 MB
    "v1_buckets_small": Mode(False, 2 * KB, False),
    "v1_fused_slices_default": Mode(False, None, True),
    "v1_fused_slices_small": Mode(False, 2 * KB, True),
    "v2_comm_buffers": Mode(True, None, False),
}


def WideLM():
    """TinyLM with 3 blocks of width 256 (about 3.2 MB fp32: 4 V2 comm
    buffers of 1 MB)."""
    return TinyLM(num_blocks=3, hidden=256)


# ----------------------------------------------------------------------
# set-up
def mode_settings(mode):
    if mode.v2:
        return training.sharding_configs(
            ("comm_buffer_size_MB",),
            split_param=True,
            comm_buffer_size_MB=BUFFER_MB,
        )
    return training.sharding_configs(tensor_fusion=mode.tensor_fusion)


def make_optimizer(parameters):
    return paddle.optimizer.AdamW(
        learning_rate=0.01,
        parameters=parameters,
        weight_decay=0.01,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
    )


def build(mode):
    """(fleet model, fleet optimizer) of ``mode`` (settings active)."""
    raw = build_with_initial_state(WideLM if mode.v2 else TinyLM)
    if mode.v2:
        with hybrid_parallel_cpu_shim.cpu_sharding_v2(BUFFER_MB):
            opt = fleet.distributed_optimizer(make_optimizer(raw.parameters()))
            model = fleet.distributed_model(raw)
    else:
        with hybrid_parallel_cpu_shim.cpu_tensor_fusion():  # item 6
            opt = fleet.distributed_optimizer(make_optimizer(raw.parameters()))
        model = fleet.distributed_model(raw)
    return model, opt


def enable(mode, model, opt):
    """Overlap on, as PaddleFormers calls it."""
    if mode.v2:
        opt._set_all_gather_overlap_forward(True, model)
    else:
        kwargs = (
            {} if mode.bucket_mb is None else {"bucket_size_mb": mode.bucket_mb}
        )
        opt._set_broadcast_overlap(True, layers=model, **kwargs)
    assert overlap_impl(opt) is not None, "no overlap owner: not the product"


def paddle_sync_count(mode, inner):
    """The collectives of Paddle's own blocking parameter sync per step."""
    if mode.v2:
        return len(inner._comm_buffer_list)
    valid = inner._rank2fused if inner.tensor_fusion else inner._rank2params
    return sum(len(v) for v in valid.values())


def train(mode, overlap):
    """One run; a namespace: ``losses``, ``params``, ``steps`` (a
    ``Region`` per ``step()``), ``fwd_bwd`` (per forward + backward),
    ``due`` (units needing a sync after each step; on only), ``paddle``
    (Paddle's blocking sync count), ``inner``."""
    run = types.SimpleNamespace(due=[])
    with mode_settings(mode), BlockingCallCounter() as counter:
        model, opt = build(mode)
        if overlap:
            enable(mode, model, opt)
        run.inner = opt._inner_opt
        run.paddle = paddle_sync_count(mode, run.inner)
        counter.tag_phase(run.inner, "_sharding_sync_parameters", PARAM_SYNC)
        if overlap:  # its launch may be deferred to the end of step()
            counter.tag_phase(overlap_impl(opt), "launch", PARAM_SYNC)
        counter.count_calls_of(opt, "step")

        def micro_step(model, step, micro, acc_steps):
            with counter.counting("fwd_bwd"):
                loss = lm_loss(model, step)
                loss.backward()
            return loss

        def on_step(step, model, opt):
            if overlap:
                units = overlap_impl(opt).units
                run.due.append(sum(u.needs_sync() for u in units))

        done = training.train(
            model=model,
            opt=opt,
            steps=STEPS,
            micro_step=micro_step,
            on_step=on_step,
        )
        run.losses, run.params = done.losses, done.params
        run.steps = counter.regions["step"]
        run.fwd_bwd = counter.regions["fwd_bwd"]
        run.owner = overlap_impl(opt)
    assert len(run.steps) == STEPS, len(run.steps)
    return run


# ----------------------------------------------------------------------
# checks
def outside_phase(region):
    """Counter of the collectives outside ``param_sync``."""
    return collections.Counter(c.key for c in region.collectives_of(phase=None))


def nonzero(counter):
    return {k: v for k, v in counter.items() if v}


def diff(on, off):
    keys = set(on) | set(off)
    return nonzero({k: on.get(k, 0) - off.get(k, 0) for k in keys})


def check_steady_step(name, s, mode, off, on):
    """The module docstring's assertions for step ``s`` (>= 1)."""
    a, b = off.steps[s], on.steps[s]
    what = f"{name} step {s}"
    # 1. host synchronisations: the same, name by name
    host = diff(b.host_syncs, a.host_syncs)
    assert not host, f"{what}: host syncs inside step() on - off: {host}"
    # 2. every collective outside the parameter sync: the same
    other = diff(outside_phase(b), outside_phase(a))
    assert (
        not other
    ), f"{what}: collectives outside the parameter sync, on - off: {other}"
    # 3. on: the parameter sync is exactly the units, each async
    kind = "all_gather" if mode.v2 else "broadcast"
    due = on.due[s]
    mine = b.collectives_of(phase=PARAM_SYNC)
    pg = [c for c in mine if c.level == "pg"]
    assert [c.name for c in pg] == [kind] * due, (
        f"{what}: on, param_sync issued {[c.key for c in pg]}, expected "
        f"{due} x pg.{kind} (units needing a sync)"
    )
    blocking = [c.key for c in mine if c.blocking]
    assert not blocking, f"{what}: on, blocking param_sync calls {blocking}"
    python = [c for c in mine if c.level != "pg"]
    if mode.v2:  # Paddle's FusedCommBuffer call: the process group's
        assert not python, [c.key for c in python]
    else:
        assert [(c.level, c.name, c.sync) for c in python] == [
            ("dist", "broadcast", False)
        ] * due, [c.key for c in python]
    assert due == len(on.owner.units) > 0, (due, len(on.owner.units))
    # 4. off: Paddle's blocking sync
    theirs = a.collectives_of(phase=PARAM_SYNC, level="pg")
    assert [c.name for c in theirs] == [kind] * off.paddle, (
        f"{what}: off, param_sync issued {[c.key for c in theirs]}, Paddle "
        f"syncs with {off.paddle} x pg.{kind}"
    )
    assert all(c.blocking for c in theirs), [c.key for c in theirs]
    # 5. nothing pending reached step(): forward waited every unit
    assert b.waits["task.wait earlier"] == 0, b.waits
    # 6. forward + backward: the overlap's hooks only wait
    f_off, f_on = off.fwd_bwd[s], on.fwd_bwd[s]
    host = diff(f_on.host_syncs, f_off.host_syncs)
    coll = diff(outside_phase(f_on), outside_phase(f_off))
    assert not host and not coll, (
        f"{what}: forward + backward on - off: host syncs {host}, "
        f"collectives {coll}"
    )


def check_first_step(name, mode, off, on):
    """Step 0, on: the order agreement (two blocking int64 broadcasts of
    the group, read with ``.numpy()``) on top of the launch."""
    a, b = off.steps[0], on.steps[0]
    host = diff(b.host_syncs, a.host_syncs)
    assert host == {"tensor.numpy": 2}, f"{name} step 0: host syncs {host}"
    other = diff(outside_phase(b), outside_phase(a))
    assert not other, f"{name} step 0: other collectives on - off: {other}"
    mine = b.collectives_of(phase=PARAM_SYNC, level="pg")
    kind = "all_gather" if mode.v2 else "broadcast"
    agreement = [c for c in mine if c.blocking]
    assert [c.name for c in agreement] == ["broadcast"] * 2, [
        c.key for c in mine
    ]
    assert [c.name for c in mine if not c.blocking] == [kind] * on.due[0]


def same_on_every_step(regions, steps, of):
    values = [dict(of(regions[s])) for s in steps]
    return values[0] if all(v == values[0] for v in values) else values


def table(name, mode, off, on):
    """Rank 0 prints per key: off and on at step 0 and in the steady
    state (the same at every steady step, else the per-step list)."""
    steady = range(1, STEPS)
    rows = []
    for label, of in (
        ("step()", lambda r: r.counts()),
        ("step() param_sync", lambda r: r.counts(phase=PARAM_SYNC)),
        ("fwd+bwd", lambda r: r.counts()),
    ):
        regions = (
            (off.fwd_bwd, on.fwd_bwd)
            if label == "fwd+bwd"
            else (
                off.steps,
                on.steps,
            )
        )
        first = [dict(of(r[0])) for r in regions]
        rest = [same_on_every_step(r, steady, of) for r in regions]
        keys = sorted(
            set().union(*first, *[r for r in rest if isinstance(r, dict)])
        )
        for key in keys:
            if label == "step() param_sync" and (
                is_host_sync(key) or key.startswith("task.")
            ):
                continue
            vals = [first[0].get(key, 0), first[1].get(key, 0)]
            vals += [r.get(key, 0) if isinstance(r, dict) else r for r in rest]
            rows.append((label, key, *vals))
    units = len(on.owner.units)
    lines = [
        f"TABLE {name}: {units} units ({on.owner.collective}), Paddle's "
        f"blocking sync {off.paddle} collectives, per step; steady = steps "
        f"1-{STEPS - 1}",
        f"  {'region':<18}{'name':<36}{'off s0':>7}{'on s0':>7}"
        f"{'off':>6}{'on':>6}{'on-off':>8}",
    ]
    for label, key, o0, n0, o, n in rows:
        d = n - o if isinstance(n, int) and isinstance(o, int) else "?"
        lines.append(
            f"  {label:<18}{key:<36}{o0:>7}{n0:>7}{o!s:>6}{n!s:>6}{d!s:>8}"
        )
    if rank() == 0:
        print("\n".join(lines), flush=True)


def digest(params):
    return [zlib.crc32(params[k].tobytes()) for k in sorted(params)]


def check_mode(name):
    mode = MODES[name]
    off = train(mode, overlap=False)
    on = train(mode, overlap=True)
    same_on_ranks = all_ranks_equal(digest(on.params))
    assert_bitwise_equal((off.losses, off.params), (on.losses, on.params), name)
    assert same_on_ranks, f"{name}: final parameters differ across ranks"
    table(name, mode, off, on)
    for s in range(1, STEPS):
        check_steady_step(name, s, mode, off, on)
    check_first_step(name, mode, off, on)
    return off, on


def case_v1_per_parameter():
    off, on = check_mode("v1_per_parameter")
    assert len(on.owner.units) == len(off.inner._origin_parameter_list)


def case_v1_buckets_default():
    off, on = check_mode("v1_buckets_default")
    assert len(on.owner.units) == 2, len(on.owner.units)  # one per owner


def case_v1_buckets_small():
    off, on = check_mode("v1_buckets_small")
    params = len(off.inner._origin_parameter_list)
    assert 2 < len(on.owner.units) < params, len(on.owner.units)


def case_v1_fused_slices_default():
    off, on = check_mode("v1_fused_slices_default")
    assert off.inner.tensor_fusion and off.inner._rank2fused
    assert len(on.owner.units) == off.paddle, (len(on.owner.units), off.paddle)


def case_v1_fused_slices_small():
    off, on = check_mode("v1_fused_slices_small")
    assert off.inner.tensor_fusion
    assert len(on.owner.units) > off.paddle, (len(on.owner.units), off.paddle)


def case_v2_comm_buffers():
    off, on = check_mode("v2_comm_buffers")
    assert type(on.inner).__name__ == "DygraphShardingOptimizerV2"
    assert len(on.owner.units) == off.paddle >= 3, (
        len(on.owner.units),
        off.paddle,
    )


# ----------------------------------------------------------------------
# the counter itself, on this release
def case_counter_sees_every_name():
    """Every name the counter wraps is counted once per call, only inside a
    region; nested host syncs and the paddle.distributed -> stream nesting
    count once; a function imported by name is seen; waits mark their
    collective blocking."""
    group = paddle.distributed.collective._get_default_group()
    expected = collections.Counter()
    originals = (paddle.distributed.all_reduce, vars(paddle.Tensor)["numpy"])
    with BlockingCallCounter() as counter:
        x = paddle.to_tensor(1.5)
        i = paddle.to_tensor(2)
        x.numpy()  # outside any region: not counted
        with counter.counting("probe") as region:
            calls = {
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
            for method, call in calls.items():
                if method in vars(paddle.Tensor):
                    call()
                    expected[f"tensor.{method}"] += 1
            for key, sync in (
                ("device.synchronize", paddle.device.synchronize),
                ("device.cuda.synchronize", paddle.device.cuda.synchronize),
            ):
                try:
                    with warnings.catch_warnings():  # cuda's is deprecated
                        warnings.simplefilter("ignore")
                        sync()
                except Exception:  # the CPU build refuses; still counted
                    pass
                expected[key] += 1
            t = paddle.ones([4])
            paddle.distributed.all_reduce(t)
            all_reduce_imported_by_name(t)
            expected["dist.all_reduce blocking"] += 2
            expected["pg.all_reduce blocking"] += 2
            expected["task.wait"] += 2  # sync_op=True: Paddle waits its task
            task = paddle.distributed.broadcast(t, src=0, sync_op=False)
            task.wait()
            expected["dist.broadcast blocking"] += 1  # waited in the region
            expected["pg.broadcast blocking"] += 1
            expected["task.wait"] += 1
            late = paddle.distributed.broadcast(t, src=0, sync_op=False)
            expected["dist.broadcast async"] += 1
            expected["pg.broadcast async"] += 1
            full = paddle.zeros([4])
            shard = paddle.ones([2])
            gather = group.process_group.all_gather(shard, full)
            expected["pg.all_gather async"] += 1
        late.wait()
        gather.wait()
        with counter.counting("barrier") as barrier:
            paddle.distributed.barrier()
    got = region.counts()
    assert got == expected, nonzero(diff(got, expected))
    assert counter.regions["probe"] == [region]
    # the barrier's process-group call and waits are the release's own
    dist_level = barrier.collectives_of(level="dist")
    assert [c.key for c in dist_level] == ["dist.barrier blocking"], dist_level
    assert barrier.collectives_of(level="pg"), "no process-group call seen"
    # restored on exit
    now = (paddle.distributed.all_reduce, vars(paddle.Tensor)["numpy"])
    assert all(a is b for a, b in zip(now, originals)), now
    assert all_reduce_imported_by_name is originals[0]
    if rank() == 0:
        print(f"counter probe on Paddle {paddle.__version__}: {dict(got)}")


def launch_cases():
    cases = cases_of(globals())
    first = {"counter_sees_every_name": cases.pop("counter_sees_every_name")}
    return {**first, **cases}


if __name__ == "__main__":
    sys.exit(run_cases(launch_cases()))
