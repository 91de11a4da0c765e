"""Broadcast buckets on two CPU ranks, measured: collectives per step and
host time per launch, one broadcast per parameter vs buckets.

Model: ``bench_common``'s LLaMA-shaped small model (4 decoder layers, hidden
64, FFN 172, vocab 512: 39 parameters, 1.0 MiB in float32). Modes, each its
own model and optimizer with overlap on (``paddle_overlay``), interleaved
step by step like ``overhead.py``:

* ``per_parameter`` - ``bucket_size_mb=0``;
* ``buckets_scaled`` - ``bucket_size_mb=0.125``: 128 KiB windows hold 8
  attention or 3 FFN weights of this model, as 256 MB windows do for
  LLaMA-7B (32 MB and 86 MB weights);
* ``buckets_default`` - ``bucket_size_mb=256`` (the default): one window.

Per mode: async broadcasts per step (counted by wrapping
``paddle.distributed.broadcast``), and the host time of one launch
(``StageOneBroadcastOverlap.launch``: wall and main-thread CPU, median over
the timed steps). On gloo each broadcast completes inside its call, so the
launch time here includes the transfers of 2 CPU processes; the per-call
part is what buckets remove. Then, without Paddle kernels, the bucket plan
of LLaMA-7B (32 layers, bf16, owners from Paddle's V1 partition) at
sharding degrees 2 and 8: broadcasts per step.

    OMP_NUM_THREADS=1 python -m paddle.distributed.launch --nproc_per_node 2 \\
        --log_dir /tmp/bench_buckets benchmarks/buckets.py
"""

import argparse
import collections
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_common as bc  # noqa: E402  (sets thread env before paddle)
import paddle  # noqa: E402

MODES = {"per_parameter": 0, "buckets_scaled": 0.125, "buckets_default": 256}


def table(rows, header):
    rows = [[str(c) for c in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |"]
    out.append("| " + " | ".join("-" * w[i] for i in range(len(header))) + " |")
    out += ["| " + " | ".join(r[i].rjust(w[i]) for i in range(len(header))) + " |" for r in rows]
    return "\n".join(out)


def llama7b_params(degree, layers=32, hidden=4096, ffn=11008, vocab=32000):
    """LLaMA-7B's bf16 parameters as a PaddleNLP-style model lists them
    (embedding; per layer q, k, v, o, gate, up, down, then its two norms;
    final norm; LM head): (numels, owners by Paddle's V1 partition, forward
    first-use order as positions)."""
    H, I, V = hidden, ffn, vocab
    layer = [("q", H * H), ("k", H * H), ("v", H * H), ("o", H * H), ("gate", I * H), ("up", I * H),
             ("down", I * H), ("norm1", H), ("norm2", H)]
    named = [("embed", V * H)] + [(f"L{i}.{k}", n) for i in range(layers) for k, n in layer]
    named += [("final_norm", H), ("lm_head", H * V)]
    # DygraphShardingOptimizer._partition_parameters: largest first (stable), to the least-loaded rank
    sizes, owners = [0] * degree, [0] * len(named)
    for i in sorted(range(len(named)), key=lambda i: -named[i][1]):
        owners[i] = sizes.index(min(sizes))
        sizes[owners[i]] += named[i][1]
    # forward: each layer's input norm first, its second norm before the MLP
    step = ["norm1", "q", "k", "v", "o", "norm2", "gate", "up", "down"]
    pos = {"embed": -1, "final_norm": layers * len(step), "lm_head": layers * len(step) + 1}
    pos.update({f"L{i}.{k}": i * len(step) + j for i in range(layers) for j, k in enumerate(step)})
    order = sorted(range(len(named)), key=lambda i: pos[named[i][0]])
    return [n for _, n in named], owners, order


def build_mode(cap_mb):
    """Model, optimizer (overlap on with ``cap_mb``), batch function, loss."""
    from paddle.distributed import fleet

    model, batch, loss_fn = bc.build("llama")
    bc.set_mode("ours")
    opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-3, parameters=model.parameters()))
    opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=cap_mb)
    return model, opt, batch, loss_fn


def timed_launches(opt, record):
    """Wrap the owner's launch to record (wall s, cpu s) per call."""
    from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
        get_param_sync_overlap,
    )

    owner = get_param_sync_overlap(opt)
    original = owner.launch

    def launch():
        w, c = time.perf_counter(), time.thread_time()
        original()
        if owner.num_pending:  # a real launch, not the call held back by _step
            record.append((time.perf_counter() - w, time.thread_time() - c))

    owner.launch = launch
    return owner


def measure(warmup, rounds):
    counts = collections.Counter()
    original = paddle.distributed.broadcast
    current = [None]

    def counting(tensor, *args, **kwargs):
        if not kwargs.get("sync_op", True) and current[0] is not None:
            counts[current[0]] += 1
        return original(tensor, *args, **kwargs)

    paddle.distributed.broadcast = counting
    runs, times, owners = {}, {m: [] for m in MODES}, {}
    try:
        for mode, cap in MODES.items():
            runs[mode] = build_mode(cap)
            owners[mode] = timed_launches(runs[mode][1], times[mode])
        for step in range(warmup + rounds):
            if step == warmup:
                counts.clear()
                for t in times.values():
                    t.clear()
            for mode in MODES:
                model, opt, batch, loss_fn = runs[mode]
                current[0] = mode
                bc.train_step(model, opt, batch(step), loss_fn)
                current[0] = None
    finally:
        paddle.distributed.broadcast = original
    n_params = len(list(runs["per_parameter"][0].parameters()))
    rows = []
    for mode, cap in MODES.items():
        owner = owners[mode]
        windows = len({s.window for s in owner.bucket_storage.specs}) if owner.bucket_storage else n_params
        wall = statistics.median(w for w, _ in times[mode]) * 1e3
        cpu = statistics.median(c for _, c in times[mode]) * 1e3
        rows.append([mode, cap, n_params, windows, f"{counts[mode] / rounds:.0f}", f"{wall:.3f}", f"{cpu:.3f}"])
    base = float(rows[0][6])
    for row in rows:
        row.append(f"{float(row[6]) / base:.2f}")
    return table(
        rows,
        ["mode", "bucket_size_mb", "parameters", "windows", "broadcasts/step", "launch wall ms", "launch cpu ms",
         "cpu / per_parameter"],
    )


def llama7b_plan_table():
    """Broadcasts per step of LLaMA-7B's plan (computed, no kernels)."""
    from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.broadcast_buckets import plan_buckets

    Fake = collections.namedtuple("Fake", ["shape", "dtype", "stop_gradient"])
    rows = []
    for degree in (2, 8):
        numels, owners, order = llama7b_params(degree)
        fakes = [Fake((n,), "bfloat16", False) for n in numels]
        for cap in (0, 256, 1024, 2048):
            n = len(numels) if cap == 0 else len(plan_buckets(order, fakes, owners, cap << 20))
            rows.append([degree, cap, len(numels), n])
    return table(rows, ["degree", "bucket_size_mb", "parameters", "broadcasts/step"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    bc.init_fleet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = measure(args.warmup, args.rounds)
    if bc.rank() == 0:
        print(f"Paddle {paddle.__version__}, 2 CPU ranks (gloo), {args.rounds} timed steps per mode, interleaved.")
        print("Table B1. Broadcast buckets on the LLaMA-shaped small model (measured):")
        print(table)
        print()
        print("Table B2. LLaMA-7B bucket plan, broadcasts per step (computed from shapes and Paddle's V1 partition):")
        print(llama7b_plan_table())


if __name__ == "__main__":
    main()
