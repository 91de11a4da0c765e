# Copyright (c) 2026 paddle_overlay authors. All Rights Reserved.
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
"""Per-rank script: sharding stage 1 with broadcast overlap on vs off.

Run under ``python -m paddle.distributed.launch --nproc_per_node 2``. Cases
are chosen with env ``BROADCAST_OVERLAP_CASES`` (comma list; all by default);
several run in one launch to save Paddle start-up. Each case trains the same
model from identical initial weights and data with overlap off and on and
asserts bitwise-equal losses and final parameters (numpy copies taken after
each run), and that the wait checker saw every task waited before use. The
script exits non-zero if any case fails.

Env ``PADDLE_OVERLAY_MODE``: ``overlay`` (default) applies paddle_overlay;
``patched`` runs against a Paddle whose sources carry the patch.
"""

import os
import sys
import traceback
import warnings

import numpy as np

import paddle
from paddle.distributed import fleet

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broadcast_overlap_checker import BroadcastWaitChecker  # noqa: E402

if os.environ.get("PADDLE_OVERLAY_MODE", "overlay") == "overlay":
    import paddle_overlay

    paddle_overlay.apply()

VOCAB, HIDDEN, SEQ, BATCH = 32, 16, 6, 4
STEPS = int(os.environ.get("BROADCAST_OVERLAP_STEPS", "4"))


# ----------------------------------------------------------------------
# models
class Block(paddle.nn.Layer):
    def __init__(self, hidden):
        super().__init__()
        self.norm = paddle.nn.LayerNorm(hidden)
        self.up = paddle.nn.Linear(hidden, 2 * hidden)
        self.down = paddle.nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return x + self.down(paddle.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(paddle.nn.Layer):
    """Embedding -> 2 blocks (LayerNorm, Linear) -> head, [BATCH, SEQ] int64
    tokens -> [BATCH, SEQ, VOCAB] float32 logits."""

    def __init__(self, num_blocks=2):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = paddle.nn.LayerList([Block(HIDDEN) for _ in range(num_blocks)])
        self.head = paddle.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


MODELS = {"tiny_lm": TinyLM}


# ----------------------------------------------------------------------
# training
def rank():
    return paddle.distributed.get_rank()


def batch(step, micro):
    rng = np.random.RandomState(1000 * step + 10 * micro + rank())
    tokens = rng.randint(0, VOCAB, size=(BATCH, SEQ)).astype("int64")
    labels = rng.randint(0, VOCAB, size=(BATCH, SEQ)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def initial_state(model_name):
    """numpy copy of a freshly built model's weights, the same on all ranks."""
    paddle.seed(2026)
    model = MODELS[model_name]()
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def train(
    model_name,
    overlap,
    acc_steps=1,
    steps=STEPS,
    use_minimize=False,
    checker=None,
    on_step=None,
):
    """Train and return (losses, params, info): numpy copies, taken after the
    run; ``info`` holds the optimizer and model for extra checks."""
    model = MODELS[model_name]()
    model.set_state_dict(
        {k: paddle.to_tensor(v) for k, v in initial_state(model_name).items()}
    )
    inner = paddle.optimizer.AdamW(
        learning_rate=0.01, parameters=model.parameters(), weight_decay=0.01
    )
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(inner)
    if overlap:
        opt._set_broadcast_overlap(True, layers=model)
    if checker is not None:
        checker.watch(model, opt)
    losses = []
    for step in range(steps):
        for micro in range(acc_steps):
            tokens, labels = batch(step, micro)
            logits = model(tokens)
            loss = paddle.nn.functional.cross_entropy(logits, labels).mean()
            (loss / acc_steps).backward()
            losses.append(loss.numpy().copy())
        if use_minimize:
            opt.minimize(loss)
        else:
            opt.step()
        opt.clear_grad()
        if on_step is not None:
            on_step(step, model, opt)
    params = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    info = {"model": model, "opt": opt}
    return losses, params, info


def assert_bitwise_equal(expected, actual, what):
    expected_losses, expected_params = expected
    actual_losses, actual_params = actual
    assert len(expected_losses) == len(actual_losses), what
    for i, (a, b) in enumerate(zip(expected_losses, actual_losses)):
        assert a.tobytes() == b.tobytes(), f"{what}: loss {i} differs: {a} vs {b}"
    assert expected_params.keys() == actual_params.keys(), what
    for k in expected_params:
        a, b = expected_params[k], actual_params[k]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {k}"
        assert a.tobytes() == b.tobytes(), (
            f"{what}: parameter {k} differs, max abs diff "
            f"{np.abs(a.astype('float64') - b.astype('float64')).max()}"
        )


def overlap_impl(opt):
    return opt._inner_opt.__dict__["_broadcast_overlap_impl"]


def total_forward_pre_hooks(model):
    return sum(len(l._forward_pre_hooks) for l in model.sublayers(include_self=True))


def compare_on_off(model_name="tiny_lm", **kwargs):
    """Off run, then on run under the checker; returns the checker and info."""
    off_losses, off_params, _ = train(model_name, overlap=False, **kwargs)
    with BroadcastWaitChecker() as checker:
        on_losses, on_params, info = train(
            model_name, overlap=True, checker=checker, **kwargs
        )
    assert_bitwise_equal(
        (off_losses, off_params), (on_losses, on_params), f"{kwargs}"
    )
    assert checker.violations == [], checker.violations[:10]
    assert checker.counts["launched"] > 0, "no async broadcast was issued"
    return checker, info


# ----------------------------------------------------------------------
# cases
def case_equal_acc1():
    checker, info = compare_on_off(acc_steps=1)
    # every launched task is waited, in forward or before the next update
    steps = STEPS
    n_trainable = len(list(info["model"].parameters()))
    # step 0 launches after the update too: steps * n_trainable tasks
    assert checker.counts["launched"] == steps * n_trainable, checker.counts
    # the final model.state_dict() waited for the last launch
    assert checker.num_unwaited() == 0, checker.num_unwaited()


def case_equal_acc2():
    compare_on_off(acc_steps=2)


def case_equal_minimize():
    compare_on_off(acc_steps=1, use_minimize=True)


def case_forward_order_recorded():
    """The agreed order is the forward first-use order, the same on every rank."""
    _, _, info = train("tiny_lm", overlap=True, steps=1)
    opt, model = info["opt"], info["model"]
    impl = overlap_impl(opt)
    params = list(opt._inner_opt._origin_parameter_list)
    forward_names = []

    def record(layer, _inputs):
        forward_names.extend(p.name for p in layer.parameters(include_sublayers=False))

    handles = [
        l.register_forward_pre_hook(record) for l in model.sublayers(include_self=True)
    ]
    model(batch(0, 0)[0])
    for h in handles:
        h.remove()
    seen = []
    for name in forward_names:
        if name not in seen:
            seen.append(name)
    assert [params[i].name for i in impl.order] == seen, (
        [params[i].name for i in impl.order],
        seen,
    )
    # identical on every rank: gather the orders and compare
    mine = paddle.to_tensor(impl.order, dtype="int64")
    gathered = []
    paddle.distributed.all_gather(gathered, mine)
    for other in gathered:
        assert other.numpy().tolist() == impl.order


def case_hooks_constant_and_removed():
    counts = []

    def on_step(step, model, opt):
        counts.append((total_forward_pre_hooks(model), overlap_impl(opt).num_hooks))

    _, _, info = train("tiny_lm", overlap=True, steps=12, on_step=on_step)
    assert len(set(counts)) == 1, counts
    model, opt = info["model"], info["opt"]
    _, _, plain = train("tiny_lm", overlap=False, steps=1)
    base = total_forward_pre_hooks(plain["model"])
    assert counts[0][0] > base, counts
    impl = overlap_impl(opt)
    opt._set_broadcast_overlap(False)
    assert impl.num_pending == 0 and impl.num_hooks == 0
    assert total_forward_pre_hooks(model) == base


def case_checker_catches_missing_wait():
    """Negative control: with the overlap's pre-hooks removed, the checker
    must report violations (it would otherwise prove nothing)."""
    with BroadcastWaitChecker() as checker:

        def drop_hooks(step, model, opt):
            if step == 0:
                for handle in overlap_impl(opt)._pre_hook_handles.values():
                    handle.remove()

        train("tiny_lm", overlap=True, steps=2, checker=checker, on_step=drop_hooks)
    assert checker.violations, "checker failed to see unwaited broadcasts"
    assert any(w.startswith("forward:") for w, _ in checker.violations)


CASES = {
    name[len("case_") :]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")
}


def main():
    paddle.set_device(os.environ.get("PADDLE_OVERLAY_TEST_DEVICE", "cpu"))
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {
        "dp_degree": 1,
        "mp_degree": 1,
        "pp_degree": 1,
        "sharding_degree": int(os.environ.get("PADDLE_TRAINERS_NUM", "2")),
    }
    fleet.init(is_collective=True, strategy=strategy)
    wanted = os.environ.get("BROADCAST_OVERLAP_CASES", "")
    names = [n for n in wanted.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown cases {unknown}; known: {sorted(CASES)}", flush=True)
        return 2
    failed = []
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                CASES[name]()
            print(f"CASE {name} PASS (rank {rank()})", flush=True)
        except Exception:
            failed.append(name)
            print(f"CASE {name} FAIL (rank {rank()})", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
    print(f"{len(names) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
