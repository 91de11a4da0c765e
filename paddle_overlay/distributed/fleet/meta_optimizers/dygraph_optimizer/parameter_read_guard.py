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

"""Wait for a parameter's pending broadcast on every Python read of it.

Every Python path to a parameter of a ``paddle.nn.Layer`` goes through the
layer's ``_parameters`` dict (an ``OrderedDict`` name -> Parameter):

* attribute access (``layer.weight``, so ``F.linear(x, self.proj.weight)``,
  a direct ``sub.forward(x)``, a pipeline ``SharedLayerDesc`` forward_func)
  is ``Layer.__getattr__`` -> ``_parameters[name]``;
* ``parameters()`` / ``named_parameters()`` of any layer, ``state_dict()``,
  ``set_state_dict()``, ``to()``/``astype()`` and ``copy.deepcopy`` iterate
  ``_parameters.items()`` (or ``values()``).

While broadcast overlap is on, each layer that owns managed parameters gets
a :class:`GuardedParameters` in place of that dict: the same class of
container with the same content, whose read methods first wait for the task
of each parameter they hand out, and only that parameter's task. The guard
holds no state of its own: the pending tasks live in the one registry
:data:`_PENDING` (``id(parameter) -> owner``), filled by the owner at launch
and emptied by its waits, so a read with nothing pending costs one truth
test of an empty dict.

What cannot be seen here: a tensor reference taken before ``step()`` and
read after it (``w = layer.weight`` kept across steps), and a compiled
program (``paddle.jit.to_static``) that reads parameters without running
Python; the owner makes every compiled program wait for everything before
it runs (``broadcast_overlap._wait_before_compiled_programs``).
"""

import weakref
from collections import OrderedDict

__all__ = [
    "GuardedParameters",
    "clear_pending",
    "guard_layer",
    "register_pending",
    "unguard_layer",
]

# id(parameter) -> the owner whose broadcast of it is pending. The owner
# adds entries at launch and removes them when it waits; a read that finds
# its parameter here asks that owner to wait for it.
_PENDING = {}

_odict_getitem = OrderedDict.__getitem__
_odict_get = OrderedDict.get
_odict_items = OrderedDict.items
_odict_values = OrderedDict.values
_odict_pop = OrderedDict.pop
_odict_popitem = OrderedDict.popitem


def _wait_for(param, path):
    owner = _PENDING.get(id(param))
    if owner is not None:
        owner.wait_for_read(param, path)


def _wait_for_all(params, path):
    for param in params:
        _wait_for(param, path)


class GuardedParameters(OrderedDict):
    """A layer's ``_parameters`` that waits before handing a parameter out.

    Read paths wait for the pending broadcast of exactly the parameters
    they return: ``d[name]``, ``d.get(name)``, ``d.pop(name)`` and
    ``d.popitem()`` (path ``"attribute"``; ``copy()``, ``setdefault()`` and
    ``dict(d)`` go through ``d[name]``), ``d.items()`` and ``d.values()``
    (path ``"iteration"``, all of this layer's own parameters). Membership,
    ``keys()`` and writes are plain ``OrderedDict`` operations. A copy or
    pickle is a plain ``OrderedDict`` (made after the waits), so a
    ``copy.deepcopy`` of the model carries no guard.
    """

    __slots__ = ()

    def __getitem__(self, key):
        value = _odict_getitem(self, key)
        if _PENDING:
            _wait_for(value, "attribute")
        return value

    def get(self, key, default=None):
        value = _odict_get(self, key, default)
        if _PENDING:
            _wait_for(value, "attribute")
        return value

    def items(self):
        if _PENDING:
            _wait_for_all(_odict_values(self), "iteration")
        return _odict_items(self)

    def values(self):
        if _PENDING:
            _wait_for_all(_odict_values(self), "iteration")
        return _odict_values(self)

    def pop(self, key, *default):
        value = _odict_pop(self, key, *default)
        if _PENDING:
            _wait_for(value, "attribute")
        return value

    def popitem(self, last=True):
        item = _odict_popitem(self, last)
        if _PENDING:
            _wait_for(item[1], "attribute")
        return item

    def __reduce__(self):
        return (OrderedDict, (list(self.items()),))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()


# layer -> WeakSet of owners that need its guard (several optimizers can
# share one model). Weak both ways: owners refer to their layers.
_USERS = weakref.WeakKeyDictionary()


def guard_layer(layer, owner):
    """Install (or re-install) the guard on ``layer`` for ``owner``.

    Safe to call again: returns False when the guard was already in place,
    True when it was (re)installed (Paddle or user code may have replaced
    ``layer._parameters`` with a fresh dict since).
    """
    _USERS.setdefault(layer, weakref.WeakSet()).add(owner)
    current = layer.__dict__.get("_parameters")
    if current is None or type(current) is GuardedParameters:
        return False
    guarded = GuardedParameters()
    for name, value in _odict_items(current):
        OrderedDict.__setitem__(guarded, name, value)
    layer.__dict__["_parameters"] = guarded
    return True


def unguard_layer(layer, owner):
    """Drop ``owner``'s use of ``layer``'s guard; the last user puts a plain
    ``OrderedDict`` with the same content back."""
    users = _USERS.get(layer)
    if users is not None:
        users.discard(owner)
        if users:
            return
        _USERS.pop(layer, None)
    current = layer.__dict__.get("_parameters")
    if type(current) is GuardedParameters:
        layer.__dict__["_parameters"] = OrderedDict(_odict_items(current))


def register_pending(param, owner):
    """Mark ``param`` as having a pending broadcast of ``owner``; a second
    owner with the same parameter pending is waited for first."""
    previous = _PENDING.get(id(param))
    if previous is not None and previous is not owner:
        previous.wait_for_read(param, "launch")
    _PENDING[id(param)] = owner


def clear_pending(param):
    """Forget ``param``'s pending broadcast (its task was waited)."""
    _PENDING.pop(id(param), None)
