"""Fakes and helpers of the in-process owner tests (no ranks).

The owner (``param_sync_overlap.ParamSyncOverlap``) gets a fake sharding
group and a recording ``comm`` whose async collectives return tasks that log
their ``wait()``; each test compares the exact list of events (agree,
broadcast, all_gather, wait, forward of a layer) with the expected one, the
way PyTorch FSDP's tests compare event lists. What needs real ranks (bitwise
equality, agreement across ranks, Paddle's optimizer internals) stays in the
collective tests. Fixtures live in ``conftest.py``.
"""

import paddle

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_buckets,
    param_sync_overlap as pso,
    sync_registry,
    unit_plan,
)

V1 = "_set_broadcast_overlap"
V2 = "_set_all_gather_overlap_forward"
X = paddle.ones([2, 4])
IDS = paddle.to_tensor([[1, 2]], dtype="int64")


class FakeGroup:
    ranks = [0, 1]


class FakeTask:
    def __init__(self, events, name):
        self._events = events
        self._name = name

    def wait(self):
        self._events.append(("wait", self._name))


class RecordingComm:
    """Records ("agree", message) for blocking broadcasts and ("broadcast",
    name, src) for async ones, whose FakeTask records ("wait", name); a
    tensor it was not told about is named ``bucket<k>`` in the order seen.

    ``first_rank_messages``: what the group's first rank sends at each
    blocking broadcast of the agreement (None: this rank's own values, as
    if it were rank 0)."""

    def __init__(self, names, first_rank_messages=None):
        self.events = []
        self._names = dict(names)
        self._first_rank_messages = list(first_rank_messages or [])

    def name_of(self, tensor):
        if id(tensor) not in self._names:
            k = sum(n.startswith("bucket") for n in self._names.values())
            self._names[id(tensor)] = f"bucket{k}"
        return self._names[id(tensor)]

    def broadcast(self, tensor, src, group, sync_op):
        if sync_op:
            if self._first_rank_messages:
                tensor.set_value(
                    paddle.to_tensor(self._first_rank_messages.pop(0), dtype="int64")
                )
            self.events.append(("agree", tensor.numpy().tolist()))
            return None
        name = self.name_of(tensor)
        self.events.append(("broadcast", name, src))
        return FakeTask(self.events, name)

    def rank(self):
        return 1

    def take(self):
        events = list(self.events)
        self.events.clear()
        return events


class GatherGroup(FakeGroup):
    nranks = 2
    rank = 1


class FakeBuffer:
    """A V2 comm buffer (``FusedCommBuffer``): its parameters and storage."""

    def __init__(self, params, group):
        self._params = params
        self._comm_group = group
        numel = sum(int(p._numel()) for p in params)
        self.param_storage = paddle.zeros([numel + numel % 2], dtype="float32")


class GatherComm(RecordingComm):
    """Also records ("all_gather", buf<k>) and each shard sent."""

    def __init__(self, names, buffers):
        super().__init__(names)
        self._buffer_names = {
            id(b.param_storage): f"buf{k}" for k, b in enumerate(buffers)
        }
        self.shards = []

    def all_gather(self, shard, full, group):
        name = self._buffer_names[id(full)]
        offset = shard.data_ptr() - full.data_ptr()
        self.shards.append((name, int(shard._numel()), offset))
        self.events.append(("all_gather", name))
        return FakeTask(self.events, name)


class Net(paddle.nn.Layer):
    """Two linears built in the opposite of their forward order."""

    def __init__(self):
        super().__init__()
        self.second = paddle.nn.Linear(3, 2)
        self.first = paddle.nn.Linear(4, 3)

    def forward(self, x):
        return self.second(self.first(x))


class TiedHead(paddle.nn.Layer):
    """Pipeline-style tie: the head reads the embedding's weight without
    calling the embedding layer (PaddleNLP's SharedLayerDesc forward_func)."""

    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(5, 4)
        self.block = paddle.nn.Linear(4, 4)

    def forward(self, ids):
        h = self.block(self.embed(ids))
        return paddle.matmul(h, self.embed.weight, transpose_y=True)

    def head_only(self, h):
        return paddle.matmul(h, self.embed.weight, transpose_y=True)


class Chain(paddle.nn.Layer):
    """Four linears used in construction order a, b, c, d (``reverse``:
    d, c, b, a; ``depth``: only the first ``depth`` of them)."""

    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(4, 4)
        self.b = paddle.nn.Linear(4, 4)
        self.c = paddle.nn.Linear(4, 4)
        self.d = paddle.nn.Linear(4, 4)
        self.reverse = False
        self.depth = 4

    def forward(self, x):
        layers = [self.a, self.b, self.c, self.d]
        for layer in (layers[::-1] if self.reverse else layers)[: self.depth]:
            x = layer(x)
        return x


NET_NAMES = ["second.weight", "second.bias", "first.weight", "first.bias"]
# Net's forward after the first step: each layer's waits, then its user pre-hook
NET_FORWARD = [
    ("wait", "first.weight"),
    ("wait", "first.bias"),
    ("forward", "first"),
    ("wait", "second.weight"),
    ("wait", "second.bias"),
    ("forward", "second"),
]
CHAIN_NAMES = [f"{l}.{p}" for l in "abcd" for p in ("weight", "bias")]


def names_of(model):
    return {id(p): n for n, p in model.named_parameters()}


def make_owner(
    model,
    strict=False,
    src_ranks=None,
    messages=None,
    planner=None,
    params=None,
    comm=None,
    method=V1,
    group=None,
):
    """An opened V1 owner of ``model`` (default: one broadcast per
    parameter from rank 0) and its recording comm."""
    params = list(model.parameters()) if params is None else params
    if planner is None:
        planner = unit_plan.PerParameter(src_ranks or [0] * len(params))
    if comm is None:
        comm = RecordingComm(names_of(model), messages)
    owner = pso.ParamSyncOverlap(
        params, group or FakeGroup(), model, planner, method, strict, comm=comm
    )
    owner.open()
    return owner, comm


def make_bucket_owner(model, bucket_size_mb, src_ranks=None, **kwargs):
    """A V1 owner with broadcast buckets of ``bucket_size_mb`` MB (0: one
    broadcast per parameter), as ``_set_broadcast_overlap`` plans it."""
    src_ranks = src_ranks or [0] * len(list(model.parameters()))
    cap = broadcast_buckets.check_bucket_size_mb(bucket_size_mb)
    if cap:
        planner = unit_plan.Buckets(src_ranks, cap)
    else:
        planner = unit_plan.PerParameter(src_ranks)
    return make_owner(model, planner=planner, **kwargs)


def make_fused_owner(model, bucket_size_mb, layout=None, **kwargs):
    """A V1 owner sending slices of a fused buffer built by hand (as Paddle's
    tensor fusion lays parameters out, here in ``layout`` order)."""
    params = list(model.parameters())
    layout = list(range(len(params))) if layout is None else layout
    fused = fuse(params, layout)
    cap = broadcast_buckets.check_bucket_size_mb(bucket_size_mb)
    planner = unit_plan.FusedSlices([0] * len(params), cap, [fused])
    owner, comm = make_owner(model, planner=planner, **kwargs)
    return owner, comm, fused


def fuse(params, layout):
    """Move ``params`` into one 1-D buffer in ``layout`` order (aligned
    slots); returns the buffer."""
    src = [0] * len(params)
    specs = broadcast_buckets.plan_buckets(layout, params, src, 1 << 40)
    storage = broadcast_buckets.BucketStorage(specs, params, src, layout)
    storage.materialize()
    (buffer,) = storage.buffers
    return buffer


def make_gather_owner(model, buffers, strict=False):
    """An opened V2 owner (one all-gather per comm buffer) and its comm."""
    comm = GatherComm(names_of(model), buffers)
    owner, _ = make_owner(
        model,
        strict=strict,
        planner=unit_plan.CommBuffers(lambda: buffers),
        comm=comm,
        method=V2,
        group=GatherGroup(),
    )
    return owner, comm


def chain_buffers(model, layout=(("d",), ("a", "c"), ("b",))):
    """Paddle-like V2 layout of a Chain: buffer k holds the layers named."""
    p = dict(model.named_parameters())
    group = GatherGroup()
    return [
        FakeBuffer([p[f"{l}.{n}"] for l in names for n in ("weight", "bias")], group)
        for names in layout
    ]


def record_forwards(model, comm):
    """A user pre-hook on every sublayer, registered after the overlay's:
    logs ("forward", name) after the overlay's waits for that layer."""
    handles = []
    for name, layer in model.named_sublayers(include_self=True):
        handles.append(
            layer.register_forward_pre_hook(
                lambda _l, _i, name=name or "<root>": comm.events.append(
                    ("forward", name)
                )
            )
        )
    return handles


def first_step(model, owner, comm, x=X):
    """Forward (records the order), then the first launch; its events."""
    model(x)
    owner.launch()
    return comm.take()


def wait_before_update(owner):
    """What step() does first (``wait_then(..., "waited_before_update")``)."""
    return owner.wait_all("waited_before_update")


def next_step(owner, comm):
    """Wait as step() does, then launch again; the launch's events."""
    wait_before_update(owner)
    comm.take()
    owner.launch()
    return comm.take()


def units_of(owner, index):
    """The units delivering optimizer position ``index``."""
    return [unit for unit in owner.units if index in unit.indices]


def unit_of_param(owner, param):
    (unit,) = units_of(owner, owner.index_of(param))
    return unit


def num_hooks(model):
    return sum(len(l._forward_pre_hooks) for l in model.sublayers(include_self=True))


def num_post_hooks(model):
    return sum(len(l._forward_post_hooks) for l in model.sublayers(include_self=True))


def in_buffer(buffer, param):
    begin = buffer.data_ptr()
    end = begin + int(buffer._numel()) * broadcast_buckets.itemsize(buffer.dtype)
    return begin <= param.data_ptr() < end


def close_all():
    for owner in sync_registry.open_owners():
        owner.close()
