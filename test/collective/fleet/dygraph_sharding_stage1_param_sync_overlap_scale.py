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
"""Per-rank script: the parameter sync overlap on 8 ranks.

Env ``PARAM_SYNC_SCALE_TOPOLOGY`` picks the launch's topology
(``fleet.init`` runs once per process):

- ``sharding8`` (sharding degree 8):

  * V1 (broadcast) with small buckets and one broadcast per parameter
    (``bucket_size_mb=0``), on a model whose owners carry very different
    loads (Paddle's greedy partition gives one rank the one big embedding
    and one rank every tiny parameter, 17 of them) and with a rank that
    owns only frozen parameters (those ``optimizer._rank2params`` assigns
    to it, frozen after the optimizer is built);
  * V2 (``split_param``, comm buffers of 1 MB) on a model with a parameter
    of 5 elements, ones whose sizes are not divisible by 8, a comm buffer
    whose parameters are all frozen (before the first step) and per-rank
    padding that differs (each parameter is padded to a multiple of
    8 x 64 elements, and each rank's shard of a buffer holds a different
    share of real elements);

- ``pp2_sharding4``: V1 with small buckets in a pipeline of two stages,
  each stage a sharding group of 4, with a tied embedding/head
  (``SharedLayerDesc``; the last stage's head reads the shared weight
  without calling the shared layer).

Every case trains with the overlap off and on from the same initial weights
and data and checks bitwise-equal losses and final parameters, equal
parameters on every rank of each sharding group, and that the wait checker
(``broadcast_overlap_checker``) saw no read or update of a parameter whose
broadcast or all-gather was pending and every task waited. Cases are
chosen with env ``BROADCAST_OVERLAP_CASES`` (all of the topology when unset).
Each rank prints ``CASE <name> PASS|FAIL`` and a summary line; the exit
code is non-zero on any failure.
"""

import contextlib
import os
import sys
import time
import zlib

import broadcast_overlap_training as training
import hybrid_parallel_cpu_shim  # noqa: I001 (before fleet.init)
import numpy as np
from broadcast_overlap_checker import BroadcastWaitChecker
from broadcast_overlap_training import (
    adamw,
    assert_bitwise_equal,
    cases_of,
    equal_in_group,
    overlap_impl,
    rank,
)

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.distributed import fleet

TOPOLOGY = os.environ.get("PARAM_SYNC_SCALE_TOPOLOGY", "sharding8")
DEGREES = {
    "sharding8": dict(sharding_degree=8),
    "pp2_sharding4": dict(pp_degree=2, sharding_degree=4),
}
STEPS = 3
BATCH, SEQ = 4, 4
# 4 KB buckets: the V1 model's order closes a window after each of its
# 8 KB linear weights and after the 64 KB embedding, so the tiny parameters
# of one owner share buckets between them
SMALL_BUCKET_MB = 0.004
# comm buffer size: sharding_configs.comm_buffer_size_MB on Paddle 3.x (an
# int: 1 is the smallest), hybrid_parallel_cpu_shim item 9 on 2.6
V2_BUFFER_MB = 1


def init_fleet():
    world = paddle.distributed.get_world_size()
    assert world == 8, f"this script runs on 8 ranks, got {world}"
    training.init_fleet(DEGREES[TOPOLOGY], micro_batch=BATCH // 2)


# ----------------------------------------------------------------------
# helpers
def snapshot(raw):
    return {k: v.numpy().copy() for k, v in raw.state_dict().items()}


def digests(params):
    return [zlib.crc32(params[k].tobytes()) for k in sorted(params)]


def gather_ints(values, group):
    """The int list ``values`` of every rank of ``group`` (same length on
    each), in group rank order; every rank of the group must call it."""
    if group.nranks < 2:
        return [list(values)]
    gathered = []
    mine = paddle.to_tensor(list(values), dtype="int64")
    paddle.distributed.all_gather(gathered, mine, group=group)
    return [g.numpy().tolist() for g in gathered]


build_same = training.build_with_initial_state  # the same on every rank


def inner_of(opt, class_name):
    inner = opt
    while type(inner).__name__ != class_name:
        inner = vars(inner)["_inner_opt"]
    return inner


def names_of(raw):
    return {id(p): n for n, p in raw.named_parameters()}


def check_waits(checker):
    assert checker.violations == [], (
        "reads or updates of a parameter whose sync is pending: "
        f"{checker.violations[:8]}"
    )
    assert checker.counts["launched"] > 0, checker.counts
    assert checker.num_unwaited() == 0, checker.num_unwaited()


# ----------------------------------------------------------------------
# V1 on sharding8: very different loads, a rank owning only frozen ones
HIDDEN, VOCAB, CLASSES = 32, 512, 16


class Block(nn.Layer):
    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Tiny(nn.Layer):
    """Parameters of 5, 13 and 1 elements (sizes not divisible by 8)."""

    def __init__(self):
        super().__init__()
        self.gate = self.create_parameter([5])
        self.odd = self.create_parameter([13])
        self.one = self.create_parameter([1])

    def forward(self, x):
        scale = 1.0 + 0.1 * paddle.tanh(self.gate).mean()
        return x * scale + 0.1 * self.odd.mean() + self.one


class UnevenLM(nn.Layer):
    """With the defaults: an embedding of 16384 elements (Paddle's greedy
    partition gives it one rank alone), 3 blocks whose 2048-element weights
    get one rank each, a head and three tiny parameters: the last rank owns
    the 17 small ones."""

    def __init__(self, vocab=VOCAB, hidden=HIDDEN, out=CLASSES, tiny=Tiny):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.tiny = tiny()
        self.blocks = nn.LayerList([Block(hidden) for _ in range(3)])
        self.head = nn.Linear(hidden, out)

    def forward(self, tokens):
        x = self.tiny(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(step, vocab=VOCAB, classes=CLASSES):
    rng = np.random.RandomState(1000 * step + rank())
    tokens = rng.randint(0, vocab, size=(BATCH, SEQ)).astype("int64")
    labels = rng.randint(0, classes, size=(BATCH, SEQ)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def owners(raw, inner):
    """{sharding rank: [structured names]} of Paddle's partition."""
    name = names_of(raw)
    return {
        r: [name[id(p)] for p in ps] for r, ps in inner._rank2params.items()
    }


def frozen_rank(layout):
    """The rank whose parameters are frozen: the first one (from the
    middle of the group) that owns neither the biggest parameter nor the
    most parameters."""
    counts = {r: len(ns) for r, ns in layout.items()}
    busiest = max(counts, key=counts.get)
    biggest = next(r for r, ns in layout.items() if "embed.weight" in ns)
    n = len(layout)
    for r in [(n // 2 + k) % n for k in range(n)]:
        if r not in (busiest, biggest) and counts[r] > 0:
            return r
    raise AssertionError(f"no rank to freeze in {layout}")


def train_v1(overlap, bucket_mb, checker=None):
    raw = build_same(UnevenLM)
    opt = fleet.distributed_optimizer(adamw(raw.parameters()))
    model = fleet.distributed_model(raw)
    inner = inner_of(opt, "DygraphShardingOptimizer")
    layout = owners(raw, inner)
    frozen = frozen_rank(layout)
    for p in inner._rank2params[frozen]:
        p.stop_gradient = True
    initial = snapshot(raw)
    if overlap:
        opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=bucket_mb)
    if checker is not None:
        checker.watch(model, opt)
    losses = []
    for step in range(STEPS):
        tokens, labels = batch(step)
        loss = F.cross_entropy(model(tokens), labels).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(loss.numpy().copy())
    info = dict(raw=raw, opt=opt, inner=inner, layout=layout, frozen=frozen)
    return (losses, snapshot(raw)), initial, info


def compare_v1(bucket_mb):
    start = time.monotonic()
    off, _, off_info = train_v1(False, bucket_mb)
    with BroadcastWaitChecker() as checker:
        on, initial, info = train_v1(True, bucket_mb, checker)
    world = paddle.distributed.get_world_size()
    # collectives first, on every rank, then the assertions
    group = info["inner"]._hcg.get_sharding_parallel_group()
    ranks_equal = equal_in_group(digests(on[1]), group)
    assert_bitwise_equal(off, on, f"sharding8 V1 bucket_size_mb={bucket_mb}")
    check_waits(checker)
    assert ranks_equal, "parameters differ across the sharding group"
    layout, frozen = info["layout"], info["frozen"]
    assert layout == off_info["layout"] and frozen == off_info["frozen"]
    assert len(layout) == world, layout
    # very different loads: one rank holds the embedding alone, another
    # holds many small parameters
    assert ["embed.weight"] in layout.values(), layout
    assert max(len(ns) for ns in layout.values()) >= 10, layout
    # the frozen rank's parameters never changed, and no broadcast of the
    # overlap came from it
    for name in layout[frozen]:
        assert on[1][name].tobytes() == initial[name].tobytes(), name
    impl = overlap_impl(info["opt"])
    due = [u for u in impl.units if u.needs_sync()]
    src_of_frozen = group.ranks[frozen]
    assert due and all(u.src != src_of_frozen for u in due), [
        (u.label, u.src) for u in due
    ]
    assert impl.stats["launched"] == STEPS * len(due), (impl.stats, len(due))
    sources = {u.src for u in due}
    assert sources == set(group.ranks) - {src_of_frozen}, sources
    if bucket_mb:
        assert len(due) >= 8, due
        assert max(len(u.params) for u in due) >= 2, due
    else:
        assert all(len(u.params) == 1 for u in due), due
        trainable = sum(not p.stop_gradient for p in info["raw"].parameters())
        assert len(due) == trainable, (len(due), trainable)
    print(
        f"rank {rank()} sharding8 V1 bucket_size_mb={bucket_mb}: "
        f"{len(due)} broadcasts per step from {len(sources)} owners, "
        f"frozen rank {frozen} {layout[frozen]}, params per rank "
        f"{[len(layout[r]) for r in sorted(layout)]}, checker "
        f"{checker.counts}, stats {impl.stats}, "
        f"{time.monotonic() - start:.1f} s",
        flush=True,
    )


def case_v1_buckets_uneven_owners_frozen_rank():
    compare_v1(SMALL_BUCKET_MB)


def case_v1_per_parameter_uneven_owners_frozen_rank():
    compare_v1(0)


# ----------------------------------------------------------------------
# V2 on sharding8: tiny and odd sizes, a frozen comm buffer, padding
V2_HIDDEN, V2_VOCAB = 256, 64


class V2Tiny(nn.Layer):
    """Parameters of 5 and 201 elements (201 = 3 x 67)."""

    def __init__(self):
        super().__init__()
        self.gate = self.create_parameter([5])
        self.odd = self.create_parameter([3, 67])

    def forward(self, x):
        scale = 1.0 + 0.1 * paddle.tanh(self.gate).mean()
        return x * scale + 0.1 * self.odd.mean()


def V2LM():
    """About 3.3 MB of fp32 parameters: 4 comm buffers of 1 MB."""
    return UnevenLM(V2_VOCAB, V2_HIDDEN, V2_VOCAB, V2Tiny)


def v2_batch(step):
    return batch(step, V2_VOCAB, V2_VOCAB)


def buffer_layout(raw, inner):
    """[[structured names] per comm buffer], in Paddle's buffer order."""
    name = names_of(raw)
    return [[name[id(p)] for p in b._params] for b in inner._comm_buffer_list]


def frozen_buffer(layout):
    """The last buffer holding neither the embedding nor a tiny parameter
    (it is frozen whole)."""
    for b in reversed(range(len(layout))):
        if not any(n.startswith(("embed.", "tiny.")) for n in layout[b]):
            return b
    raise AssertionError(f"no buffer to freeze in {layout}")


def shard_fill(buffer, group):
    """(real elements, padding) of this rank's shard of ``buffer``."""
    total = int(buffer.param_storage._numel())
    shard = total // group.nranks
    begin = shard * max(group.rank, 0)
    end = begin + shard
    real = 0
    for p in buffer._params:
        start = buffer._sharding_param_grad_view[p.name]._index
        stop = start + int(p._numel())
        real += max(0, min(stop, end) - max(start, begin))
    return real, shard - real


def train_v2(overlap, checker=None):
    raw = build_same(V2LM)
    with training.sharding_v2(V2_BUFFER_MB):
        opt = fleet.distributed_optimizer(adamw(raw.parameters()))
        model = fleet.distributed_model(raw)
    inner = inner_of(opt, "DygraphShardingOptimizerV2")
    layout = buffer_layout(raw, inner)
    frozen = frozen_buffer(layout)
    for p in inner._comm_buffer_list[frozen]._params:
        p.stop_gradient = True
    initial = snapshot(raw)
    if overlap:
        # as PaddleFormers calls it (two arguments)
        opt._set_all_gather_overlap_forward(True, model)
        assert overlap_impl(opt) is not None, "no overlap owner on V2"
    if checker is not None:
        checker.watch(model, opt)
    losses = []
    for step in range(STEPS):
        tokens, labels = v2_batch(step)
        loss = F.cross_entropy(model(tokens), labels).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        if checker is not None:
            checker.hooks_last()
        losses.append(loss.numpy().copy())
    info = dict(raw=raw, opt=opt, inner=inner, layout=layout, frozen=frozen)
    return (losses, snapshot(raw)), initial, info


def case_v2_odd_sizes_frozen_buffer_uneven_padding():
    start = time.monotonic()
    off, _, off_info = train_v2(False)
    with BroadcastWaitChecker() as checker:
        on, initial, info = train_v2(True, checker)
    inner = info["inner"]
    group = inner._hcg.get_sharding_parallel_group()
    buffers = inner._comm_buffer_list
    fills = [shard_fill(b, group) for b in buffers]
    # collectives first, on every rank, then the assertions
    ranks_equal = equal_in_group(digests(on[1]), group)
    padding_by_rank = gather_ints([pad for _, pad in fills], group)
    assert_bitwise_equal(off, on, "sharding8 V2")
    check_waits(checker)
    assert ranks_equal, "parameters differ across the sharding group"
    layout, frozen = info["layout"], info["frozen"]
    assert layout == off_info["layout"] and frozen == off_info["frozen"]
    assert len(buffers) >= 3, f"{len(buffers)} comm buffers: {layout}"
    sizes = {n: p.size for n, p in on[1].items()}
    assert min(sizes.values()) < 8, sizes
    assert any(s % 8 for s in sizes.values()), sizes
    # the frozen buffer: its parameters never changed, it was never gathered
    frozen_names = set(layout[frozen])
    for name in frozen_names:
        assert on[1][name].tobytes() == initial[name].tobytes(), name
    gathered = {id(p) for task in checker.gather_log for p in task.params}
    assert not any(
        id(p) in gathered for p in buffers[frozen]._params
    ), f"frozen comm buffer {frozen} was gathered"
    impl = overlap_impl(info["opt"])
    due = [u for u in impl.units if u.needs_sync()]
    assert len(due) == len(buffers) - 1, (len(due), len(buffers))
    assert impl.stats["launched"] == STEPS * len(due), impl.stats
    # each rank's shards hold a different share of padding
    assert len({tuple(p) for p in padding_by_rank}) > 1, padding_by_rank
    print(
        f"rank {rank()} sharding8 V2: {len(buffers)} comm buffers "
        f"(frozen: {frozen}), padding per rank and buffer "
        f"{padding_by_rank}, checker {checker.counts}, stats {impl.stats}, "
        f"{time.monotonic() - start:.1f} s",
        flush=True,
    )


# ----------------------------------------------------------------------
# pp2_sharding4: a pipeline with a tied embedding/head, V1 buckets
PP_VOCAB, PP_HIDDEN = 32, 16


class EmbPipe(nn.Layer):
    def __init__(self):
        super().__init__()
        self.embedding_weight = self.create_parameter([PP_VOCAB, PP_HIDDEN])

    def forward(self, tokens):
        return F.embedding(tokens, self.embedding_weight)


class BlockPipe(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(PP_HIDDEN, PP_HIDDEN)

    def forward(self, x):
        return paddle.tanh(self.fc(x))


def tied_head(emb, x):
    """PaddleNLP's tied LM head: reads the shared weight without calling
    the shared layer (on the last stage it is never called)."""
    return paddle.matmul(x, emb.embedding_weight, transpose_y=True)


def pp_loss(logits, labels):
    return F.cross_entropy(logits, labels).mean()


def pipeline_model():
    from paddle.distributed.fleet.meta_parallel import (
        LayerDesc,
        PipelineLayer,
        SharedLayerDesc,
    )

    descs = [
        SharedLayerDesc("embed", EmbPipe, shared_weight_attr="embedding_weight")
    ]
    descs += [LayerDesc(BlockPipe) for _ in range(4)]
    descs.append(
        SharedLayerDesc(
            "embed",
            EmbPipe,
            forward_func=tied_head,
            shared_weight_attr="embedding_weight",
        )
    )
    hcg = fleet.get_hybrid_communicate_group()
    paddle.seed(2026 + hcg.get_stage_id())
    return PipelineLayer(layers=descs, topology=hcg.topology(), loss_fn=pp_loss)


_PP_INITIAL = {}


def pp_data(step):
    """The same on both stages of a pipeline, different per sharding rank."""
    hcg = fleet.get_hybrid_communicate_group()
    rng = np.random.RandomState(
        1000 * step + 7 * hcg.get_sharding_parallel_rank()
    )
    tokens = rng.randint(0, PP_VOCAB, size=(BATCH, SEQ)).astype("int64")
    labels = rng.randint(0, PP_VOCAB, size=(BATCH, SEQ, 1)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def train_pp(overlap, checker=None):
    raw = pipeline_model()
    if not _PP_INITIAL:
        _PP_INITIAL.update(snapshot(raw))
    else:  # the first build's weights: off and on start equal
        raw.set_state_dict(
            {k: paddle.to_tensor(v) for k, v in _PP_INITIAL.items()}
        )
    opt = fleet.distributed_optimizer(adamw(raw.parameters()))
    model = fleet.distributed_model(raw)
    if overlap:
        opt._set_broadcast_overlap(
            True, layers=model, bucket_size_mb=SMALL_BUCKET_MB / 8
        )
    if checker is not None:
        checker.watch(model, opt)
    losses = []
    for step in range(STEPS):
        loss = model.train_batch(list(pp_data(step)), opt)
        losses.append(np.array(loss.numpy()).copy())
    return (losses, snapshot(raw)), dict(raw=raw, opt=opt)


def case_pipeline_tied_embedding_head_buckets():
    start = time.monotonic()
    off, _ = train_pp(False)
    with BroadcastWaitChecker() as checker:
        on, info = train_pp(True, checker)
    hcg = fleet.get_hybrid_communicate_group()
    # collectives first, on every rank, then the assertions
    sharding_equal = equal_in_group(
        digests(on[1]), hcg.get_sharding_parallel_group()
    )
    tied = [k for k in on[1] if k.endswith("embedding_weight")]
    assert len(tied) == 1, sorted(on[1])
    tied_equal = equal_in_group(
        digests({k: on[1][k] for k in tied}), hcg.get_pipe_parallel_group()
    )
    assert_bitwise_equal(off, on, "pp2_sharding4 V1 tied")
    check_waits(checker)
    assert sharding_equal, "parameters differ across the sharding group"
    assert tied_equal, "the tied weight differs between the two stages"
    impl = overlap_impl(info["opt"])
    due = [u for u in impl.units if u.needs_sync()]
    assert len({u.src for u in due}) == 4, [(u.label, u.src) for u in due]
    if hcg.is_last_stage:
        # tied_head read the shared weight while its broadcast could be
        # pending and waited for it there (the shared layer never runs)
        assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)
    print(
        f"rank {rank()} pp2_sharding4 stage {hcg.get_stage_id()}: "
        f"{len(due)} broadcasts per step, checker {checker.counts}, "
        f"stats {impl.stats}, read paths {dict(impl.read_paths)}, "
        f"{time.monotonic() - start:.1f} s",
        flush=True,
    )


# ----------------------------------------------------------------------
def launch_cases():
    """The cases of this launch's topology."""
    cases = cases_of(globals())
    pipeline = TOPOLOGY == "pp2_sharding4"
    return {
        k: v for k, v in cases.items() if k.startswith("pipeline") == pipeline
    }


def init():
    init_fleet()
    print(
        f"param sync scale: Paddle {paddle.__version__}, {TOPOLOGY}, "
        f"{paddle.distributed.get_world_size()} ranks",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(training.run_cases(launch_cases(), init))
