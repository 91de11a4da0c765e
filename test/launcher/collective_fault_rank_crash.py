# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank fault script: rank 1 exits with code 3 mid-run; rank 0 goes on to a broadcast.

Used by test_collective_launch_fault_injection.py; the launch must fail with rank 1's log
tail in the error, and every process of the launch must be gone.
"""

import sys

import paddle
import paddle.distributed as dist


def main():
    dist.init_parallel_env()
    rank = dist.get_rank()
    x = paddle.to_tensor([float(rank)])
    dist.broadcast(x, src=0)  # one healthy collective first: the fault is mid-run
    print(f"FAULT-CRASH rank {rank} after first broadcast", flush=True)
    if rank == 1:
        print("FAULT-CRASH rank 1 exiting with code 3", flush=True)
        sys.exit(3)
    dist.broadcast(x, src=1, sync_op=True)
    print("FAULT-CRASH rank 0 unexpectedly finished", flush=True)


if __name__ == "__main__":
    main()
