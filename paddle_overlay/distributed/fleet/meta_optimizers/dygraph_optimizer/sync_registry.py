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

"""The one registry of the parameter sync overlap: the open owners, in
creation order, and the parameters whose sync is pending.

Iteration over owners is in creation order (a serial each), never in an
order that depends on object ids, so every rank visits its owners alike.
A garbage-collection finalizer only marks an owner abandoned; it is waited
and unhooked at the next explicit call (Paddle may be iterating a hook dict
inside the collection).
"""

import itertools
import weakref

__all__ = []

# id(parameter) -> (owner, CommUnit): from the unit's start to its wait
PENDING = {}
_OPEN = weakref.WeakValueDictionary()  # serial -> owner, open() to close()
_ABANDONED = []  # owners whose optimizer was collected, to release
_SERIAL = itertools.count()


def next_serial():
    """int: the creation serial of a new owner."""
    return next(_SERIAL)


def add(owner):
    _OPEN[owner.serial] = owner


def discard(owner):
    _OPEN.pop(owner.serial, None)


def abandon(owner):
    """From a finalizer: no collective, no hook change here."""
    discard(owner)
    _ABANDONED.append(owner)


def wait_for(param, reason, path=None):
    """Wait for the pending sync of ``param`` (any owner's), counted by its
    owner under ``reason`` (and ``path``); nothing when none is pending."""
    entry = PENDING.get(id(param))
    if entry is not None:
        owner, unit = entry
        owner.wait((unit,), reason, path)


def sweep_abandoned():
    while _ABANDONED:
        _ABANDONED.pop(0).release_abandoned()


def open_owners():
    """list[owner]: opened and not closed, in creation order."""
    sweep_abandoned()
    return [owner for _, owner in sorted(_OPEN.items(), key=_serial_of)]


def _serial_of(item):
    return item[0]
