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

"""What the parameter sync overlap counts, and where its warnings point.

* :class:`SyncStat`: the keys of an owner's ``stats`` (dict[SyncStat, int]);
  the ``waited_*`` members are also the reasons a wait is counted under.
  Members are strings, so ``stats["waited_in_forward"]`` reads the same
  entry as ``stats[SyncStat.IN_FORWARD]``.
* :func:`caller_stacklevel`: the ``stacklevel`` that makes a warning name
  the first line outside Paddle.
"""

import enum
import os
import sys

import paddle

__all__ = []


class SyncStat(str, enum.Enum):
    """A counter of an owner's ``stats``."""

    # a compiled program waited for a unit first, before it ran
    IN_PROGRAM = "waited_in_program"
    # a Python read of one of a unit's parameters waited for it first
    ON_READ = "waited_on_read"
    LAUNCHED = "launched"  # units started
    # who else waited for a unit first (each unit is waited once per launch)
    IN_FORWARD = "waited_in_forward"  # its layer's forward pre-hook
    BEFORE_UPDATE = "waited_before_update"  # the next step(): still pending
    UNREACHABLE = "waited_unreachable"  # at launch: no layer owns them
    ON_DEMAND = "waited_on_demand"  # state_dict(), turning the overlap off
    BY_OTHER_OWNER = "waited_by_other_owner"  # a shared parameter's owner
    # a layer needed a unit while an earlier one was pending (less overlap)
    OUT_OF_ORDER = "waited_out_of_order"
    REBOUND = "rebound"  # parameters put back into their bucket slots
    # an mp/pp parameter sync after the update waited for the unit first
    FOR_HYBRID_SYNC = "waited_for_hybrid_sync"

    def __repr__(self):
        # a printed ``stats`` reads as a dict of strings
        return repr(self.value)


# objects told of every owner's launches, waits and training forwards (none
# by default; a tool adds one, e.g. to report how much of the sync a run
# overlapped): ``on_launch(owner, units)``, ``on_wait(owner, count, reason,
# path)`` and ``on_training_forward(owner)``
MONITORS = []


def new_stats():
    """dict[SyncStat, int]: every counter at 0."""
    return dict.fromkeys(SyncStat, 0)


def notify(event, *args):
    """Call ``event`` (``on_launch``, ``on_wait``, ``on_training_forward``)
    of every monitor of :data:`MONITORS` with ``args``."""
    for monitor in MONITORS:
        getattr(monitor, event)(*args)


# frames of Paddle, of the package holding this module (Paddle itself, in
# Paddle's tree) and of the standard library
_PACKAGE_DIR = os.path.abspath(__file__)
for _ in range(5):  # .../<package>/distributed/fleet/meta_optimizers/...
    _PACKAGE_DIR = os.path.dirname(_PACKAGE_DIR)
_LIBRARY_DIRS = tuple(
    {
        os.path.dirname(os.path.abspath(paddle.__file__)) + os.sep,
        _PACKAGE_DIR + os.sep,
        os.path.dirname(os.path.abspath(os.__file__)) + os.sep,
    }
)


def caller_stacklevel():
    """int: the ``stacklevel`` of a ``warnings.warn`` in the function that
    calls this, naming the first frame outside Paddle and the standard
    library (the user's line)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(
        _LIBRARY_DIRS
    ):
        frame, level = frame.f_back, level + 1
    return level
