# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script (2 ranks): sharding stage 1 V2 (``split_param``, comm buffers of ``cases.V2_BUFFER_MB`` MB: several per
model) with the parameter all-gather overlapped with the next forward (``opt._set_all_gather_overlap_forward( True,
model)``, as PaddleFormers calls it) against V2 without overlap: each case is :func:`compare` (``cases.compare_on_off``)
unless it says otherwise. The cases whose reads between steps wait for every gather assert the product's lost-overlap
warning; the others must not see it.

Env ``ALLGATHER_OVERLAP_IMPL``: ``product`` (default; the overlay or a patched Paddle provides the owner, checked) or
``upstream`` (Paddle's own, the overlay not applied, checked: only ``tools/v2_upstream_faults.py`` runs it).
``BROADCAST_OVERLAP_CASES``, ``..._EXPECTED_FAILURES``: see ``cases.run_cases``."""

import functools
import os
import sys
import zlib

import sharding_cases as cases

import paddle
import paddle.nn.functional as F
from paddle import nn

IMPL = os.environ.get("ALLGATHER_OVERLAP_IMPL", "product")

# Paddle's notices for what these cases do on purpose (see run_cases):
NOTICES = (
    # bf16 weights trained by SGD without multi_precision (no CPU bf16 AdamW)
    r"^Accumulating with FP16/BF16 in optimizer",
    # paddle.jit.to_static (PIR) reads .place (Value on 3.2, Tensor on 3.3)
    r"^(Tensor|Value) do not have 'place' interface for pir graph mode",
)
VOCAB, HIDDEN = 64, 256
STEPS = 3


# ----------------------------------------------------------------------
# models
class CollectiveBlock(cases.Block):
    """Runs its own collective (MoE-like: an all-reduce over another group object) between its matmuls."""

    group = None

    def forward(self, x):
        h = F.gelu(self.up(self.norm(x)))
        routed = h.detach().clone()
        paddle.distributed.all_reduce(routed, group=CollectiveBlock.group)
        return x + self.down(h + 0.5 * routed)


class LM(cases.TinyLM):
    """TinyLM of 3 blocks at this size (about 3.2 MB of fp32: 4 buffers); ``tied``: the head reads the embedding's weight;
    ``adapter``: a layer the optimizer does not hold (frozen adapter, teacher, ...) after the embedding; ``collective``:
    block 1 is a CollectiveBlock."""

    def __init__(self, tied=False, adapter=False, collective=False):
        super().__init__(num_blocks=3, vocab=VOCAB, hidden=HIDDEN)
        if tied:
            del self.head
        if adapter:
            self.adapter = nn.Linear(HIDDEN, HIDDEN)
        if collective:
            self.blocks[1] = CollectiveBlock(HIDDEN)

    def embedded(self, tokens):
        x = self.embed(tokens)
        return x + self.adapter(x) if "adapter" in self._sub_layers else x

    def logits(self, x):
        if "head" in self._sub_layers:
            return self.head(x)
        return paddle.matmul(x, self.embed.weight, transpose_y=True)


class RootParamLM(LM):
    """A positional table of the root layer, read before any sublayer."""

    def __init__(self):
        super().__init__()
        self.pos_table = self.create_parameter([cases.SEQ, HIDDEN])
        self.register_buffer("pos_onehot", paddle.eye(cases.SEQ))

    def embedded(self, tokens):
        pos = paddle.matmul(self.pos_onehot, self.pos_table)  # root's read
        return self.embed(tokens) + pos


class Tables(nn.Layer):
    """One layer owning 6 tables of 1 MB: its parameters span 6 buffers."""

    def __init__(self, n=6):
        super().__init__()
        for i in range(n):
            self.add_parameter(f"table_{i}", self.create_parameter([1024, HIDDEN]))

    def forward(self, tokens):
        return sum(F.embedding(tokens, t) for t in self.parameters())


class EncodeLM(LM):
    """``encode()`` (retrieval-style) calls a sublayer outside ``forward``; its parameters fill buffers 0 to 5, of equal
    sizes (ranks gathering them in different orders mix data instead of aborting gloo)."""

    def __init__(self):
        nn.Layer.__init__(self)
        self.encoder = Tables()  # first in parameters()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.LayerList([cases.Block(HIDDEN) for _ in range(3)])
        self.head = nn.Linear(HIDDEN, VOCAB)

    def encode(self, tokens):
        return self.encoder(tokens).mean(axis=1)


class BF16Linear(nn.Linear):
    """Linear with bfloat16 weight and bias, computing in fp32 (the CPU has no bfloat16 matmul)."""

    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out)
        self.to(dtype="bfloat16")

    def forward(self, x):
        return F.linear(x, self.weight.astype("float32"), self.bias.astype("float32"))


class MixedLM(LM):
    """fp32 embedding, norms and head beside bfloat16 linears: Paddle 3.x sorts each buffer group by dtype name, so the
    fp32 embedding, used first, lands in a later buffer."""

    def __init__(self):
        super().__init__()
        for block in self.blocks:
            block.up = BF16Linear(HIDDEN, 2 * HIDDEN)
            block.down = BF16Linear(2 * HIDDEN, HIDDEN)


# ----------------------------------------------------------------------
# set-up, the on/off comparison
def init_fleet():
    """fleet.init of V2, the collective blocks' group, the implementation the launch asked for checked."""
    cases.init_fleet(split_param=True, buffer_mb=cases.V2_BUFFER_MB)
    world = paddle.distributed.get_world_size()
    CollectiveBlock.group = paddle.distributed.new_group(list(range(world)))
    if IMPL == "upstream":
        overlay = sys.modules.get("paddle_overlay")
        assert overlay is None or not overlay.is_applied(), (
            "ALLGATHER_OVERLAP_IMPL=upstream but paddle_overlay is applied " "(set PADDLE_OVERLAY=0)"
        )
    print(f"allgather overlap: Paddle {paddle.__version__}, impl {IMPL}, {world} ranks")


def buffers(opt):
    """[[parameter, ...] per comm buffer], in Paddle's buffer order (never changed by the overlap)."""
    return [list(b._params) for b in cases.sharding_optimizer(opt)._comm_buffer_list]


def buffer_of(opt):
    """{parameter name: index of its comm buffer}."""
    return {p.name: i for i, ps in enumerate(buffers(opt)) for p in ps}


def final_forward(run):
    """One more forward before the final read (every implementation syncs what a forward uses; reads right after step() are
    the cases')."""
    with paddle.no_grad():
        run.model(cases.batch(99)[0])


def train(cls=LM, overlap=False, *, raw_layers=False, parameters=None, optimizer=cases.adamw, **kwargs):
    """``cases.train`` of V2 (``parameters``, ``optimizer``: the :class:`cases.Build`'s), the overlap on as PaddleFormers
    turns it on (the product's owner checked); ``raw_layers``: ``layers`` is the user's layer, not fleet's wrapper of
    it."""

    def on(run):
        run.opt._set_all_gather_overlap_forward(True, run.raw if raw_layers else run.model)
        assert IMPL != "product" or cases.overlap_impl(run.opt) is not None, (
            "the product is not applied to V2: _set_all_gather_overlap_forward left no overlap owner (Paddle's own "
            "method ran)"
        )

    build = cases.Build(cls, parameters=parameters, optimizer=optimizer)
    build.around = cases.sharding_v2
    return cases.train(build, overlap, enable=on, final=final_forward, **{"steps": STEPS, **kwargs})


def compare(cls=LM, lost=None, waits=(), **kwargs):
    """``cases.compare_on_off`` of :func:`train` (every rank's final parameters equal), >= 3 comm buffers, some all-gather
    seen; returns ``(checker, on)``. ``lost``: the path of the reads that took the product's overlap away on this rank
    (None: none; never a warning in these short runs); ``waits``: the product's wait counters (``stats``) that must be >
    0."""
    with cases.lost_overlap_warnings() as said:
        checker, on = cases.compare_on_off(
            cls, train=train, replicas="world", started_in_step=IMPL == "product", **kwargs
        )
    assert checker.counts["gathers"] > 0, "no all-gather of a parameter seen"
    cases.assert_v2(on.opt)
    for reason in waits if IMPL == "product" else ():
        stats = cases.overlap_impl(on.opt).stats
        assert stats[reason] > 0, (reason, dict(stats))
    if IMPL == "product" and lost is not None:
        cases.assert_overlap_lost(said, on.opt, lost)
    else:  # (Paddle's own overlap has no such warning)
        assert said == [], said
    return checker, on


def compile_forward(run):
    run.raw.forward = paddle.jit.to_static(run.raw.forward, full_graph=True)


def evaluate(run):
    tokens, labels = cases.batch(5)
    run.model.eval()
    with paddle.no_grad():
        loss = F.cross_entropy(run.model(tokens), labels).mean()
    run.model.train()
    return [loss.numpy()]


def not_held(raw):
    return [p for n, p in raw.named_parameters() if not n.startswith("adapter.")]


# cases that are one compare(**kwargs): name -> (what it proves, kwargs)
COMPARES = {
    "equal_on_off": ("Plain training: the baseline every implementation passes.", {}),
    "state_dict_right_after_step": (
        "Item 2: state_dict() right after step(), before any forward.",
        dict(after_step=lambda run: cases.snapshot(run.raw).values(), lost="iteration"),
    ),
    "layer_parameter_not_in_optimizer": (
        "Item 5: a layer of ``layers`` whose parameters the optimizer does not hold.",
        dict(cls=functools.partial(LM, adapter=True), parameters=not_held),
    ),
    "root_owned_parameter": (
        "Item 6: a parameter owned by the root layer, read before any sublayer runs; ``layers`` is the user's model.",
        dict(cls=RootParamLM, raw_layers=True),
    ),
    "root_owned_parameter_wrapped_layers": (
        "Item 6 with fleet's wrapper as ``layers`` (as PaddleFormers passes it): the model is a sublayer.",
        dict(cls=RootParamLM),
    ),
    "tied_embedding_head": ("Tied embedding and head.", dict(cls=functools.partial(LM, tied=True))),
    "eval_between_steps": ("An eval forward under no_grad between steps.", dict(after_step=evaluate)),
    "gradient_accumulation": ("Two micro-batches per step.", dict(acc_steps=2)),
    "to_static": (
        "The forward compiled by paddle.jit.to_static (AST, full_graph): its programs read the parameters without the "
        "sublayers' Python hooks: the program's call waits (the product's waited_in_program).",
        dict(prepare=compile_forward, waits=("waited_in_program",)),
    ),
    "forward_with_own_collective": (
        "A block all-reduces over another group object in its forward while all-gathers may be in flight: one "
        "collective order on every rank.",
        dict(cls=functools.partial(LM, collective=True)),
    ),
}


for _name, (_doc, _kwargs) in COMPARES.items():
    _case = globals()[f"case_{_name}"] = functools.partial(compare, **_kwargs)
    _case.__doc__ = _doc


# ----------------------------------------------------------------------
# cases: issue 17's items 2-6
def case_parameters_loop_ema_right_after_step():
    """Item 2: an EMA over parameters() right after step()."""
    ema = {}

    def update_ema(run):
        for i, p in enumerate(run.raw.parameters()):
            value = p.numpy().astype("float32")
            ema[i] = value if run.step == 0 else 0.9 * ema[i] + 0.1 * value
        return [ema[i].copy() for i in range(len(ema))]

    compare(LM, after_step=update_ema, lost="iteration")


def case_encode_helper_between_steps():
    """Item 3: a helper calls, between steps, a sublayer whose parameters span several buffers (Paddle's own overlap
    started the first one only); the call waits in its pre-hook (a forward: no lost-overlap warning)."""
    tokens, names = cases.batch(7)[0], []

    def encoder_names(run):  # before training: the check reads no parameter
        names[:] = [p.name for p in run.raw.encoder.parameters()]

    def encode(run):
        if run.step == 0:
            spans = {buffer_of(run.opt)[name] for name in names}
            assert spans == set(range(6)), spans
        return [run.raw.encode(tokens).numpy()]

    compare(EncodeLM, prepare=encoder_names, after_step=encode)


def case_freeze_parameters_after_first_step():
    """Item 4: after the first step the buffer holding the embedding (then frozen-only) and one parameter of another buffer
    stop training."""

    def freeze(run):
        if run.step == 0:
            groups = buffers(run.opt)
            first = buffer_of(run.opt)[run.raw.embed.weight.name]
            for p in groups[first]:
                p.stop_gradient = True
            groups[(first + 1) % len(groups)][0].stop_gradient = True

    compare(LM, after_step=freeze)


def case_hooks_constant_and_removed():
    """Item 6: the hook count is constant over steps, and ``_set_all_gather_overlap_forward(False, model)`` removes every
    hook; one more step is then bitwise equal to overlap off's."""
    counts = []

    def count(run):
        counts.append(cases.total_forward_pre_hooks(run.raw))

    base = cases.total_forward_pre_hooks(LM())
    off = train(LM, steps=6)
    on = train(LM, overlap=True, steps=6, after_step=count)
    assert len(set(counts)) == 1, f"hook count changed over steps: {counts}"
    assert counts[0] > base, f"no hook registered: {counts} vs {base}"
    on.opt._set_all_gather_overlap_forward(False, on.model)
    after = cases.total_forward_pre_hooks(on.raw)
    assert after == base, (
        f"_set_all_gather_overlap_forward(False) left {after - base} forward pre-hooks ({counts[0]} while on, {base} "
        "without)"
    )
    assert IMPL != "product" or cases.overlap_impl(on.opt) is None
    off2, on2 = (  # one more step without overlap
        cases.train(cases.Build.of(r.model, r.opt), first_step=50, steps=1) for r in (off, on)
    )
    cases.assert_bitwise_equal(
        (off.losses + off2.losses, off2.params), (on.losses + on2.losses, on2.params), "after False"
    )


# ----------------------------------------------------------------------
# cases: order, layout, dtypes
def case_gather_order_follows_forward():
    """Item 1: after each step the buffers are all-gathered in the order forward first uses them, the same on every rank.
    MixedLM: bfloat16 linears beside fp32 embedding, norms and head, two dtypes of buffers (the CPU has no float16
    matmul or optimizer kernels; bfloat16 has an SGD kernel); on 3.x not in Paddle's buffer order."""
    first_use = []

    def record_first_use(run):
        where = buffer_of(run.opt)

        def hook(layer, _inputs):
            for p in layer.parameters(include_sublayers=False):
                if p.name in where and where[p.name] not in first_use:
                    first_use.append(where[p.name])

        handles = [layer.register_forward_pre_hook(hook) for layer in run.raw.sublayers(include_self=True)]
        run.raw(cases.batch(0)[0])
        for h in handles:
            h.remove()

    checker, on = compare(MixedLM, optimizer=cases.sgd, prepare=record_first_use)
    where = buffer_of(on.opt)
    launched = [min(where[p.name] for p in t.params) for t in checker.gather_log]
    same_on_ranks = cases.equal_in_group([len(launched), zlib.crc32(repr(launched).encode())])
    n = len(first_use)
    # one gather per buffer per step (the last step's may be cut short by the final forward): check each full step
    per_step = [launched[i : i + n] for i in range(0, n * STEPS, n)]
    for i, order in enumerate(per_step):
        assert order == first_use, (
            f"step {i}: all-gathers launched in buffer order {order}, forward first uses {first_use} (Paddle's buffer "
            f"order {list(range(len(buffers(on.opt))))})"
        )
    assert same_on_ranks, "ranks launched different orders"
    dtypes = {str(ps[0].dtype) for ps in buffers(on.opt)}
    assert len(dtypes) == 2, dtypes


def case_layer_spanning_two_buffers():
    """A Linear whose weight and bias lie in two buffers, read by a helper (F.linear of its weight and bias) right after
    each step."""
    probe = paddle.ones([1, 2 * HIDDEN])
    linears = []

    def find_linears(run):  # names before training: no read between steps
        linears[:] = [
            (layer, layer.weight.name, layer.bias.name) for layer in run.raw.sublayers() if isinstance(layer, nn.Linear)
        ]

    def read_split_layer(run):
        where = buffer_of(run.opt)
        split = [lin for lin, w, b in linears if where[w] != where[b]]
        assert split, "no Linear spans two buffers in this layout"
        layer = split[-1]  # two buffers of its 4 read: not a lost overlap
        return [F.linear(probe[:, : layer.weight.shape[0]], layer.weight, layer.bias).numpy()]

    compare(LM, prepare=find_linears, after_step=read_split_layer)


def case_color_groups():
    """``param.color`` groups (Paddle 3.x builds each colour's buffers apart, on the colour's group, as MoE experts do; 2.6
    ignores it)."""
    group = paddle.distributed.new_group(list(range(paddle.distributed.get_world_size())))

    def colored(raw):
        for p in raw.blocks[1].parameters():
            p.color = {"color": "experts", "group": group}
        for p in raw.head.parameters():
            p.color = 1
        return raw.parameters()

    compare(LM, parameters=colored)


# ----------------------------------------------------------------------
# cases: checkpoints, the schedule, arguments
def save_and_reload(run):
    """after_step: paddle.save(state_dict()) right after step(), loaded into a fresh model (rank 0 alone saving: the
    schedule script)."""
    fresh = LM()
    fresh.set_state_dict(cases.reloaded(run.raw.state_dict()))
    return list(cases.snapshot(fresh).values())


def case_save_right_after_step_and_reload():
    """paddle.save(model.state_dict()) right after step(), with no synchronize, and reload into a fresh model: equal to
    overlap off."""
    compare(LM, after_step=save_and_reload, lost="iteration")


def rebuild_after_step(clear, launched_current):
    """An ``after_step`` of Paddle's own rebuild test (``hybrid_parallel_sharding_model_rebuild.py``): after each step V2's
    comm buffers are built again (``clear``: first the slice parameters' and the buffers' parameter storage freed, as
    that test does), with this script's buffer size (and, on the CPU, the shim's items 8 and 9). Appends to
    ``launched_current`` whether the step's units gathered the current buffers' storage (overlap on, product)."""

    def after_step(run):
        inner = cases.sharding_optimizer(run.opt)
        impl = cases.overlap_impl(run.opt) if IMPL == "product" else None
        if impl is not None:
            storages = {id(b.param_storage) for b in inner._comm_buffer_list}
            launched_current.append({id(u.tensor) for u in impl.units} == storages)
        if clear:
            for param in inner._slice_params.values():
                param._clear_to_zero_allocation()
            inner._slice_params = {}
            for buffer in inner._comm_buffer_list:
                buffer.param_storage._clear_to_zero_allocation()
        with cases.sharding_v2(cases.V2_BUFFER_MB):
            run.opt.rebuild()

    return after_step


def case_rebuild_between_steps():
    """V2's ``rebuild()`` after every step, without and with the storage freed first: the all-gathers pending from the step
    are waited before the rebuild reads the parameters (``waited_on_demand``: every unit of every step) and each launch
    gathers the buffers of the latest rebuild (the plan follows them), equal to overlap off. Paddle 2.6's V2 has no
    ``rebuild``: asserted there."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import dygraph_sharding_optimizer as dso

    if not hasattr(dso.DygraphShardingOptimizerV2, "rebuild"):
        assert cases.PADDLE_2, paddle.__version__
        return
    for clear in (False, True):
        launched_current = []
        _, on = compare(after_step=rebuild_after_step(clear, launched_current))
        if IMPL == "product":
            stats = cases.overlap_impl(on.opt).stats
            assert stats["waited_on_demand"] == stats["launched"], stats
            assert launched_current == [True] * STEPS, launched_current


def case_bad_arguments_refused_before_any_change():
    """Product only: a bad ``layers`` or ``strict`` passed to fleet's optimizer raises naming it and leaves no hook and no
    owner behind (the flag's type, the removed ``max_in_flight`` and the delegation to V2:
    test/unit/test_hybrid_overlap_delegation.py)."""
    run = train(LM, steps=0)
    base = cases.total_forward_pre_hooks(run.raw)
    method = "_set_all_gather_overlap_forward"
    bad = [
        ((True, None), {}, ValueError, f"{method}(True, model)"),
        ((True, "model"), {}, TypeError, "paddle.nn.Layer"),
        ((True, LM()), {}, ValueError, "owns none"),
        ((True, run.model), {"strict": 1}, TypeError, "strict"),
    ]
    for args, kwargs, error, text in bad:
        with cases.raises(error, text):
            run.opt._set_all_gather_overlap_forward(*args, **kwargs)
        assert cases.total_forward_pre_hooks(run.raw) == base, (args, kwargs)
        assert cases.overlap_impl(run.opt) is None, (args, kwargs)
    run.opt._set_all_gather_overlap_forward(False, run.model)  # no-op: off
    assert cases.overlap_impl(run.opt) is None


if __name__ == "__main__":
    # the product must not warn; Paddle's own overlap may
    allowed = NOTICES if IMPL == "product" else (".",)
    sys.exit(cases.run_cases(cases.cases_of(globals()), init_fleet, allowed))
