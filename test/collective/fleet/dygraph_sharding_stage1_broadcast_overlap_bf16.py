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
"""Per-rank script: sharding stage 1 with bf16, broadcast overlap on vs off.

Run on 2 GPUs under ``python -m paddle.distributed.launch --nproc_per_node 2
--devices 0,1`` (driver: ``test_dygraph_sharding_stage1_broadcast_overlap.py``).
Same shape as ``dygraph_group_sharded_stage1_bf16.py``, with every comparison
made on numpy copies taken when a run ends (never on live parameters) and every
run starting from a fresh model with the same initial weights:

* bf16 O1 (fp32 parameters, bf16 compute) vs bf16 O2 with ``main_grad``
  (bf16 parameters, fp32 master weights and gradients), gradient
  accumulation 1 and 2: equal losses, and O1's parameters equal to O2's
  master weights;
* for O1 and O2, accumulation 1 and 2: broadcast overlap on vs off bitwise
  equal losses, parameters and optimizer state;
* with ``GradScaler`` (static loss scale, as ``distributed_scaler``), O2 with
  and without ``main_grad``: broadcast overlap on vs off bitwise equal.

Any mismatch raises; the script then exits non-zero. It fails, instead of
passing having run nothing, when the device lacks bf16: the driver skips
before launching in that case.

The optimizer must carry the ordered broadcast overlap
(``DygraphShardingOptimizer._origin_step``); the script checks it at start.
"""

import logging
import os
import re
import sys

import numpy as np

import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    dygraph_sharding_optimizer,
)
from paddle.distributed.fleet.utils import mix_precision_utils

if not hasattr(
    dygraph_sharding_optimizer.DygraphShardingOptimizer, "_origin_step"
):
    raise RuntimeError(
        "this Paddle's DygraphShardingOptimizer has no ordered broadcast "
        f"overlap: {dygraph_sharding_optimizer.__file__} has no "
        "DygraphShardingOptimizer._origin_step"
    )

logging.basicConfig(level="INFO", format="%(message)s")

LINEAR_SIZE = 1000
BATCH_SIZE = 50
NUM_BATCHES = 8  # micro-batches per run; 4 updates with accumulation 2
SHARDING_DEGREE = 2
# bf16 O1 autocasts these ops; the rest run in fp32.
O1_WHITE_LIST = ["matmul_v2", "elementwise_add", "relu"]


class MLP(paddle.nn.Layer):
    def __init__(self, linear_size=LINEAR_SIZE):
        super().__init__()
        self._linear1 = paddle.nn.Linear(linear_size, linear_size)
        self._linear2 = paddle.nn.Linear(linear_size, linear_size)
        self._linear3 = paddle.nn.Linear(linear_size, 10)
        self._relu = paddle.nn.ReLU()

    def forward(self, inputs):
        y = self._linear1(inputs)
        y = self._linear2(y)
        y = self._linear3(y)
        return self._relu(y)


def make_batches(rank):
    """Fixed float32 micro-batches; each rank of the sharding group gets its own."""
    rng = np.random.RandomState(2023 + rank)
    return [
        rng.rand(BATCH_SIZE, LINEAR_SIZE).astype("float32")
        for _ in range(NUM_BATCHES)
    ]


def bf16_representable_state():
    """Initial weights (numpy) that bf16 represents exactly, the same on every
    rank, so that O1 (fp32 parameters) and O2 (bf16 parameters) start equal."""
    paddle.seed(2023)
    state = {}
    for name, value in MLP().state_dict().items():
        rounded = paddle.cast(paddle.cast(value, "bfloat16"), "float32")
        state[name] = rounded.numpy().copy()
    return state


def create_optimizer(model, use_pure_bf16, use_main_grad):
    """AdamW as upstream's test builds it; with ``use_main_grad`` the model's
    parameters get fp32 ``main_grad`` hooks and the optimizer reads them."""
    wrapper = None
    if use_main_grad:
        assert use_pure_bf16, "main_grad goes with pure bf16 (O2)"
        wrapper = mix_precision_utils.MixPrecisionLayer(model, dtype="bfloat16")
    optimizer = paddle.optimizer.AdamW(
        parameters=model.parameters(),
        learning_rate=1e-5,
        weight_decay=1e-5,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_norm=1.0),
        multi_precision=use_pure_bf16,
    )
    if use_main_grad:
        optimizer = mix_precision_utils.MixPrecisionOptimizer(optimizer)
    return optimizer, wrapper


def by_position(named, params):
    """``named`` (name -> value) with each parameter's unique name replaced by
    its position in ``params``: fresh models get fresh unique names, positions
    compare across runs. Entries not named after a parameter keep their name."""
    names = sorted(
        ((p.name, i) for i, p in enumerate(params)), key=lambda x: -len(x[0])
    )
    out = {}
    for key, value in named.items():
        for name, i in names:  # longest first: a name may prefix another
            if key == name or re.match(re.escape(name) + r"(_|$)", key):
                key = f"param{i}" + key[len(name) :]
                break
        out[key] = value
    return out


def numpy_copy(value):
    return np.array(value.numpy(), copy=True)


def train_mlp(
    initial_state,
    batches,
    use_pure_bf16=False,
    use_main_grad=False,
    acc_steps=1,
    broadcast_overlap=False,
    use_scaler=False,
):
    """Train a fresh MLP from ``initial_state``; returns numpy copies taken at
    the end: (losses, parameters, optimizer state, master weights), the last
    three keyed by parameter position (``param<i>...``). ``use_scaler``: a
    ``GradScaler`` with a static loss scale of 1024 (bf16 needs no dynamic
    scaling) through ``fleet.distributed_scaler``, one update per batch."""
    logging.info(
        f"-- train: pure_bf16={use_pure_bf16} main_grad={use_main_grad} "
        f"acc_steps={acc_steps} broadcast_overlap={broadcast_overlap} "
        f"scaler={use_scaler}"
    )
    assert not (use_scaler and acc_steps != 1), "the scaler runs use acc 1"
    model = MLP()
    model.set_state_dict(
        {k: paddle.to_tensor(v) for k, v in initial_state.items()}
    )
    optimizer, _main_grad_layer = create_optimizer(
        model, use_pure_bf16, use_main_grad
    )
    if use_pure_bf16:
        level, white_list = "O2", None
        model = paddle.amp.decorate(models=model, dtype="bfloat16", level="O2")
    else:
        level, white_list = "O1", O1_WHITE_LIST
    params = model.parameters()  # the optimizer's (O2 casts them in place)

    model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
    if broadcast_overlap:
        optimizer._set_broadcast_overlap(True, layers=model)
    scaler = None
    if use_scaler:
        scaler = fleet.distributed_scaler(
            paddle.amp.GradScaler(
                init_loss_scaling=1024, use_dynamic_loss_scaling=False
            )
        )

    losses = []
    for i, data in enumerate(batches):
        with paddle.amp.auto_cast(
            True, level=level, dtype="bfloat16", custom_white_list=white_list
        ):
            out = model(paddle.to_tensor(data))
        loss = paddle.mean(out.astype("float32"))  # loss in fp32
        if acc_steps != 1:
            loss = loss / acc_steps
        losses.append(loss.detach())  # no .item(): no host sync per step
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()
            continue
        loss.backward()
        if (i + 1) % acc_steps == 0:
            optimizer.step()
            optimizer.clear_grad()

    # The model's and the optimizer's state_dict() wait for pending
    # broadcasts (what overlap promises: no manual synchronize), so the
    # parameter copies are taken after the model's.
    model.state_dict()
    model_state = {f"param{i}": numpy_copy(p) for i, p in enumerate(params)}
    opt_state = optimizer.state_dict()
    master = {
        k: numpy_copy(v) for k, v in opt_state.pop("master_weights", {}).items()
    }
    opt_state = {
        k: numpy_copy(v)
        for k, v in opt_state.items()
        if isinstance(v, paddle.Tensor)
    }
    result = (
        np.array([numpy_copy(x) for x in losses]),
        model_state,
        by_position(opt_state, params),
        by_position(master, params),
    )
    if broadcast_overlap:
        optimizer._set_broadcast_overlap(False)
    return result


def assert_all_equal(expected, actual, what):
    """Bitwise equality of two dicts of numpy arrays with the same keys."""
    assert sorted(expected) == sorted(
        actual
    ), f"{what}: keys differ: {sorted(expected)} vs {sorted(actual)}"
    assert expected, f"{what}: nothing to compare"
    for key in sorted(expected):
        np.testing.assert_array_equal(
            expected[key], actual[key], err_msg=f"{what}: {key}"
        )


def compare_bf16_o1_vs_o2(initial_state, batches, acc_steps):
    """O1 vs O2 with main_grad: equal losses; O1 parameters equal the O2
    master weights this rank owns."""
    o1_losses, o1_params, _, _ = train_mlp(
        initial_state, batches, use_pure_bf16=False, acc_steps=acc_steps
    )
    o2_losses, _, _, o2_master = train_mlp(
        initial_state,
        batches,
        use_pure_bf16=True,
        use_main_grad=True,
        acc_steps=acc_steps,
    )
    np.testing.assert_array_equal(o2_losses, o1_losses)
    assert o2_master, "O2 run has no master weights"
    for key, master in o2_master.items():
        np.testing.assert_array_equal(
            o1_params[key], master, err_msg=f"O1 param vs O2 master {key}"
        )
    logging.info(
        f"-- O1 vs O2 (acc_steps={acc_steps}): losses and "
        f"{len(o2_master)} master weights equal"
    )


def compare_overlap_on_off(initial_state, batches, what, **kwargs):
    """Train with ``kwargs`` (see ``train_mlp``) overlap off, then on: bitwise
    equal losses, parameters, optimizer state and (pure bf16) master
    weights."""
    off = train_mlp(initial_state, batches, **kwargs)
    on = train_mlp(initial_state, batches, broadcast_overlap=True, **kwargs)
    what = f"{what}, overlap on vs off, {kwargs}"
    np.testing.assert_array_equal(on[0], off[0], err_msg=f"{what}: losses")
    assert_all_equal(off[1], on[1], f"{what}: parameters")
    assert_all_equal(off[2], on[2], f"{what}: optimizer state")
    if kwargs["use_pure_bf16"]:
        assert_all_equal(off[3], on[3], f"{what}: master weights")
    logging.info(f"-- {what}: bitwise equal")


def compare_bf16_broadcast_overlap(initial_state, batches, acc_steps):
    """Overlap on vs off, for O1 and for O2 with main_grad."""
    for kwargs in (
        dict(use_pure_bf16=False),
        dict(use_pure_bf16=True, use_main_grad=True),
    ):
        compare_overlap_on_off(
            initial_state, batches, "bf16", acc_steps=acc_steps, **kwargs
        )


def compare_bf16_grad_scaler_overlap(initial_state, batches):
    """With GradScaler (as upstream's two scaler runs), O2 with and without
    main_grad: overlap on vs off."""
    for use_main_grad in (True, False):
        compare_overlap_on_off(
            initial_state,
            batches,
            "bf16 GradScaler",
            use_pure_bf16=True,
            use_main_grad=use_main_grad,
            use_scaler=True,
        )


def test_stage1_bf16():
    device = os.environ.get("PADDLE_OVERLAY_TEST_DEVICE", "gpu")
    paddle.set_device(device)
    if not paddle.amp.is_bfloat16_supported():
        raise RuntimeError(
            f"bf16 is not supported on {paddle.get_device()}; the driver "
            "should have skipped this test"
        )
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {
        "dp_degree": 1,
        "mp_degree": 1,
        "pp_degree": 1,
        "sharding_degree": SHARDING_DEGREE,
    }
    fleet.init(is_collective=True, strategy=strategy)
    rank = paddle.distributed.get_rank()
    initial_state = bf16_representable_state()
    batches = make_batches(rank)

    for acc_steps in (1, 2):  # without and with gradient accumulation
        compare_bf16_o1_vs_o2(initial_state, batches, acc_steps)
    for acc_steps in (1, 2):
        compare_bf16_broadcast_overlap(initial_state, batches, acc_steps)
    compare_bf16_grad_scaler_overlap(initial_state, batches)
    logging.info(f"-- rank {rank}: all stage-1 bf16 comparisons passed")


if __name__ == "__main__":
    test_stage1_bf16()
    sys.exit(0)
