# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank case (this project's catalogue only, not in the patch): the ``bf16`` case of
``dygraph_sharding_stage1_broadcast_overlap.py`` as far as a CPU allows. Paddle's ``auto_cast`` is a no-op there (it
warns): O1 trains the MLP in float32 through the same ``train_mlp``, overlap on vs off, with accumulation 1 and 2. O2,
``main_grad`` and ``GradScaler`` run on GPUs."""

import dygraph_sharding_stage1_broadcast_overlap as script
import numpy as np
import sharding_cases as cases

import paddle
import paddle.distributed as dist

AMP_NO_OP = "amp_guard can only be enabled on CUDAPlace"


def case_bf16_o1_runs_in_float32():
    """O1 on a CPU: one no-op warning per forward, no other warning (the runner fails the case on it), bitwise equal with
    optimizer state."""
    paddle.seed(2023)
    initial = script.copies(script.mlp().state_dict())
    rng = np.random.RandomState(2023 + dist.get_rank())
    batches = [rng.rand(script.MLP_BATCH, script.SIZE).astype("float32") for _ in range(4)]
    for acc in (1, 2):
        with cases.overlap_warnings(AMP_NO_OP) as amp:
            off = script.train_mlp(initial, batches, acc=acc)
            on = script.train_mlp(initial, batches, acc=acc, overlap=True)
        assert len(amp) == 2 * len(batches), len(amp)  # one per forward
        assert on["optimizer state"], "no optimizer state compared"
        script.assert_bitwise(off, on, f"O1 in float32, acc={acc}")
