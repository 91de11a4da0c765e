# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script of test_collective_launch_multinode.py: one rank on each of 2 nodes (two launches of
Paddle's launcher, ``--nnodes 2``), sharding degree 2 across them; the overlay applied by the start-up hook
(``PADDLE_OVERLAY=1``). Cases, each overlap off vs on bitwise equal (losses, final parameters), with equal
parameters on both ranks and no read of a parameter whose sync was pending (the wait checker): V1 with
small buckets, V1 per parameter, V2 (``split_param``). Prints ``MULTINODE rank R of N, node K of M: ...``
and ``CASE <name> PASS|FAIL``; exits non-zero on a failure or when the launch is not 2 nodes of one rank.
"""

import contextlib
import os
import sys
import zlib

FLEET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "collective", "fleet")
sys.path.insert(0, FLEET)  # the shared training helpers, wait checker and CPU shim

import broadcast_overlap_training as training  # noqa: E402
import hybrid_parallel_cpu_shim  # noqa: E402
from broadcast_overlap_checker import BroadcastWaitChecker  # noqa: E402

import paddle  # noqa: E402
from paddle.distributed import fleet  # noqa: E402

NODES, RANKS_PER_NODE = 2, 1


def check_topology():
    """The launch is what the test asked for: 2 nodes of 1 rank, this rank on node ``PADDLE_TRAINER_ID``."""
    env = os.environ
    world, rank = paddle.distributed.get_world_size(), paddle.distributed.get_rank()
    nodes, local = int(env.get("PADDLE_NNODES", "1")), int(env.get("PADDLE_LOCAL_SIZE", "0"))
    print(f"MULTINODE rank {rank} of {world}, node {rank // max(local, 1)} of {nodes}, master "
          f"{env.get('PADDLE_MASTER')}, endpoint {env.get('PADDLE_CURRENT_ENDPOINT')}", flush=True)
    assert (world, nodes, local) == (NODES * RANKS_PER_NODE, NODES, RANKS_PER_NODE), (world, nodes, local)


def compare_v1(bucket_mb):
    checker, info = training.compare_on_off(training.TinyLM, bucket_mb=bucket_mb)
    params = {k: v.numpy() for k, v in info["model"].state_dict().items()}
    assert training.all_ranks_equal([zlib.crc32(params[k].tobytes()) for k in sorted(params)])
    units = training.overlap_impl(info["opt"]).units
    assert len({u.src for u in units}) == NODES, [(u.label, u.src) for u in units]  # both nodes send
    print(f"V1 bucket_size_mb={bucket_mb}: {len(units)} broadcasts per step, checker {checker.counts}", flush=True)


def case_v1_buckets():
    compare_v1(0.002)


def case_v1_per_parameter():
    compare_v1(0)


@contextlib.contextmanager
def v2():
    """``split_param`` for the optimizer built in the block (read by ``HybridParallelOptimizer``)."""
    config = fleet.fleet._user_defined_strategy.hybrid_configs["sharding_configs"]
    config.split_param = True
    try:
        with hybrid_parallel_cpu_shim.cpu_sharding_v2():
            yield
    finally:
        config.split_param = False


def train_v2(overlap, checker=None):
    model = training.build_with_initial_state(training.TinyLM)
    with v2():
        opt = fleet.distributed_optimizer(training.adamw(model.parameters()))
        model = fleet.distributed_model(model)
    assert type(opt._inner_opt).__name__ == "DygraphShardingOptimizerV2", type(opt._inner_opt)
    if overlap:
        opt._set_all_gather_overlap_forward(True, model)
    if checker is not None:
        checker.watch(model, opt)
    losses = []
    for step in range(training.STEPS):
        loss = training.lm_loss(model, step)
        loss.backward()
        opt.step()
        opt.clear_grad()
        if checker is not None:
            checker.hooks_last()
        losses.append(loss.numpy().copy())
    return (losses, {k: v.numpy().copy() for k, v in model.state_dict().items()}), opt


def case_v2():
    off, _ = train_v2(False)
    with BroadcastWaitChecker() as checker:
        on, opt = train_v2(True, checker)
    equal = training.all_ranks_equal([zlib.crc32(on[1][k].tobytes()) for k in sorted(on[1])])
    training.assert_bitwise_equal(off, on, "V2 across two nodes")
    assert checker.violations == [] and checker.counts["gathers"] > 0, (checker.violations[:5], checker.counts)
    assert checker.num_unwaited() == 0 and equal, (checker.num_unwaited(), equal)
    print(f"V2: stats {training.overlap_impl(opt).stats}, checker {checker.counts}", flush=True)


def init():
    training.init_fleet()  # sharding degree = world size (PADDLE_TRAINERS_NUM)
    check_topology()


if __name__ == "__main__":
    sys.exit(training.run_cases(training.cases_of(globals()), init=init))
