"""A deterministic virtual clock at the process-group level (test and benchmark code; not the product).

:meth:`VirtualClock.install` wraps the collective methods of process-group classes (Paddle's
``core.ProcessGroup`` and its subclasses, as ``tools/collective/collective_recorder.py`` does, or the
fake group of :mod:`vclock.fake_group`): each collective is issued for real and its task comes back
wrapped. The wrapper models the collective on its group's stream of every :class:`~vclock.timeline.Timeline`
(one per scenario: tokens per micro-batch x contention), its wait advances the modelled time to the
modelled completion and records who waited (:mod:`vclock.waiter`). Forward post-hooks on the model's
leaf layers (:meth:`add_segment`) advance the time by each layer's modelled forward; the driver adds the
rest of the step (:meth:`compute`: backward, update) and marks steps (:meth:`begin_step`,
:meth:`end_forward`).

Modelled sizes: parameters registered with :meth:`register` carry a modelled size in bytes. A
collective's message is its largest tensor argument (an all-gather's full buffer); its modelled bytes are
the modelled sizes of the registered parameters, and of their gradients, whose memory (``data_ptr``
range, read at call time: buckets move parameters into contiguous buffers at the first step, V2's comm
buffers hold them) lies inside that tensor, and its real bytes when it holds none (the order agreement's
int64s, a model's own collective). A broadcast or all-gather holding parameters is part of the parameter
sync.

Per step (from one :meth:`begin_step` to the next) and scenario, :meth:`steps` reports the step time, the
exposed sync time (the step time minus the same step's time with every parameter-sync collective free:
waits, contention and queueing behind the sync), the sync waits by who waited, and the bound
(:func:`~vclock.timeline.bound_ms`) of the units sent since the previous forward ended against this
step's forward. The same calls give the same numbers on any machine: nothing reads a wall clock.
"""

import collections
import sys

import paddle
from paddle.base import core

from . import timeline as tl
from .waiter import who_waited

__all__ = ["Scenario", "VirtualClock", "StepRecord"]

SYNC_OPS = ("broadcast", "all_gather")
_EPS_MS = 1e-9


def _collective_recorder():
    """``tools/collective/collective_recorder`` (the list of collective methods of a process-group class
    and the canonical op names), importable from a clone without the test set-up."""
    import os

    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "collective")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import collective_recorder

    return collective_recorder


class Scenario:
    """One modelled setting: ``tokens`` per micro-batch (selects each segment's forward ms) and the
    ``contention`` rates (rc, rb) of :class:`~vclock.timeline.Timeline`, named ``name``."""

    def __init__(self, name, tokens, contention):
        self.name, self.tokens, self.contention = name, tokens, contention


class StepRecord:
    """One step of one scenario, in ms: ``step_ms``, ``exposed_ms``, ``bound_ms``, ``waits`` ({who: ms}
    the sync added to waits: a sync task's whole wait, the delay of a collective queued behind the
    sync), ``syncs`` (parameter-sync collectives issued), ``sync_bytes`` (their modelled bytes). The
    exposed time not in ``waits`` is contention (:attr:`contention_ms`)."""

    def __init__(self, step_ms, exposed_ms, bound_ms, waits, syncs, sync_bytes):
        self.step_ms, self.exposed_ms, self.bound_ms = step_ms, exposed_ms, bound_ms
        self.waits, self.syncs, self.sync_bytes = waits, syncs, sync_bytes

    @property
    def contention_ms(self):
        return self.exposed_ms - sum(self.waits.values())

    def as_dict(self):
        return dict(vars(self))


class _Lane:
    """A scenario's two timelines (with the sync, and with the sync free) and its step bookkeeping."""

    def __init__(self, scenario, pipelined_ms):
        self.scenario = scenario
        self.full = tl.Timeline(scenario.contention, pipelined_ms)
        self.free = tl.Timeline(scenario.contention, pipelined_ms, free_sync=True)
        self.start_full = self.start_free = 0.0
        self.waits = collections.Counter()


class VirtualTask:
    """The task a wrapped collective returns: ``wait()`` waits for the real task, then advances every
    scenario's modelled time to this collective's completion."""

    def __init__(self, clock, task, items, sync):
        self._clock, self._task, self._items, self.sync = clock, task, items, sync

    def wait(self, *args, **kwargs):
        result = self._task.wait(*args, **kwargs) if self._task is not None else True
        self._clock._wait(self, sys._getframe(1))
        return result

    def is_completed(self):
        return self._task.is_completed() if self._task is not None else True

    def __getattr__(self, name):
        return getattr(self._task, name)


class VirtualClock:
    """See the module docstring. ``costs``: a :class:`~vclock.costs.CollectiveCosts`; ``scenarios``: the
    :class:`Scenario` list (names unique). ValueError: no scenario or a repeated name."""

    def __init__(self, costs, scenarios):
        names = [s.name for s in scenarios]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"scenarios need unique names, got {names}")
        self.costs = costs
        self._lanes = [_Lane(s, costs.pipelined_ms) for s in scenarios]
        self._sizes = {}  # id(param) -> (param, modelled bytes)
        self._segments = []  # hook handles
        self._undo = []
        self._forward = []  # this step's segments: ({tokens: ms}, keys)
        self._units = []  # sync units since the last forward ended: (ms, keys)
        self._in_forward = self._started = False
        self._bounds = {}
        self._sync_count, self._sync_bytes = 0, 0
        self.records = {s.name: [] for s in scenarios}
        self.trace = []  # (event, detail): what happened, in order (for tests and debugging)

    # -- set-up -----------------------------------------------------------------------------------------
    def install(self, classes):
        """Wrap the collective methods each class of ``classes`` defines itself (a method a subclass
        inherits is wrapped once, on its base). Returns the names wrapped; :meth:`uninstall` undoes."""
        recorder = _collective_recorder()
        wrapped = []
        for cls in classes:
            for name in recorder.collective_methods(cls):
                original = vars(cls)[name]
                setattr(cls, name, self._wrap(name, original, recorder.canonical(name)))
                self._undo.append((cls, name, original))
                wrapped.append(f"{cls.__name__}.{name}")
        return wrapped

    def uninstall(self):
        """Restore every wrapped method and remove the forward hooks."""
        while self._undo:
            cls, name, original = self._undo.pop()
            setattr(cls, name, original)
        while self._segments:
            self._segments.pop().remove()

    def register(self, sizes):
        """``sizes``: {parameter: modelled bytes} (int)."""
        for param, nbytes in sizes.items():
            self._sizes[id(param)] = (param, int(nbytes))

    def add_segment(self, layer, ms_by_tokens, params=None):
        """Charge ``ms_by_tokens[tokens]`` of forward compute after each call of ``layer`` (a forward
        post-hook); ``params``: the parameters the segment uses (default: the layer's own), for the
        bound."""
        params = list(layer.parameters(include_sublayers=False)) if params is None else list(params)
        keys = frozenset(id(p) for p in params)
        ms = dict(ms_by_tokens)

        def charge(_layer, _inputs, _outputs):
            self._charge("forward", ms)
            if self._in_forward:
                self._forward.append((ms, keys))

        self._segments.append(layer.register_forward_post_hook(charge))

    # -- driver -----------------------------------------------------------------------------------------
    def begin_step(self):
        """A step starts (before its forward): closes the previous step's records."""
        for lane in self._lanes:
            if self._started:
                full = lane.full.now - lane.start_full
                free = lane.free.now - lane.start_free
                self.records[lane.scenario.name].append(
                    StepRecord(full, full - free, self._bounds.get(lane.scenario.tokens, 0.0),
                               dict(lane.waits), self._sync_count, self._sync_bytes))
            lane.start_full, lane.start_free = lane.full.now, lane.free.now
            lane.waits.clear()
        self._started = True
        self._forward, self._in_forward, self._bounds = [], True, {}
        self._sync_count = self._sync_bytes = 0
        self.trace.append(("step", None))

    def end_forward(self):
        """The step's forward has ended: the bound of the units sent since the previous forward."""
        tokens = {lane.scenario.tokens for lane in self._lanes}
        for t in tokens:
            segments = [(ms[t], keys) for ms, keys in self._forward]
            self._bounds[t] = tl.bound_ms(self._units, segments, self.costs.pipelined_ms)
        self._units, self._in_forward = [], False

    def compute(self, label, ms_by_tokens):
        """Charge compute outside the forward's segments (backward, update): {tokens: ms}."""
        self._charge(label, ms_by_tokens)

    def steps(self, scenario):
        """The :class:`StepRecord` list of ``scenario`` (name), one per completed step."""
        return list(self.records[scenario])

    # -- internals --------------------------------------------------------------------------------------
    def _charge(self, label, ms_by_tokens):
        for lane in self._lanes:
            ms = ms_by_tokens[lane.scenario.tokens]
            lane.full.compute(ms)
            lane.free.compute(ms)
        self.trace.append((label, None))

    def _wrap(self, name, original, op):
        clock = self

        def virtual(pg, *args, **kwargs):
            task = original(pg, *args, **kwargs)
            return clock._issued(pg, name, op, list(args) + list(kwargs.values()), task)

        virtual.__name__, virtual.__doc__, virtual.__wrapped__ = name, getattr(original, "__doc__", None), original
        return virtual

    def _message(self, op, values):
        """(modelled bytes, keys of the parameters inside) of the largest tensor among ``values``: the
        parameters (``op`` a parameter-sync op) or their gradients (any other op) inside it."""
        tensors = [t for v in values for t in (v if isinstance(v, (list, tuple)) else (v,))
                   if isinstance(t, paddle.Tensor)]
        if not tensors:
            return 0, frozenset()
        message = max(tensors, key=_nbytes)
        begin = message.data_ptr()
        end = begin + _nbytes(message)
        inside, modelled = [], 0
        for key, (param, nbytes) in self._sizes.items():
            # a parameter-sync op carries parameters, any other op their gradients
            tensor = param if op in SYNC_OPS else _grad(param)
            if tensor is None or not tensor._is_initialized():
                continue
            ptr = tensor.data_ptr()
            if begin <= ptr and ptr + _nbytes(tensor) <= end:
                modelled += nbytes
                inside.append(key)
        if not modelled:
            return _nbytes(message), frozenset()
        return modelled, frozenset(inside)

    def _issued(self, pg, name, op, values, task):
        nbytes, keys = self._message(op, values)
        sync = op in SYNC_OPS and bool(keys)
        ms = self.costs.time_ms(op, nbytes, pg.size())
        group = ("pg", id(pg))
        items = [(lane, lane.full.issue(group, ms, sync, name), lane.free.issue(group, ms, sync, name))
                 for lane in self._lanes]
        if sync:
            self._units.append((ms, keys))
            self._sync_count += 1
            self._sync_bytes += nbytes
        self.trace.append(("issue", (op, nbytes, sync)))
        wrapped = VirtualTask(self, task, items, sync)
        if name.endswith("_on_calc_stream"):
            self._wait(wrapped, sys._getframe(1))
        return wrapped

    def _wait(self, task, frame):
        who = who_waited(frame)
        for lane, full, free in task._items:
            # what the sync added to this wait: all of a sync task's, a queued collective's delay
            added = lane.full.wait(full) - lane.free.wait(free)
            if added > _EPS_MS:
                lane.waits[who] += added
        self.trace.append(("wait", (who, task.sync)))


def _nbytes(tensor):
    return int(tensor._numel()) * core.size_of_dtype(tensor.dtype)


def _grad(param):
    main = getattr(param, "main_grad", None)
    return main if main is not None else param.grad
