"""Modelled costs on H200, from the measured figures in ``benchmarks/data/`` (``README.md`` there gives
each file's source and date). Every number derived here is a model calibrated on measured H200 torch
stand-in figures, not a GPU run of Paddle.

* Collectives (:class:`CollectiveCosts`): NCCL broadcast time by message size on 2x H200 over NVLink
  (``h200_anchor.json``), interpolated linearly in bytes between the measured sizes (8 KiB to 1 GiB),
  extrapolated beyond 1 GiB at the last segment's bandwidth. No all-gather, reduce-scatter or reduce
  was measured: an all-gather or reduce-scatter of a B-byte buffer over N ranks is modelled as a
  broadcast of (N-1)/N * B bytes (the same bus bandwidth), an all-reduce as 2 (N-1)/N * B, a reduce
  as a broadcast of B. The 2-GPU curve is used at every degree (no 4- or 8-GPU run was measured).
  Back-to-back calls: each queued collective saves the launch latency fitted from one LLaMA-7B layer
  broadcast per parameter (9 calls) against the sum of its calls alone.
* Forward (:func:`llama_segments`): one LLaMA-7B decoder layer's measured forward time at 1024 and
  4096 tokens (``h200_anchor.json``), split into its leaf layers: norms, residual adds and SiLU*mul by
  the bytes they move at the measured device copy bandwidth, the rest among the GEMMs and attention by
  FLOPs (so the parts add up to the measured layer). The LM head runs at the layer's achieved FLOP
  rate, the embedding and the loss at the copy bandwidth.

Contention (the forward's and the transfers' slowdown while both run) is :mod:`vclock.contention`.
"""

import bisect
import json
import os

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
TOKENS = (1024, 4096)  # the measured micro-batch sizes (one sequence of S tokens)


def load(name):
    """The measured figures of ``benchmarks/data/<name>.json`` (a dict)."""
    with open(os.path.join(DATA, name + ".json")) as f:
        return json.load(f)


class LlamaShape:
    """LLaMA-7B's shapes (bf16): ``layers`` decoder layers of ``hidden`` / ``ffn`` / ``heads``, ``vocab``."""

    def __init__(self, layers=32, hidden=4096, ffn=11008, heads=32, vocab=32000, dtype_bytes=2):
        self.layers, self.hidden, self.ffn, self.heads = layers, hidden, ffn, heads
        self.vocab, self.dtype_bytes = vocab, dtype_bytes


LLAMA7B = LlamaShape()


class CollectiveCosts:
    """Modelled collective times (ms) from a measured broadcast curve; see the module docstring.

    ``curve``: {bytes: ms} of one broadcast; ``pipelined_ms``: latency a queued call saves."""

    def __init__(self, curve, pipelined_ms):
        points = sorted((int(b), float(ms)) for b, ms in curve.items())
        self._bytes = [b for b, _ in points]
        self._ms = [ms for _, ms in points]
        self.pipelined_ms = pipelined_ms

    @classmethod
    def from_anchor(cls, anchor=None, shape=LLAMA7B):
        """From ``h200_anchor.json`` (or the dict given): its curve, and the latency saved per queued
        call fitted from ``layer_bcast_ms_per_param`` (one layer's 9 broadcasts back to back)."""
        anchor = anchor if anchor is not None else load("h200_anchor")
        costs = cls(anchor["broadcast_ms_by_bytes"], 0.0)
        h, f, b = shape.hidden, shape.ffn, shape.dtype_bytes
        alone = 4 * costs.broadcast_ms(h * h * b) + 3 * costs.broadcast_ms(h * f * b) + 2 * costs.broadcast_ms(h * b)
        costs.pipelined_ms = max(0.0, (alone - anchor["layer_bcast_ms_per_param"]) / 8)
        return costs

    def broadcast_ms(self, nbytes):
        """One broadcast of ``nbytes`` alone, ms."""
        xs, ys = self._bytes, self._ms
        if nbytes <= xs[0]:
            return ys[0]
        i = min(bisect.bisect_left(xs, nbytes), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (nbytes - x0) * (y1 - y0) / (x1 - x0)

    def time_ms(self, op, nbytes, nranks):
        """One collective ``op`` (canonical name) of a ``nbytes`` message over ``nranks`` ranks, alone,
        ms (``nbytes``: the full buffer of an all-gather or reduce-scatter)."""
        share = (nranks - 1) / nranks if nranks > 1 else 0.0
        if op in ("all_gather", "reduce_scatter"):
            return self.broadcast_ms(share * nbytes)
        if op == "all_reduce":
            return self.broadcast_ms(2 * share * nbytes)
        return self.broadcast_ms(nbytes)


def _split(shape, tokens, layer_ms, copy_gbps):
    """{part: ms} of one decoder layer; the achieved FLOP rate (FLOP/ms)."""
    s, h, f, b = tokens, shape.hidden, shape.ffn, shape.dtype_bytes
    per_ms = copy_gbps * 1e6  # bytes per ms
    norm = 2 * s * h * b / per_ms  # read + write the activations
    residual = 3 * s * h * b / per_ms
    silu_mul = 3 * s * f * b / per_ms
    flops = {"proj": 2 * s * h * h, "mlp": 2 * s * h * f, "attention": 2 * s * s * h}  # causal: half of 4 s^2 h
    gemm_total = 4 * flops["proj"] + 3 * flops["mlp"] + flops["attention"]
    rate = gemm_total / (layer_ms - 2 * norm - 2 * residual - silu_mul)
    parts = {"norm": norm, "residual": residual, "silu_mul": silu_mul}
    parts.update({k: v / rate for k, v in flops.items()})
    return parts, rate


def llama_segments(tokens, shape=LLAMA7B, layer_ms=None, anchor=None):
    """Forward ms of each leaf layer of a LLaMA-7B-shaped model, each carrying the operations that run
    after it up to the next leaf layer: {role: ms} with roles ``embed``, ``input_layernorm``,
    ``q_proj``, ``k_proj``, ``v_proj`` (+ attention), ``o_proj`` (+ residual),
    ``post_attention_layernorm``, ``gate_proj``, ``up_proj`` (+ SiLU*mul), ``down_proj`` (+ residual),
    ``norm``, ``lm_head`` (+ loss). ``layer_ms``: one decoder layer's forward (default: measured at
    ``tokens``). ValueError: ``tokens`` not measured and no ``layer_ms``."""
    anchor = anchor if anchor is not None else load("h200_anchor")
    if layer_ms is None:
        if tokens not in TOKENS:
            raise ValueError(f"layer forward measured at {TOKENS} tokens only, got {tokens}")
        layer_ms = anchor[f"layer_fwd_ms_S{tokens}"]
    copy_gbps = anchor["d2d_copy_GBps"]
    parts, rate = _split(shape, tokens, layer_ms, copy_gbps)
    per_ms = copy_gbps * 1e6
    s, h, b = tokens, shape.hidden, shape.dtype_bytes
    return {
        "embed": 2 * s * h * b / per_ms,
        "input_layernorm": parts["norm"],
        "q_proj": parts["proj"],
        "k_proj": parts["proj"],
        "v_proj": parts["proj"] + parts["attention"],
        "o_proj": parts["proj"] + parts["residual"],
        "post_attention_layernorm": parts["norm"],
        "gate_proj": parts["mlp"],
        "up_proj": parts["mlp"] + parts["silu_mul"],
        "down_proj": parts["mlp"] + parts["residual"],
        "norm": parts["norm"],
        # logits GEMM; the loss reads the bf16 logits and writes fp32 (memory-bound)
        "lm_head": 2 * s * h * shape.vocab / rate + s * shape.vocab * (b + 4) / per_ms,
    }


DECODER_ROLES = ("input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm",
                 "gate_proj", "up_proj", "down_proj")
