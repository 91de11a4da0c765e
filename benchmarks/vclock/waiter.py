"""Who waited for a collective's task: read from the Python call stack of the ``wait()``.

Only Paddle's own frames and the frame kinds are looked at (a hook called by ``Layer.__call__``, a layer's
``forward``, an optimizer's ``step``), never the overlay's internals, so the same rule classifies the
product's waits and upstream Paddle's.
"""

import inspect

from paddle.nn import Layer

__all__ = ["WHO", "who_waited"]

# the kinds, in the order the report shows them
WHO = ("forward pre-hook", "read", "step", "program", "forward", "forward post-hook", "other")



def _codes(code):
    """``code`` and the code objects nested in it (Paddle 3.x runs hooks and forward in an inner function)."""
    out = {code}
    for const in code.co_consts:
        if isinstance(const, type(code)):
            out |= _codes(const)
    return out


# where Layer.__call__ runs hooks and forward (a layer without hooks: forward from __call__ itself)
_CALLERS = _codes(Layer._dygraph_call_func.__code__) | {Layer.__call__.__code__}
_LAYER_FILE = Layer._dygraph_call_func.__code__.co_filename


def _first_forward_line():
    lines, start = inspect.getsourcelines(Layer._dygraph_call_func)
    return next(start + i for i, line in enumerate(lines) if "self.forward(" in line)


_FORWARD_LINE = _first_forward_line()


def _is_optimizer(obj):
    import paddle

    return isinstance(obj, paddle.optimizer.Optimizer) or "_inner_opt" in getattr(obj, "__dict__", {})


def who_waited(frame):
    """The kind of caller (one of :data:`WHO`) of a wait whose innermost caller frame is ``frame``,
    walking outwards: a hook that ``Layer.__call__`` runs before (``forward pre-hook``) or after the
    layer's ``forward``; a ``Layer`` method handing out parameters (``read``: attribute access,
    ``parameters()``, ``state_dict()``); ``step``/``minimize`` of an optimizer (``step``: blocking sync,
    wait before the update); a compiled program's call (``program``); a layer's ``forward`` itself
    (``forward``: e.g. a collective the model issues); else ``other``."""
    while frame is not None:
        code, back = frame.f_code, frame.f_back
        called_by_layer = back is not None and back.f_code in _CALLERS
        if called_by_layer and code not in _CALLERS and code.co_name != "forward":
            return "forward pre-hook" if back.f_lineno < _FORWARD_LINE else "forward post-hook"
        if called_by_layer:
            return "forward"
        if code.co_filename == _LAYER_FILE and code not in _CALLERS and code.co_name != "__call__":
            return "read"
        if code.co_name in ("step", "minimize") and _is_optimizer(frame.f_locals.get("self")):
            return "step"
        if code.co_name == "__call__" and "dy2static" in code.co_filename:
            return "program"
        frame = back
    return "other"
