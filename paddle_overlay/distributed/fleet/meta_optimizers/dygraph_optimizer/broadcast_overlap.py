# Copyright (c) 2026 paddle_overlay authors. All Rights Reserved.
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
  parameters, recorded by the forward pre-hooks between enabling and the
  first update. Rank 0 of the sharding group then broadcasts its recorded
  order once, as positions in the optimizer's parameter list, so every rank
  issues the same collectives in the same order (an order taken from names or
  recorded independently per rank can differ between ranks: on NCCL that
  hangs or pairs the wrong tensors). Upstream sorts by the integer in
  ``param.name``, which is not the forward order in general.
* Waits. Every layer that owns managed parameters directly
  (``parameters(include_sublayers=False)``) gets a pre-hook, not only leaf
  layers, placed before any other pre-hook of that layer; a container
  without ``forward`` (``ParameterList``) is waited for by its parent.
  Parameters that no layer of ``layers`` owns are waited for right after
  launch (with one warning). ``state_dict()`` and ``set_state_dict()`` of
  any layer of the model, the optimizer's ``state_dict()``, and the next
  ``step()``/``minimize()`` wait for whatever is still pending, so no
  manual synchronize is needed before ``paddle.save`` or inference.
  Not intercepted (README, "Use in a training script"): direct access to
  parameters between ``step()`` and the next forward (``param.numpy()``,
  ``set_value``, ``copy.deepcopy(model)``, ``model.to(dtype)``), and a read
  before its owner layer runs in the same forward (use ``strict=True``).
* Hooks. Registered once when overlap is enabled, kept in a dict keyed by
  layer, removed together when it is disabled; upstream registers them every
  step and ``minimize()`` never removes them.

Every wait is safe to call again: it returns at once when nothing is pending.
On GPUs ``task.wait()`` makes the compute stream wait for the comm stream; it
does not block the host.
"""

import contextlib
import enum
import types
import warnings
import weakref
from copy import deepcopy as _deepcopy

import paddle

__all__ = [
    "BroadcastOverlapState",
    "StageOneBroadcastOverlap",
    "check_broadcast_overlap_flag",
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


class BroadcastOverlapState(enum.Enum):
    """Life cycle of :class:`StageOneBroadcastOverlap`."""

    # Hooks installed; forward pre-hooks record the first-use order.
    # No broadcast is in flight yet.
    RECORDING = "recording"
    # The order is agreed across the sharding group; after each update the
    # broadcasts are launched in that order and waited by the hooks.
    ORDERED = "ordered"
    # Hooks removed and nothing pending; the object is spent.
    CLOSED = "closed"


def _owned_parameters(layer):
    return layer.parameters(include_sublayers=False)


def _waiting_layer(layer, parent_of, root):
    """The layer whose pre-hook waits for ``layer``'s own parameters.

    A container without ``forward`` (``ParameterList``, ``ParameterDict``)
    never runs: its parent reads its parameters, so the nearest ancestor
    with a ``forward`` waits for them.
    """
    while layer is not root and type(layer).forward is paddle.nn.Layer.forward:
        layer = parent_of.get(id(layer), root)
    return layer


# Loading methods that must wait for pending broadcasts first.
_LOAD_METHODS = ("set_state_dict", "set_dict", "load_dict")
# layer -> WeakSet of StageOneBroadcastOverlap: the owners a load on it
# waits for (several optimizers can share one model). Weak both ways: an
# owner refers to its layers, so a strong value would keep the key alive.
_LOAD_WAITERS = weakref.WeakKeyDictionary()
# Every owner between open() and close(); paddle_overlay.remove() checks it.
_OPEN = weakref.WeakSet()


class _WaitingLoad:
    """Stands in for ``layer.set_state_dict`` (and its aliases) in the
    layer's ``__dict__``: waits for every owner's pending broadcasts, then
    loads, so no broadcast lands after the loaded values. It calls the
    instance attribute it replaced, if the user had set one, else the
    class's method. A ``copy.deepcopy`` of the layer gets plain methods."""

    def __init__(self, layer, name, replaced=None):
        self._layer = weakref.ref(layer)
        self._name = name
        self.replaced = replaced  # the user's instance attribute, restored later

    def __call__(self, *args, **kwargs):
        layer = self._layer()
        if layer is None:
            raise RuntimeError(
                f"{self._name} belongs to a layer that no longer exists "
                "(a copy.copy of a layer under broadcast overlap); use "
                "copy.deepcopy instead."
            )
        for owner in list(_LOAD_WAITERS.get(layer, ())):
            owner.stats["waited_on_demand"] += owner.wait_all()
        if self.replaced is not None:
            return self.replaced(*args, **kwargs)
        return getattr(type(layer), self._name)(layer, *args, **kwargs)

    def __deepcopy__(self, memo):
        layer = self._layer()
        copy = memo.get(id(layer))
        if self.replaced is not None:
            return _deepcopy(self.replaced, memo)
        if copy is None:
            return self
        return types.MethodType(getattr(type(copy), self._name), copy)


def _add_load_waiter(layer, owner):
    waiters = _LOAD_WAITERS.setdefault(layer, weakref.WeakSet())
    if not waiters:
        for name in _LOAD_METHODS:
            if hasattr(type(layer), name):
                current = layer.__dict__.get(name)
                if isinstance(current, _WaitingLoad):
                    continue
                object.__setattr__(
                    layer, name, _WaitingLoad(layer, name, replaced=current)
                )
    waiters.add(owner)


def _remove_load_waiter(layer, owner):
    waiters = _LOAD_WAITERS.get(layer, ())
    if owner in waiters:
        waiters.discard(owner)
    if not waiters:
        _LOAD_WAITERS.pop(layer, None)
        for name in _LOAD_METHODS:
            current = layer.__dict__.get(name)
            if isinstance(current, _WaitingLoad):
                if current.replaced is None:
                    object.__delattr__(layer, name)
                else:
                    object.__setattr__(layer, name, current.replaced)


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


def _noop_hook(*_args):
    return None


def open_overlaps():
    """list[StageOneBroadcastOverlap]: every one opened and not yet closed."""
    return list(_OPEN)


class StageOneBroadcastOverlap:
    """Owns the broadcast order, the pending tasks and the hook handles.

    Nothing else touches the pending tasks: the optimizer methods call
    :meth:`launch` after an update, :meth:`wait_all` before one, and the
    hooks call :meth:`wait` (see NOTE [broadcast overlap] in this module).

    Args:
        params (list[paddle.Tensor]): the optimizer's full parameter list, in
            the same order on every rank of the sharding group (the order of
            ``DygraphShardingOptimizer._origin_parameter_list``).
        src_ranks (list[int]): for each entry of ``params``, the global rank
            that owns and broadcasts it.
        group (paddle.distributed.collective.Group): the sharding process group.
        layers (paddle.nn.Layer): the model that runs the forward.
        strict (bool): if True, the first hooked layer to run in a forward
            waits for every pending task (no overlap), for models that read
            parameters without calling their owner layer
            (``F.linear(x, self.proj.weight)``).

    Raises:
        TypeError: ``layers`` is not a ``paddle.nn.Layer`` or ``strict`` is
            not a bool.
        ValueError: ``layers`` is None or owns none of ``params``.

    The constructor only validates and builds tables; :meth:`open` installs
    the hooks, so a rejected call changes nothing.
    """

    def __init__(self, params, src_ranks, group, layers, strict=False):
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
            raise TypeError(f"strict must be a bool, got {type(strict).__name__}.")
        if len(params) != len(src_ranks):
            raise ValueError(
                f"got {len(params)} parameters but {len(src_ranks)} source ranks."
            )

        # -- identity: positions in the optimizer's list, the same on every
        #    rank (parameter names can differ between ranks).
        self._params = list(params)
        self._src_ranks = list(src_ranks)
        self._group = group
        self._index_of = {id(p): i for i, p in enumerate(self._params)}

        # -- where each parameter is waited: every layer that owns managed
        #    parameters directly, tied parameters under each owner.
        self._layers = layers
        self._strict = strict
        self._all_layers = layers.sublayers(include_self=True)
        parent_of = {}
        for layer in self._all_layers:
            for child in layer.children():
                parent_of.setdefault(id(child), layer)
        waiting = {}  # id(waiting layer) -> (layer, [indices])
        for layer in self._all_layers:
            indices = [
                self._index_of[id(p)]
                for p in _owned_parameters(layer)
                if id(p) in self._index_of
            ]
            if indices:
                waiter = _waiting_layer(layer, parent_of, layers)
                waiting.setdefault(id(waiter), (waiter, []))[1].extend(indices)
        # [(layer, tuple of indices)], in sublayer order
        self._layer_indices = [
            (layer, tuple(dict.fromkeys(indices)))
            for layer, indices in waiting.values()
        ]
        reachable = {i for _, indices in self._layer_indices for i in indices}
        if not reachable:
            raise ValueError(
                f"layers ({type(layers).__name__}) owns none of the "
                f"{len(self._params)} parameters of this optimizer: pass the "
                "model whose parameters() were given to the optimizer."
            )
        # Parameters no hook will wait for: waited right after launch.
        self._unreachable = tuple(
            i for i in range(len(self._params)) if i not in reachable
        )

        # -- the order: recorded from forward while RECORDING, then agreed.
        self._state = BroadcastOverlapState.RECORDING
        self._recorded = []
        self._recorded_set = set()
        self._order = None

        # -- in flight: index -> task, in launch order.
        self._pending = {}

        # -- hook handles, paired: removed together in close().
        self._pre_hook_handles = {}  # id(layer) -> handle
        self._state_dict_hook_handles = {}  # id(layer) -> handle
        self._post_hook_handle = None
        self._warned_unwaited = False
        self._finalizer = None  # see close_with

        # -- launch deferred while the hybrid optimizer still syncs
        #    parameters after the update (see deferred_launch).
        self._defer_depth = 0
        self._launch_deferred = False

        # -- counts, for tests and benchmarks.
        self.stats = {
            "launched": 0,
            "waited_in_forward": 0,
            # forward waited for a task while an earlier-launched one was
            # still pending: forward order differs from the broadcast order
            # on this rank (overlap is reduced; results are not affected).
            "waited_out_of_order": 0,
            "waited_before_update": 0,
            "waited_unreachable": 0,
            "waited_on_demand": 0,
        }

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
        """int: hook handles currently held (forward pre-hooks, state-dict
        hooks and the forward post-hook of ``layers``)."""
        return (
            len(self._pre_hook_handles)
            + len(self._state_dict_hook_handles)
            + (self._post_hook_handle is not None)
        )

    # ------------------------------------------------------------------
    # life cycle
    def open(self):
        """Install the hooks (once; they stay until :meth:`close`).

        Forward pre-hooks go first in each layer's hook order, so a user's
        own pre-hook (``weight_norm``'s, say) reads waited parameters.
        """
        self._check_state(BroadcastOverlapState.RECORDING)
        assert not self._pre_hook_handles, "open() called twice"
        root = self._layers
        if self._unreachable:
            names = [self._params[i].name for i in self._unreachable]
            warnings.warn(
                f"broadcast overlap: {len(names)} optimizer parameter(s) are "
                f"not owned by any layer of {type(root).__name__}, so no "
                f"forward pre-hook can wait for them: {names}. They are "
                "waited right after their broadcast is launched (no overlap).",
                stacklevel=3,
            )
        _OPEN.add(self)
        if not any(layer is root for layer, _ in self._layer_indices):
            # The root always gets a pre-hook: strict mode and order
            # recording of root-owned parameters run there.
            self._add_pre_hook(root, ())
        for layer, indices in self._layer_indices:
            self._add_pre_hook(layer, indices)
        # Hooks are _Hook objects, not bound methods: see _Hook.
        state_dict_hook = _Hook(self._on_state_dict)
        for layer in self._all_layers:
            self._state_dict_hook_handles[id(layer)] = (
                layer.register_state_dict_hook(state_dict_hook)
            )
            _add_load_waiter(layer, self)
        self._post_hook_handle = root.register_forward_post_hook(
            _Hook(self._on_root_forward_post)
        )

    def close_with(self, owner):
        """Close when ``owner`` (the optimizer) is garbage-collected, so an
        optimizer deleted with overlap still on leaves no hooks behind."""
        self._finalizer = weakref.finalize(owner, self.close)
        self._finalizer.atexit = False

    def close(self):
        """Wait for every pending task and remove every hook. Idempotent;
        the object is closed even if a step of it fails."""
        if self._state is BroadcastOverlapState.CLOSED:
            return
        self._state = BroadcastOverlapState.CLOSED
        _OPEN.discard(self)
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            self.wait_all()
        finally:
            for handles in (self._pre_hook_handles, self._state_dict_hook_handles):
                for handle in handles.values():
                    handle.remove()
                handles.clear()
            if self._post_hook_handle is not None:
                self._post_hook_handle.remove()
                self._post_hook_handle = None
            for layer in self._all_layers:
                _remove_load_waiter(layer, self)
            self._recorded, self._recorded_set = [], set()

    # ------------------------------------------------------------------
    # launching and waiting
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
        """Broadcast every trainable parameter from its owner, ``sync_op=False``.

        Called after each update, in place of the blocking broadcast (inside
        :meth:`deferred_launch`, when that block ends). The
        first call agrees the order across the sharding group (one blocking
        broadcast of ``len(params)`` int64 positions from the group's first
        rank). Frozen parameters (``stop_gradient=True``) are not broadcast:
        no rank changes them. Parameters that no layer owns are waited at once.

        Raises:
            AssertionError (broken invariant, names the rank): a task of the
                previous launch was never waited, or ranks disagree on the
                number of parameters.
        """
        self._check_state(
            BroadcastOverlapState.RECORDING, BroadcastOverlapState.ORDERED
        )
        if self._defer_depth:
            self._launch_deferred = True
            return
        if self._state is BroadcastOverlapState.RECORDING:
            self._order = self._agree_order()
            self._recorded, self._recorded_set = [], set()
            self._state = BroadcastOverlapState.ORDERED
        assert not self._pending, (
            f"rank {paddle.distributed.get_rank()}: launch() with "
            f"{len(self._pending)} broadcast task(s) still pending; "
            "wait_all() must run before every update."
        )
        group = self._group
        for i in self._order:
            param = self._params[i]
            if param.stop_gradient:
                continue
            self._pending[i] = paddle.distributed.broadcast(
                param, src=self._src_ranks[i], group=group, sync_op=False
            )
        self.stats["launched"] += len(self._pending)
        self.stats["waited_unreachable"] += self._wait(self._unreachable)

    def wait_all(self):
        """Wait for every pending task, in launch order.

        Returns:
            int: how many tasks were waited.
        """
        return self._wait(list(self._pending))

    def wait_before_update(self):
        """Called by ``step()``/``minimize()`` before anything is updated."""
        self.stats["waited_before_update"] += self.wait_all()

    def _wait(self, indices):
        count = 0
        pending = self._pending
        for i in indices:
            task = pending.pop(i, None)
            if task is not None:
                task.wait()
                count += 1
        return count

    def _agree_order(self):
        """Rank 0 of the sharding group decides; every rank adopts its order."""
        n = len(self._params)
        seen = self._recorded_set
        proposal = self._recorded + [i for i in range(n) if i not in seen]
        # [n + 1] int64: the parameter count first, so that a rank with a
        # different list is caught instead of pairing the wrong tensors.
        message = paddle.to_tensor([n, *proposal], dtype="int64")
        paddle.distributed.broadcast(
            message, src=self._group.ranks[0], group=self._group, sync_op=True
        )
        agreed = [int(v) for v in message.numpy().tolist()]
        rank = paddle.distributed.get_rank()
        assert agreed[0] == n and sorted(agreed[1:]) == list(range(n)), (
            f"rank {rank}: the sharding group disagrees on the optimizer's "
            f"parameter list ({n} parameters here, {agreed[0]} on the group's "
            "first rank); every rank must build the same model and optimizer."
        )
        return agreed[1:]

    # ------------------------------------------------------------------
    # hooks
    def _add_pre_hook(self, layer, indices):
        strict = self._strict

        def forward_pre_hook(_layer, _inputs):
            if self._state is BroadcastOverlapState.RECORDING:
                self._record(indices)
            elif self._pending:
                if strict:
                    # The first hooked layer to run waits for everything,
                    # whether or not the forward goes through the root.
                    self.stats["waited_in_forward"] += self.wait_all()
                    return
                first_pending = next(iter(self._pending))
                waited = self._wait(indices)
                if waited and first_pending not in indices:
                    self.stats["waited_out_of_order"] += 1
                self.stats["waited_in_forward"] += waited

        handle = layer.register_forward_pre_hook(_Hook(forward_pre_hook))
        layer._forward_pre_hooks.move_to_end(handle._hook_id, last=False)
        self._pre_hook_handles[id(layer)] = handle

    def _record(self, indices):
        seen = self._recorded_set
        for i in indices:
            if i not in seen:
                seen.add(i)
                self._recorded.append(i)

    def _on_state_dict(self, _destination):
        # Wait for everything: the result may hold detached copies
        # (keep_vars=False in Paddle 3.x), so its values cannot be matched
        # to parameters; a state_dict() is no hot path.
        self.stats["waited_on_demand"] += self.wait_all()

    def _on_root_forward_post(self, _layer, _inputs, _outputs):
        if not self._pending or self._warned_unwaited:
            return
        self._warned_unwaited = True
        names = sorted(
            {
                type(layer).__name__
                for layer, indices in self._layer_indices
                if any(i in self._pending for i in indices)
            }
        )
        warnings.warn(
            f"broadcast overlap: after the forward of "
            f"{type(self._layers).__name__}, {len(self._pending)} "
            f"parameter broadcast(s) were still pending, owned by layers of "
            f"type {names}. Either those layers did not run (harmless: the "
            "next step() waits for them), or their parameters were read "
            "without calling the layer (e.g. F.linear(x, layer.weight) or "
            "layer.forward(x)), which reads them while the broadcast may be "
            "in flight on GPU. In that case call "
            "_set_broadcast_overlap(True, layers=model, strict=True) so the "
            "first layer to run waits for every broadcast. Shown once.",
            stacklevel=2,
        )

    def _check_state(self, *allowed):
        assert self._state in allowed, (
            f"rank {paddle.distributed.get_rank()}: broadcast overlap is "
            f"{self._state.value}, expected one of "
            f"{[s.value for s in allowed]}"
        )
