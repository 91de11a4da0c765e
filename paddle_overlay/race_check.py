"""Race checker: find reads of a parameter whose sync (V1 broadcast, V2 all-gather) is still in flight.

A debugging mode for your own model. While the parameter sync overlap is on, every
Python path through a layer waits for a parameter's sync before handing
it out (``read_interception.py``); what no hook can see is a tensor
reference kept across ``step()`` and read later. On gloo such a read still
gives the right numbers (an async collective has finished when it returns); on
NCCL it reads memory the comm stream may still be writing. The checker makes
those reads visible on any machine, CPU or GPU: it wraps every operator entry
point Paddle's Python API calls (``paddle._C_ops.*``, and
``paddle._legacy_C_ops.*`` where compiled programs run on Paddle 2.6),
every other name Paddle's modules give those operators (such as
``paddle.linalg.matmul`` on 3.x), the tensor methods
that copy data out (``numpy``, ``item``, ``tolist``, ``__array__``) and the
tensor operators and methods Paddle implements in C++ without ``_C_ops``
(``x @ w``, ``h + b``, ``w[0]``, ``w.clone()``, ``x.copy_(w)``,
``w.set_value(v)``, ``w.cpu()``), and
counts each call that receives a parameter whose broadcast or all-gather task is pending,
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
import threading

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
# Tensor operators and methods that read or write a tensor's data in C++
# without going through paddle._C_ops (``x @ w``, ``h + b``, ``w[0]``,
# ``w.clone()``, ``x.copy_(w)``, ``w.set_value(v)``, ``w.cpu()``); the
# parameter can be self or an argument (``x @ w`` is ``x.__matmul__(w)``).
# Only what each release defines on the class itself is wrapped; operators
# that Paddle writes in Python over paddle._C_ops (``-w``, ``abs(w)``) are
# already seen there and are not wrapped twice.
_TENSOR_OPERATORS = tuple(
    """
    __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__
    __rtruediv__ __div__ __rdiv__ __floordiv__ __rfloordiv__ __mod__ __rmod__
    __pow__ __rpow__ __matmul__ __rmatmul__ __and__ __rand__ __or__ __ror__
    __xor__ __rxor__ __lshift__ __rlshift__ __rshift__ __rrshift__
    __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __getitem__ __setitem__
    clone detach detach_ _copy_to copy_ set_value
    """.split()
)


class _State:
    mode = None  # None (off) | "report" | "raise"
    wrapped = []  # (owner object, attribute name, original)
    races = collections.Counter()  # (parameter, layer, path) -> reads
    layers = []  # stack of layer names whose forward is running
    atexit_registered = False


class _Thread(threading.local):
    # inside a checked tensor method: the calls it makes are the same read
    # (np.asarray(w) is w.__array__(), which calls w.numpy()), not counted
    inside = False


_THREAD = _Thread()


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
            "count reads of a parameter with a pending sync and print "
            "a summary at exit, raise to stop at the first one, or 0 / "
            "unset for off."
        )
    return _MODES[value]


def is_enabled():
    """bool: whether the checker is installed."""
    return _State.mode is not None


def _pending():
    from .distributed.fleet.meta_optimizers.dygraph_optimizer import sync_registry

    return sync_registry.PENDING


def _record(pending, value, path):
    entry = pending.get(id(value))
    if entry is None:
        return
    owner = entry[0]
    layer = _State.layers[-1] if _State.layers else "<outside forward>"
    name = getattr(value, "name", "?")
    _State.races[(name, layer, path)] += 1
    if _State.mode == "raise":
        raise RuntimeError(
            f"paddle_overlay race check: rank {_rank()} read parameter "
            f"{name} in {layer} through {path} while its {owner.collective} "
            "was still pending (a tensor reference kept across step()?). "
            "Read it through its layer (layer.weight) after step(), or pass "
            f"strict=True to {owner.method}."
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
        if pending and not _THREAD.inside:
            _check_args(args, kwargs, name, pending)
        return fn(*args, **kwargs)

    return checked


def _wrap_method(name, fn, pending):
    """A tensor method or operator: checks self and the arguments (the
    parameter is the argument in ``x @ w``, ``x.copy_(w)``)."""
    path = f"Tensor.{name}"

    @functools.wraps(fn)
    def checked(self, *args, **kwargs):
        if not pending or _THREAD.inside:
            return fn(self, *args, **kwargs)
        _record(pending, self, path)
        _check_args(args, kwargs, path, pending)
        _THREAD.inside = True
        try:
            return fn(self, *args, **kwargs)
        finally:
            _THREAD.inside = False

    return checked


def _wrap_op_aliases(checked_ops, wrapped):
    """Point every other name of a ``paddle._C_ops`` operator in Paddle's
    modules at its wrapper: some APIs are the operator itself, bound at
    import (``from paddle._C_ops import matmul`` makes
    ``paddle.linalg.matmul`` the raw operator on Paddle 3.x)."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (
            module_name == "paddle" or module_name.startswith("paddle.")
        ):
            continue
        try:
            names = list(vars(module).items())
        except TypeError:
            continue
        for name, value in names:
            entry = checked_ops.get(id(value))
            if entry is None or entry[0] is not value:
                continue
            wrapped.append((module, name, value))
            setattr(module, name, entry[1])


def _tensor_classes():
    """paddle.Tensor, and the parameter class where it defines an operator
    of its own (``EagerParamBase._copy_to``, behind ``w.cpu()``)."""
    import paddle

    classes = [paddle.Tensor]
    try:
        from paddle.base.framework import EagerParamBase
    except ImportError:  # pragma: no cover - every tested release has it
        EagerParamBase = None
    if EagerParamBase is not None and EagerParamBase is not paddle.Tensor:
        classes.append(EagerParamBase)
    return classes


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
    checked_ops = {}  # id(original operator) -> (original, its wrapper)
    # _legacy_C_ops: what a compiled program runs through on Paddle 2.6
    # (run_program, with the parameters in a list argument).
    modules = [paddle._C_ops, getattr(paddle, "_legacy_C_ops", None)]
    for module in modules:
        if module is None:
            continue
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("_") or not callable(fn):
                continue
            if id(fn) not in checked_ops:
                checked_ops[id(fn)] = (fn, _wrap_op(name, fn, pending))
            wrapped.append((module, name, fn))
            setattr(module, name, checked_ops[id(fn)][1])
    _wrap_op_aliases(checked_ops, wrapped)
    for name in _TENSOR_METHODS:
        fn = getattr(paddle.Tensor, name, None)
        if fn is not None:
            wrapped.append((paddle.Tensor, name, fn))
            setattr(paddle.Tensor, name, _wrap_method(name, fn, pending))
    for cls in _tensor_classes():
        for name in _TENSOR_OPERATORS:
            fn = cls.__dict__.get(name)
            if fn is None or not callable(fn):
                continue
            wrapped.append((cls, name, fn))
            setattr(cls, name, _wrap_method(name, fn, pending))
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
        "parameter with a pending broadcast or all-gather"
        + (" (none: every read waited for its sync)" if not total else "")
    ]
    for (name, layer, path), count in _State.races.most_common():
        lines.append(f"  {count:6d}  {name}  in {layer}  via {path}")
    return "\n".join(lines)


def _print_summary_at_exit():
    if _State.mode is not None or _State.races:
        print(summary(), file=sys.stderr, flush=True)
