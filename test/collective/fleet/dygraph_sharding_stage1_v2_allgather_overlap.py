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
"""Per-rank script: sharding stage 1 V2 (``sharding_configs.split_param``)
with the parameter all-gather overlapped with the next forward
(``_set_all_gather_overlap_forward``), on vs off.

Run on 2 ranks under ``python -m paddle.distributed.launch``. Env
``ALLGATHER_OVERLAP_CASES`` picks cases (comma list; empty: all but
``bf16``). Comm buffers of 1 MB (``comm_buffer_size_MB``), so the model has
several. ``bf16`` (2 GPUs with bf16): O2 with ``main_grad``, overlap on vs
off bitwise. A rank exits non-zero at its first failed case; the launcher
then stops the others.
"""

import os
import sys
import traceback

import numpy as np

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle import nn
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
    get_param_sync_overlap,
)
from paddle.distributed.fleet.utils import mix_precision_utils

VOCAB, HIDDEN, SEQ, BATCH, STEPS = 64, 256, 6, 4, 3
BUFFER_MB = 1  # about 3.2 MB of fp32 parameters: 4 comm buffers


class Block(nn.Layer):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class LM(nn.Layer):
    """Embedding -> 3 blocks -> head, the head built first: Paddle's buffer
    order (the parameter list's) is not the order forward uses them."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.blocks = nn.LayerList([Block() for _ in range(3)])
        self.embed = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(step, micro=0):
    rng = np.random.RandomState(1000 * step + 10 * micro + dist.get_rank())
    tokens, labels = rng.randint(0, VOCAB, size=(2, BATCH, SEQ)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def copies(tensors):
    """{key: numpy copy} of a dict or list of tensors (list: by position)."""
    items = tensors.items() if isinstance(tensors, dict) else enumerate(tensors)
    return {k: np.array(v.numpy(), copy=True) for k, v in items}


def assert_bitwise(expected, actual, what):
    """Two runs' {part: {key: numpy array}} are bitwise equal, none empty."""
    assert sorted(expected) == sorted(actual), (what, sorted(actual))
    for part, want in expected.items():
        got = actual[part]
        assert sorted(want) == sorted(got), f"{what}: {part}: keys differ"
        assert want, f"{what}: {part}: nothing to compare"
        for key, a in want.items():
            b = got[key]
            same = a.dtype == b.dtype and a.tobytes() == b.tobytes()
            assert same, f"{what}: {part} {key}: {a} vs {b}"


def assert_waits_balanced(stats):
    """Every unit launched was waited exactly once (nothing pending)."""
    waits = {k: v for k, v in stats.items() if k.startswith("waited_")}
    waits.pop("waited_out_of_order")  # counts layers out of order, not waits
    assert sum(waits.values()) == stats["launched"], stats


def inner_v2(opt):
    while type(opt).__name__ != "DygraphShardingOptimizerV2":
        opt = vars(opt)["_inner_opt"]
    return opt


def train(overlap, acc=1, steps=STEPS, after_step=None, prepare=None):
    """Train LM with V2, overlap off or on; returns (losses, values read
    after each step, final parameters), each {key: numpy copy}, and the
    model, the optimizer and the raw layer."""
    paddle.seed(2026)  # the same initial weights on every rank and run
    raw = LM()
    opt = fleet.distributed_optimizer(
        paddle.optimizer.AdamW(0.01, parameters=raw.parameters())
    )
    model = fleet.distributed_model(raw)
    if overlap:  # as PaddleFormers' --stage1_allgather_overlap calls it
        opt._set_all_gather_overlap_forward(True, model)
    if prepare is not None:
        prepare(raw, model, opt)
    losses, reads = [], []
    for step in range(steps):
        for micro in range(acc):
            tokens, labels = batch(step, micro)
            loss = F.cross_entropy(model(tokens), labels).mean()
            (loss / acc).backward()
            losses.append(loss)
        opt.step()
        opt.clear_grad()
        if after_step is not None:
            reads.extend(after_step(raw, model, opt))
    opt.state_dict()  # waits for the last step's gathers
    result = {
        "losses": copies(losses),
        "parameters": copies(raw.state_dict()),
    }
    if reads:
        result["reads between steps"] = copies(reads)
    return result, raw, model, opt


def compare(**kwargs):
    """Overlap off, then on: bitwise equal; the final parameters the same on
    every rank; every gather waited once. Returns the run with overlap."""
    off, *_ = train(False, **kwargs)
    on, raw, model, opt = train(True, **kwargs)
    assert_bitwise(off, on, f"overlap on vs off {sorted(kwargs)}")
    overlap = get_param_sync_overlap(opt)
    assert overlap is not None and len(overlap.units) >= 3, overlap
    assert overlap.collective == "all-gather", overlap.collective
    assert_waits_balanced(overlap.stats)
    digest = paddle.to_tensor(
        [float(v.astype("float64").sum()) for v in on["parameters"].values()]
    )
    gathered = []
    dist.all_gather(gathered, digest)
    assert all((g.numpy() == digest.numpy()).all() for g in gathered)
    return on, raw, model, opt


def case_equal_on_off():
    """Losses and final parameters equal overlap off bit for bit, with
    gradient accumulation 1 and 2."""
    for acc in (1, 2):
        compare(acc=acc)


def case_gather_order_follows_forward():
    """The buffers are gathered in the order forward first uses them (not
    Paddle's buffer order, the parameter list's), the same on every rank;
    one gather per buffer per step, each waited once, by forward."""
    first_use = []

    def record(raw, model, opt):
        where = {
            p.name: b
            for b, buf in enumerate(inner_v2(opt)._comm_buffer_list)
            for p in buf._params
        }

        def hook(layer, _inputs):
            for p in layer.parameters(include_sublayers=False):
                if where[p.name] not in first_use:
                    first_use.append(where[p.name])

        handles = [
            layer.register_forward_pre_hook(hook)
            for layer in raw.sublayers(include_self=True)
        ]
        with paddle.no_grad():
            raw(batch(0)[0])
        for handle in handles:
            handle.remove()

    _, raw, model, opt = compare(prepare=record)
    overlap = get_param_sync_overlap(opt)
    order = [int(u.label[len("comm_buffer") :]) for u in overlap.units]
    assert order == first_use, (order, first_use)
    assert order != sorted(order), "Paddle's buffer order is forward's here"
    gathered = []
    dist.all_gather(gathered, paddle.to_tensor(order, dtype="int64"))
    assert all(g.numpy().tolist() == order for g in gathered), gathered
    stats = overlap.stats
    assert stats["launched"] == STEPS * len(order), stats
    assert stats["waited_in_forward"] == (STEPS - 1) * len(order), stats
    assert stats["waited_out_of_order"] == 0, stats


def case_reads_right_after_step():
    """Right after step(): the model's state_dict(), parameters(), an
    attribute and a forward compiled by paddle.jit.to_static read the
    updated parameters (equal to overlap off), not the gathers' old values."""

    def compile_forward(raw, model, opt):
        raw.head.forward = paddle.jit.to_static(raw.head.forward)

    def read(raw, model, opt):
        values = list(raw.state_dict().values())
        values += [p * 1 for p in raw.parameters()]
        values.append(raw.embed.weight * 1)
        with paddle.no_grad():
            values.append(raw.head(paddle.ones([1, HIDDEN])))
        return values

    _, raw, model, opt = compare(after_step=read, prepare=compile_forward)
    stats = get_param_sync_overlap(opt).stats
    assert stats["waited_on_read"] > 0, stats
    assert stats["waited_in_forward"] == 0, stats  # the reads came first


def case_read_on_one_rank_then_barrier():
    """Rank 0 alone reads the model's state_dict() right after step() (a
    checkpoint), then every rank meets at a barrier: no read starts a
    gather, so the ranks' collectives stay the same and nothing hangs."""

    def save_on_rank0(raw, model, opt):
        values = []
        if dist.get_rank() == 0:
            values = list(raw.state_dict().values())
        dist.barrier()
        return values

    compare(after_step=save_on_rank0)


def num_pre_hooks(model):
    return sum(len(m._forward_pre_hooks) for m in model.sublayers(True))


def case_hooks_constant_and_removed():
    """Hooks registered once; turning the overlap off right after a step
    waits for its gathers and removes every hook; training goes on equal
    to overlap off."""
    _, _, model, _ = train(False, steps=1)
    plain = num_pre_hooks(model)  # fleet's wrapper: the hooked root
    seen = []

    def check(raw, model, opt):
        overlap = get_param_sync_overlap(opt)
        seen.append((num_pre_hooks(model) - plain, overlap.num_hooks))
        assert seen[-1] == seen[0], seen  # the same at every step
        assert seen[0][0] == seen[0][1] > 0, seen  # each one the overlap's
        if len(seen) == STEPS:
            assert overlap.num_pending > 0, "the step's gathers are pending"
            opt._set_all_gather_overlap_forward(False, model)
            assert overlap.num_pending == overlap.num_hooks == 0
            assert overlap.state.value == "closed", overlap.state
            assert num_pre_hooks(model) == plain, num_pre_hooks(model)
            assert get_param_sync_overlap(opt) is None
        return []

    off, *_ = train(False, steps=STEPS)
    on, *_ = train(True, steps=STEPS, after_step=check)
    assert_bitwise(off, on, "turned off after the last step")


def case_bf16():
    """bf16 O2 with main_grad (fp32 gradients, master weights): overlap on
    vs off bitwise."""
    if not paddle.amp.is_bfloat16_supported():
        raise RuntimeError("bf16 is not supported here; the driver skips it")

    def train_bf16(overlap):
        paddle.seed(2026)
        raw = LM()
        _hooks = mix_precision_utils.MixPrecisionLayer(raw, "bfloat16")
        opt = mix_precision_utils.MixPrecisionOptimizer(
            paddle.optimizer.AdamW(
                1e-3, parameters=raw.parameters(), multi_precision=True
            )
        )
        raw = paddle.amp.decorate(models=raw, dtype="bfloat16", level="O2")
        opt = fleet.distributed_optimizer(opt)
        model = fleet.distributed_model(raw)
        if overlap:
            opt._set_all_gather_overlap_forward(True, model)
        losses = []
        for step in range(STEPS):
            tokens, labels = batch(step)
            with paddle.amp.auto_cast(True, level="O2", dtype="bfloat16"):
                logits = model(tokens)
            loss = F.cross_entropy(logits.astype("float32"), labels).mean()
            loss.backward()
            losses.append(loss)
            opt.step()
            opt.clear_grad()
        state = opt.state_dict()  # waits for the last step's gathers
        tensors = {
            k: v for k, v in state.items() if isinstance(v, paddle.Tensor)
        }
        return {
            "losses": copies(losses),
            "parameters": copies(raw.state_dict()),
            "optimizer state": copies(tensors),
        }

    assert_bitwise(train_bf16(False), train_bf16(True), "bf16 O2 main_grad")


def init_fleet():
    strategy = fleet.DistributedStrategy()
    degrees = dict(dp_degree=1, mp_degree=1, pp_degree=1, sharding_degree=2)
    strategy.hybrid_configs = degrees
    sharding = strategy.hybrid_configs["sharding_configs"]
    sharding.split_param = True
    if hasattr(sharding, "comm_buffer_size_MB"):  # Paddle 3.x
        sharding.comm_buffer_size_MB = BUFFER_MB
    fleet.init(is_collective=True, strategy=strategy)


def main():
    cases = {k[5:]: f for k, f in globals().items() if k.startswith("case_")}
    wanted = os.environ.get("ALLGATHER_OVERLAP_CASES", "")
    names = [n for n in wanted.split(",") if n]
    names = names or [n for n in cases if n != "bf16"]
    if not set(names) <= set(cases):
        print(f"unknown cases {names}; known: {list(cases)}", flush=True)
        return 2
    init_fleet()
    for name in names:
        try:
            cases[name]()
        except Exception:
            print(f"CASE {name} FAIL", flush=True)
            traceback.print_exc()
            return 1  # at the first failure (see the docstring)
        print(f"CASE {name} PASS", flush=True)
    print(f"{len(names)} passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
