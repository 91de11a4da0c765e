"""Step-time overhead of broadcast overlap on two CPU ranks, measured.

On gloo a ``sync_op=False`` broadcast has finished before it returns, so
nothing overlaps on the CPU: any on/off difference here is the bookkeeping
cost of the overlap itself (hooks, task dicts, per-step hook registration).
That is exactly the part that does not shrink on a GPU.

For each model (``deep96``: 96 Linear(32, 32) leaf layers; ``llama``: a
LLaMA-shaped small model) and each mode

* ``off``         - Paddle's blocking broadcast;
* ``off_applied`` - paddle_overlay applied, overlap not enabled;
* ``upstream``    - Paddle's built-in ``_set_broadcast_overlap`` (3.x only);
* ``ours``        - paddle_overlay's ``_set_broadcast_overlap``,

one model and optimizer per mode are built (fresh name scope each), and the
modes are interleaved step by step: every round runs one step of each mode,
in a rotated order, on the same input (both ranks lockstep: every step
reduces and broadcasts synchronously on gloo).  Pairing steps that ran
milliseconds apart cancels the drift of a shared 2-core machine.  Reported
per phase (whole step, forward, backward, update): the median ms and the
median of the per-round ratio mode/off, with its interquartile range.  The
forward phase has no collectives, so it shows the hooks' cost with little
noise; the whole step carries gloo's jitter.

    OMP_NUM_THREADS=1 python -m paddle.distributed.launch --nproc_per_node 2 \\
        --log_dir /tmp/bench_overhead benchmarks/overhead.py
    # table printed by rank 0 (also in /tmp/bench_overhead/workerlog.0)

About two to three minutes with the defaults on an idle 2-core machine.
"""

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_common as bc  # noqa: E402  (sets thread env before paddle)
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402


PHASES = ("step", "forward", "backward", "update")


def one_step(model, opt, inputs, loss_fn):
    """Seconds per phase of one training step, wall clock and CPU time of
    this (the main) thread: forward (where the pre-hooks wait), backward,
    update (``opt.step()`` + ``clear_grad()``: gradient reduce, update,
    broadcast launch).  With one math thread Paddle's CPU kernels and all
    the Python run on the main thread; thread CPU time leaves out the time
    this process was descheduled or blocked, so it stays readable when
    other jobs share the two cores."""
    wall, cpu = time.perf_counter, time.thread_time
    w0, c0 = wall(), cpu()
    loss = loss_fn(model(inputs))
    w1, c1 = wall(), cpu()
    loss.backward()
    w2, c2 = wall(), cpu()
    opt.step()
    opt.clear_grad()
    w3, c3 = wall(), cpu()
    return {
        ("wall", "forward"): w1 - w0,
        ("wall", "backward"): w2 - w1,
        ("wall", "update"): w3 - w2,
        ("wall", "step"): w3 - w0,
        ("cpu", "forward"): c1 - c0,
        ("cpu", "backward"): c2 - c1,
        ("cpu", "update"): c3 - c2,
        ("cpu", "step"): c3 - c0,
    }


def measure(kind, modes, warmup, rounds):
    """Interleave the modes step by step; return {mode: [per-round phase dict]}.

    Every mode has its own model and optimizer, built once.  Paddle is
    patched (``ours``, ``off_applied``) or unpatched (``off``, ``upstream``)
    just before that mode's step, outside the timed region; the overlay's
    own pending tasks have completed on gloo and stay in its own object
    while the others run.
    """
    runs = {}
    for mode in modes:
        model, batch, loss_fn = bc.build(kind)
        runs[mode] = (model, bc.make_optimizer(model, mode), loss_fn)
    out = {m: [] for m in modes}
    for r in range(warmup + rounds):
        inputs = batch(r)
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            model, opt, loss_fn = runs[mode]
            bc.set_mode(mode)
            dist.barrier()
            t = one_step(model, opt, inputs, loss_fn)
            if r >= warmup:
                out[mode].append({key: 1000.0 * v for key, v in t.items()})
    stats = overlay_stats(runs["ours"][1]) if "ours" in runs else None
    for mode in modes:
        bc.set_mode(mode)
        if mode in ("upstream", "ours"):
            runs[mode][1]._set_broadcast_overlap(False)
    bc.set_mode("off")
    return out, stats


def overlay_stats(opt):
    """paddle_overlay's counters, to show the overlapped path really ran
    (tasks launched by the update and waited by forward pre-hooks)."""
    from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        param_sync_overlap,
    )

    impl = param_sync_overlap.get_param_sync_overlap(opt)
    return dict(impl.stats) if impl is not None else None


def main():
    ap = argparse.ArgumentParser(description="overlap on/off step-time overhead, 2 CPU ranks")
    ap.add_argument("--models", default="deep96,llama")
    ap.add_argument("--rounds", type=int, default=100, help="timed steps per mode (interleaved)")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    warnings.simplefilter("ignore")
    bc.init_fleet(2)
    modes = ["off", "off_applied", "ours"]
    if bc.upstream_available():
        modes.insert(2, "upstream")
    t_start = time.time()
    results, stats = {}, {}
    for kind in args.models.split(","):
        results[kind], stats[kind] = measure(kind, modes, args.warmup, args.rounds)
    wall = time.time() - t_start
    if bc.rank() != 0:
        return
    print(
        f"paddle {paddle.__version__}, 2 ranks (gloo), sharding degree 2, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS')}; {args.rounds} rounds (after {args.warmup} warm-up), "
        f"each round one step of every mode in rotated order; {wall:.0f} s"
    )
    if "upstream" not in modes:
        print("upstream: this Paddle has no built-in _set_broadcast_overlap (Paddle 3.x has it); skipped")
    for kind, st in stats.items():
        print(f"ours on {kind}, paddle_overlay counters over the whole run: {st}")
    titles = {
        "wall": "Table H1. Wall clock: median ms per phase; '/ off' = median of the per-round ratio to 'off' "
        "(same round, same input) [interquartile range].",
        "cpu": "Table H2. Main-thread CPU time (time.thread_time), same layout: the host-side cost, "
        "robust to other jobs on the machine.",
    }
    for clock in ("wall", "cpu"):
        rows = []
        for kind, res in results.items():
            off = res["off"]
            for mode in modes:
                row = [kind, mode]
                for ph in PHASES:
                    key = (clock, ph)
                    xs = [x[key] for x in res[mode]]
                    paired = sorted(x[key] / o[key] for x, o in zip(res[mode], off) if o[key] > 0)
                    q1, q3 = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
                    row.append(f"{statistics.median(xs):.2f}")
                    row.append(f"{statistics.median(paired):.3f} [{q1:.2f}-{q3:.2f}]")
                rows.append(row)
        header = ["model", "mode"]
        for ph in PHASES:
            header += [f"{ph} ms", f"{ph} / off"]
        print()
        print(titles[clock])
        w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |")
        print("| " + " | ".join("-" * w[i] for i in range(len(header))) + " |")
        for r in rows:
            print("| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |")


if __name__ == "__main__":
    main()
