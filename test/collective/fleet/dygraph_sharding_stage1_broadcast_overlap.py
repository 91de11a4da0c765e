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
overlapped with the next forward (``_set_broadcast_overlap``), on vs off.

Run on 2 ranks under ``python -m paddle.distributed.launch``. Env
``BROADCAST_OVERLAP_CASES`` picks cases (comma list; empty: all but
``bf16``). The others run in each mode of ``MODES`` and check the public
counters. ``bf16`` (2 GPUs with bf16), the MLP of
test_dygraph_sharding_stage1_bf16: O1 vs O2 with ``main_grad``, and overlap
on vs off bitwise for O1, O2 with ``main_grad`` and the ``GradScaler`` runs.
A rank exits non-zero at its first failed case; the launcher then stops
the others.
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

VOCAB, HIDDEN, SEQ, BATCH, STEPS = 32, 16, 6, 4, 4
MODES = {  # keyword arguments of _set_broadcast_overlap
    "per_parameter": {"bucket_size_mb": 0},
    "buckets": {"bucket_size_mb": 0.002},  # 2 KB: boundaries inside layers
}


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


def train(mode, acc=1, minimize=False, steps=STEPS, on_step=None):
    """Train TinyLM, overlap off (``mode`` None) or on in ``MODES[mode]``:
    (numpy copies of losses, parameters and what ``on_step(model, opt)``
    returned after each step), model, optimizer, parameters."""
    paddle.seed(2026)  # the same initial weights on every rank and run
    model = TinyLM()
    params = model.parameters()
    opt = fleet.distributed_optimizer(
        paddle.optimizer.AdamW(0.01, parameters=params, weight_decay=0.01)
    )
    model = fleet.distributed_model(model)
    if mode is not None:
        opt._set_broadcast_overlap(True, layers=model, **MODES[mode])
    losses, reads = [], []
    for step in range(steps):
        for micro in range(acc):
            tokens, labels = batch(step, micro)
            loss = F.cross_entropy(model(tokens), labels).mean()
            (loss / acc).backward()
            losses.append(loss)
        if minimize:
            opt.minimize(loss)
        else:
            opt.step()
        opt.clear_grad()
        if on_step is not None:
            reads.extend(on_step(model, opt) or ())
    opt.state_dict()  # waits for the last step's broadcasts
    result = {
        "losses": copies(losses),
        "parameters": copies(model.state_dict()),
    }
    if reads:
        result["reads between steps"] = copies(reads)
    return result, model, opt, params


def case_on_off_bitwise(mode):
    """Losses and final parameters equal overlap off bit for bit: gradient
    accumulation 1 and 2 with step(), and minimize()."""
    for acc, minimize in ((1, False), (2, False), (1, True)):
        off, *_ = train(None, acc, minimize)
        on, *_ = train(mode, acc, minimize)
        assert_bitwise(off, on, f"acc={acc} minimize={minimize}")


def case_order_is_forward_first_use(mode):
    """The agreed order is the order forward first uses the parameters (not
    the parameter list's), the same on every rank."""
    *_, model, opt, params = train(mode, steps=1)
    order = get_param_sync_overlap(opt).order
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


def case_units_and_waits(mode):
    """One unit per parameter (or per bucket: fewer, a bucket boundary inside
    a layer); each launched every step, waited once, by forward, in order."""
    *_, model, opt, params = train(mode)
    overlap = get_param_sync_overlap(opt)
    stats, units = overlap.stats, overlap.units
    indices = sorted(i for u in units for i in u.indices)
    assert indices == list(range(len(params))), indices  # each one, once
    if mode == "per_parameter":
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
    assert stats["launched"] == STEPS * len(units), stats
    assert_waits_balanced(stats)
    # forward after each step but the last; then the final state_dict()
    assert stats["waited_in_forward"] == (STEPS - 1) * len(units), stats
    assert stats["waited_on_demand"] == len(units), stats
    assert stats["waited_out_of_order"] == 0, stats


def case_reads_right_after_step(mode):
    """Right after step(), before the next forward: an attribute, the
    model's parameters() and state_dict(), and a forward compiled by
    paddle.jit.to_static read the updated parameters (equal to overlap off),
    each path first in turn; every read waits only for what it returns."""
    state = {}

    def read(model, opt):
        layers = model._layers
        if not state:  # the head's forward as a compiled program
            state.update(head=paddle.jit.to_static(layers.head.forward), n=0)
        first, state["n"] = state["n"] % 3, state["n"] + 1
        reads = [
            lambda: [layers.fcs[1].weight * 1, layers.head.bias * 1],
            lambda: [p * 1 for p in model.parameters()],
            lambda: [state["head"](paddle.ones([1, HIDDEN]))],
        ]
        values = []
        for i in range(3):
            values += reads[(first + i) % 3]()
        return values + list(model.state_dict().values())

    off, *_ = train(None, on_step=read)
    state.clear()
    on, model, opt, params = train(mode, on_step=read)
    assert_bitwise(off, on, f"reads right after step() [{mode}]")
    overlap = get_param_sync_overlap(opt)
    stats, paths = overlap.stats, overlap.read_paths
    assert_waits_balanced(stats)
    assert stats["waited_in_forward"] == 0, stats  # the reads came first
    assert paths["attribute"] > 0 and paths["iteration"] > 0, paths
    assert stats["waited_in_program"] > 0, stats


def num_pre_hooks(model):
    return sum(len(m._forward_pre_hooks) for m in model.sublayers(True))


def case_hooks_constant_and_removed(mode):
    """Hooks registered once; turning overlap off right after a step waits
    for its broadcasts and removes every hook."""
    plain = num_pre_hooks(train(None, steps=1)[1])
    seen = []

    def check(model, opt):
        overlap = get_param_sync_overlap(opt)
        seen.append((num_pre_hooks(model) - plain, overlap.num_hooks))
        assert seen[-1] == seen[0], seen  # the same at every step
        assert seen[0][0] == seen[0][1] > 0, seen  # each one the overlap's
        if len(seen) == STEPS:
            assert overlap.num_pending > 0, "the step's broadcasts are pending"
            opt._set_broadcast_overlap(False)
            assert overlap.num_pending == overlap.num_hooks == 0
            assert overlap.state.value == "closed", overlap.state
            assert num_pre_hooks(model) == plain, num_pre_hooks(model)
            assert get_param_sync_overlap(opt) is None

    train(mode, on_step=check)


# bf16: the MLP and settings of test_dygraph_sharding_stage1_bf16; O1
# autocasts only these ops, so O1 and O2 compute the same values
SIZE, MLP_BATCH, MLP_BATCHES = 1000, 50, 8  # 4 updates with acc 2
O1_WHITE_LIST = ["matmul_v2", "elementwise_add", "relu"]


def mlp():
    linears = [nn.Linear(SIZE, SIZE), nn.Linear(SIZE, SIZE)]
    return nn.Sequential(*linears, nn.Linear(SIZE, 10), nn.ReLU())


@paddle.utils.unique_name.guard()  # the same names in every run
def train_mlp(
    initial, data, o2=False, main_grad=False, acc=1, overlap=False, scaler=False
):
    """Train a fresh MLP from ``initial`` on ``data`` (bf16 O2 if ``o2``,
    else O1; ``scaler``: static loss scale 1024); returns numpy copies of the
    losses, parameters, optimizer state and (O2) master weights."""
    assert not (scaler and acc != 1), "the scaler runs use acc 1"
    assert o2 or not main_grad, "main_grad goes with pure bf16 (O2)"
    model = mlp()
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in initial.items()})
    if main_grad:  # fp32 main_grad hooks on the parameters
        _hooks = mix_precision_utils.MixPrecisionLayer(model, "bfloat16")
    opt = paddle.optimizer.AdamW(
        parameters=model.parameters(),
        learning_rate=1e-5,
        weight_decay=1e-5,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_norm=1.0),
        multi_precision=o2,
    )
    if main_grad:
        opt = mix_precision_utils.MixPrecisionOptimizer(opt)
    level, white_list = "O1", O1_WHITE_LIST
    if o2:
        level, white_list = "O2", None
        model = paddle.amp.decorate(models=model, dtype="bfloat16", level="O2")
    params = model.parameters()  # the optimizer's (O2 casts them in place)
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(opt)
    if overlap:
        opt._set_broadcast_overlap(True, layers=model)
    if scaler:  # a static loss scale: bf16 needs no dynamic scaling
        static = dict(init_loss_scaling=1024, use_dynamic_loss_scaling=False)
        scaler = fleet.distributed_scaler(paddle.amp.GradScaler(**static))
    losses = []
    for i, batch_i in enumerate(data):
        with paddle.amp.auto_cast(
            True, level=level, dtype="bfloat16", custom_white_list=white_list
        ):
            out = model(paddle.to_tensor(batch_i))
        loss = paddle.mean(out.astype("float32"))  # loss in fp32
        if acc != 1:
            loss = loss / acc
        losses.append(loss.detach())  # no .item(): no host sync per step
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
        else:
            loss.backward()
            if (i + 1) % acc == 0:
                opt.step()
                opt.clear_grad()
    # the optimizer's state_dict() waits for pending broadcasts (no
    # synchronize), so the parameters are read after it
    state = opt.state_dict()
    tensors = {k: v for k, v in state.items() if isinstance(v, paddle.Tensor)}
    result = {
        "losses": copies(losses),
        "parameters": copies({p.name: p for p in params}),
        "optimizer state": copies(tensors),
    }
    if o2:
        result["master weights"] = copies(state.get("master_weights", {}))
    if overlap:
        stats = get_param_sync_overlap(opt).stats
        opt._set_broadcast_overlap(False)
        assert_waits_balanced(stats)
    return result


def case_bf16(_mode):
    """bf16 O1 vs O2 with main_grad; overlap on vs off for O1, O2 with
    main_grad and the GradScaler runs (default settings)."""
    paddle.seed(2023)  # initial weights bf16 represents exactly
    state = mlp().state_dict().items()
    bf16 = {k: paddle.cast(v, "bfloat16").astype("float32") for k, v in state}
    initial = copies(bf16)
    rng = np.random.RandomState(2023 + dist.get_rank())
    batches = [
        rng.rand(MLP_BATCH, SIZE).astype("float32") for _ in range(MLP_BATCHES)
    ]
    for acc in (1, 2):  # O1 parameters equal O2's master weights
        o1 = train_mlp(initial, batches, acc=acc)
        o2 = train_mlp(initial, batches, True, True, acc)
        for k, loss in o1["losses"].items():
            np.testing.assert_array_equal(o2["losses"][k], loss)
        assert o2["master weights"], "O2 run has no master weights"
        for key, master in o2["master weights"].items():
            np.testing.assert_array_equal(
                o1["parameters"][key], master, err_msg=f"O1 vs O2 {key}"
            )
    runs = [dict(acc=acc) for acc in (1, 2)]
    runs += [dict(o2=True, main_grad=True, acc=acc) for acc in (1, 2)]
    runs += [dict(o2=True, main_grad=g, scaler=True) for g in (True, False)]
    for kwargs in runs:
        off = train_mlp(initial, batches, **kwargs)
        on = train_mlp(initial, batches, overlap=True, **kwargs)
        assert_bitwise(off, on, f"bf16 overlap on vs off {kwargs}")


def init_fleet():
    strategy = fleet.DistributedStrategy()
    degrees = dict(dp_degree=1, mp_degree=1, pp_degree=1, sharding_degree=2)
    strategy.hybrid_configs = degrees
    fleet.init(is_collective=True, strategy=strategy)


def main():
    cases = {k[5:]: f for k, f in globals().items() if k.startswith("case_")}
    wanted = os.environ.get("BROADCAST_OVERLAP_CASES", "")
    names = [n for n in wanted.split(",") if n]
    names = names or [n for n in cases if n != "bf16"]
    if not set(names) <= set(cases):
        print(f"unknown cases {names}; known: {list(cases)}", flush=True)
        return 2
    if "bf16" in names:
        if not paddle.amp.is_bfloat16_supported():
            raise RuntimeError(
                f"bf16 is not supported on {paddle.get_device()}; the driver "
                "should have skipped this test"
            )
    init_fleet()
    passed = 0
    for name in names:
        for mode in ("default",) if name == "bf16" else MODES:
            try:
                cases[name](mode)
            except Exception:
                print(f"CASE {name} [{mode}] FAIL", flush=True)
                traceback.print_exc()
                return 1  # at the first failure (see the docstring)
            print(f"CASE {name} [{mode}] PASS", flush=True)
            passed += 1
    print(f"{passed} passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
