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

"""Sharding stage 1: the post-update parameter sync overlapped with the next
forward (V1 broadcast, V2 all-gather), with one owner.

NOTE [broadcast overlap]
In sharding stage 1 (ZeRO-1, https://arxiv.org/abs/1910.02054) each rank of
the sharding process group updates only its share of the parameters; then
the parameters are synced: V1 (``DygraphShardingOptimizer``) broadcasts
each parameter from its owner, V2 (``DygraphShardingOptimizerV2``,
``split_param``) all-gathers each comm buffer (every rank owns a slice).
Upstream Paddle overlaps that sync with the next forward (PR #63945 for V1,
``_set_all_gather_overlap_forward`` for V2): collectives launched with
``sync_op=False``, forward pre-hooks waiting just before a layer runs.
``StageOneBroadcastOverlap`` does the same job for both and differs from
upstream in these ways:

* Units. A :class:`~.comm_unit.CommUnit` is one collective with its task:
  a parameter, a bucket (NOTE [broadcast buckets] in
  ``broadcast_buckets.py``), a slice of Paddle's fused buffer
  (``tensor_fusion`` or ``comm_overlap``), or one of V2's comm buffers,
  kept exactly as Paddle lays it out. ``unit_plan.plan_units`` builds them
  for every mode; this owner never touches a task itself.
* Order. Units are started in the order forward first uses their
  parameters, recorded by the forward pre-hooks between enabling and the
  first update. Rank 0 of the sharding group broadcasts its recorded order
  once, as positions in the optimizer's parameter list, so every rank
  issues the same collectives in the same order. Upstream V1 sorts by the
  integer in ``param.name``; upstream V2 starts the first buffer at the
  step and then the next not-yet-synced one in buffer-list order (sorted by
  dtype, so fp32 norms come last), and a layer whose buffer is not next
  starts it in its own hook, in the iteration order of a Python ``set``:
  two ranks can gather different buffers at once (gloo aborts, NCCL hangs).
* Depth. ``max_in_flight`` units in flight at once (None: all at the step,
  V1's default; V2 defaults to 1 like upstream, Paddle PR #73406: gathers
  queued at once delayed the forward's own communication); the next one
  starts, in the agreed order, as a wait completes. Whatever triggers a
  start (the step, a hook, a read, a compiled program), a unit not yet
  started first starts every unit before it in that order, so a read on
  one rank alone (``if rank == 0: paddle.save(model.state_dict())``)
  neither hangs nor reads stale values.
* Waits on every read. Each layer that owns managed parameters directly
  gets a forward pre-hook (placed before any other pre-hook of that layer)
  that waits for that layer's own units. Every Python path to a parameter
  (attribute, ``parameters()``, ``state_dict()``/``set_state_dict()``,
  ``to()``, ``copy.deepcopy``, pickle) waits for its own unit, and every
  ``paddle.jit.to_static`` program waits for everything before it runs
  (``read_interception.py``, the one module that intercepts reads). The
  optimizer's ``state_dict()`` and the next ``step()`` wait for whatever is
  pending, so no synchronize is needed before ``paddle.save``. Upstream V2's
  ``state_dict()`` right after ``step()`` reads buffers whose gather was
  never started. Not intercepted: a tensor reference (or a view) taken
  before ``step()`` and read after it, and layers outside ``layers``.
* Hooks. Registered once when overlap is enabled (on every layer that owns
  parameters, the root included), kept in a dict keyed by layer, removed
  together when it is disabled; upstream V1 registers them every step and
  ``minimize()`` never removes them, upstream V2 keeps no handle.
* Say what happens. The first training forward after a step that uses the
  units in another order than the agreed one warns once, naming the layer
  (Megatron-LM warns on the same mismatch); launch and every wait are
  ``paddle.profiler.RecordEvent`` spans (``paddle_overlay::launch``,
  ``paddle_overlay::wait <unit>``).
* Replaced memory. In bucket modes a rank that finds a parameter's memory
  replaced (``model.to(dtype=...)``, a loader sharing new memory) cannot
  change its plan alone: one int64 [1] max-reduce per launch over the group
  tells every rank, and all plan again.

Every wait is safe to call again: it returns at once when nothing is pending.
On GPUs ``task.wait()`` makes the compute stream wait for the comm stream; it
does not block the host. A garbage-collection finalizer never waits: an
optimizer collected with overlap on is waited and unhooked at the next
explicit call.
"""

import collections
import contextlib
import enum
import inspect
import os
import warnings
import weakref

import paddle

from . import read_interception
from .broadcast_buckets import check_bucket_size_mb
from .comm_unit import PENDING, PaddleComm, UnitState
from .unit_plan import plan_units

__all__ = [
    "BroadcastOverlapState",
    "MAX_IN_FLIGHT_ENV",
    "StageOneBroadcastOverlap",
    "check_broadcast_overlap_flag",
    "check_max_in_flight",
    "get_broadcast_overlap",
    "launch_or_sync",
    "open_overlaps",
    "wait_then",
]

# Environment variable read when max_in_flight is not passed (PaddleFormers
# calls _set_all_gather_overlap_forward(True, model) with two arguments).
MAX_IN_FLIGHT_ENV = "PADDLE_OVERLAY_MAX_IN_FLIGHT"


def check_broadcast_overlap_flag(broadcast_overlap):
    """Raise ``TypeError`` unless ``broadcast_overlap`` is a Python bool."""
    if not isinstance(broadcast_overlap, bool):
        raise TypeError(
            "broadcast_overlap must be a Python bool, got "
            f"{broadcast_overlap!r} of type "
            f"{type(broadcast_overlap).__module__}."
            f"{type(broadcast_overlap).__qualname__}."
        )


def check_max_in_flight(max_in_flight, default):
    """The launch depth: ``max_in_flight`` if given, else the environment
    variable :data:`MAX_IN_FLIGHT_ENV`, else ``default``.

    Args:
        max_in_flight (int | str | None): collectives in flight at once
            (>= 1), ``"all"`` (every unit at the step), or None.
        default (int | None): None means all.

    Returns:
        int | None: the depth, None for all.

    Raises:
        TypeError / ValueError: not an int >= 1 or ``"all"`` (names where
            the value came from).
    """
    where = "max_in_flight"
    if max_in_flight is None:
        env = os.environ.get(MAX_IN_FLIGHT_ENV, "").strip()
        if not env:
            return default
        max_in_flight, where = env, MAX_IN_FLIGHT_ENV
        if max_in_flight.isdigit():
            max_in_flight = int(max_in_flight)
    if max_in_flight == "all":
        return None
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
        raise TypeError(
            f"{where} must be an int >= 1 or 'all', got {max_in_flight!r}."
        )
    if max_in_flight < 1:
        raise ValueError(
            f"{where} must be >= 1 (collectives in flight at once) or "
            f"'all', got {max_in_flight}."
        )
    return max_in_flight


# The attribute of a sharding optimizer that holds its owner; read and
# written only through get_broadcast_overlap / set_broadcast_overlap_owner.
_OWNER_ATTR = "_broadcast_overlap_impl"


def get_broadcast_overlap(optimizer):
    """The :class:`StageOneBroadcastOverlap` of ``optimizer``, or None.

    Args:
        optimizer: a ``DygraphShardingOptimizer`` (V1) or
            ``DygraphShardingOptimizerV2``, or a ``HybridParallelOptimizer``
            (or any wrapper with ``_inner_opt``) around one.

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
    """Store ``owner`` (or None) on a sharding optimizer."""
    vars(optimizer)[_OWNER_ATTR] = owner


def launch_or_sync(optimizer, blocking_sync):
    """The optimizers' ``_sharding_sync_parameters``: launch the owner's
    units (async) when overlap is on, else run Paddle's ``blocking_sync``."""
    overlap = get_broadcast_overlap(optimizer)
    if overlap is None:
        return blocking_sync()
    with paddle.no_grad():
        overlap.launch()


def wait_then(optimizer, reason, call, *args):
    """Wait for every pending unit of ``optimizer`` (counted under
    ``reason``: ``"waited_before_update"`` before ``step()``/``minimize()``,
    ``"waited_on_demand"`` before ``state_dict()``), then ``call(*args)``."""
    overlap = get_broadcast_overlap(optimizer)
    if overlap is not None:
        overlap.wait_all(reason)
    return call(*args)


class BroadcastOverlapState(enum.Enum):
    """Life cycle of :class:`StageOneBroadcastOverlap`."""

    # Hooks installed; forward pre-hooks record the first-use order.
    # No collective is in flight yet.
    RECORDING = "recording"
    # The order is agreed across the group; after each update the units
    # are marked due and started in that order, waited by hooks and reads.
    ORDERED = "ordered"
    # Nothing pending; hooks are no-ops and are (or will be) removed.
    CLOSED = "closed"


class _Hook:
    """A hook function that a ``copy.deepcopy`` or pickle of the model
    drops: the copy gets a no-op instead of a reference to this overlap."""

    def __init__(self, fn):
        self._fn = fn

    def __call__(self, *args):
        return self._fn(*args)

    def __deepcopy__(self, memo):
        return _noop_hook

    def __reduce__(self):
        return (_make_noop_hook, ())


def _noop_hook(*_args):
    return None


def _make_noop_hook():
    return _noop_hook


_HAS_PREPEND = (
    "prepend"
    in inspect.signature(paddle.nn.Layer.register_forward_pre_hook).parameters
)


def _span(name):
    """A ``paddle.profiler`` span (shows on the profiler timeline; costs
    one flag test when no profiler runs)."""
    return paddle.profiler.RecordEvent(name)


def _waiting_layer(layer, parent_of, root):
    """The layer whose pre-hook waits for ``layer``'s own parameters: a
    container without ``forward`` (``ParameterList``) never runs, so its
    nearest ancestor with a ``forward`` waits."""
    while layer is not root and type(layer).forward is paddle.nn.Layer.forward:
        layer = parent_of.get(id(layer), root)
    return layer


# Every owner between open() and close(); paddle_overlay.remove() checks it.
_OPEN = weakref.WeakSet()
# Owners whose optimizer was garbage-collected with overlap on: marked
# closed by the finalizer (which never waits on a collective), waited and
# unhooked at the next explicit call (removing hooks inside garbage
# collection could mutate a hook dict while Paddle iterates it).
_ABANDONED = []


def sweep_abandoned():
    """Wait for and unhook the owners whose optimizer was collected."""
    while _ABANDONED:
        owner = _ABANDONED.pop()
        try:
            owner.wait_all("waited_on_demand")
        finally:
            owner._remove_hooks()


def open_overlaps():
    """list[StageOneBroadcastOverlap]: every one opened and not closed."""
    sweep_abandoned()
    return list(_OPEN)


class StageOneBroadcastOverlap:
    """Owns the order, the units, the launch depth and the hook handles.

    The units own their collectives and tasks (``comm_unit.py``); this
    object decides when each starts and who waits for it: the optimizer
    methods call :meth:`launch` after an update and
    :meth:`wait_before_update` before one; forward pre-hooks, parameter
    reads (``read_interception.py``) and compiled programs call
    :meth:`wait`. See NOTE [broadcast overlap] in this module.

    Args:
        params (list[paddle.Tensor]): the optimizer's full parameter list, in
            the same order on every rank of the group.
        src_ranks (list[int] | None): global owner rank of each parameter
            (V1); None with ``comm_buffers`` (V2: every rank owns a slice).
        group: the sharding process group (``.ranks``: its global ranks).
        layers (paddle.nn.Layer): the model that runs the forward.
        strict (bool): the first hooked layer to run in a forward waits for
            everything (no overlap).
        comm: the collectives (``comm_unit.PaddleComm``'s methods); unit
            tests pass a recording fake.
        bucket_size_mb (int | float): V1: 0 for one broadcast per
            parameter; above 0, buckets planned in windows of this many MB
            (``broadcast_buckets.py``).
        fused_storages (list[paddle.Tensor] | None): V1: Paddle's fused 1-D
            buffers the parameters live in; buckets are slices of them.
        comm_buffers (list | callable | None): V2: Paddle's comm buffers
            (``FusedCommBuffer``), or a callable returning them at the
            first launch; one all-gather per buffer.
        max_in_flight (int | None): collectives in flight at once; None
            starts every unit at the step. With a depth k the first k units
            start at the step, and each wait that completes starts the next
            in the agreed order.

    Raises:
        TypeError / ValueError: bad arguments (before anything changes).
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
        comm_buffers=None,
        max_in_flight=None,
    ):
        self._check_arguments(params, src_ranks, layers, strict, comm_buffers)
        self._bucket_cap = check_bucket_size_mb(bucket_size_mb)
        self._max_in_flight = (
            None
            if max_in_flight is None
            else check_max_in_flight(max_in_flight, None)
        )
        self._fused_storages = fused_storages
        self._comm_buffers = comm_buffers
        self._comm = comm if comm is not None else PaddleComm()
        self._params = list(params)
        self._src_ranks = None if src_ranks is None else list(src_ranks)
        self._group = group
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self._map_waiting_layers(layers, strict)
        self._init_life_cycle()

    # ------------------------------------------------------------------
    # construction, in named steps
    @staticmethod
    def _check_arguments(params, src_ranks, layers, strict, comm_buffers):
        if layers is None:
            raise ValueError(
                "the overlap needs the model: pass the paddle.nn.Layer that "
                "runs the forward, e.g. optimizer._set_broadcast_overlap("
                "True, layers=model) or optimizer."
                "_set_all_gather_overlap_forward(True, model)."
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
        if comm_buffers is None and (
            src_ranks is None or len(params) != len(src_ranks)
        ):
            raise ValueError(
                f"got {len(params)} parameters but "
                f"{None if src_ranks is None else len(src_ranks)} source "
                "ranks."
            )

    def _map_waiting_layers(self, layers, strict):
        # Where each parameter is waited: every layer that owns managed
        # parameters directly; tied parameters under each owner.
        self._layers = layers
        self._strict = strict
        all_layers = layers.sublayers(include_self=True)
        parent_of = {}
        for layer in all_layers:
            for child in layer.children():
                parent_of.setdefault(id(child), layer)
        waiting = {}  # id(waiting layer) -> (layer, [indices])
        # Layers whose _parameters hold managed parameters: guarded reads.
        self._owning_layers = []
        for layer in all_layers:
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
            # The root always gets a pre-hook: strict mode, the order check
            # and order recording of root-owned parameters run there.
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
        self._state = BroadcastOverlapState.RECORDING
        # The order: recorded from forward while RECORDING, then agreed.
        self._recorded, self._recorded_set = [], set()
        self._order = None
        # The plan (unit_plan.plan_units) and its units in launch order,
        # with the tables built from them: each unit's position, the units
        # each hooked layer waits for, the units of unreachable parameters.
        self._plan = None
        self._units = []
        self._position_of = {}
        self._units_of_layer = {}
        self._unreachable_units = ()
        # Launch progress: units before _next_start are started (or not
        # due); _in_flight of them are not waited; _first_unsynced is where
        # the order check looks first.
        self._next_start = 0
        self._in_flight = 0
        self._first_unsynced = 0
        # The order check: armed at launch, for the first training forward
        # of the root; warned once per owner.
        self._order_check_armed = False
        self._in_root_forward = False
        self._warned_order = False
        # Hook handles, paired: removed together in close().
        self._pre_hook_handles = {}  # id(layer) -> handle
        self._post_hook_handle = None
        self._finalizer = None  # see close_with
        # Launch deferred while the hybrid optimizer still syncs parameters
        # after the update (see deferred_launch).
        self._defer_depth = 0
        self._launch_deferred = False
        # Counts, for tests, benchmarks and users' checks.
        self.stats = {
            # collectives started
            "launched": 0,
            # units waited, by who waited
            "waited_in_forward": 0,
            "waited_before_update": 0,
            "waited_unreachable": 0,
            "waited_on_read": 0,
            "waited_on_demand": 0,
            # forward waited for a unit while an earlier one in the agreed
            # order was not synced: forward order differs from the agreed
            # order on this rank (less overlap; results are not affected).
            "waited_out_of_order": 0,
            # plans rebuilt after a rank's parameter memory was replaced
            "replanned": 0,
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
        """list[int] | None: agreed order (positions in the optimizer's
        parameter list), None while still recording."""
        return None if self._order is None else list(self._order)

    @property
    def units(self):
        """list[comm_unit.CommUnit]: the units of the last launch, in order."""
        return list(self._units)

    @property
    def max_in_flight(self):
        """int | None: the launch depth (None: all at the step)."""
        return self._max_in_flight

    @property
    def num_pending(self):
        """int: units due or in flight (not yet waited)."""
        return sum(u.state is not UnitState.SYNCED for u in self._units)

    @property
    def num_hooks(self):
        """int: forward pre-hook handles currently held."""
        return len(self._pre_hook_handles)

    @property
    def bucket_storage(self):
        """broadcast_buckets.BucketStorage | None: the bucket (or fused
        slice) storage in bucket mode, else None."""
        return getattr(self._plan, "storage", None)

    def units_of(self, index):
        """list[CommUnit]: the units that deliver parameter ``index``."""
        return [u for u in self._units if index in u.indices]

    # ------------------------------------------------------------------
    # life cycle
    def open(self):
        """Install the forward pre-hooks and the read interception (once;
        they stay until :meth:`close`). Pre-hooks go first in each layer's
        hook order, so a user's own pre-hook reads waited parameters.

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
                f"parameter sync overlap: {len(names)} optimizer "
                "parameter(s) are not owned by any layer of "
                f"{type(self._layers).__name__}, so no forward pre-hook can "
                f"wait for them: {names}. They are waited right after their "
                "sync is launched (no overlap).",
                stacklevel=3,
            )
        _OPEN.add(self)
        read_interception.acquire(self, self._owning_layers)
        for layer in self._hooked_layers:
            self._add_pre_hook(layer)
        self._post_hook_handle = self._layers.register_forward_post_hook(
            _Hook(self._on_root_forward_post)
        )

    def close_with(self, owner):
        """Mark this overlap closed when ``owner`` (the optimizer) is
        garbage-collected; its units are waited and its hooks removed at
        the next explicit call (:func:`open_overlaps`, :meth:`open`,
        :meth:`close` of any overlap, ``_set_broadcast_overlap``), never
        from inside garbage collection."""
        self._finalizer = weakref.finalize(owner, self._abandon)
        self._finalizer.atexit = False

    def _abandon(self):
        # runs inside garbage collection: no collective, no hook change
        if self._state is not BroadcastOverlapState.CLOSED:
            self._state = BroadcastOverlapState.CLOSED
            _OPEN.discard(self)
            _ABANDONED.append(self)

    def close(self):
        """Wait for every pending unit and remove every hook and guard.
        Idempotent; the object is closed even if a step of it fails."""
        sweep_abandoned()
        if self._state is BroadcastOverlapState.CLOSED:
            return
        self._state = BroadcastOverlapState.CLOSED
        _OPEN.discard(self)
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            self.wait_all("waited_on_demand")
        finally:
            self._remove_hooks()

    def _remove_hooks(self):
        for handle in self._pre_hook_handles.values():
            handle.remove()
        self._pre_hook_handles.clear()
        if self._post_hook_handle is not None:
            self._post_hook_handle.remove()
            self._post_hook_handle = None
        read_interception.release(self, self._owning_layers)
        self._recorded, self._recorded_set = [], set()

    # ------------------------------------------------------------------
    # launching
    @contextlib.contextmanager
    def deferred_launch(self):
        """Hold :meth:`launch` back until the block ends.

        ``HybridParallelOptimizer._step`` syncs some parameters across the
        model- and pipeline-parallel groups right after the sharding update
        (``mp_configs.sync_param``, on by default in Paddle 3.x); they must
        not be read while a sharding collective may be writing them on
        another stream. Launching after those syncs gives the same values as
        the blocking order.
        """
        self._defer_depth += 1
        try:
            yield
        finally:
            # Launch even if the block raised after the update: the blocking
            # order had synced by then.
            self._defer_depth -= 1
            if self._defer_depth == 0 and self._launch_deferred:
                self._launch_deferred = False
                self.launch()

    def launch(self):
        """Mark every unit due after an update and start them in the agreed
        order (all, or the first ``max_in_flight``), async.

        The first call agrees the order across the group
        (:meth:`_agree_order`). Units whose parameters are all frozen are
        skipped. Units of parameters no layer owns are waited at once.

        Raises:
            RuntimeError (a broken invariant; names the rank): the owner is
                closed, a unit of the previous launch was never waited, or
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
        elif self._plan.can_go_stale:
            self._replan_if_replaced()
        if self.num_pending:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync launch with "
                f"{self.num_pending} unit(s) still pending; "
                "wait_before_update() must run before every update."
            )
        read_interception.refresh(self, self._owning_layers)
        units = self._plan.units()
        if units is not self._units:
            self._use_units(units)
        with _span("paddle_overlay::launch"):
            for unit in self._units:
                if unit.needs_sync():
                    unit.mark_due(self)
            self._next_start = self._first_unsynced = 0
            self._start_more()
        self._order_check_armed = True
        self.wait(self._unreachable_units, "waited_unreachable")

    def _agree_order(self):
        """Rank 0 of the group decides; every rank adopts its order.

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
                f"rank {self._comm.rank()}: the order received from "
                f"rank {first_rank} is not a permutation of 0..{n - 1}."
            )
        return agreed

    def _broadcast_int64(self, values, src):
        message = paddle.to_tensor(values, dtype="int64")
        self._comm.broadcast(message, src=src, group=self._group, sync_op=True)
        return [int(v) for v in message.numpy().tolist()]

    def _make_plan(self):
        buffers = self._comm_buffers
        if callable(buffers):
            buffers = buffers()
        return plan_units(
            self._order,
            self._params,
            self._src_ranks,
            self._group,
            cap_bytes=self._bucket_cap,
            fused_storages=self._fused_storages,
            comm_buffers=buffers,
            alone=self._unreachable,
        )

    def _adopt_order(self, order):
        """Plan the units from the agreed order (in bucket mode the
        parameters move into contiguous storage now, once)."""
        self._order = order
        self._recorded, self._recorded_set = [], set()
        self._plan = self._make_plan()
        self._state = BroadcastOverlapState.ORDERED

    def _replan_if_replaced(self):
        """Plan again when any rank's parameter memory was replaced.

        A replacement (``model.to(dtype=...)``, a loader sharing new
        memory) is seen per rank by a pointer check, but a plan must be the
        same on every rank: one blocking int64 [1] max-reduce per launch
        over the group says whether any rank saw one, and then every rank
        plans again from its parameters' current memory.
        """
        replaced = self._plan.replaced()
        (anywhere,) = self._comm.all_reduce_max([len(replaced)], self._group)
        if not anywhere:
            return
        names = [self._params[i].name for i in replaced]
        warnings.warn(
            "parameter sync overlap: the memory of parameter(s) "
            f"{names or '(none here; on another rank)'} was replaced after "
            "planning (e.g. model.to(dtype=...)); every rank of the group "
            "plans its units again from the current memory.",
            stacklevel=4,
        )
        self._plan = self._make_plan()
        self.stats["replanned"] += 1

    def _use_units(self, units):
        """Adopt ``units`` (launch order) and index them."""
        self._units = units
        self._position_of = {id(u): k for k, u in enumerate(units)}
        unit_of = collections.defaultdict(list)
        for unit in units:
            for i in unit.indices:
                unit_of[i].append(unit)
        self._units_of_layer = {
            key: tuple(
                {id(u): u for i in indices for u in unit_of.get(i, ())}.values()
            )
            for key, indices in self._indices_of_layer.items()
        }
        self._unreachable_units = tuple(
            {
                id(u): u for i in self._unreachable for u in unit_of.get(i, ())
            }.values()
        )

    def _start_more(self, through=-1):
        """Start due units in the agreed order: every one up to position
        ``through``, then more while fewer than the depth are in flight."""
        units, comm, depth = self._units, self._comm, self._max_in_flight
        while self._next_start < len(units) and (
            self._next_start <= through
            or depth is None
            or self._in_flight < depth
        ):
            unit = units[self._next_start]
            started = unit.start(comm)  # may raise: then retried next time
            self._next_start += 1
            if started:
                self._in_flight += 1
                self.stats["launched"] += 1

    # ------------------------------------------------------------------
    # waiting: safe to call again
    def wait(self, units, reason, path=None):
        """Finish ``units`` (each waited at most once; a due unit first
        starts every unit before it in the agreed order, so all ranks start
        the same collectives in the same order whatever triggers a start),
        then start more up to the depth.

        Args:
            units (iterable[CommUnit]): units of this owner.
            reason (str): the :attr:`stats` key to count them under.
            path (str | None): the read path, counted in :attr:`read_paths`.

        Returns:
            int: units waited now.
        """
        waited = 0
        for unit in units:
            if unit.state is UnitState.SYNCED:
                continue
            if unit.state is UnitState.DUE:
                self._start_more(self._position_of[id(unit)])
            with _span(f"paddle_overlay::wait {unit.label}"):
                unit.finish()
            self._in_flight -= 1
            waited += 1
        if waited:
            self.stats[reason] += waited
            if path is not None:
                self.read_paths[path] += waited
            self._start_more()
        return waited

    def wait_all(self, reason="waited_on_demand"):
        """Wait for every pending unit, in launch order.

        Returns:
            int: how many were waited.
        """
        return self.wait(self._units, reason)

    def wait_before_update(self):
        """Called by ``step()``/``minimize()`` before anything is updated."""
        self.wait_all("waited_before_update")

    def wait_on_demand(self):
        """Wait for everything before a read of the whole model's state
        (the optimizer's ``state_dict()``, say)."""
        self.wait_all("waited_on_demand")

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
        order while RECORDING; afterwards wait for the layer's own units
        (everything in strict mode)."""
        state = self._state
        if state is BroadcastOverlapState.RECORDING:
            self._record(self._indices_of_layer.get(id(layer), ()))
            return
        if layer is self._layers:
            self._in_root_forward = True
        if not PENDING or state is not BroadcastOverlapState.ORDERED:
            return
        if self._strict:
            # The first hooked layer to run waits for everything, whether
            # or not the forward goes through the root.
            self.wait_all("waited_in_forward")
            return
        units = self._units_of_layer.get(id(layer), ())
        if units:
            self._check_order(layer, units)
            self.wait(units, "waited_in_forward")

    def _on_root_forward_post(self, layer, _inputs, _outputs):
        # the first root forward after a launch is over: later ones
        # (micro-batches, recompute, eval) are not checked
        self._in_root_forward = False
        self._order_check_armed = False

    def _check_order(self, layer, units):
        """Count (and warn once, for a training forward) a layer that needs
        a unit while an earlier one in the agreed order is not synced."""
        all_units = self._units
        cursor = self._first_unsynced
        while (
            cursor < len(all_units)
            and all_units[cursor].state is UnitState.SYNCED
        ):
            cursor += 1
        self._first_unsynced = cursor
        if cursor == len(all_units):
            return
        first = all_units[cursor]
        if any(u is first for u in units) or all(
            u.state is UnitState.SYNCED for u in units
        ):
            return
        self.stats["waited_out_of_order"] += 1
        if (
            self._order_check_armed
            and self._in_root_forward
            and not self._warned_order
            and self._layers.training
            and paddle.is_grad_enabled()
        ):
            self._warned_order = True
            needed = next(u for u in units if u.state is not UnitState.SYNCED)
            warnings.warn(
                f"parameter sync overlap: {type(layer).__name__} "
                f"({getattr(layer, '_full_name', '')}) needs "
                f"{needed.label} while {first.label}, earlier in the order "
                "agreed at the first step, is not synced yet: this forward "
                "uses the parameters in another order than the first one "
                "did, so some overlap is lost (results are not affected). "
                "Shown once.",
                stacklevel=2,
            )

    def _record(self, indices):
        seen = self._recorded_set
        for i in indices:
            if i not in seen:
                seen.add(i)
                self._recorded.append(i)

    def _check_state(self, *allowed):
        if self._state not in allowed:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync overlap is "
                f"{self._state.value}, expected one of "
                f"{[s.value for s in allowed]}"
            )
