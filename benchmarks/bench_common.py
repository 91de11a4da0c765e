"""Shared pieces of the CPU benchmarks (overhead.py, ordering.py).

Run under ``python -m paddle.distributed.launch --nproc_per_node 2``: fleet
with ``sharding_degree=2`` on gloo, models and the three ways to run the
post-update broadcast:

* ``off``      - Paddle's own blocking broadcast (no overlap);
* ``upstream`` - Paddle's built-in ``_set_broadcast_overlap`` (3.x only);
* ``ours``     - ``paddle_overlay.apply()`` then ``_set_broadcast_overlap``;
* ``off_applied`` - overlay applied but overlap not enabled (what applying
  costs a user who never turns it on).

Models are built inside ``paddle.utils.unique_name.guard()`` so each gets the
auto names a fresh training script would get (``linear_0`` ...), whatever was
built before it in the same process: upstream's order depends on them.
"""

import os

# One math thread per rank: two ranks on two cores, and less timing noise.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
import paddle.nn as nn  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from paddle.distributed import fleet  # noqa: E402

MODES = ("off", "upstream", "ours")


# --------------------------------------------------------------------------
# fleet
# --------------------------------------------------------------------------
_HCG = None


def init_fleet(sharding_degree=2):
    global _HCG
    if _HCG is None:
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {
            "dp_degree": 1,
            "mp_degree": 1,
            "pp_degree": 1,
            "sharding_degree": sharding_degree,
        }
        fleet.init(is_collective=True, strategy=strategy)
        _HCG = fleet.get_hybrid_communicate_group()
    return _HCG


def rank():
    return dist.get_rank()


def upstream_available():
    """Paddle's own DygraphShardingOptimizer has _set_broadcast_overlap
    (PR #63945, in Paddle 3.x; not in 2.6)."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        dygraph_sharding_optimizer as m,
    )

    import paddle_overlay

    was = paddle_overlay.is_applied()
    paddle_overlay.remove()
    try:
        return "_set_broadcast_overlap" in vars(m.DygraphShardingOptimizer)
    finally:
        if was:
            paddle_overlay.apply()


def set_mode(mode):
    """Patch or unpatch Paddle for ``mode`` (before building the optimizer,
    and before each of its steps when modes are interleaved; the overlay's
    remove() would refuse while "ours" has overlap on)."""
    from paddle_overlay import _patching

    _patching._swap_for_benchmark(patched=mode in ("ours", "off_applied"))


def make_optimizer(model, mode, lr=1e-3):
    """AdamW through fleet; overlap enabled for ``upstream``/``ours``."""
    set_mode(mode)
    opt = paddle.optimizer.AdamW(learning_rate=lr, parameters=model.parameters())
    opt = fleet.distributed_optimizer(opt)
    if mode in ("upstream", "ours"):
        import warnings

        with warnings.catch_warnings():
            # Upstream warns about manual synchronize on every enable.
            warnings.simplefilter("ignore")
            opt._set_broadcast_overlap(True, layers=model)
    return opt


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------
class DeepLinear(nn.Layer):
    """``depth`` small leaf layers in a row: the most hooks per FLOP."""

    def __init__(self, depth=96, width=32):
        super().__init__()
        self.layers = nn.LayerList([nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return x


class LlamaRMSNorm(nn.Layer):
    def __init__(self, hidden, eps=1e-6, name=None):
        super().__init__()
        attr = paddle.ParamAttr(name=name) if name else None
        self.weight = self.create_parameter(
            shape=[hidden], attr=attr, default_initializer=nn.initializer.Constant(1.0)
        )
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * paddle.rsqrt(var + self.eps) * self.weight


class LlamaLMHead(nn.Layer):
    def __init__(self, hidden, vocab, name=None):
        super().__init__()
        attr = paddle.ParamAttr(name=name) if name else None
        self.weight = self.create_parameter(shape=[hidden, vocab], attr=attr)

    def forward(self, x):
        return paddle.matmul(x, self.weight)


def _linear(i, o, name):
    attr = paddle.ParamAttr(name=name) if name else None
    return nn.Linear(i, o, weight_attr=attr, bias_attr=False)


class LlamaDecoderLayer(nn.Layer):
    """PaddleNLP's registration order: attention, MLP, then the two norms
    (so the norm used first is registered after the projections)."""

    def __init__(self, hidden, ffn, heads, prefix=None, sdpa=False):
        super().__init__()
        n = (lambda s: f"{prefix}.{s}.weight") if prefix else (lambda s: None)
        self.heads = heads
        self.sdpa = sdpa  # fused causal attention (GPU); else plain matmuls
        self.q_proj = _linear(hidden, hidden, n("self_attn.q_proj"))
        self.k_proj = _linear(hidden, hidden, n("self_attn.k_proj"))
        self.v_proj = _linear(hidden, hidden, n("self_attn.v_proj"))
        self.o_proj = _linear(hidden, hidden, n("self_attn.o_proj"))
        self.gate_proj = _linear(hidden, ffn, n("mlp.gate_proj"))
        self.up_proj = _linear(hidden, ffn, n("mlp.up_proj"))
        self.down_proj = _linear(ffn, hidden, n("mlp.down_proj"))
        self.input_layernorm = LlamaRMSNorm(hidden, name=n("input_layernorm"))
        self.post_attention_layernorm = LlamaRMSNorm(hidden, name=n("post_attention_layernorm"))

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        y = self.input_layernorm(x)
        q = self.q_proj(y).reshape([b, s, self.heads, d])
        k = self.k_proj(y).reshape([b, s, self.heads, d])
        v = self.v_proj(y).reshape([b, s, self.heads, d])
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).reshape([b, s, h])
        else:
            q, k, v = (t.transpose([0, 2, 1, 3]) for t in (q, k, v))
            att = paddle.matmul(q, k, transpose_y=True) / (d**0.5)
            mask = paddle.triu(paddle.full([s, s], float("-inf"), dtype=att.dtype), diagonal=1)
            att = F.softmax(att + mask, axis=-1)
            o = paddle.matmul(att, v).transpose([0, 2, 1, 3]).reshape([b, s, h])
        x = x + self.o_proj(o)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class LlamaSmall(nn.Layer):
    """LLaMA-shaped, PaddleNLP-like construction.

    ``head_first``: the head is an ``nn.Linear`` built before everything else
    (so Paddle names it ``linear_0`` and lists it first).  ``custom_names``:
    every parameter named through ``ParamAttr`` in checkpoint style.
    """

    def __init__(
        self, layers=4, hidden=64, ffn=172, heads=4, vocab=512, head_first=False, custom_names=False, sdpa=False
    ):
        super().__init__()
        self.head_first = head_first
        if head_first:
            self.lm_head = nn.Linear(hidden, vocab, bias_attr=False)
        emb_attr = paddle.ParamAttr(name="model.embed_tokens.weight") if custom_names else None
        self.embed_tokens = nn.Embedding(vocab, hidden, weight_attr=emb_attr)
        self.layers = nn.LayerList(
            [
                LlamaDecoderLayer(hidden, ffn, heads, prefix=f"model.layers.{i}" if custom_names else None, sdpa=sdpa)
                for i in range(layers)
            ]
        )
        self.norm = LlamaRMSNorm(hidden, name="model.norm.weight" if custom_names else None)
        if not head_first:
            self.lm_head = LlamaLMHead(hidden, vocab, name="lm_head.weight" if custom_names else None)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


MODEL_KINDS = {
    "deep96": "DeepLinear: 96 Linear(32, 32) leaf layers",
    "llama": "LLaMA-shaped small (4 layers, hidden 64, ffn 172, vocab 512), Paddle auto names",
    "llama_head_first": "same, lm_head an nn.Linear built first (auto name linear_0)",
    "llama_custom_names": "same, every parameter named with ParamAttr(name='model.layers.N....weight')",
}


def build(kind, **kw):
    """Build a model of ``kind`` with a fresh name scope and a fixed seed,
    plus a function that makes one batch: ``(inputs, loss_fn)``."""
    paddle.seed(1234)
    with paddle.utils.unique_name.guard():
        if kind == "deep96":
            model = DeepLinear(**kw)
            width = model.layers[0].weight.shape[0]

            def batch(step):
                paddle.seed(10_000 + step)
                return paddle.randn([16, width])

            loss_fn = lambda out: out.mean()  # noqa: E731
        elif kind.startswith("llama"):
            model = LlamaSmall(
                head_first=kind == "llama_head_first", custom_names=kind == "llama_custom_names", **kw
            )
            vocab = model.embed_tokens.weight.shape[0]

            def batch(step):
                paddle.seed(10_000 + step)
                return paddle.randint(0, vocab, [2, 32])

            loss_fn = lambda out: out.astype("float32").mean()  # noqa: E731
        else:
            raise ValueError(f"unknown model kind {kind!r}; one of {sorted(MODEL_KINDS)}")
    return model, batch, loss_fn


def train_step(model, opt, inputs, loss_fn):
    loss = loss_fn(model(inputs))
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss
