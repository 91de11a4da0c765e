"""The parameter sync's overlap timed on a virtual clock: exposed sync time, its bound and the step time
per step, for overlap off, the product and upstream Paddle 3.3.1's own overlap, side by side in one table.

A model calibrated on measured H200 torch stand-in figures, not a GPU run: every collective is issued
for real and its completion modelled (``vclock/``, ``docs/performance.md`` Section 3). LLaMA-7B-shaped
models built tiny (each parameter carrying its bf16 LLaMA-7B size): sharded 2 ways on 2 real CPU ranks
(a ``paddle.distributed.launch`` this script starts; losses compared bitwise with overlap off), 4 and 8
ways in this process over a fake group (values not checked). Columns per micro-batch of 1k and 4k
tokens: exposed sync ms with the NCCL contention model, the same without contention, the bound (no
schedule on one in-order stream without contention exposes less) and the modelled step time. Same
numbers on any machine.

    python benchmarks/overlap_clock.py                       # ~5 min on 2 cores
    python benchmarks/overlap_clock.py --plot /tmp/overlap_clock.png   # docs/img/overlap_clock.png is this figure
    python benchmarks/overlap_clock.py --standins            # the stand-ins replayed, model vs measured
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this folder, the cases module (test/collective/fleet) and the test-only CPU shim it imports
# (tools/collective, its one home): for this process and the ranks it launches, which run this file
PATHS = (HERE, os.path.join(ROOT, "test", "collective", "fleet"), os.path.join(ROOT, "tools", "collective"))
sys.path[:0] = [p for p in PATHS if p not in sys.path]

import bench_common  # noqa: E402,F401  (one math thread per rank, before paddle)
import paddle_overlay  # noqa: E402
from buckets import table  # noqa: E402
from vclock import contention, costs, runs, standins  # noqa: E402

SCENARIOS = ("1k", "1k_free", "4k", "4k_free")
VARIANT_MODES = ("off", "ours_v1_per_param", "ours_v1_bucket_256", "upstream_v1", "off_v2",
                 "ours_v2_buffer_256", "upstream_v2")


def specs(ways):
    """[(variant, mode name)] measured at ``ways``: every mode on LLaMA-7B; at 2 ways also the
    head-first, tied-head and forward-collective models."""
    out = [("llama7b", m) for m in runs.MODES]
    if ways == 2:
        out += [(v, m) for v in ("head_first", "tied_head", "forward_collective") for m in VARIANT_MODES]
    return out


def measure(backend, ways, layers, steps):
    """One row per spec: the last step's records by scenario, the losses, the step-to-step check."""
    rows = []
    for variant, name in specs(ways):
        clock, losses = runs.run(backend, runs.MODES[name], variant, layers, steps)
        row = {"ways": ways, "variant": variant, "mode": name, "losses": losses,
               "group": "real" if backend.values_checked else "fake"}
        for scenario in SCENARIOS:
            records = clock.steps(scenario)
            last = records[-1]
            row[scenario] = dict(last.as_dict(), contention_ms=last.contention_ms)
            row[scenario + "_steady"] = abs(records[-2].exposed_ms - last.exposed_ms) < 1e-6
        rows.append(row)
    return rows


def rank_main(args):
    """One rank of the 2-rank launch: every row, written to ``--out``/rank-N.json."""
    import paddle.distributed as dist
    import sharding_cases

    sharding_cases.init_fleet()
    rows = measure(runs.FleetBackend(), 2, args.layers, args.steps)
    with open(os.path.join(args.out, f"rank-{dist.get_rank()}.json"), "w") as f:
        json.dump(rows, f)


def launch_two_ranks(args):
    """Run this script on 2 CPU ranks; the rows of each rank (rank 0 first)."""
    out = tempfile.mkdtemp(prefix="overlap_clock_")
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
               os.path.join(out, "log"), os.path.abspath(__file__), "--rank-run", "--out", out,
               "--layers", str(args.layers), "--steps", str(args.steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [HERE, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode:
        raise SystemExit(f"the 2-rank launch failed ({done.returncode}); logs in {out}/log")
    ranks = []
    for rank in (0, 1):
        with open(os.path.join(out, f"rank-{rank}.json")) as f:
            ranks.append(json.load(f))
    shutil.rmtree(out)
    return ranks


def check_values(rows):
    """Each real row's ``values``: "= off" when its losses are bitwise those of overlap off (same ways,
    model and sync family), else "DIFFER"; "not checked" in a fake group."""
    def key(r):
        return r["ways"], r["variant"], runs.MODES[r["mode"]].family

    reference = {key(r): r["losses"] for r in rows if r["group"] == "real" and runs.MODES[r["mode"]].kind == "off"}
    for r in rows:
        if r["group"] == "fake":
            r["values"] = "not checked"
        else:
            r["values"] = "= off" if r["losses"] == reference[key(r)] else "DIFFER"


def agreement(a_rows, b_rows, keys=("exposed_ms", "bound_ms")):
    """The largest difference (ms) between two row lists' ``keys`` over the scenarios, matched by
    (variant, mode)."""
    b_by = {(r["variant"], r["mode"]): r for r in b_rows}
    worst = 0.0
    for r in a_rows:
        other = b_by.get((r["variant"], r["mode"]))
        if other is None:
            continue
        for s in SCENARIOS:
            for k in keys:
                worst = max(worst, abs(r[s][k] - other[s][k]))
    return worst


def render(rows):
    header = ["ways", "group", "model", "mode", "syncs/step", "values"]
    for t in ("1k", "4k"):
        header += [f"{t} exposed", f"{t} no contention", f"{t} bound", f"{t} waited by", f"{t} step"]
    lines = []
    for r in rows:
        line = [r["ways"], r["group"], r["variant"], r["mode"], r["4k"]["syncs"], r["values"]]
        for t in ("1k", "4k"):
            rec = r[t]
            waits = ", ".join(f"{who} {ms:.1f}" for who, ms in sorted(rec["waits"].items(), key=lambda w: -w[1])
                              if ms >= 0.05) or "-"
            line += [f"{rec['exposed_ms']:.2f}", f"{r[t + '_free']['exposed_ms']:.2f}", f"{rec['bound_ms']:.2f}",
                     waits, f"{rec['step_ms']:.1f}"]
        lines.append(line)
    return table(lines, header)


def standins_table():
    """The stand-ins replayed on the clock's model next to their measurements (ms exposed)."""
    rates = contention.nccl_2gpu()
    lines = []
    for tokens in costs.TOKENS:
        for mode in standins.ISSUE_MODES:
            model, measured = standins.issue_strategy(mode, tokens, rates)
            lines.append(["issue strategy (2x H200)", tokens, mode, "nccl_2gpu", f"{model:.2f}", f"{measured:.2f}",
                          f"{(model - measured) / measured:+.0%}"])
    for tokens in costs.TOKENS:
        for engine, source in (("sm", "sm16_1gpu"), ("ce", "ce_1gpu")):
            for schedule in standins.V2_SCHEDULES:
                model, measured = standins.v2_schedule(schedule, engine, tokens, contention.contention(source, tokens))
                lines.append(["V2 schedule proxy (1x H200)", tokens, f"{engine} {schedule}", source, f"{model:.2f}",
                              f"{measured:.2f}", f"{(model - measured) / measured:+.0%}"])
    for tokens in costs.TOKENS:
        for cap in standins.SWEEP_CAPS:
            model, measured = standins.bucket_sweep(cap, tokens, rates)
            lines.append(["bucket sweep (2x H200)", tokens, f"cap {cap} MB", "nccl_2gpu", f"{model:.2f}",
                          f"{measured:.2f}", f"{(model - measured) / measured:+.0%}"])
    return table(lines, ["stand-in", "tokens", "mode", "contention", "model ms", "measured ms", "model / measured - 1"])


def plot(rows, path):
    """Exposed sync ms per mode, LLaMA-7B at 2/4/8 ways, 1k and 4k tokens: bars with contention, hatched
    without, a dot for the bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ways = sorted({r["ways"] for r in rows})
    modes = list(runs.MODES)
    fig, axes = plt.subplots(len(ways), 2, figsize=(13, 3.2 * len(ways)), sharex=True, squeeze=False)
    for i, w in enumerate(ways):
        by_mode = {r["mode"]: r for r in rows if r["ways"] == w and r["variant"] == "llama7b"}
        for j, t in enumerate(("1k", "4k")):
            ax = axes[i][j]
            x = range(len(modes))
            ax.bar(x, [by_mode[m][t]["exposed_ms"] for m in modes], color="tab:blue", label="exposed (contention)")
            ax.bar(x, [by_mode[m][t + "_free"]["exposed_ms"] for m in modes], color="none", edgecolor="black",
                   hatch="//", label="exposed (no contention)")
            ax.plot(x, [by_mode[m][t]["bound_ms"] for m in modes], "o", color="tab:red", label="bound")
            ax.set_title(f"LLaMA-7B-shaped, sharding {w}, {t} tokens", fontsize=9)
            ax.set_ylabel("ms per step")
            ax.set_xticks(list(x))
            ax.set_xticklabels(modes, rotation=60, ha="right", fontsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Exposed parameter sync per step: model calibrated on measured H200 torch stand-in figures "
                 "(not a GPU run)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (LLaMA-7B: 32)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per mode (the last one is reported)")
    ap.add_argument("--degrees", type=int, nargs="+", default=[2, 4, 8], help="sharding degrees")
    ap.add_argument("--plot", help="write the figure (PNG) here; needs matplotlib (pip install .[bench])")
    ap.add_argument("--standins", action="store_true", help="print the stand-ins replayed, model vs measured")
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 3:
        ap.error("--steps must be >= 3 (step 1 records the order; the last two are compared)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (asked before minutes of measuring, not after)
        except ImportError:
            ap.error("--plot needs matplotlib: pip install .[bench] (or leave --plot out)")
    paddle_overlay.apply()
    if args.rank_run:
        return rank_main(args)
    if args.standins:
        print(standins_table())
        return None
    rows, notes = [], []
    if 2 in args.degrees:
        rank0, rank1 = launch_two_ranks(args)
        notes.append(f"the 2 ranks' clocks differ by at most {agreement(rank0, rank1):.2e} ms")
        rows += rank0
        fake2 = measure(runs.FakeBackend(2), 2, args.layers, args.steps)
        fake2 = [r for r in fake2 if r["variant"] == "llama7b"]
        notes.append(f"a fake 2-way group gives the real ranks' exposed and bound within "
                     f"{agreement(rank0, fake2):.2e} ms")
    for ways in [d for d in args.degrees if d != 2]:
        rows += measure(runs.FakeBackend(ways), ways, args.layers, args.steps)
    check_values(rows)
    unsteady = [f"{r['ways']}/{r['variant']}/{r['mode']}" for r in rows
                if not all(r[s + "_steady"] for s in SCENARIOS)]
    notes.append("every row is the same in its last two steps" if not unsteady
                 else f"rows whose last two steps differ: {unsteady}")
    rates = contention.nccl_2gpu()
    print(f"Parameter sync per step, LLaMA-7B-shaped ({args.layers} layers, bf16 sizes), 1 micro-batch: a model "
          "calibrated on measured H200 torch stand-in figures, not a GPU run.")
    print(f"ms per step; 'exposed' with NCCL contention (forward at rate {rates[0]}, collectives at {rates[1]} while "
          "both run), 'no contention' without; 'bound': no schedule on one in-order stream exposes less "
          "without contention; 'waited by': what the sync added to waits, by who waited (with contention); "
          "all-gather modelled from the broadcast's bus bandwidth (none measured); 4- and 8-way rows: fake "
          "group in one process, values not checked.")
    print(render(rows))
    for note in notes:
        print("note:", note)
    if args.plot:
        plot(rows, args.plot)
        print("plot:", args.plot)
    return None


if __name__ == "__main__":
    main()
