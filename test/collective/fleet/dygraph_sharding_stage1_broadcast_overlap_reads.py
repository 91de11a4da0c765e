# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: parameter reads between step() and the next forward, the way user code reads outside ``model(...)``,
overlap on vs off (the read outputs too), checked by the wait checker at the read (``F.linear``, ``paddle.linalg.norm``,
...); negative controls must show violations."""

import sys

import numpy as np
import sharding_cases as cases
from param_sync_checker import ParamSyncWaitChecker

import paddle

HIDDEN = cases.HIDDEN


class OneLinear(paddle.nn.Layer):
    """One ``nn.Linear(16, 8)`` named ``fc``: [B, S] int64 tokens (one-hot) -> [B, S, 32] logits through a fixed tile."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(HIDDEN, 8)

    def forward(self, tokens):
        x = paddle.nn.functional.one_hot(tokens % HIDDEN, HIDDEN)
        return paddle.tile(self.fc(x), [1, 1, 4])


PROBE = paddle.linspace(-1.0, 1.0, 2 * HIDDEN).reshape([2, HIDDEN])


def train_reading(read, build=OneLinear, overlap=False, **kwargs):
    """``train`` of 3 steps, ``read(raw model)`` after each (its outputs in ``run.extras``)."""
    return cases.train(build, overlap, steps=3, after_step=lambda run: [read(run.raw)], **kwargs)


def compare_reads(read=None, strict=False, reader=None):
    """``compare_on_off`` of ``train_reading`` (``reader(checker)`` makes each run's read, checker None when off); the
    reads were checked. Returns the overlap."""
    reader = reader or (lambda checker: read)

    def run(build, overlap, checker=None, **kwargs):
        return train_reading(reader(checker), build, overlap, checker=checker, **kwargs)

    checker, on = cases.compare_on_off(OneLinear, train=run, enable=cases.v1(strict=strict))
    assert len(on.extras) == 3, len(on.extras)
    assert checker.counts["checked"] > 0, checker.counts
    return cases.overlap_impl(on.opt)


def encode(raw):
    """An encode()/generate()-style helper: a direct sublayer forward."""
    with paddle.no_grad():
        return raw.fc.forward(PROBE).numpy()


def weight_norm(raw):
    return paddle.linalg.norm(raw.fc.weight).numpy()


def ema_over_parameters(checker=None):
    """A reader: an EMA over model.parameters(), keyed by position; with a ``checker``, each parameter is checked before it
    is read."""
    ema = {}

    def read(raw):
        for i, p in enumerate(raw.parameters()):
            if checker is not None:
                checker.check([p], "read:parameters")
            value = p.numpy()
            ema[i] = value if i not in ema else 0.9 * ema[i] + 0.1 * value
        return np.concatenate([ema[i].ravel() for i in sorted(ema)])

    return read


def case_helper_forward_outside_model_call():
    """A helper's sublayer forward between steps waits (strict or not); it reads both parameters, so each step's overlap is
    lost (no warning: too few steps)."""
    for strict in (False, True):
        with cases.lost_overlap_warnings() as lost:
            impl = compare_reads(encode, strict=strict)
        cases.assert_overlap_lost(lost, impl, "attribute")


def case_weight_norm_logging_between_steps():
    """A norm of one of the two parameters waits; half of the step's broadcasts is no lost overlap (run_named fails on any
    warning)."""
    impl = compare_reads(weight_norm)
    assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def case_parameters_loop_between_steps():
    """An EMA loop over parameters() between steps: each tensor checked before ``p.numpy()``, bitwise equal to off, each
    step's overlap lost."""
    with cases.lost_overlap_warnings() as lost:
        impl = compare_reads(reader=ema_over_parameters)
    cases.assert_overlap_lost(lost, impl, "iteration")


def case_guard_removed_reads_are_caught():
    """Negative control: without the read guard the checker must report the helper's reads of parameters with a pending
    broadcast."""
    with cases.read_guard_removed(), ParamSyncWaitChecker() as checker:
        train_reading(encode, OneLinear, True, checker=checker)
    reads = [v for v in checker.violations if v[0] == "read:linear"]
    assert len(reads) >= 2 * 3, checker.violations  # weight + bias, 3 steps


def case_checker_catches_a_sync_started_by_a_hook():
    """Negative control: a forward pre-hook that starts a broadcast of its layer's weight (what a depth-limited schedule
    does) is named by the checker's outside-step record, and compare_on_off fails on it."""

    def hook_starts_sync(run):
        if run.step == 0:
            layer = run.raw.blocks[0].up

            def start(_layer, _inputs):
                paddle.distributed.broadcast(layer.weight, src=0, sync_op=False).wait()

            layer.register_forward_pre_hook(start)

    with cases.raises(AssertionError, "syncs started outside step()"):
        cases.compare_on_off(after_step=hook_starts_sync)


if __name__ == "__main__":
    sys.exit(cases.run_cases(cases.cases_of(globals())))
