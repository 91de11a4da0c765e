"""LLaMA-7B-shaped models built tiny, for the virtual clock.

Every dimension of LLaMA-7B divided by :data:`SCALE` (hidden 4096 -> 256, FFN 11008 -> 688, vocab
32000 -> 2000; 32 decoder layers of 9 parameters each, PaddleNLP's construction order and Paddle's
automatic names, from ``bench_common``), in float32. Each parameter carries its modelled size
(:func:`modelled_sizes`: its shape times :data:`SCALE` per dimension, in bf16), so a matrix's tiny bytes
are 1/:data:`BYTES_RATIO` of its modelled bytes: a bucket cap or comm buffer size of C modelled MB is
C / :data:`BYTES_RATIO` MB here (:func:`tiny_mb`). Each leaf layer is one forward segment of the clock
(:func:`segments`), timed by :func:`vclock.costs.llama_segments`.

Variants (:data:`VARIANTS`): ``llama7b``; ``head_first`` (the LM head an ``nn.Linear`` built before
everything else, so Paddle names it ``linear_0``); ``tied_head`` (the head multiplies by the embedding's
weight, as a tied LM head does); ``forward_collective`` (the forward all-reduces a token count over the
sharding group right after the embedding: a collective of its own, queued behind the step's syncs).
"""

import paddle
import paddle.nn as nn

import bench_common as bc

from . import costs

__all__ = ["SCALE", "BYTES_RATIO", "VARIANTS", "build", "modelled_sizes", "segments", "tiny_mb", "batch"]

SCALE = 16
BYTES_RATIO = SCALE * SCALE * 2 // 4  # a matrix: SCALE^2 more elements, 2 bytes (bf16) modelled vs 4 here
TINY = dict(hidden=costs.LLAMA7B.hidden // SCALE, ffn=costs.LLAMA7B.ffn // SCALE, heads=2,
            vocab=costs.LLAMA7B.vocab // SCALE)
VARIANTS = {
    "llama7b": "LLaMA-7B-shaped, PaddleNLP construction order",
    "head_first": "the LM head an nn.Linear built first (auto name linear_0)",
    "tied_head": "LM head tied to the embedding",
    "forward_collective": "forward all-reduces a token count over the sharding group",
}
SEQUENCE = 8  # tokens of the tiny forward (the modelled tokens are the clock's scenarios)


class TiedHead(nn.Layer):
    """The LM head of a tied model: logits from the embedding's weight (no parameter of its own)."""

    def __init__(self, embedding):
        super().__init__()
        self._embedding = [embedding]  # not a sublayer: the embedding stays where it is

    def forward(self, x):
        return paddle.matmul(x, self._embedding[0].weight, transpose_y=True)


class TiedLlama(bc.LlamaSmall):
    def __init__(self, **kw):
        super().__init__(**kw)
        del self.lm_head
        self.lm_head = TiedHead(self.embed_tokens)


class CountingLlama(bc.LlamaSmall):
    """All-reduces the number of tokens over ``group`` after the embedding (sync), as a model that
    normalises by the group's token count does."""

    def __init__(self, group, **kw):
        super().__init__(**kw)
        self._group = [group]

    def forward(self, ids):
        x = self.embed_tokens(ids)
        count = paddle.to_tensor([float(ids.size)], dtype="float32")
        paddle.distributed.all_reduce(count, group=self._group[0])
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x)) * (count / count)


def build(variant, layers=32, group=None):
    """A fresh model of ``variant`` (seed 1234, fresh automatic names); ``group``: the sharding group
    (``forward_collective`` only). ValueError: an unknown variant, or no group for
    ``forward_collective``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {sorted(VARIANTS)}")
    if variant == "forward_collective" and group is None:
        raise ValueError("forward_collective needs the sharding group")
    paddle.seed(1234)
    kw = dict(TINY, layers=layers)
    with paddle.utils.unique_name.guard():
        if variant == "tied_head":
            return TiedLlama(**kw)
        if variant == "forward_collective":
            return CountingLlama(group, **kw)
        return bc.LlamaSmall(head_first=variant == "head_first", **kw)


def batch(step):
    """The input ids of ``step``: int64 [1, SEQUENCE], the same for every mode and rank (made without
    reading a parameter: a read would wait for its sync)."""
    paddle.seed(10_000 + step)
    return paddle.randint(0, TINY["vocab"], [1, SEQUENCE])


def modelled_sizes(model):
    """{parameter: modelled bytes}: each dimension times :data:`SCALE`, 2 bytes an element."""
    sizes = {}
    for param in model.parameters():
        numel = 1
        for dim in param.shape:
            numel *= dim * SCALE
        sizes[param] = 2 * numel
    return sizes


def tiny_mb(modelled_mb):
    """The MB here of a size of ``modelled_mb`` modelled MB (a bucket cap, a comm buffer size)."""
    return modelled_mb / BYTES_RATIO


def segments(model, tokens, shape=costs.LLAMA7B):
    """[(layer, {tokens: ms}, parameters used)] of every leaf layer in forward order (the modelled
    forward of :func:`vclock.costs.llama_segments` at each of ``tokens``); the tied head uses the
    embedding's weight."""
    per = {t: costs.llama_segments(t, shape) for t in tokens}

    def of(layer, role, params=None):
        params = list(layer.parameters(include_sublayers=False)) if params is None else params
        return layer, {t: per[t][role] for t in tokens}, params

    out = [of(model.embed_tokens, "embed")]
    for layer in model.layers:
        out += [of(getattr(layer, role), role) for role in costs.DECODER_ROLES]
    out.append(of(model.norm, "norm"))
    head = model.lm_head
    out.append(of(head, "lm_head", [model.embed_tokens.weight] if isinstance(head, TiedHead) else None))
    return out
