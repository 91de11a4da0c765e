"""In-process tests of the owner's schedule (every unit starts inside
launch(), on every rank, in the agreed order; hooks and reads only wait),
owners in creation order, the order warning, profiler spans and V2
all-gather units (fakes of ``owner_fakes.py``, exact event lists)."""

import warnings

import paddle
import pytest
from owner_fakes import (
    CHAIN_NAMES,
    V2,
    Chain,
    FakeGroup,
    Net,
    RecordingComm,
    X,
    chain_buffers,
    make_gather_owner,
    make_owner,
    names_of,
    next_step,
    record_forwards,
    wait_before_update,
)

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    param_sync_overlap as pso,
    sync_registry,
    unit_plan,
)


def make(model, strict=False):
    """An owner one step in (order agreed, nothing pending)."""
    owner, comm = make_owner(model, strict=strict)
    model(X)
    owner.launch()
    wait_before_update(owner)
    comm.take()
    return owner, comm


def collectives(events):
    return [e for e in events if e[0] not in ("wait", "forward")]


# ----------------------------------------------------------------------
# schedule: everything starts in launch(), nothing anywhere else
@pytest.mark.parametrize("reverse", [False, True])
def test_launch_starts_every_unit_in_the_agreed_order(reverse):
    model = Chain()
    model.reverse = reverse
    owner, comm = make(model)
    owner.launch()
    expected = CHAIN_NAMES if not reverse else [
        f"{l}.{p}" for l in "dcba" for p in ("weight", "bias")
    ]
    assert comm.take() == [("broadcast", name, 0) for name in expected]
    assert owner.num_pending == 8 and owner.stats["launched"] == 16


def eval_forward(model):
    with paddle.no_grad():
        model(X)


READS = {
    "attribute": lambda m: m.c.weight,
    "numpy of an attribute": lambda m: m.d.bias.numpy(),
    "iteration": lambda m: list(m.c.parameters()),
    "state_dict": lambda m: m.state_dict(),
    "sublayer forward": lambda m: m.c(X),
    "eval forward": eval_forward,
    "forward": lambda m: m(X),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_hook_or_read_after_launch_only_waits(read):
    model = Chain()
    owner, comm = make(model)
    owner.launch()
    comm.take()
    READS[read](model)
    events = comm.take()
    assert events and {e[0] for e in events} == {"wait"}


def test_reads_on_one_rank_alone_leave_every_rank_the_same_collectives():
    """Rank 0 alone logs a weight and runs an eval forward between steps;
    both ranks then meet at a barrier: their collective sequences (what
    NCCL pairs) must be the same, or the barrier pairs with a broadcast."""
    ranks = []
    for alone in (True, False):
        model = Chain()
        owner, comm = make(model)
        owner.launch()
        if alone:
            model.c.weight.numpy()
            eval_forward(model)
        comm.events.append(("barrier",))
        model(X)
        log = comm.take()
        log += next_step(owner, comm)
        ranks.append(collectives(log))
    assert ranks[0] == ranks[1]
    assert ranks[0][:9] == [("broadcast", n, 0) for n in CHAIN_NAMES] + [("barrier",)]


def test_open_owners_are_listed_in_creation_order_not_opening_order():
    models = [Net() for _ in range(3)]
    owners = [
        pso.ParamSyncOverlap(
            list(m.parameters()),
            FakeGroup(),
            m,
            unit_plan.PerParameter([0] * 4),
            "_set_broadcast_overlap",
            comm=RecordingComm(names_of(m)),
        )
        for m in models
    ]
    for owner in reversed(owners):
        owner.open()
    assert sync_registry.open_owners() == owners
    owners[1].close()
    assert sync_registry.open_owners() == [owners[0], owners[2]]


def double(x):
    return x * 2


def test_compiled_program_waits_every_owner_in_creation_order():
    first, second = Chain(), Net()
    comm = RecordingComm({**names_of(first), **names_of(second)})
    owners = [make_owner(m, comm=comm)[0] for m in (first, second)]
    for model, owner in zip((first, second), owners):
        model(X)
        owner.launch()
    comm.take()
    paddle.jit.to_static(double, full_graph=True)(X)
    waits = [e[1] for e in comm.take()]
    assert waits == CHAIN_NAMES + ["first.weight", "first.bias", "second.weight", "second.bias"]
    assert [o.stats["waited_in_program"] for o in owners] == [8, 4]


def test_a_shared_parameter_pending_on_another_owner_is_waited_by_its_launch():
    model = Net()
    comm = RecordingComm(names_of(model))
    owner1, _ = make_owner(model, params=list(model.first.parameters()), comm=comm)
    owner2, _ = make_owner(model, comm=comm)
    model(X)
    owner1.launch()
    assert comm.take()[2:] == [("broadcast", "first.weight", 0), ("broadcast", "first.bias", 0)]
    owner2.launch()
    assert comm.take()[2:] == [
        ("wait", "first.weight"),  # owner1's, before owner2 sends it again
        ("wait", "first.bias"),
        ("broadcast", "first.weight", 0),
        ("broadcast", "first.bias", 0),
        ("broadcast", "second.weight", 0),
        ("broadcast", "second.bias", 0),
    ]
    assert owner1.stats["waited_by_other_owner"] == 2
    assert owner2.stats["waited_by_other_owner"] == 0
    assert owner1.num_pending == 0 and owner2.num_pending == 4
    model.first.weight  # the registry points at owner2's unit now
    assert comm.take() == [("wait", "first.weight")]
    assert owner2.stats["waited_on_read"] == 1


# ----------------------------------------------------------------------
# order warning
def order_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "another order" in str(w.message)]


def test_training_forward_in_another_order_warns_once_naming_the_layer():
    model = Chain()
    owner, comm = make(model)
    model.reverse = True
    owner.launch()
    (message,) = order_warnings(lambda: model(X))
    assert message.startswith("parameter sync overlap (_set_broadcast_overlap): ")
    assert model.d._full_name in message
    assert model.d.weight.name in message and model.a.weight.name in message
    assert owner.stats["waited_out_of_order"] > 0
    next_step(owner, comm)
    assert order_warnings(lambda: model(X)) == []  # once per owner


@pytest.mark.parametrize("how", ["eval", "no_grad", "helper", "second_forward"])
def test_no_warning_outside_the_first_training_forward(how):
    model = Chain()
    owner, comm = make(model)
    owner.launch()

    def run():
        if how == "eval":
            model.eval()
            model.reverse = True
            model(X)
        elif how == "no_grad":
            model.reverse = True
            with paddle.no_grad():
                model(X)
        elif how == "helper":  # a helper calling a sublayer between steps
            model.d(X)
        else:  # micro-batch 2 / recompute: after the first root forward
            model.depth = 2  # a, b: in order
            model(X)
            model.reverse, model.depth = True, 4
            model(X)

    assert order_warnings(run) == []
    assert owner.stats["waited_out_of_order"] > 0  # seen, just not said


def test_forward_in_the_agreed_order_never_counts_out_of_order():
    model = Chain()
    owner, comm = make(model)
    for _ in range(3):
        owner.launch()
        model(X)
        wait_before_update(owner)
    assert owner.stats["waited_out_of_order"] == 0


# ----------------------------------------------------------------------
# profiler spans
def test_launch_and_waits_are_profiler_spans(monkeypatch):
    spans = []

    class Span:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            spans.append(self.name)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(pso.paddle.profiler, "RecordEvent", Span)
    model = Chain()
    owner, comm = make(model)
    spans.clear()
    owner.launch()
    model.a(X)
    assert spans == [
        "ParamSyncOverlap::launch",
        f"ParamSyncOverlap::wait {model.a.weight.name}",
        f"ParamSyncOverlap::wait {model.a.bias.name}",
    ]


def test_spans_show_on_a_paddle_profiler_timeline():
    import paddle.profiler as profiler

    model = Chain()
    owner, comm = make(model)
    seen = []
    with profiler.Profiler(
        targets=[profiler.ProfilerTarget.CPU],
        on_trace_ready=lambda prof: seen.append(prof),
    ) as prof:
        owner.launch()
        model(X)
        prof.step()
    # the spans are recorded host events of the profiler's result
    names = set()

    def walk(node):
        names.add(node.name)
        for child in node.children_node:
            walk(child)

    for tree in seen[0].profiler_result.get_data().values():
        walk(tree)
    assert "ParamSyncOverlap::launch" in names
    assert f"ParamSyncOverlap::wait {model.a.weight.name}" in names


# ----------------------------------------------------------------------
# V2: one all-gather per comm buffer, in first-use order, all in flight
def test_v2_buffers_are_gathered_in_first_use_order_all_at_launch():
    model = Chain()
    # Paddle's layout: buffer 0 holds d, buffer 1 holds a and c, buffer 2 b
    buffers = chain_buffers(model)
    owner, comm = make_gather_owner(model, buffers)
    assert (owner.method, owner.collective) == (V2, "all-gather")
    model(X)
    owner.launch()
    assert comm.take()[2:] == [
        ("all_gather", "buf1"),  # a is used first
        ("all_gather", "buf2"),
        ("all_gather", "buf0"),
    ]
    assert owner.num_pending == 3
    record_forwards(model, comm)
    model(X)
    assert [e for e in comm.take() if e[0] != "forward"] == [
        ("wait", "buf1"),
        ("wait", "buf2"),
        ("wait", "buf0"),
    ]
    # rank 1 contributes the second half of each buffer
    assert comm.shards[0] == ("buf1", 20, 20 * 4)
    assert owner.stats["waited_out_of_order"] == 0


def test_v2_frozen_only_buffer_is_skipped():
    model = Chain()
    buffers = chain_buffers(model, layout=(("a",), ("b", "c", "d")))
    owner, comm = make_gather_owner(model, buffers)
    model(X)
    model.a.weight.stop_gradient = model.a.bias.stop_gradient = True
    owner.launch()
    assert collectives(comm.take())[2:] == [("all_gather", "buf1")]
    model.a.weight.stop_gradient = model.a.bias.stop_gradient = False
    assert next_step(owner, comm) == [("all_gather", "buf0"), ("all_gather", "buf1")]


def test_v2_cleared_storage_is_refused_by_name_before_anything_is_sent():
    model = Chain()
    buffers = chain_buffers(model, layout=(("a",), ("b", "c", "d")))
    owner, comm = make_gather_owner(model, buffers)
    model(X)
    owner.launch()
    wait_before_update(owner)
    comm.take()
    storage = buffers[1].param_storage
    numel = int(storage._numel())
    # what clear_param_storage does (3.x); _clear_data frees it on 2.6 too
    getattr(storage, "_clear_to_zero_allocation", storage._clear_data)()
    with pytest.raises(RuntimeError, match="comm_buffer1 holds no memory.*rebuild.*Nothing was sent"):
        owner.launch()
    assert comm.take() == []  # checked for every unit before the first starts
    # Paddle's reset_param_storage shares new memory into the same tensor
    paddle.zeros([numel])._share_buffer_to(storage)
    assert next_step(owner, comm) == [("all_gather", "buf0"), ("all_gather", "buf1")]
    model(X)
    assert owner.num_pending == 0
