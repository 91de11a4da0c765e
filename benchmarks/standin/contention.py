"""Contention of the overlapped V1 broadcasts with the forward, under one
NCCL setting a Paddle user can pass through the environment.

**Torch + NCCL, not Paddle.** torchrun, one process per GPU, world size =
the plan's degree. NCCL reads ``NCCL_MAX_NCHANNELS`` / ``NCCL_MAX_CTAS``
(and the rest) when the communicator is made, so one run measures one
setting; ``run_2gpu.sh`` loops over the settings and the file records the
environment. With the product's bucket plan:

* ``transfer_alone_ms``: every bucket broadcast back to back, no forward;
* ``fwd_alone_ms``: the forward, no communication;
* ``fwd_with_transfer_ms`` / ``transfer_with_fwd_ms``: both started
  together with no dependency (the broadcasts go to a second copy of the
  buckets), each stream's own span: the forward's slowdown and the
  broadcasts' under contention;
* ``exposed_ms``: the real overlap (``all_at_step``: each layer waits for
  its buckets) minus the forward alone.

    NCCL_MAX_NCHANNELS=8 torchrun --nproc_per_node 2 benchmarks/standin/contention.py --out ...
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common as C  # noqa: E402
import plan as P  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--fold", action="store_true", help="smoke test on fewer GPUs than the plan's degree")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rank, world, dev = C.init_dist()
    import torch.distributed as dist

    plan = P.load_plan(2 if args.fold else world)
    groups = P.v1_groups(plan, "buckets")
    lay = P.layout(plan, groups)
    srcs = [plan["params"][g[0]]["owner"] % world for g in groups]
    store = C.Storage(plan, lay, dev, seed=rank)
    other = C.Storage(plan, lay, dev, seed=rank + 100)  # broadcast target with no reader
    needs = P.unit_needs(plan, groups)
    tr = C.NcclTransport(store.buffers, "broadcast", srcs)
    tr_free = C.NcclTransport(other.buffers, "broadcast", srcs)
    side = torch.cuda.Stream(device=dev)
    layers = C.layers_of(plan)
    res = C.record("contention.py", world, smoke=args.fold or world < 2, reps=args.reps,
                   plan=f"llama7b_plan_s{plan['degree']}.json", collectives=len(groups))

    def spans(ids, labels, with_fwd, with_comm):
        C.dist_sync()
        cur = torch.cuda.current_stream()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record(cur)
        if with_comm:
            for g in range(len(groups)):
                tr_free.launch(g)
        if with_fwd:
            C.forward(store.by_unit, ids, labels, layers)
        ev[1].record(cur)
        with torch.cuda.stream(side):
            side.wait_stream(cur) if not with_comm else None
            if with_comm:
                for g in range(len(groups)):
                    tr_free.wait(g)
            ev[2].record(side)
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]), ev[0].elapsed_time(ev[2])

    with torch.no_grad():
        for S in args.tokens:
            ids, labels = C.tokens(S, dev)
            rows = {k: [] for k in ("fwd", "comm", "fwd_c", "comm_f")}
            for i in range(2 + args.reps):
                f, _ = spans(ids, labels, True, False)
                _, c = spans(ids, labels, False, True)
                fc, cf = spans(ids, labels, True, True)
                if i >= 2:
                    for k, v in zip(rows, (f, c, fc, cf)):
                        rows[k].append(v)
            m = {k: C.gather_max(C.median(v)) for k, v in rows.items()}
            run = lambda hook: C.forward(store.by_unit, ids, labels, layers, hook)
            samples = [C.boundary(run, tr, len(groups), needs, "all_at_step", C.dist_sync)
                       for _ in range(2 + args.reps)][2:]
            at_step = C.summarize_ranks(samples)
            res[f"S{S}"] = {
                "fwd_alone_ms": m["fwd"], "transfer_alone_ms": m["comm"],
                "fwd_with_transfer_ms": m["fwd_c"], "transfer_with_fwd_ms": m["comm_f"],
                "fwd_slowdown": m["fwd_c"] / m["fwd"], "transfer_slowdown": m["comm_f"] / m["comm"],
                "all_at_step_ms": at_step["ms"], "exposed_ms": at_step["ms"] - m["fwd"],
            }
            if rank == 0:
                print(f"S={S} {res['nccl_env'] or 'NCCL defaults'}: {res[f'S{S}']}", flush=True)
    if rank == 0:
        C.write_json(res, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
