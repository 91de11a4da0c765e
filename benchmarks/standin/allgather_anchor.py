"""NCCL all-gather (V2's unit) and broadcast (V1's) time by message size.

**Torch + NCCL, not Paddle.** torchrun, one process per GPU. For each size
(bytes of the whole gathered buffer, 8 KiB to 1 GiB): in-place
``all_gather_into_tensor`` from the rank's shard, and ``broadcast`` of the
same buffer from rank 0; median of ``--iters`` calls, each timed alone with
CUDA events after a barrier (largest median over the ranks). Also the
algorithm bandwidth (bytes / time) and NCCL's bus bandwidth
(all-gather: x (n-1)/n; broadcast: x 1).

    torchrun --nproc_per_node 2 benchmarks/standin/allgather_anchor.py --out benchmarks/data/standin_allgather_anchor.json
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common as C  # noqa: E402

SIZES = [8 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 90 << 20, 256 << 20, 512 << 20, 1 << 30]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rank, world, dev = C.init_dist()
    import torch.distributed as dist

    res = C.record("allgather_anchor.py", world, smoke=world < 2, iters=args.iters,
                   allgather_ms_by_bytes={}, broadcast_ms_by_bytes={}, busbw_GBps={})
    for nbytes in SIZES:
        n = nbytes // 2 // world * world
        buf = torch.empty(n, dtype=torch.bfloat16, device=dev).normal_()
        mine = buf.narrow(0, rank * (n // world), n // world)
        for name, op, bus in (("allgather", lambda: dist.all_gather_into_tensor(buf, mine), (world - 1) / world),
                              ("broadcast", lambda: dist.broadcast(buf, src=0), 1.0)):
            times = []
            for i in range(3 + args.iters):
                C.dist_sync()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                op()
                e1.record()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(e0.elapsed_time(e1))
            ms = C.gather_max(C.median(times))
            res[f"{name}_ms_by_bytes"][str(n * 2)] = ms
            res["busbw_GBps"][f"{name}_{n * 2}"] = n * 2 * bus / ms / 1e6
            if rank == 0:
                print(f"{name} {n * 2 / 2**20:9.3f} MiB: {ms:.4f} ms, bus {n * 2 * bus / ms / 1e6:.1f} GB/s", flush=True)
        del buf, mine
    if rank == 0:
        C.write_json(res, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
