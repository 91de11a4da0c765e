# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Counts host synchronisations and collectives inside chosen regions (e.g.
an optimizer's ``step()``), per name; test and benchmark helper (in
``tools/collective``, imported by name as ``hybrid_parallel_cpu_shim`` says).
While a
:class:`BlockingCallCounter` is entered it wraps (restored on exit), and
counts only inside a :meth:`~BlockingCallCounter.counting` region:

- host synchronisations (the outermost of nested ones): ``tensor.<name>``,
  the ``paddle.Tensor`` methods of :data:`TENSOR_HOST_SYNC_METHODS` on every
  subclass defining its own; the device synchronisations of
  :data:`DEVICE_SYNCS` (in every module holding one); ``task.synchronize``;
- collectives: every collective method of the ``ProcessGroup`` classes (the
  collective recorder's ``collective_methods``; every ``paddle.distributed``
  collective calls one), each a :class:`Collective` ``pg.<name>``: ``sync`` is
  ``sync_op`` as passed (keyword or a last positional bool), else true for
  ``*_on_calc_stream`` only (``FusedCommBuffer``'s ``all_gather(in, out)``
  is asynchronous);
- ``task.wait``: of a task started in the region it marks the collective
  ``waited`` (blocking); of one started before, ``task.wait earlier``.

Example::

    with BlockingCallCounter() as counter:
        counter.count_calls_of(opt, "step")      # every opt.step() counted
        counter.tag_phase(inner, "_sharding_sync_parameters", "param_sync")
        ... train ...
    counter.regions["step"][-1].counts()   # Counter of the last step
"""

import collections
import contextlib
import functools
import sys
import types

import collective_recorder
import paddle

try:
    from paddle.base import core
except ImportError:  # Paddle < 2.6
    from paddle.fluid import core

__all__ = ["BlockingCallCounter", "Collective", "Region"]

_MISSING = object()  # no instance attribute before ours

TENSOR_HOST_SYNC_METHODS = tuple(
    "numpy item tolist __array__ __bool__ __float__ __int__ __index__ "
    "__complex__ __nonzero__ cpu __repr__ __str__ __format__".split()
)
# the device synchronisations: key -> the module holding it (the key's last
# name)
DEVICE_SYNCS = {
    "device.synchronize": paddle.device,
    "device.cuda.synchronize": getattr(paddle.device, "cuda", None),
    "core._device_synchronize": core,
}
HOST_SYNC_PREFIXES = ("tensor.", "device.", "core.", "task.synchronize")


def is_host_sync(key):
    """True when ``key`` (a :meth:`Region.counts` key) names a host
    synchronisation."""
    return key.startswith(HOST_SYNC_PREFIXES)


Collective = collections.namedtuple(
    "Collective", "level name phase sync waited"
)
Collective.__doc__ = """One collective call: ``level`` ``"pg"``, ``name``,
``phase`` (label or None), ``sync`` (bool), ``waited`` (its task waited in
the same region)."""
Collective.blocking = property(lambda c: bool(c.sync or c.waited))
Collective.key = property(
    lambda c: f"{c.level}.{c.name} " + ("blocking" if c.blocking else "async")
)


class Region:
    """What one counted region did: ``host_syncs`` (Counter by name),
    ``collectives`` (:class:`Collective` list in call order), ``waits``
    (Counter: ``task.wait`` of tasks started in the region, ``task.wait
    earlier`` of tasks started before it)."""

    def __init__(self):
        self.host_syncs = collections.Counter()
        self.collectives = []
        self.waits = collections.Counter()
        self._tasks = {}  # id(task) -> (task, index in collectives)

    def counts(self, phase=any, level=any):
        """Counter of everything: host-sync names, the waits, and
        ``<level>.<name> blocking|async`` of the collectives of ``phase`` /
        ``level`` when given (``phase=None``: outside every phase label)."""
        out = collections.Counter(self.host_syncs)
        out.update(self.waits)
        out.update(c.key for c in self.collectives_of(phase, level))
        return out

    def collectives_of(self, phase=any, level=any):
        return [
            c
            for c in self.collectives
            if (phase is any or c.phase == phase)
            and (level is any or c.level == level)
        ]


def _subclasses(cls):
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(c for c in _subclasses(sub) if c not in out)
    return out


def _pg_sync_flag(name, args, kwargs):
    if "sync_op" in kwargs:
        return bool(kwargs["sync_op"])
    if args and isinstance(args[-1], bool):
        return args[-1]
    # *_on_calc_stream: synchronous; the bindings without the flag: async
    return name.endswith("_on_calc_stream")


class BlockingCallCounter:
    """Context manager: wraps the calls the module docstring lists while
    entered (restored on exit), counting inside :meth:`counting` regions.
    ``regions``: {label: [Region, ...]}, one per region entered."""

    def __init__(self):
        self.regions = collections.defaultdict(list)
        self._region = None
        self._phases = []
        self._host_depth = 0
        self._restore = []  # (target, attribute, value to put back)

    @contextlib.contextmanager
    def counting(self, label):
        """Count inside the block, into a new :class:`Region` appended to
        ``regions[label]``; regions do not nest (an inner one is ignored)."""
        if self._region is not None:
            yield self._region
            return
        region = self._region = Region()
        try:
            yield region
        finally:
            self._region = None
            region._tasks.clear()  # no task outlives its region here
            self.regions[label].append(region)

    @contextlib.contextmanager
    def phase(self, label):
        """Collectives issued inside the block carry ``phase=label``."""
        self._phases.append(label)
        try:
            yield
        finally:
            self._phases.pop()

    def count_calls_of(self, obj, method, label=None):
        """Every call of ``obj.method`` (an instance attribute wrapping the
        bound method) is a region ``label`` (default: ``method``)."""
        self._inside(obj, method, self.counting, label or method)

    def tag_phase(self, obj, method, label):
        """Collectives issued inside ``obj.method`` carry ``phase=label``."""
        self._inside(obj, method, self.phase, label)

    def _inside(self, obj, name, context, label):
        """``obj.name`` (instance attribute) runs inside ``context(label)``."""
        original = getattr(obj, name)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            with context(label):
                return original(*args, **kwargs)

        self._restore.append((obj, name, vars(obj).get(name, _MISSING)))
        vars(obj)[name] = wrapped

    def __enter__(self):
        try:
            for cls in _subclasses(paddle.Tensor):
                own = [n for n in TENSOR_HOST_SYNC_METHODS if n in vars(cls)]
                for name in own:
                    sync = self._host_sync(f"tensor.{name}", getattr(cls, name))
                    self._patch(cls, name, sync)
            self._wrap_process_groups()
            self._wrap_task()
            self._wrap_device_syncs()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for target, name, value in reversed(self._restore):
            if isinstance(target, (types.ModuleType, type)):
                setattr(target, name, value)
            elif value is _MISSING:
                vars(target).pop(name, None)  # an instance attribute we added
            else:
                vars(target)[name] = value
        self._restore.clear()
        return False

    def _patch(self, target, name, wrapper):
        self._restore.append((target, name, vars(target)[name]))
        setattr(target, name, wrapper)

    def _host_sync(self, key, original):
        counter = self

        @functools.wraps(original)
        def host_sync(*args, **kwargs):
            region = counter._region
            if region is not None and counter._host_depth == 0:
                region.host_syncs[key] += 1
            counter._host_depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._host_depth -= 1

        return host_sync

    def _wrap_process_groups(self):
        counter = self
        for cls in _subclasses(core.ProcessGroup):
            for name in collective_recorder.collective_methods(cls):
                original = getattr(cls, name)

                def collective(pg, *args, _name=name, _original=original, **kw):
                    region = counter._region
                    task = _original(pg, *args, **kw)
                    if region is not None:
                        sync = _pg_sync_flag(_name, args, kw)
                        phase = counter._phases[-1] if counter._phases else None
                        record = Collective("pg", _name, phase, sync, False)
                        region.collectives.append(record)
                        if type(task) is core.task:
                            i = len(region.collectives) - 1
                            region._tasks[id(task)] = (task, i)
                    return task

                functools.update_wrapper(collective, original)
                self._patch(cls, name, collective)

    def _wrap_task(self):
        counter = self
        original_wait = core.task.wait

        def wait(task, *args, **kwargs):
            region = counter._region
            if region is not None:
                task_, i = region._tasks.get(id(task), (None, None))
                if task_ is task:
                    region.waits["task.wait"] += 1
                    c = region.collectives[i]
                    region.collectives[i] = c._replace(waited=True)
                else:
                    region.waits["task.wait earlier"] += 1
            return original_wait(task, *args, **kwargs)

        functools.update_wrapper(wait, original_wait)
        self._patch(core.task, "wait", wait)
        if "synchronize" in vars(core.task):
            sync = self._host_sync("task.synchronize", core.task.synchronize)
            self._patch(core.task, "synchronize", sync)

    def _wrap_device_syncs(self):
        """:data:`DEVICE_SYNCS`, in every module attribute that is one of
        them (callers that imported the function by name)."""
        wrappers = {}
        for key, module in DEVICE_SYNCS.items():
            fn = getattr(module, key.rpartition(".")[2], None)
            if callable(fn) and id(fn) not in wrappers:
                wrappers[id(fn)] = (fn, self._host_sync(key, fn))
        for module in list(sys.modules.values()):
            if not isinstance(module, types.ModuleType):
                continue
            try:
                items = list(vars(module).items())
            except TypeError:
                continue
            for attr, value in items:
                fn, wrapper = wrappers.get(id(value), (None, None))
                if fn is value:
                    self._patch(module, attr, wrapper)
