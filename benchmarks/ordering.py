"""Broadcast order vs forward order, measured from real 2-rank CPU runs.

For each model and each mode (``off``, ``upstream`` = Paddle's built-in
overlap, ``ours`` = paddle_overlay) this trains three steps on two CPU ranks
(gloo, sharding degree 2) and records

* the broadcast issue order after step 2's update (``paddle.distributed.
  broadcast`` wrapped; only calls whose tensor is a model parameter), and
* the order in which layers start in step 3's forward (a forward pre-hook on
  every layer that owns parameters directly).

For every such layer it reports the bytes that must have arrived before the
layer can start (everything issued up to its last parameter) minus what the
forward order itself needs (the parameters of the layers that started up to
and including it). Positive = the layer waits for bytes it does not use.
The timeline simulator turns such orders into GPU time; here they are only
counted.

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/bench_ordering \\
        benchmarks/ordering.py
    # the tables are printed by rank 0: /tmp/bench_ordering/workerlog.0

Runs in well under a minute.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_common as bc  # noqa: E402  (sets thread env before paddle)
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

RECORD_STEPS = 3  # broadcasts after step 2, forward of step 3


class Recorder:
    """Wraps paddle.distributed.broadcast and hooks layers, per step."""

    def __init__(self, model):
        self.step = 0
        self.param_ids = {id(p): p for p in model.parameters()}
        self.bcasts = {}  # step -> [param]
        self.starts = {}  # step -> [layer]
        self._seen = {}
        self._handles = []
        self._layer_params = []
        for layer in model.sublayers(include_self=True):
            own = list(layer.parameters(include_sublayers=False))
            if own:
                self._layer_params.append((layer, own))
                self._handles.append(layer.register_forward_pre_hook(self._pre_hook(layer)))
        self._orig = paddle.distributed.broadcast

        def recording_broadcast(tensor, *args, **kwargs):
            p = self.param_ids.get(id(tensor))
            if p is not None:
                self.bcasts.setdefault(self.step, []).append(p)
            return self._orig(tensor, *args, **kwargs)

        paddle.distributed.broadcast = recording_broadcast

    def _pre_hook(self, layer):
        def hook(_layer, _inputs):
            seen = self._seen.setdefault(self.step, set())
            if id(layer) not in seen:
                seen.add(id(layer))
                self.starts.setdefault(self.step, []).append(layer)

        return hook

    def close(self):
        paddle.distributed.broadcast = self._orig
        for h in self._handles:
            h.remove()

    def layer_params(self):
        return {id(layer): own for layer, own in self._layer_params}


def nbytes(p):
    return int(p.numel()) * p.element_size()


def analyse(rec, bstep, fstep, blocking=False):
    """Per started layer: (name, bytes needed under the issued order, bytes
    the forward order needs). Layers whose parameters were not broadcast at
    all (frozen) are skipped.  ``blocking``: every broadcast is waited for
    before the forward (overlap off), so every layer needs all bytes."""
    order = rec.bcasts.get(bstep, [])
    starts = rec.starts.get(fstep, [])
    owned = rec.layer_params()
    cum, acc = {}, 0
    for p in order:
        acc += nbytes(p)
        cum[id(p)] = acc
    rows, fwd_acc = [], 0
    for layer in starts:
        params = [p for p in owned[id(layer)] if id(p) in cum]
        if not params:
            continue
        fwd_acc += sum(nbytes(p) for p in params)
        need = acc if blocking else max(cum[id(p)] for p in params)
        rows.append((_layer_label(layer, params), need, fwd_acc))
    return rows, order


def _layer_label(layer, params):
    return f"{type(layer).__name__}[{params[0].name}]"


def run(kind, mode):
    model, batch, loss_fn = bc.build(kind)
    rec = Recorder(model)
    opt = bc.make_optimizer(model, mode)
    try:
        for step in range(1, RECORD_STEPS + 1):
            rec.step = step
            bc.train_step(model, opt, batch(step), loss_fn)
    finally:
        rec.close()
        if mode != "off":
            opt._set_broadcast_overlap(False)
    rows, order = analyse(rec, RECORD_STEPS - 1, RECORD_STEPS, blocking=mode == "off")
    names = [p.name for p in order]
    fwd_names = []
    for layer in rec.starts.get(RECORD_STEPS, []):
        fwd_names += [p.name for p in rec.layer_params()[id(layer)] if p.name in set(names)]
    return rows, names, fwd_names


def fmt_bytes(b):
    return f"{b / 1024:.1f} KiB"


def table(rows, header):
    rows = [[str(c) for c in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |"]
    out.append("| " + " | ".join("-" * w[i] for i in range(len(header))) + " |")
    out += ["| " + " | ".join(r[i].ljust(w[i]) for i in range(len(header))) + " |" for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description="broadcast order vs forward order, measured")
    ap.add_argument("--models", default=",".join(k for k in bc.MODEL_KINDS if k != "deep96"))
    ap.add_argument("--detail", action="store_true", help="print every layer's numbers")
    args = ap.parse_args()

    bc.init_fleet(2)
    modes = [m for m in bc.MODES if m != "upstream" or bc.upstream_available()]
    summary = []
    details = []
    for kind in args.models.split(","):
        for mode in modes:
            rows, names, fwd_names = run(kind, mode)
            # Both ranks must issue the same collectives in the same order.
            gathered = []
            dist.all_gather_object(gathered, names)
            same = all(g == gathered[0] for g in gathered)
            total = rows[-1][2] if rows else 0
            extra = [(need - fwd, label) for label, need, fwd in rows]
            worst = max(extra) if extra else (0, "-")
            delayed = sum(1 for e, _ in extra if e > 0)
            summary.append(
                [
                    kind,
                    mode,
                    "yes" if names == fwd_names else "no",
                    "yes" if same else "NO",
                    fmt_bytes(rows[0][1]) if rows else "-",
                    f"{worst[0] / 1024:.1f} KiB ({100 * worst[0] / max(total, 1):.0f}% of model) at {worst[1]}"
                    if worst[0] > 0
                    else "0",
                    f"{delayed} of {len(rows)}",
                ]
            )
            details.append((kind, mode, rows, names))
    if bc.rank() != 0:
        return
    print(f"paddle {paddle.__version__}, 2 ranks (gloo), sharding degree 2, fp32 parameters")
    if "upstream" not in modes:
        print("upstream: this Paddle has no built-in _set_broadcast_overlap (Paddle 3.x has it); skipped")
    print()
    print("Table O1. Broadcast issue order after step 2 vs the layer start order of step 3's forward.")
    print(
        "'extra' = bytes a layer must wait for beyond what the forward order needs "
        "(everything issued up to its last parameter, minus the parameters of the layers that started up to it); "
        "with overlap off every layer waits for every byte."
    )
    print(
        table(
            summary,
            [
                "model",
                "mode",
                "issue order = forward order",
                "same on both ranks",
                "bytes before 1st layer",
                "largest extra before a layer",
                "layers delayed",
            ],
        )
    )
    print()
    for kind, mode, rows, names in details:
        if kind == "llama" or args.detail:
            print(f"{kind} / {mode}: first 6 broadcasts: {names[:6]}")
    if args.detail:
        for kind, mode, rows, names in details:
            print(f"\n{kind} / {mode}")
            print(
                table(
                    [[lab, fmt_bytes(n), fmt_bytes(f), fmt_bytes(n - f)] for lab, n, f in rows],
                    ["layer (first param)", "needed under issued order", "needed in forward order", "extra"],
                )
            )


if __name__ == "__main__":
    main()
