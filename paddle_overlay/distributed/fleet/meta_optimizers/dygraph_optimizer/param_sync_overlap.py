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

"""Sharding stage 1: the post-update parameter sync (V1's broadcast) overlapped
with the next forward, with one owner.
# series: v2
V2 (``split_param``) all-gathers its comm buffers on the same owner.
# series: end

NOTE [parameter sync overlap]
``sync_op=False`` collectives waited by forward pre-hooks (the approach of
PR #63945 for V1 and of V2's ``_set_all_gather_overlap_forward``), by these
rules:

* Units (``comm_unit.CommUnit``) own their tasks; a planner of
  ``unit_plan`` builds them.
* Order: forward's first use, recorded before the first update and sent
  once from rank 0 of the group: all ranks issue the same collectives in
  the same order (PR #63945 sorted V1's by ``param.name``; V2's hooks
  started gathers in ``set`` order, which differs across processes).
* Schedule: every unit starts inside ``step()``, where Paddle's blocking
  sync was (right after the update), on every rank, in the agreed order; no
  hook, read or compiled program ever issues a collective.
  So whatever user code runs between ``step()`` and the next forward (reads
  or forwards on one rank alone, then a barrier or an all-reduce), as long
  as that code issues the same collectives on every rank, every rank of
  each process group issues the same sequence of collectives and the
  ranks' sequences merge into one order without a wait cycle. Owners are
  visited in creation order (``sync_registry``).
* Waits: a pre-hook (first in its layer's order) per layer owning managed
  parameters, the optimizer's ``state_dict()`` and ``step()``; safe to call
  again, never in a GC finalizer.
* Paddle's own step code after the update: every parameter it reads or
  writes holds, when it does, the value overlap off gives it, and no
  collective of it runs on memory a unit is still writing.
  ``HybridParallelOptimizer._insert_sync`` (its model- and
  pipeline-parallel parameter syncs, both ``sync_mode`` s) waits for the
  parameter's unit first; the parameters those syncs cover are planned
  into the first units (``lead_with``, agreed with the order), so only
  they lose the overlap. V2's ``rebuild()`` and ``clear_param_storage()``
  wait for everything first, and the plan follows rebuilt comm buffers.
# series: reads
* Reads: every Python read of a parameter waits for its own unit, a
  compiled program for every unit (``read_interception``). Not seen: a
  tensor reference taken before ``step()`` (``strict=True``: the first
  hooked layer waits for everything).
# series: end
* No host synchronisation and no collective of its own after the first
  step: a parameter's dtype or size change is refused before anything is
  sent.
# series: buckets
  Replaced parameter memory is put back into its bucket slot, locally.
# series: end
* Hooks: registered once, removed together on disable.
* Said: a training forward using units out of the agreed order warns once.
# series: reads
  So does a forward most of whose units were already waited by reads (the
  overlap was lost).
# series: end
"""

import collections
import enum
import inspect
import os
import sys
import warnings
import weakref

import paddle

# series: until reads
# from . import sync_registry
# series: end
# series: reads
from . import read_interception, sync_registry

# series: end
from .comm_unit import PaddleComm, UnitState

__all__ = []

_OWNER_ATTR = "_param_sync_overlap"
_COLLECTIVE_NAMES = {
    "broadcast": "broadcast",
    # series: v2
    "all_gather": "all-gather",
    # series: end
}


def check_overlap_flag(flag, method, argument):
    """TypeError naming ``method(argument=...)`` unless ``flag`` is a bool."""
    if not isinstance(flag, bool):
        kind = type(flag)
        raise TypeError(
            f"{method}: {argument} must be a Python bool, got {flag!r} of "
            f"type {kind.__module__}.{kind.__qualname__}."
        )


def get_param_sync_overlap(optimizer):
    """The :class:`ParamSyncOverlap` of ``optimizer`` (a sharding optimizer,
    or a ``HybridParallelOptimizer`` or other ``_inner_opt`` wrapper around
    one), or None when overlap is off. Public counters: ``stats``
    (dict[str, int]: ``launched``, ``waited_*`` by who waited,
    ``waited_out_of_order``, ``rebound``), ``order``, ``units``,
    ``num_pending``, ``num_hooks``, ``state``."""
    while optimizer is not None:
        owner = vars(optimizer).get(_OWNER_ATTR)
        if owner is not None:
            return owner
        optimizer = vars(optimizer).get("_inner_opt")
    return None


def switch_owner(optimizer, new):
    """Close ``optimizer``'s owner, then open ``new`` (None: overlap off)."""
    sync_registry.sweep_abandoned()
    current = vars(optimizer).get(_OWNER_ATTR)
    if current is not None:
        vars(optimizer)[_OWNER_ATTR] = None  # off if opening the new raises
        current.close()
    if new is not None:
        new.open()
        new.close_with(optimizer)
    vars(optimizer)[_OWNER_ATTR] = new


def launch_param_sync(optimizer):
    """Start the parameter sync of ``optimizer`` when its overlap is on and
    return True; False when the overlap is off: the caller syncs without
    overlap."""
    overlap = get_param_sync_overlap(optimizer)
    if overlap is None:
        return False
    with paddle.no_grad():
        overlap.launch()
    return True


def wait_param_sync(optimizer, reason="waited_before_update"):
    """Wait for the pending parameter syncs of ``optimizer`` (counted as
    ``reason``); before an update, raise if the last launch stopped part way
    (see :meth:`ParamSyncOverlap.before_update`)."""
    overlap = get_param_sync_overlap(optimizer)
    if overlap is None:
        return
    if reason == "waited_before_update":
        overlap.before_update()
    else:
        overlap.wait_all(reason)


def wait_before_hybrid_sync(tensor):
    """Wait for the pending sync of ``tensor`` (a parameter of any open
    owner), before ``HybridParallelOptimizer._insert_sync`` sends or
    all-reduces it across the model- or pipeline-parallel group: that sync
    then reads and writes the value overlap off gives it, and never memory a
    sharding collective is still writing."""
    if sync_registry.PENDING:
        sync_registry.wait_for(tensor, "waited_for_hybrid_sync")


def plan_hybrid_synced_first(optimizer, params):
    """Plan ``params`` (the parameters ``HybridParallelOptimizer._step``
    syncs across its model- or pipeline-parallel group after the update)
    into the first units of ``optimizer``'s parameter sync, issued first:
    the wait before each such sync (:func:`wait_before_hybrid_sync`) then
    costs the least. Read only before the first launch plans the units;
    ``params`` may be a callable returning them (called only then)."""
    overlap = get_param_sync_overlap(optimizer)
    if overlap is not None and overlap.state is ParamSyncState.RECORDING:
        overlap.lead_with(params() if callable(params) else params)


class ParamSyncState(enum.Enum):
    RECORDING = "recording"  # hooks record the first-use order
    ORDERED = "ordered"  # order agreed; units launched after each update
    CLOSED = "closed"  # nothing pending; hooks removed (or to be)


class LaunchState(enum.Enum):
    IDLE = "idle"  # every unit of the last launch started (or none yet)
    CHECKED = "checked"  # before_update() checked the plan; launch is next
    STARTING = "starting"  # starting units; left so if a launch raised


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


# Paddle 2.6's register_forward_pre_hook has no ``prepend``. A release flag:
# tools/make_patch.py keeps the branch of the release a patch is made for.
_HAS_PREPEND = (
    "prepend"
    in inspect.signature(paddle.nn.Layer.register_forward_pre_hook).parameters
)
_STATS = (
    "launched waited_in_forward waited_in_program waited_before_update "
    "waited_unreachable waited_on_read waited_on_demand "
    "waited_by_other_owner waited_for_hybrid_sync waited_out_of_order "
    "rebound"
).split()


_HERE = os.path.dirname(os.path.abspath(__file__))
# frames of Paddle and of this package are not the user's line
_LIBRARY_DIRS = tuple(
    {
        os.path.dirname(os.path.abspath(paddle.__file__)) + os.sep,
        os.path.dirname(os.path.abspath(os.__file__)) + os.sep,  # stdlib
        os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
        )
        + os.sep,
    }
)


def _user_frame():
    """(frame, stacklevel for ``warnings.warn`` called by our caller) of the
    innermost frame outside Paddle and this package."""
    frame, level = sys._getframe(2), 1
    while frame is not None and frame.f_code.co_filename.startswith(
        _LIBRARY_DIRS
    ):
        frame, level = frame.f_back, level + 1
    return frame, level


def _user_stacklevel():
    return _user_frame()[1]


# series: reads
# waits that take the overlap away from the next forward
_READ_WAITS = ("waited_on_read", "waited_in_program")


def _user_line():
    frame, _ = _user_frame()
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


# series: end
def _waiting_layer(layer, parent_of, root):
    # a container without forward (ParameterList) never runs: its nearest
    # ancestor with a forward waits
    while layer is not root and type(layer).forward is paddle.nn.Layer.forward:
        layer = parent_of.get(id(layer), root)
    return layer


class ParamSyncOverlap:
    """Owns the order, the plan, the units and the hook handles of one
    optimizer's overlapped parameter sync.

    Args:
        params (list[paddle.Tensor]): the optimizer's parameters, in its
            order (positions are what ranks agree on).
        group: the sharding process group (``paddle.distributed`` Group).
        layers (paddle.nn.Layer): the model that runs the forward.
        planner: a planner of ``unit_plan`` (``PerParameter``, ``Buckets``,
            ``FusedSlices``, ``CommBuffers``).
        method (str): the optimizer method that turned it on, named in
            errors and warnings.
        strict (bool): the root's pre-hook waits for everything.
        comm: ``comm_unit.PaddleComm`` or a test fake.

    Raises:
        TypeError / ValueError: bad ``layers`` or ``strict``; ``layers``
            owns none of ``params``.
    """

    def __init__(
        self, params, group, layers, planner, method, strict=False, comm=None
    ):
        self._check_arguments(layers, strict)
        self._method, self._planner = method, planner
        self._collective = _COLLECTIVE_NAMES[planner.collective]
        self._comm = comm if comm is not None else PaddleComm()
        self._params = list(params)
        self._group = group
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self._map_waiting_layers(layers, strict)
        self.serial = sync_registry.next_serial()
        self._state = ParamSyncState.RECORDING
        self._recorded = {}  # first-use order while RECORDING (dict as set)
        self._order = self._plan = None
        self._lead = {}  # positions planned into the first units (as set)
        self._use_units([])
        self._first_unsynced = 0  # the order check looks from here
        self._order_check_armed = self._in_root_forward = False
        self._warned_order = False
        # series: reads
        # the lost-overlap check of the next root forward after a launch
        self._lost_check_armed = self._warned_lost = False
        self._started_now, self._read_waited_now = 0, 0
        self._first_read = None
        # series: end
        self._pre_hook_handles = {}  # id(layer) -> handle
        self._post_hook_handle = self._finalizer = None
        self._launch = LaunchState.IDLE
        # public counters (get_param_sync_overlap); waited_out_of_order: a
        # layer waited while an earlier unit was not synced (less overlap)
        self.stats = dict.fromkeys(_STATS, 0)
        # series: reads
        # waited_on_read by path ("attribute", "iteration")
        self.read_paths = collections.Counter()
        # series: end

    def _check_arguments(self, layers, strict):
        if layers is None:
            raise ValueError(
                "the overlap needs the model: pass the paddle.nn.Layer that "
                "runs the forward, e.g. optimizer._set_broadcast_overlap("
                "True, layers=model)"
                # series: v2
                " or optimizer._set_all_gather_overlap_forward(True, model)"
                # series: end
                "."
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
        # the root always gets a pre-hook (strict mode, the checks)
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
        """:class:`ParamSyncState`."""
        return self._state

    @property
    def method(self):
        """str: the optimizer method that turned the overlap on."""
        return self._method

    @property
    def collective(self):
        """str: what a unit sends: ``"broadcast"`` (V1), ``"all-gather"``
        (V2)."""
        return self._collective

    @property
    def order(self):
        """list[int] | None: the agreed order (positions in the optimizer's
        parameter list); None while recording."""
        return None if self._order is None else list(self._order)

    @property
    def lead(self):
        """list[int]: the positions planned into the first units (agreed at
        the first step; :meth:`lead_with`), in the agreed order."""
        return [i for i in self._order or () if i in self._lead]

    @property
    def units(self):
        """list[comm_unit.CommUnit]: the units of the last launch, in order."""
        return list(self._units)

    @property
    def num_pending(self):
        """int: units in flight (started, not waited)."""
        return sum(u.state is not UnitState.SYNCED for u in self._units)

    @property
    def num_hooks(self):
        """int: forward pre-hook handles held."""
        return len(self._pre_hook_handles)

    @property
    def owning_layers(self):
        """list[paddle.nn.Layer]: layers owning managed parameters directly."""
        return list(self._owning_layers)

    def index_of(self, param):
        """int | None: ``param``'s position in the optimizer's list."""
        return self._index_of.get(id(param))

    def units_of_layer(self, layer):
        """tuple[CommUnit]: the units ``layer``'s pre-hook waits for."""
        return self._units_of_layer.get(id(layer), ())

    def open(self):
        """Install the pre-hooks (first in each layer's hook order), until
        :meth:`close`."""
        self._check_state(ParamSyncState.RECORDING)
        if self._pre_hook_handles:
            raise RuntimeError("ParamSyncOverlap.open() called twice.")
        sync_registry.sweep_abandoned()
        if self._unreachable:
            names = [self._params[i].name for i in self._unreachable]
            warnings.warn(
                f"parameter sync overlap ({self._method}): {len(names)} "
                "optimizer parameter(s) are not owned by any layer of "
                f"{type(self._layers).__name__}, so no forward pre-hook can "
                f"wait for them: {names}. They are waited right after their "
                f"{self._collective} is launched (no overlap).",
                stacklevel=_user_stacklevel(),
            )
        sync_registry.add(self)
        # series: reads
        read_interception.acquire(self)
        # series: end
        for layer in self._hooked_layers:
            hook = _Hook(self._on_forward_pre)
            if _HAS_PREPEND:
                handle = layer.register_forward_pre_hook(hook, prepend=True)
            else:
                # no prepend argument: move the hook to the front by hand
                handle = layer.register_forward_pre_hook(hook)
                layer._forward_pre_hooks.move_to_end(handle._hook_id, False)
            self._pre_hook_handles[id(layer)] = handle
        self._post_hook_handle = self._layers.register_forward_post_hook(
            _Hook(self._on_root_forward_post)
        )

    def close_with(self, optimizer):
        """Close this overlap when ``optimizer`` is collected: marked closed
        then, unhooked at the next explicit call."""
        self._finalizer = weakref.finalize(optimizer, self._abandon)
        self._finalizer.atexit = False

    def _abandon(self):
        # inside garbage collection: no collective, no hook change
        if self._state is not ParamSyncState.CLOSED:
            self._state = ParamSyncState.CLOSED
            sync_registry.abandon(self)

    def release_abandoned(self):
        """Wait and unhook an owner whose optimizer was collected."""
        try:
            self.wait_all("waited_on_demand")
        finally:
            self._remove_hooks()

    def close(self):
        """Wait for pending units, remove every hook and guard; idempotent."""
        sync_registry.sweep_abandoned()
        if self._state is ParamSyncState.CLOSED:
            return
        self._state = ParamSyncState.CLOSED
        sync_registry.discard(self)
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
        # series: reads
        read_interception.release(self)
        # series: end
        self._recorded = {}

    def before_update(self):
        """Wait for every pending unit before the optimizer updates; after
        the first step also check the parameters against the plan and put
        replaced memory back into its slot (local, no collective).

        Raises:
            RuntimeError: the last launch raised after starting part of its
                units, so the ranks' parameters differ; nothing is waited.
            ValueError: a parameter's dtype or size changed (names it and
                the fix); raised before the update changes anything.
        """
        self._check_launch_finished()
        self.wait_all("waited_before_update")
        if self._state is not ParamSyncState.ORDERED:
            return
        # a shared parameter's other owner may still be writing its bucket
        self._wait_for_other_owners(self._units)
        self.stats["rebound"] += self._plan.prepare(self._method)
        self._launch = LaunchState.CHECKED

    def _check_launch_finished(self):
        if self._launch is LaunchState.STARTING:
            raise RuntimeError(
                f"rank {self._comm.rank()}: the last optimizer step raised "
                f"while starting its parameter {self._collective}s, so the "
                "ranks' parameters differ; restore them from a checkpoint "
                f"(turning the overlap off with optimizer.{self._method}"
                "(False) and on again clears this error)."
            )

    def lead_with(self, params):
        """Plan ``params`` (those of this owner's parameters that Paddle's
        own step code reads after the update) into the first units, issued
        first; only while recording (the first launch plans the units).
        The set is agreed with the order (rank 0's)."""
        self._check_state(ParamSyncState.RECORDING)
        found = (self._index_of.get(id(p)) for p in params)
        self._lead = {i: None for i in found if i is not None}

    def launch(self):
        """Start every unit that needs a sync after an update, in the agreed
        order (the first call agrees it: one int64 broadcast of the count
        and one of the order, the only host synchronisation); frozen units
        are skipped, units no layer waits for are waited at once.

        Raises:
            RuntimeError (names the rank): closed, a unit still pending, or
                the ranks' parameter lists differ.
            ValueError: a parameter's dtype or size changed since the first
                step (names it and the fix). Nothing is sent when raised.
        """
        self._check_state(ParamSyncState.RECORDING, ParamSyncState.ORDERED)
        checked = self._launch is LaunchState.CHECKED
        # until every unit has started: a launch that raised part way is
        # refused at the next update (_check_launch_finished)
        self._launch = LaunchState.STARTING
        if self.num_pending:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync launch with "
                f"{self.num_pending} unit(s) still pending; step() and "
                "minimize() wait for them before the update."
            )
        if self._state is ParamSyncState.RECORDING:
            order, lead = self._agree_order()
            first = [i for i in order if i in lead]
            rest = [i for i in order if i not in lead]
            # a planner error leaves the recorded order for the retry
            self._plan = self._planner.plan(
                first + rest,
                self._params,
                self._group,
                self._unreachable,
                lead=len(first),
            )
            self._order, self._lead, self._recorded = order, lead, {}
            self._state = ParamSyncState.ORDERED
        elif not checked:
            self.stats["rebound"] += self._plan.prepare(self._method)
        # series: reads
        read_interception.refresh(self)
        # series: end
        units = self._plan.units()
        if units is not self._units:
            self._use_units(units)
        due = [unit for unit in self._units if unit.needs_sync()]
        self._wait_for_other_owners(due)
        self._first_unsynced = 0
        self._order_check_armed, self._in_root_forward = True, False
        # series: reads
        self._lost_check_armed = True
        self._started_now = self._read_waited_now = 0
        self._first_read = None
        # series: end
        with paddle.profiler.RecordEvent("ParamSyncOverlap::launch"):
            for unit in due:
                unit.start(self._comm)  # may raise: the started stay counted
                for param in unit.params:
                    sync_registry.PENDING[id(param)] = (self, unit)
                self.stats["launched"] += 1
                # series: reads
                self._started_now += 1
                # series: end
        self._launch = LaunchState.IDLE
        self.wait(self._unreachable_units, "waited_unreachable")

    def _wait_for_other_owners(self, units):
        # a parameter shared with another owner: its pending sync first
        if not sync_registry.PENDING:  # the common case: no other owner
            return
        for unit in units:
            for param in unit.params:
                entry = sync_registry.PENDING.get(id(param))
                if entry is not None and entry[0] is not self:
                    entry[0].wait((entry[1],), "waited_by_other_owner")

    def _agree_order(self):
        # rank 0 of the group decides: the count (int64 [1]) is checked
        # before the order (int64 [n]) is sent, so ranks with different
        # lists stop with an error instead of pairing the wrong tensors; a
        # position planned first (lead_with) is sent as position + n
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
        proposal = [i + n if i in self._lead else i for i in proposal]
        agreed = self._broadcast_int64(proposal, first_rank)
        order = [v % n for v in agreed]
        if sorted(order) != list(range(n)) or not all(
            0 <= v < 2 * n for v in agreed
        ):
            raise RuntimeError(
                f"rank {self._comm.rank()}: the order received from "
                f"rank {first_rank} is not a permutation of 0..{n - 1}."
            )
        return order, {v - n: None for v in agreed if v >= n}

    def _broadcast_int64(self, values, src):
        message = paddle.to_tensor(values, dtype="int64")
        self._comm.broadcast(message, src=src, group=self._group, sync_op=True)
        return [int(v) for v in message.numpy().tolist()]

    def _use_units(self, units):
        self._units = units
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

    # series: until reads
    # def wait(self, units, reason):
    # series: end
    # series: reads
    def wait(self, units, reason, path=None):
        # series: end
        """Finish this owner's ``units`` that are in flight, counted under
        ``stats[reason]`` (a read: also ``read_paths[path]``); issues no
        collective. Returns the number waited now."""
        waited = 0
        for unit in units:
            if unit.state is UnitState.SYNCED:
                continue
            with paddle.profiler.RecordEvent(
                f"ParamSyncOverlap::wait {unit.label}"
            ):
                unit.finish()
            for param in unit.params:
                entry = sync_registry.PENDING.get(id(param))
                if entry is not None and entry[1] is unit:
                    del sync_registry.PENDING[id(param)]
            waited += 1
        if waited:
            self.stats[reason] += waited
            # series: reads
            if path is not None:
                self.read_paths[path] += waited
            if reason in _READ_WAITS and self._lost_check_armed:
                self._read_waited_now += waited
                if self._first_read is None:
                    where = path or "compiled program"
                    self._first_read = (where, _user_line())
            # series: end
        return waited

    def wait_all(self, reason="waited_on_demand"):
        return self.wait(self._units, reason)

    def _on_forward_pre(self, layer, _inputs):
        # RECORDING: record first use; then wait for the layer's own units
        state = self._state
        if state is ParamSyncState.RECORDING:
            self._recorded.update(
                dict.fromkeys(self._indices_of_layer.get(id(layer), ()))
            )
            return
        if state is not ParamSyncState.ORDERED:
            return  # closed (or abandoned, its hooks removed later)
        if layer is self._layers:
            self._in_root_forward = True
            # series: reads
            # decided at the next training forward (eval forwards wait in
            # their hooks, which is no loss)
            if (
                self._lost_check_armed
                and self._layers.training
                and paddle.is_grad_enabled()
            ):
                self._check_lost_overlap()
            # series: end
        if not sync_registry.PENDING:
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

    # series: reads
    def _check_lost_overlap(self):
        # at the first root forward after a launch: were most of its units
        # already waited by reads between step() and this forward?
        self._lost_check_armed = False
        if self._warned_lost or 2 * self._read_waited_now <= self._started_now:
            return
        self._warned_lost = True
        path, line = self._first_read
        warnings.warn(
            f"parameter sync overlap ({self._method}): "
            f"{self._read_waited_now} of the {self._started_now} "
            f"{self._collective}s launched by the last step() were waited "
            f"by reads before this forward (first: {path} at {line}), so "
            "they did not overlap the forward. To keep the overlap, read the "
            "parameters after the forward (e.g. log gradient norms after "
            "loss.backward() or every N steps), or accept it. Shown once.",
            stacklevel=_user_stacklevel(),
        )

    # series: end
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
                f"parameter sync overlap ({self._method}): "
                f"{type(layer).__name__} "
                f"({getattr(layer, '_full_name', '')}) needs "
                f"{pending[0].label} while {first.label}, earlier in the "
                "order agreed at the first step, is not synced yet: this "
                "forward uses the parameters in another order than the first "
                "one did, so some overlap is lost (results are not "
                "affected). Shown once.",
                stacklevel=_user_stacklevel(),
            )

    def _check_state(self, *allowed):
        if self._state not in allowed:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync overlap is "
                f"{self._state.value}, expected one of "
                f"{[s.value for s in allowed]}"
            )
