"""Two-GPU (or more) torch+NCCL stand-in: the product's exact V1 bucket plan
and V2 all-gather buffers replayed under a launch schedule.

**Torch + NCCL, not Paddle.** One process per GPU (torchrun); the world size
must equal the plan's sharding degree (``benchmarks/data/llama7b_plan_s{2,8}
.json``, dumped from the product's ``plan_buckets``), unless ``--fold``
(smoke tests only: owners folded onto the ranks there are; its numbers are
not a measurement of the plan). Parameters live as views of the groups'
buffers, exactly as the plan lays them out (``plan.layout``).

Suites (``v1_plan_replay.py`` and ``launch_depth.py`` call this):

* ``v1_replay``: V1 per parameter (``bucket_size_mb=0``) and the product's
  bucket plan, each ``off`` (Paddle's blocking path) and ``all_at_step``
  (the product's V1 overlap: every broadcast launched after ``step()`` in
  the agreed order, each leaf layer waiting for its own buckets).
* ``launch_depth``: V1 buckets (``broadcast``) and V2 256 MB buffers
  (``all_gather_into_tensor`` of each buffer from the rank's shard), each
  ``all_at_step`` and ``chain1/2/4`` (launched from the pre-hooks with K in
  flight, ``plan.ChainPolicy``), with a plain forward and with an MoE-like
  ``all_to_all_single`` on another process group around every layer's MLP
  (expert dispatch and combine, on the compute stream).

exposed = boundary - forward alone (same variant), both the largest median
over the ranks; every boundary starts from a barrier and an idle GPU.

    torchrun --nproc_per_node 2 benchmarks/standin/v1_plan_replay.py --out benchmarks/data/standin_v1_replay_s2.json
    torchrun --nproc_per_node 2 benchmarks/standin/launch_depth.py  --out benchmarks/data/standin_launch_depth_s2.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common as C  # noqa: E402
import plan as P  # noqa: E402

SUITES = {
    "v1_replay": {"configs": ["v1_per_parameter", "v1_buckets"], "variants": ["plain"],
                  "schedules": ["off", "all_at_step"]},
    "launch_depth": {"configs": ["v1_buckets", "v2_256MB"], "variants": ["plain", "moe"],
                     "schedules": ["all_at_step", "chain1", "chain2", "chain4"]},
}


def build(config, plan, world, fold):
    """(groups, layout, transport kind, source rank per group)."""
    d = plan["degree"]
    if config == "v2_256MB":
        groups = P.v2_groups(plan, 256)
        return groups, P.layout(plan, groups, pad_multiple=max(world, 1) * 128), "allgather", None
    groups = P.v1_groups(plan, "per_parameter" if config == "v1_per_parameter" else "buckets")
    srcs = [plan["params"][g[0]]["owner"] for g in groups]
    if fold:
        srcs = [s % world for s in srcs]
    elif world != d:
        raise SystemExit(f"the plan is for sharding {d}, the world size is {world} (pass --fold for a smoke test)")
    return groups, P.layout(plan, groups), "broadcast", srcs


def main(argv=None, suite=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default=suite)
    ap.add_argument("--degree", type=int, default=None, help="plan to replay (default: the world size)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--schedules", nargs="+", default=None)
    ap.add_argument("--variants", nargs="+", default=None)
    ap.add_argument("--fold", action="store_true", help="smoke test on fewer GPUs than the plan's degree")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.suite is None:
        ap.error("--suite is required")
    rank, world, dev = C.init_dist()
    import torch.distributed as dist

    degree = args.degree or world
    plan = P.load_plan(degree)
    spec = SUITES[args.suite]
    schedules = args.schedules or spec["schedules"]
    variants = args.variants or spec["variants"]
    moe_group = dist.new_group(list(range(world))) if "moe" in variants else None

    def a2a(t):
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t, group=moe_group)
        return out

    res = C.record(os.path.basename(sys.argv[0]), world, suite=args.suite, plan=f"llama7b_plan_s{degree}.json",
                   fold=args.fold, smoke=args.fold or world < 2, reps=args.reps, results={})
    layers = C.layers_of(plan)
    with torch.no_grad():
        for config in spec["configs"]:
            groups, lay, kind, srcs = build(config, plan, world, args.fold)
            store = C.Storage(plan, lay, dev, seed=rank)
            tr = C.NcclTransport(store.buffers, kind, srcs)
            needs = P.unit_needs(plan, groups)
            name = config if config == "v1_per_parameter" else f"{config}_s{degree}"
            for S in args.tokens:
                ids, labels = C.tokens(S, dev)
                for variant in variants:
                    hookless = a2a if variant == "moe" else None
                    run = lambda hook: C.forward(store.by_unit, ids, labels, layers, hook, hookless)
                    timed = lambda sched: [C.boundary(run, tr, len(groups), needs, sched, C.dist_sync)
                                           for _ in range(2 + args.reps)][2:]
                    fwd = C.summarize_ranks(timed("none"))
                    res["results"][f"{name}/S{S}/{variant}/none"] = fwd
                    for sched in schedules:
                        r = C.summarize_ranks(timed(sched), fwd["ms"])
                        r["collectives"] = len(groups)
                        res["results"][f"{name}/S{S}/{variant}/{sched}"] = r
                        if rank == 0:
                            print(f"{name} S={S} {variant} {sched}: exposed {r['exposed_ms']:.2f} ms "
                                  f"(forward alone {fwd['ms']:.2f}, {len(groups)} collectives)", flush=True)
            del store, tr
            torch.cuda.empty_cache()
    if rank == 0:
        C.write_json(res, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
