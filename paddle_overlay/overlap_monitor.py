"""How much of the parameter sync a run overlapped, and a warning when reads
keep taking the overlap away (overlay only: Paddle's patch carries the
counters, ``stats``, not this).

:func:`overlap_report` reads an optimizer's counters. :class:`LostOverlapMonitor`
(one per process, a monitor of ``sync_stats.MONITORS`` while the overlay is
applied) decides, at the first training forward after each ``step()``,
whether that step's overlap was lost: more than half of the units the step
launched were waited by reads (a Python read of a parameter, or a compiled
program) before that forward. It warns once per owner when the loss recurs:
in at least :data:`LOST_STEPS` of the last :data:`WINDOW` decided steps. A
checkpoint or an evaluation every few steps never reaches that; reading
every parameter after every ``step()`` (a gradient-norm loop over
``model.parameters()``) does, at the fourth such step. The warning names the
first line outside the installed packages and this product that led to the
first read of the latest lost step, and, when the read itself ran inside an
installed package (a trainer's checkpoint code), that package's line.
"""

import collections
import dataclasses
import os
import site
import sys
import sysconfig
import warnings
import weakref

from .distributed.fleet.meta_optimizers.dygraph_optimizer import (
    param_sync_overlap,
    sync_stats,
)
from .distributed.fleet.meta_optimizers.dygraph_optimizer.sync_stats import SyncStat

__all__ = ["OverlapReport", "overlap_report"]

# the members a wait is counted under
WAIT_REASONS = frozenset(s for s in SyncStat if s.value.startswith("waited_")) - {SyncStat.OUT_OF_ORDER}
# waits that take the overlap away from the next forward
READ_WAITS = frozenset({SyncStat.ON_READ, SyncStat.IN_PROGRAM})

WINDOW = 8  # decided steps looked at
LOST_STEPS = 4  # of them with the overlap lost: the warning


@dataclasses.dataclass(frozen=True)
class OverlapReport:
    """The parameter sync overlap an optimizer got so far.

    Attributes:
        collective (str): ``"broadcast"`` (V1) or ``"all-gather"`` (V2).
        launched (int): units started (collectives issued by ``step()``).
        waited (dict[str, int]): units by who waited for them first:
            ``in_forward`` (a layer's forward pre-hook: overlapped),
            ``on_read``, ``in_program``, ``before_update``, ``unreachable``,
            ``on_demand``, ``by_other_owner``, ``for_hybrid_sync``.
        read_paths (dict[str, int]): ``on_read`` waits by path
            (``attribute``, ``iteration``).
        pending (int): units not waited yet.
        overlapped (float): fraction of the waited units that a forward
            pre-hook waited first, in [0, 1] (0.0 before any wait).
        steps_decided (int), steps_lost (int): steps followed by a training
            forward, and those of them whose overlap reads took away.
    """

    collective: str
    launched: int
    waited: dict
    read_paths: dict
    pending: int
    overlapped: float
    steps_decided: int
    steps_lost: int


def overlap_report(optimizer):
    """The :class:`OverlapReport` of ``optimizer`` (fleet's optimizer, or
    the sharding optimizer inside it).

    Raises:
        ValueError: ``optimizer`` has no parameter sync overlap on (turn it
            on with ``_set_broadcast_overlap`` / ``_set_all_gather_overlap_
            forward``, or the start-up setting).
    """
    owner = param_sync_overlap.get_param_sync_overlap(optimizer)
    if owner is None:
        raise ValueError(
            f"{type(optimizer).__name__} has no parameter sync overlap on: "
            "nothing to report. Turn it on with optimizer."
            "_set_broadcast_overlap(True, layers=model) (V1) or "
            "_set_all_gather_overlap_forward(True, model) (V2)."
        )
    stats = owner.stats
    waited = {
        reason.value[len("waited_") :]: stats[reason]
        for reason in SyncStat
        if reason in WAIT_REASONS
    }
    total = sum(waited.values())
    history = MONITOR.history(owner)
    return OverlapReport(
        collective=owner.collective,
        launched=stats[SyncStat.LAUNCHED],
        waited=waited,
        read_paths=dict(owner.read_paths),
        pending=owner.num_pending,
        overlapped=waited["in_forward"] / total if total else 0.0,
        steps_decided=len(history),
        steps_lost=sum(history),
    )


def _installed_dirs():
    """Folders of installed packages and the standard library: a frame in
    one is not the user's (the product's own folder is added by the
    caller)."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("purelib", "platlib", "stdlib") if k in paths}
    found.update(getattr(site, "getsitepackages", lambda: [])())
    found.add(os.path.dirname(os.path.abspath(os.__file__)))
    return tuple(sorted(os.path.abspath(d) + os.sep for d in found))


_PRODUCT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def read_site(installed=None):
    """(the user's line, the innermost installed package's line or None)
    of the current stack, each ``"file:line"``: the user's line is the
    innermost frame outside the installed packages and this product
    (``"<unknown>"`` when there is none)."""
    installed = _installed_dirs() if installed is None else installed
    frame, package_line = sys._getframe(1), None
    while frame is not None:
        name = frame.f_code.co_filename
        where = f"{name}:{frame.f_lineno}"
        if name.startswith(_PRODUCT_DIR):
            pass
        elif name.startswith(installed):
            if package_line is None and not _is_paddle_or_stdlib(name):
                package_line = where
        else:
            return where, package_line
        frame = frame.f_back
    return "<unknown>", package_line


def _is_paddle_or_stdlib(name):
    stdlib = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
    return name.startswith(stdlib) or f"{os.sep}paddle{os.sep}" in name


class _Step:
    """One launch's count of units started and waited by reads."""

    def __init__(self, started):
        self.started, self.read_waited, self.first_read = started, 0, None


class LostOverlapMonitor:
    """A ``sync_stats`` monitor: per owner, the last :data:`WINDOW` steps'
    verdicts; the warning (module docstring) once per owner."""

    def __init__(self):
        self._open = weakref.WeakKeyDictionary()  # owner -> _Step
        self._history = weakref.WeakKeyDictionary()  # owner -> deque[bool]
        self._warned = weakref.WeakSet()

    def history(self, owner):
        """list[bool]: whether each decided step of ``owner`` (last
        :data:`WINDOW`) lost its overlap."""
        return list(self._history.get(owner, ()))

    def on_launch(self, owner, units):
        self._open[owner] = _Step(len(units))

    def on_wait(self, owner, count, reason, path):
        step = self._open.get(owner)
        if step is None or reason not in READ_WAITS:
            return
        step.read_waited += count
        if step.first_read is None:
            step.first_read = (path or "compiled program", read_site())

    def on_training_forward(self, owner):
        step = self._open.pop(owner, None)
        if step is None:
            return
        lost = 2 * step.read_waited > step.started
        history = self._history.setdefault(
            owner, collections.deque(maxlen=WINDOW)
        )
        history.append(lost)
        if lost and sum(history) >= LOST_STEPS and owner not in self._warned:
            self._warned.add(owner)
            _warn_lost(owner, step, sum(history), len(history))


def _warn_lost(owner, step, lost, decided):
    path, (line, package_line) = step.first_read
    if package_line is None:
        first = f"{path} at {line}"
    else:
        first = (
            f"{path} by an installed package at {package_line}, called from "
            f"{line}"
        )
    warnings.warn(
        f"parameter sync overlap ({owner.method}): in {lost} of the last "
        f"{decided} steps most of the {owner.collective}s launched by step() "
        f"were waited by reads before the next forward (latest: "
        f"{step.read_waited} of {step.started}; first read: {first}), so "
        "they did not overlap it. To keep the overlap, read the parameters "
        "after the forward (e.g. log gradient norms after loss.backward()) "
        "or less often; paddle_overlay.overlap_report(optimizer) shows the "
        "overlap you get. Shown once.",
        stacklevel=_stacklevel(),
    )


def _stacklevel():
    # for the warnings.warn of the caller: the user's line, the first frame
    # outside the installed packages and this product
    installed = _installed_dirs()
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(
        installed + (_PRODUCT_DIR,)
    ):
        frame, level = frame.f_back, level + 1
    return level


MONITOR = LostOverlapMonitor()


def install():
    """Add :data:`MONITOR` to ``sync_stats.MONITORS``; returns the undo."""
    if MONITOR not in sync_stats.MONITORS:
        sync_stats.MONITORS.append(MONITOR)

    def uninstall():
        if MONITOR in sync_stats.MONITORS:
            sync_stats.MONITORS.remove(MONITOR)

    return uninstall
