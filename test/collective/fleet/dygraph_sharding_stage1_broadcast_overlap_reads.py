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
"""Per-rank script: parameter reads between step() and the next forward.

Each case reads parameters the way user code does outside ``model(...)``
(an ``encode()``-style helper calling ``sublayer.forward``, weight-norm
logging, a loop over ``model.parameters()``), with overlap on and off:
bitwise-equal results, and the wait checker (which checks at the read:
``F.linear``, ``paddle.linalg.norm``, ``Tensor.set_value``, ...) sees no
read of a parameter whose broadcast is pending. Two negative controls
remove the read guard and the forward pre-hooks and must show violations.
A helper that reads every parameter between steps takes the whole overlap
away from the next forward: the overlap says so once (its lost-overlap
warning, asserted where the case reads everything). Cases are chosen with
env ``BROADCAST_OVERLAP_CASES``.
"""

import sys

import numpy as np
from broadcast_overlap_checker import BroadcastWaitChecker
from broadcast_overlap_training import (
    HIDDEN,
    TinyLM,
    assert_bitwise_equal,
    assert_lost_overlap_warning,
    cases_of,
    compare_on_off,
    lost_overlap_warnings,
    overlap_impl,
    read_guard_module,
    run_cases,
    train,
)

import paddle


class OneLinear(paddle.nn.Layer):
    """A root with one ``nn.Linear(16, 8)`` named ``fc``; [B, S] int64
    tokens (read as floats) -> [B, S, 32] logits through a fixed tile."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(HIDDEN, 8)

    def forward(self, tokens):
        x = paddle.nn.functional.one_hot(tokens % HIDDEN, HIDDEN)
        return paddle.tile(self.fc(x), [1, 1, 4])


PROBE = paddle.linspace(-1.0, 1.0, 2 * HIDDEN).reshape([2, HIDDEN])


def run_with_reads(read, strict=False, checker=None, steps=3):
    """Train OneLinear for ``steps``; after each step ``read(raw_model)``
    runs before the next forward. Returns ((losses, params), outputs of
    read, the run)."""
    run = train(
        OneLinear,
        overlap=checker is not None,
        strict=strict,
        checker=checker,
        after_step=lambda _step, run: [read(run.model._layers)],
        steps=steps,
    )
    return run[:2], run.extras, run


def compare_reads(read, strict=False):
    """``compare_on_off`` with ``read`` between steps (its outputs
    bitwise equal too); the reads were checked."""
    checker, on = compare_on_off(
        OneLinear,
        strict=strict,
        steps=3,
        after_step=lambda _step, run: [read(run.model._layers)],
    )
    assert len(on.extras) == 3, len(on.extras)
    assert checker.counts["checked"] > 0, checker.counts
    return checker, overlap_impl(on.opt)


def encode(raw):
    """An encode()/generate()-style helper: a direct sublayer forward."""
    with paddle.no_grad():
        return raw.fc.forward(PROBE).numpy()


def weight_norm(raw):
    return paddle.linalg.norm(raw.fc.weight).numpy()


def ema_over_parameters(read_check=None):
    """A reader: an EMA update over model.parameters(), keyed by position;
    ``read_check(params)`` runs before each parameter is read."""
    ema = {}

    def read(raw):
        out = []
        for i, p in enumerate(raw.parameters()):
            if read_check is not None:
                read_check([p])
            prev = ema.get(i)
            value = p.numpy()
            ema[i] = value if prev is None else 0.9 * prev + 0.1 * value
            out.append(ema[i].ravel())
        return np.concatenate(out)

    return read


def case_helper_forward_outside_model_call():
    for strict in (False, True):
        with lost_overlap_warnings() as lost:
            _, impl = compare_reads(encode, strict=strict)
        # each helper read found fc's broadcasts pending and waited them
        assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)
        # fc.forward reads the model's only two parameters: both of the
        # step's broadcasts waited by reads before the next forward, said
        # once
        assert_lost_overlap_warning(lost, "attribute", launched=2, read=2)


def case_weight_norm_logging_between_steps():
    # the norm reads one of the two parameters: half of the step's
    # broadcasts waited by a read is not a lost overlap (run_cases fails the
    # case on any warning)
    _, impl = compare_reads(weight_norm)
    assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def case_parameters_loop_between_steps():
    off, off_out, _ = run_with_reads(ema_over_parameters())
    with BroadcastWaitChecker() as checker, lost_overlap_warnings() as lost:
        on, on_out, info = run_with_reads(
            ema_over_parameters(
                lambda ps: checker.check(ps, "read:parameters")
            ),
            checker=checker,
        )
    # the loop reads every parameter between steps: said once
    assert_lost_overlap_warning(lost, "iteration", launched=2, read=2)
    assert_bitwise_equal(off, on, "parameters() loop")
    for a, b in zip(off_out, on_out):
        assert a.tobytes() == b.tobytes()
    impl = overlap_impl(info["opt"])
    assert impl.read_paths["iteration"] > 0, dict(impl.read_paths)
    # each tensor parameters() handed out was checked before p.numpy()
    assert checker.violations == [], checker.violations[:5]


def case_guard_removed_reads_are_caught():
    """Negative control: without the read guard the checker must report
    the helper's reads of parameters with a pending broadcast."""
    guarded = read_guard_module().GuardedParameters
    from collections import OrderedDict

    saved = (guarded.__getitem__, guarded.get)
    guarded.__getitem__ = OrderedDict.__getitem__
    guarded.get = OrderedDict.get
    try:
        with BroadcastWaitChecker() as checker:
            run_with_reads(encode, checker=checker)
    finally:
        guarded.__getitem__, guarded.get = saved
    reads = [v for v in checker.violations if v[0] == "read:linear"]
    assert len(reads) >= 2 * 3, checker.violations  # weight + bias, 3 steps


def case_held_reference_is_documented_limit():
    """A tensor taken before step() and read after it is not intercepted
    (documented; the fix is to read ``layer.weight`` again)."""
    held = {}

    def read(raw):
        if "w" not in held:
            held["w"] = raw.fc.weight  # taken now, read after later steps
            return held["w"].numpy()
        return paddle.linalg.norm(held["w"]).numpy()

    with BroadcastWaitChecker() as checker:
        run_with_reads(read, checker=checker)
    stale = [v for v in checker.violations if v[0] == "read:norm"]
    assert len(stale) == 2, checker.violations  # steps 2 and 3
    with BroadcastWaitChecker() as checker:
        run_with_reads(weight_norm, checker=checker)  # re-read: waited
    assert checker.violations == []


def case_checker_catches_missing_wait():
    """Negative control: with the overlap's pre-hooks removed, the checker
    must report violations (it would otherwise prove nothing)."""
    with BroadcastWaitChecker() as checker:

        def drop_hooks(step, model, opt):
            if step == 0:
                # every forward pre-hook but the checker's is the overlap's
                # (TinyLM and fleet's wrapper have none)
                removed = 0
                for layer in model.sublayers(include_self=True):
                    hooks = layer._forward_pre_hooks
                    for hook_id in list(hooks):
                        if not checker.owns_hook(layer, hook_id):
                            del hooks[hook_id]
                            removed += 1
                impl = overlap_impl(opt)
                assert removed == impl.num_hooks > 0, (removed, impl.num_hooks)

        train(
            TinyLM, overlap=True, steps=2, checker=checker, on_step=drop_hooks
        )
    assert checker.violations, "checker failed to see unwaited broadcasts"
    assert any(w.startswith("forward:") for w, _ in checker.violations)


if __name__ == "__main__":
    sys.exit(run_cases(cases_of(globals())))
