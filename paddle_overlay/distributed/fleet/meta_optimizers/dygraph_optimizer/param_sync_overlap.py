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
forward, with one owner (:class:`ParamSyncOverlap`) per optimizer.

NOTE [parameter sync overlap]
``sync_op=False`` collectives waited by forward pre-hooks (the approach of
PR #63945), by these rules:

* Units (``comm_unit.CommUnit``) own their tasks; a planner of
  ``unit_plan`` builds them.
* Order: forward's first use, recorded before the first update and sent
  once from rank 0 of the group: all ranks issue the same collectives in
  the same order (PR #63945 sorted them by ``param.name``).
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
  again, never in a GC finalizer. Paddle's own step code after the update
  reads or writes a parameter only after its unit is waited.
* Reads: every Python read of a parameter waits for its own unit, a
  compiled program for every unit (``read_interception``). Not seen: a
  tensor reference taken before ``step()`` (``strict``: the first hooked
  layer waits for everything).
* No host synchronisation and no collective of its own after the first
  step: a parameter's dtype or size change is refused before anything is
  sent. Replaced parameter memory is put back into its slot, locally.
* Hooks: registered once, removed together on disable.
* Counted and said: ``stats`` by who waited first (``sync_stats.SyncStat``);
  a training forward using units out of the agreed order warns once
  (``wait_map``); monitors of ``sync_stats.MONITORS`` are told of every
  launch, wait and training forward.
"""

import collections
import enum
import inspect
import os
import warnings
import weakref

import paddle

from . import read_interception, sync_registry, sync_stats
from .comm_unit import PaddleComm, UnitState
from .sync_stats import SyncStat
from .wait_map import LayerWaits

__all__ = []

_OWNER_ATTR = "_param_sync_overlap"
# Paddle 2.6's register_forward_pre_hook has no ``prepend``. A release flag:
# tools/make_patch.py keeps the branch of the release a patch is made for.
_HAS_PREPEND = (
    "prepend"
    in inspect.signature(paddle.nn.Layer.register_forward_pre_hook).parameters
)


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
    one), or None when overlap is off. Public views: ``stats``
    (dict[SyncStat, int]: ``launched``, ``waited_*`` by who waited first,
    ``waited_out_of_order``, ``rebound``), ``read_paths``, ``order``,
    ``lead``, ``units``, ``num_pending``, ``num_hooks``, ``state``."""
    while optimizer is not None:
        attributes = getattr(optimizer, "__dict__", {})
        owner = attributes.get(_OWNER_ATTR)
        if owner is not None:
            return owner
        optimizer = attributes.get("_inner_opt")
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


def prepare_param_sync_update(optimizer):
    """Before ``optimizer`` updates: wait for its pending syncs and check
    the parameters against the plan (:meth:`ParamSyncOverlap.before_update`,
    which says what it raises); nothing when the overlap is off."""
    overlap = get_param_sync_overlap(optimizer)
    if overlap is not None:
        overlap.before_update()


def wait_param_sync(optimizer):
    """Wait for the pending syncs of ``optimizer`` (``waited_on_demand``):
    before Paddle code reads or replaces every parameter (the optimizer's
    ``state_dict()``)."""
    overlap = get_param_sync_overlap(optimizer)
    if overlap is not None:
        overlap.wait_all(SyncStat.ON_DEMAND)


def wait_before_hybrid_sync(tensor):
    """Wait for the pending sync of ``tensor`` (a parameter of any open
    owner), before ``HybridParallelOptimizer._insert_sync`` sends or
    all-reduces it across the model- or pipeline-parallel group (both
    ``sync_mode`` s): that sync then reads and writes the value overlap off
    gives it, and never memory a sharding collective is still writing. The
    parameters those syncs cover are planned into the first units
    (:func:`plan_hybrid_synced_first`), so only they lose the overlap."""
    if sync_registry.PENDING:
        sync_registry.wait_for(tensor, SyncStat.FOR_HYBRID_SYNC)


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


class ParamSyncOverlap:
    """Owns the order, the plan, the units and the hook handles of one
    optimizer's overlapped parameter sync.

    Args:
        params (list[paddle.Tensor]): the optimizer's parameters, in its
            order (positions are what ranks agree on).
        group: the sharding process group (``paddle.distributed`` Group).
        layers (paddle.nn.Layer): the model that runs the forward.
        planner: a planner of ``unit_plan``; its ``collective`` names what
            the units send.
        method (str): the optimizer method that turned it on, named in
            errors and warnings.
        strict (bool | None): the root's pre-hook waits for everything
            (None: ``FLAGS_sharding_overlap_strict``).
        comm: ``comm_unit.PaddleComm`` or a test fake.

    Raises:
        TypeError / ValueError: bad ``layers`` or ``strict``; ``layers``
            owns none of ``params``.
    """

    def __init__(
        self, params, group, layers, planner, method, strict=None, comm=None
    ):
        strict = _check_arguments(layers, strict, method)
        self._method, self._planner = method, planner
        self._collective = planner.collective.replace("_", "-")  # in messages
        self._comm = comm if comm is not None else PaddleComm()
        self._params = list(params)
        self._group = group
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self._layers, self._strict = layers, strict
        self._waits = LayerWaits(layers, self._index_of)
        self.serial = sync_registry.next_serial()
        self._state = ParamSyncState.RECORDING
        self._launch = LaunchState.IDLE
        self._recorded = {}  # first-use order while RECORDING (dict as set)
        self._lead = {}  # positions planned into the first units (as set)
        self._lead_units = ()  # the units holding them, waited at launch
        self._order = self._plan = None
        self._pre_hook_handles = {}  # id(layer) -> handle
        self._post_hook_handle = self._finalizer = None
        self.stats = sync_stats.new_stats()
        # waited_on_read by path ("attribute", "iteration")
        self.read_paths = collections.Counter()

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
    def layers(self):
        """paddle.nn.Layer: the model whose forward waits."""
        return self._layers

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
        return list(self._waits.units)

    @property
    def num_pending(self):
        """int: units in flight (started, not waited)."""
        return sum(u.state is not UnitState.SYNCED for u in self._waits.units)

    @property
    def num_hooks(self):
        """int: forward pre-hook handles held."""
        return len(self._pre_hook_handles)

    @property
    def owning_layers(self):
        """list[paddle.nn.Layer]: layers owning managed parameters directly."""
        return list(self._waits.owning_layers)

    def index_of(self, param):
        """int | None: ``param``'s position in the optimizer's list."""
        return self._index_of.get(id(param))

    def units_of_layer(self, layer):
        """tuple[CommUnit]: the units ``layer``'s pre-hook waits for."""
        return self._waits.units_of(layer)

    def open(self):
        """Install the pre-hooks (first in each layer's hook order), until
        :meth:`close`."""
        self._check_state(ParamSyncState.RECORDING)
        if self._pre_hook_handles:
            raise RuntimeError("ParamSyncOverlap.open() called twice.")
        sync_registry.sweep_abandoned()
        if self._waits.unreachable:
            names = [self._params[i].name for i in self._waits.unreachable]
            warnings.warn(
                f"parameter sync overlap ({self._method}): {len(names)} "
                "optimizer parameter(s) are not owned by any layer of "
                f"{type(self._layers).__name__}, so no forward pre-hook can "
                f"wait for them: {names}. They are waited right after their "
                f"{self._collective} is launched (no overlap).",
                stacklevel=sync_stats.caller_stacklevel(),
            )
        sync_registry.add(self)
        read_interception.acquire(self)
        for layer in self._waits.hooked_layers:
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
            self.wait_all(SyncStat.ON_DEMAND)
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
            self.wait_all(SyncStat.ON_DEMAND)
        finally:
            self._remove_hooks()

    def _remove_hooks(self):
        for handle in self._pre_hook_handles.values():
            handle.remove()
        self._pre_hook_handles.clear()
        if self._post_hook_handle is not None:
            self._post_hook_handle.remove()
            self._post_hook_handle = None
        read_interception.release(self)
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
        if self._launch is LaunchState.STARTING:
            raise RuntimeError(
                f"rank {self._comm.rank()}: the last optimizer step raised "
                f"while starting its parameter {self._collective}s, so the "
                "ranks' parameters differ; restore them from a checkpoint "
                f"(turning the overlap off with optimizer.{self._method}"
                "(False) and on again clears this error)."
            )
        self.wait_all(SyncStat.BEFORE_UPDATE)
        if self._state is not ParamSyncState.ORDERED:
            return
        # a shared parameter's other owner may still be writing its bucket
        self._wait_for_other_owners(self._waits.units)
        self.stats[SyncStat.REBOUND] += self._plan.prepare(self._method)
        self._launch = LaunchState.CHECKED

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
        are skipped. Waited at once: the units planned first, which hold
        what Paddle's own step code reads next (the update returns with them
        synced, whichever code sends them on), and units no layer waits
        for.

        Raises:
            RuntimeError (names the rank): closed, a unit still pending, or
                the ranks' parameter lists differ.
            ValueError: a parameter's dtype or size changed since the first
                step (names it and the fix). Nothing is sent when raised.
        """
        self._check_state(ParamSyncState.RECORDING, ParamSyncState.ORDERED)
        checked = self._launch is LaunchState.CHECKED
        # until every unit has started: a launch that raised part way is
        # refused at the next update (before_update)
        self._launch = LaunchState.STARTING
        if self.num_pending:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync launch with "
                f"{self.num_pending} unit(s) still pending; step() and "
                "minimize() wait for them before the update."
            )
        if self._state is ParamSyncState.RECORDING:
            self._plan_units()
        elif not checked:
            self.stats[SyncStat.REBOUND] += self._plan.prepare(self._method)
        read_interception.refresh(self)
        units = self._plan.units()
        if units is not self._waits.units:
            self._waits.use(units)
            self._lead_units = tuple(
                u for u in units if any(i in self._lead for i in u.indices)
            )
        due = [unit for unit in units if unit.needs_sync()]
        self._wait_for_other_owners(due)
        self._waits.arm()
        with paddle.profiler.RecordEvent("ParamSyncOverlap::launch"):
            for unit in due:
                unit.start(self._comm)  # may raise: the started stay counted
                for param in unit.params:
                    sync_registry.PENDING[id(param)] = (self, unit)
                self.stats[SyncStat.LAUNCHED] += 1
        self._launch = LaunchState.IDLE
        sync_stats.notify("on_launch", self, due)
        self.wait(self._lead_units, SyncStat.FOR_HYBRID_SYNC)
        self.wait(self._waits.unreachable_units, SyncStat.UNREACHABLE)

    def _plan_units(self):
        # the first launch: agree the order (and the lead), plan the units
        order, lead = self._agree_order()
        first = [i for i in order if i in lead]
        rest = [i for i in order if i not in lead]
        # a planner error leaves the recorded order for the retry
        self._plan = self._planner.plan(
            first + rest,
            self._params,
            self._group,
            self._waits.unreachable,
            lead=len(first),
        )
        self._order, self._lead, self._recorded = order, lead, {}
        self._state = ParamSyncState.ORDERED

    def _wait_for_other_owners(self, units):
        # a parameter shared with another owner: its pending sync first
        if not sync_registry.PENDING:  # the common case: no other owner
            return
        for unit in units:
            for param in unit.params:
                entry = sync_registry.PENDING.get(id(param))
                if entry is not None and entry[0] is not self:
                    entry[0].wait((entry[1],), SyncStat.BY_OTHER_OWNER)

    def _agree_order(self):
        # rank 0 of the group decides: the count (int64 [1]) is checked
        # before the order (int64 [n]) is sent, so ranks with different
        # lists stop with an error instead of pairing the wrong tensors; a
        # position planned into the first units (self._lead) is sent as
        # position + n
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

    def wait(self, units, reason, path=None):
        """Finish this owner's ``units`` that are in flight, counted under
        ``stats[reason]`` (a :class:`SyncStat` wait reason; a read also
        under ``read_paths[path]``); issues no collective. Returns the
        number waited now."""
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
            if path is not None:
                self.read_paths[path] += waited
            sync_stats.notify("on_wait", self, waited, reason, path)
        return waited

    def wait_all(self, reason=SyncStat.ON_DEMAND):
        return self.wait(self._waits.units, reason)

    def _on_forward_pre(self, layer, _inputs):
        # RECORDING: record first use; then wait for the layer's own units
        state = self._state
        if state is ParamSyncState.RECORDING:
            self._recorded.update(
                dict.fromkeys(self._waits.positions_of(layer))
            )
            return
        if state is not ParamSyncState.ORDERED:
            return  # closed (or abandoned, its hooks removed later)
        if layer is self._layers:
            self._waits.enter_root()
            if self._layers.training and paddle.is_grad_enabled():
                sync_stats.notify("on_training_forward", self)
        if not sync_registry.PENDING:
            return
        if self._strict:
            self.wait_all(SyncStat.IN_FORWARD)
            return
        units = self._waits.units_of(layer)
        if units:
            if self._waits.out_of_order(layer, units, self._method):
                self.stats[SyncStat.OUT_OF_ORDER] += 1
            self.wait(units, SyncStat.IN_FORWARD)

    def _on_root_forward_post(self, layer, _inputs, _outputs):
        self._waits.leave_root()

    def _check_state(self, *allowed):
        if self._state not in allowed:
            raise RuntimeError(
                f"rank {self._comm.rank()}: parameter sync overlap is "
                f"{self._state.value}, expected one of "
                f"{[s.value for s in allowed]}"
            )


def _check_arguments(layers, strict, method):
    """``strict`` as given, or (None) the environment variable
    ``FLAGS_sharding_overlap_strict`` ("1"/"true" or "0"/"false", default
    "0"); TypeError / ValueError for bad arguments."""
    if layers is None:
        raise ValueError(
            "the overlap needs the model: pass the paddle.nn.Layer that "
            f"runs the forward, e.g. optimizer.{method}(True, "
            f"{'layers=model' if 'broadcast' in method else 'model'})."
        )
    if not isinstance(layers, paddle.nn.Layer):
        raise TypeError(
            "layers must be a paddle.nn.Layer (the model that runs the "
            f"forward), got {type(layers).__name__}."
        )
    if strict is None:
        raw = os.getenv("FLAGS_sharding_overlap_strict", "0")
        if raw.strip().lower() not in ("0", "1", "false", "true"):
            raise ValueError(
                "FLAGS_sharding_overlap_strict must be 0, 1, false or true, "
                f"got {raw!r}."
            )
        return raw.strip().lower() in ("1", "true")
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}.")
    return strict
