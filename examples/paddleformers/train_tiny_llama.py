# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Train a tiny random LLaMA with the PaddleFormers Trainer (one rank of a launch).

Nothing here names paddle_overlay: with ``PADDLE_OVERLAY=1`` in the environment the
installed start-up hook applies it when Paddle is imported, and PaddleFormers'
own ``--stage1_broadcast_overlap true`` (sharding stage 1 V1, ``--split_param
false``) calls ``optimizer._set_broadcast_overlap``, ``--stage1_allgather_overlap
true`` (V2, ``--split_param true``) ``optimizer._set_all_gather_overlap_forward``.
The model config is built in code (no hub download) and the data are random
tokens from a fixed seed.

Arguments are PaddleFormers ``TrainingArguments`` (``--output_dir``, ``--sharding``,
``--max_steps``, ``--resume_from_checkpoint``, ...) plus the model's size
(:class:`ModelArguments`). When it ends, rank 0 writes
``<output_dir>/result.npz``: every parameter of the model (``param/<name>``), the
loss of every optimizer step this run made (``losses``, float32, in step order),
``applied`` (1 if paddle_overlay was applied in this process, else 0) and, when it
was, what the overlay's overlap did (``overlap_order``: how many parameters are
in the agreed order, 0 if overlap is off; ``overlap_hooks``: forward pre-hooks it
holds; ``overlap_units``: collectives per step and ``overlap_all_gather``: 1 if
they are V2 all-gathers of comm buffers, 0 for V1 broadcasts); ``comm_buffers``:
V2's comm buffers (0 for V1). These read-outs are the only place paddle_overlay is
named, and only when the start-up hook already imported it.

V2 on CPU ranks (``--split_param true --device cpu``): Paddle's V2 builds its comm
buffers only for a GPU/NPU/XPU and reduces with ``reduce_scatter``, which gloo
lacks, so this script then uses the project's TEST-ONLY CPU shim
(``tools/collective/hybrid_parallel_cpu_shim.py``, imported by name: ``run.sh``
puts ``tools/collective`` on the ranks' ``PYTHONPATH``; ``install()`` before
``fleet.init``, ``cpu_sharding_v2()`` around the Trainer's model/optimizer
wrapping; both no-ops on GPU ranks). V1 runs without it. See README.md.
"""

import dataclasses
import sys

import numpy as np
import paddle
from paddleformers.trainer import PdArgumentParser, Trainer, TrainingArguments
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 256  # tokens
SEQ_LEN = 32  # tokens per sample
SAMPLES = 64  # in the data set


class RandomTokens(paddle.io.Dataset):
    """``SAMPLES`` fixed random sequences; labels are the inputs (causal LM)."""

    def __init__(self, seed=1234):
        self.tokens = np.random.RandomState(seed).randint(3, VOCAB, size=(SAMPLES, SEQ_LEN)).astype("int64")

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


@dataclasses.dataclass
class ModelArguments:
    """The tiny LLaMA's size (defaults: 2 layers, hidden 64, 21 parameters)."""

    hidden_size: int = dataclasses.field(default=64, metadata={"help": "hidden size"})
    intermediate_size: int = dataclasses.field(default=128, metadata={"help": "MLP size"})
    num_hidden_layers: int = dataclasses.field(default=2, metadata={"help": "decoder layers"})


class LossRecordingTrainer(Trainer):
    """The Trainer, keeping each micro-batch loss (reads the loss tensor only, no parameter)."""

    losses = []
    cpu_shim = None  # hybrid_parallel_cpu_shim, for V2 on CPU ranks (see the top)

    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.losses.append(float(loss))
        return loss

    def _wrap_model(self, *args, **kwargs):
        # fleet.distributed_model / distributed_optimizer run in here: V2 builds its comm buffers
        if self.cpu_shim is None:
            return super()._wrap_model(*args, **kwargs)
        with self.cpu_shim.cpu_sharding_v2():
            return super()._wrap_model(*args, **kwargs)


def tiny_llama_config(size):
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
        fuse_rms_norm=False,  # fused_rms_norm_ext has no CPU kernel in Paddle 3.3.1
    )


def v2_on_cpu(argv):
    """Whether the arguments ask for sharding stage 1 V2 on the CPU (PaddleFormers'
    ``split_param`` defaults to true; read before the parser, which runs ``fleet.init``)."""
    values = {}
    for i, a in enumerate(argv):
        for key in ("--split_param", "--device"):
            if a == key and i + 1 < len(argv):
                values[key] = argv[i + 1]
            elif a.startswith(key + "="):
                values[key] = a.split("=", 1)[1]
    split = values.get("--split_param", "true").lower() in ("true", "1", "yes", "y", "t")
    return split and values.get("--device", "gpu").lower() == "cpu"


def load_cpu_shim():
    """The project's test-only CPU shim (``tools/collective``), installed (before ``fleet.init``)."""
    import hybrid_parallel_cpu_shim

    hybrid_parallel_cpu_shim.install()
    return hybrid_parallel_cpu_shim


def main():
    if v2_on_cpu(sys.argv[1:]):
        LossRecordingTrainer.cpu_shim = load_cpu_shim()
    size, args = PdArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    paddle.seed(args.seed)
    model = LlamaForCausalLM(tiny_llama_config(size))
    trainer = LossRecordingTrainer(model=model, args=args, train_dataset=RandomTokens())
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    state = trainer.model.state_dict()  # waits for any pending broadcast or all-gather under the overlay
    if paddle.distributed.get_rank() == 0:
        np.savez(
            f"{args.output_dir}/result.npz",
            losses=np.array(trainer.losses, dtype="float32"),
            comm_buffers=np.array(comm_buffers(trainer.optimizer)),
            **overlay_report(trainer.optimizer),
            **{f"param/{name}": t.numpy() for name, t in state.items()},
        )


def comm_buffers(optimizer):
    """How many comm buffers V2 holds (0: not V2)."""
    seen = 0
    while optimizer is not None and seen < 8:
        if type(optimizer).__name__ == "DygraphShardingOptimizerV2":
            return len(optimizer._comm_buffer_list)
        optimizer, seen = vars(optimizer).get("_inner_opt"), seen + 1
    return 0


def overlay_report(optimizer):
    """applied / overlap_order / overlap_hooks / overlap_units / overlap_all_gather /
    (ints) as described at the top."""
    zero = np.array(0)
    overlay = sys.modules.get("paddle_overlay")
    if overlay is None or not overlay.is_applied():
        return {
            "applied": zero, "overlap_order": zero, "overlap_hooks": zero,
            "overlap_units": zero, "overlap_all_gather": zero,
        }
    from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
        get_param_sync_overlap,
    )

    owner = get_param_sync_overlap(optimizer)
    order = (owner.order or []) if owner is not None else []
    hooks = owner.num_hooks if owner is not None else 0
    units = owner.units if owner is not None else []
    return {
        "applied": np.array(1),
        "overlap_order": np.array(len(order)),
        "overlap_hooks": np.array(hooks),
        "overlap_units": np.array(len(units)),
        "overlap_all_gather": np.array(int(bool(units) and all(u.kind == "all_gather" for u in units))),
    }


if __name__ == "__main__":
    main()
