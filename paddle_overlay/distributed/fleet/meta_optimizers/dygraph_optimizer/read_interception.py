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

"""Every read of a parameter waits for its own pending sync, while an
overlap is open: each layer's ``_parameters`` (every Python path to a
parameter) becomes a :class:`GuardedParameters`, and a compiled program
(a call of a ``paddle.jit.to_static`` function) waits for everything,
through a pre-call hook of ``paddle.jit.dy2static.pre_call_hooks``.
"""

from collections import OrderedDict

from . import sync_registry
from .sync_registry import PENDING
from .sync_stats import SyncStat

__all__ = []

_odict_getitem = OrderedDict.__getitem__
_odict_get = OrderedDict.get
_odict_items = OrderedDict.items
_odict_values = OrderedDict.values
_odict_pop = OrderedDict.pop
_odict_popitem = OrderedDict.popitem


def _wait_for(param, path):
    sync_registry.wait_for(param, SyncStat.ON_READ, path)


def _wait_for_all(params, path):
    for param in params:
        _wait_for(param, path)


class GuardedParameters(OrderedDict):
    """A layer's ``_parameters`` whose reads (path ``"attribute"``: ``[]``,
    ``get``, ``pop``, ``popitem``; ``"iteration"``: ``items``, ``values``)
    wait for exactly what they return; copies and pickles are plain."""

    __slots__ = ()

    def __getitem__(self, key):
        value = _odict_getitem(self, key)
        if PENDING:
            _wait_for(value, "attribute")
        return value

    def get(self, key, default=None):
        value = _odict_get(self, key, default)
        if PENDING:
            _wait_for(value, "attribute")
        return value

    def items(self):
        if PENDING:
            _wait_for_all(_odict_values(self), "iteration")
        return _odict_items(self)

    def values(self):
        if PENDING:
            _wait_for_all(_odict_values(self), "iteration")
        return _odict_values(self)

    def pop(self, key, *default):
        value = _odict_pop(self, key, *default)
        if PENDING:
            _wait_for(value, "attribute")
        return value

    def popitem(self, last=True):
        item = _odict_popitem(self, last)
        if PENDING:
            _wait_for(item[1], "attribute")
        return item

    def __reduce__(self):
        return (OrderedDict, (list(self.items()),))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()


def guard_layer(layer):
    """Guard ``layer``'s ``_parameters``; True if (re)installed now."""
    current = layer.__dict__.get("_parameters")
    if current is None or type(current) is GuardedParameters:
        return False
    guarded = GuardedParameters()
    for name, value in _odict_items(current):
        OrderedDict.__setitem__(guarded, name, value)
    layer.__dict__["_parameters"] = guarded
    return True


def unguard_layer(layer):
    """Put a plain ``OrderedDict`` back."""
    current = layer.__dict__.get("_parameters")
    if type(current) is GuardedParameters:
        layer.__dict__["_parameters"] = OrderedDict(_odict_items(current))


def _wait_everything_pending():
    # a compiled program reads parameters outside Python: wait for all
    if PENDING:
        for owner in sync_registry.open_owners():  # creation order
            owner.wait_all(SyncStat.IN_PROGRAM)


def _pre_call_hooks():
    # imported when first needed, not when fleet is imported
    from paddle.jit.dy2static import pre_call_hooks

    return pre_call_hooks


def acquire(owner):
    """Guard ``owner``'s layers; the first open owner adds the wait of
    compiled programs."""
    _pre_call_hooks().add_pre_call_hook(_wait_everything_pending)
    for layer in owner.owning_layers:
        guard_layer(layer)


def refresh(owner):
    """Re-guard a layer whose ``_parameters`` was replaced since."""
    for layer in owner.owning_layers:
        guard_layer(layer)


def release(owner):
    """Unguard ``owner``'s layers no other open owner uses; with no owner
    open, remove the wait of compiled programs."""
    others = sync_registry.open_owners()
    still = {id(l) for o in others if o is not owner for l in o.owning_layers}
    for layer in owner.owning_layers:
        if id(layer) not in still:
            unguard_layer(layer)
    if not any(o is not owner for o in others):
        _pre_call_hooks().remove_pre_call_hook(_wait_everything_pending)


def is_installed():
    """bool: whether compiled programs wait (an owner is open)."""
    return _pre_call_hooks().has_pre_call_hook(_wait_everything_pending)
