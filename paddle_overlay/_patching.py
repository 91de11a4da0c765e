"""Set the overlay methods onto the installed Paddle classes, and take them off.

Each overlay module under ``paddle_overlay/distributed/...`` mirrors the
Paddle module of the same dotted path and holds one class of the same name
as the Paddle class, plus ``OVERLAY_WRAPS``: the names that replace an
existing method, whose original is kept as ``_origin_<name>``.

Before anything is patched, :func:`apply` checks the installed Paddle:

* its version against :data:`TESTED_PADDLE` (the releases the collective
  tests run on). A tested release applies silently; an untested release not
  older than the oldest tested one applies after one ``UserWarning``; an
  older or unreadable version is refused (:class:`UnsupportedPaddleVersion`).
* its structure (:class:`PaddleInternalsChanged` names what moved): every
  class of :data:`OVERLAY_MODULES` and :data:`USED_CLASSES` exists; every
  wrapped method exists on the class itself; the call paths and attributes
  the overlay relies on are still in the source (:data:`CALL_PATHS`: V1's,
  V2's and ``HybridParallelOptimizer``'s, ``FusedCommBuffer``'s fields); the
  Paddle internals checked by a function are in place
  (:data:`REQUIRED_INTERNALS`: the read interception's ``Layer.__getattr__``
  reading ``_parameters``, ``named_parameters``/``state_dict`` iterating it,
  ``StaticFunction.__call__``, SOT's skip files; V2's ``step`` and
  ``_sharding_sync_parameters`` reaching the blocking all-gather with
  ``_all_gather_overlap_forward`` False, ``FusedCommBuffer.sync_params``'s
  ``process_group.all_gather(shard, full)``, how its storage is freed, the
  ``paddle.Tensor`` methods the units call); and no method the
  overlay *adds* (anything not wrapped and not in
  :data:`REPLACES_UPSTREAM`) exists on the installed class, so an added
  method never shadows one a later Paddle defines. Such a clash is refused,
  not renamed: a renamed method would not be the one callers reach.
"""

import ast
import gc
import importlib
import inspect
import os
import re
import sys
import textwrap
import warnings

__all__ = [
    "CALL_PATHS",
    "OVERLAY_MODULES",
    "PaddleInternalsChanged",
    "REPLACES_UPSTREAM",
    "REQUIRED_INTERNALS",
    "SUPPORTED_PADDLE",
    "TESTED_PADDLE",
    "USED_CLASSES",
    "UnsupportedPaddleVersion",
    "apply",
    "remove",
    "is_applied",
    "origin_name",
    "overlay_methods",
]

# (Paddle module, class) -> overlay module. Order matters: the sharding
# optimizer first, the hybrid optimizer (which imports it) second.
_DYGRAPH_OPT = "distributed.fleet.meta_optimizers.dygraph_optimizer"
OVERLAY_MODULES = (
    (f"{_DYGRAPH_OPT}.dygraph_sharding_optimizer", "DygraphShardingOptimizer"),
    (f"{_DYGRAPH_OPT}.dygraph_sharding_optimizer", "DygraphShardingOptimizerV2"),
    (f"{_DYGRAPH_OPT}.hybrid_parallel_optimizer", "HybridParallelOptimizer"),
)
# Paddle classes the overlay relies on without patching them, as (module, class).
USED_CLASSES = (("distributed.fleet.utils.tensor_fusion_helper", "FusedCommBuffer"),)

# Every release the package index serves that the collective tests pass on
# (tools/run_collective_tests.sh --matrix); oldest first.
TESTED_PADDLE = (
    "2.6.2",
    "3.0.0",
    "3.1.0",
    "3.1.1",
    "3.2.0",
    "3.2.1",
    "3.2.2",
    "3.3.0",
    "3.3.1",
)
SUPPORTED_PADDLE = (
    f"{', '.join(TESTED_PADDLE)} (tested); a newer release applies with a "
    f"warning; older than {TESTED_PADDLE[0]} is refused"
)

# Methods the overlay defines on purpose in place of Paddle's own version of
# the same API (upstream PR #63945 added _set_broadcast_overlap in 3.0):
# replaced without calling the original.
# (and Paddle 3.x's V2 _set_all_gather_overlap_forward, PaddleFormers'
# --stage1_allgather_overlap; 2.6.2 has none, so there it is added).
REPLACES_UPSTREAM = frozenset({"_set_broadcast_overlap", "_set_all_gather_overlap_forward"})

# What the overlay relies on, as (class of OVERLAY_MODULES or USED_CLASSES,
# method or None for the whole class source, names that source must mention,
# why). An instance attribute is checked as ``self.<name>`` in ``__init__``.
CALL_PATHS = (
    ("DygraphShardingOptimizer", "step", ("_sharding_sync_parameters",),
     "step() must reach the sharding parameter broadcast the overlay launches"),
    ("DygraphShardingOptimizer", "minimize", ("_sharding_sync_parameters",),
     "minimize() must reach the sharding parameter broadcast"),
    ("DygraphShardingOptimizer", None,
     ("_rank2params", "_origin_parameter_list", "_sharding_world_size", "_hcg", "_inner_opt"),
     "the overlay reads these attributes to know each parameter's owner rank and group"),
    ("HybridParallelOptimizer", "step", ("_step",),
     "step() must go through _step, where the launch waits for the mp/pp parameter syncs"),
    ("HybridParallelOptimizer", "_step", ("_inner_opt.step",),
     "_step must run the sharding optimizer's step before its mp/pp syncs"),
    ("DygraphShardingOptimizer", "__init__", ("self.tensor_fusion", "self.comm_overlap", "self._rank2fused"),
     "_set_broadcast_overlap reads them to send slices of Paddle's fused buffers (tensor_fusion, comm_overlap)"),
    ("DygraphShardingOptimizerV2", "__init__",
     ("self._comm_buffer_list", "self._parameter_list", "self._hcg", "self._sharding_world_size", "self._inner_opt"),
     "the all-gather overlap reads them: the comm buffers it gathers, the parameters, the sharding group "
     "and degree, the inner optimizer (state_dict)"),
    ("FusedCommBuffer", "__init__", ("self._comm_group", "self._params", "self.param_storage"),
     "each V2 all-gather unit reads its comm buffer's group, parameters and parameter storage"),
)

# The overlay's removed depth setting: apply() warns when it is still set.
REMOVED_DEPTH_ENV = "PADDLE_OVERLAY_MAX_IN_FLIGHT"

_MISSING = object()
# (class, attribute name) -> the attribute before apply() (or _MISSING).
_saved = {}
_warned_versions = set()


class UnsupportedPaddleVersion(RuntimeError):
    """The installed Paddle is older than :data:`TESTED_PADDLE` or its version is unreadable."""


class PaddleInternalsChanged(UnsupportedPaddleVersion):
    """A class, method, call path, attribute or internal the overlay relies on moved, or a
    method it adds would shadow one the installed Paddle defines."""


def wraps_of(overlay_module, class_name):
    """The names ``class_name``'s overlay wraps: the module's ``OVERLAY_WRAPS``
    tuple, or its entry when it is a dict keyed by class name."""
    wraps = overlay_module.OVERLAY_WRAPS
    if isinstance(wraps, dict):
        return tuple(wraps.get(class_name, ()))
    return tuple(wraps)


def origin_name(name):
    """``step`` -> ``_origin_step``; ``_sharding_sync_parameters`` ->
    ``_origin_sharding_sync_parameters``."""
    return "_origin_" + name.lstrip("_")


def overlay_methods(overlay_cls):
    """The functions an overlay class defines, in source order."""
    return {
        name: value
        for name, value in vars(overlay_cls).items()
        if callable(value) and not (name.startswith("__") and name.endswith("__"))
    }


def _release(version):
    """``"3.1.0"`` -> ``((3, 1, 0), "")``; ``"3.0.0rc1"`` -> ``((3, 0, 0), "rc1")``;
    None when the version does not start with three numbers."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(.*)$", version.strip())
    if not match:
        return None
    return tuple(int(v) for v in match.groups()[:3]), match.group(4)


def _check_version(version):
    """Refuse (raise) or warn (once per version) for ``version``; silent when tested.

    Raises:
        UnsupportedPaddleVersion: older than the oldest tested release, or
            not of the form ``X.Y.Z``.
    """
    if version in TESTED_PADDLE:
        return
    parsed = _release(version)
    oldest = _release(TESTED_PADDLE[0])
    if parsed is None or parsed[0] < oldest[0]:
        raise UnsupportedPaddleVersion(
            f"paddle_overlay supports Paddle {SUPPORTED_PADDLE}; the installed "
            f"Paddle is {version}. Install one of the tested releases, e.g. "
            f"pip install paddlepaddle=={TESTED_PADDLE[-1]} (or paddlepaddle-gpu); "
            "nothing was patched."
        )
    if version not in _warned_versions:
        _warned_versions.add(version)
        warnings.warn(
            f"paddle_overlay was not tested with Paddle {version} (tested: "
            f"{', '.join(TESTED_PADDLE)}); its structure checks passed, so the "
            "overlay is applied. Run the collective tests with this Paddle "
            "(tools/run_collective_tests.sh) before relying on it.",
            UserWarning,
            stacklevel=3,
        )


def _source(obj):
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def _mentions(text, name):
    """Whether ``text`` mentions ``name`` as a whole word (``_step`` is not in ``_origin_step``)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def _check_call_paths(classes):
    """Problems (list of str) with :data:`CALL_PATHS` on ``classes`` (name -> class, or None for
    a class of :data:`USED_CLASSES` the installed Paddle lacks: :func:`_used_classes` names it)."""
    problems = []
    for class_name, method, needles, why in CALL_PATHS:
        cls = classes[class_name]
        if cls is None:
            continue
        owner = cls if method is None else vars(cls).get(method)
        where = class_name if method is None else f"{class_name}.{method}"
        if owner is None:
            problems.append(f"{where} is missing ({why})")
            continue
        text = _source(owner)
        if text is None:
            problems.append(f"the source of {where} cannot be read to check that {why}")
            continue
        missing = [n for n in needles if not _mentions(text, n)]
        if missing:
            problems.append(f"{where} no longer mentions {', '.join(missing)} ({why})")
    return problems


def _layer_source_mentions(name, needle):
    def check():
        import paddle

        text = _source(vars(paddle.nn.Layer)[name])
        if text is None:
            return "its source cannot be read"
        return None if needle in text else f"it no longer mentions {needle}"

    return check


def _static_call_defined():
    from .distributed.fleet.meta_optimizers.dygraph_optimizer import read_interception

    if "__call__" not in vars(read_interception.static_function_class()):
        return "StaticFunction defines no __call__ of its own"
    return None


def _sot_skip_list():
    from .distributed.fleet.meta_optimizers.dygraph_optimizer import read_interception

    skip_files = read_interception.sot_skip_files()
    if skip_files is None:
        return None  # no SOT in this Paddle: nothing to skip
    names = ("skip_file_names", "skip_file_name_re", "setup_skip_files")
    missing = [n for n in names if not hasattr(skip_files, n)]
    if missing or not isinstance(skip_files.skip_file_names, set):
        return f"skip_files lacks {missing or ['a set skip_file_names']}"
    return None


_V2_OVERLAP_FLAG = "self._all_gather_overlap_forward"
# The paddle.Tensor methods the units call on the storages they slice, gather into or share
# (V2's FusedCommBuffer.param_storage, V1's fused buffers, buckets).
_TENSOR_METHODS = ("_is_initialized", "_slice", "_numel", "data_ptr", "_share_buffer_to", "_copy_to", "get_tensor")


def _v2_class():
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        dygraph_sharding_optimizer,
    )

    return dygraph_sharding_optimizer.DygraphShardingOptimizerV2


def _fused_comm_buffer_class():
    from paddle.distributed.fleet.utils import tensor_fusion_helper

    return tensor_fusion_helper.FusedCommBuffer


def _function_tree(function):
    """The ``ast`` node of ``function``'s definition, or None when its source cannot be read."""
    text = _source(function)
    try:
        return None if text is None else ast.parse(textwrap.dedent(text)).body[0]
    except SyntaxError:
        return None


# Expressions whose calls may not run (or run later): not counted as calls a function makes.
_CONDITIONAL_EXPRS = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _calls_in(node):
    if isinstance(node, _CONDITIONAL_EXPRS):
        return []
    found = [node] if isinstance(node, ast.Call) else []
    for child in ast.iter_child_nodes(node):
        found += _calls_in(child)
    return found


def _calls_taken(tree, flag=None, value=False):
    """The calls (``ast.Call``) that the function ``tree`` makes whenever the expression ``flag``
    (e.g. ``"self._all_gather_overlap_forward"``) is ``value``: outside every condition, or in the
    branch of ``if flag:`` / ``if not flag:`` that ``value`` takes, through ``with``, ``for`` and
    ``try`` bodies. A call under any other ``if``, ``while``, ``except`` or conditional
    expression is not one: it may not run."""
    wanted = None if flag is None else ast.dump(ast.parse(flag, mode="eval").body)
    calls = []

    def branch(test):
        # the statements of if test: ... that run with flag == value, or None if it tests something else
        if ast.dump(test) == wanted:
            return value
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and ast.dump(test.operand) == wanted:
            return not value
        return None

    def visit(statements):
        for stmt in statements:
            if isinstance(stmt, ast.If):
                taken = branch(stmt.test)
                if taken is not None:
                    visit(stmt.body if taken else stmt.orelse)
            elif isinstance(stmt, ast.With):
                for item in stmt.items:
                    calls.extend(_calls_in(item.context_expr))
                visit(stmt.body)
            elif isinstance(stmt, ast.For):
                calls.extend(_calls_in(stmt.iter))
                visit(stmt.body)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)
                visit(stmt.finalbody)
            elif not isinstance(stmt, (ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                calls.extend(_calls_in(stmt))

    visit(tree.body)
    return calls


def _is_method_call(call, name):
    return isinstance(call.func, ast.Attribute) and call.func.attr == name


def _method_tree(cls, name):
    """(the ``ast`` node of ``cls``'s own method ``name``, None) or (None, the problem)."""
    function = vars(cls).get(name)
    if function is None:
        return None, f"{cls.__name__} defines no {name}"
    tree = _function_tree(function)
    if tree is None:
        return None, f"the source of {cls.__name__}.{name} cannot be read"
    return tree, None


def _v2_step_reaches_sync():
    tree, problem = _method_tree(_v2_class(), "step")
    if problem:
        return problem
    calls = _calls_taken(tree, _V2_OVERLAP_FLAG, False)
    if not any(ast.unparse(c.func) == "self._sharding_sync_parameters" for c in calls):
        return f"with {_V2_OVERLAP_FLAG} False it no longer always calls self._sharding_sync_parameters()"
    return None


def _v2_sync_blocks():
    tree, problem = _method_tree(_v2_class(), "_sharding_sync_parameters")
    if problem:
        return problem
    calls = _calls_taken(tree, _V2_OVERLAP_FLAG, False)
    if not any(_is_method_call(c, "sync_params") and not c.args and not c.keywords for c in calls):
        return f"with {_V2_OVERLAP_FLAG} False it no longer always calls a comm buffer's sync_params()"
    return None


def _fused_sync_gathers_shard_into_full():
    cls = _fused_comm_buffer_class()
    tree, problem = _method_tree(cls, "sync_params")
    if problem:
        return problem
    sync = inspect.signature(vars(cls)["sync_params"]).parameters.get("sync")
    if sync is not None and sync.default is not True:
        return f"its sync argument defaults to {sync.default!r}, not True (a blocking all-gather)"
    names = [
        (node.targets[0].id, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    ]
    # full = self.param_storage; shard = full._slice(begin, end): {shard: full}
    storages = {name for name, value in names if ast.unparse(value) == "self.param_storage"}
    slices = {
        name: value.func.value.id
        for name, value in names
        if isinstance(value, ast.Call)
        and _is_method_call(value, "_slice")
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id in storages
    }
    for call in _calls_taken(tree, "sync", True):
        gather = call.func.value if _is_method_call(call, "wait") else None
        if (
            isinstance(gather, ast.Call)
            and _is_method_call(gather, "all_gather")
            and isinstance(gather.func.value, ast.Attribute)
            and gather.func.value.attr == "process_group"
            and not gather.keywords
            and len(gather.args) == 2
            and all(isinstance(a, ast.Name) for a in gather.args)
            and slices.get(gather.args[0].id) == gather.args[1].id
        ):
            return None
    return (
        "it no longer always waits for group.process_group.all_gather(shard, full) with "
        "full = self.param_storage and shard = full._slice(begin, end)"
    )


def _storage_freeing_detected():
    v2, buffer = _v2_class(), _fused_comm_buffer_class()
    defined = [n for n, c in (("clear_param_storage", v2), ("_clear_param_storage", buffer)) if n in vars(c)]
    if not defined:
        return None  # as 2.6.2: nothing in Paddle frees a comm buffer's parameter storage
    for cls, name, needle in (
        (v2, "clear_param_storage", "_clear_param_storage"),
        (buffer, "_clear_param_storage", "param_storage._clear_to_zero_allocation"),
    ):
        function = vars(cls).get(name)
        if function is None:
            return f"{cls.__name__} defines no {name} (while {', '.join(defined)} exists)"
        text = _source(function)
        if text is None:
            return f"the source of {cls.__name__}.{name} cannot be read"
        if not _mentions(text, needle):
            return f"{cls.__name__}.{name} no longer mentions {needle}"
    return None


def _tensor_methods():
    import paddle

    missing = [n for n in _TENSOR_METHODS if not callable(getattr(paddle.Tensor, n, None))]
    return f"it lacks {', '.join(missing)}" if missing else None


# The Paddle internals checked by a function, for the read interception (read_interception.py)
# and V2's all-gather: (what, why, check() -> None or the problem).
REQUIRED_INTERNALS = (
    ("paddle.nn.Layer.__getattr__", "attribute reads of a parameter go through _parameters[name]",
     _layer_source_mentions("__getattr__", "_parameters[")),
    ("paddle.nn.Layer.named_parameters", "parameters()/named_parameters() iterate _parameters.items()",
     _layer_source_mentions("named_parameters", "_parameters.items()")),
    ("paddle.nn.Layer.parameters", "parameters() goes through named_parameters()",
     _layer_source_mentions("parameters", "named_parameters")),
    ("paddle.nn.Layer._state_dict_impl", "state_dict() iterates _parameters.items()",
     _layer_source_mentions("_state_dict_impl", "_parameters.items()")),
    ("paddle.jit StaticFunction.__call__", "every compiled program runs through it", _static_call_defined),
    ("paddle.jit.sot skip_files", "the owner's hooks must run untraced by SOT", _sot_skip_list),
    ("DygraphShardingOptimizerV2.step",
     f"the overlay keeps {_V2_OVERLAP_FLAG} False so that step() reaches the _sharding_sync_parameters "
     "it wraps to launch the all-gathers", _v2_step_reaches_sync),
    ("DygraphShardingOptimizerV2._sharding_sync_parameters",
     f"with {_V2_OVERLAP_FLAG} False it runs the blocking all-gather of each comm buffer, which the "
     "overlay's units replace (and which runs with the overlay off)", _v2_sync_blocks),
    ("FusedCommBuffer.sync_params",
     "comm_unit.PaddleComm.all_gather copies its group.process_group.all_gather(shard, full) on "
     "param_storage", _fused_sync_gathers_shard_into_full),
    ("FusedCommBuffer._clear_param_storage",
     "a V2 all-gather unit finds a parameter storage freed by clear_param_storage with "
     "param_storage._is_initialized()", _storage_freeing_detected),
    ("paddle.Tensor", "the units call these on the storages they gather, send or share", _tensor_methods),
)


def _check_internals():
    """Problems (list of str) with :data:`REQUIRED_INTERNALS`."""
    problems = []
    for what, why, check in REQUIRED_INTERNALS:
        try:
            problem = check()
        except (AttributeError, KeyError, ImportError) as error:
            problem = f"it is missing ({error!r})"
        if problem:
            problems.append(f"{what}: {problem} (relied on because {why})")
    return problems


def _check_methods(target, overlay_module, overlay_cls):
    """Problems (list of str) with wrapped and added methods of one class."""
    problems = []
    name = target.__name__
    wraps = wraps_of(overlay_module, name)
    for method in wraps:
        if method not in vars(target):
            problems.append(f"{name}.{method} (wrapped by the overlay) is not defined by the installed class")
        if hasattr(target, origin_name(method)):
            problems.append(f"{name}.{origin_name(method)} already exists; the overlay keeps {method}'s original there")
    for method in overlay_methods(overlay_cls):
        if method in wraps or method in REPLACES_UPSTREAM:
            continue
        if hasattr(target, method):
            problems.append(
                f"{name}.{method} is defined by the installed Paddle; the overlay's own {method} would shadow it"
            )
    return problems


def _paddle_class(module_name, class_name):
    """(``paddle.<module_name>.<class_name>``, None) or (None, why the installed Paddle has none)."""
    try:
        return getattr(importlib.import_module(f"paddle.{module_name}"), class_name), None
    except (ImportError, AttributeError) as error:
        return None, f"paddle.{module_name}.{class_name} is missing ({error!r})"


def _used_classes():
    """({name: class, or None where missing} of :data:`USED_CLASSES`, [problems] naming those missing)."""
    found, problems = {}, []
    for module_name, class_name in USED_CLASSES:
        found[class_name], problem = _paddle_class(module_name, class_name)
        if problem:
            problems.append(problem)
    return found, problems


def _targets(version):
    """[(paddle class, overlay module, overlay class)] for every overlay.

    Raises:
        PaddleInternalsChanged: a class of :data:`OVERLAY_MODULES` is missing (checked before any
            overlay module is imported: they import Paddle's classes).
    """
    found = [_paddle_class(module_name, class_name) for module_name, class_name in OVERLAY_MODULES]
    problems = [problem for _, problem in found if problem]
    if problems:
        _refuse(version, problems)
    targets = []
    for (module_name, class_name), (target, _) in zip(OVERLAY_MODULES, found):
        overlay_module = importlib.import_module(f"paddle_overlay.{module_name}")
        targets.append((target, overlay_module, getattr(overlay_module, class_name)))
    return targets


def _refuse(version, problems):
    raise PaddleInternalsChanged(
        f"paddle_overlay cannot patch Paddle {version}: "
        + "; ".join(problems)
        + f". Tested releases: {', '.join(TESTED_PADDLE)}. Nothing was patched."
    )


def _check_structure(version, targets):
    """Raise :class:`PaddleInternalsChanged` listing every problem found, if any."""
    classes, problems = _used_classes()
    classes.update({t.__name__: t for t, _, _ in targets})
    problems += _check_call_paths(classes)
    problems += _check_internals()
    for target, overlay_module, overlay_cls in targets:
        problems += _check_methods(target, overlay_module, overlay_cls)
    if problems:
        _refuse(version, problems)


def _announce(version):
    rank = os.environ.get("PADDLE_TRAINER_ID")
    where = f"rank {rank}" if rank is not None else f"process {os.getpid()}, no PADDLE_TRAINER_ID"
    sys.stderr.write(f"paddle_overlay: applied to Paddle {version} ({where})\n")
    sys.stderr.flush()


def apply(check=None):
    """Patch the installed Paddle with the overlay methods. Idempotent.

    Args:
        check (str | bool | None): the race checker (``race_check.py``):
            ``"report"`` or True counts reads of a parameter whose broadcast
            is pending and prints a per-rank summary at exit, ``"raise"``
            stops at the first one, False turns it off; None (default)
            takes the mode from ``PADDLE_OVERLAY_CHECK`` (off when unset).

    Prints ``paddle_overlay: applied to Paddle X (rank R)`` to stderr each time
    it patches (once per process unless :func:`remove` ran in between).

    Warns (``UserWarning``, once per version) when the installed Paddle is a
    release newer than the oldest in :data:`TESTED_PADDLE` but not in it.

    Raises:
        UnsupportedPaddleVersion: Paddle is older than the oldest tested
            release or its version is unreadable.
        PaddleInternalsChanged: a class, a wrapped method, a call path or
            attribute in :data:`CALL_PATHS` or an internal in
            :data:`REQUIRED_INTERNALS` moved, or an added method would shadow
            one of the installed Paddle; the message names each.
        ValueError: ``check`` or ``PADDLE_OVERLAY_CHECK`` is not a mode the
            race checker knows.
        All are raised before anything is patched.
    """
    from . import race_check

    if check is None:
        check_mode = race_check.mode_from_env()
    elif check is True:
        check_mode = "report"
    elif check is False:
        check_mode = None
    elif check in ("report", "raise"):
        check_mode = check
    else:
        raise ValueError(
            f"apply(check={check!r}): use 'report' (or True), 'raise', "
            "False, or None to read PADDLE_OVERLAY_CHECK."
        )
    if _saved:
        _set_check(race_check, check_mode, explicit=check is not None)
        return
    import paddle

    version = paddle.__version__
    _check_version(version)
    targets = _targets(version)
    _check_structure(version, targets)
    plan = []
    for target, overlay_module, overlay_cls in targets:
        for name in wraps_of(overlay_module, target.__name__):
            plan.append((target, origin_name(name), vars(target)[name]))
        plan.extend((target, name, fn) for name, fn in overlay_methods(overlay_cls).items())
    for target, name, value in plan:
        _saved.setdefault((target, name), vars(target).get(name, _MISSING))
        setattr(target, name, value)
    _announce(version)
    if os.environ.get(REMOVED_DEPTH_ENV, "").strip():
        warnings.warn(
            f"{REMOVED_DEPTH_ENV} is ignored: the launch depth was removed (every "
            "parameter sync now starts inside step() on every rank, so code one rank "
            "runs between steps cannot make the ranks' collectives differ); unset it.",
            UserWarning,
            stacklevel=2,
        )
    _set_check(race_check, check_mode, explicit=True)


def _set_check(race_check, mode, explicit):
    if mode is not None:
        race_check.enable(mode)
    elif explicit and race_check.is_enabled():
        race_check.disable()


def remove():
    """Restore the exact attributes that :func:`apply` replaced. Idempotent.

    Raises:
        RuntimeError: an optimizer still has broadcast overlap on (its hooks
            and pending tasks belong to the overlay); nothing is restored.
    """
    if _saved:
        from .distributed.fleet.meta_optimizers.dygraph_optimizer import (
            sync_registry,
        )

        gc.collect()  # overlaps of unreachable models/optimizers do not count
        still_open = sync_registry.open_owners()
        if still_open:
            raise RuntimeError(
                f"{len(still_open)} optimizer(s) still have the parameter sync "
                "overlap on; call optimizer._set_broadcast_overlap(False) (V2: "
                "_set_all_gather_overlap_forward(False)) on each "
                "before paddle_overlay.remove(). Nothing was removed."
            )
    while _saved:
        (target, name), original = _saved.popitem()
        if original is _MISSING:
            delattr(target, name)
        else:
            setattr(target, name, original)
    from . import race_check

    race_check.disable()


def _swap_for_benchmark(patched):
    """Benchmarks only: switch the classes between the overlay's methods
    (``patched=True``) and Paddle's own, without :func:`remove`'s refusal,
    so one process can interleave optimizers of both kinds step by step.
    Applies first if needed; the overlay's own objects stay alive."""
    if not _saved:
        apply()
    if not _patched_values:
        for key in _saved:
            _patched_values[key] = vars(key[0]).get(key[1], _MISSING)
    for (target, name), original in _saved.items():
        value = _patched_values[(target, name)] if patched else original
        if value is _MISSING:
            if name in vars(target):
                delattr(target, name)
        else:
            setattr(target, name, value)


_patched_values = {}


def is_applied():
    """bool: whether :func:`apply` is in effect."""
    return bool(_saved)
