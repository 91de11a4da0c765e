"""Real GPU step time with broadcast overlap off vs on, for users with CUDA
Paddle and 2 or more GPUs.

NOT RUN BY THIS PROJECT: the machines it is developed on have no GPU, and
no number from this script appears in docs/performance.md.  The script has
only been exercised on the CPU through ``--dry-run-cpu`` (a smoke test of
its code paths; the times it prints there mean nothing).

What it does: fleet with ``sharding_degree`` = number of GPUs (DygraphSharding
Optimizer V1 inside HybridParallelOptimizer), a LLaMA-shaped model in bf16
(AMP O2, fp32 master weights), AdamW, ``--micro-batches`` forward/backward
passes per optimizer step (broadcast once per step; only the first micro-
batch's forward can overlap it).  Modes, interleaved run by run so drift
hits them alike:

* ``off``      - Paddle's blocking broadcast;
* ``upstream`` - Paddle's built-in ``_set_broadcast_overlap`` (Paddle 3.x);
* ``ours``     - ``paddle_overlay.apply()`` + ``_set_broadcast_overlap``
                 (broadcast buckets of ``--bucket-size-mb``, default 256);
* ``ours_per_param`` - the same with ``bucket_size_mb=0``: one broadcast
                 per parameter (what ``ours`` was before buckets).

Each run builds a fresh model and optimizer, runs ``--warmup`` steps, then
times ``--steps`` steps between ``paddle.device.synchronize()`` calls.
Prints median ms/step, tokens/s (all GPUs and per GPU) and the speedup over
``off`` measured in the same invocation.

Usage (one command; it starts ``paddle.distributed.launch`` itself)::

    python benchmarks/research/gpu_step_time.py                    # all visible GPUs
    python benchmarks/research/gpu_step_time.py --gpus 0,1 --layers 32 --seq 4096 --micro-batches 8

Defaults: LLaMA-7B layer shape (hidden 4096, FFN 11008, 32 heads, vocab
32000), 8 layers (``--layers 32`` for the full 7B model needs about 50 GB
per GPU at sharding 8 without recompute), sequence 2048, 1 sequence per
micro-batch, 1 micro-batch.

Without CUDA Paddle or with fewer than two GPUs it prints why and exits
with status 2.  Compare its table with the timeline simulator's prediction
(``benchmarks/research/timeline_sim.py``) for your GPU, and please report both.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench_common

NO_GPU_EXIT = 2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="GPU step time, broadcast overlap off vs on (not run by this project)")
    ap.add_argument("--gpus", default=None, help="comma list of GPU ids (default: all visible)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1, help="sequences per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3, help="runs per mode, interleaved")
    ap.add_argument("--modes", default="off,upstream,ours_per_param,ours")
    ap.add_argument("--bucket-size-mb", type=float, default=256, help="bucket window of mode ours (MB)")
    ap.add_argument("--log-dir", default="/tmp/gpu_step_time_logs")
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="smoke-test the code paths on 2 CPU ranks with a tiny fp32 model; times are meaningless",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# --------------------------------------------------------------------------
# launcher side
# --------------------------------------------------------------------------
def gpu_check():
    """(ok, message, gpu ids)."""
    try:
        import paddle
    except ImportError:
        return False, "Paddle is not installed (pip install paddlepaddle-gpu).", []
    if not paddle.is_compiled_with_cuda():
        return (
            False,
            f"this Paddle ({paddle.__version__}) is built without CUDA; "
            "gpu_step_time.py needs paddlepaddle-gpu and 2 or more GPUs.",
            [],
        )
    n = paddle.device.cuda.device_count()
    if n < 2:
        return False, f"found {n} GPU(s); gpu_step_time.py needs 2 or more (sharding degree >= 2).", []
    return True, "", list(range(n))


def launch(args, argv):
    if args.dry_run_cpu:
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
    else:
        ok, msg, ids = gpu_check()
        if not ok:
            print(f"gpu_step_time.py: not running: {msg}", file=sys.stderr)
            return NO_GPU_EXIT
        gpus = args.gpus or ",".join(map(str, ids))
        if len(gpus.split(",")) < 2:
            print("gpu_step_time.py: not running: --gpus must name 2 or more GPUs.", file=sys.stderr)
            return NO_GPU_EXIT
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--gpus", gpus]
    cmd += ["--log_dir", args.log_dir, os.path.abspath(__file__), "--worker", *argv]
    print("running:", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    # The launcher echoes rank 0's output (the table); all ranks' logs stay here:
    print(f"per-rank logs: {args.log_dir}/workerlog.N", flush=True)
    return rc


# --------------------------------------------------------------------------
# worker side (one process per GPU)
# --------------------------------------------------------------------------
def worker(args):
    if args.dry_run_cpu:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    import bench_common as bc
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet

    cpu = args.dry_run_cpu
    if cpu:
        args.layers, args.hidden, args.ffn, args.heads, args.vocab, args.seq = 2, 64, 172, 4, 512, 32
        args.warmup, args.steps, args.reps = 1, 2, 1
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    bc.init_fleet(world)
    modes = [m for m in args.modes.split(",") if m]
    if "upstream" in modes and not bc.upstream_available():
        modes.remove("upstream")
        if dist.get_rank() == 0:
            print("  upstream: this Paddle has no built-in _set_broadcast_overlap; skipped")
    warnings.simplefilter("ignore")

    def sync():
        if not cpu:
            # paddle.device.synchronize where it exists, else the older cuda spelling.
            (getattr(paddle.device, "synchronize", None) or paddle.device.cuda.synchronize)()

    def one_run(mode):
        paddle.seed(1234)
        with paddle.utils.unique_name.guard():
            model = bc.LlamaSmall(
                layers=args.layers,
                hidden=args.hidden,
                ffn=args.ffn,
                heads=args.heads,
                vocab=args.vocab,
                sdpa=not cpu,
            )
        bc.set_mode("ours" if mode.startswith("ours") else mode)
        opt = paddle.optimizer.AdamW(learning_rate=1e-5, parameters=model.parameters(), multi_precision=not cpu)
        if not cpu:
            model, opt = paddle.amp.decorate(models=model, optimizers=opt, level="O2", dtype="bfloat16")
        opt = fleet.distributed_optimizer(opt)
        if mode == "upstream":
            opt._set_broadcast_overlap(True, layers=model)
        elif mode.startswith("ours"):
            cap = 0 if mode == "ours_per_param" else args.bucket_size_mb
            opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=cap)

        def step(i):
            for m in range(args.micro_batches):
                ids = paddle.randint(0, args.vocab, [args.batch, args.seq])
                if cpu:
                    loss = model(ids).mean()
                else:
                    with paddle.amp.auto_cast(level="O2", dtype="bfloat16"):
                        logits = model(ids)
                    loss = paddle.nn.functional.cross_entropy(
                        logits.astype("float32").reshape([-1, args.vocab]), ids.reshape([-1])
                    )
                (loss / args.micro_batches).backward()
            opt.step()
            opt.clear_grad()

        for i in range(args.warmup):
            step(i)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i)
        sync()
        dist.barrier()
        ms = (time.perf_counter() - t0) / args.steps * 1000.0
        if mode == "upstream" or mode.startswith("ours"):
            opt._set_broadcast_overlap(False)
        bc.set_mode("off")
        return ms

    times = {m: [] for m in modes}
    for rep in range(args.reps):
        k = rep % len(modes)
        for mode in modes[k:] + modes[:k]:
            times[mode].append(one_run(mode))
    if dist.get_rank() != 0:
        return 0
    tokens = world * args.micro_batches * args.batch * args.seq
    dev = "CPU DRY RUN (times meaningless)" if cpu else paddle.device.cuda.get_device_name()
    print(f"GPU step time: {dev}, {world} ranks, paddle {paddle.__version__}")
    print(
        f"config: layers={args.layers} hidden={args.hidden} ffn={args.ffn} heads={args.heads} vocab={args.vocab} "
        f"seq={args.seq} batch={args.batch} micro_batches={args.micro_batches} sharding_degree={world} "
        f"{'fp32' if cpu else 'bf16 O2'}; {args.reps} interleaved runs x {args.steps} steps per mode"
    )
    off = statistics.median(times["off"]) if "off" in times else None
    print("| mode | median ms/step | tokens/s (all GPUs) | tokens/s per GPU | vs off |")
    print("| --- | --- | --- | --- | --- |")
    for mode in modes:
        ms = statistics.median(times[mode])
        vs = f"{100.0 * (off / ms - 1):+.2f}%" if off else "-"
        print(f"| {mode} | {ms:.2f} | {tokens / ms * 1000:.0f} | {tokens / ms * 1000 / world:.0f} | {vs} |")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
