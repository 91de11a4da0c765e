"""In-process tests of what Paddle's own step code reads after the update
(``HybridParallelOptimizer._step``'s model- and pipeline-parallel syncs):
the parameters it syncs are planned into the first units (agreed with the
order), ``_insert_sync`` waits for exactly their unit first; V2's plan
follows ``rebuild()``; a launch that raised part way is refused at the next
update (fakes of ``owner_fakes.py``, exact event lists)."""

import paddle
import pytest
from owner_fakes import (
    CHAIN_NAMES,
    Chain,
    FakeBuffer,
    GatherGroup,
    X,
    chain_buffers,
    make_bucket_owner,
    make_gather_owner,
    make_owner,
    next_step,
    wait_before_update,
)

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_buckets,
    param_sync_overlap as pso,
)


def agreed_launch(owner, comm, model, lead=()):
    """The first step with ``lead`` (parameters) planned first; its
    collectives (the agreement's two messages included)."""
    model(X)
    owner.lead_with(lead)
    owner.launch()
    return [e for e in comm.take() if e[0] != "wait"]


def test_lead_is_sent_with_the_order_and_its_units_start_first():
    model = Chain()
    owner, comm = make_owner(model)
    events = agreed_launch(owner, comm, model, [model.c.weight, model.a.bias])
    # positions a.w 0, a.b 1, ..., d.b 7: the lead sent as position + 8
    assert events[:2] == [("agree", [8]), ("agree", [0, 9, 2, 3, 12, 5, 6, 7])]
    first = ["a.bias", "c.weight"]  # the lead, in forward order
    rest = [n for n in CHAIN_NAMES if n not in first]
    assert events[2:] == [("broadcast", n, 0) for n in first + rest]
    assert owner.order == list(range(8)) and owner.lead == [1, 4]


def test_rank0s_lead_is_adopted():
    """The group's first rank decides the lead, as the order: a rank whose
    own set differs (here none) plans rank 0's."""
    model = Chain()
    owner, comm = make_owner(model, messages=[[8], [0, 1, 2, 3, 4, 5, 6, 15]])
    events = agreed_launch(owner, comm, model)
    assert owner.lead == [7]
    assert events[2] == ("broadcast", "d.bias", 0)


def test_lead_only_while_recording():
    model = Chain()
    owner, comm = make_owner(model)
    agreed_launch(owner, comm, model)
    with pytest.raises(RuntimeError, match="expected one of \\['recording'\\]"):
        owner.lead_with([model.a.weight])
    assert owner.lead == []


def test_plan_hybrid_synced_first_reads_the_parameters_only_before_planning():
    model = Chain()
    owner, comm = make_owner(model)
    optimizer = type("Opt", (), {})()
    vars(optimizer)["_param_sync_overlap"] = owner
    asked = []

    def synced():
        asked.append(1)
        return [model.d.weight]

    model(X)
    pso.plan_hybrid_synced_first(optimizer, synced)
    owner.launch()
    pso.plan_hybrid_synced_first(optimizer, synced)  # planned: not asked
    assert asked == [1] and owner.lead == [6]


def test_buckets_never_span_the_lead_and_the_rest():
    model = Chain()
    owner, comm = make_bucket_owner(model, 1)  # one 1 MB window would hold all
    agreed_launch(owner, comm, model, [model.b.weight, model.b.bias])
    units = owner.units
    assert [u.indices for u in units] == [(2, 3), (0, 1, 4, 5, 6, 7)]
    assert units[0].label == "bucket0"


def test_windows_close_at_the_lead():
    params = [paddle.create_parameter([4], "float32") for _ in range(4)]
    specs = broadcast_buckets.plan_buckets(
        [2, 0, 1, 3], params, [0] * 4, 1 << 20, lead=1
    )
    assert [s.indices for s in specs] == [(2,), (0, 1, 3)]


def test_the_lead_is_waited_before_the_launch_returns():
    """Whatever code sends the lead on next (Paddle's ``_insert_sync``, or a
    trainer's replacement of it on the instance, as PaddleFormers 1.2.0
    sets one), the update returns with it synced."""
    model = Chain()
    owner, comm = make_owner(model)
    model(X)
    owner.lead_with([model.c.weight, model.a.bias])
    owner.launch()
    events = comm.take()
    started = [e[1] for e in events if e[0] == "broadcast"]
    assert events[-2:] == [("wait", "a.bias"), ("wait", "c.weight")], events
    assert started[:2] == ["a.bias", "c.weight"] and len(started) == 8
    assert owner.stats["waited_for_hybrid_sync"] == 2 and owner.num_pending == 6


def test_hybrid_sync_waits_for_its_parameter_only():
    """A parameter Paddle syncs that is not in the lead (a set rank 0
    did not plan): ``_insert_sync`` waits for its unit, and only it."""
    model = Chain()
    owner, comm = make_owner(model)
    weight = model.c.weight  # a reference, as the optimizer's list holds
    agreed_launch(owner, comm, model)
    pso.wait_before_hybrid_sync(weight)
    pso.wait_before_hybrid_sync(paddle.ones([1]))  # no sync of it: nothing
    assert comm.take() == [("wait", "c.weight")]
    assert owner.stats["waited_for_hybrid_sync"] == 1
    assert owner.num_pending == 7


def test_paddles_insert_sync_waits_for_the_parameter_before_it_sends(monkeypatch):
    """The edit of ``HybridParallelOptimizer._insert_sync`` as applied: a
    parameter still pending (not in the lead) is waited, then Paddle's own
    body broadcasts it over the model-parallel group."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        hybrid_parallel_optimizer as hpo,
    )

    model = Chain()
    owner, comm = make_owner(model)
    weight = model.b.weight  # a reference, as the optimizer's list holds (an attribute read waits)
    agreed_launch(owner, comm, model)
    sent = []
    monkeypatch.setattr(
        paddle.distributed, "broadcast",
        lambda tensor, src, group, sync_op: sent.append((comm.name_of(tensor), src, group, sync_op))
        or comm.events.append(("mp broadcast", comm.name_of(tensor))),
    )
    optimizer = object.__new__(hpo.HybridParallelOptimizer)  # only the method is used
    optimizer._insert_sync(weight, 3, "mp group", "broadcast")
    assert comm.take() == [("wait", "b.weight"), ("mp broadcast", "b.weight")]
    assert sent == [("b.weight", 3, "mp group", True)]
    assert owner.stats["waited_for_hybrid_sync"] == 1 and owner.num_pending == 7


def test_v2_plan_follows_rebuilt_buffers():
    model = Chain()
    buffers = chain_buffers(model)
    owner, comm = make_gather_owner(model, buffers)
    model(X)
    owner.launch()
    assert [e for e in comm.take() if e[0] == "all_gather"] == [
        ("all_gather", "buf1"),
        ("all_gather", "buf2"),
        ("all_gather", "buf0"),
    ]
    # what rebuild() does: a new list of new buffers (here one of all)
    params = [p for b in buffers for p in b._params]
    rebuilt = [FakeBuffer(params, GatherGroup())]
    comm._buffer_names[id(rebuilt[0].param_storage)] = "rebuilt"
    buffers[:] = rebuilt
    assert next_step(owner, comm) == [("all_gather", "rebuilt")]
    assert [u.tensor for u in owner.units] == [rebuilt[0].param_storage]


def test_launch_that_raised_part_way_is_refused_at_the_next_update():
    model = Chain()
    owner, comm = make_owner(model)
    model(X)
    owner.launch()
    wait_before_update(owner)
    broadcast = comm.broadcast
    calls = []

    def fail_third(tensor, src, group, sync_op):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected")
        return broadcast(tensor, src, group, sync_op)

    comm.broadcast = fail_third
    with pytest.raises(RuntimeError, match="injected"):
        owner.launch()
    with pytest.raises(RuntimeError, match="raised while starting its parameter broadcasts"):
        owner.before_update()
    assert owner.num_pending == 2  # nothing waited by the refusal
