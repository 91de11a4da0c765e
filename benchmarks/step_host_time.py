"""``step()`` host time with the parameter-sync overlap on vs off, and the
blocking calls inside ``step()`` per step, before and after the owner
stopped agreeing anything per step (no host synchronisation and no
blocking collective added to ``step()``). Two CPU ranks.

Modes, each trained twice from the same weights and data (overlap off:
Paddle's own blocking parameter sync, the overlay applied; overlap on),
the two interleaved step by step in one run (the order alternates per
step, a barrier before each, outside the clock):

* ``v1_buckets``        - V1, ``bucket_size_mb`` default (256 MB: one bucket
  per owner rank for this model);
* ``v1_buckets_scaled`` - V1, ``bucket_size_mb=0.125`` (several buckets,
  about as many per parameter as 256 MB gives LLaMA-7B);
* ``v2``                - V2 (``split_param``), 1 MB comm buffers, through
  the test-only CPU shim (``tools/collective/hybrid_parallel_cpu_shim.py``).

Printed per mode: median ``step()`` wall and main-thread CPU time
(``time.thread_time``) on and off over ``--steps`` timed steps, the
median per-step ratio on/off and the ratio of the medians; then, counted
with ``tools/collective/blocking_calls.py`` over ``--count-steps``
more steps (the counter's wrappers stay out of the timed steps), the
blocking calls inside ``step()`` per step: host synchronisations
(``Tensor.numpy`` / ``item`` / ... , device and task synchronize) and
blocking collectives (process-group level: one per collective), on, off
and on - off; for the parent commit too when given (``--before-json``).

gloo's collectives are synchronous: on 2 CPU ranks every collective,
asynchronous or not, has finished when its call returns, so these times
carry the transfers and cannot show what a host synchronisation costs on a
GPU (the CPU stalls until the GPU stream drains). The GPU estimate is
``data/h200_host_sync_1gpu.json`` (a torch stand-in on one H200: an int64
read-back between the update and the launch, what bucket mode did each
step before, adds 0.6-1.1 ms per step at 1k tokens and is within noise at
4k). Nothing here is asserted on time.

Run (from the repository root; the ranks import the shim and the counter
from ``tools/collective``: the driver puts it on their ``PYTHONPATH``, a
launch of your own sets it), either way:

    # the whole comparison: measures the counts of the commit before the
    # owner stopped agreeing per step (ac28af6~1) first, in a temporary
    # folder (git archive of its paddle_overlay), then this tree
    OMP_NUM_THREADS=1 python benchmarks/step_host_time.py --before ac28af6~1

    # this tree only, under the launcher (the "before" column then says how
    # to get it)
    PYTHONPATH=tools/collective OMP_NUM_THREADS=1 \\
        python -m paddle.distributed.launch --nproc_per_node 2 \\
        --log_dir /tmp/bench_step_host benchmarks/step_host_time.py
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLLECTIVE_TOOLS = os.path.join(ROOT, "tools", "collective")  # the CPU shim, blocking_calls
GPU_ESTIMATE = os.path.join(HERE, "data", "h200_host_sync_1gpu.json")
MODES = {
    "v1_buckets": {"v2": False, "bucket_mb": None},
    "v1_buckets_scaled": {"v2": False, "bucket_mb": 0.125},
    "v2": {"v2": True, "bucket_mb": None},
}
MODEL = dict(layers=6, hidden=128, ffn=344, heads=4, vocab=1024)  # 5.9 MiB
BUFFER_MB = 1


def _early_overlay_src(argv):
    """``--overlay-src DIR`` must act before anything imports paddle_overlay."""
    for i, arg in enumerate(argv):
        if arg == "--overlay-src" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--overlay-src="):
            return arg.split("=", 1)[1]
    return None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--count-steps", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--counts-only", action="store_true")
    ap.add_argument("--json", help="rank 0 writes its results here")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--before-json", help="counts of the parent commit")
    ap.add_argument("--overlay-src", help="import paddle_overlay from DIR")
    ap.add_argument(
        "--before",
        help="not under the launcher: measure REV's counts first (git "
        "archive into a temporary folder), then run this tree",
    )
    return ap.parse_args(argv)


# ----------------------------------------------------------------------
# driver (no launcher): the parent commit's counts, then this tree
def drive(args):
    work = tempfile.mkdtemp(prefix="step_host_time_")
    sha = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", args.before], text=True).strip()
    src = os.path.join(work, "src")
    os.makedirs(src)
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", args.before, "paddle_overlay"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    env = {k: v for k, v in os.environ.items() if k != "PADDLE_OVERLAY"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (COLLECTIVE_TOOLS, env.get("PYTHONPATH")) if p)
    before_json = os.path.join(work, "before.json")
    launch = [sys.executable, "-m", "paddle.distributed.launch"]
    launch += ["--nproc_per_node", "2"]
    common = ["--modes", args.modes, "--count-steps", str(args.count_steps)]
    print(f"measuring the counts of {args.before} ({sha}) from {src} ...", flush=True)
    _launch(
        launch
        + ["--log_dir", os.path.join(work, "log_before"), __file__]
        + common
        + ["--counts-only", "--overlay-src", src, "--json", before_json]
        + ["--label", f"{args.before} ({sha})"],
        env,
        os.path.join(work, "log_before"),
    )
    # the last commit that changed the overlay (this tree's source)
    here = subprocess.check_output(
        ["git", "-C", ROOT, "log", "-1", "--format=%h", "--", "paddle_overlay"],
        text=True,
    ).strip()
    dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "paddle_overlay"]).returncode
    label = f"this tree ({here}{', modified' if dirty else ''})"
    log_dir = os.path.join(work, "log_after")
    _launch(
        launch
        + ["--log_dir", log_dir, __file__]
        + common
        + ["--steps", str(args.steps), "--warmup", str(args.warmup)]
        + ["--before-json", before_json, "--label", label],
        env,
        log_dir,
    )
    with open(os.path.join(log_dir, "workerlog.0")) as f:
        lines = f.read().splitlines()
    first = next(i for i, l in enumerate(lines) if l.startswith("Paddle "))
    glog = re.compile(r"^[IWEF]\d{4} ")  # Paddle's C++ log lines
    print("\n".join(l for l in lines[first:] if not glog.match(l)))
    print(f"logs: {work}")


def _launch(cmd, env, log_dir):
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "launcher.out"), "w") as out:
        done = subprocess.run(cmd, env=env, stdout=out, stderr=out)
    if done.returncode:
        sys.exit(f"launch failed ({done.returncode}); logs in {log_dir}")


# ----------------------------------------------------------------------
# per rank
def worker(args):
    import warnings

    sys.path.insert(0, HERE)
    import bench_common as bc  # sets the thread env before paddle
    import hybrid_parallel_cpu_shim  # test-only: V2 on gloo
    import paddle
    from blocking_calls import BlockingCallCounter, is_host_sync
    from paddle.distributed import fleet

    import paddle_overlay

    warnings.simplefilter("ignore")
    if args.overlay_src:
        where = os.path.abspath(paddle_overlay.__file__)
        assert where.startswith(os.path.abspath(args.overlay_src)), where
    hybrid_parallel_cpu_shim.install()
    bc.init_fleet(2)
    bc.set_mode("ours")  # the overlay applied; "off" = overlap not enabled
    config = fleet.fleet._user_defined_strategy.hybrid_configs["sharding_configs"]

    def build(mode, overlap):
        spec = MODES[mode]
        raw, batch, loss_fn = bc.build("llama", **MODEL)
        opt_ = paddle.optimizer.AdamW(1e-3, parameters=raw.parameters())
        saved = {k: getattr(config, k) for k in ("split_param",)}
        config.split_param = spec["v2"]
        if spec["v2"] and hasattr(config, "comm_buffer_size_MB"):
            saved["comm_buffer_size_MB"] = config.comm_buffer_size_MB
            config.comm_buffer_size_MB = BUFFER_MB
        try:
            with hybrid_parallel_cpu_shim.cpu_sharding_v2(BUFFER_MB):
                opt = fleet.distributed_optimizer(opt_)
                model = fleet.distributed_model(raw)
        finally:
            for k, v in saved.items():
                setattr(config, k, v)
        if overlap and spec["v2"]:
            opt._set_all_gather_overlap_forward(True, model)
        elif overlap:
            kw = {} if spec["bucket_mb"] is None else {"bucket_size_mb": spec["bucket_mb"]}
            opt._set_broadcast_overlap(True, layers=model, **kw)
        return model, opt, batch, loss_fn

    def run_mode(mode):
        import statistics
        import time

        runs = {name: build(mode, name == "on") for name in ("off", "on")}
        times = {name: [] for name in runs}
        losses = {name: [] for name in runs}
        total = 1 + (0 if args.counts_only else args.warmup + args.steps)
        step = 0
        for step in range(total):
            order = ("off", "on") if step % 2 == 0 else ("on", "off")
            for name in order:
                model, opt, batch, loss_fn = runs[name]
                loss = loss_fn(model(batch(step)))
                loss.backward()
                paddle.distributed.barrier()
                w, c = time.perf_counter(), time.thread_time()
                opt.step()
                w, c = time.perf_counter() - w, time.thread_time() - c
                opt.clear_grad()
                losses[name].append(loss.numpy().tobytes())
                if step > args.warmup:
                    times[name].append((1e3 * w, 1e3 * c))
        counts = {}
        with BlockingCallCounter() as counter:
            for name, (_, opt, _, _) in runs.items():
                counter.count_calls_of(opt, "step", label=name)
            for extra in range(args.count_steps):
                for name in ("off", "on"):
                    model, opt, batch, loss_fn = runs[name]
                    loss = loss_fn(model(batch(total + extra)))
                    loss.backward()
                    opt.step()
                    opt.clear_grad()
                    losses[name].append(loss.numpy().tobytes())
            for name in runs:
                regions = counter.regions[name]
                per_step = [
                    {k: v for k, v in r.counts(level="pg").items() if is_host_sync(k) or k.endswith(" blocking")}
                    for r in regions
                ]
                asyncs = [{k: v for k, v in r.counts(level="pg").items() if k.endswith(" async")} for r in regions]
                counts[name] = {
                    "blocking": per_step[-1],
                    "async": asyncs[-1],
                    "stable": all(p == per_step[-1] for p in per_step),
                }
        owner = _owner(runs["on"][1])
        result = {
            "counts": counts,
            "units": len(owner.units) if owner is not None else None,
            "bitwise": losses["on"] == losses["off"],
        }
        if not args.counts_only:
            med = {name: [statistics.median(x[i] for x in times[name]) for i in (0, 1)] for name in times}
            ratios = [
                statistics.median(a[i] / b[i] for a, b in zip(times["on"], times["off"]) if b[i] > 0) for i in (0, 1)
            ]
            result["time"] = {"median_ms": med, "median_ratio": ratios, "n": len(times["on"])}
        for name in runs:  # turn the overlap off: hooks removed
            opt = runs[name][1]
            if name == "on":
                if MODES[mode]["v2"]:
                    opt._set_all_gather_overlap_forward(False)
                else:
                    opt._set_broadcast_overlap(False)
        return result

    results = {
        "paddle": paddle.__version__,
        "label": args.label,
        "modes": {m: run_mode(m) for m in args.modes.split(",")},
    }
    if bc.rank() != 0:
        return
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if not args.counts_only:
        report(args, results)


def _owner(opt):
    """The overlap owner (this tree's name, or the parent commit's)."""
    from paddle_overlay.distributed.fleet.meta_optimizers import dygraph_optimizer as d

    import importlib

    for module, fn in (
        ("param_sync_overlap", "get_param_sync_overlap"),
        ("broadcast_overlap", "get_broadcast_overlap"),
    ):
        try:
            m = importlib.import_module(f"{d.__name__}.{module}")
        except ImportError:
            continue
        if hasattr(m, fn):
            return getattr(m, fn)(opt)
    return None


def _total(counts):
    return sum(counts.values())


def _names(counts):
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if v) or "-"


def report(args, results):
    before = None
    if args.before_json:
        with open(args.before_json) as f:
            before = json.load(f)
    print(
        f"Paddle {results['paddle']}, 2 CPU ranks (gloo), model "
        f"bench_common llama {MODEL}; overlap off = Paddle's blocking "
        "parameter sync (the overlay applied, overlap not enabled)"
    )
    print(
        "NOTE: gloo's collectives are synchronous (an async collective has "
        "finished when its call returns), so the CPU cannot show the GPU "
        "cost of a host synchronisation; the GPU estimate is "
        "benchmarks/data/h200_host_sync_1gpu.json (below)."
    )
    print()
    print(
        "Table S1. step() host time, overlap on vs off, interleaved step by "
        f"step in one run: medians over {args.steps} steps (after "
        f"{args.warmup} warm-up and the first step); ratio on/off: median of "
        "the per-step ratios (ratio of the medians)"
    )
    print(
        f"| {'mode':<18} | units | off wall ms | on wall ms | on/off wall   "
        "| off CPU ms | on CPU ms | on/off CPU    | losses bitwise |"
    )
    print("|" + "|".join("-" * w for w in (20, 7, 13, 12, 15, 12, 11, 15, 16)) + "|")
    for mode, r in results["modes"].items():
        t = r["time"]
        (ow, oc), (nw, nc) = t["median_ms"]["off"], t["median_ms"]["on"]
        rw, rc = t["median_ratio"]
        print(
            f"| {mode:<18} | {r['units']:>5} | {ow:>11.3f} | {nw:>10.3f} | "
            f"{rw:.3f} ({nw / ow:.3f}) | {oc:>10.3f} | {nc:>9.3f} | "
            f"{rc:.3f} ({nc / oc:.3f}) | {'yes' if r['bitwise'] else 'NO':<14} |"
        )
    print()
    print(
        "Table S2. Blocking calls inside step() per step (steady state, "
        f"counted over {args.count_steps} more steps; process-group level, "
        "one per collective): host synchronisations and blocking "
        "collectives; on - off is what the overlap adds (negative: Paddle's "
        "blocking sync it replaces)"
    )
    print(
        f"| {'mode':<18} | {'overlay':<26} | off blocking | on blocking "
        "| on - off | on: host syncs | on: async parameter syncs | on - off by name |"
    )
    print("|" + "|".join("-" * w for w in (20, 28, 14, 13, 10, 16, 27, 18)) + "|")
    rows = [(results, "after")]
    if before is not None:
        rows.insert(0, (before, "before"))
    for mode in results["modes"]:
        for res, _ in rows:
            r = res["modes"].get(mode)
            if r is None:
                continue
            off, on = r["counts"]["off"]["blocking"], r["counts"]["on"]["blocking"]
            keys = set(off) | set(on)
            d = {k: on.get(k, 0) - off.get(k, 0) for k in keys}
            host = {k: v for k, v in on.items() if is_host_sync_key(k)}
            print(
                f"| {mode:<18} | {res['label'][:26]:<26} | {_total(off):>12} | "
                f"{_total(on):>11} | {_total(d):>8} | {_total(host):>14} | "
                f"{_names(r['counts']['on']['async']):<25} | "
                + ", ".join(f"{v:+d} {k}" for k, v in sorted(d.items()) if v)
                + " |"
            )
    if before is None:
        print(
            "| (before)           | ac28af6~1: not measured in this run; "
            "`python benchmarks/step_host_time.py --before ac28af6~1` "
            "measures it. From its code: bucket mode ran one int64 MAX "
            "all-reduce + one .numpy() per step (_replan_if_replaced) |"
        )
    print()
    print(f"GPU estimate ({os.path.relpath(GPU_ESTIMATE, ROOT)}):")
    if os.path.exists(GPU_ESTIMATE):
        with open(GPU_ESTIMATE) as f:
            data = json.load(f)
        print(f"  {data.get('what', '')}")
        for row in data.get("rows", []):
            print(
                f"  {row['tokens']:>5} tokens, {row['buckets']:>3} buckets: "
                f"sync/nosync {row['ratio_sync_over_nosync']:.4f}, "
                f"added {row['added_ms']:+.3f} ms per step"
            )
    else:
        print(
            "  (not in this checkout) torch stand-in on one H200: the per-step "
            "int64 read-back adds 0.6-1.1 ms per step at 1k tokens, within "
            "noise at 4k."
        )


def is_host_sync_key(key):
    from blocking_calls import is_host_sync

    return is_host_sync(key)


def main():
    src = _early_overlay_src(sys.argv[1:])
    if src:
        if "paddle_overlay" in sys.modules:
            sys.exit("--overlay-src: paddle_overlay is already imported (unset PADDLE_OVERLAY)")
        sys.path.insert(0, os.path.abspath(src))
    args = parse_args()
    if args.before and os.environ.get("PADDLE_TRAINER_ID") is None:
        return drive(args)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return worker(args)


if __name__ == "__main__":
    main()
