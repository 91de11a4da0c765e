# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Train a tiny random LLaMA with the PaddleFormers Trainer (one rank of a launch).

Nothing here names paddle_overlay: with ``PADDLE_OVERLAY=1`` in the environment the
installed start-up hook applies it when Paddle is imported, and PaddleFormers'
own ``--stage1_broadcast_overlap true`` calls ``optimizer._set_broadcast_overlap``.
The model config is built in code (no hub download) and the data are random
tokens from a fixed seed.

Arguments are PaddleFormers ``TrainingArguments`` (``--output_dir``, ``--sharding``,
``--max_steps``, ``--resume_from_checkpoint``, ...). When it ends, rank 0 writes
``<output_dir>/result.npz``: every parameter of the model (``param/<name>``), the
loss of every optimizer step this run made (``losses``, float32, in step order),
``applied`` (1 if paddle_overlay was applied in this process, else 0) and, when it
was, what the overlay's broadcast overlap did (``overlap_order``: how many
parameters are in the agreed broadcast order, 0 if overlap is off; ``overlap_hooks``:
forward pre-hooks it holds). These read-outs are the only place paddle_overlay is
named, and only when the start-up hook already imported it.
"""

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


class LossRecordingTrainer(Trainer):
    """The Trainer, keeping each micro-batch loss (reads the loss tensor only, no parameter)."""

    losses = []

    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.losses.append(float(loss))
        return loss


def tiny_llama_config():
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
        fuse_rms_norm=False,  # fused_rms_norm_ext has no CPU kernel in Paddle 3.3.1
    )


def main():
    (args,) = PdArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    paddle.seed(args.seed)
    model = LlamaForCausalLM(tiny_llama_config())
    trainer = LossRecordingTrainer(model=model, args=args, train_dataset=RandomTokens())
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    state = trainer.model.state_dict()  # waits for any pending broadcast under the overlay
    if paddle.distributed.get_rank() == 0:
        np.savez(
            f"{args.output_dir}/result.npz",
            losses=np.array(trainer.losses, dtype="float32"),
            **overlay_report(trainer.optimizer),
            **{f"param/{name}": t.numpy() for name, t in state.items()},
        )


def overlay_report(optimizer):
    """applied / overlap_order / overlap_hooks (ints) as described at the top."""
    overlay = sys.modules.get("paddle_overlay")
    if overlay is None or not overlay.is_applied():
        return {"applied": np.array(0), "overlap_order": np.array(0), "overlap_hooks": np.array(0)}
    from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.broadcast_overlap import (
        get_broadcast_overlap,
    )

    owner = get_broadcast_overlap(optimizer)
    order = (owner.order or []) if owner is not None else []
    hooks = owner.num_hooks if owner is not None else 0
    return {"applied": np.array(1), "overlap_order": np.array(len(order)), "overlap_hooks": np.array(hooks)}


if __name__ == "__main__":
    main()
