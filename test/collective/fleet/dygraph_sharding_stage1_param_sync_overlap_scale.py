# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: the parameter sync overlap on 8 ranks.

Env ``PARAM_SYNC_SCALE_TOPOLOGY`` (``fleet.init`` runs once per process): ``sharding8`` (the V1 and V2 cases) or
``pp2_sharding4`` (the pipeline case). Every case is ``cases.compare_on_off`` (bitwise equal off and on, the waits
checked), the final parameters equal on every rank of the sharding group, then the case's own checks."""

import functools
import os
import sys

import dygraph_sharding_stage1_broadcast_overlap_hybrid as hybrid
import sharding_cases as cases

import paddle
from paddle import nn

TOPOLOGY = os.environ.get("PARAM_SYNC_SCALE_TOPOLOGY", "sharding8")
DEGREES = {"sharding8": dict(sharding_degree=8), "pp2_sharding4": dict(pp_degree=2, sharding_degree=4)}
STEPS = 3
BATCH = 4  # (pipeline micro-batches of 2)
# 4 KB buckets: the V1 model's order closes a window after each of its 8 KB linear weights and after the 64 KB
# embedding, so the tiny parameters of one owner share buckets between them
SMALL_BUCKET_MB = 0.004
HIDDEN, VOCAB, CLASSES = 32, 512, 16  # V1
V2_HIDDEN, V2_VOCAB = 256, 64  # about 3.3 MB of fp32: 4 comm buffers


def init_fleet():
    world = paddle.distributed.get_world_size()
    assert world == 8, f"this script runs on 8 ranks, got {world}"
    cases.init_fleet(DEGREES[TOPOLOGY], micro_batch=BATCH // 2)
    print(f"param sync scale: Paddle {paddle.__version__}, {TOPOLOGY}, {world} ranks", flush=True)


def names_of(raw):
    return {id(p): n for n, p in raw.named_parameters()}


def sharding_group():
    return hybrid.hcg().get_sharding_parallel_group()


# ----------------------------------------------------------------------
# sharding8 models: uneven owners (V1), tiny and odd sizes (V2)
class Tiny(nn.Layer):
    """Parameters of 5 and ``odd`` elements and, with ``one``, of 1 (sizes not divisible by 8)."""

    def __init__(self, odd=(13,), one=True):
        super().__init__()
        self.gate = self.create_parameter([5])
        self.odd = self.create_parameter(list(odd))
        self.one = self.create_parameter([1]) if one else None

    def forward(self, x):
        scale = 1.0 + 0.1 * paddle.tanh(self.gate).mean()
        x = x * scale + 0.1 * self.odd.mean()
        return x if self.one is None else x + self.one


class UnevenLM(nn.Layer):
    """With the defaults: an embedding of 16384 elements (Paddle's greedy partition gives it one rank alone), 3 blocks
    whose 2048-element weights get one rank each, a head and three tiny parameters: the last rank owns the 17 small
    ones."""

    def __init__(self, vocab=VOCAB, hidden=HIDDEN, out=CLASSES, tiny=Tiny):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.tiny = tiny()
        self.blocks = nn.LayerList([cases.Block(hidden) for _ in range(3)])
        self.head = nn.Linear(hidden, out)

    def forward(self, tokens):
        x = self.tiny(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def V2LM():
    """Parameters of 5 and 201 (= 3 x 67) elements among 1 MB buffers."""
    return UnevenLM(V2_VOCAB, V2_HIDDEN, V2_VOCAB, lambda: Tiny((3, 67), False))


def batch(step, vocab=VOCAB, classes=CLASSES):
    tokens, labels = cases.batch(step, vocab=vocab)
    return tokens, labels % classes


def compare_frozen(build, *, freeze, enable, data=batch, **kwargs):
    """``cases.compare_on_off`` of STEPS steps on ``data(step)``, the final parameters equal across the sharding group;
    ``freeze(raw, inner)`` freezes parameters once the optimizer is built, before ``enable(run)``, and returns
    ``(layout, frozen)`` (on the run). Off and on froze the same, the frozen parameters ended as they started, each unit
    needing a sync launched once per step. Returns (checker, on run, owner, units needing a sync)."""

    def built(run):
        run.layout, run.frozen = freeze(run.raw, cases.sharding_optimizer(run.opt))
        run.initial = cases.snapshot(run.raw)

    micro_step = functools.partial(hybrid.backward, data=data)
    checker, on = cases.compare_on_off(
        build, replicas=sharding_group(), steps=STEPS, built=built, enable=enable, micro_step=micro_step, **kwargs
    )
    assert (on.layout, on.frozen) == (on.off.layout, on.off.frozen)
    final = cases.snapshot(on.raw)
    for name in on.layout[on.frozen]:
        assert final[name].tobytes() == on.initial[name].tobytes(), name
    impl = cases.overlap_impl(on.opt)
    due = [u for u in impl.units if u.needs_sync()]
    assert impl.stats["launched"] == STEPS * len(due), (impl.stats, len(due))
    print(f"rank {cases.rank()}: checker {checker.counts}, stats {impl.stats}")
    return checker, on, impl, due


# ----------------------------------------------------------------------
# V1 on sharding8: very different loads, a rank owning only frozen ones
def freeze_rank(raw, inner):
    """Freezes the parameters of the first rank (from the middle of the group) that owns neither the biggest parameter nor
    the most; returns ({sharding rank: [structured names]} of Paddle's partition, that rank)."""
    name = names_of(raw)
    layout = {r: [name[id(p)] for p in ps] for r, ps in inner._rank2params.items()}
    counts = {r: len(ns) for r, ns in layout.items()}
    busiest = max(counts, key=counts.get)
    biggest = next(r for r, ns in layout.items() if "embed.weight" in ns)
    n = len(layout)
    for r in [(n // 2 + k) % n for k in range(n)]:
        if r not in (busiest, biggest) and counts[r] > 0:
            for p in inner._rank2params[r]:
                p.stop_gradient = True
            return layout, r
    raise AssertionError(f"no rank to freeze in {layout}")


def compare_v1(bucket_mb):
    _, on, _, due = compare_frozen(UnevenLM, freeze=freeze_rank, enable=cases.v1(bucket_mb))
    group, layout, frozen = sharding_group(), on.layout, on.frozen
    assert len(layout) == paddle.distributed.get_world_size(), layout
    # very different loads: one rank holds the embedding alone, another holds many small parameters
    assert ["embed.weight"] in layout.values(), layout
    assert max(len(ns) for ns in layout.values()) >= 10, layout
    # every owner but the frozen rank broadcast, the frozen rank nothing
    sources = [u.src for u in due]
    assert set(sources) == set(group.ranks) - {group.ranks[frozen]}, sources
    if bucket_mb:
        assert len(due) >= 8, due
        assert max(len(u.params) for u in due) >= 2, due
    else:
        assert all(len(u.params) == 1 for u in due), due
        trainable = sum(not p.stop_gradient for p in on.raw.parameters())
        assert len(due) == trainable, (len(due), trainable)
    print(f"rank {cases.rank()}: frozen rank {frozen} {layout[frozen]}, {layout}")


def case_v1_buckets_uneven_owners_frozen_rank():
    """V1, 4 KB buckets: uneven owners and a rank owning only frozen ones."""
    compare_v1(SMALL_BUCKET_MB)


def case_v1_per_parameter_uneven_owners_frozen_rank():
    """V1, one broadcast per parameter: the same model and frozen rank."""
    compare_v1(0)


# ----------------------------------------------------------------------
# V2 on sharding8: tiny and odd sizes, a frozen comm buffer, padding
def freeze_buffer(raw, inner):
    """Freezes the last comm buffer holding neither the embedding nor a tiny parameter; returns ([[structured names] per
    buffer], that buffer)."""
    name = names_of(raw)
    buffers = inner._comm_buffer_list
    layout = [[name[id(p)] for p in b._params] for b in buffers]
    for b in reversed(range(len(layout))):
        if not any(n.startswith(("embed.", "tiny.")) for n in layout[b]):
            for p in buffers[b]._params:
                p.stop_gradient = True
            return layout, b
    raise AssertionError(f"no buffer to freeze in {layout}")


def padding_per_rank(run):
    """Each group rank's padding per comm buffer (every rank calls it)."""
    group, pads = sharding_group(), []
    for buffer in cases.sharding_optimizer(run.opt)._comm_buffer_list:
        shard = int(buffer.param_storage._numel()) // group.nranks
        begin = shard * max(group.rank, 0)
        real = 0
        for p in buffer._params:
            start = buffer._sharding_param_grad_view[p.name]._index
            stop = start + int(p._numel())
            real += max(0, min(stop, begin + shard) - max(start, begin))
        pads.append(shard - real)
    gathered = []
    paddle.distributed.all_gather(gathered, paddle.to_tensor(pads, dtype="int64"), group=group)
    run.padding = [g.numpy().tolist() for g in gathered]


def case_v2_odd_sizes_frozen_buffer_uneven_padding():
    """V2 (1 MB comm buffers): parameters of 5 and 201 elements, a frozen buffer never gathered, per-rank padding that
    differs."""
    checker, on, _, due = compare_frozen(
        cases.Build(V2LM, around=cases.sharding_v2),
        freeze=freeze_buffer,
        enable=cases.v2,
        data=lambda step: batch(step, V2_VOCAB, V2_VOCAB),
        final=padding_per_rank,
    )
    buffers = cases.sharding_optimizer(on.opt)._comm_buffer_list
    layout, frozen = on.layout, on.frozen
    assert len(buffers) >= 3, f"{len(buffers)} comm buffers: {layout}"
    sizes = {n: p.size for n, p in on.params.items()}
    assert min(sizes.values()) < 8, sizes
    assert any(s % 8 for s in sizes.values()), sizes
    # the frozen buffer was never gathered
    gathered = {id(p) for task in checker.gather_log for p in task.params}
    assert not any(id(p) in gathered for p in buffers[frozen]._params), f"frozen comm buffer {frozen} was gathered"
    assert len(due) == len(buffers) - 1, (len(due), len(buffers))
    # each rank's shards hold a different share of padding
    assert len({tuple(p) for p in on.padding}) > 1, on.padding
    print(f"rank {cases.rank()}: frozen buffer {frozen}, padding {on.padding}")


# ----------------------------------------------------------------------
# pp2_sharding4: the hybrid script's pipeline with a tied embedding/head
def case_pipeline_tied_embedding_head_buckets():
    """pp2 x sharding4 (4 blocks: every sharding rank owns parameters), V1 buckets, a tied embedding/head: the tied weight
    equal on both stages; the last stage's head waited on the attribute."""
    hcg = hybrid.hcg()

    def tied_equal(run):  # collectives before compare_on_off's assertions
        run.tied = {k: v for k, v in cases.snapshot(run.model).items() if k.endswith("embedding_weight")}
        run.tied_equal = cases.equal_in_group(cases.digests(run.tied), hcg.get_pipe_parallel_group())

    checker, on = hybrid.compare(
        lambda: hybrid.pipeline_model(tied=True, blocks=4), enable=cases.v1(SMALL_BUCKET_MB / 8), final=tied_equal
    )
    assert len(on.tied) == 1, sorted(on.params)
    assert on.tied_equal, "the tied weight differs between the two stages"
    impl = cases.overlap_impl(on.opt)
    due = [u for u in impl.units if u.needs_sync()]
    assert len({u.src for u in due}) == 4, [(u.label, u.src) for u in due]
    if hcg.is_last_stage:
        # tied_head read the shared weight while its broadcast could be pending and waited for it there (the shared
        # layer never runs)
        assert impl.read_paths["attribute"] > 0, dict(impl.read_paths)


def case_pipeline_shared_weight_owners_differ_synced():
    """pp2 x sharding4, pp_configs.sync_param: the tied embedding/head's sharding owner differs between the stages
    (asserted), V1 per parameter; bitwise equal to off with the same equality pattern, the shared weight's unit first
    and waited before Paddle's sync (the hybrid script's check). Paddle 2.6 has no pp_configs.sync_param: asserted
    there."""
    if hybrid.pp_sync_missing():
        return
    with cases.pp_configs(sync_param=True):
        hybrid.compare_hybrid_synced(hybrid.owner_shift_pipeline, *hybrid.SHARED_SYNCED)


# ----------------------------------------------------------------------
def launch_cases():
    """The cases of this launch's topology."""
    found = cases.cases_of(globals())
    return {k: v for k, v in found.items() if k.startswith("pipeline") == (TOPOLOGY == "pp2_sharding4")}


if __name__ == "__main__":
    sys.exit(cases.run_cases(launch_cases(), init_fleet))
