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

"""Sharding stage 1: the post-update parameter sync (V1 broadcast, V2
all-gather) overlapped with the next forward, with one owner.

NOTE [broadcast overlap]
As upstream (PR #63945 for V1, ``_set_all_gather_overlap_forward`` for V2),
``sync_op=False`` collectives waited by forward pre-hooks, by these rules
(why: paddle_overlay's ``docs/design.md``):

* Units (``comm_unit.CommUnit``, planned by ``unit_plan``) own their tasks.
* Order: forward's first use, recorded before the first update and sent
  once from rank 0 of the group: all ranks issue the same collectives in
  the same order (upstream V1 sorts by ``param.name``, V2 uses ``set`` order).
* Depth: ``max_in_flight`` units in flight (V1: all; V2: 1, as PR #73406).
  Whatever starts a unit starts every unit before it first.
* Waits: a pre-hook (first in its layer's order) per layer owning managed
  parameters, every Python read of a parameter and compiled program, the
  optimizer's ``state_dict()`` and ``step()``; safe to call again, never in
  a GC finalizer. Not seen: a tensor reference taken before ``step()``.
* Hooks: registered once, removed together on disable.
* A training forward using units out of the agreed order warns once.
* Profiler spans: ``paddle_overlay::launch``, ``paddle_overlay::wait <unit>``.
* Buckets: one int64 [1] max-reduce per launch tells every rank whether any
  rank's parameter memory was replaced; then all plan again.
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

__all__ = []

# read when max_in_flight is not passed (PaddleFormers passes two arguments)
MAX_IN_FLIGHT_ENV = "PADDLE_OVERLAY_MAX_IN_FLIGHT"
_OWNER_ATTR = "_broadcast_overlap_impl"


def check_broadcast_overlap_flag(flag):
    if not isinstance(flag, bool):
        kind = type(flag)
        raise TypeError(
            f"broadcast_overlap must be a Python bool, got {flag!r} of type "
            f"{kind.__module__}.{kind.__qualname__}."
        )


def check_max_in_flight(max_in_flight, default):
    """The launch depth (int, None: all) from ``max_in_flight`` (int >= 1
    or ``"all"``), else :data:`MAX_IN_FLIGHT_ENV`, else ``default``; raises
    TypeError / ValueError naming where a bad value came from."""
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


def get_broadcast_overlap(optimizer):
    """The :class:`StageOneBroadcastOverlap` of ``optimizer`` (V1, V2, or a
    ``HybridParallelOptimizer`` or other ``_inner_opt`` wrapper around one),
    or None when overlap is off. Public counters: ``stats`` (dict[str, int]:
    ``launched``, ``waited_*`` by who waited, ``waited_out_of_order``,
    ``replanned``), ``read_paths`` (``waited_on_read`` by path), ``order``,
    ``units``, ``num_pending``, ``num_hooks``, ``state``."""
    while optimizer is not None:
        owner = vars(optimizer).get(_OWNER_ATTR)
        if owner is not None:
            return owner
        optimizer = vars(optimizer).get("_inner_opt")
    return None


def switch_owner(optimizer, new):
    """Close ``optimizer``'s owner, then open ``new`` (None: overlap off)."""
    sweep_abandoned()
    current = vars(optimizer).get(_OWNER_ATTR)
    if current is not None:
        current.close()
    if new is not None:
        new.open()
        new.close_with(optimizer)
    vars(optimizer)[_OWNER_ATTR] = new


def launch_or_sync(optimizer, blocking_sync):
    """Launch the owner's units if overlap is on, else ``blocking_sync()``."""
    overlap = get_broadcast_overlap(optimizer)
    if overlap is None:
        return blocking_sync()
    with paddle.no_grad():
        overlap.launch()


def wait_then(optimizer, reason, call, *args):
    """Wait for pending units (counted as ``reason``), then ``call(*args)``."""
    overlap = get_broadcast_overlap(optimizer)
    if overlap is not None:
        overlap.wait_all(reason)
    return call(*args)


class BroadcastOverlapState(enum.Enum):
    RECORDING = "recording"  # hooks record the first-use order
    ORDERED = "ordered"  # order agreed; units launched after each update
    CLOSED = "closed"  # nothing pending; hooks removed (or to be)


class _Hook:
    """A hook that ``copy.deepcopy`` or pickle of the model makes a no-op."""

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
_STATS = (
    "launched waited_in_forward waited_before_update waited_unreachable "
    "waited_on_read waited_on_demand waited_out_of_order replanned"
).split()
_OPEN = weakref.WeakSet()  # owners between open() and close()
# owners whose optimizer was collected: unhooked at the next explicit call,
# never inside garbage collection (Paddle may be iterating a hook dict)
_ABANDONED = []


def sweep_abandoned():
    while _ABANDONED:
        owner = _ABANDONED.pop()
        try:
            owner.wait_all("waited_on_demand")
        finally:
            owner._remove_hooks()


def open_overlaps():
    """list[StageOneBroadcastOverlap]: opened and not closed."""
    sweep_abandoned()
    return list(_OPEN)


def _waiting_layer(layer, parent_of, root):
    # a container without forward (ParameterList) never runs: its nearest
    # ancestor with a forward waits
    while layer is not root and type(layer).forward is paddle.nn.Layer.forward:
        layer = parent_of.get(id(layer), root)
    return layer


class StageOneBroadcastOverlap:
    """Owns the order, the units, the launch depth and the hook handles.
    ``src_ranks``: V1 owner global ranks (None with V2's ``comm_buffers``, a
    list or a callable); ``comm``: ``PaddleComm`` or a test fake."""

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
        depth = "all" if max_in_flight is None else max_in_flight
        self._max_in_flight = check_max_in_flight(depth, None)
        self._fused_storages = fused_storages
        self._comm_buffers = comm_buffers
        self._comm = comm if comm is not None else PaddleComm()
        self._params = list(params)
        self._src_ranks = None if src_ranks is None else list(src_ranks)
        self._group = group
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self._map_waiting_layers(layers, strict)
        self._state = BroadcastOverlapState.RECORDING
        self._recorded = {}  # first-use order while RECORDING (dict as set)
        self._order = self._plan = None
        self._use_units([])
        # units before _next_start are started (or not due); _in_flight of
        # them are not waited; the order check looks from _first_unsynced
        self._next_start = self._in_flight = self._first_unsynced = 0
        self._order_check_armed = self._in_root_forward = False
        self._warned_order = False
        self._pre_hook_handles = {}  # id(layer) -> handle
        self._post_hook_handle = self._finalizer = None
        self._defer_depth, self._launch_deferred = 0, False
        # public counters (get_broadcast_overlap); waited_out_of_order: a
        # layer waited while an earlier unit was not synced (less overlap)
        self.stats = dict.fromkeys(_STATS, 0)
        # waited_on_read by path ("attribute", "iteration", "launch")
        self.read_paths = collections.Counter()

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
        n_src = None if src_ranks is None else len(src_ranks)
        if comm_buffers is None and n_src != len(params):
            raise ValueError(
                f"got {len(params)} parameters but {n_src} source ranks."
            )

    def _map_waiting_layers(self, layers, strict):
        # every layer owning managed parameters directly waits for them
        self._layers, self._strict = layers, strict
        all_layers = layers.sublayers(include_self=True)
        parent_of = {}
        for layer in all_layers:
            for child in layer.children():
                parent_of.setdefault(id(child), layer)
        waiting = {}  # id(waiting layer) -> (layer, {index: None})
        self._owning_layers = []  # their _parameters get guarded reads
        for layer in all_layers:
            own = layer.parameters(include_sublayers=False)
            indices = [
                self._index_of[id(p)] for p in own if id(p) in self._index_of
            ]
            if indices:
                self._owning_layers.append(layer)
                waiter = _waiting_layer(layer, parent_of, layers)
                waiting.setdefault(id(waiter), (waiter, {}))[1].update(
                    dict.fromkeys(indices)
                )
        self._indices_of_layer = {k: tuple(v) for k, (_, v) in waiting.items()}
        # the root always gets a pre-hook (strict mode, the order check)
        self._hooked_layers = [layer for layer, _ in waiting.values()]
        if id(layers) not in waiting:
            self._hooked_layers.insert(0, layers)
        reachable = {i for v in self._indices_of_layer.values() for i in v}
        if not reachable:
            raise ValueError(
                f"layers ({type(layers).__name__}) owns none of the "
                f"{len(self._params)} parameters of this optimizer: pass the "
                "model whose parameters() were given to the optimizer."
            )
        # no hook or guarded read sees these: waited right after launch
        self._unreachable = tuple(
            i for i in range(len(self._params)) if i not in reachable
        )

    @property
    def state(self):
        """:class:`BroadcastOverlapState`."""
        return self._state

    @property
    def order(self):
        """list[int] | None: the agreed order (positions in the optimizer's
        parameter list); None while recording."""
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
        """int: units due or in flight."""
        return sum(u.state is not UnitState.SYNCED for u in self._units)

    @property
    def num_hooks(self):
        """int: forward pre-hook handles held."""
        return len(self._pre_hook_handles)

    @property
    def bucket_storage(self):
        """broadcast_buckets.BucketStorage | None: in bucket modes."""
        return getattr(self._plan, "storage", None)

    def units_of(self, index):
        """list[CommUnit]: the units that deliver parameter ``index``."""
        return [u for u in self._units if index in u.indices]

    def open(self):
        """Install the pre-hooks (first in each layer's hook order) and the
        read interception, until :meth:`close`."""
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
            hook = _Hook(self._on_forward_pre)
            if _HAS_PREPEND:
                handle = layer.register_forward_pre_hook(hook, prepend=True)
            else:  # Paddle 2.6: the same move of the hook dict's entry
                handle = layer.register_forward_pre_hook(hook)
                layer._forward_pre_hooks.move_to_end(handle._hook_id, False)
            self._pre_hook_handles[id(layer)] = handle
        self._post_hook_handle = self._layers.register_forward_post_hook(
            _Hook(self._on_root_forward_post)
        )

    def close_with(self, owner):
        """Close this overlap when ``owner`` (the optimizer) is collected:
        marked closed then, unhooked at the next explicit call."""
        self._finalizer = weakref.finalize(owner, self._abandon)
        self._finalizer.atexit = False

    def _abandon(self):
        # inside garbage collection: no collective, no hook change
        if self._state is not BroadcastOverlapState.CLOSED:
            self._state = BroadcastOverlapState.CLOSED
            _OPEN.discard(self)
            _ABANDONED.append(self)

    def close(self):
        """Wait for pending units, remove every hook and guard; idempotent."""
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
        self._recorded = {}

    @contextlib.contextmanager
    def deferred_launch(self):
        """Hold :meth:`launch` back until the block ends (even if it raised):
        ``HybridParallelOptimizer._step``'s mp/pp parameter syncs come first,
        as in the blocking order."""
        self._defer_depth += 1
        try:
            yield
        finally:
            self._defer_depth -= 1
            if self._defer_depth == 0 and self._launch_deferred:
                self._launch_deferred = False
                self.launch()

    def launch(self):
        """Mark the units due after an update and start them in the agreed
        order (the first call agrees it); frozen units are skipped, units no
        layer waits for are waited at once. RuntimeError (names the rank):
        closed, a unit still pending, or the ranks' parameter lists differ."""
        self._check_state(
            BroadcastOverlapState.RECORDING, BroadcastOverlapState.ORDERED
        )
        if self._defer_depth:
            self._launch_deferred = True
            return
        if self._state is BroadcastOverlapState.RECORDING:
            self._order = self._agree_order()
            self._recorded = {}
            self._plan = self._make_plan()
            self._state = BroadcastOverlapState.ORDERED
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
        with paddle.profiler.RecordEvent("paddle_overlay::launch"):
            for unit in self._units:
                if unit.needs_sync():
                    unit.mark_due(self)
            self._next_start = self._first_unsynced = 0
            self._start_more()
        self._order_check_armed = True
        self.wait(self._unreachable_units, "waited_unreachable")

    def _agree_order(self):
        # rank 0 of the group decides: the count (int64 [1]) is checked
        # before the order (int64 [n]) is sent, so ranks with different
        # lists stop with an error instead of pairing the wrong tensors
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
        proposal = list(self._recorded)
        proposal += [i for i in range(n) if i not in self._recorded]
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
        return plan_units(
            self._order,
            self._params,
            self._src_ranks,
            self._group,
            cap_bytes=self._bucket_cap,
            fused_storages=self._fused_storages,
            comm_buffers=buffers() if callable(buffers) else buffers,
            alone=self._unreachable,
        )

    def _replan_if_replaced(self):
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
        self._units = units
        self._position_of = {id(u): k for k, u in enumerate(units)}
        unit_of = collections.defaultdict(dict)  # index -> {id: unit}
        for unit in units:
            for i in unit.indices:
                unit_of[i][id(unit)] = unit

        def units_for(indices):
            found = {}
            for i in indices:
                found.update(unit_of.get(i, {}))
            return tuple(found.values())

        self._units_of_layer = {
            key: units_for(indices)
            for key, indices in self._indices_of_layer.items()
        }
        self._unreachable_units = units_for(self._unreachable)

    def _start_more(self, through=-1):
        # every due unit up to position through, then up to the depth
        units, depth = self._units, self._max_in_flight
        while self._next_start < len(units) and (
            self._next_start <= through
            or depth is None
            or self._in_flight < depth
        ):
            started = units[self._next_start].start(self._comm)  # may raise
            self._next_start += 1
            if started:
                self._in_flight += 1
                self.stats["launched"] += 1

    def wait(self, units, reason, path=None):
        """Finish ``units`` (a due one first starts every unit before it),
        then start more up to the depth; counted under ``stats[reason]``
        (and ``read_paths[path]``). Returns the number waited now."""
        waited = 0
        for unit in units:
            if unit.state is UnitState.SYNCED:
                continue
            if unit.state is UnitState.DUE:
                self._start_more(self._position_of[id(unit)])
            span = f"paddle_overlay::wait {unit.label}"
            with paddle.profiler.RecordEvent(span):
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
        return self.wait(self._units, reason)

    def wait_before_update(self):
        self.wait_all("waited_before_update")

    def _on_forward_pre(self, layer, _inputs):
        # RECORDING: record first use; then wait for the layer's own units
        state = self._state
        if state is BroadcastOverlapState.RECORDING:
            self._recorded.update(
                dict.fromkeys(self._indices_of_layer.get(id(layer), ()))
            )
            return
        if layer is self._layers:
            self._in_root_forward = True
        if not PENDING or state is not BroadcastOverlapState.ORDERED:
            return
        if self._strict:
            self.wait_all("waited_in_forward")
            return
        units = self._units_of_layer.get(id(layer), ())
        if units:
            self._check_order(layer, units)
            self.wait(units, "waited_in_forward")

    def _on_root_forward_post(self, layer, _inputs, _outputs):
        # only the first root forward after a launch is order-checked
        self._in_root_forward = self._order_check_armed = False

    def _check_order(self, layer, units):
        # count (and warn once, in training) a layer that needs a unit while
        # an earlier one in the agreed order is not synced
        cursor, all_units = self._first_unsynced, self._units
        while (
            cursor < len(all_units)
            and all_units[cursor].state is UnitState.SYNCED
        ):
            cursor += 1
        self._first_unsynced = cursor
        if cursor == len(all_units):
            return
        first = all_units[cursor]
        pending = [u for u in units if u.state is not UnitState.SYNCED]
        if not pending or any(u is first for u in units):
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
            warnings.warn(
                f"parameter sync overlap: {type(layer).__name__} "
                f"({getattr(layer, '_full_name', '')}) needs "
                f"{pending[0].label} while {first.label}, earlier in the "
                "order agreed at the first step, is not synced yet: this "
                "forward uses the parameters in another order than the first "
                "one did, so some overlap is lost (results are not "
                "affected). Shown once.",
                stacklevel=2,
            )

    def _check_state(self, *allowed):
        if self._state not in allowed:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync overlap is "
                f"{self._state.value}, expected one of "
                f"{[s.value for s in allowed]}"
            )
