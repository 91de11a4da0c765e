# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank fault script: rank 1 hangs mid-run while rank 0 waits for it.

Used by test_collective_launch_fault_injection.py; the launch must time out, and every
process of the launch must be killed.
"""

import time

import paddle
import paddle.distributed as dist


def main():
    dist.init_parallel_env()
    rank = dist.get_rank()
    x = paddle.to_tensor([float(rank)])
    dist.broadcast(x, src=0)  # one healthy collective first: the fault is mid-run
    print(f"FAULT-HANG rank {rank} after first broadcast", flush=True)
    if rank == 1:
        print("FAULT-HANG rank 1 sleeping forever", flush=True)
        while True:
            time.sleep(3600)
    # Rank 0 waits outside any collective: in a blocking broadcast gloo's own timeout (about
    # 30 s) would end it first, and the launch's verdict would race that timeout.
    print("FAULT-HANG rank 0 waiting for rank 1 forever", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
