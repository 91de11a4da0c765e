# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: the parameter-sync overlap in hybrid topologies on 4 ranks, overlap off against on
(``cases.compare_on_off``).

Env ``BROADCAST_OVERLAP_TOPOLOGY`` (``fleet.init`` runs once per process): ``pp2_sharding2``
(``train_batch``/``eval_batch``, plain and with a tied embedding/head; with the pipeline's gradient-communication
overlap, ``*_sharding_comm_overlap_*``, V1 and V2), ``dp2_sharding2`` and ``mp2_sharding2`` (``mp_configs.sync_param``
on), whose second sharding group does not start at rank 0; there the ``v2_*``/``mp_v2_*`` cases run V2 (``split_param``,
comm buffers of ``cases.V2_BUFFER_MB`` MB, ``cases.sharding_v2``) with the all-gather overlap."""

import functools
import os
import sys
import tempfile
import types
import zlib

import dygraph_sharding_stage1_grad_comm_overlap as grad_comm
import hybrid_parallel_cpu_shim
import numpy as np
import sharding_cases as cases
from param_sync_checker import ParamSyncWaitChecker

import paddle
from paddle.distributed import fleet

TOPOLOGY = os.environ.get("BROADCAST_OVERLAP_TOPOLOGY", "pp2_sharding2")
PP, MP = TOPOLOGY == "pp2_sharding2", TOPOLOGY == "mp2_sharding2"
VOCAB, HIDDEN, BATCH, SEQ = 32, 16, 4, 4
STEPS = 3
V2_HIDDEN = 256  # V2's model width (comm buffers of cases.V2_BUFFER_MB)


def init_fleet():
    assert TOPOLOGY in ("pp2_sharding2", "dp2_sharding2", "mp2_sharding2")
    cases.init_fleet({TOPOLOGY[:2] + "_degree": 2, "sharding_degree": 2}, mp_sync_param=MP, micro_batch=BATCH // 2)


def hcg():
    return fleet.get_hybrid_communicate_group()


def data(step):
    """([B, S] int64 tokens, [B, S, 1] int64 labels): the same on the ranks of one model/pipeline-parallel group, different
    across sharding and data-parallel ranks."""
    seed = 1000 * step + 7 * hcg().get_sharding_parallel_rank() + 13 * hcg().get_data_parallel_rank()
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, VOCAB, size=(BATCH, SEQ)).astype("int64")
    labels = rng.randint(0, VOCAB, size=(BATCH, SEQ, 1)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def cross_entropy(logits, labels):
    return paddle.nn.functional.cross_entropy(logits, labels).mean()


def train_batch(run):
    """The pipeline's step (forward, backward, update): a micro-step."""
    return run.model.train_batch(list(data(run.step)), run.opt)


# ----------------------------------------------------------------------
# models
class EmbPipe(paddle.nn.Layer):
    """Owns one parameter ``embedding_weight`` [32, 16]."""

    def __init__(self):
        super().__init__()
        self.embedding_weight = self.create_parameter([VOCAB, HIDDEN])

    def forward(self, tokens):
        return paddle.nn.functional.embedding(tokens, self.embedding_weight)


class BlockPipe(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return paddle.tanh(self.fc(x))


def tied_head(emb, x):
    """PaddleNLP's tied LM head: reads the shared weight without calling the shared layer (on the last stage it is never
    called)."""
    return paddle.matmul(x, emb.embedding_weight, transpose_y=True)


def pipeline_model(tied, blocks=2, last_block=BlockPipe):
    """``blocks`` blocks, :class:`BlockPipe` s but the last, a ``last_block``, between the embedding and the head
    (``tied``: the embedding's weight, :func:`tied_head`), 2 stages of as many layers (Paddle's "uniform" segments)."""
    from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

    if tied:
        first, last = pipeline_shared_desc(), pipeline_shared_desc(forward_func=tied_head)
    else:
        first = LayerDesc(EmbPipe)
        last = LayerDesc(paddle.nn.Linear, HIDDEN, VOCAB)
    descs = [first] + [LayerDesc(cls) for cls in [BlockPipe] * (blocks - 1) + [last_block]] + [last]
    paddle.seed(2026 + hcg().get_stage_id())
    return PipelineLayer(layers=descs, topology=hcg().topology(), loss_fn=cross_entropy)


class FlatBlock(cases.Block):
    """``cases.Block`` of ``hidden`` -> ``widen * hidden`` -> ``hidden``, its LayerNorm only when ``norm``;
    column/row-parallel linears in mp2_sharding2."""

    def __init__(self, hidden, widen, norm):
        paddle.nn.Layer.__init__(self)
        self.norm = paddle.nn.LayerNorm(hidden) if norm else paddle.nn.Identity()
        wide, mpu = widen * hidden, fleet.meta_parallel
        if MP:
            self.up = mpu.ColumnParallelLinear(hidden, wide, gather_output=False, has_bias=True)
            self.down = mpu.RowParallelLinear(wide, hidden, input_is_parallel=True, has_bias=True)
        else:
            self.up = paddle.nn.Linear(hidden, wide)
            self.down = paddle.nn.Linear(wide, hidden)


class FlatLM(cases.TinyLM):
    """``cases.TinyLM`` of :class:`FlatBlock` s, its embedding vocab-parallel in mp2_sharding2."""

    def __init__(self, hidden=HIDDEN, blocks=1, widen=2, norm=False):
        paddle.nn.Layer.__init__(self)
        self.embed = (fleet.meta_parallel.VocabParallelEmbedding if MP else paddle.nn.Embedding)(VOCAB, hidden)
        self.blocks = paddle.nn.LayerList([FlatBlock(hidden, widen, norm) for _ in range(blocks)])
        self.head = paddle.nn.Linear(hidden, VOCAB)


def mp_seeded(cls, **kwargs):
    """``cls(**kwargs)`` seeded per model-parallel rank."""
    paddle.seed(2026 + 100 * hcg().get_model_parallel_rank())
    return cls(**kwargs)


flat_model = functools.partial(mp_seeded, FlatLM)


def v2_model():
    """3 blocks of width 256 (4H per model-parallel rank pair in mp2_sharding2, 2H otherwise): about 3.2 MB of fp32
    parameters per rank, 4 comm buffers of 1 MB."""
    return flat_model(hidden=V2_HIDDEN, blocks=3, widen=4 if MP else 2, norm=True)


# ----------------------------------------------------------------------
# training
_INITIAL = {}


def build_same(build):
    """``build()`` with the weights of the first ``build()`` of this process (model-parallel layers draw from Paddle's RNG
    tracker, which ``paddle.seed`` does not reset), so off and on start equal."""
    model = build()
    state = cases.snapshot(model)
    state = _INITIAL.setdefault(tuple(state), state)
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    return model


def backward(run, data=data):
    """A forward and backward of ``data(step)``'s tokens and labels (default this topology's)."""
    tokens, labels = data(run.step)
    loss = cross_entropy(run.model(tokens), labels)
    loss.backward()
    return loss


def micro_step(run):
    """This topology's micro-step: the pipeline's ``train_batch``, else :func:`backward`."""
    return train_batch(run) if PP else backward(run)


def train(model, overlap=False, *, v2=False, **kwargs):
    """``cases.train`` of ``model()`` in this topology: its data, the pipeline's ``train_batch`` (which runs the update),
    off and on from the same initial weights (:func:`build_same`); ``v2``: sharding stage 1 V2 (``cases.sharding_v2``),
    its overlap on as PaddleFormers does."""
    build = cases.Build(model, init=build_same)
    if v2:
        build.around, build.optimizer = cases.sharding_v2, functools.partial(cases.adamw, learning_rate=0.001)
        kwargs.setdefault("enable", cases.v2)
    update = cases.no_update if PP else None
    return cases.train(build, overlap, micro_step=micro_step, update=update, **{"steps": STEPS, **kwargs})


def compare(model, **kwargs):
    """``cases.compare_on_off`` of :func:`train` (or ``kwargs["train"]``) in this topology, the final parameters equal
    across the sharding group. Returns ``(checker, on run)``."""
    group = hcg().get_sharding_parallel_group()
    kwargs.setdefault("train", train)
    checker, on = cases.compare_on_off(model, replicas=group, **kwargs)
    impl = cases.overlap_impl(on.opt)
    counts = f"checker {checker.counts} stats {impl.stats} read paths {dict(impl.read_paths)}"
    print(f"rank {cases.rank()} stage {hcg().get_stage_id()}: {counts}", flush=True)
    return checker, on


# ----------------------------------------------------------------------
# pp2_sharding2
def case_pipeline_train_batch_plain():
    """``train_batch`` with overlap equals it without."""
    compare(lambda: pipeline_model(tied=False))


def case_pipeline_tied_embedding_head():
    """The tied head on the last stage reads the shared weight while its broadcast is pending and waits for it there."""
    checker, on = compare(lambda: pipeline_model(tied=True))
    if hcg().is_last_stage:  # (the shared layer never runs there)
        impl = cases.overlap_impl(on.opt)
        assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def case_pipeline_tied_head_without_guard_is_caught():
    """Negative control: with the read guard removed, the checker sees the last stage's tied head read the shared weight
    mid-broadcast."""
    with cases.read_guard_removed(), ParamSyncWaitChecker() as checker:
        train(lambda: pipeline_model(tied=True), True, checker=checker)
    reads = [v for v in checker.violations if v[0] == "read:matmul"]
    if hcg().is_last_stage:
        assert len(reads) >= STEPS - 1, checker.violations
    else:
        assert reads == [], reads


def case_pipeline_eval_batch_and_save_after_step():
    """``eval_batch`` and a save between steps, equal off and on."""
    saved = []

    def after_step(run):
        loss = run.model.eval_batch(list(data(100 + run.step)), compute_loss=True)
        saved.append(cases.reloaded(run.model.state_dict()))
        return [loss.numpy() if loss is not None else np.zeros([1])]

    compare(lambda: pipeline_model(tied=True), after_step=after_step)
    assert len(saved) == 2 * STEPS  # off and on


# ----------------------------------------------------------------------
# dp2_sharding2, mp2_sharding2
def case_sharding_group_layout():
    """Overlap on equals overlap off; the second sharding group does not start at rank 0, each rank's broadcast sources are
    global ranks of its own group, and both ranks of a group own parameters and send them."""
    group = hcg().get_sharding_parallel_group()
    _, on = compare(flat_model)
    units = cases.overlap_impl(on.opt).units
    sources = [u.src for u in units]
    assert units and all(u.kind == "broadcast" for u in units)
    assert sorted(set(sources)) == sorted(group.ranks), (sources, group.ranks)
    if cases.rank() >= 2 and TOPOLOGY == "dp2_sharding2":
        assert group.ranks == [2, 3], group.ranks


# ----------------------------------------------------------------------
# sharding stage 1 V2 (split_param) with the all-gather overlap
def compare_v2(**hooks):
    """:func:`compare` of V2 (``hooks``: its ``prepare``, ``after_step``): some all-gather seen, >= 3 comm buffers; in
    mp2_sharding2 the parameters model parallelism replicates equal on every rank (in dp2_sharding2 Paddle's own V2
    leaves the data-parallel replicas unequal, off and on alike: its first step all-reduces no data-parallel gradient).
    Returns the on run."""

    def replicated_equal(run):  # the collective on every rank before any assertion
        replicated = [p for p in run.raw.parameters() if not p.is_distributed]
        run.replicated_equal = cases.equal_in_group([zlib.crc32(p.numpy().tobytes()) for p in replicated])

    checker, on = compare(v2_model, v2=True, final=replicated_equal if MP else None, **hooks)
    assert checker.counts["gathers"] > 0, checker.counts
    assert not MP or on.replicated_equal, "replicated parameters differ"
    cases.assert_v2(on.opt)
    return on


def case_v2_allgather_overlap_on_off():
    """V2 with the all-gather overlap equals V2 without it. Paddle 2.6's own V2 fails in dp2_sharding2 at its first step,
    overlap off (``_hybrid_sync_grad`` hands ``fused_allreduce_gradients`` no parameter): asserted, so the case is not
    silently empty there."""
    if cases.PADDLE_2 and TOPOLOGY == "dp2_sharding2":
        steps_done = []
        with cases.raises(IndexError, "list index out of range") as fault:
            train(v2_model, v2=True, after_step=lambda r: steps_done.append(r.step))
        # Paddle's own fault at the first step (build_groups: vars[0]), not an IndexError of the product's
        assert "build_groups" in fault.traceback, fault.traceback
        assert "_hybrid_sync_grad" in fault.traceback, fault.traceback
        assert steps_done == [], steps_done
        return
    compare_v2()


# ----------------------------------------------------------------------
# Paddle's own syncs after the update: HybridParallelOptimizer._step syncs the parameters model parallelism replicates
# (mp_configs.sync_param, on in mp2_sharding2) and, on Paddle 3.x, the pipeline's shared weights (pp_configs.sync_param)
# across their groups, by broadcast or, with sync_mode "average", all-reduce. Each case builds a model where a synced
# parameter's sharding owner differs across that group (asserted before training): there the sync reads a copy its own
# sharding sync must have brought up to date first. The parameters those syncs read are planned into the first units,
# waited right before each such sync (waited_for_hybrid_sync, once per step each); every other unit is waited first by a
# forward pre-hook (and, after the last step, by the final read); the wait checker sees no blocking collective on a
# tensor whose sync is in flight (compare_on_off).
class OwnerShiftPipe(paddle.nn.Layer):
    """Owns one parameter [16, 64], larger than the embedding [32, 16]: on the last stage V1's partition (largest first)
    gives it to sharding rank 0 and the shared embedding to rank 1, on the first stage the embedding goes to rank 0."""

    def __init__(self):
        super().__init__()
        self.big = self.create_parameter([HIDDEN, 4 * HIDDEN])

    def forward(self, x):
        y = paddle.tanh(paddle.matmul(x, self.big))
        return x + 0.1 * y.reshape(x.shape + [4]).mean(-1)


def owner_shift_pipeline():
    """Embedding (shared, ``SharedLayerDesc``) and a block on stage 0; :class:`OwnerShiftPipe` and the tied head on stage
    1."""
    return pipeline_model(tied=True, last_block=OwnerShiftPipe)


def pipeline_shared_desc(**kwargs):
    from paddle.distributed.fleet.meta_parallel import SharedLayerDesc

    return SharedLayerDesc("embed", EmbPipe, shared_weight_attr="embedding_weight", **kwargs)


class UnevenShard(paddle.nn.Layer):
    """A model-parallel parameter (``is_distributed``) of ``uneven[0]`` elements on model-parallel rank 0 and ``uneven[1]``
    on rank 1, a LayerNorm of ``width`` (synced by ``mp_configs.sync_param``: "layer_norm" is in its name), ``wide``
    bias-free Linear layers ``width`` -> ``width`` (not synced) and a Linear ``width`` -> VOCAB (its bias synced:
    ".b_"). Width 80: V1's partition gives the LayerNorm weight to another sharding rank on each model-parallel rank;
    width 512 with 2 wide layers and 300,000 / 8 elements: V2 comm buffers of 1 MB, some holding no synced parameter,
    split elsewhere on each model-parallel rank."""

    def __init__(self, width=80, wide=0, uneven=(96, 8)):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, width)
        self.shard = self.create_parameter([uneven[hcg().get_model_parallel_rank()]])
        self.shard.is_distributed = True
        self.norm = paddle.nn.LayerNorm(width)
        self.wide = paddle.nn.LayerList([paddle.nn.Linear(width, width, bias_attr=False) for _ in range(wide)])
        self.head = paddle.nn.Linear(width, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) * (1.0 + 0.01 * self.shard.mean())
        for layer in self.wide:
            x = x + 0.1 * paddle.tanh(layer(x))
        return self.head(self.norm(x))


uneven_model = functools.partial(mp_seeded, UnevenShard)


def sharding_owner_ranks(opt, params):
    """V1's sharding owner rank of each of ``params``."""
    inner = cases.sharding_optimizer(opt)
    rank_of = {id(p): r for r, ps in inner._rank2params.items() for p in ps}
    return [rank_of[id(p)] for p in params]


def shared_weights(layer):
    """The pipeline's shared weights that ``pp_configs.sync_param`` syncs, by name (Paddle colours them when it builds the
    pipeline)."""
    found = [p for p in layer.parameters() if "broadcast_group" in (getattr(p, "color", None) or {})]
    return sorted(found, key=lambda p: p.color["shared_weight_name"])


def mp_synced(opt, layer):
    """The parameters ``mp_configs.sync_param`` syncs (Paddle's filter)."""
    hybrid = opt
    while type(hybrid).__name__ != "HybridParallelOptimizer":
        hybrid = hybrid._inner_opt
    return hybrid._params_synced_after_update(list(layer.parameters()))


# compare_hybrid_synced's ``synced`` and ``group_of``: the pipeline's shared weights (pp_configs.sync_param), the
# parameters mp_configs.sync_param syncs
SHARED_SYNCED = (lambda run: shared_weights(run.raw), lambda p: p.color["broadcast_group"])
MP_SYNCED = (lambda run: mp_synced(run.opt, run.raw), lambda p: hcg().get_model_parallel_group())


def pp_sync_missing(field="sync_param"):
    """True on Paddle 2.6, whose pp_configs has no ``field`` (asserted there): a case of it has nothing to run."""
    assert not (cases.PADDLE_2 and hasattr(fleet.fleet._user_defined_strategy.hybrid_configs["pp_configs"], field))
    return cases.PADDLE_2


def assert_owners_differ(opt, params, group):
    """Before training: the sharding owner of some of ``params`` differs across ``group`` (every rank of the group calls
    it)."""
    owners = sharding_owner_ranks(opt, params)
    assert owners and not cases.equal_in_group(owners, group), owners


def equality_pattern(run):
    """Which groups hold equal copies at the end of ``run``: the sharding group (every parameter), the model-parallel group
    (the replicated parameters), each shared weight's pipeline group. Every rank calls the same collectives."""
    params, h = list(run.raw.parameters()), hcg()
    crc = lambda ps: [zlib.crc32(p.numpy().tobytes()) for p in ps]  # noqa
    replicated = [p for p in params if not p.is_distributed]
    groups = (h.get_sharding_parallel_group(), h.get_model_parallel_group())
    pattern = [cases.equal_in_group(crc(ps), g) for ps, g in zip((params, replicated), groups)]
    return pattern + [cases.equal_in_group(crc([p]), p.color["broadcast_group"]) for p in shared_weights(run.raw)]


def check_hybrid_synced_first(on, synced):
    """The positions of ``synced`` are the agreed lead, their units come first and are waited once per step before Paddle's
    sync; every other unit is waited first by a forward pre-hook (all but the last step's, which the final read waits);
    off and on show the same equality pattern."""
    impl = cases.overlap_impl(on.opt)
    lead = sorted(impl.index_of(p) for p in synced)
    assert sorted(impl.lead) == lead and lead, (impl.lead, lead)
    first = [u for u in impl.units if set(u.indices) & set(lead)]
    assert impl.units[: len(first)] == first, impl.units
    others = len(impl.units) - len(first)
    stats = impl.stats
    assert stats["waited_for_hybrid_sync"] == STEPS * len(first), stats
    assert stats["waited_in_forward"] == (STEPS - 1) * others, stats
    assert stats["waited_out_of_order"] == 0, stats
    assert equality_pattern(on.off) == equality_pattern(on)


def compare_hybrid_synced(build, synced, group_of, v2=False, built_also=None, **kwargs):
    """:func:`compare` (V1, or V2 with ``v2``) of ``build``: before training, ``synced(run)`` (the parameters Paddle syncs
    after the update) have a sharding owner that differs across ``group_of(p)`` (V1), and ``built_also(run)`` runs; then
    :func:`check_hybrid_synced_first`."""
    seen = []

    def built(run):
        params = synced(run)
        seen.append(params)
        if not v2:
            assert_owners_differ(run.opt, params, group_of(params[0]))
        if built_also is not None:
            built_also(run)

    _, on = compare(build, v2=v2, built=built, **kwargs)
    check_hybrid_synced_first(on, seen[-1])
    return on


def case_pipeline_shared_weight_owners_differ():
    """pp_configs.sync_param (broadcast, then average) with a tied embedding/head whose sharding owner differs between the
    stages; V1 per parameter and in 2 KB buckets (the shared weight planned into a bucket of its own, first). Paddle 2.6
    has no pp_configs.sync_param: asserted there."""
    if pp_sync_missing():
        return
    for mode, bucket_mb in (("broadcast", 0.0), ("average", 0.002)):
        with cases.pp_configs(sync_param=True, sync_mode=mode):
            compare_hybrid_synced(owner_shift_pipeline, *SHARED_SYNCED, enable=cases.v1(bucket_mb))


def case_pipeline_v2_shared_weight():
    """V2 with pp_configs.sync_param and the tied embedding/head: Paddle colours the shared weight into a comm buffer of
    its own, so each rank holds the same slice of it on both stages (asserted); the order is value-safe because that
    buffer is gathered first and waited before the pipeline's sync reads it."""
    if pp_sync_missing():
        return
    with cases.pp_configs(sync_param=True):
        on = compare_hybrid_synced(owner_shift_pipeline, *SHARED_SYNCED, v2=True)
    inner = cases.sharding_optimizer(on.opt)
    (weight,) = shared_weights(on.raw)
    holding = [[id(q) for q in b._params] for b in inner._comm_buffer_list if any(q is weight for q in b._params)]
    assert holding == [[id(weight)]], holding


def case_pipeline_sync_moment_equal_owners():
    """pp_configs.sync_param and sync_moment with the tied embedding/head of :func:`pipeline_model` (its sharding owner is
    rank 0 on both stages, asserted: Paddle's moment sync runs on the owners only, so with owners that differ Paddle's
    own step hangs, overlap off as on)."""
    if pp_sync_missing("sync_moment"):
        return

    def built(run):
        (weight,) = shared_weights(run.raw)
        owner = sharding_owner_ranks(run.opt, [weight])
        assert cases.equal_in_group(owner, weight.color["broadcast_group"])

    with cases.pp_configs(sync_param=True, sync_moment=True):
        _, on = compare(lambda: pipeline_model(tied=True), built=built)
    check_hybrid_synced_first(on, shared_weights(on.raw))


def case_pipeline_set_state_dir_between_steps():
    """``PipelineLayer.set_state_dir`` between steps (V1, the tied embedding/head, owners that differ between the stages,
    and pp_configs.sync_param on Paddle 3.x): it loads every layer of this stage from files in Paddle's layout
    (``layer_NN-model_states.pdparams``, written from the first build's weights), then broadcasts the shared weight
    across its stages (``_synchronize_shared_weights``): its reads and writes wait for the step's syncs, equal to
    overlap off."""

    def after_step(run):
        layers = run.raw
        if run.step == 0:  # the files hold the values after the first step
            for idx, layer in enumerate(layers.run_function):
                if not hasattr(layer, "state_dict"):  # a shared forward_func
                    continue
                path = os.path.join(folder, f"layer_{idx + layers._start_pos:0>2d}")
                paddle.save(layer.state_dict(), path + "-model_states.pdparams")
        layers.set_state_dir(folder)

    settings = {} if cases.PADDLE_2 else {"sync_param": True}
    with tempfile.TemporaryDirectory(prefix=f"set_state_dir_{cases.rank()}_") as folder, cases.pp_configs(**settings):
        checker, _ = compare(owner_shift_pipeline, after_step=after_step)
    assert checker.counts["writes"] > 0, checker.counts


def paddle_moment_sync_owners_differ_hangs():
    """Paddle's own step, overlap off: with pp_configs.sync_moment and a shared weight whose sharding owner differs between
    the stages (asserted), ``_sync_pp_params_and_moments`` broadcasts its Adam moments from the ranks that hold them
    (the owners) only, so sharding rank 0's first stage waits in a broadcast its last-stage peer never issues: the step
    hangs. Run alone in its own launch, which the driver expects to time out with that broadcast named; the overlap
    changes nothing here."""
    assert not cases.PADDLE_2, "Paddle 2.6 has no pp_configs.sync_moment"

    def built(run):
        params = shared_weights(run.raw)
        assert_owners_differ(run.opt, params, params[0].color["broadcast_group"])
        print(f"rank {cases.rank()}: owners checked, training", flush=True)

    with cases.pp_configs(sync_param=True, sync_moment=True):
        train(owner_shift_pipeline, built=built)
    raise AssertionError("Paddle's moment sync finished: no hang to show")


def case_mp_synced_owner_differs():
    """mp_configs.sync_param (broadcast, then average) on :class:`UnevenShard`, whose LayerNorm weight has another sharding
    owner on each model-parallel rank; V1 per parameter and in 2 KB buckets."""
    for mode, bucket_mb in (("broadcast", 0.0), ("average", 0.002)):
        with cases.hybrid_configs("mp_configs", sync_mode=mode):
            compare_hybrid_synced(uneven_model, *MP_SYNCED, enable=cases.v1(bucket_mb))


def trainers_insert_sync(self, sync_var, src, mp_group, sync_mode):
    """A trainer's own ``_insert_sync``, set on the optimizer instance (as PaddleFormers 1.2.0's ``_wrap_model`` does, for
    pinned memory): the overlay's edit of the class method never runs."""
    if sync_mode == "broadcast":
        paddle.distributed.broadcast(sync_var, src=src, group=mp_group)
    else:
        paddle.distributed.all_reduce(sync_var, group=mp_group)
        sync_var.scale_(1.0 / mp_group.nranks)


def case_mp_trainer_replaces_insert_sync():
    """:func:`case_mp_synced_owner_differs` (broadcast, per parameter) with the hybrid optimizer's ``_insert_sync``
    replaced on the instance by a trainer's (:func:`trainers_insert_sync`), off and on: the synced parameters' units are
    waited before the update returns, so the replacement too sends and receives the values of overlap off."""

    def replace(run):
        run.opt._insert_sync = types.MethodType(trainers_insert_sync, run.opt)

    compare_hybrid_synced(uneven_model, *MP_SYNCED, built_also=replace)


def slices_in_buffers(opt, params):
    """(element offset, buffer size) of each of ``params`` in V2's comm buffers: which sharding rank holds which slice of
    it."""
    inner, found = cases.sharding_optimizer(opt), []
    for p in params:
        for buffer in inner._comm_buffer_list:
            storage = buffer.param_storage
            if any(q is p for q in buffer._params):
                found += [(p.data_ptr() - storage.data_ptr()) // 4, int(storage._numel())]
    return found


def case_mp_v2_synced_params():
    """V2 on :class:`UnevenShard` (2 wide layers): the comm buffers differ between the model-parallel ranks (their
    parameters do), so the slices of a synced parameter belong to other sharding ranks on each (asserted before
    training); its buffers are gathered first and waited before the model-parallel sync, the others by forward
    pre-hooks."""
    group = hcg().get_model_parallel_group()

    def built(run):
        layout = slices_in_buffers(run.opt, mp_synced(run.opt, run.raw))
        assert not cases.equal_in_group(layout, group), layout

    uneven = functools.partial(uneven_model, width=512, wide=2, uneven=(300_000, 8))
    on = compare_hybrid_synced(uneven, *MP_SYNCED, v2=True, built_also=built)
    impl = cases.overlap_impl(on.opt)
    assert any(not set(u.indices) & set(impl.lead) for u in impl.units)


# ----------------------------------------------------------------------
# pp2_sharding2 with the pipeline's gradient-communication overlap (pp_configs.sharding_comm_overlap; it needs
# main_grad, Paddle refuses it with tensor_fusion or comm_overlap: ..._buckets.py): the pipeline builds comm buffers per
# chunk at the first train_batch (shim item 10) and reduces them in backward, one collective each (V1: one per
# destination rank, 2; V2: 1); parameter syncs, V1 default bucket_size_mb: one bucket of the overlap's own storage per
# owner rank, 0: one per parameter; V2: one all-gather per pipeline buffer (V2 takes them).
def build_main_grad_pipeline(tied):
    raw = build_same(lambda: pipeline_model(tied))
    base = grad_comm.with_main_grad(raw, cases.adamw(raw.parameters()))
    with hybrid_parallel_cpu_shim.cpu_tensor_fusion(), hybrid_parallel_cpu_shim.cpu_sharding_v2():  # items 6, 8
        return fleet.distributed_model(raw), fleet.distributed_optimizer(base)


def pipeline_buffers(on):
    assert on.model._sharding_comm_overlap
    return [b for bs in on.model._chunk_2_comm_buffers.values() for b in bs]


def check_comm_overlap(v2, tied):
    """``grad_comm.compare`` (collectives counted) of the pipeline with V1 (in both bucket modes) or V2,
    ``pp_configs.sharding_comm_overlap`` on (Paddle reads it and ``split_param`` when it builds the pipeline and the
    optimizer)."""
    for bucket_mb in (None,) if v2 else (None, 0):
        with cases.pp_configs(sharding_comm_overlap=True), cases.sharding_configs(split_param=v2):
            on, checker, impl, buffers = grad_comm.compare(
                functools.partial(build_main_grad_pipeline, tied),
                cases.v2 if v2 else cases.v1(bucket_mb),
                pipeline_buffers,
                what=f"V{1 + v2} tied={tied} stage {hcg().get_stage_id()}",
                replicas=hcg().get_sharding_parallel_group(),
                train_batch=train_batch,
            )
        inner = cases.sharding_optimizer(on.opt)
        assert type(inner).__name__ == "DygraphShardingOptimizer" + ("V2" if v2 else ""), inner
        units = len(impl.units)
        if v2:  # V2 adopted the pipeline's buffers: one all-gather each
            assert [id(b) for b in inner._comm_buffer_list] == list(map(id, buffers))
            grad_comm.assert_one_gather_per_buffer(impl, checker, buffers)
            continue
        # V1's pipeline buffers hold gradients only (no parameter storage)
        assert all(b.param_storage is None for b in buffers)
        assert not getattr(inner, "_rank2fused", None)
        if bucket_mb == 0:
            cases.assert_per_parameter(on.opt)
        else:  # one bucket per owner rank (one dtype, all under 256 MB)
            slices = cases.bucket_units(on.opt)
            assert units == 2 and len(slices) == 2, (units, slices)
            assert len({u.src for u in slices}) == 2, [u.src for u in slices]
        if tied and hcg().is_last_stage:
            # the tied head read the shared weight while pending: waited
            assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


# the pipeline's comm overlap (:func:`check_comm_overlap`), pp2_sharding2
PIPELINE_COMM_OVERLAP = {
    f"v{1 + v2}_sharding_comm_overlap_"
    + ("tied_embedding_head" if tied else "plain"): functools.partial(check_comm_overlap, v2, tied)
    for v2 in (False, True)
    for tied in (False, True)
}


# Cases of a launch of their own, run only when env BROADCAST_OVERLAP_CASES names them: Paddle's own failures, which end
# the launch.
PADDLE_FAILURES = {"paddle_moment_sync_owners_differ_hangs": (paddle_moment_sync_owners_differ_hangs)}


def launch_cases():
    """The cases of this launch's topology (env BROADCAST_OVERLAP_TOPOLOGY)."""
    found = {**cases.cases_of(globals()), **PIPELINE_COMM_OVERLAP}
    chosen = os.environ.get("BROADCAST_OVERLAP_CASES", "").split(",")
    found.update({k: v for k, v in PADDLE_FAILURES.items() if k in chosen})
    return {
        k: v
        for k, v in found.items()
        if (k.startswith(("pipeline", "paddle")) or k in PIPELINE_COMM_OVERLAP) == PP
        and (MP or not k.startswith("mp_"))
    }


if __name__ == "__main__":
    sys.exit(cases.run_cases(launch_cases(), init=init_fleet))
