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

import sys

from broadcast_overlap_checker import BroadcastWaitChecker
from broadcast_overlap_training import (
    STEPS,
    TinyLM,
    all_ranks_equal,
    batch,
    cases_of,
    compare_on_off,
    overlap_impl,
    per_parameter,
    run_cases,
    total_forward_pre_hooks,
    train,
)


def case_equal_acc1():
    checker, info = compare_on_off(acc_steps=1)
    # one async broadcast per trainable parameter (or bucket) after every update
    n_trainable = len(list(info["model"].parameters()))
    if not per_parameter(info["opt"]):
        n_trainable = len(overlap_impl(info["opt"])._units)
    assert checker.counts["launched"] == STEPS * n_trainable, checker.counts
    assert (
        checker.counts["waited"] == checker.counts["launched"]
    ), checker.counts
    # forward uses the parameters exactly in broadcast order
    stats = overlap_impl(info["opt"]).stats
    assert stats["waited_out_of_order"] == 0, stats
    assert stats["waited_in_forward"] == (STEPS - 1) * n_trainable, stats


def case_equal_acc2():
    compare_on_off(acc_steps=2)


def case_equal_minimize():
    compare_on_off(acc_steps=1, use_minimize=True)


def case_forward_order_recorded():
    """The agreed order is the forward first-use order, the same on every rank."""
    _, _, info = train(TinyLM, overlap=True, steps=1)
    opt, model = info["opt"], info["model"]
    impl = overlap_impl(opt)
    params = list(opt._inner_opt._origin_parameter_list)
    forward_names = []

    def record(layer, _inputs):
        forward_names.extend(
            p.name for p in layer.parameters(include_sublayers=False)
        )

    handles = [
        l.register_forward_pre_hook(record)
        for l in model.sublayers(include_self=True)
    ]
    model(batch(0)[0])
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
    assert all_ranks_equal(impl.order)


def case_hooks_constant_and_removed():
    counts = []

    def on_step(step, model, opt):
        counts.append(
            (total_forward_pre_hooks(model), overlap_impl(opt).num_hooks)
        )

    _, _, info = train(TinyLM, overlap=True, steps=10, on_step=on_step)
    assert len(counts) == 10 and len(set(counts)) == 1, counts
    model, opt = info["model"], info["opt"]
    _, _, plain = train(TinyLM, overlap=False, steps=1)
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

        train(
            TinyLM, overlap=True, steps=2, checker=checker, on_step=drop_hooks
        )
    assert checker.violations, "checker failed to see unwaited broadcasts"
    assert any(w.startswith("forward:") for w, _ in checker.violations)


if __name__ == "__main__":
    sys.exit(run_cases(cases_of(globals())))
