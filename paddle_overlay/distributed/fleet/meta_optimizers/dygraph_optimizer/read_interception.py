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

"""Every read of a parameter waits for its own pending sync: the one place
where reads are intercepted. Installed by :func:`acquire` while an overlap is
open; the last :func:`release` restores everything.

* Layer reads. Every Python path to a parameter goes through its layer's
  ``_parameters`` dict: attributes (``Layer.__getattr__``, so also
  ``F.linear(x, self.proj.weight)`` or a direct ``sub.forward(x)``) and
  ``parameters()``/``state_dict()``/``set_state_dict()``/``to()``/
  ``copy.deepcopy`` (``_parameters.items()``/``values()``). A
  :class:`GuardedParameters` in its place waits for the unit of each
  parameter it hands out, and only that unit.
* Compiled programs. ``paddle.jit.to_static`` programs read parameters
  without Python: ``StaticFunction.__call__`` waits for everything first.
* SOT (``to_static``'s default in 3.x) simulates every function a compiled
  forward calls, the owner's hooks too (on 3.3.1 they failed with
  ``InnerError: ObjectVariable(_Hook) has no attribute _state``; on 2.6.2
  they recorded a wrong order): this directory joins SOT's skip list, as
  Paddle's own is.

Pending state lives in :data:`comm_unit.PENDING`. Not seen: a tensor
reference taken before ``step()`` and read after it, and layers outside
``layers``.
"""

import functools
import os
import re
import weakref
from collections import OrderedDict

from .comm_unit import PENDING

__all__ = []

_odict_getitem = OrderedDict.__getitem__
_odict_get = OrderedDict.get
_odict_items = OrderedDict.items
_odict_values = OrderedDict.values
_odict_pop = OrderedDict.pop
_odict_popitem = OrderedDict.popitem


def _wait_for(param, path):
    unit = PENDING.get(id(param))
    if unit is not None:
        unit.owner.wait((unit,), "waited_on_read", path)


def _wait_for_all(params, path):
    for param in params:
        _wait_for(param, path)


class GuardedParameters(OrderedDict):
    """A layer's ``_parameters`` that waits before handing a parameter out.

    ``d[name]``, ``d.get(name)``, ``d.pop(name)`` and ``d.popitem()`` (path
    ``"attribute"``; ``copy()``, ``setdefault()`` and ``dict(d)`` go through
    ``d[name]``), ``d.items()`` and ``d.values()`` (path ``"iteration"``)
    wait for the pending sync of exactly the parameters they return.
    Membership, ``keys()`` and writes are plain. A copy or pickle is a plain
    ``OrderedDict`` made after the waits.
    """

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


# layer -> WeakSet of owners that need its guard (several optimizers can
# share one model). Weak both ways: owners refer to their layers.
_USERS = weakref.WeakKeyDictionary()


def guard_layer(layer, owner):
    """Install (or re-install) the guard on ``layer`` for ``owner``.

    Returns:
        bool: True when it was (re)installed, False when already in place
        (user code may have replaced ``layer._parameters`` since).
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


# ----------------------------------------------------------------------
# compiled programs and SOT: installed once for all open owners
# id(owner) -> finalizer: the owners holding the install (an owner
# collected without release() drops out through its finalizer)
_HOLDERS = {}
# what _install() replaced, restored by _uninstall(): [restore()]
_RESTORE = []


def static_function_class():
    """``paddle.jit``'s ``StaticFunction`` (every compiled program)."""
    from paddle.jit.dy2static.program_translator import StaticFunction

    return StaticFunction


def sot_skip_files():
    """SOT's ``skip_files`` module, or None in a Paddle without SOT."""
    try:
        from paddle.jit.sot.opcode_translator import skip_files
    except ImportError:
        return None
    return skip_files


def _wait_everything_pending():
    for owner in {unit.owner for unit in list(PENDING.values())}:
        owner.wait_all("waited_in_forward")


def _install():
    cls = static_function_class()
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        if PENDING:
            _wait_everything_pending()
        return original(self, *args, **kwargs)

    cls.__call__ = __call__
    _RESTORE.append(lambda: setattr(cls, "__call__", original))

    skip_files = sot_skip_files()
    names = getattr(skip_files, "skip_file_names", None)
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    if isinstance(names, set) and not any(here.startswith(n) for n in names):
        # a patched Paddle has this file under Paddle's own directory
        old_re = skip_files.skip_file_name_re

        def restore_sot():
            names.discard(here)
            skip_files.skip_file_name_re = old_re
            skip_files.setup_skip_files()

        names.add(here)
        skip_files.skip_file_name_re = re.compile(
            f"^({'|'.join(map(re.escape, names))})"
        )
        skip_files.setup_skip_files()
        _RESTORE.append(restore_sot)


def _uninstall():
    while _RESTORE:
        _RESTORE.pop()()


def acquire(owner, layers):
    """``owner`` opens: guard ``layers`` (each a ``paddle.nn.Layer`` owning
    managed parameters) and, for the first open owner, install the
    compiled-program wait and the SOT skip entry."""
    if not _HOLDERS:
        _install()
    if id(owner) not in _HOLDERS:
        _HOLDERS[id(owner)] = weakref.finalize(owner, _drop_holder, id(owner))
    for layer in layers:
        guard_layer(layer, owner)


def _drop_holder(key):
    finalizer = _HOLDERS.pop(key, None)
    if finalizer is not None:
        finalizer.detach()
    if not _HOLDERS:
        _uninstall()


def refresh(owner, layers):
    """Re-guard a layer whose ``_parameters`` was replaced since."""
    for layer in layers:
        if type(layer.__dict__.get("_parameters")) is not GuardedParameters:
            guard_layer(layer, owner)


def release(owner, layers):
    """``owner`` closes: unguard ``layers``; the last holder restores
    ``StaticFunction.__call__`` and SOT's skip list exactly."""
    for layer in layers:
        unguard_layer(layer, owner)
    _drop_holder(id(owner))


def is_installed():
    """bool: whether the compiled-program wait is in place."""
    return bool(_RESTORE)
