"""Cost of the race checker (PADDLE_OVERLAY_CHECK), one process, no ranks.

**Measured.** Forward + backward of the benchmark models with the checker
off and on, interleaved round by round (median of per-round ratios, with
the interquartile range): "on, nothing pending" is the wrapper cost every
operator call pays; "on, all pending" adds the scan of each call's tensor
arguments against the pending-broadcast registry (every parameter marked
pending, as right after a launch). Off is the default and wraps nothing.

    .venv-test/paddle-3.3.1/bin/python benchmarks/race_check_cost.py [--rounds 60]
"""

import argparse
import statistics
import time

import paddle

import bench_common as bc
from paddle_overlay import race_check
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    comm_unit,
)


class _NeverWaits:
    """Stands in for a pending unit (the checker only looks it up)."""


def fwd_bwd(model, inputs, loss_fn):
    start = time.perf_counter()
    loss_fn(model(inputs)).backward()
    elapsed = time.perf_counter() - start
    model.clear_gradients()
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--models", default="deep96,llama")
    args = ap.parse_args()
    paddle.set_device("cpu")
    print(f"paddle {paddle.__version__}, {args.rounds} rounds, forward+backward, seconds per mode interleaved")
    print("| model | mode | median ms | ratio to off [IQR] |")
    print("| --- | --- | --- | --- |")
    for kind in args.models.split(","):
        model, batch, loss_fn = bc.build(kind)
        owner = _NeverWaits()
        modes = ["off", "on, nothing pending", "on, all pending"]
        times = {m: [] for m in modes}
        for r in range(args.rounds + 3):
            inputs = batch(r)
            for mode in modes[r % 3:] + modes[: r % 3]:
                if mode == "off":
                    race_check.disable()
                else:
                    race_check.enable("report")
                if mode == "on, all pending":
                    for p in model.parameters():
                        comm_unit.PENDING[id(p)] = owner
                t = fwd_bwd(model, inputs, loss_fn)
                comm_unit.PENDING.clear()
                if r >= 3:
                    times[mode].append(t)
        race_check.disable()
        for mode in modes:
            ratios = sorted(a / b for a, b in zip(times[mode], times["off"]))
            q = statistics.quantiles(ratios, n=4)
            print(
                f"| {kind} | {mode} | {1000 * statistics.median(times[mode]):.2f} | "
                f"{statistics.median(ratios):.2f} [{q[0]:.2f}-{q[2]:.2f}] |"
            )
    print(f"(races counted while 'all pending': {sum(race_check.races().values())})")
    race_check._State.races.clear()  # no summary at exit: these were staged


if __name__ == "__main__":
    main()
