"""Sharding stage 1 V2 all-gather overlap on two CPU ranks, measured:
collectives per step and host overhead, side by side in one run.

V2 (``sharding_configs.split_param = True``, ``DygraphShardingOptimizerV2``)
keeps each rank's slice of the parameters in Paddle's comm buffers and
all-gathers every buffer after each update. Modes, each its own model and
optimizer (same initial weights, same data), interleaved step by step like
``overhead.py``:

* ``off``      - V2 without overlap: Paddle's blocking ``sync_params()``
                 at the end of ``step()`` (the overlay swapped out);
* ``upstream`` - Paddle's own ``_set_all_gather_overlap_forward(True,
                 model)`` (Paddle 3.x; the overlay swapped out for this
                 optimizer's steps, as ``bench_common.set_mode`` does);
* ``ours``     - paddle_overlay's ``_set_all_gather_overlap_forward(True,
                 model)`` (every gather launched by ``step()``).

Collectives: every call of the process group's ``all_gather`` (the call
Paddle's ``FusedCommBuffer.sync_params`` and the overlay's units make) is
counted per mode and by where it started (inside ``step()`` or inside the
forward), and its task is wrapped to count how many were started and not
yet waited at once ("max in flight", a logical count: on gloo the transfer
has finished when the call returns); ``all_reduce`` and ``broadcast`` calls
are counted too, so any other collective a mode makes per step shows. Host overhead: main-thread CPU time
(``time.thread_time``; one math thread per rank) of ``step()`` and of the
next forward, whose sum is what moves between the two when the gathers
move; '/ off' is the median over rounds of the per-round ratio to ``off``
(same round, same input), with its interquartile range. Ratios are read
side by side, never asserted. On gloo nothing overlaps, so the CPU time is
the bookkeeping cost of each overlap plus gloo's own copies.

The model is ``bench_common``'s LLaMA-shaped one, larger (6 layers, hidden
128, FFN 344, vocab 1024: 5.9 MiB of fp32 parameters) with comm buffers of
``--buffer-mb`` (1, the smallest ``comm_buffer_size_MB`` takes) so it has
several. V2 runs on the CPU through the test-only shim
(``tools/collective/hybrid_parallel_cpu_shim.py``: ``install()``, items 7-8
in ``cpu_sharding_v2``), imported from ``tools/collective`` on the ranks'
``PYTHONPATH``:

    PYTHONPATH=tools/collective OMP_NUM_THREADS=1 \\
        python -m paddle.distributed.launch --nproc_per_node 2 \\
        --log_dir /tmp/bench_allgather benchmarks/allgather_overlap.py
    # tables printed by rank 0 (also in /tmp/bench_allgather/workerlog.0)
"""

import argparse
import collections
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_common as bc  # noqa: E402  (sets thread env before paddle)
import hybrid_parallel_cpu_shim  # noqa: E402  (test-only: V2 on gloo)
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle.distributed import fleet  # noqa: E402

MODES = ("off", "upstream", "ours")
MODEL = dict(layers=6, hidden=128, ffn=344, heads=4, vocab=1024)


class GatherCounter:
    """Counts the process group's collectives per (mode, kind, phase):
    ``all_gather`` (the parameter sync) and, to show every other collective
    a mode makes per step, ``all_reduce`` and ``broadcast``; and the most
    all-gathers started but not yet waited at once (per mode)."""

    KINDS = ("all_gather", "all_reduce", "broadcast")

    def __init__(self):
        self.mode = None  # set around each mode's step
        self.phase = "other"
        self.calls = collections.Counter()  # (mode, kind, phase) -> calls
        self.max_in_flight = collections.Counter()
        self.open = collections.Counter()  # per mode: gathers started, not yet waited
        self._originals = []

    def install(self):
        from paddle.base import core

        pg = core.ProcessGroup
        for kind in self.KINDS:
            self._originals.append((pg, kind, getattr(pg, kind)))
            setattr(pg, kind, self._counting(kind, getattr(pg, kind)))

    def _counting(self, kind, original):
        counter = self

        def collective(*args, **kwargs):
            task = original(*args, **kwargs)
            m = counter.mode
            if m is None:
                return task
            counter.calls[(m, kind, counter.phase)] += 1
            if kind != "all_gather":
                return task
            counter.open[m] += 1
            counter.max_in_flight[m] = max(counter.max_in_flight[m], counter.open[m])
            return _CountedTask(task, counter, m)

        return collective

    def remove(self):
        for pg, kind, original in self._originals:
            setattr(pg, kind, original)
        self._originals = []

    def reset(self):
        self.calls.clear()
        self.max_in_flight = collections.Counter(self.open)  # what is open now

    def per_step(self, mode, kind, phase=None, rounds=1):
        n = sum(v for (m, k, ph), v in self.calls.items() if m == mode and k == kind and phase in (None, ph))
        return n / rounds


class _CountedTask:
    """A process-group task of ``mode``; its first ``wait()`` closes it in
    the count."""

    def __init__(self, task, counter, mode):
        self._task, self._counter, self._mode, self._open = task, counter, mode, True

    def wait(self, *args, **kwargs):
        if self._open:
            self._open = False
            self._counter.open[self._mode] -= 1
        return self._task.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._task, name)


def init_fleet(buffer_mb):
    hybrid_parallel_cpu_shim.install()  # gloo: reduce_scatter emulated (item 7), ...
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 2}
    cfg = strategy.hybrid_configs["sharding_configs"]
    cfg.split_param = True
    if hasattr(cfg, "comm_buffer_size_MB"):
        cfg.comm_buffer_size_MB = buffer_mb
    fleet.init(is_collective=True, strategy=strategy)


def inner_v2(opt):
    inner = opt
    while type(inner).__name__ != "DygraphShardingOptimizerV2":
        inner = vars(inner)["_inner_opt"]
    return inner


def build_mode(mode, buffer_mb):
    """(model, optimizer, batch, loss_fn) for ``mode``; Paddle patched or not
    as the mode needs, while its optimizer is built and enabled."""
    bc.set_mode("ours" if mode.startswith("ours") else "off")
    raw, batch, loss_fn = bc.build("llama", **MODEL)
    with hybrid_parallel_cpu_shim.cpu_sharding_v2(buffer_mb):
        opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-3, parameters=raw.parameters()))
        model = fleet.distributed_model(raw)
    if mode == "upstream":
        opt._set_all_gather_overlap_forward(True, model)
    elif mode == "ours":
        opt._set_all_gather_overlap_forward(True, model)
    return model, opt, batch, loss_fn


def one_step(model, opt, inputs, loss_fn, counter, mode):
    """Main-thread CPU and wall seconds of forward, backward and
    ``step()`` + ``clear_grad()``; gathers counted by phase."""
    wall, cpu = time.perf_counter, time.thread_time
    counter.mode, counter.phase = mode, "forward"
    w0, c0 = wall(), cpu()
    loss = loss_fn(model(inputs))
    w1, c1 = wall(), cpu()
    counter.phase = "backward"
    loss.backward()
    w2, c2 = wall(), cpu()
    counter.phase = "step"
    opt.step()
    opt.clear_grad()
    w3, c3 = wall(), cpu()
    counter.mode, counter.phase = None, "other"
    return loss, {
        ("cpu", "forward"): c1 - c0,
        ("cpu", "step"): c3 - c2,
        ("cpu", "forward+step"): (c1 - c0) + (c3 - c2),
        ("cpu", "whole"): c3 - c0,
        ("wall", "forward+step"): (w1 - w0) + (w3 - w2),
        ("wall", "whole"): w3 - w0,
    }


def measure(modes, warmup, rounds, buffer_mb):
    counter = GatherCounter()
    counter.install()
    runs = {m: build_mode(m, buffer_mb) for m in modes}
    out = {m: [] for m in modes}
    losses = {m: [] for m in modes}
    try:
        for r in range(warmup + rounds):
            if r == warmup:
                counter.reset()
            k = r % len(modes)
            for mode in modes[k:] + modes[:k]:
                model, opt, batch, loss_fn = runs[mode]
                bc.set_mode("ours" if mode.startswith("ours") else "off")
                dist.barrier()
                loss, t = one_step(model, opt, batch(r), loss_fn, counter, mode)
                losses[mode].append(loss.numpy().tobytes())
                if r >= warmup:
                    out[mode].append({key: 1000.0 * v for key, v in t.items()})
    finally:
        counter.remove()
    info = {}
    for mode in modes:
        model, opt, _, _ = runs[mode]
        n_buffers = len(inner_v2(opt)._comm_buffer_list)
        stats = None
        if mode.startswith("ours"):
            from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import param_sync_overlap

            owner = param_sync_overlap.get_param_sync_overlap(opt)
            stats = dict(owner.stats) if owner is not None else None
        info[mode] = (n_buffers, losses[mode] == losses["off"], stats)
    for mode in modes:
        bc.set_mode("ours" if mode.startswith("ours") else "off")
        if mode != "off":
            runs[mode][1]._set_all_gather_overlap_forward(False)
    bc.set_mode("off")
    return out, counter, info


def upstream_v2_available():
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import dygraph_sharding_optimizer as m

    bc.set_mode("off")
    return "_set_all_gather_overlap_forward" in vars(m.DygraphShardingOptimizerV2)


def table(rows, header):
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |"]
    lines.append("| " + " | ".join("-" * w[i] for i in range(len(header))) + " |")
    lines += ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60, help="timed steps per mode (interleaved)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--buffer-mb", type=int, default=1, help="sharding_configs.comm_buffer_size_MB")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    init_fleet(args.buffer_mb)
    modes = list(MODES)
    if not upstream_v2_available():
        modes.remove("upstream")
    t0 = time.time()
    res, counter, info = measure(modes, args.warmup, args.rounds, args.buffer_mb)
    wall = time.time() - t0
    if bc.rank() != 0:
        return
    n_params = sum(1 for _ in bc.build("llama", **MODEL)[0].parameters())
    print(
        f"paddle {paddle.__version__}, 2 ranks (gloo), sharding stage 1 V2 (split_param), comm_buffer_size_MB="
        f"{args.buffer_mb}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; model {MODEL} "
        f"({n_params} parameters); {args.rounds} rounds (after {args.warmup} warm-up), each round one step of "
        f"every mode in rotated order; {wall:.0f} s"
    )
    if "upstream" not in modes:
        print("upstream: this Paddle has no built-in V2 _set_all_gather_overlap_forward (Paddle 3.x has it); skipped")
    for mode in modes:
        if info[mode][2] is not None:
            print(f"{mode}: paddle_overlay counters over the whole run: {info[mode][2]}")
    rows = []
    for mode in modes:
        per = lambda kind, phase=None: f"{counter.per_step(mode, kind, phase, args.rounds):g}"  # noqa: E731
        rows.append([
            mode, str(info[mode][0]), per("all_gather"), per("all_gather", "step"), per("all_gather", "forward"),
            str(counter.max_in_flight[mode]), per("all_reduce"), per("all_reduce", "step"), per("broadcast"),
            "yes" if info[mode][1] else "NO",
        ])
    print()
    print("Table G1. Collectives per training step (process group calls, counted per mode over the timed rounds): "
          "all-gathers by where they start, max in flight = most all-gathers started and not yet waited at once; "
          "all-reduces (on gloo the test shim's reduce_scatter is one all-reduce per comm buffer) and broadcasts.")
    print(table(rows, ["mode", "comm buffers", "all-gathers/step", "in step()", "in forward", "max in flight",
                       "all-reduces/step", "in step()", "broadcasts/step", "losses == off (bitwise)"]))
    keys = [("cpu", "forward"), ("cpu", "step"), ("cpu", "forward+step"), ("cpu", "whole"), ("wall", "forward+step")]
    rows = []
    for mode in modes:
        row = [mode]
        for key in keys:
            xs = [x[key] for x in res[mode]]
            paired = sorted(x[key] / o[key] for x, o in zip(res[mode], res["off"]) if o[key] > 0)
            q1, q3 = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
            row += [f"{statistics.median(xs):.2f}", f"{statistics.median(paired):.3f} [{q1:.2f}-{q3:.2f}]"]
        rows.append(row)
    header = ["mode"]
    for clock, ph in keys:
        name = ph if clock == "cpu" else f"wall {ph}"
        header += [f"{name} ms", f"{name} / off"]
    print()
    print("Table G2. Host overhead: main-thread CPU time (time.thread_time) of the forward, of step() + "
          "clear_grad(), their sum and the whole step (forward + backward + step), median ms and the median "
          "per-round ratio to 'off' [interquartile range]; last, the wall clock of forward + step.")
    print(table(rows, header))


if __name__ == "__main__":
    main()
