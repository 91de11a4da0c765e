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
parameter) becomes a :class:`GuardedParameters`; compiled programs
(``StaticFunction.__call__``) wait for everything; this directory joins
SOT's skip list, as Paddle's own files, so SOT does not trace the hooks.
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


# layer -> WeakSet of owners using its guard (optimizers may share a model)
_USERS = weakref.WeakKeyDictionary()


def guard_layer(layer, owner):
    """Guard ``layer`` for ``owner``; True if (re)installed now."""
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
    """The last user of ``layer``'s guard puts a plain ``OrderedDict`` back."""
    users = _USERS.get(layer)
    if users is not None:
        users.discard(owner)
        if users:
            return
        _USERS.pop(layer, None)
    current = layer.__dict__.get("_parameters")
    if type(current) is GuardedParameters:
        layer.__dict__["_parameters"] = OrderedDict(_odict_items(current))


# compiled programs and SOT, installed once for all open owners:
_HOLDERS = {}  # id(owner) -> finalizer (a collected owner drops out)
_RESTORE = []  # [restore()] of what _install() replaced


def static_function_class():
    from paddle.jit.dy2static.program_translator import StaticFunction

    return StaticFunction


def sot_skip_files():
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
    """Guard ``layers`` for ``owner``; the first holder installs the
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
    """Unguard ``layers``; the last holder restores what was installed."""
    for layer in layers:
        unguard_layer(layer, owner)
    _drop_holder(id(owner))


def is_installed():
    return bool(_RESTORE)
