# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script of test_collective_launch_multinode.py: one rank on each of 2 nodes (two launches of
Paddle's launcher, ``--nnodes 2``), sharding degree 2 across them; the overlay applied by the start-up hook
(``PADDLE_OVERLAY=1``). Cases, each overlap off vs on bitwise equal (losses, final parameters), with equal
parameters on both ranks and no read of a parameter whose sync was pending (the wait checker): V1 with
small buckets, V1 per parameter, V2 (``split_param``). Prints ``MULTINODE rank R of N, node K of M: ...``
and ``CASE <name> PASS|FAIL``; exits non-zero on a failure or when the launch is not 2 nodes of one rank.
"""

import os
import sys

import sharding_cases as cases  # test/collective/fleet, on the launch's PYTHONPATH

import paddle

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
    checker, on = cases.compare_on_off(cases.TinyLM, replicas="world", enable=cases.v1(bucket_mb))
    units = cases.overlap_impl(on.opt).units
    assert len({u.src for u in units}) == NODES, [(u.label, u.src) for u in units]  # both nodes send
    print(f"V1 bucket_size_mb={bucket_mb}: {len(units)} broadcasts per step, checker {checker.counts}", flush=True)


def case_v1_buckets():
    compare_v1(0.002)


def case_v1_per_parameter():
    compare_v1(0)


def case_v2():
    """V2 (``split_param``, 1 MB comm buffers), the overlap turned on as PaddleFormers does."""
    build = cases.Build(around=cases.sharding_v2)
    checker, on = cases.compare_on_off(build, replicas="world", enable=cases.v2)
    cases.assert_v2(on.opt, buffers=1)
    assert checker.counts["gathers"] > 0, checker.counts
    print(f"V2: stats {cases.overlap_impl(on.opt).stats}, checker {checker.counts}", flush=True)


def init():
    cases.init_fleet()  # sharding degree = world size (PADDLE_TRAINERS_NUM)
    check_topology()


if __name__ == "__main__":
    sys.exit(cases.run_cases(cases.cases_of(globals()), init=init))
