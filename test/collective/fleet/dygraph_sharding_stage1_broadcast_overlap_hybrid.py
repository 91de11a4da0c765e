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
"""Per-rank script: the parameter-sync overlap in hybrid topologies on 4
ranks, overlap off against on (``cases.compare_on_off``).

Env ``BROADCAST_OVERLAP_TOPOLOGY`` (``fleet.init`` runs once per process):
``pp2_sharding2`` (``train_batch``/``eval_batch``, plain and with a tied
embedding/head; with the pipeline's gradient-communication overlap,
``*_sharding_comm_overlap_*``, V1 and V2), ``dp2_sharding2`` and
``mp2_sharding2`` (``mp_configs.sync_param`` on), whose second sharding
group does not start at rank 0; there the ``v2_*``/``mp_v2_*`` cases run V2
(``split_param``, comm buffers of ``cases.V2_BUFFER_MB`` MB,
``cases.sharding_v2``) with the all-gather overlap.
"""

import functools
import os
import sys
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
    degrees = {TOPOLOGY[:2] + "_degree": 2, "sharding_degree": 2}
    cases.init_fleet(degrees, mp_sync_param=MP, micro_batch=BATCH // 2)


def hcg():
    return fleet.get_hybrid_communicate_group()


def data(step):
    """([B, S] int64 tokens, [B, S, 1] int64 labels): the same on the ranks
    of one model/pipeline-parallel group, different across sharding and
    data-parallel ranks."""
    seed = (
        1000 * step
        + 7 * hcg().get_sharding_parallel_rank()
        + 13 * hcg().get_data_parallel_rank()
    )
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
    """PaddleNLP's tied LM head: reads the shared weight without calling
    the shared layer (on the last stage it is never called)."""
    return paddle.matmul(x, emb.embedding_weight, transpose_y=True)


def pipeline_model(tied, blocks=2):
    """``blocks`` :class:`BlockPipe` s between the embedding and the head
    (``tied``: the embedding's weight, :func:`tied_head`), 2 stages."""
    from paddle.distributed.fleet.meta_parallel import (
        LayerDesc,
        PipelineLayer,
        SharedLayerDesc,
    )

    def shared(**kwargs):
        attr = "embedding_weight"
        return SharedLayerDesc(
            "embed", EmbPipe, shared_weight_attr=attr, **kwargs
        )

    if tied:
        first, last = shared(), shared(forward_func=tied_head)
    else:
        first = LayerDesc(EmbPipe)
        last = LayerDesc(paddle.nn.Linear, HIDDEN, VOCAB)
    descs = [first] + [LayerDesc(BlockPipe) for _ in range(blocks)] + [last]
    paddle.seed(2026 + hcg().get_stage_id())
    return PipelineLayer(
        layers=descs, topology=hcg().topology(), loss_fn=cross_entropy
    )


class FlatBlock(cases.Block):
    """``cases.Block`` of ``hidden`` -> ``widen * hidden`` -> ``hidden``,
    its LayerNorm only when ``norm``; column/row-parallel linears in
    mp2_sharding2."""

    def __init__(self, hidden, widen, norm):
        paddle.nn.Layer.__init__(self)
        self.norm = (
            paddle.nn.LayerNorm(hidden) if norm else paddle.nn.Identity()
        )
        wide, mpu = widen * hidden, fleet.meta_parallel
        if MP:
            self.up = mpu.ColumnParallelLinear(
                hidden, wide, gather_output=False, has_bias=True
            )
            self.down = mpu.RowParallelLinear(
                wide, hidden, input_is_parallel=True, has_bias=True
            )
        else:
            self.up = paddle.nn.Linear(hidden, wide)
            self.down = paddle.nn.Linear(wide, hidden)


class FlatLM(cases.TinyLM):
    """``cases.TinyLM`` of :class:`FlatBlock` s, its embedding
    vocab-parallel in mp2_sharding2."""

    def __init__(self, hidden=HIDDEN, blocks=1, widen=2, norm=False):
        paddle.nn.Layer.__init__(self)
        mpu = fleet.meta_parallel
        embedding = mpu.VocabParallelEmbedding if MP else paddle.nn.Embedding
        self.embed = embedding(VOCAB, hidden)
        self.blocks = paddle.nn.LayerList(
            [FlatBlock(hidden, widen, norm) for _ in range(blocks)]
        )
        self.head = paddle.nn.Linear(hidden, VOCAB)


def flat_model(**kwargs):
    paddle.seed(2026 + 100 * hcg().get_model_parallel_rank())
    return FlatLM(**kwargs)


def v2_model():
    """3 blocks of width 256 (4H per model-parallel rank pair in
    mp2_sharding2, 2H otherwise): about 3.2 MB of fp32 parameters per rank,
    4 comm buffers of 1 MB."""
    return flat_model(
        hidden=V2_HIDDEN, blocks=3, widen=4 if MP else 2, norm=True
    )


# ----------------------------------------------------------------------
# training
_INITIAL = {}


def build_same(build):
    """``build()`` with the weights of the first ``build()`` of this
    process (model-parallel layers draw from Paddle's RNG tracker, which
    ``paddle.seed`` does not reset), so off and on start equal."""
    model = build()
    state = cases.snapshot(model)
    state = _INITIAL.setdefault(tuple(state), state)
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    return model


def micro_step(run):
    """This topology's micro-step: the pipeline's ``train_batch``, else a
    forward and backward of this topology's data."""
    if PP:
        return train_batch(run)
    tokens, labels = data(run.step)
    loss = cross_entropy(run.model(tokens), labels)
    loss.backward()
    return loss


def v2_adamw(parameters):
    return paddle.optimizer.AdamW(
        learning_rate=0.001, parameters=parameters, weight_decay=0.01
    )


def train(model, overlap=False, *, v2=False, **kwargs):
    """``cases.train`` of ``model()`` in this topology: its data, the
    pipeline's ``train_batch`` (which runs the update), off and on from the
    same initial weights (:func:`build_same`); ``v2``: sharding stage 1 V2
    (``cases.sharding_v2``), its overlap on as PaddleFormers does."""
    build = cases.Build(model, init=build_same)
    if v2:
        build.around, build.optimizer = cases.sharding_v2, v2_adamw
        kwargs.setdefault("enable", cases.v2)
    update = cases.no_update if PP else None
    return cases.train(
        build,
        overlap,
        micro_step=micro_step,
        update=update,
        **{"steps": STEPS, **kwargs},
    )


def compare(model, **kwargs):
    """``cases.compare_on_off`` of :func:`train` (or ``kwargs["train"]``) in
    this topology, the final parameters equal across the sharding group.
    Returns ``(checker, on run)``."""
    group = hcg().get_sharding_parallel_group()
    kwargs.setdefault("train", train)
    checker, on = cases.compare_on_off(model, replicas=group, **kwargs)
    impl = cases.overlap_impl(on.opt)
    print(
        f"rank {cases.rank()} stage {hcg().get_stage_id()}: checker "
        f"{checker.counts} stats "
        f"{impl.stats} read paths {dict(impl.read_paths)}",
        flush=True,
    )
    return checker, on


def check_launch_order(compare_fn, key, first_step=0):
    """``compare_fn(prepare=, after_step=)`` (overlap off and on) recording
    the on run's updates (the sharding optimizer's ``step()``) and the
    hybrid optimizer's mp/pp parameter syncs (``_insert_sync``), each with
    the checker's ``counts[key]`` so far; per step from ``first_step`` on:
    the update, then at least one sync, nothing launched from the previous
    step's end to the last sync, every unit of the owner launched by the
    step's end."""
    assert hcg().get_model_parallel_world_size() == 2, "needs mp_degree 2"
    log, checkers = [[]], []  # per step [(what, launched so far)]

    def record(what):
        log[-1].append((what, checkers[0].counts[key]))

    def prepare(run):
        if run.checker is None:  # the off run
            return
        checkers.append(run.checker)
        inner, insert_sync = run.opt._inner_opt, run.opt._insert_sync
        inner_step = inner.step

        def recording_step():
            inner_step()
            record("update")

        def recording_sync(*args, **kwargs):
            record("sync")
            return insert_sync(*args, **kwargs)

        inner.step, run.opt._insert_sync = recording_step, recording_sync

    def after_step(run):
        if run.checker is not None:
            record("end")
            log.append([])

    on = compare_fn(prepare=prepare, after_step=after_step)
    units = len(cases.overlap_impl(on.opt).units)
    assert len(log) == STEPS + 1, log
    for i in range(first_step, STEPS):
        whats = [w for w, _ in log[i]]
        update = whats.index("update")
        syncs = [j for j, w in enumerate(whats) if w == "sync" and j > update]
        assert syncs, log[i]
        start = log[i - 1][-1][1] if i else 0
        counts = {n for _, n in log[i][: syncs[-1] + 1]}
        assert counts == {start}, (start, log[i])
        assert log[i][-1][1] - start == units, (log[i], start, units)


# ----------------------------------------------------------------------
# pp2_sharding2
def case_pipeline_train_batch_plain():
    """``train_batch`` with overlap equals it without."""
    compare(lambda: pipeline_model(tied=False))


def case_pipeline_tied_embedding_head():
    """The tied head on the last stage reads the shared weight while its
    broadcast is pending and waits for it there."""
    checker, on = compare(lambda: pipeline_model(tied=True))
    if hcg().is_last_stage:  # (the shared layer never runs there)
        impl = cases.overlap_impl(on.opt)
        assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def case_pipeline_tied_head_without_guard_is_caught():
    """Negative control: with the read guard removed, the checker sees the
    last stage's tied head read the shared weight mid-broadcast."""
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
        tokens, labels = data(100 + run.step)
        loss = run.model.eval_batch([tokens, labels], compute_loss=True)
        path = f"/tmp/overlap_hybrid_{os.getpid()}_{run.step}.pdparams"
        paddle.save(run.model.state_dict(), path)
        saved.append(paddle.load(path))
        os.remove(path)
        return [loss.numpy() if loss is not None else np.zeros([1])]

    compare(lambda: pipeline_model(tied=True), after_step=after_step)
    assert len(saved) == 2 * STEPS  # off and on


# ----------------------------------------------------------------------
# dp2_sharding2, mp2_sharding2
def case_sharding_group_layout():
    """Overlap on equals overlap off; the second sharding group does not
    start at rank 0, each rank's broadcast sources are global ranks of its
    own group, and both ranks of a group own parameters and send them."""
    group = hcg().get_sharding_parallel_group()
    _, on = compare(flat_model)
    units = cases.overlap_impl(on.opt).units
    sources = [u.src for u in units]
    assert units and all(u.kind == "broadcast" for u in units)
    assert sorted(set(sources)) == sorted(group.ranks), (sources, group.ranks)
    if cases.rank() >= 2 and TOPOLOGY == "dp2_sharding2":
        assert group.ranks == [2, 3], group.ranks


def case_mp_step_launches_after_parameter_syncs():
    """HybridParallelOptimizer._step syncs the parameters the
    model-parallel ranks replicate (mp_configs.sync_param: the biases and
    the head here) after the sharding update; the async sharding broadcast
    starts only after those syncs, at every step (checked from the second
    one: the first agrees on the order)."""
    on_run = lambda **hooks: compare(flat_model, **hooks)[1]  # noqa: E731
    check_launch_order(on_run, "launched", first_step=1)


# ----------------------------------------------------------------------
# sharding stage 1 V2 (split_param) with the all-gather overlap
def compare_v2(**hooks):
    """:func:`compare` of V2 (``hooks``: its ``prepare``, ``after_step``): some
    all-gather seen, >= 3 comm buffers; in mp2_sharding2 the parameters
    model parallelism replicates equal on every rank (in dp2_sharding2
    Paddle's own V2 leaves the data-parallel replicas unequal, off and on
    alike: its first step all-reduces no data-parallel gradient). Returns
    the on run."""

    def run(model, overlap, **kwargs):
        r = train(model, overlap, v2=True, **kwargs)
        if MP:  # the collective on every rank before any assertion
            replicated = [p for p in r.raw.parameters() if not p.is_distributed]
            digests = [zlib.crc32(p.numpy().tobytes()) for p in replicated]
            r.replicated_equal = cases.all_ranks_equal(digests)
        return r

    checker, on = compare(v2_model, train=run, **hooks)
    assert checker.counts["gathers"] > 0, checker.counts
    assert not MP or on.replicated_equal, "replicated parameters differ"
    cases.assert_v2(on.opt)
    return on


def case_v2_allgather_overlap_on_off():
    """V2 with the all-gather overlap equals V2 without it. Paddle 2.6's own
    V2 fails in dp2_sharding2 at its first step, overlap off
    (``_hybrid_sync_grad`` hands ``fused_allreduce_gradients`` no
    parameter): asserted, so the case is not silently empty there."""
    if cases.PADDLE_2 and TOPOLOGY == "dp2_sharding2":
        steps_done = []
        with cases.raises(IndexError, "list index out of range") as fault:
            train(
                v2_model,
                v2=True,
                after_step=lambda r: steps_done.append(r.step),
            )
        # Paddle's own fault at the first step (build_groups: vars[0]), not
        # an IndexError of the product's
        assert "build_groups" in fault.traceback, fault.traceback
        assert "_hybrid_sync_grad" in fault.traceback, fault.traceback
        assert steps_done == [], steps_done
        return
    compare_v2()


def case_mp_v2_step_launches_after_parameter_syncs():
    """V2's ``step()`` inside ``HybridParallelOptimizer._step`` is followed
    by the model-parallel parameter syncs (the norms and biases here); no
    all-gather starts between the update's start and the last of those
    syncs, and every gather of the step starts by its end, at every step."""
    check_launch_order(compare_v2, "gathers")


# ----------------------------------------------------------------------
# pp2_sharding2 with the pipeline's gradient-communication overlap
# (pp_configs.sharding_comm_overlap; it needs main_grad, Paddle refuses it
# with tensor_fusion or comm_overlap: ..._buckets.py): the pipeline builds
# comm buffers per chunk at the first train_batch (shim item 10) and reduces
# them in backward, one collective each (V1: one per destination rank, 2;
# V2: 1); parameter syncs, V1 default bucket_size_mb: one bucket of the
# overlap's own storage per owner rank, 0: one per parameter; V2: one
# all-gather per pipeline buffer (V2 takes them).
def build_main_grad_pipeline(tied):
    raw = build_same(lambda: pipeline_model(tied))
    base = grad_comm.with_main_grad(raw, cases.adamw(raw.parameters()))
    with hybrid_parallel_cpu_shim.cpu_tensor_fusion():  # item 6
        with hybrid_parallel_cpu_shim.cpu_sharding_v2():  # item 8
            model = fleet.distributed_model(raw)
            return model, fleet.distributed_optimizer(base)


def pipeline_buffers(on):
    assert on.model._sharding_comm_overlap
    return [b for bs in on.model._chunk_2_comm_buffers.values() for b in bs]


def check_comm_overlap(v2, tied):
    """``grad_comm.compare`` (collectives counted) of the pipeline with V1
    (in both bucket modes) or V2, ``pp_configs.sharding_comm_overlap`` on
    (Paddle reads it and ``split_param`` when it builds the pipeline and
    the optimizer)."""
    for bucket_mb in (None,) if v2 else (None, 0):
        enable = cases.v2 if v2 else cases.v1(bucket_mb)
        pp = cases.pp_configs(sharding_comm_overlap=True)
        with pp, cases.sharding_configs(split_param=v2):
            on, checker, impl, buffers = grad_comm.compare(
                functools.partial(build_main_grad_pipeline, tied),
                enable,
                pipeline_buffers,
                what=f"V{1 + v2} tied={tied} stage {hcg().get_stage_id()}",
                replicas=hcg().get_sharding_parallel_group(),
                train_batch=train_batch,
            )
        inner = cases.sharding_optimizer(on.opt)
        name = "DygraphShardingOptimizer" + ("V2" if v2 else "")
        assert type(inner).__name__ == name, inner
        units = len(impl.units)
        if v2:  # V2 adopted the pipeline's buffers: one all-gather each
            assert [id(b) for b in inner._comm_buffer_list] == list(
                map(id, buffers)
            )
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
    + ("tied_embedding_head" if tied else "plain"): functools.partial(
        check_comm_overlap, v2, tied
    )
    for v2 in (False, True)
    for tied in (False, True)
}


def launch_cases():
    """The cases of this launch's topology (env BROADCAST_OVERLAP_TOPOLOGY)."""
    found = {**cases.cases_of(globals()), **PIPELINE_COMM_OVERLAP}
    return {
        k: v
        for k, v in found.items()
        if (k.startswith("pipeline") or k in PIPELINE_COMM_OVERLAP) == PP
        and (MP or not k.startswith("mp_"))
    }


if __name__ == "__main__":
    sys.exit(cases.run_cases(launch_cases(), init=init_fleet))
