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

"""Sharding stage 1: parameter broadcast overlapped with the next forward.

NOTE [broadcast overlap]
In sharding stage 1 (ZeRO-1, https://arxiv.org/abs/1910.02054) each rank of
the sharding process group updates only the parameters it owns, then every
owner broadcasts its updated parameters to the other ranks. Upstream Paddle
(PR #63945, "sharding stage1 V1 support Broadcast overlap Forward") launches
those broadcasts with ``sync_op=False`` and lets a forward pre-hook wait for a
layer's tasks just before the layer runs, so communication overlaps the next
forward. ``StageOneBroadcastOverlap`` does the same job and differs from
upstream in these ways:

* Order. The broadcast order is the order in which forward first uses the
  parameters, recorded by the forward pre-hooks (and parameter reads)
  between enabling and the first update. Rank 0 of the sharding group then
  broadcasts its recorded order once, as positions in the optimizer's
  parameter list, so every rank issues the same collectives in the same
  order (an order taken from names or recorded independently per rank can
  differ between ranks: on NCCL that hangs or pairs the wrong tensors).
  Upstream sorts by the integer in ``param.name``, which is not the forward
  order in general.
* Waits on every Python read. Each layer that owns managed parameters
  directly gets a forward pre-hook (placed before any other pre-hook of
  that layer) that waits for that layer's own tasks, so the forward waits
  layer by layer. Beyond that, every Python path to a parameter waits for
  that parameter's own task first (``parameter_read_guard.py``): attribute
  access (``layer.weight``, ``F.linear(x, self.proj.weight)``, a direct
  ``sub.forward(x)``, a pipeline ``SharedLayerDesc`` forward_func),
  ``parameters()``/``named_parameters()``, ``state_dict()``,
  ``set_state_dict()``, ``to()`` and ``copy.deepcopy`` of the model or any
  sublayer, inside or outside ``model(...)``. A program compiled with
  ``paddle.jit.to_static`` (a layer's forward in AST or SOT mode, or a
  compiled method or function) reads parameters without Python, so it
  waits for everything before it runs; SOT leaves this module untraced.
  Parameters that no layer of ``layers`` owns are waited right after
  launch (with one warning). The optimizer's
  ``state_dict()`` and the next ``step()``/``minimize()`` wait for whatever
  is still pending, so no manual synchronize is needed before
  ``paddle.save`` or inference. Not intercepted: a tensor reference (or a
  view of one) taken
  before ``step()`` and read after it (re-read ``layer.weight`` instead).
* Hooks. Registered once when overlap is enabled, kept in a dict keyed by
  layer, removed together when it is disabled; upstream registers them every
  step and ``minimize()`` never removes them.
* Buckets. With ``bucket_size_mb`` > 0 (the optimizer's default) a unit is
  a bucket: at the first launch the parameters move into contiguous
  buffers planned from the agreed order, one broadcast per buffer, and a
  layer waits for every bucket holding one of its parameters (NOTE
  [broadcast buckets] in ``broadcast_buckets.py``). Upstream sends one
  broadcast per parameter.

Every wait is safe to call again: it returns at once when nothing is pending.
On GPUs ``task.wait()`` makes the compute stream wait for the comm stream; it
does not block the host.
"""

import collections
import contextlib
import enum
import functools
import inspect
import os
import re
import warnings
import weakref

import paddle

from .broadcast_buckets import (
    BucketStorage,
    check_bucket_size_mb,
    plan_buckets,
    plan_fused_slices,
)
from .parameter_read_guard import (
    _PENDING,
    GuardedParameters,
    clear_pending,
    guard_layer,
    register_pending,
    unguard_layer,
)

__all__ = [
    "BroadcastOverlapState",
    "StageOneBroadcastOverlap",
    "check_broadcast_overlap_flag",
    "get_broadcast_overlap",
    "open_overlaps",
]


def check_broadcast_overlap_flag(broadcast_overlap):
    """Raise ``TypeError`` unless ``broadcast_overlap`` is a Python bool."""
    if not isinstance(broadcast_overlap, bool):
        raise TypeError(
            "broadcast_overlap must be a Python bool, got "
            f"{broadcast_overlap!r} of type "
            f"{type(broadcast_overlap).__module__}."
            f"{type(broadcast_overlap).__qualname__}."
        )


# The attribute of DygraphShardingOptimizer that holds its owner; read and
# written only through get_broadcast_overlap / set_broadcast_overlap_owner.
_OWNER_ATTR = "_broadcast_overlap_impl"


def get_broadcast_overlap(optimizer):
    """The :class:`StageOneBroadcastOverlap` of ``optimizer``, or None.

    Args:
        optimizer: a ``DygraphShardingOptimizer``, or a
            ``HybridParallelOptimizer`` (or any wrapper with ``_inner_opt``)
            around one.

    Returns:
        StageOneBroadcastOverlap | None: None when overlap is off.
    """
    seen = 0
    while optimizer is not None and seen < 8:
        owner = vars(optimizer).get(_OWNER_ATTR)
        if owner is not None:
            return owner
        optimizer = vars(optimizer).get("_inner_opt")
        seen += 1
    return None


def set_broadcast_overlap_owner(optimizer, owner):
    """Store ``owner`` (or None) on a ``DygraphShardingOptimizer``."""
    vars(optimizer)[_OWNER_ATTR] = owner


class BroadcastOverlapState(enum.Enum):
    """Life cycle of :class:`StageOneBroadcastOverlap`."""

    # Hooks installed; forward pre-hooks record the first-use order.
    # No broadcast is in flight yet.
    RECORDING = "recording"
    # The order is agreed across the sharding group; after each update the
    # broadcasts are launched in that order and waited by hooks and reads.
    ORDERED = "ordered"
    # Nothing pending; hooks are no-ops and are (or will be) removed.
    CLOSED = "closed"


class _PaddleComm:
    """The collectives the owner uses, looked up at call time (so test
    instrumentation that wraps ``paddle.distributed.broadcast`` sees them).
    Unit tests pass a fake with the same two methods."""

    @staticmethod
    def broadcast(tensor, src, group, sync_op):
        return paddle.distributed.broadcast(
            tensor, src=src, group=group, sync_op=sync_op
        )

    @staticmethod
    def rank():
        return paddle.distributed.get_rank()


class _Unit:
    """One broadcast: the tensor sent, its source rank, and the positions
    (in the optimizer's parameter list) of the parameters it carries;
    ``bucket`` when the tensor is a bucket's buffer (NOTE [broadcast
    buckets] in ``broadcast_buckets.py``)."""

    __slots__ = ("tensor", "src", "indices", "bucket")

    def __init__(self, tensor, src, indices, bucket=False):
        self.tensor = tensor
        self.src = src
        self.indices = indices
        self.bucket = bucket

    def is_frozen(self):
        # Frozen parameters are never broadcast: no rank changes them. A
        # bucket holds only parameters trainable when it was planned and is
        # always sent (one frozen since keeps its value on every rank).
        return not self.bucket and self.tensor.stop_gradient


class _Hook:
    """A hook function that a ``copy.deepcopy`` of the model drops: the copy
    gets a no-op instead of a reference to this overlap (which would keep it
    and the original model alive, and cannot be pickled)."""

    def __init__(self, fn):
        self._fn = fn

    def __call__(self, *args):
        return self._fn(*args)

    def __deepcopy__(self, memo):
        return _noop_hook

    def __reduce__(self):
        # a pickle of the model (pickle.dumps(model)) gets the no-op too
        return (_make_noop_hook, ())


def _noop_hook(*_args):
    return None


def _make_noop_hook():
    return _noop_hook


# The original StaticFunction.__call__ while the wrapper below is in place.
_STATIC_CALL = []


def _wait_before_compiled_programs():
    """Make every ``paddle.jit.to_static`` program wait for all pending
    broadcasts before it runs (installed while an overlap is open).

    A compiled program reads parameters without running Python, so neither
    the forward pre-hooks of the layers inside it nor the read guard can
    see those reads: a compiled ``Layer.forward`` (AST or SOT mode,
    ``full_graph`` or not), a compiled method (``to_static(model.encode)``)
    or function. Every one of them goes through ``StaticFunction.__call__``;
    with nothing pending the wrapper costs one truth test.
    """
    if _STATIC_CALL:
        return
    cls = paddle.jit.dy2static.program_translator.StaticFunction
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        if _PENDING:
            for owner in list(_OPEN):
                owner.wait_before_compiled_program()
        return original(self, *args, **kwargs)

    _STATIC_CALL.append(original)
    cls.__call__ = __call__


def _keep_out_of_sot():
    """Put this module's directory on SOT's list of files it does not
    trace, as Paddle's own directory is (a no-op when it already is, as in
    a patched Paddle, or when the installed Paddle has no SOT).

    SOT (the default mode of ``paddle.jit.to_static`` in Paddle 3.x)
    simulates the bytecode of every function a compiled forward calls,
    except files under ``skip_files.skip_file_names``. Simulated, the
    forward pre-hooks and the read guard failed at the first forward on
    Paddle 3.3.1 (``InnerError: ObjectVariable(_Hook) has no attribute
    _state``) and recorded a wrong broadcast order on 2.6.2; skipped, they
    run as plain Python, as Paddle's own hooks do.
    """
    try:
        from paddle.jit.sot.opcode_translator import skip_files
    except ImportError:
        return
    names = getattr(skip_files, "skip_file_names", None)
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    if not isinstance(names, set) or any(here.startswith(n) for n in names):
        return
    names.add(here)
    skip_files.skip_file_name_re = re.compile(
        f"^({'|'.join(map(re.escape, names))})"
    )
    skip_files.setup_skip_files()


def _unwrap_compiled_programs():
    """Restore ``StaticFunction.__call__`` once no overlap is open."""
    if _STATIC_CALL and not _OPEN:
        cls = paddle.jit.dy2static.program_translator.StaticFunction
        cls.__call__ = _STATIC_CALL.pop()


_HAS_PREPEND = (
    "prepend"
    in inspect.signature(paddle.nn.Layer.register_forward_pre_hook).parameters
)


def _waiting_layer(layer, parent_of, root):
    """The layer whose pre-hook waits for ``layer``'s own parameters.

    A container without ``forward`` (``ParameterList``, ``ParameterDict``)
    never runs: its parent reads its parameters, so the nearest ancestor
    with a ``forward`` waits for them.
    """
    while layer is not root and type(layer).forward is paddle.nn.Layer.forward:
        layer = parent_of.get(id(layer), root)
    return layer


# Every owner between open() and close(); paddle_overlay.remove() checks it.
_OPEN = weakref.WeakSet()
# Owners whose optimizer was garbage-collected with overlap on: marked
# closed by the finalizer, hooks removed at the next explicit call
# (removing them inside garbage collection could mutate a layer's hook dict
# while Paddle iterates it in a forward).
_ABANDONED = []


def sweep_abandoned():
    """Remove the hooks of owners whose optimizer was garbage-collected."""
    while _ABANDONED:
        _ABANDONED.pop()._remove_hooks()
    _unwrap_compiled_programs()


def open_overlaps():
    """list[StageOneBroadcastOverlap]: every one opened and not yet closed."""
    sweep_abandoned()
    return list(_OPEN)


class StageOneBroadcastOverlap:
    """Owns the broadcast order, the pending tasks and the hook handles.

    Nothing else touches the pending tasks: the optimizer methods call
    :meth:`launch` after an update and :meth:`wait_before_update` before
    one; forward pre-hooks and parameter reads call the waits (see NOTE
    [broadcast overlap] in this module).

    Args:
        params (list[paddle.Tensor]): the optimizer's full parameter list, in
            the same order on every rank of the sharding group (the order of
            ``DygraphShardingOptimizer._origin_parameter_list``).
        src_ranks (list[int]): for each entry of ``params``, the global rank
            that owns and broadcasts it.
        group: the sharding process group (``.ranks``: its global ranks).
        layers (paddle.nn.Layer): the model that runs the forward.
        strict (bool): if True, the first hooked layer to run in a forward
            waits for every pending task (no overlap), for models that keep
            tensor references to parameters and read them in forward.
        comm: the collectives (``broadcast(tensor, src, group, sync_op)``
            returning a task with ``wait()``, and ``rank()``); Paddle's by
            default. Unit tests pass a recording fake.
        bucket_size_mb (int | float): 0 (here the default): one broadcast
            per parameter. Above 0: at the first launch the parameters are
            moved into contiguous buckets planned from the agreed order in
            windows of this many MB (``broadcast_buckets.py``), one
            broadcast per bucket. The optimizer's ``_set_broadcast_overlap``
            defaults to ``DEFAULT_BUCKET_SIZE_MB``.
        fused_storages (list[paddle.Tensor] | None): the fused 1-D buffers
            the parameters already live in (``sharding_configs.tensor_fusion``);
            with ``bucket_size_mb`` > 0 each window sends slices of them
            instead of moving the parameters (``plan_fused_slices``).

    Raises:
        TypeError: ``layers`` is not a ``paddle.nn.Layer``, ``strict`` is
            not a bool, or ``bucket_size_mb`` is not a number.
        ValueError: ``layers`` is None or owns none of ``params``,
            ``params`` and ``src_ranks`` differ in length, or
            ``bucket_size_mb`` is negative or not finite.

    The constructor only validates and builds tables; :meth:`open` installs
    the hooks, so a rejected call changes nothing.
    """

    def __init__(
        self,
        params,
        src_ranks,
        group,
        layers,
        strict=False,
        comm=None,
        bucket_size_mb=0,
        fused_storages=None,
    ):
        self._check_arguments(params, src_ranks, layers, strict)
        # Bytes per bucket window; 0: one broadcast per parameter.
        self._bucket_cap = check_bucket_size_mb(bucket_size_mb)
        self._fused_storages = fused_storages
        self._comm = comm if comm is not None else _PaddleComm()
        self._index_parameters(params, src_ranks, group)
        self._map_waiting_layers(layers, strict)
        self._init_life_cycle()

    # ------------------------------------------------------------------
    # construction, in named steps
    @staticmethod
    def _check_arguments(params, src_ranks, layers, strict):
        if layers is None:
            raise ValueError(
                "_set_broadcast_overlap(True, layers=...) needs the model: "
                "pass the paddle.nn.Layer that runs the forward, e.g. "
                "optimizer._set_broadcast_overlap(True, layers=model)."
            )
        if not isinstance(layers, paddle.nn.Layer):
            raise TypeError(
                "layers must be a paddle.nn.Layer (the model that runs the "
                f"forward), got {type(layers).__name__}."
            )
        if not isinstance(strict, bool):
            raise TypeError(
                f"strict must be a bool, got {type(strict).__name__}."
            )
        if len(params) != len(src_ranks):
            raise ValueError(
                f"got {len(params)} parameters but {len(src_ranks)} source "
                "ranks."
            )

    def _index_parameters(self, params, src_ranks, group):
        # Identity: positions in the optimizer's list, the same on every
        # rank (parameter names can differ between ranks).
        self._params = list(params)
        self._src_ranks = list(src_ranks)
        self._group = group
        self._index_of = {id(p): i for i, p in enumerate(self._params)}

    def _map_waiting_layers(self, layers, strict):
        # Where each parameter is waited: every layer that owns managed
        # parameters directly; tied parameters under each owner.
        self._layers = layers
        self._strict = strict
        self._all_layers = layers.sublayers(include_self=True)
        parent_of = {}
        for layer in self._all_layers:
            for child in layer.children():
                parent_of.setdefault(id(child), layer)
        waiting = {}  # id(waiting layer) -> (layer, [indices])
        # Layers whose _parameters hold managed parameters: guarded reads.
        self._owning_layers = []
        for layer in self._all_layers:
            indices = [
                self._index_of[id(p)]
                for p in layer.parameters(include_sublayers=False)
                if id(p) in self._index_of
            ]
            if indices:
                self._owning_layers.append(layer)
                waiter = _waiting_layer(layer, parent_of, layers)
                waiting.setdefault(id(waiter), (waiter, []))[1].extend(indices)
        # id(layer) -> tuple of indices its pre-hook waits for / records.
        self._indices_of_layer = {
            key: tuple(dict.fromkeys(indices))
            for key, (_, indices) in waiting.items()
        }
        self._hooked_layers = [layer for layer, _ in waiting.values()]
        if all(layer is not layers for layer in self._hooked_layers):
            # The root always gets a pre-hook: strict mode, compiled
            # models and order recording of root-owned parameters run there.
            self._hooked_layers.insert(0, layers)
        reachable = {
            i for indices in self._indices_of_layer.values() for i in indices
        }
        if not reachable:
            raise ValueError(
                f"layers ({type(layers).__name__}) owns none of the "
                f"{len(self._params)} parameters of this optimizer: pass the "
                "model whose parameters() were given to the optimizer."
            )
        # Parameters no hook or guarded read will see: waited after launch.
        self._unreachable = tuple(
            i for i in range(len(self._params)) if i not in reachable
        )

    def _init_life_cycle(self):
        # The order: recorded from forward while RECORDING, then agreed.
        self._state = BroadcastOverlapState.RECORDING
        self._recorded = []
        self._recorded_set = set()
        self._order = None
        # The broadcasts, built from the agreed order: units in launch
        # order, the unit of each parameter position, the units each
        # hooked layer waits for.
        self._units = []
        self._unit_of = {}
        self._units_of_layer = {}
        # Bucket storage (bucket mode), and the list of its units the
        # tables above were built from (rebuilt when it changes).
        self._buckets = None
        self._bucket_units = None
        # In flight: unit position -> task, in launch order.
        self._pending = {}
        # Hook handles, paired: removed together in close().
        self._pre_hook_handles = {}  # id(layer) -> handle
        self._finalizer = None  # see close_with
        # Launch deferred while the hybrid optimizer still syncs parameters
        # after the update (see deferred_launch).
        self._defer_depth = 0
        self._launch_deferred = False
        # Counts, for tests, benchmarks and users' checks (tasks waited).
        self.stats = {
            "launched": 0,
            "waited_in_forward": 0,
            # forward waited for a task while an earlier-launched one was
            # still pending: forward order differs from the broadcast order
            # on this rank (overlap is reduced; results are not affected).
            "waited_out_of_order": 0,
            "waited_before_update": 0,
            "waited_unreachable": 0,
            # waited by a read outside a hooked layer's call: attribute
            # access, parameters()/state_dict() iteration, etc.
            "waited_on_read": 0,
            "waited_on_demand": 0,
        }
        # waited_on_read by path ("attribute", "iteration", ...).
        self.read_paths = collections.Counter()

    # ------------------------------------------------------------------
    # read-only views
    @property
    def state(self):
        """:class:`BroadcastOverlapState`: where the life cycle is."""
        return self._state

    @property
    def order(self):
        """list[int] | None: agreed broadcast order (positions in the
        optimizer's parameter list), None while still recording."""
        return None if self._order is None else list(self._order)

    @property
    def num_pending(self):
        """int: tasks launched and not yet waited."""
        return len(self._pending)

    @property
    def num_hooks(self):
        """int: forward pre-hook handles currently held."""
        return len(self._pre_hook_handles)

    # ------------------------------------------------------------------
    # life cycle
    def open(self):
        """Install the forward pre-hooks and the parameter read guards (once;
        they stay until :meth:`close`).

        Forward pre-hooks go first in each layer's hook order, so a user's
        own pre-hook (``weight_norm``'s, say) reads waited parameters.

        Raises:
            RuntimeError: the owner is not freshly constructed.
        """
        self._check_state(BroadcastOverlapState.RECORDING)
        if self._pre_hook_handles:
            raise RuntimeError("StageOneBroadcastOverlap.open() called twice.")
        sweep_abandoned()
        if self._unreachable:
            names = [self._params[i].name for i in self._unreachable]
            warnings.warn(
                f"broadcast overlap: {len(names)} optimizer parameter(s) are "
                "not owned by any layer of "
                f"{type(self._layers).__name__}, so no forward pre-hook can "
                f"wait for them: {names}. They are waited right after their "
                "broadcast is launched (no overlap).",
                stacklevel=3,
            )
        _OPEN.add(self)
        _wait_before_compiled_programs()
        _keep_out_of_sot()
        for layer in self._hooked_layers:
            self._add_pre_hook(layer)
        for layer in self._owning_layers:
            guard_layer(layer, self)

    def close_with(self, owner):
        """Mark this overlap closed when ``owner`` (the optimizer) is
        garbage-collected; its hooks are removed at the next explicit call
        (:func:`open_overlaps`, :meth:`open`, :meth:`close` of any overlap),
        never from inside garbage collection."""
        self._finalizer = weakref.finalize(owner, self._abandon)
        self._finalizer.atexit = False

    def _abandon(self):
        if self._state is BroadcastOverlapState.CLOSED:
            return
        self._state = BroadcastOverlapState.CLOSED
        _OPEN.discard(self)
        try:
            self.wait_all()
        finally:
            _ABANDONED.append(self)

    def close(self):
        """Wait for every pending task and remove every hook and guard.
        Idempotent; the object is closed even if a step of it fails."""
        sweep_abandoned()
        if self._state is BroadcastOverlapState.CLOSED:
            return
        self._state = BroadcastOverlapState.CLOSED
        _OPEN.discard(self)
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            self.wait_all()
        finally:
            self._remove_hooks()
            _unwrap_compiled_programs()

    def _remove_hooks(self):
        for handle in self._pre_hook_handles.values():
            handle.remove()
        self._pre_hook_handles.clear()
        for layer in self._owning_layers:
            unguard_layer(layer, self)
        self._recorded, self._recorded_set = [], set()

    # ------------------------------------------------------------------
    # launching
    @contextlib.contextmanager
    def deferred_launch(self):
        """Hold :meth:`launch` back until the block ends.

        ``HybridParallelOptimizer._step`` syncs some parameters across the
        model- and pipeline-parallel groups right after the sharding update
        (``mp_configs.sync_param``, on by default in Paddle 3.x); they must
        not be read while a sharding broadcast may be writing them on
        another stream. Launching after those syncs gives the same values as
        the blocking order: every rank ends with the owner's parameter.
        """
        self._defer_depth += 1
        try:
            yield
        finally:
            # Launch even if the block raised after the update: the blocking
            # order had broadcast by then, and a caller that catches the
            # error and trains on must see the same parameters.
            self._defer_depth -= 1
            if self._defer_depth == 0 and self._launch_deferred:
                self._launch_deferred = False
                self.launch()

    def launch(self):
        """Broadcast every trainable parameter from its owner (async).

        Called after each update, in place of the blocking broadcast (inside
        :meth:`deferred_launch`, when that block ends). The first call
        agrees the order across the sharding group (see :meth:`_agree_order`).
        Frozen parameters (``stop_gradient=True``) are not broadcast: no
        rank changes them. Parameters that no layer owns are waited at once.

        Raises:
            RuntimeError (a broken invariant; names the rank): the owner is
                closed, a task of the previous launch was never waited, or
                the ranks disagree on the optimizer's parameter list.
        """
        self._check_state(
            BroadcastOverlapState.RECORDING, BroadcastOverlapState.ORDERED
        )
        if self._defer_depth:
            self._launch_deferred = True
            return
        if self._state is BroadcastOverlapState.RECORDING:
            self._adopt_order(self._agree_order())
        if self._pending:
            raise RuntimeError(
                f"rank {self._comm.rank()}: broadcast overlap launch with "
                f"{len(self._pending)} broadcast task(s) still pending; "
                "wait_before_update() must run before every update."
            )
        self._refresh_read_paths()
        if self._buckets is not None:
            self._refresh_bucket_units()
        group, pending = self._group, self._pending
        for position, unit in enumerate(self._units):
            if unit.is_frozen():
                continue
            pending[position] = self._comm.broadcast(
                unit.tensor, src=unit.src, group=group, sync_op=False
            )
            for i in unit.indices:
                register_pending(self._params[i], self)
        self.stats["launched"] += len(pending)
        self.stats["waited_unreachable"] += self._wait_indices(
            self._unreachable
        )

    def _agree_order(self):
        """Rank 0 of the sharding group decides; every rank adopts its order.

        Two blocking broadcasts from the group's first rank, once: the
        parameter count (int64 [1]), checked on every rank before the
        order (int64 [n]) is sent, so ranks with different lists stop with
        an error instead of pairing the wrong tensors.

        Raises:
            RuntimeError: this rank's parameter count differs from the
                group's first rank, or the received order is not a
                permutation of the positions (names this rank).
        """
        n = len(self._params)
        first_rank = self._group.ranks[0]
        count = self._broadcast_int64([n], first_rank)
        if count != [n]:
            raise RuntimeError(
                f"rank {self._comm.rank()}: the sharding group disagrees on "
                f"the optimizer's parameter list ({n} parameters here, "
                f"{count[0]} on the group's first rank {first_rank}); every "
                "rank must build the same model and optimizer."
            )
        seen = self._recorded_set
        proposal = self._recorded + [i for i in range(n) if i not in seen]
        agreed = self._broadcast_int64(proposal, first_rank)
        if sorted(agreed) != list(range(n)):
            raise RuntimeError(
                f"rank {self._comm.rank()}: the broadcast order received from "
                f"rank {first_rank} is not a permutation of 0..{n - 1}."
            )
        return agreed

    def _broadcast_int64(self, values, src):
        message = paddle.to_tensor(values, dtype="int64")
        self._comm.broadcast(message, src=src, group=self._group, sync_op=True)
        return [int(v) for v in message.numpy().tolist()]

    def _adopt_order(self, order):
        """Build the broadcast units from the agreed order (one per
        parameter, or the buckets planned from it: their parameters move
        into contiguous storage now, once) and the units each hooked layer
        waits for."""
        self._order = order
        self._recorded, self._recorded_set = [], set()
        args = (order, self._params, self._src_ranks, self._bucket_cap)
        if self._bucket_cap and self._fused_storages is not None:
            plan = plan_fused_slices(
                *args, self._fused_storages, alone=self._unreachable
            )
            self._buckets = BucketStorage(
                [spec for spec, _, _ in plan],
                self._params,
                self._src_ranks,
                order,
            )
            self._buckets.use_views(
                [
                    self._fused_storages[k]._slice(begin, begin + spec.length)
                    for spec, k, begin in plan
                ]
            )
            self._refresh_bucket_units()
        elif self._bucket_cap:
            specs = plan_buckets(*args, alone=self._unreachable)
            self._buckets = BucketStorage(
                specs, self._params, self._src_ranks, order
            )
            self._buckets.materialize()
            self._refresh_bucket_units()
        else:
            self._use_units(
                [
                    _Unit(self._params[i], self._src_ranks[i], (i,))
                    for i in order
                ]
            )
        self._state = BroadcastOverlapState.ORDERED

    def _refresh_bucket_units(self):
        """Once per launch in bucket mode: the storage's units (a parameter
        whose memory was replaced is sent alone, one unfrozen since planning
        too); tables rebuilt only when that list changed."""
        units = self._buckets.units()
        if units is self._bucket_units:
            return
        self._bucket_units = units
        self._use_units(
            [_Unit(u.tensor, u.src, u.indices, u.bucket) for u in units]
        )

    def _use_units(self, units):
        """Adopt ``units`` (launch order) and index them: the unit of each
        parameter position, the units each hooked layer waits for."""
        self._units = units
        self._unit_of = {
            i: position
            for position, unit in enumerate(self._units)
            for i in unit.indices
        }
        self._units_of_layer = {
            key: tuple(
                dict.fromkeys(
                    self._unit_of[i] for i in indices if i in self._unit_of
                )
            )
            for key, indices in self._indices_of_layer.items()
        }

    def _refresh_read_paths(self):
        """Once per launch: re-guard a layer whose ``_parameters`` was
        replaced since the last launch (the others are left alone: their
        users were registered at :meth:`open`)."""
        for layer in self._owning_layers:
            if type(layer.__dict__.get("_parameters")) is not GuardedParameters:
                guard_layer(layer, self)

    # ------------------------------------------------------------------
    # waiting: every wait is safe to call again
    def wait_all(self):
        """Wait for every pending task, in launch order.

        Returns:
            int: how many tasks were waited.
        """
        return self._wait_units(list(self._pending))

    def wait_before_update(self):
        """Called by ``step()``/``minimize()`` before anything is updated."""
        self.stats["waited_before_update"] += self.wait_all()

    def wait_on_demand(self):
        """Wait for everything before a read of the whole model's state
        (the optimizer's ``state_dict()``, say)."""
        self.stats["waited_on_demand"] += self.wait_all()

    def wait_before_compiled_program(self):
        """Wait for everything before a ``paddle.jit.to_static`` program
        runs (it reads parameters without Python; see
        :func:`_wait_before_compiled_programs`)."""
        if self._state is BroadcastOverlapState.ORDERED:
            self.stats["waited_in_forward"] += self.wait_all()

    def wait_for_read(self, param, path):
        """Wait for the task carrying ``param`` (a read is about to hand it
        out through ``path``: ``"attribute"``, ``"iteration"``, ...).

        Returns:
            int: tasks waited (0 or 1).
        """
        waited = self._wait_indices((self._index_of.get(id(param)),))
        if waited:
            self.stats["waited_on_read"] += waited
            self.read_paths[path] += waited
        else:
            clear_pending(param)  # not ours any more (closed owner)
        return waited

    def _wait_indices(self, indices):
        unit_of = self._unit_of
        return self._wait_units([unit_of[i] for i in indices if i in unit_of])

    def _wait_units(self, positions):
        count = 0
        pending = self._pending
        for position in positions:
            task = pending.pop(position, None)
            if task is not None:
                task.wait()
                for i in self._units[position].indices:
                    clear_pending(self._params[i])
                count += 1
        return count

    # ------------------------------------------------------------------
    # hooks
    def _add_pre_hook(self, layer):
        # First in the layer's hook order, so user pre-hooks read waited
        # parameters: prepend=True where Paddle has it (3.x), the same
        # move of the hook dict's entry otherwise (2.6).
        hook = _Hook(self._on_forward_pre)
        if _HAS_PREPEND:
            handle = layer.register_forward_pre_hook(hook, prepend=True)
        else:
            handle = layer.register_forward_pre_hook(hook)
            layer._forward_pre_hooks.move_to_end(handle._hook_id, last=False)
        self._pre_hook_handles[id(layer)] = handle

    def _on_forward_pre(self, layer, _inputs):
        """Forward pre-hook of every hooked layer: record the first-use
        order while RECORDING; afterwards wait for the layer's own tasks
        (everything in strict mode)."""
        state = self._state
        if state is BroadcastOverlapState.RECORDING:
            self._record(self._indices_of_layer.get(id(layer), ()))
            return
        if not self._pending or state is not BroadcastOverlapState.ORDERED:
            return
        if self._strict:
            # The first hooked layer to run waits for everything, whether
            # or not the forward goes through the root.
            self.stats["waited_in_forward"] += self.wait_all()
            return
        units = self._units_of_layer.get(id(layer), ())
        first_pending = next(iter(self._pending))
        waited = self._wait_units(units)
        if waited and first_pending not in units:
            self.stats["waited_out_of_order"] += 1
        self.stats["waited_in_forward"] += waited

    def _record(self, indices):
        seen = self._recorded_set
        for i in indices:
            if i not in seen:
                seen.add(i)
                self._recorded.append(i)

    def _check_state(self, *allowed):
        if self._state not in allowed:
            raise RuntimeError(
                f"rank {self._comm.rank()}: broadcast overlap is "
                f"{self._state.value}, expected one of "
                f"{[s.value for s in allowed]}"
            )
