"""Race checker: find reads of a parameter whose broadcast is still in flight.

A debugging mode for your own model. While broadcast overlap is on, every
Python path through a layer waits for a parameter's broadcast before handing
it out (``parameter_read_guard.py``); what no hook can see is a tensor
reference kept across ``step()`` and read later. On gloo such a read still
gives the right numbers (an async broadcast has finished when it returns); on
NCCL it reads memory the comm stream may still be writing. The checker makes
those reads visible on any machine, CPU or GPU: it wraps every operator entry
point Paddle's Python API calls (``paddle._C_ops.*``) and the tensor methods
that copy data out (``numpy``, ``item``, ``tolist``, ``__array__``), and
counts each call that receives a parameter whose broadcast task is pending,
by parameter, by the layer whose forward is running (``<outside forward>``
between steps) and by path (the operator or method name). At exit each rank
prints one summary line, plus one line per (parameter, layer, path).

Switch it on with the environment variable ``PADDLE_OVERLAY_CHECK`` before
``paddle_overlay.apply()`` runs (so it also works with ``PADDLE_OVERLAY=1``
zero-edit enablement), or with ``paddle_overlay.apply(check=...)``:

* ``1`` / ``report``: count and print the summary at exit;
* ``raise``: raise ``RuntimeError`` at the first racing read, naming the
  parameter, the layer and the path;
* ``0`` / unset: off. Off costs nothing: nothing is wrapped.

On, it is a debugging mode: every operator call goes through one Python
wrapper (measured: see ``benchmarks/README.md``, "race checker").
The same summary is available in-process from :func:`summary`.
"""

import atexit
import collections
import functools
import os
import sys

__all__ = [
    "CHECK_ENV",
    "disable",
    "enable",
    "is_enabled",
    "mode_from_env",
    "races",
    "summary",
]

CHECK_ENV = "PADDLE_OVERLAY_CHECK"
_MODES = {"1": "report", "report": "report", "raise": "raise"}
_OFF = {"", "0", "off"}

# Tensor methods that copy a tensor's data to the host.
_TENSOR_METHODS = ("numpy", "item", "tolist", "__array__")


class _State:
    mode = None  # None (off) | "report" | "raise"
    wrapped = []  # (owner object, attribute name, original)
    races = collections.Counter()  # (parameter, layer, path) -> reads
    layers = []  # stack of layer names whose forward is running
    atexit_registered = False


def mode_from_env(environ=None):
    """The mode ``PADDLE_OVERLAY_CHECK`` asks for: None, "report" or "raise".

    Raises:
        ValueError: the variable holds anything else (names the values it
            accepts).
    """
    raw = (environ if environ is not None else os.environ).get(CHECK_ENV, "")
    value = raw.strip().lower()
    if value in _OFF:
        return None
    if value not in _MODES:
        raise ValueError(
            f"{CHECK_ENV}={raw!r} is not understood; use 1 (or report) to "
            "count reads of a parameter with a pending broadcast and print "
            "a summary at exit, raise to stop at the first one, or 0 / "
            "unset for off."
        )
    return _MODES[value]


def is_enabled():
    """bool: whether the checker is installed."""
    return _State.mode is not None


def _pending():
    from .distributed.fleet.meta_optimizers.dygraph_optimizer import (
        parameter_read_guard,
    )

    return parameter_read_guard._PENDING


def _record(pending, value, path):
    owner = pending.get(id(value))
    if owner is None:
        return
    layer = _State.layers[-1] if _State.layers else "<outside forward>"
    name = getattr(value, "name", "?")
    _State.races[(name, layer, path)] += 1
    if _State.mode == "raise":
        raise RuntimeError(
            f"paddle_overlay race check: rank {_rank()} read parameter "
            f"{name} in {layer} through {path} while its broadcast was "
            "still pending (a tensor reference kept across step()?). Read "
            "it through its layer (layer.weight) after step(), or pass "
            "strict=True to _set_broadcast_overlap."
        )


def _check_args(args, kwargs, path, pending):
    for value in args:
        if type(value) in (list, tuple):
            for item in value:
                _record(pending, item, path)
        else:
            _record(pending, value, path)
    for value in kwargs.values():
        _record(pending, value, path)


def _wrap_op(name, fn, pending):
    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if pending:
            _check_args(args, kwargs, name, pending)
        return fn(*args, **kwargs)

    return checked


def _wrap_method(name, fn, pending):
    path = f"Tensor.{name}"

    @functools.wraps(fn)
    def checked(self, *args, **kwargs):
        if pending:
            _record(pending, self, path)
        return fn(self, *args, **kwargs)

    return checked


def _wrap_layer_call(fn):
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        _State.layers.append(f"{type(self).__name__}({self.full_name()})")
        try:
            return fn(self, *args, **kwargs)
        finally:
            _State.layers.pop()

    return call


def enable(mode="report"):
    """Install the checker (idempotent; a second call may change the mode).

    Args:
        mode (str): "report" (count, summary at exit) or "raise" (raise
            ``RuntimeError`` at the first racing read).

    Raises:
        ValueError: ``mode`` is neither.
    """
    if mode not in ("report", "raise"):
        raise ValueError(
            f"race check mode must be 'report' or 'raise', got {mode!r}."
        )
    if _State.mode is not None:
        _State.mode = mode
        return
    import paddle

    pending = _pending()
    wrapped = []
    for module in (paddle._C_ops,):
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("_") or not callable(fn):
                continue
            wrapped.append((module, name, fn))
            setattr(module, name, _wrap_op(name, fn, pending))
    for name in _TENSOR_METHODS:
        fn = getattr(paddle.Tensor, name, None)
        if fn is not None:
            wrapped.append((paddle.Tensor, name, fn))
            setattr(paddle.Tensor, name, _wrap_method(name, fn, pending))
    call = paddle.nn.Layer.__call__
    wrapped.append((paddle.nn.Layer, "__call__", call))
    paddle.nn.Layer.__call__ = _wrap_layer_call(call)
    _State.wrapped = wrapped
    _State.mode = mode
    if not _State.atexit_registered:
        _State.atexit_registered = True
        atexit.register(_print_summary_at_exit)


def disable():
    """Restore everything :func:`enable` wrapped; keeps the counts."""
    for owner, name, original in reversed(_State.wrapped):
        setattr(owner, name, original)
    _State.wrapped = []
    _State.mode = None


def races():
    """dict: ``(parameter name, layer, path) -> reads`` seen so far."""
    return dict(_State.races)


def _rank():
    return os.environ.get("PADDLE_TRAINER_ID", "0")


def summary():
    """str: the per-rank report, one line plus one per (parameter, layer,
    path), most frequent first."""
    total = sum(_State.races.values())
    lines = [
        f"paddle_overlay race check: rank {_rank()}: {total} read(s) of a "
        "parameter with a pending broadcast"
        + (" (none: every read waited for its broadcast)" if not total else "")
    ]
    for (name, layer, path), count in _State.races.most_common():
        lines.append(f"  {count:6d}  {name}  in {layer}  via {path}")
    return "\n".join(lines)


def _print_summary_at_exit():
    if _State.mode is not None or _State.races:
        print(summary(), file=sys.stderr, flush=True)
