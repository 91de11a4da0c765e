# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Wait checker for the stage-1 broadcast overlap tests.

On gloo an async broadcast has finished when it returns, so a missing ``task.wait()`` never shows as a wrong number on
the CPU. This checker proves the waits by instrumentation instead: it wraps ``paddle.distributed.broadcast`` so every
``sync_op=False`` task records its ``wait()``, and at every point of use (each forward pre-hook of a layer that owns
parameters, and each optimizer update) it records a violation for any parameter about to be used whose latest broadcast
task was never waited. A broadcast of a bucket buffer (``broadcast_buckets.py``) counts for every watched parameter
whose memory lies inside that buffer. Sharding stage 1 V2 gathers instead of broadcasting: the checker also wraps the
process group's ``all_gather`` and ``all_gather_into_tensor`` (Paddle 3.x ``FusedCommBuffer.sync_params`` calls
``group.process_group.all_gather(slice_buffer, full_buffer)``; the overlay gathers each comm buffer's parameter
storage), and a pending all-gather counts for every watched parameter whose memory lies in the gathered tensors (the
full buffer); ``counts["gathers"]`` counts those. It also wraps the tensor functions that read parameters in the test
models (:data:`READ_FUNCTIONS`: ``F.linear``, ``F.embedding``, ``paddle.matmul``, ``paddle.linalg.norm``), so a read
outside any layer's call (a helper calling ``layer.forward``, ``F.linear(x, layer.weight)``, a tied head, weight-norm
logging) is checked at the read itself. A blocking broadcast or all-reduce (``HybridParallelOptimizer``'s model- and
pipeline-parallel syncs after the update) of a tensor whose latest async sync was never waited is a violation too
(``collective:broadcast``, ``collective:all_reduce``): no such collective may read or write memory a sharding collective
is still writing."""

import contextlib
import functools

import paddle

# (module, attribute) of each function whose tensor arguments are checked.
READ_FUNCTIONS = (
    (paddle.nn.functional, "linear"),
    (paddle.nn.functional, "embedding"),
    (paddle, "matmul"),
    (paddle.linalg, "norm"),
)


# process-group methods of an all-gather (wrapped on the class: pybind instances take no attributes)
GATHER_METHODS = ("all_gather", "all_gather_into_tensor")


def _memory_range(tensor):
    """[start, end) of ``tensor``'s elements in memory, in bytes."""
    start = tensor.data_ptr()
    return start, start + int(tensor._numel()) * tensor.element_size()


class _RecordingTask:
    """Proxy for a communication task that records ``wait()``."""

    def __init__(self, task, checker):
        self._task = task
        self._checker = checker
        self.waited = False

    def wait(self, *args, **kwargs):
        if not self.waited:
            self.waited = True
            self._checker.counts["waited"] += 1
        return self._task.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._task, name)


class ParamSyncWaitChecker:
    """Records async broadcast tasks and checks them at every point of use.

    Usage::

        checker = ParamSyncWaitChecker()
        with checker:                      # wraps paddle.distributed.broadcast
            opt._set_broadcast_overlap(True, layers=model)
            checker.watch(model, opt)      # hooks registered after overlap's
            ... train ...
            report = checker.step_report() # once per step
        assert checker.violations == []

    ``counts`` holds running totals: ``launched`` async tasks, ``waited``, ``checked`` parameter uses, ``writes`` of a
    broadcast parameter through ``Tensor.set_value`` (how ``set_state_dict`` loads); ``violations`` lists ``(where,
    parameter name)`` for each use of a parameter with a pending task; ``outside_step`` each async broadcast (of any
    tensor) and each all-gather of watched parameters issued, once :meth:`watch` ran, while no ``step()``/``minimize()``
    of a watched optimizer ran (the schedule's invariant: every sync starts inside the step, hooks and reads only wait).
    """

    def __init__(self):
        self._latest = {}  # id(tensor) -> (tensor, _RecordingTask)
        self._watched = {}  # id(parameter) -> parameter, from watch()
        self._patched = []  # (owner, attribute, original or None: set on an instance) of each function it wrapped
        self._handles = []
        self._hooked = []  # (layer, handle) of each checker pre-hook
        self._in_step = 0
        self.watching = False
        self.outside_step = []
        self.counts = {"launched": 0, "waited": 0, "checked": 0, "writes": 0, "gathers": 0}
        self.violations = []
        # each recorded all-gather's task (``.params``: what it covers), in launch order
        self.gather_log = []
        self._last_report = dict(self.counts, violations=0)

    # -- broadcast instrumentation -------------------------------------
    def _wrap(self, owner, name, wrapper, instance=False):
        """``owner.name`` replaced by ``wrapper(original, *args, **kwargs)`` until the checker exits (``instance``: a
        method of the object ``owner``, set on the object, then removed)."""
        original = getattr(owner, name)
        self._patched.append((owner, name, None if instance else original))

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            return wrapper(original, *args, **kwargs)

        setattr(owner, name, wrapped)

    def __enter__(self):
        def recording_broadcast(original, tensor, *args, **kwargs):
            sync_op = kwargs.get("sync_op", args[2] if len(args) > 2 else True)
            if sync_op and id(tensor) in self._latest:
                self.check([tensor], "collective:broadcast")
            task = original(tensor, *args, **kwargs)
            if sync_op or task is None:
                return task
            proxy = _RecordingTask(task, self)
            self._note_outside_step(f"broadcast of {tensor.name}")
            self._latest[id(tensor)] = (tensor, proxy)
            if id(tensor) not in self._watched:  # a bucket: its parameters
                start, end = _memory_range(tensor)
                for p in self._watched.values():
                    if start <= p.data_ptr() < end:
                        self._latest[id(p)] = (p, proxy)
            self.counts["launched"] += 1
            return proxy

        def checked_all_reduce(original, tensor, *args, **kwargs):
            if id(tensor) in self._latest:
                self.check([tensor], "collective:all_reduce")
            return original(tensor, *args, **kwargs)

        def checked_set_value(original, tensor, *args, **kwargs):
            if id(tensor) in self._latest:
                self.counts["writes"] += 1
                self.check([tensor], "write:set_value")
            return original(tensor, *args, **kwargs)

        self._wrap(paddle.distributed, "broadcast", recording_broadcast)
        self._wrap(paddle.distributed, "all_reduce", checked_all_reduce)
        self._wrap_gathers()
        for module, name in READ_FUNCTIONS:
            self._wrap(module, name, functools.partial(self._checked_read, name))
        # writes: set_state_dict loads through Tensor.set_value
        self._wrap(paddle.Tensor, "set_value", checked_set_value)
        return self

    def _wrap_gathers(self):
        """Record each all-gather of a process group whose tensors hold watched parameters (sharding stage 1 V2's comm
        buffers)."""
        from paddle.base import core

        def tensors_of(args):
            for a in args:
                if isinstance(a, (list, tuple)):
                    yield from (t for t in a if isinstance(t, paddle.Tensor))
                elif isinstance(a, paddle.Tensor):
                    yield a

        def recording_gather(original, group, *args, **kwargs):
            task = original(group, *args, **kwargs)
            if task is None:
                return task
            ranges = [_memory_range(t) for t in tensors_of(list(args) + list(kwargs.values())) if t._is_initialized()]
            covered = [
                p
                for p in self._watched.values()
                if p._is_initialized() and any(s <= p.data_ptr() < e for s, e in ranges)
            ]
            if not covered:
                return task
            proxy = _RecordingTask(task, self)
            self._note_outside_step(f"all-gather of {covered[0].name}")
            for p in covered:
                self._latest[id(p)] = (p, proxy)
            self.counts["launched"] += 1
            self.counts["gathers"] += 1
            self.gather_log.append(proxy)
            proxy.params = covered
            return proxy

        for name in GATHER_METHODS:
            if hasattr(core.ProcessGroup, name):
                self._wrap(core.ProcessGroup, name, recording_gather)

    @contextlib.contextmanager
    def as_step(self):
        """Syncs started in the block count as inside a step: a watched optimizer's ``step()``/``minimize()``, or a case
        that calls the owner's ``launch()`` itself, as ``step()`` would."""
        self._in_step += 1
        try:
            yield
        finally:
            self._in_step -= 1

    def _note_outside_step(self, what):
        if self.watching and not self._in_step:
            self.outside_step.append(what)

    def _checked_read(self, name, fn, /, *args, **kwargs):
        tensors = [a for a in list(args) + list(kwargs.values()) if id(a) in self._latest]
        if tensors:
            self.check(tensors, f"read:{name}")
        return fn(*args, **kwargs)

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._patched):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._patched.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._hooked.clear()
        return False

    # -- points of use --------------------------------------------------
    def watch(self, model, optimizer):
        """Check at every forward pre-hook of ``model`` and every update of ``optimizer``. Call after enabling overlap so
        these hooks run after the overlap's own."""
        for name, layer in model.named_sublayers(include_self=True):
            own = list(layer.parameters(include_sublayers=False))
            self._watched.update((id(p), p) for p in own)
            if own:
                handle = layer.register_forward_pre_hook(self._make_pre_hook(name or "<root>", own))
                self._handles.append(handle)
                self._hooked.append((layer, handle))
        inner = optimizer
        while "_inner_opt" in vars(inner):
            inner = vars(inner)["_inner_opt"]

        def checked_apply_optimize(original, *args, **kwargs):
            self.check([t for t, _ in self._latest.values()], "update")  # every tensor ever synced asynchronously
            return original(*args, **kwargs)

        def in_step(method, *args, **kwargs):
            with self.as_step():
                return method(*args, **kwargs)

        self._wrap(inner, "_apply_optimize", checked_apply_optimize, instance=True)
        for name in ("step", "minimize"):  # where every sync must start
            if name not in vars(optimizer):
                self._wrap(optimizer, name, in_step, instance=True)
        self.watching = True

    def owns_hook(self, layer, hook_id):
        """True when ``hook_id`` in ``layer._forward_pre_hooks`` is one of the checker's pre-hooks (registered by
        :meth:`watch`)."""
        return any(l is layer and h._hook_id == hook_id for l, h in self._hooked)

    def hooks_last(self):
        """Move the checker's pre-hooks after every other pre-hook of their layers: an overlap that registers its hooks
        later than ``watch`` (Paddle 3.x's V2 all-gather overlap does so at the first ``step()``) still waits before the
        check."""
        for layer, handle in self._hooked:
            hooks = layer._forward_pre_hooks
            if handle._hook_id in hooks:
                hooks.move_to_end(handle._hook_id)

    def _make_pre_hook(self, where, params):
        def hook(_layer, _inputs):
            self.check(params, f"forward:{where}")

        return hook

    def check(self, params, where):
        """Record a violation for each of ``params`` with an unwaited task."""
        for p in params:
            self.counts["checked"] += 1
            entry = self._latest.get(id(p))
            if entry is not None and not entry[1].waited:
                self.violations.append((where, p.name))

    def synced_ids(self):
        """``{id(tensor)}`` of every tensor (parameter or bucket member) a recorded broadcast or all-gather has written."""
        return set(self._latest)

    def num_unwaited(self):
        """int: tasks launched and not waited yet."""
        return len({id(proxy) for _, proxy in self._latest.values() if not proxy.waited})

    def step_report(self):
        """Counts since the previous report, e.g. ``{'launched': 8, 'waited': 8, 'checked': 20, 'violations': 0}``."""
        now = dict(self.counts, violations=len(self.violations))
        report = {k: now[k] - self._last_report[k] for k in now}
        self._last_report = now
        return report
