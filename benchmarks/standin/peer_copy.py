"""For the record: NCCL broadcast versus copy-engine peer copies
(``cudaMemcpyPeerAsync`` through torch's peer access) for the V1 plan.

**Torch, not Paddle; one process driving two GPUs (no torchrun).** GPU 0
runs the forward over the product's sharding-2 bucket plan; the buckets
rank 1 owns arrive by peer copies from GPU 1 into GPU 0's buckets on a side
stream of GPU 0 (``Tensor.copy_`` between devices with peer access on is a
copy-engine ``cudaMemcpyPeerAsync``); at the same time GPU 1 pulls the
buckets rank 0 owns from GPU 0 (the load a sender carries). Schedules
``off``, ``all_at_step`` and ``chain1`` (``common.boundary``); exposed =
boundary - forward alone, on GPU 0. Compare with ``standin_v1_replay_s2.json``
(NCCL, same plan, same forward).

    python3 benchmarks/standin/peer_copy.py --out benchmarks/data/standin_peer_copy.json
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common as C  # noqa: E402
import plan as P  # noqa: E402


class PeerTransport(C.Transport):
    def __init__(self, store0, store1, srcs, side0, side1):
        self.b0, self.b1, self.srcs, self.side0, self.side1 = store0.buffers, store1.buffers, srcs, side0, side1
        self.events = [None] * len(srcs)

    def reset(self):
        self.events = [None] * len(self.srcs)

    def launch(self, g):
        cur = torch.cuda.current_stream()
        if self.srcs[g] == 1:  # GPU 0 receives
            self.side0.wait_stream(cur)
            with torch.cuda.stream(self.side0):
                self.b0[g].copy_(self.b1[g], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.side0)
            self.events[g] = ev
        else:  # GPU 0 sends: GPU 1 pulls
            ready = _ev(cur)  # the sender's data is ready once GPU 0's stream got here
            with torch.cuda.device(1), torch.cuda.stream(self.side1):
                self.side1.wait_event(ready)
                self.b1[g].copy_(self.b0[g], non_blocking=True)

    def wait(self, g):
        if self.events[g] is not None:
            torch.cuda.current_stream().wait_event(self.events[g])


def _ev(stream):
    e = torch.cuda.Event()
    e.record(stream)
    return e


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("peer_copy: needs 2 GPUs in one process; "
              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} visible, not run", file=sys.stderr)
        return 2
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    peer = torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)
    plan = P.load_plan(2)
    groups = P.v1_groups(plan, "buckets")
    lay = P.layout(plan, groups)
    srcs = [plan["params"][g[0]]["owner"] for g in groups]
    s0, s1 = C.Storage(plan, lay, d0), C.Storage(plan, lay, d1, seed=1)
    torch.cuda.set_device(d0)
    side0 = torch.cuda.Stream(device=d0)
    with torch.cuda.device(d1):
        side1 = torch.cuda.Stream(device=d1)
    tr = PeerTransport(s0, s1, srcs, side0, side1)
    needs = P.unit_needs(plan, groups)
    layers = C.layers_of(plan)

    def sync():
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)

    res = C.record("peer_copy.py", 2, peer_access=peer, reps=args.reps, plan="llama7b_plan_s2.json",
                   collectives=len(groups), results={})
    with torch.no_grad():
        for S in args.tokens:
            ids, labels = C.tokens(S, d0)
            run = lambda hook: C.forward(s0.by_unit, ids, labels, layers, hook)
            timed = lambda sched: [C.boundary(run, tr, len(groups), needs, sched, sync)
                                   for _ in range(2 + args.reps)][2:]
            fwd = C.summarize(timed("none"))
            res["results"][f"v1_buckets_s2/S{S}/peer/none"] = fwd
            for sched in ("off", "all_at_step", "chain1"):
                r = C.summarize(timed(sched), fwd["ms"])
                res["results"][f"v1_buckets_s2/S{S}/peer/{sched}"] = r
                print(f"peer copies S={S} {sched}: exposed {r['exposed_ms']:.2f} ms (forward alone {fwd['ms']:.2f})",
                      flush=True)
    C.write_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
