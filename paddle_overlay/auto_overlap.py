"""``PADDLE_OVERLAY=overlap``: the parameter-sync overlap for trainers that never call its switch.

Overlay only: this module never goes into the patches (``tools/make_patch.py`` carries only
``OVERLAY_MODULES`` and ``NEW_MODULES`` of ``_patching.py``). :func:`paddle_overlay.apply` installs it
when ``PADDLE_OVERLAY=overlap`` (``_startup.mode``), and :func:`paddle_overlay.remove` takes it off.

What it does, per process:

* every sharding stage 1 optimizer Paddle builds (``DygraphShardingOptimizer``, V1, or
  ``DygraphShardingOptimizerV2``, V2; inside ``fleet.distributed_optimizer``, or inside a
  ``HybridParallelOptimizer`` subclass built directly, as ERNIE 4.5's MoE trainers do) and every
  wrapped model (a ``MetaParallelBase``: ``fleet.distributed_model``'s result, a
  ``PipelineParallel`` built directly) is noted when its ``__init__`` returns;
* as soon as an optimizer and the one wrapped model that holds all of its parameters both exist,
  in either order, the optimizer's own switch is called for it, exactly as a trainer would: V1
  ``_set_broadcast_overlap(True, layers=model)``, V2 ``_set_all_gather_overlap_forward(True,
  model)`` (their defaults: buckets of 256 MB for V1, not strict). That is before the model's
  first forward after both exist, so that forward records the order, as with an explicit call.
  A wrapped model inside another one that exists then does not count (ERNIEKit wraps a
  ``TensorParallel`` it built in ``fleet.distributed_model``'s: the outer one runs the forward);
* an optimizer that has no such model when its first ``step()``/``minimize()`` starts, or that
  two wrapped models (neither inside the other) hold, gets no overlap; neither does one whose
  switch refuses the configuration (its ``ValueError``, e.g. V2 with ``release_gradients``): it
  trains as without the overlay, and the reason is printed;
* an explicit call of the switch by the trainer that returns decides from then on: on, with its
  arguments (the owner it opens replaces the one opened here), or off, for good. A call that
  raises raises as without this module and changes nothing here.

Each decision prints one line per rank to stderr, naming the optimizer (class, V1/V2, a number
counted per process in creation order, its parameter count), which overlap it got and with which
model, or why it got none and what to call instead; when the parameter sync is left without
overlap while the strategy has the gradient overlap on (``sharding_configs.comm_overlap``,
PaddleFormers' ``stage1_overlap``), the line says that this is another overlap.

Every rank of a sharding group decides alike: from which wrapped model holds the optimizer's
parameters (the same model on every rank), the strategy, and the switch's own checks, which read
only the strategy and the sharding degree; nothing is decided from timing, and no collective
is added.
"""

import functools
import itertools
import sys
import weakref

from ._version_gate import paddle_class

__all__ = [
    "KINDS",
    "Kind",
    "before_update",
    "explicit_call_returned",
    "forget",
    "gradient_overlap_note",
    "optimizer_built",
    "patches",
    "wrapper_built",
]

_ATTR = "_paddle_overlay_auto"  # the per-optimizer record, in the optimizer's __dict__
_WRAPPER = ("distributed.fleet.meta_parallel.meta_parallel_base", "MetaParallelBase")


class Kind:
    """One sharding stage 1 optimizer class: its switch and how it is called.

    Args:
        name (str): ``"V1"`` or ``"V2"``.
        class_name (str): Paddle's class in ``dygraph_sharding_optimizer``.
        method (str): the switch.
        collective (str): what its overlap sends, for the lines.
        params_attr (str): the optimizer's own parameter list (the positions the overlap uses).
        call (str): the call a trainer writes, for the lines.
    """

    def __init__(self, name, class_name, method, collective, params_attr, call):
        self.name, self.class_name, self.method = name, class_name, method
        self.collective, self.params_attr, self.call = collective, params_attr, call
        self.switch = None  # the switch's function, set by patches()

    def turn_on(self, optimizer, model):
        """Call the switch (the function the class had before :func:`patches`) for ``model``.

        Raises:
            ValueError, TypeError: the switch's own (``dygraph_sharding_optimizer.py``).
        """
        if self.name == "V1":
            return self.switch(optimizer, True, layers=model)
        return self.switch(optimizer, True, model)


KINDS = {
    "V1": Kind(
        "V1",
        "DygraphShardingOptimizer",
        "_set_broadcast_overlap",
        "broadcast",
        "_origin_parameter_list",
        "optimizer._set_broadcast_overlap(True, layers=model)",
    ),
    "V2": Kind(
        "V2",
        "DygraphShardingOptimizerV2",
        "_set_all_gather_overlap_forward",
        "all-gather",
        "_parameter_list",
        "optimizer._set_all_gather_overlap_forward(True, model)",
    ),
}


class _Record:
    """What this module knows of one optimizer: its number, its kind, and who decided its
    overlap (``by``: None while undecided, ``"setting"``, or ``"trainer"``)."""

    def __init__(self, serial, kind, num_params):
        self.serial, self.kind, self.num_params = serial, kind, num_params
        self.by = None

    def label(self, optimizer):
        return f"{type(optimizer).__name__} #{self.serial} ({self.kind.name}, {self.num_params} parameters)"


class _State:
    """The process-wide registry (weak: it keeps no optimizer or model alive)."""

    def __init__(self):
        self.serials = itertools.count(1)
        self.undecided = []  # weakref.ref to optimizers not decided yet, in creation order
        self.wrappers = []  # weakref.ref to wrapped models, in creation order


_state = _State()


def forget():
    """Drop every record of optimizers and wrapped models (``remove()`` calls it)."""
    global _state
    _state = _State()


def _live(refs):
    return [obj for obj in (ref() for ref in refs) if obj is not None]


def _say(text):
    import paddle

    sys.stderr.write(f"paddle_overlay: rank {paddle.distributed.get_rank()}: {text}\n")
    sys.stderr.flush()


def _param_ids(model):
    # the dicts' own values: no read of a parameter whose sync another owner has pending waits here
    layers = model.sublayers(include_self=True)
    return {id(p) for layer in layers for p in dict.values(layer._parameters) if p is not None}


def _outermost(models):
    """``models`` less those another of them wraps (ERNIEKit wraps a ``TensorParallel`` it built
    in ``fleet.distributed_model``'s: the outer one runs the forward)."""
    inner = {id(sub) for m in models for sub in m.sublayers()}
    return [m for m in models if id(m) not in inner]


def _describe(model):
    inner = model._sub_layers.get("_layers")
    return f"{type(model).__name__}({type(inner).__name__})" if inner is not None else type(model).__name__


def gradient_overlap_note(strategy):
    """str: the note a line without parameter-sync overlap ends with when ``strategy`` (fleet's
    ``DistributedStrategy`` or None) has the gradient overlap on; empty otherwise."""
    if strategy is None:
        return ""
    configs = strategy.hybrid_configs
    on = [
        name
        for section, field, name in (
            ("sharding_configs", "comm_overlap", "sharding_configs.comm_overlap"),
            ("pp_configs", "sharding_comm_overlap", "pp_configs.sharding_comm_overlap"),
        )
        if getattr(configs[section], field, False)
    ]
    if not on:
        return ""
    return (
        f" Note: {' and '.join(on)} {'is' if len(on) == 1 else 'are'} on: that is the gradient overlap (the "
        "reduce of gradients during backward; PaddleFormers --stage1_overlap, PaddleNLP "
        "--sharding_parallel_config enable_stage1_overlap), not this parameter sync."
    )


def _strategy():
    from paddle.distributed import fleet

    return fleet.fleet._user_defined_strategy


def _decide(optimizer, record, text, overlapped, by="setting"):
    record.by = by
    _state.undecided = [r for r in _state.undecided if r() is not None and r() is not optimizer]
    note = "" if overlapped else gradient_overlap_note(_strategy())
    _say(f"{record.label(optimizer)}: {text}{note}")


def optimizer_built(optimizer, kind):
    """Note a sharding stage 1 optimizer whose ``__init__`` returned (called by the wrapper
    :func:`patches` sets on its class); turn its overlap on if the wrapped model that holds its
    parameters exists already, else leave it undecided.

    Args:
        optimizer: a ``DygraphShardingOptimizer`` or ``DygraphShardingOptimizerV2``.
        kind (Kind): its entry of :data:`KINDS`.

    Raises:
        Any error of the switch other than its ``ValueError`` (a refusal, said and absorbed).
    """
    params = vars(optimizer)[kind.params_attr]
    vars(optimizer)[_ATTR] = _Record(next(_state.serials), kind, len(params))
    _state.undecided.append(weakref.ref(optimizer))
    _try(optimizer)


def wrapper_built(model):
    """Note a wrapped model whose ``__init__`` returned (called by the wrapper :func:`patches`
    sets on ``MetaParallelBase``); turn the overlap on for every undecided optimizer whose
    parameters it holds, in the optimizers' creation order.

    Args:
        model (paddle.nn.Layer): a ``MetaParallelBase``.

    Raises:
        As :func:`optimizer_built`.
    """
    _state.wrappers = [ref for ref in _state.wrappers if ref() is not None] + [weakref.ref(model)]
    for optimizer in _live(_state.undecided):
        _try(optimizer)


def _try(optimizer):
    record = vars(optimizer)[_ATTR]
    kind = record.kind
    wanted = {id(p) for p in vars(optimizer)[kind.params_attr]}
    holders = _outermost([m for m in _live(_state.wrappers) if wanted <= _param_ids(m)])
    if not holders:
        return  # decided at the first update if no wrapped model comes first
    if len(holders) > 1:
        names = ", ".join(_describe(m) for m in holders)
        _decide(
            optimizer,
            record,
            f"no {kind.collective} overlap, training without it: {len(holders)} wrapped models hold all of its "
            f"parameters ({names}), so PADDLE_OVERLAY=overlap does not choose; call {kind.call} with the one "
            "that trains.",
            overlapped=False,
        )
        return
    model = holders[0]
    try:
        kind.turn_on(optimizer, model)
    except ValueError as refusal:  # the switch's own refusal: nothing changed
        _decide(
            optimizer,
            record,
            f"no {kind.collective} overlap, training without it: {kind.method} refuses this configuration: "
            f"{refusal}",
            overlapped=False,
        )
        return
    _decide(
        optimizer,
        record,
        f"{kind.collective} overlap on with {_describe(model)}, turned on by PADDLE_OVERLAY=overlap as "
        f"{kind.call} (the trainer's own call of {kind.method} replaces it).",
        overlapped=True,
    )


def before_update(optimizer):
    """At each ``step()``/``minimize()`` of a sharding stage 1 optimizer, before the overlay's
    edit of it: one still undecided (no wrapped model holds all of its parameters) is decided
    now, without overlap, and says so. Raises nothing of its own."""
    record = vars(optimizer).get(_ATTR)
    if record is None or record.by is not None:
        return
    kind = record.kind
    wanted = {id(p) for p in vars(optimizer)[kind.params_attr]}
    held = [(len(wanted & _param_ids(m)), _describe(m)) for m in _live(_state.wrappers)]
    closest = max(held, default=(0, None))
    where = f"; the closest, {closest[1]}, holds {closest[0]}" if closest[0] else ""
    _decide(
        optimizer,
        record,
        f"no {kind.collective} overlap, training without it: no wrapped model (fleet.distributed_model's "
        f"result or a PipelineParallel) holds all of its {record.num_params} parameters at its first "
        f"update{where}. Call {kind.call} yourself, with the model whose forward uses them.",
        overlapped=False,
    )


def explicit_call_returned(optimizer, method):
    """The trainer's own call of ``method`` (the switch) on ``optimizer`` returned: from now on
    the trainer decides this optimizer's overlap (said once, with the state the call left).
    Optimizers built before :func:`patches` was applied are not known here and left alone."""
    record = vars(optimizer).get(_ATTR)
    if record is None or record.by == "trainer":
        return
    from .distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
        get_param_sync_overlap,
    )

    on = get_param_sync_overlap(optimizer) is not None
    _decide(
        optimizer,
        record,
        f"the trainer's own {method} call turned the {record.kind.collective} overlap {'on' if on else 'off'}; "
        "PADDLE_OVERLAY=overlap leaves this optimizer to the trainer.",
        overlapped=on,
        by="trainer",
    )


def _after_init(init, noted):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        noted(self)

    return __init__


def _before(method, check):
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        check(self)
        return method(self, *args, **kwargs)

    return wrapped


def _explicit(switch, method):
    @functools.wraps(switch)
    def wrapped(self, *args, **kwargs):
        result = switch(self, *args, **kwargs)
        explicit_call_returned(self, method)
        return result

    return wrapped


def patches(current):
    """The attributes :func:`paddle_overlay.apply` sets for this module, after the overlay's.

    Args:
        current (Callable[[type, str], object]): the value the class attribute will have once the
            overlay's own methods are set (``apply()`` computes them first).

    Returns:
        tuple[list[tuple[type, str, object]], list[str]]: (class, name, value) to set, and the
        problems that make it impossible (a class missing or moved); when there are problems the
        list of patches is empty and nothing was changed.
    """
    wrapper, problem = paddle_class(*_WRAPPER)
    if problem:  # the optimizers' classes were checked by apply() already
        return [], [problem]
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        dygraph_sharding_optimizer as optimizers,
    )

    plan = []
    for kind in KINDS.values():
        cls = getattr(optimizers, kind.class_name)
        kind.switch = current(cls, kind.method)
        noted = functools.partial(optimizer_built, kind=kind)
        plan.append((cls, "__init__", _after_init(current(cls, "__init__"), noted)))
        for name in ("step", "minimize"):
            if current(cls, name) is not None:
                plan.append((cls, name, _before(current(cls, name), before_update)))
        plan.append((cls, kind.method, _explicit(kind.switch, kind.method)))
    plan.append((wrapper, "__init__", _after_init(current(wrapper, "__init__"), wrapper_built)))
    return plan, []
