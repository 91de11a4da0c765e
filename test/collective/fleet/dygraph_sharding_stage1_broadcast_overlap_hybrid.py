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
"""Per-rank script: broadcast overlap in hybrid topologies on 4 ranks.

Env ``BROADCAST_OVERLAP_TOPOLOGY`` picks one (``fleet.init`` runs once per
process): ``pp2_sharding2`` (pipeline with ``train_batch``/``eval_batch``,
plain and with a tied embedding/head built from ``SharedLayerDesc``),
``dp2_sharding2`` and ``mp2_sharding2`` (``mp_configs.sync_param`` on:
the sharding broadcast launches after those syncs); in the last two the
second sharding group does not start at rank 0.
Every case trains with overlap off and on from the same initial weights
and checks bitwise-equal losses and parameters, and the wait checker sees
no read or update of a parameter whose broadcast is pending. Cases are
chosen with env ``BROADCAST_OVERLAP_CASES``.

Sharding stage 1 V2 (``split_param``) runs in the ``dp2_sharding2`` and
``mp2_sharding2`` launches too (cases ``v2_*`` and ``mp_v2_*``): the launch's
``fleet.init`` strategy is V1's, and Paddle reads
``sharding_configs.split_param`` only when ``fleet.distributed_optimizer``
builds ``HybridParallelOptimizer`` (and V2 reads ``comm_buffer_size_MB`` in
its ``__init__``), so those cases set both around building their optimizer
and restore them (``broadcast_overlap_training.sharding_v2``). V2 without overlap against V2 with
``_set_all_gather_overlap_forward(True, model)``, comm buffers of
:data:`V2_BUFFER_MB` MB and a model of a few MB (several buffers).
"""

import contextlib
import os
import sys
import time
import traceback
import zlib

import broadcast_overlap_training as training
import hybrid_parallel_cpu_shim  # noqa: I001 (before fleet.init)
import numpy as np
from broadcast_overlap_checker import BroadcastWaitChecker
from broadcast_overlap_training import (
    all_ranks_equal,
    assert_bitwise_equal,
    cases_of,
    overlap_impl,
    rank,
    run_cases,
)

import paddle
from paddle.distributed import fleet

TOPOLOGY = os.environ.get("BROADCAST_OVERLAP_TOPOLOGY", "pp2_sharding2")
VOCAB, HIDDEN, BATCH, SEQ = 32, 16, 4, 4
STEPS = 3

DEGREES = {
    "pp2_sharding2": dict(pp_degree=2, sharding_degree=2),
    "dp2_sharding2": dict(dp_degree=2, sharding_degree=2),
    "mp2_sharding2": dict(mp_degree=2, sharding_degree=2),
}


def init_fleet():
    training.init_fleet(
        DEGREES[TOPOLOGY],
        mp_sync_param=TOPOLOGY == "mp2_sharding2",
        micro_batch=BATCH // 2,
    )


def data(step):
    """([B, S] int64 tokens, [B, S, 1] int64 labels): the same on the ranks
    of one model/pipeline-parallel group, different across sharding and
    data-parallel ranks."""
    hcg = fleet.get_hybrid_communicate_group()
    seed = (
        1000 * step
        + 7 * hcg.get_sharding_parallel_rank()
        + 13 * hcg.get_data_parallel_rank()
    )
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, VOCAB, size=(BATCH, SEQ)).astype("int64")
    labels = rng.randint(0, VOCAB, size=(BATCH, SEQ, 1)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def cross_entropy(logits, labels):
    return paddle.nn.functional.cross_entropy(logits, labels).mean()


# ----------------------------------------------------------------------
# pipeline models
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


class HeadPipe(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(HIDDEN, VOCAB)

    def forward(self, x):
        return self.fc(x)


def tied_head(emb, x):
    """PaddleNLP's tied LM head: reads the shared weight without calling
    the shared layer (on the last stage it is never called)."""
    return paddle.matmul(x, emb.embedding_weight, transpose_y=True)


def pipeline_model(tied):
    from paddle.distributed.fleet.meta_parallel import (
        LayerDesc,
        PipelineLayer,
        SharedLayerDesc,
    )

    if tied:
        descs = [
            SharedLayerDesc(
                "embed", EmbPipe, shared_weight_attr="embedding_weight"
            ),
            LayerDesc(BlockPipe),
            LayerDesc(BlockPipe),
            SharedLayerDesc(
                "embed",
                EmbPipe,
                forward_func=tied_head,
                shared_weight_attr="embedding_weight",
            ),
        ]
    else:
        descs = [
            LayerDesc(EmbPipe),
            LayerDesc(BlockPipe),
            LayerDesc(BlockPipe),
            LayerDesc(HeadPipe),
        ]
    hcg = fleet.get_hybrid_communicate_group()
    paddle.seed(2026 + hcg.get_stage_id())
    return PipelineLayer(
        layers=descs, topology=hcg.topology(), loss_fn=cross_entropy
    )


# ----------------------------------------------------------------------
# dp / mp models
class MpLM(paddle.nn.Layer):
    """Vocab-parallel embedding -> column/row-parallel MLP -> head."""

    def __init__(self):
        super().__init__()
        mpu = fleet.meta_parallel
        self.embed = mpu.VocabParallelEmbedding(VOCAB, HIDDEN)
        self.up = mpu.ColumnParallelLinear(
            HIDDEN, 2 * HIDDEN, gather_output=False, has_bias=True
        )
        self.down = mpu.RowParallelLinear(
            2 * HIDDEN, HIDDEN, input_is_parallel=True, has_bias=True
        )
        self.head = paddle.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.down(paddle.nn.functional.gelu(self.up(x)))
        return self.head(x)


class DpLM(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, HIDDEN)
        self.up = paddle.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = paddle.nn.Linear(2 * HIDDEN, HIDDEN)
        self.head = paddle.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.down(paddle.nn.functional.gelu(self.up(x)))
        return self.head(x)


def flat_model():
    hcg = fleet.get_hybrid_communicate_group()
    paddle.seed(2026 + 100 * hcg.get_model_parallel_rank())
    return MpLM() if TOPOLOGY == "mp2_sharding2" else DpLM()


# ----------------------------------------------------------------------
# training
_INITIAL = {}


def build_same(build):
    """``build()`` with the weights of the first ``build()`` of this
    process (model-parallel layers draw from Paddle's RNG tracker, which
    ``paddle.seed`` does not reset), so off and on start equal."""
    model = build()
    key = tuple(model.state_dict().keys())
    if key not in _INITIAL:
        _INITIAL[key] = {
            k: v.numpy().copy() for k, v in model.state_dict().items()
        }
    else:
        model.set_state_dict(
            {k: paddle.to_tensor(v) for k, v in _INITIAL[key].items()}
        )
    return model


def train(build, overlap=False, *, prepare=None, **kwargs):
    """``training.train`` in this topology: this topology's data, the
    pipeline's ``train_batch`` (which runs the update), off and on from the
    same initial weights (:func:`build_same`)."""
    pipeline = TOPOLOGY == "pp2_sharding2"
    runs = []

    def start(run):
        runs.append(run)
        if prepare is not None:
            prepare(run)

    def micro_step(model, step, micro, acc_steps):
        tokens, labels = data(step)
        if pipeline:
            return model.train_batch([tokens, labels], runs[0].opt)
        loss = cross_entropy(model(tokens), labels)
        loss.backward()
        return loss

    return training.train(
        build,
        overlap,
        init=build_same,
        micro_step=micro_step,
        skip_update=(lambda step: True) if pipeline else None,
        prepare=start,
        **{"steps": STEPS, **kwargs},
    )


def compare(build, **kwargs):
    """``training.compare_on_off`` in this topology, the final parameters
    equal across the sharding group; returns ``(checker, overlap)``."""
    group = fleet.get_hybrid_communicate_group().get_sharding_parallel_group()
    checker, on = training.compare_on_off(
        build, run=train, replicas=group, **kwargs
    )
    impl = overlap_impl(on.opt)
    print(
        f"rank {rank()} {TOPOLOGY}: checker {checker.counts} stats "
        f"{impl.stats} read paths {dict(impl.read_paths)}",
        flush=True,
    )
    return checker, impl


def is_last_stage():
    return fleet.get_hybrid_communicate_group().is_last_stage


def case_pipeline_train_batch_plain():
    compare(lambda: pipeline_model(tied=False))


def case_pipeline_tied_embedding_head():
    checker, impl = compare(lambda: pipeline_model(tied=True))
    if is_last_stage():
        # tied_head read the shared weight while its broadcast was pending
        # and waited for it there (the shared layer never runs here)
        assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def case_pipeline_tied_head_without_guard_is_caught():
    """Negative control: with the read guard removed, the checker sees the
    last stage's tied head read the shared weight mid-broadcast."""
    from collections import OrderedDict

    from broadcast_overlap_training import read_guard_module

    guarded = read_guard_module().GuardedParameters
    saved = guarded.__getitem__
    guarded.__getitem__ = OrderedDict.__getitem__
    try:
        with BroadcastWaitChecker() as checker:
            train(lambda: pipeline_model(tied=True), True, checker=checker)
    finally:
        guarded.__getitem__ = saved
    reads = [v for v in checker.violations if v[0] == "read:matmul"]
    if is_last_stage():
        assert len(reads) >= STEPS - 1, checker.violations
    else:
        assert reads == [], reads


def case_pipeline_eval_batch_and_save_after_step():
    saved = []

    def after_step(step, run):
        tokens, labels = data(100 + step)
        loss = run.model.eval_batch([tokens, labels], compute_loss=True)
        path = f"/tmp/overlap_hybrid_{os.getpid()}_{step}.pdparams"
        paddle.save(run.model.state_dict(), path)
        saved.append(paddle.load(path))
        os.remove(path)
        return [loss.numpy() if loss is not None else np.zeros([1])]

    compare(lambda: pipeline_model(tied=True), after_step=after_step)
    assert len(saved) == 2 * STEPS  # off and on


def case_flat_model_on_off():
    compare(flat_model)


def case_sharding_group_layout():
    """The second sharding group does not start at rank 0; each rank's
    broadcast sources are global ranks of its own group."""
    hcg = fleet.get_hybrid_communicate_group()
    group = hcg.get_sharding_parallel_group()
    _, impl = compare(flat_model)
    sources = [u.src for u in impl.units]
    assert impl.units and all(u.kind == "broadcast" for u in impl.units)
    # both ranks of the group own parameters, and send them
    assert sorted(set(sources)) == sorted(group.ranks), (sources, group.ranks)
    if rank() >= 2 and TOPOLOGY == "dp2_sharding2":
        assert group.ranks == [2, 3], group.ranks


def record_mp_syncs(opt, record):
    """Call ``record("sync")`` at each of the hybrid optimizer's mp/pp
    parameter syncs (every one goes through ``_insert_sync``)."""
    insert_sync = opt._insert_sync

    def recording_sync(*args, **kwargs):
        record("sync")
        return insert_sync(*args, **kwargs)

    opt._insert_sync = recording_sync


def case_mp_step_launches_after_parameter_syncs():
    """HybridParallelOptimizer._step syncs the parameters the
    model-parallel ranks replicate (mp_configs.sync_param: the biases and
    the head here) after the sharding update; the async sharding broadcast
    starts only after those syncs, at every step."""
    hcg = fleet.get_hybrid_communicate_group()
    assert hcg.get_model_parallel_world_size() == 2, "needs mp_degree 2"
    events = []  # (what, async broadcasts launched so far)
    with BroadcastWaitChecker() as checker:

        def record(what):
            events.append((what, checker.counts["launched"]))

        def watch(step, _model, opt):
            record("step end")
            if step == 0:  # record the next steps
                inner = opt._inner_opt
                inner_step = type(inner).step

                def recording_step():
                    inner_step(inner)
                    record("update")

                inner.step = recording_step
                record_mp_syncs(opt, record)

        info = train(flat_model, overlap=True, checker=checker, on_step=watch)
    assert checker.violations == [], checker.violations[:5]
    units = len(overlap_impl(info["opt"]).units)
    steps, inside = [], []  # per step: (its events, launched at its end)
    for what, launched in events:
        if what == "step end":
            steps.append((inside, launched))
            inside = []
        else:
            inside.append((what, launched))
    assert len(steps) == STEPS, events
    for (_, begin), (inside, end) in zip(steps, steps[1:]):
        whats = [w for w, _ in inside]
        # the update, then at least one parameter sync ...
        assert "update" in whats, inside
        assert "sync" in whats[whats.index("update") + 1 :], inside
        # ... with nothing launched until the last sync, and every one of
        # the step's broadcasts launched by its end (inside the step)
        assert all(n == begin for _, n in inside), (begin, inside)
        assert end - begin == units, (begin, end, units)


# ----------------------------------------------------------------------
# sharding stage 1 V2 (split_param) with the all-gather overlap
V2_HIDDEN = 256
# comm buffer size: sharding_configs.comm_buffer_size_MB on Paddle 3.x (an
# int: 1 is the smallest), hybrid_parallel_cpu_shim item 9 on 2.6
V2_BUFFER_MB = 1
PADDLE_2 = paddle.__version__.startswith("2.")


class V2Block(paddle.nn.Layer):
    """LayerNorm -> up -> gelu -> down, residual; column/row-parallel
    linears (H -> 4H -> H, 2H per model-parallel rank) in mp2_sharding2,
    plain linears (H -> 2H -> H) otherwise: about 1 MB per rank either
    way."""

    def __init__(self):
        super().__init__()
        hidden = V2_HIDDEN
        self.norm = paddle.nn.LayerNorm(hidden)
        if TOPOLOGY == "mp2_sharding2":
            mpu = fleet.meta_parallel
            self.up = mpu.ColumnParallelLinear(
                hidden, 4 * hidden, gather_output=False, has_bias=True
            )
            self.down = mpu.RowParallelLinear(
                4 * hidden, hidden, input_is_parallel=True, has_bias=True
            )
        else:
            self.up = paddle.nn.Linear(hidden, 2 * hidden)
            self.down = paddle.nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        h = paddle.nn.functional.gelu(self.up(self.norm(x)))
        return x + self.down(h)


class V2LM(paddle.nn.Layer):
    """Embedding (vocab-parallel in mp2_sharding2) -> 3 blocks -> head:
    about 3.2 MB of fp32 parameters per rank, 4 comm buffers of 1 MB."""

    def __init__(self):
        super().__init__()
        if TOPOLOGY == "mp2_sharding2":
            self.embed = fleet.meta_parallel.VocabParallelEmbedding(
                VOCAB, V2_HIDDEN
            )
        else:
            self.embed = paddle.nn.Embedding(VOCAB, V2_HIDDEN)
        self.blocks = paddle.nn.LayerList([V2Block() for _ in range(3)])
        self.head = paddle.nn.Linear(V2_HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def v2_model():
    hcg = fleet.get_hybrid_communicate_group()
    paddle.seed(2026 + 100 * hcg.get_model_parallel_rank())
    return V2LM()


def train_v2(overlap, **kwargs):
    """:func:`train` of V2 (``training.sharding_v2``), the overlap turned on as
    PaddleFormers does (two arguments). ``run.dp_params``: per step, how
    many parameters ``HybridParallelOptimizer._hybrid_sync_grad`` handed
    to the data-parallel gradient all-reduce (V2's ``filter_parameters``);
    ``prepare(run)`` runs before the first step."""
    prepare = kwargs.pop("prepare", None)

    def enable(opt, model):
        opt._set_all_gather_overlap_forward(True, model)
        assert overlap_impl(opt) is not None, "no overlap owner on V2"

    def count_dp_params(run):
        inner = run.opt._inner_opt
        assert type(inner).__name__ == "DygraphShardingOptimizerV2", inner
        run.dp_params = []
        filter_parameters = inner.filter_parameters

        def counted_filter_parameters(*args, **kwargs):
            kept = filter_parameters(*args, **kwargs)
            run.dp_params.append(len(kept))
            return kept

        inner.filter_parameters = counted_filter_parameters
        if prepare is not None:
            prepare(run)

    return train(
        v2_model,
        overlap,
        around=lambda: training.sharding_v2(V2_BUFFER_MB),
        enable=enable,
        make_optimizer=lambda ps: paddle.optimizer.AdamW(
            learning_rate=0.001, parameters=ps, weight_decay=0.01
        ),
        prepare=count_dp_params,
        **kwargs,
    )


equal_in_group = training.equal_in_group


def param_digests(raw, replicated_only):
    return [
        zlib.crc32(p.numpy().tobytes())
        for p in raw.parameters()
        if not (replicated_only and p.is_distributed)
    ]


def compare_v2(prepare=None, on_step=None):
    """V2 off, then V2 with overlap under the wait checker (``prepare(opt,
    checker)`` before its first step, ``on_step`` after each): bitwise-equal
    losses and parameters, no read of a parameter whose all-gather is
    pending, every gather waited, equal parameters on the sharding group
    (and, in mp2_sharding2, the parameters model parallelism replicates on
    every rank), several comm buffers. In dp2_sharding2 the data-parallel
    replicas differ, with overlap off and on alike: Paddle's own V2 fault,
    asserted (see :func:`assert_paddle_v2_dp_replicas_differ`). Returns
    ``(checker, info of the on run)``."""
    start = time.monotonic()
    off_info = train_v2(overlap=False)
    off = off_info[:2]
    with BroadcastWaitChecker() as checker:
        info = train_v2(
            overlap=True,
            checker=checker,
            prepare=prepare and (lambda run: prepare(run.opt, checker)),
            on_step=on_step,
        )
    on = info[:2]
    hcg = fleet.get_hybrid_communicate_group()
    # collectives first, on every rank, then the assertions
    sharding_equal = equal_in_group(
        param_digests(info["raw"], False), hcg.get_sharding_parallel_group()
    )
    dp_equal = equal_in_group(
        param_digests(info["raw"], False), hcg.get_data_parallel_group()
    )
    replicated_equal = all_ranks_equal(param_digests(info["raw"], True))
    assert_bitwise_equal(off, on, f"{TOPOLOGY} V2")
    assert checker.violations == [], (
        f"reads of a parameter whose all-gather is pending: "
        f"{checker.violations[:8]}"
    )
    assert checker.counts["gathers"] > 0, checker.counts
    assert checker.num_unwaited() == 0, checker.num_unwaited()
    assert sharding_equal, "parameters differ across the sharding group"
    if TOPOLOGY == "dp2_sharding2":
        assert_paddle_v2_dp_replicas_differ(off_info["dp_params"], dp_equal)
    else:
        assert dp_equal, "parameters differ across the data-parallel group"
        assert replicated_equal, "replicated parameters differ across ranks"
    num_buffers = len(info["opt"]._inner_opt._comm_buffer_list)
    assert num_buffers >= 3, f"{num_buffers} comm buffers"
    impl = overlap_impl(info["opt"])
    print(
        f"rank {rank()} {TOPOLOGY} V2: {num_buffers} comm buffers, checker "
        f"{checker.counts}, stats {impl.stats}, "
        f"{time.monotonic() - start:.1f} s",
        flush=True,
    )
    return checker, info


def assert_paddle_v2_dp_replicas_differ(dp_params, dp_equal):
    """Paddle 3.x's V2 with data parallelism (not through the pipeline's
    ``dp_comm_overlap``): ``HybridParallelOptimizer._hybrid_sync_grad``
    all-reduces over the data-parallel group the gradients of
    ``V2.filter_parameters(...)``, the initialized slice parameters, and V2
    fills those only inside its own ``step()``. At the first step the list
    is empty (``fused_allreduce_gradients([])`` does nothing on 3.x; 2.6
    raises, see :func:`assert_paddle_2_v2_dp_fails`), so each replica
    applies its own gradients and the replicas differ from then on (later
    steps all-reduce the slice gradients). Asserted on the off run's counts,
    so this fails once Paddle changes; then require ``dp_equal``."""
    assert len(dp_params) == STEPS, dp_params
    assert dp_params[0] == 0 and all(n > 0 for n in dp_params[1:]), (
        f"Paddle {paddle.__version__}'s V2 now hands {dp_params} parameters "
        "per step to the data-parallel gradient all-reduce (0 at the first "
        "step was its known fault): require equal data-parallel replicas"
    )
    assert not dp_equal, (
        "data-parallel replicas equal although Paddle skipped the first "
        "step's data-parallel gradient all-reduce"
    )
    print(
        f"rank {rank()} dp2_sharding2 V2 on Paddle {paddle.__version__}: "
        f"Paddle's own V2 skips the first step's data-parallel gradient "
        f"all-reduce (parameters handed to it per step: {dp_params}); the "
        "data-parallel replicas differ, overlap off and on alike (known)",
        flush=True,
    )


def case_v2_allgather_overlap_on_off():
    """V2 with the all-gather overlap equals V2 without it in this
    topology. In dp2_sharding2 Paddle's own V2 is faulty: 3.x skips the
    first step's data-parallel gradient all-reduce (asserted in
    :func:`compare_v2`), 2.6 fails at that point (asserted here); both
    assertions fail once Paddle changes."""
    if PADDLE_2 and TOPOLOGY == "dp2_sharding2":
        assert_paddle_2_v2_dp_fails()
        return
    compare_v2()


def assert_paddle_2_v2_dp_fails():
    """Paddle 2.6's V2 fills its slice parameters only inside its own
    ``step()``; before that ``HybridParallelOptimizer._hybrid_sync_grad``
    all-reduces the data-parallel gradients of
    ``V2.filter_parameters(...)`` (the initialized slice parameters: none
    yet), and ``fused_allreduce_gradients`` of an empty list fails in
    ``build_groups`` (``dtype = vars[0].dtype``). Asserted with overlap off
    (Paddle's own V2) at the first step."""
    steps_done = []
    try:
        train_v2(
            overlap=False,
            on_step=lambda step, _model, _opt: steps_done.append(step),
        )
    except IndexError as e:
        tb = traceback.format_exc()
        assert "list index out of range" in str(e), tb
        assert "build_groups" in tb and "_hybrid_sync_grad" in tb, tb
        assert steps_done == [], steps_done
        print(
            f"rank {rank()} dp2_sharding2 V2 on Paddle {paddle.__version__}: "
            f"Paddle's own V2 fails at the first step as known: "
            f"IndexError: {e} (build_groups from _hybrid_sync_grad)",
            flush=True,
        )
        return
    raise AssertionError(
        f"Paddle {paddle.__version__} trained V2 in dp2_sharding2 without "
        "its known IndexError in build_groups: run compare_v2() here"
    )


def case_mp_v2_step_launches_after_parameter_syncs():
    """V2's ``step()`` inside ``HybridParallelOptimizer._step`` is followed
    by the model-parallel parameter syncs (``mp_configs.sync_param``: the
    norms and biases here); no all-gather starts between the update and the
    last of those syncs, and every gather of the step starts by its end, at
    every step (bitwise equal to overlap off, as the case above)."""
    hcg = fleet.get_hybrid_communicate_group()
    assert hcg.get_model_parallel_world_size() == 2, "needs mp_degree 2"
    events = []  # (what, all-gathers of parameters launched so far)
    checkers = []

    def record(what):
        events.append((what, checkers[0].counts["gathers"]))

    def prepare(opt, checker):
        checkers.append(checker)
        inner = opt._inner_opt
        inner_step = inner.step  # the overlay's V2 step (waits, updates)

        def recording_step():
            record("update begin")
            inner_step()
            record("update")

        inner.step = recording_step
        record_mp_syncs(opt, record)

    _, info = compare_v2(
        prepare=prepare,
        on_step=lambda step, _model, _opt: record("step end"),
    )
    units = len(overlap_impl(info["opt"]).units)
    steps, inside = [], []
    for what, launched in events:
        if what == "step end":
            steps.append((inside, launched))
            inside = []
        else:
            inside.append((what, launched))
    assert len(steps) == STEPS, events
    for inside, end in steps:
        whats = [w for w, _ in inside]
        begin = whats.index("update begin")
        update = whats.index("update")
        syncs = [i for i, w in enumerate(whats) if w == "sync" and i > update]
        # the update, then at least one parameter sync ...
        assert syncs, inside
        # ... with no gather launched from the update's start to the last
        # sync, and every gather of the step launched by its end
        counts = {n for _, n in inside[begin : syncs[-1] + 1]}
        assert len(counts) == 1, inside
        assert end - counts.pop() == units, (inside, end, units)


def launch_cases():
    """The cases of this launch's topology (env BROADCAST_OVERLAP_TOPOLOGY)."""
    cases = cases_of(globals())
    if TOPOLOGY == "pp2_sharding2":
        cases = {k: v for k, v in cases.items() if k.startswith("pipeline")}
    else:
        cases = {k: v for k, v in cases.items() if not k.startswith("pipeline")}
    if TOPOLOGY != "mp2_sharding2":
        cases = {k: v for k, v in cases.items() if not k.startswith("mp_")}
    return cases


if __name__ == "__main__":
    sys.exit(run_cases(launch_cases(), init=init_fleet))
