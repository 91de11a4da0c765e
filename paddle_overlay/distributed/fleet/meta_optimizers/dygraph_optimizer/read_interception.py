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
from collections import OrderedDict

from . import sync_registry
from .sync_registry import PENDING

__all__ = []

_odict_getitem = OrderedDict.__getitem__
_odict_get = OrderedDict.get
_odict_items = OrderedDict.items
_odict_values = OrderedDict.values
_odict_pop = OrderedDict.pop
_odict_popitem = OrderedDict.popitem


def _wait_for(param, path):
    entry = PENDING.get(id(param))
    if entry is not None:
        owner, unit = entry
        owner.wait((unit,), "waited_on_read", path)


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


# compiled programs and SOT, installed while any owner is open
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
    for owner in sync_registry.open_owners():  # creation order
        owner.wait_all("waited_in_program")


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


def acquire(owner):
    """Guard ``owner``'s layers; the first installs the compiled-program
    wait and the SOT skip entry."""
    if not _RESTORE:
        _install()
    for layer in owner.owning_layers:
        guard_layer(layer)


def refresh(owner):
    """Re-guard a layer whose ``_parameters`` was replaced since."""
    for layer in owner.owning_layers:
        guard_layer(layer)


def release(owner):
    """Unguard ``owner``'s layers no other open owner uses; with no owner
    open, restore what was installed."""
    others = sync_registry.open_owners()
    still = {id(l) for o in others if o is not owner for l in o.owning_layers}
    for layer in owner.owning_layers:
        if id(layer) not in still:
            unguard_layer(layer)
    if not any(o is not owner for o in others):
        _uninstall()


def is_installed():
    return bool(_RESTORE)
