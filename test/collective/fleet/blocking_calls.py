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

"""Counts host synchronisations and collectives inside chosen regions (e.g.
an optimizer's ``step()``), per name; test and benchmark helper. While a
:class:`BlockingCallCounter` is entered it wraps, and counts only inside a
:meth:`~BlockingCallCounter.counting` region: host synchronisations (the
``paddle.Tensor`` methods of :data:`TENSOR_HOST_SYNC_METHODS` on every
subclass defining its own, the device synchronisations, the task's
``synchronize``; the outermost of nested ones); collectives at two levels,
``dist.<name>`` (the functions of ``paddle.distributed``,
:data:`DIST_FUNCTIONS`, and of its ``stream``, in every module holding a
reference; the outermost) and ``pg.<name>`` (every public method of the
``ProcessGroup`` classes but the collective recorder's ``NOT_COLLECTIVES``;
one not matching :data:`PG_COLLECTIVE` fails ``__enter__``), each a
:class:`Collective` (``sync``: ``sync_op`` as passed or defaulted,
``*_on_calc_stream`` synchronous, a method without the flag such as
``FusedCommBuffer``'s ``all_gather(in, out)`` asynchronous); and
``task.wait``, apart from the host synchronisations.

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
import importlib.util
import inspect
import os
import re
import sys
import types

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
# paddle.distributed functions that communicate (each release's subset)
DIST_FUNCTIONS = tuple(
    "all_reduce broadcast all_gather all_gather_object barrier reduce scatter "
    "scatter_object_list gather send recv isend irecv send_object_list "
    "recv_object_list batch_isend_irecv alltoall alltoall_single "
    "reduce_scatter broadcast_object_list wait gloo_barrier".split()
)
# no sync_op argument: asynchronous by their API (they return tasks)
_ASYNC_BY_API = ("isend", "irecv", "batch_isend_irecv")
# what every collective method's name starts with
PG_COLLECTIVE = re.compile(
    r"^(all_?gather|all_?reduce|all_?to_?all|broadcast|barrier|send|recv|"
    r"reduce|scatter|gather)"
)
TASK_SYNC, TASK_WAIT = "task.synchronize", "task.wait"
HOST_SYNC_PREFIXES = ("tensor.", "device.", "core._device_synchronize")
HOST_SYNC_PREFIXES += (TASK_SYNC,)


def is_host_sync(key):
    """True when ``key`` (a :meth:`Region.counts` key) names a host
    synchronisation."""
    return key.startswith(HOST_SYNC_PREFIXES)


Collective = collections.namedtuple(
    "Collective", "level name phase sync waited"
)
Collective.__doc__ = """One collective call: ``level`` ``"dist"`` /
``"dist.stream"`` / ``"pg"``, ``name``, ``phase`` (label or None),
``sync`` (bool), ``waited`` (its task waited in the same region)."""
Collective.blocking = property(lambda c: bool(c.sync or c.waited))
Collective.key = property(
    lambda c: f"{c.level}.{c.name} " + ("blocking" if c.blocking else "async")
)


class Region:
    """What one counted region did: ``host_syncs`` (Counter by name),
    ``collectives`` (:class:`Collective` list in call order), ``waits``
    (Counter: ``task.wait`` of tasks started in the region, ``task.wait
    earlier`` of tasks started before it)."""

    def __init__(self, label):
        self.label = label
        self.host_syncs = collections.Counter()
        self.collectives = []
        self.waits = collections.Counter()
        self._tasks = {}  # id(task) -> (task, [indices in collectives])

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


def _recorder():
    """tools/collective/collective_recorder.py: loaded by the harness's
    rank hook in every launched rank; elsewhere (a benchmark) from the
    project's tools/collective."""
    if "collective_recorder" not in sys.modules:
        here = os.path.dirname(os.path.abspath(__file__))
        tools = os.path.join(here, *[".."] * 3, "tools")
        path = os.path.join(tools, "collective", "collective_recorder.py")
        spec = importlib.util.spec_from_file_location(
            "collective_recorder", path
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["collective_recorder"] = module
    return sys.modules["collective_recorder"]


def _subclasses(cls):
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(c for c in _subclasses(sub) if c not in out)
    return out


def _sync_flag_from_signature(signature, name, args, kwargs):
    if name in _ASYNC_BY_API:
        return False
    if signature is None or "sync_op" not in signature.parameters:
        return True  # barrier, *_object, wait: blocking by their API
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return bool(kwargs.get("sync_op", True))
    bound.apply_defaults()
    return bool(bound.arguments.get("sync_op", True))


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
        self._dist_depth = 0
        self._restore = []  # (target, attribute, value to put back)
        self._entered = False

    # -- regions and phases -------------------------------------------
    @contextlib.contextmanager
    def counting(self, label):
        """Count inside the block, into a new :class:`Region` appended to
        ``regions[label]``; regions do not nest (an inner one is ignored)."""
        if self._region is not None:
            yield self._region
            return
        region = self._region = Region(label)
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
        return self._inside(obj, method, self.counting, label or method)

    def tag_phase(self, obj, method, label):
        """Collectives issued inside ``obj.method`` carry ``phase=label``."""
        self._inside(obj, method, self.phase, label)

    def _inside(self, obj, name, context, label):
        """``obj.name`` (an instance attribute) runs inside ``context(label)``."""
        original = getattr(obj, name)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            with context(label):
                return original(*args, **kwargs)

        self._restore.append((obj, name, vars(obj).get(name, _MISSING)))
        vars(obj)[name] = wrapped
        return wrapped

    # -- install / restore ------------------------------------------------
    def __enter__(self):
        if self._entered:
            raise RuntimeError("BlockingCallCounter entered twice")
        self._entered = True
        try:
            for cls in _subclasses(paddle.Tensor):
                own = [n for n in TENSOR_HOST_SYNC_METHODS if n in vars(cls)]
                for name in own:
                    sync = self._host_sync(f"tensor.{name}", getattr(cls, name))
                    self._patch_class(cls, name, sync)
            self._wrap_process_groups()
            self._wrap_task()
            self._wrap_functions()
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, *exc):
        self._undo()
        return False

    def _undo(self):
        for target, name, value in reversed(self._restore):
            if isinstance(target, (types.ModuleType, type)):
                setattr(target, name, value)
            elif value is _MISSING:
                vars(target).pop(name, None)  # an instance attribute we added
            else:
                vars(target)[name] = value
        self._restore.clear()
        self._entered = False

    def _patch_class(self, cls, name, wrapper):
        self._restore.append((cls, name, vars(cls)[name]))
        setattr(cls, name, wrapper)

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
        unknown = []
        for cls in _subclasses(core.ProcessGroup):
            for name in _recorder().collective_methods(cls):
                if not PG_COLLECTIVE.match(name):
                    unknown.append(f"{cls.__name__}.{name}")
                    continue
                original = getattr(cls, name)

                def collective(pg, *args, _name=name, _original=original, **kw):
                    region = counter._region
                    task = _original(pg, *args, **kw)
                    if region is not None:
                        sync = _pg_sync_flag(_name, args, kw)
                        counter._record(region, "pg", _name, sync, task)
                    return task

                functools.update_wrapper(collective, original)
                self._patch_class(cls, name, collective)
        if unknown:
            raise RuntimeError(
                "ProcessGroup methods neither known as non-collectives nor "
                f"matched as collectives (add them to blocking_calls): "
                f"{unknown}"
            )

    def _record(self, region, level, name, sync, task):
        phase = self._phases[-1] if self._phases else None
        region.collectives.append(Collective(level, name, phase, sync, False))
        if task is not None and type(task) is core.task:
            # a paddle.distributed call and the ProcessGroup call it made
            # return the same task: both records get its wait
            entry = region._tasks.setdefault(id(task), (task, []))
            entry[1].append(len(region.collectives) - 1)

    def _wrap_task(self):
        counter = self
        original_wait = core.task.wait

        def wait(task, *args, **kwargs):
            region = counter._region
            if region is not None:
                entry = region._tasks.get(id(task))
                if entry is not None and entry[0] is task:
                    region.waits[TASK_WAIT] += 1
                    for i in entry[1]:
                        c = region.collectives[i]
                        region.collectives[i] = c._replace(waited=True)
                else:
                    region.waits[TASK_WAIT + " earlier"] += 1
            return original_wait(task, *args, **kwargs)

        functools.update_wrapper(wait, original_wait)
        self._patch_class(core.task, "wait", wait)
        if "synchronize" in vars(core.task):
            sync = self._host_sync(TASK_SYNC, core.task.synchronize)
            self._patch_class(core.task, "synchronize", sync)

    def _wrap_functions(self):
        """The paddle.distributed (and stream) collectives and the device
        synchronisations, in every module attribute that is one of them."""
        dist, wrappers = paddle.distributed, {}

        def add(fn, make):
            if callable(fn) and id(fn) not in wrappers:  # two names: once
                wrappers[id(fn)] = (fn, make())

        for name in DIST_FUNCTIONS:
            fn = getattr(dist, name, None)
            add(fn, lambda: self._dist_function("dist", name, fn))
        stream = getattr(dist, "stream", None)
        for name in sorted(vars(stream) if stream is not None else ()):
            fn = getattr(stream, name)
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            if PG_COLLECTIVE.match(name):
                add(fn, lambda: self._dist_function("dist.stream", name, fn))
        cuda = getattr(paddle.device, "cuda", None)
        for key, fn in (
            ("device.synchronize", getattr(paddle.device, "synchronize", None)),
            ("device.cuda.synchronize", getattr(cuda, "synchronize", None)),
            (
                "core._device_synchronize",
                getattr(core, "_device_synchronize", None),
            ),
        ):
            add(fn, lambda: self._host_sync(key, fn))
        # every module attribute that is one of them (callers that imported
        # the function by name)
        for module in list(sys.modules.values()):
            if not isinstance(module, types.ModuleType):
                continue
            try:
                items = list(vars(module).items())
            except TypeError:
                continue
            for attr, value in items:
                entry = wrappers.get(id(value))
                if entry is not None and entry[0] is value:
                    self._restore.append((module, attr, value))
                    setattr(module, attr, entry[1])

    def _dist_function(self, level, name, fn):
        counter = self
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(fn)
        def dist_function(*args, **kwargs):
            region = counter._region
            if region is None or counter._dist_depth:
                return fn(*args, **kwargs)
            sync = _sync_flag_from_signature(signature, name, args, kwargs)
            counter._dist_depth += 1
            try:
                task = fn(*args, **kwargs)
            finally:
                counter._dist_depth -= 1
            counter._record(region, level, name, sync, task)
            return task

        return dist_function
