"""The version gate: what :func:`paddle_overlay.apply` checks of the installed Paddle's structure
before it patches anything (``_patching._check_structure`` collects the problems and refuses with
``PaddleInternalsChanged``).

* :data:`CALL_PATHS`: call paths and attributes the overlay relies on, as words its source must
  mention (V1's, V2's and ``HybridParallelOptimizer``'s; ``FusedCommBuffer``'s fields).
* :data:`REQUIRED_INTERNALS`: internals checked by a function (the read interception's
  ``Layer.__getattr__`` reading ``_parameters``, ``named_parameters``/``state_dict`` iterating it,
  SOT's skip files; V2's ``step`` and ``_sharding_sync_parameters``
  reaching the blocking all-gather with ``_all_gather_overlap_forward`` False,
  ``FusedCommBuffer.sync_params``'s ``process_group.all_gather(shard, full)``, how its storage is
  freed, the ``paddle.Tensor`` methods the units call).
* :data:`USED_CLASSES`: Paddle classes relied on but not patched.

Every check reads the installed source; none has a silent default.
"""

import ast
import importlib
import inspect
import re
import textwrap

__all__ = ["CALL_PATHS", "REQUIRED_INTERNALS", "USED_CLASSES", "check_call_paths", "check_internals", "used_classes"]

USED_CLASSES = (("distributed.fleet.utils.tensor_fusion_helper", "FusedCommBuffer"),)

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
     "step() must go through _step, whose first statement plans what its mp/pp syncs read into the first units"),
    ("HybridParallelOptimizer", "_step", ("_inner_opt.step",),
     "_step must run the sharding optimizer's step before its mp/pp syncs"),
    ("HybridParallelOptimizer", None, ("_insert_sync", "_hcg"),
     "every mp/pp parameter sync after the update goes through _insert_sync, which waits for the parameter's "
     "sharding sync first"),
    ("DygraphShardingOptimizer", "__init__", ("self.tensor_fusion", "self.comm_overlap", "self._rank2fused"),
     "_set_broadcast_overlap reads them to send slices of Paddle's fused buffers (tensor_fusion, comm_overlap)"),
    ("DygraphShardingOptimizerV2", "__init__",
     ("self._comm_buffer_list", "self._parameter_list", "self._hcg", "self._sharding_world_size", "self._inner_opt"),
     "the all-gather overlap reads them: the comm buffers it gathers, the parameters, the sharding group "
     "and degree, the inner optimizer (state_dict)"),
    ("FusedCommBuffer", "__init__", ("self._comm_group", "self._params", "self.param_storage"),
     "each V2 all-gather unit reads its comm buffer's group, parameters and parameter storage"),
)

def paddle_class(module_name, class_name):
    """(``paddle.<module_name>.<class_name>``, None) or (None, why the installed Paddle has none)."""
    try:
        return getattr(importlib.import_module(f"paddle.{module_name}"), class_name), None
    except (ImportError, AttributeError) as error:
        return None, f"paddle.{module_name}.{class_name} is missing ({error!r})"


def used_classes():
    """({name: class, or None where missing} of :data:`USED_CLASSES`, [problems] naming those missing)."""
    found, problems = {}, []
    for module_name, class_name in USED_CLASSES:
        found[class_name], problem = paddle_class(module_name, class_name)
        if problem:
            problems.append(problem)
    return found, problems


def _source(obj):
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def _mentions(text, name):
    """Whether ``text`` mentions ``name`` as a whole word (``_step`` is not in ``_origin_step``)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def check_call_paths(classes):
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


def sot_skip_files():
    """Paddle's SOT skip-list module, or None where this Paddle has no SOT."""
    try:
        from paddle.jit.sot.opcode_translator import skip_files
    except ImportError:
        return None
    return skip_files


def _sot_skip_list():
    skip_files = sot_skip_files()
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


def _hybrid_sync_filters():
    """The filters ``HybridParallelOptimizer._params_synced_after_update`` calls: Paddle 3.x's
    ``_mp_filter_fn`` and ``_pp_filter_fn`` (with ``_get_pp_sync_params``), 2.6's ``_filter_fn``."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import hybrid_parallel_optimizer

    cls = hybrid_parallel_optimizer.HybridParallelOptimizer
    names = ("_mp_filter_fn", "_pp_filter_fn") if "_get_pp_sync_params" in vars(cls) else ("_filter_fn",)
    missing = [n for n in names if not callable(vars(cls).get(n))]
    return f"it defines no {', '.join(missing)}" if missing else None


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
    ("paddle.jit.sot skip_files", "the overlay's hooks must run untraced by SOT", _sot_skip_list),
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
     "the V2 plan finds a parameter storage freed by clear_param_storage with "
     "param_storage._is_initialized()", _storage_freeing_detected),
    ("HybridParallelOptimizer", "the parameters its mp/pp syncs read after the update are chosen by Paddle's "
     "own filters and planned into the first units", _hybrid_sync_filters),
    ("paddle.Tensor", "the units call these on the storages they gather, send or share", _tensor_methods),
)


def check_internals():
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
