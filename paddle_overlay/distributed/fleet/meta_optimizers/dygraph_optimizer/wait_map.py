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

"""Which layer's forward pre-hook waits for which units of the parameter
sync, and whether a forward needs them in the agreed order.

Every layer that owns managed parameters directly waits for them; a
container without ``forward`` (``ParameterList``) never runs, so its
nearest ancestor with a ``forward`` waits for it; the root always gets a
pre-hook. Parameters no layer owns are waited right after their launch.
"""

import collections
import warnings

import paddle

from .comm_unit import UnitState
from .sync_stats import caller_stacklevel

__all__ = []


def _waiting_layer(layer, parent_of, root):
    while layer is not root and type(layer).forward is paddle.nn.Layer.forward:
        layer = parent_of.get(id(layer), root)
    return layer


class LayerWaits:
    """The layers of ``root`` (paddle.nn.Layer) that wait for the
    parameters at positions ``index_of`` (dict: id(parameter) -> position
    in the optimizer's list), and the units each waits for.

    Raises:
        ValueError: ``root`` owns none of the parameters (names the fix).
    """

    def __init__(self, root, index_of):
        all_layers = root.sublayers(include_self=True)
        parent_of = {}
        for layer in all_layers:
            for child in layer.children():
                parent_of.setdefault(id(child), layer)
        waiting = {}  # id(waiting layer) -> (layer, {position: None})
        self.owning_layers = []  # layers owning managed parameters
        for layer in all_layers:
            own = layer.parameters(include_sublayers=False)
            found = [index_of[id(p)] for p in own if id(p) in index_of]
            if found:
                self.owning_layers.append(layer)
                waiter = _waiting_layer(layer, parent_of, root)
                entry = waiting.setdefault(id(waiter), (waiter, {}))
                entry[1].update(dict.fromkeys(found))
        if not waiting:
            raise ValueError(
                f"layers ({type(root).__name__}) owns none of the "
                f"{len(index_of)} parameters of this optimizer: pass the "
                "model whose parameters() were given to the optimizer."
            )
        self._root = root
        self._positions = {k: tuple(v) for k, (_, v) in waiting.items()}
        # the layers that get a pre-hook, the root always first or among them
        self.hooked_layers = [layer for layer, _ in waiting.values()]
        if id(root) not in waiting:
            self.hooked_layers.insert(0, root)
        self._warned = False  # the order warning: once per owner
        reachable = {i for v in self._positions.values() for i in v}
        # no hook or guarded read sees these: waited right after launch
        self.unreachable = tuple(
            i for i in sorted(index_of.values()) if i not in reachable
        )
        self.use([])

    def positions_of(self, layer):
        """tuple[int]: the positions ``layer``'s pre-hook waits for."""
        return self._positions.get(id(layer), ())

    def use(self, units):
        """Map each hooked layer to the ``units`` (list[CommUnit], in the
        agreed order) holding its positions; resets the order check."""
        self.units = units
        unit_of = collections.defaultdict(dict)  # position -> {id: unit}
        for unit in units:
            for i in unit.indices:
                unit_of[i][id(unit)] = unit

        def units_for(positions):
            found = {}
            for i in positions:
                found.update(unit_of.get(i, {}))
            return tuple(found.values())

        self._units_of = {k: units_for(v) for k, v in self._positions.items()}
        self.unreachable_units = units_for(self.unreachable)
        self._first_pending = 0
        self._armed = self._in_root = False

    def units_of(self, layer):
        """tuple[CommUnit]: the units ``layer``'s pre-hook waits for."""
        return self._units_of.get(id(layer), ())

    def arm(self):
        """After a launch: the next root forward is order-checked."""
        self._first_pending = 0
        self._armed, self._in_root = True, False

    def enter_root(self):
        self._in_root = True

    def leave_root(self):
        # only the first root forward after a launch is order-checked
        self._armed = self._in_root = False

    def out_of_order(self, layer, units, method):
        """True when ``layer`` needs one of ``units`` while an earlier unit
        of the agreed order is pending (less overlap; results are not
        affected); warns once, in the first training forward after a
        launch (``method``: the optimizer method named in the warning)."""
        cursor, everything = self._first_pending, self.units
        while (
            cursor < len(everything)
            and everything[cursor].state is UnitState.SYNCED
        ):
            cursor += 1
        self._first_pending = cursor
        if cursor == len(everything):
            return False
        first = everything[cursor]
        pending = [u for u in units if u.state is not UnitState.SYNCED]
        if not pending or any(u is first for u in units):
            return False
        if (
            self._armed
            and self._in_root
            and not self._warned
            and self._root.training
            and paddle.is_grad_enabled()
        ):
            self._warned = True
            warnings.warn(
                f"parameter sync overlap ({method}): "
                f"{type(layer).__name__} "
                f"({getattr(layer, '_full_name', '')}) needs "
                f"{pending[0].label} while {first.label}, earlier in the "
                "order agreed at the first step, is not synced yet: this "
                "forward uses the parameters in another order than the first "
                "one did, so some overlap is lost (results are not "
                "affected). Shown once.",
                stacklevel=caller_stacklevel(),
            )
        return True
