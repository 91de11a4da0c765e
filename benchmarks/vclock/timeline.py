"""The modelled time of one rank: a compute stream and one in-order stream per process group.

Deterministic: times are a function of the calls made (no wall clock is read). All times in ms.

* :meth:`Timeline.issue` queues a collective on its group's stream. A stream runs its collectives one
  after the other in issue order; each takes ``work_ms`` at full speed. A collective issued while its
  stream is busy saves ``pipelined_ms`` of launch latency (back-to-back calls overlap their latency).
* :meth:`Timeline.compute` runs ``work_ms`` of compute. While any collective is in flight the compute
  progresses at rate ``rc`` and every collective in flight at rate ``rb`` (contention; 1.0 = full speed).
* :meth:`Timeline.wait` advances the time to a collective's completion with the compute stream idle
  (collectives at full speed) and returns the time waited.

With ``free_sync=True`` the collectives issued with ``sync=True`` (the parameter sync) cost nothing:
the same run with the sync free, whose step time the exposed sync time is measured against.
"""

import math

_EPS = 1e-12


class Collective:
    """One collective on a modelled stream: ``work_ms`` its duration alone, ``done_at`` its completion
    time (None while in flight), ``sync`` whether it is part of the parameter sync."""

    __slots__ = ("label", "sync", "work_ms", "remaining", "done_at")

    def __init__(self, label, sync, work_ms):
        self.label, self.sync, self.work_ms, self.remaining = label, sync, work_ms, work_ms
        self.done_at = None


class Timeline:
    """Modelled time of one rank (``now``, ms); see the module docstring.

    ``contention``: (rc, rb), the compute rate while a collective is in flight and the collectives'
    rate while compute runs, both in (0, 1]. ``pipelined_ms``: latency a queued collective saves.
    ValueError: a rate outside (0, 1] or a negative time."""

    def __init__(self, contention=(1.0, 1.0), pipelined_ms=0.0, free_sync=False):
        rc, rb = contention
        if not (0 < rc <= 1 and 0 < rb <= 1):
            raise ValueError(f"contention rates must lie in (0, 1], got {contention}")
        if pipelined_ms < 0:
            raise ValueError(f"pipelined_ms must be >= 0, got {pipelined_ms}")
        self.rc, self.rb, self.pipelined_ms, self.free_sync = rc, rb, pipelined_ms, free_sync
        self.now = 0.0
        self._streams = {}  # group key -> [Collective, ...] not done, head first

    def issue(self, group, work_ms, sync, label=""):
        """Queue a collective of ``work_ms`` (ms alone) on ``group``'s stream; returns it."""
        if work_ms < 0:
            raise ValueError(f"work_ms must be >= 0, got {work_ms}")
        queue = self._streams.setdefault(group, [])
        if sync and self.free_sync:
            work_ms = 0.0
        elif queue:
            work_ms = max(0.0, work_ms - self.pipelined_ms)
        item = Collective(label, sync, work_ms)
        if work_ms <= _EPS and not queue:
            item.done_at = self.now
            return item
        queue.append(item)
        return item

    def compute(self, work_ms):
        """Run ``work_ms`` of compute (ms at full speed); returns the time it took."""
        if work_ms < 0:
            raise ValueError(f"work_ms must be >= 0, got {work_ms}")
        return self._advance(work_ms, None)

    def wait(self, item):
        """Advance to ``item``'s completion (compute idle); returns the time waited (0 if done)."""
        if item.done_at is not None:
            return 0.0
        return self._advance(0.0, item)

    def _advance(self, work, until):
        start = self.now
        computing = until is None
        while (work > _EPS) if computing else (until.done_at is None):
            heads = [queue[0] for queue in self._streams.values() if queue]
            rc = self.rc if heads else 1.0
            rb = self.rb if computing else 1.0
            dt = work / rc if computing else math.inf
            for head in heads:
                dt = min(dt, head.remaining / rb)
            if dt == math.inf:
                raise RuntimeError(f"waiting for {until.label!r}, which is on no stream")
            self.now += dt
            if computing:
                work -= dt * rc
            for head in heads:
                head.remaining -= dt * rb
                if head.remaining <= _EPS * max(1.0, head.work_ms):
                    self._complete(head)
        return self.now - start

    def _complete(self, item):
        item.remaining, item.done_at = 0.0, self.now
        for queue in self._streams.values():
            if queue and queue[0] is item:
                queue.pop(0)
                return


def bound_ms(units, segments, pipelined_ms=0.0):
    """The least exposed sync time any schedule on one in-order stream can reach without contention.

    ``units``: [(sync ms alone, set of parameter keys), ...] of one launch; ``segments``: [(forward ms,
    set of parameter keys used), ...] in forward order. Units numbered by their first user (units no
    segment uses go last and do not count), each after the first saving ``pipelined_ms`` as it would
    queued; returns max(0, max_k(sum of sync ms of units 1..k - forward ms of the segments before the
    first user of unit k)), in ms."""
    first_user = {}
    for position, (_ms, keys) in enumerate(segments):
        for key in keys:
            first_user.setdefault(key, position)
    before, total = [0.0], 0.0
    for ms, _keys in segments:
        total += ms
        before.append(total)
    used = []
    for ms, keys in units:
        users = [first_user[key] for key in keys if key in first_user]
        if users:
            used.append((min(users), ms))
    used.sort(key=lambda unit: unit[0])
    worst, synced = 0.0, 0.0
    for k, (position, ms) in enumerate(used):
        synced += max(0.0, ms - pipelined_ms) if k else ms
        worst = max(worst, synced - before[position])
    return worst
