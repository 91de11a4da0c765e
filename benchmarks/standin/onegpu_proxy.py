"""One-GPU proxy of the exact V1 plan replay and of the launch-depth schedules.

**A one-GPU proxy of the torch stand-in, not NCCL and not Paddle.** With one
GPU no collective moves bytes between devices, so each collective's arrival
is stood in for by a copy of the same bytes on a side stream: a copy-engine
copy (``ce``, ``cudaMemcpyAsync`` device to device) or an SM copy kernel on
16 blocks (``sm16``, NCCL-like: NCCL runs its collectives as kernels on its
channels' SMs). As a collective does, the side stream first waits for the
compute stream at each launch (its inputs must be ready).

What moves per rank:

* V1 (the product's plan from ``benchmarks/data/llama7b_plan_s{2,8}.json``,
  dumped from ``plan_buckets``): every rank takes part in every broadcast,
  so each bucket's full buffer (padding included) is copied into the
  bucket's buffer, which the parameters live in as views.
  ``per_parameter``: one copy per parameter in the agreed order.
* V2 (Paddle-sized comm buffers of 256 MB, ``plan.v2_groups``): an
  all-gather delivers ``(d-1)/d`` of each buffer to each rank; that part of
  the buffer is copied.

Schedules (``common.boundary``): ``off`` (all, wait all, forward),
``all_at_step``, ``chain1/2/4`` (``plan.ChainPolicy``: from the pre-hooks,
K in flight). exposed = boundary - forward alone.

It also measures, per engine, the anchor the timeline model is calibrated
from (copy time by size, one decoder layer's forward, one layer's 9 copies
back to back, the layer's forward overlapped with the next layer's copies),
so ``benchmarks/standin/compare.py`` can check ``timeline_sim.py`` against
this proxy with a calibration made on the same machine.

    python3 benchmarks/standin/onegpu_proxy.py --out standin_onegpu_proxy.json
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

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _strided_copy(src, dst, n, BLOCK: tl.constexpr):
        # each program walks the buffer with a stride of the whole grid
        first = tl.program_id(0) * BLOCK
        stride = tl.num_programs(0) * BLOCK
        for base in range(first, n, stride):
            idx = base + tl.arange(0, BLOCK)
            keep = idx < n
            tl.store(dst + idx, tl.load(src + idx, mask=keep), mask=keep)

except ImportError:  # pragma: no cover - the device image has Triton
    triton = None


def sm_copy(dst: torch.Tensor, src: torch.Tensor, blocks: int) -> None:
    """Copy ``src`` into ``dst`` (same bytes) with a kernel on ``blocks`` SMs."""
    nbytes = dst.numel() * dst.element_size()
    word = torch.int64 if nbytes % 8 == 0 else torch.int16
    d, s = dst.view(-1).view(word), src.view(-1)[: dst.numel()].view(word)
    _strided_copy[(blocks,)](s, d, d.numel(), BLOCK=1024, num_warps=8)


class CopyTransport(C.Transport):
    """Group g arrives by a copy of ``dsts[g]``'s bytes on a side stream."""

    def __init__(self, dsts, engine: str, scratch: torch.Tensor, side: torch.cuda.Stream):
        self.dsts, self.engine, self.side = dsts, engine, side
        self.scratch = scratch  # int8 source, at least as large as any group
        self.events = [None] * len(dsts)

    def reset(self):
        self.events = [None] * len(self.dsts)

    def launch(self, g):
        cur = torch.cuda.current_stream()
        self.side.wait_stream(cur)
        dst = self.dsts[g]
        src = self.scratch[: dst.numel() * dst.element_size()].view(dst.dtype)
        with torch.cuda.stream(self.side):
            if self.engine == "ce":
                dst.copy_(src)
            else:
                sm_copy(dst, src, int(self.engine[2:]))
            ev = torch.cuda.Event()
            ev.record(self.side)
        self.events[g] = ev

    def wait(self, g):
        torch.cuda.current_stream().wait_event(self.events[g])


def timed(fn, reps: int, warm: int = 2):
    for _ in range(warm):
        fn()
    return [fn() for _ in range(reps)]


def anchor_for(engine, dev, side, scratch, reps, tokens_list):
    """The ``h200_anchor.json`` fields, with this engine's copies in place
    of the broadcast (``broadcast_ms_by_bytes`` is copy time here)."""
    out = {"broadcast_ms_by_bytes": {}}

    def span(work):
        torch.cuda.synchronize()
        cur = torch.cuda.current_stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(cur)
        work()
        cur.wait_stream(side)
        e1.record(cur)
        torch.cuda.synchronize()
        return e0.elapsed_time(e1)

    def copy_on_side(dsts):
        def work():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for d in dsts:
                    s = scratch[: d.numel() * d.element_size()].view(d.dtype).view_as(d)
                    d.copy_(s) if engine == "ce" else sm_copy(d, s, int(engine[2:]))
        return work

    for nbytes in (8192, 65536, 1 << 20, 8 << 20, 32 << 20, 90 << 20, 256 << 20, 1 << 30):
        d = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
        out["broadcast_ms_by_bytes"][str(nbytes)] = C.median(timed(lambda: span(copy_on_side([d])), reps))
        del d
    shapes = [(C.H, C.H)] * 4 + [(C.H, C.I), (C.H, C.I), (C.I, C.H), (C.H,), (C.H,)]
    names = ["q", "k", "v", "o", "gate", "up", "down", "norm1", "norm2"]
    mk = lambda: {f"L0.{n}": torch.randn(s, dtype=torch.bfloat16, device=dev) * 0.02 for n, s in zip(names, shapes)}
    W, nxt = mk(), list(mk().values())
    out["layer_param_bytes"] = sum(t.numel() * 2 for t in nxt)
    out["layer_bcast_ms_per_param"] = C.median(timed(lambda: span(copy_on_side(nxt)), reps))
    for S in tokens_list:
        x = torch.randn(S, C.H, dtype=torch.bfloat16, device=dev)
        fwd = lambda: C.decoder_layer(x, W.__getitem__, "L0.")
        out[f"layer_fwd_ms_S{S}"] = C.median(timed(lambda: span(fwd), reps))

        def both():
            copy_on_side(nxt)()
            fwd()

        out[f"overlap_fwd+bcast_ms_S{S}"] = C.median(timed(lambda: span(both), reps))
        out[f"serial_fwd+bcast_ms_S{S}"] = out[f"layer_fwd_ms_S{S}"] + out["layer_bcast_ms_per_param"]
    big = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev)
    ms = C.median(timed(lambda: span(lambda: big.copy_(scratch[: 1 << 30].view(torch.bfloat16))), reps))
    out["d2d_copy_GBps"] = 2 * (1 << 30) / ms / 1e6
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--engines", nargs="+", default=["ce", "sm16"])
    ap.add_argument("--degrees", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 rep, 1024 tokens, degree 2, ce")
    ap.add_argument("--out", default="standin_onegpu_proxy.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.engines, args.degrees, args.reps = [1024], ["ce", "sm16"], [2], 1
    if not torch.cuda.is_available():
        print("onegpu_proxy: needs a CUDA GPU", file=sys.stderr)
        return 2
    if triton is None:
        args.engines = [e for e in args.engines if e == "ce"]
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    side = torch.cuda.Stream(device=dev)
    res = C.record("onegpu_proxy.py", 1, proxy="one GPU: arrivals are side-stream copies, not collectives",
                   reps=args.reps, quick=args.quick)
    plans = {d: P.load_plan(d) for d in args.degrees}
    # storages: what each configuration's parameters live in
    layouts = {}
    for d, plan in plans.items():
        if d == 2:
            g = P.v1_groups(plan, "per_parameter")
            layouts["v1_per_parameter"] = (plan, g, P.layout(plan, g), 1.0)
        g = P.v1_groups(plan, "buckets")
        layouts[f"v1_buckets_s{d}"] = (plan, g, P.layout(plan, g), 1.0)
        g = P.v2_groups(plan, 256)
        layouts[f"v2_256MB_s{d}"] = (plan, g, P.layout(plan, g, pad_multiple=d * 128), (d - 1) / d)
    res["configs"] = {name: {"groups": len(g), "bytes_moved": int(sum(P.group_bytes(lay)) * frac)}
                      for name, (_, g, lay, frac) in layouts.items()}
    scratch = torch.empty(1 << 30, dtype=torch.int8, device=dev)
    scratch.view(torch.bfloat16).normal_(0.0, 0.02)
    schedules = {
        "v1_per_parameter": ["off", "all_at_step", "chain1"],
        "v1_buckets_s2": ["off", "all_at_step", "chain1", "chain2", "chain4"],
        "v1_buckets_s8": ["off", "all_at_step", "chain1", "chain2", "chain4"],
        "v2_256MB_s2": ["off", "all_at_step", "chain1", "chain2", "chain4"],
        "v2_256MB_s8": ["off", "all_at_step", "chain1", "chain2", "chain4"],
    }
    if args.quick:
        schedules = {k: ["off", "all_at_step", "chain1"] for k in schedules}
    with torch.no_grad():
        for engine in args.engines:
            res[f"anchor_{engine}"] = anchor_for(engine, dev, side, scratch, args.reps, args.tokens)
            print(f"anchor {engine}: {res[f'anchor_{engine}']}", flush=True)
        for name, (plan, groups, lay, frac) in layouts.items():
            store = C.Storage(plan, lay, dev)
            dsts = []
            for buf in store.buffers:  # the part of each buffer this rank receives
                keep = buf.numel() - int(round(buf.numel() * (1 - frac)))
                dsts.append(buf[buf.numel() - keep:])
            needs = P.unit_needs(plan, groups)
            layers = C.layers_of(plan)
            for S in args.tokens:
                ids, labels = C.tokens(S, dev)
                run = lambda hook: C.forward(store.by_unit, ids, labels, layers, hook)
                sync = torch.cuda.synchronize
                fwd = C.summarize(timed(lambda: C.boundary(run, None, len(groups), needs, "none", sync), args.reps))
                row = {"fwd_alone": fwd}
                for engine in args.engines:
                    tr = CopyTransport(dsts, engine, scratch, side)
                    for sched in schedules[name]:
                        samples = timed(lambda: C.boundary(run, tr, len(groups), needs, sched, sync), args.reps)
                        row[f"{engine}_{sched}"] = C.summarize(samples, fwd["ms"])
                        print(f"{name} S={S} {engine} {sched}: exposed {row[f'{engine}_{sched}']['exposed_ms']:.2f} ms "
                              f"(forward alone {fwd['ms']:.2f})", flush=True)
                res.setdefault(name, {})[f"S{S}"] = row
            del store, dsts
            torch.cuda.empty_cache()
    C.write_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
