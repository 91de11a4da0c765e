# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Per-rank script: sharding stage 1 (V1) with the parameter broadcast
overlapped with the next forward (``_set_broadcast_overlap``).

Run on 2 ranks under ``python -m paddle.distributed.launch``. Every case runs
in both modes, one broadcast per parameter (``bucket_size_mb=0``) and small
buckets (2 KB: bucket boundaries fall inside layers), and checks the
overlap's public counters (``get_broadcast_overlap(optimizer)``); env
``BROADCAST_OVERLAP_BUCKET_MB`` is ignored. Env ``BROADCAST_OVERLAP_CASES``
picks cases (comma list; empty: all). A rank exits non-zero at its first
failed case; the launcher then stops the others, so none is left waiting in
a collective.
"""

import importlib
import os
import sys
import traceback

import numpy as np

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle import nn
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    DygraphShardingOptimizer,
)

# From the package of _set_broadcast_overlap: Paddle's, or paddle_overlay's
# when the overlay was applied at start-up (PADDLE_OVERLAY=1).
_package = DygraphShardingOptimizer._set_broadcast_overlap.__module__
get_broadcast_overlap = importlib.import_module(
    _package.rpartition(".")[0] + ".broadcast_overlap"
).get_broadcast_overlap

VOCAB, HIDDEN, SEQ, BATCH, STEPS = 32, 16, 6, 4, 4
MODES = {"per_parameter": 0, "buckets": 0.002}  # bucket_size_mb


class TinyLM(nn.Layer):
    """Embedding -> 2 x (LayerNorm, Linear) -> head, built head first:
    parameters() order is not the order forward uses them."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.norms = nn.LayerList([nn.LayerNorm(HIDDEN) for _ in range(2)])
        self.fcs = nn.LayerList([nn.Linear(HIDDEN, HIDDEN) for _ in range(2)])
        self.embed = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, fc in zip(self.norms, self.fcs):
            x = x + F.gelu(fc(norm(x)))
        return self.head(x)


def batch(step, micro):
    rng = np.random.RandomState(1000 * step + 10 * micro + dist.get_rank())
    tokens, labels = rng.randint(0, VOCAB, size=(2, BATCH, SEQ)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def train(mb, acc=1, minimize=False, steps=STEPS, on_step=None):
    """Train TinyLM (overlap off when ``mb`` is None, else on with
    ``bucket_size_mb=mb``); returns numpy copies of the losses and final
    parameters, the model, the optimizer and its parameter list."""
    paddle.seed(2026)  # the same initial weights on every rank and run
    model = TinyLM()
    params = model.parameters()
    opt = fleet.distributed_optimizer(
        paddle.optimizer.AdamW(0.01, parameters=params, weight_decay=0.01)
    )
    model = fleet.distributed_model(model)
    if mb is not None:
        opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=mb)
    losses = []
    for step in range(steps):
        for micro in range(acc):
            tokens, labels = batch(step, micro)
            loss = F.cross_entropy(model(tokens), labels).mean()
            (loss / acc).backward()
            losses.append(loss.numpy().copy())
        if minimize:
            opt.minimize(loss)
        else:
            opt.step()
        opt.clear_grad()
        if on_step is not None:
            on_step(model, opt)
    final = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    return losses, final, model, opt, params


def case_on_off_bitwise(mb):
    """Losses and final parameters equal overlap off bit for bit: gradient
    accumulation 1 and 2 with step(), and minimize()."""
    for acc, minimize in ((1, False), (2, False), (1, True)):
        off_losses, off_params, *_ = train(None, acc, minimize)
        on_losses, on_params, *_ = train(mb, acc, minimize)
        what = f"acc={acc} minimize={minimize}"
        for i, (a, b) in enumerate(zip(off_losses, on_losses)):
            assert a.tobytes() == b.tobytes(), f"{what}: loss {i}: {a} {b}"
        for k, a in off_params.items():
            assert a.tobytes() == on_params[k].tobytes(), f"{what}: {k}"


def case_order_is_forward_first_use(mb):
    """The agreed order is the order forward first uses the parameters (not
    the parameter list's), the same on every rank."""
    *_, model, opt, params = train(mb, steps=1)
    order = get_broadcast_overlap(opt).order
    names = []  # parameter names in the order forward's layers start

    def record(layer, _inputs):
        names.extend(p.name for p in layer.parameters(False))

    hooks = [
        layer.register_forward_pre_hook(record)
        for layer in model.sublayers(True)
    ]
    model(batch(0, 0)[0])
    for hook in hooks:
        hook.remove()
    gathered = []
    dist.all_gather(gathered, paddle.to_tensor(order, dtype="int64"))
    assert all(g.numpy().tolist() == order for g in gathered), gathered
    first_use = list(dict.fromkeys(names))
    assert [params[i].name for i in order] == first_use, (order, first_use)


def case_units_and_waits(mb):
    """One unit per parameter (or per bucket: fewer, a bucket boundary inside
    a layer); each launched every step, waited once, by forward, in order."""
    *_, model, opt, params = train(mb)
    overlap = get_broadcast_overlap(opt)
    stats, units = overlap.stats, overlap.units
    indices = sorted(i for u in units for i in u.indices)
    assert indices == list(range(len(params))), indices  # each one, once
    if mb == 0:
        assert all(len(u.indices) == 1 for u in units), units
    else:
        assert len(units) < len(params), units
        src_of = {id(u): u.src for u in units}
        unit_of = {id(params[i]): id(u) for u in units for i in u.indices}
        split = 0  # layers with two parameters of one rank in two buckets
        for layer in model.sublayers():
            own = {unit_of[id(p)] for p in layer.parameters(False)}
            split += len(own) > len({src_of[u] for u in own})
        assert split > 0, units
    waits = {k: v for k, v in stats.items() if k.startswith("waited_")}
    waits.pop("waited_out_of_order")  # counts layers out of order, not waits
    assert stats["launched"] == STEPS * len(units), stats
    assert sum(waits.values()) == stats["launched"], stats
    # forward after each step but the last; then the final state_dict()
    assert stats["waited_in_forward"] == (STEPS - 1) * len(units), stats
    assert stats["waited_on_read"] == len(units), stats
    assert sum(overlap.read_paths.values()) == len(units), overlap.read_paths
    assert stats["waited_out_of_order"] == 0, stats


def num_pre_hooks(model):
    return sum(len(m._forward_pre_hooks) for m in model.sublayers(True))


def case_hooks_constant_and_removed(mb):
    """Hooks registered once; turning overlap off right after a step waits
    for its broadcasts and removes every hook."""
    plain = num_pre_hooks(train(None, steps=1)[2])
    seen = []

    def check(model, opt):
        overlap = get_broadcast_overlap(opt)
        seen.append((num_pre_hooks(model) - plain, overlap.num_hooks))
        assert seen[-1] == seen[0], seen  # the same at every step
        assert seen[0][0] == seen[0][1] > 0, seen  # each one the overlap's
        if len(seen) == STEPS:
            assert overlap.num_pending > 0, "the step's broadcasts are pending"
            opt._set_broadcast_overlap(False)
            assert overlap.num_pending == overlap.num_hooks == 0
            assert overlap.state.value == "closed", overlap.state
            assert num_pre_hooks(model) == plain, num_pre_hooks(model)
            assert get_broadcast_overlap(opt) is None

    train(mb, on_step=check)


def init_fleet():
    strategy = fleet.DistributedStrategy()
    degrees = dict(dp_degree=1, mp_degree=1, pp_degree=1, sharding_degree=2)
    strategy.hybrid_configs = degrees
    fleet.init(is_collective=True, strategy=strategy)


def main():
    cases = {k[5:]: f for k, f in globals().items() if k.startswith("case_")}
    wanted = os.environ.get("BROADCAST_OVERLAP_CASES", "")
    names = [n for n in wanted.split(",") if n] or list(cases)
    if not set(names) <= set(cases):
        print(f"unknown cases {names}; known: {list(cases)}", flush=True)
        return 2
    init_fleet()
    for name in names:
        for mode, mb in MODES.items():
            try:
                cases[name](mb)
            except Exception:
                print(f"CASE {name} [{mode}] FAIL", flush=True)
                traceback.print_exc()
                return 1  # at the first failure (see the docstring)
            print(f"CASE {name} [{mode}] PASS", flush=True)
    print(f"{len(names) * len(MODES)} passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
