"""In-process tests of the owner's launch depth, order warning, profiler
spans and V2 all-gather units (recording comm, exact event lists)."""

import warnings

import paddle
import pytest

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_overlap as bo,
)
from test_broadcast_overlap_owner import (  # noqa: F401  (no_leftovers: autouse)
    FakeGroup,
    FakeTask,
    RecordingComm,
    names_of,
    no_leftovers,
    record_forwards,
)

X = paddle.ones([2, 4])


class Chain(paddle.nn.Layer):
    """Four linears used in construction order a, b, c, d."""

    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(4, 4)
        self.b = paddle.nn.Linear(4, 4)
        self.c = paddle.nn.Linear(4, 4)
        self.d = paddle.nn.Linear(4, 4)
        self.reverse = False

    def forward(self, x):
        layers = [self.a, self.b, self.c, self.d]
        for layer in reversed(layers) if self.reverse else layers:
            x = layer(x)
        return x


def make(model, max_in_flight=None, strict=False):
    params = list(model.parameters())
    comm = RecordingComm(names_of(model))
    owner = bo.StageOneBroadcastOverlap(
        params, [0] * len(params), FakeGroup(), model, strict, comm=comm,
        max_in_flight=max_in_flight,
    )
    owner.open()
    model(X)
    owner.launch()
    comm.take()
    owner.wait_before_update()
    comm.take()
    return owner, comm


def broadcasts(events):
    return [e[1] for e in events if e[0] == "broadcast"]


def test_depth_one_starts_the_next_as_each_wait_completes():
    model = Chain()
    owner, comm = make(model, max_in_flight=1)
    owner.launch()
    assert comm.take() == [("broadcast", "a.weight", 0)]
    record_forwards(model, comm)
    model(X)
    events = comm.take()
    # a.weight waited -> a.bias started; the wait of a.bias starts b.weight ...
    assert events[:5] == [
        ("forward", "<root>"),
        ("wait", "a.weight"),
        ("broadcast", "a.bias", 0),
        ("wait", "a.bias"),
        ("broadcast", "b.weight", 0),
    ]
    assert broadcasts(events) == [f"{l}.{p}" for l in "abcd" for p in ("weight", "bias")][1:]
    assert owner.num_pending == 0


def test_depth_two_keeps_two_in_flight():
    model = Chain()
    owner, comm = make(model, max_in_flight=2)
    owner.launch()
    assert broadcasts(comm.take()) == ["a.weight", "a.bias"]


def test_read_of_an_unstarted_unit_starts_every_unit_before_it_in_order():
    model = Chain()
    owner, comm = make(model, max_in_flight=1)
    owner.launch()
    comm.take()
    model.c.weight  # e.g. rank 0 alone saving c's weight right after step()
    events = comm.take()
    assert broadcasts(events) == ["a.bias", "b.weight", "b.bias", "c.weight"]
    assert events[-1] == ("wait", "c.weight")
    # the depth is kept afterwards: nothing more started until a wait
    assert owner.num_pending == 7


def test_all_units_at_the_step_when_depth_is_all():
    model = Chain()
    owner, comm = make(model, max_in_flight="all")
    owner.launch()
    assert len(broadcasts(comm.take())) == 8


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError), ("two", TypeError), (True, TypeError)])
def test_bad_depth_is_refused(bad, error):
    with pytest.raises(error, match="max_in_flight"):
        bo.check_max_in_flight(bad, 1)


def test_depth_from_the_environment(monkeypatch):
    monkeypatch.setenv(bo.MAX_IN_FLIGHT_ENV, "3")
    assert bo.check_max_in_flight(None, 1) == 3
    monkeypatch.setenv(bo.MAX_IN_FLIGHT_ENV, "all")
    assert bo.check_max_in_flight(None, 1) is None
    monkeypatch.setenv(bo.MAX_IN_FLIGHT_ENV, "0")
    with pytest.raises(ValueError, match=bo.MAX_IN_FLIGHT_ENV):
        bo.check_max_in_flight(None, 1)
    monkeypatch.delenv(bo.MAX_IN_FLIGHT_ENV)
    assert bo.check_max_in_flight(None, 1) == 1
    assert bo.check_max_in_flight(2, 1) == 2  # the keyword wins


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
    assert model.d._full_name in message
    assert model.d.weight.name in message and model.a.weight.name in message
    assert owner.stats["waited_out_of_order"] > 0
    owner.wait_before_update()
    owner.launch()
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
            model(X)
            owner.wait_before_update()
            for unit in owner.units:  # pending again, as if re-launched
                unit.mark_due(owner)
            owner._next_start = owner._first_unsynced = 0
            owner._start_more()
            model.reverse = True
            model(X)

    assert order_warnings(run) == []


def test_forward_in_the_agreed_order_never_counts_out_of_order():
    model = Chain()
    owner, comm = make(model, max_in_flight=1)
    for _ in range(3):
        owner.launch()
        model(X)
        owner.wait_before_update()
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

    monkeypatch.setattr(bo.paddle.profiler, "RecordEvent", Span)
    model = Chain()
    owner, comm = make(model)
    spans.clear()
    owner.launch()
    model.a(X)
    assert spans == [
        "paddle_overlay::launch",
        f"paddle_overlay::wait {model.a.weight.name}",
        f"paddle_overlay::wait {model.a.bias.name}",
    ]


def test_spans_show_on_a_paddle_profiler_timeline(tmp_path):
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
    assert "paddle_overlay::launch" in names
    assert f"paddle_overlay::wait {model.a.weight.name}" in names


# ----------------------------------------------------------------------
# V2: one all-gather per comm buffer, in first-use order
class FakeBuffer:
    def __init__(self, params, group):
        self._params = params
        self._comm_group = group
        numel = sum(int(p._numel()) for p in params)
        self.param_storage = paddle.zeros([numel + numel % 2], dtype="float32")


class GatherGroup(FakeGroup):
    nranks = 2
    rank = 1


class GatherComm(RecordingComm):
    def __init__(self, names, buffers):
        super().__init__(names)
        self._buffer_names = {id(b.param_storage): f"buf{k}" for k, b in enumerate(buffers)}
        self.shards = []

    def all_gather(self, shard, full, group):
        name = self._buffer_names[id(full)]
        self.shards.append((name, int(shard._numel()), shard.data_ptr() - full.data_ptr()))
        self.events.append(("all_gather", name))
        return FakeTask(self.events, name)


def test_v2_buffers_are_gathered_in_first_use_order_one_in_flight():
    model = Chain()
    group = GatherGroup()
    p = dict(model.named_parameters())
    # Paddle's layout: buffer 0 holds d, buffer 1 holds a and c, buffer 2 b
    buffers = [
        FakeBuffer([p["d.weight"], p["d.bias"]], group),
        FakeBuffer([p["a.weight"], p["a.bias"], p["c.weight"], p["c.bias"]], group),
        FakeBuffer([p["b.weight"], p["b.bias"]], group),
    ]
    params = list(model.parameters())
    comm = GatherComm(names_of(model), buffers)
    owner = bo.StageOneBroadcastOverlap(
        params, None, group, model, comm=comm, comm_buffers=lambda: buffers, max_in_flight=1
    )
    owner.open()
    model(X)
    owner.launch()
    events = comm.take()
    assert events[-1] == ("all_gather", "buf1")  # a is used first
    record_forwards(model, comm)
    model(X)
    assert [e for e in comm.take() if e[0] != "forward"] == [
        ("wait", "buf1"),
        ("all_gather", "buf2"),
        ("wait", "buf2"),
        ("all_gather", "buf0"),
        ("wait", "buf0"),
    ]
    # rank 1 contributes the second half of each buffer
    assert comm.shards[0] == ("buf1", 20, 20 * 4)
    assert owner.stats["waited_out_of_order"] == 0


@pytest.mark.skipif(
    not hasattr(paddle.Tensor, "_clear_to_zero_allocation"),
    reason="this Paddle has no clear_param_storage (V2 on Paddle 2.6 frees no storage)",
)
def test_v2_frozen_only_buffer_is_skipped_and_cleared_storage_refused_by_name():
    model = Chain()
    group = GatherGroup()
    p = dict(model.named_parameters())
    buffers = [FakeBuffer([p["a.weight"], p["a.bias"]], group),
               FakeBuffer([p[f"{l}.{n}"] for l in "bcd" for n in ("weight", "bias")], group)]
    comm = GatherComm(names_of(model), buffers)
    owner = bo.StageOneBroadcastOverlap(
        list(model.parameters()), None, group, model, comm=comm, comm_buffers=buffers, max_in_flight=1
    )
    owner.open()
    model(X)
    model.a.weight.stop_gradient = model.a.bias.stop_gradient = True
    owner.launch()
    assert [e for e in comm.take() if e[0] == "all_gather"] == [("all_gather", "buf1")]
    owner.wait_before_update()
    model.a.weight.stop_gradient = model.a.bias.stop_gradient = False
    owner.launch()
    comm.take()
    storage = buffers[1].param_storage
    numel = int(storage._numel())
    storage._clear_to_zero_allocation()  # what clear_param_storage does
    with pytest.raises(RuntimeError, match="comm_buffer1 was freed"):
        model(X)
    # Paddle's reset_param_storage shares new memory into the same tensor:
    # the refused unit is started then, never before
    paddle.zeros([numel])._share_buffer_to(storage)
    model(X)
    assert ("all_gather", "buf1") in comm.take()
    assert owner.num_pending == 0
