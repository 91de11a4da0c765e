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

"""What the parameter sync overlap counts, and who may watch it.

* :class:`SyncStat`: the keys of an owner's ``stats`` (dict[SyncStat, int]);
  the ``waited_*`` members are also the reasons a wait is counted under.
  Members are strings, so ``stats["waited_in_forward"]`` reads the same
  entry as ``stats[SyncStat.IN_FORWARD]``.
* :data:`MONITORS`: objects told of every owner's launches, waits and
  training forwards (none by default; a tool adds one, e.g. to report how
  much of the sync a run overlapped). A monitor defines
  ``on_launch(owner, units)``, ``on_wait(owner, count, reason, path)`` and
  ``on_training_forward(owner)``.
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

    LAUNCHED = "launched"  # units started
    # who waited for a unit first (each unit is waited once per launch)
    IN_FORWARD = "waited_in_forward"  # its layer's forward pre-hook
    IN_PROGRAM = "waited_in_program"  # a compiled program, before it ran
    ON_READ = "waited_on_read"  # a Python read of one of its parameters
    BEFORE_UPDATE = "waited_before_update"  # the next step(): still pending
    UNREACHABLE = "waited_unreachable"  # at launch: no layer owns them
    ON_DEMAND = "waited_on_demand"  # state_dict(), rebuild(), turning off
    BY_OTHER_OWNER = "waited_by_other_owner"  # a shared parameter's owner
    FOR_HYBRID_SYNC = "waited_for_hybrid_sync"  # an mp/pp sync after update
    # a layer needed a unit while an earlier one was pending (less overlap)
    OUT_OF_ORDER = "waited_out_of_order"
    REBOUND = "rebound"  # parameters put back into their bucket slots

    def __repr__(self):
        # a printed ``stats`` reads as a dict of strings
        return repr(self.value)


# the members a wait is counted under
WAIT_REASONS = frozenset(s for s in SyncStat if s.value.startswith("waited_"))
WAIT_REASONS -= {SyncStat.OUT_OF_ORDER}
# waits that take the overlap away from the next forward
READ_WAITS = frozenset({SyncStat.ON_READ, SyncStat.IN_PROGRAM})

MONITORS = []


def new_stats():
    """dict[SyncStat, int]: every counter at 0."""
    return dict.fromkeys(SyncStat, 0)


def notify(event, *args):
    """Call ``event`` (``on_launch``, ``on_wait``, ``on_training_forward``)
    of every monitor with ``args``."""
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
