"""Set the overlay methods onto the installed Paddle classes, and take them off.

Each overlay module under ``paddle_overlay/distributed/...`` and
``paddle_overlay/jit/...`` mirrors the Paddle module of the same dotted path
and holds one class of the same name as the Paddle class, plus
``OVERLAY_WRAPS``: Paddle's methods it edits. Such a method's body is the
statements that ``tools/make_patch.py`` puts at the top of Paddle's method
(a ``...`` statement stands for Paddle's body; what follows goes at its end):
here the same statements run around Paddle's original, kept as
``_origin_<name>`` (:func:`edit_wrapper`). The modules of :data:`NEW_MODULES`
(new files in the patch) are also importable under Paddle's name while
applied, so code written for a patched Paddle runs on the overlay as is.

Before anything is patched, :func:`apply` checks the installed Paddle:

* its version against :data:`TESTED_PADDLE` (the releases the collective
  tests run on). A tested release applies silently; an untested release not
  older than the oldest tested one applies after one ``UserWarning``; an
  older or unreadable version is refused (:class:`UnsupportedPaddleVersion`).
* its structure (:class:`PaddleInternalsChanged` names what moved): every
  class of :data:`OVERLAY_MODULES` and ``_version_gate.USED_CLASSES``
  exists; every wrapped method exists on the class itself; the call paths,
  attributes and internals of ``_version_gate`` are in place; and no method
  the overlay *adds* (anything not wrapped and not in
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

from ._version_gate import CALL_PATHS, REQUIRED_INTERNALS, USED_CLASSES, check_call_paths, check_internals
from ._version_gate import paddle_class, sot_skip_files, used_classes

__all__ = [
    "CALL_PATHS",
    "NEW_MODULES",
    "OVERLAY_MODULES",
    "PaddleInternalsChanged",
    "REPLACES_UPSTREAM",
    "REQUIRED_INTERNALS",
    "SUPPORTED_PADDLE",
    "TESTED_PADDLE",
    "USED_CLASSES",
    "UnsupportedPaddleVersion",
    "apply",
    "edit_wrapper",
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
    ("jit.dy2static.program_translator", "StaticFunction"),
)
# Overlay modules a patched Paddle has as new files, under ``paddle.<name>``:
# registered there by apply() (unless Paddle has a module of that name).
NEW_MODULES = (
    f"{_DYGRAPH_OPT}.broadcast_buckets",
    f"{_DYGRAPH_OPT}.comm_unit",
    f"{_DYGRAPH_OPT}.param_sync_overlap",
    f"{_DYGRAPH_OPT}.read_interception",
    f"{_DYGRAPH_OPT}.sync_registry",
    f"{_DYGRAPH_OPT}.sync_stats",
    f"{_DYGRAPH_OPT}.unit_plan",
    f"{_DYGRAPH_OPT}.wait_map",
    "jit.dy2static.pre_call_hooks",
)
# Paddle classes the overlay relies on without patching them, as (module, class).

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
# The one table of release pins: what pip must install next to paddlepaddle(-gpu)==VERSION for
# Paddle to import and build its DistributedStrategy (README "Supported Paddle releases" shows it;
# the test venvs install it). protobuf 6+ removed FieldDescriptor.label, which 3.0.0-3.3.0 need.
PADDLE_PINS = {version: ("protobuf<6",) for version in TESTED_PADDLE}
PADDLE_PINS.update({"2.6.2": ("protobuf==3.20.3", "numpy<2"), "3.3.1": ()})
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

# The overlay's removed depth setting: apply() warns when it is still set.
REMOVED_DEPTH_ENV = "PADDLE_OVERLAY_MAX_IN_FLIGHT"

_MISSING = object()
# (class, attribute name) -> the attribute before apply() (or _MISSING).
_saved = {}
# what else apply() did, undone by remove() (last first)
_undo = []
_warned_versions = set()


class UnsupportedPaddleVersion(RuntimeError):
    """The installed Paddle is older than :data:`TESTED_PADDLE` or its version is unreadable."""


class PaddleInternalsChanged(UnsupportedPaddleVersion):
    """A class, method, call path, attribute or internal the overlay relies on moved, or a
    method it adds would shadow one the installed Paddle defines."""


def wraps_of(overlay_module, class_name, target=None):
    """The names ``class_name``'s overlay wraps: the module's ``OVERLAY_WRAPS``
    tuple, or its entry when it is a dict keyed by class name; with
    ``target`` (the installed class), without the names of the module's
    ``EDITED_WHERE_DEFINED`` entry that ``target`` does not define."""
    wraps = overlay_module.OVERLAY_WRAPS
    if isinstance(wraps, dict):
        wraps = wraps.get(class_name, ())
    optional = getattr(overlay_module, "EDITED_WHERE_DEFINED", {}).get(class_name, ())
    if target is None:
        return tuple(wraps)
    return tuple(w for w in wraps if w not in optional or w in vars(target))


def _skipped_edits(target, overlay_module):
    """The edits of ``EDITED_WHERE_DEFINED`` that ``target`` does not define."""
    wraps = wraps_of(overlay_module, target.__name__)
    return set(wraps) - set(wraps_of(overlay_module, target.__name__, target))


def origin_name(name):
    """``step`` -> ``_origin_step``; ``_sharding_sync_parameters`` ->
    ``_origin_sharding_sync_parameters``."""
    return "_origin_" + name.lstrip("_")


def overlay_methods(overlay_cls):
    """The functions an overlay class defines, in source order (an edited
    dunder such as ``StaticFunction.__call__`` included)."""
    return {name: value for name, value in vars(overlay_cls).items() if inspect.isfunction(value)}


def _edit_parts(fn):
    """(def node, prologue, the ``...`` statement or None, epilogue) of an
    overlay method of ``OVERLAY_WRAPS``: its body without the docstring,
    split at a top-level ``...`` (none: all prologue); line numbers of its
    file."""
    lines, first = inspect.getsourcelines(fn)
    node = ast.parse(textwrap.dedent("".join(lines))).body[0]
    ast.increment_lineno(node, first - 1)
    body = list(node.body)
    if body and _is_constant(body[0], str):
        body = body[1:]
    marks = [i for i, st in enumerate(body) if _is_constant(st, type(Ellipsis))]
    if len(marks) > 1:
        raise ValueError(f"{fn.__qualname__}: more than one '...' (Paddle's body goes in one place)")
    if not marks:
        return node, body, None, []
    return node, body[: marks[0]], body[marks[0]], body[marks[0] + 1 :]


def _is_constant(statement, kind):
    value = getattr(statement, "value", None) if isinstance(statement, ast.Expr) else None
    return isinstance(value, ast.Constant) and isinstance(value.value, kind)


def _call_of(args):
    """The argument list that passes ``args`` (ast.arguments) on unchanged."""
    pos = [a.arg for a in args.posonlyargs + args.args][1:]  # without self
    parts = pos + ([f"*{args.vararg.arg}"] if args.vararg else [])
    parts += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    parts += [f"**{args.kwarg.arg}"] if args.kwarg else []
    return ", ".join(parts)


def _located(text, where):
    body = ast.parse(text).body
    for statement in body:
        for sub in ast.walk(statement):
            ast.copy_location(sub, where)
    return body


def edit_wrapper(overlay_module, fn, origin):
    """The function ``apply()`` sets for the edit ``fn`` of ``overlay_module``:
    ``fn``'s statements before ``...``, then Paddle's method (the attribute
    ``origin`` of self), then the statements after it, returning what
    Paddle's method returned. The statements are compiled from ``fn``'s own
    source (line numbers kept) with the overlay module's globals, so a
    ``return`` among them returns from the method, as in the patch."""
    node, prologue, mark, epilogue = _edit_parts(fn)
    where = mark or node.body[-1]
    self_name = (node.args.posonlyargs + node.args.args)[0].arg
    call = f"{self_name}.{origin}({_call_of(node.args)})"
    if epilogue:
        body = prologue + _located(f"_result = {call}", where) + epilogue + _located("return _result", where)
    else:
        body = prologue + _located(f"return {call}", where)
    node.body, node.decorator_list, node.returns = body, [], None
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    namespace = {}
    exec(compile(module, inspect.getsourcefile(fn), "exec"), vars(overlay_module), namespace)
    made = namespace[node.name]
    made.__qualname__ = fn.__qualname__
    made.__doc__ = fn.__doc__
    return made


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


# The folders of the overlay's copies of Paddle modules: SOT runs Paddle's
# own files untraced (its skip list), and these run where Paddle's would.
_MIRROR_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name) + os.sep for name in ("distributed", "jit")
)


def _skip_mirrors_in_sot():
    """Add :data:`_MIRROR_DIRS` to SOT's skip list; returns restore() (None: nothing added)."""
    skip_files = sot_skip_files()
    if skip_files is None:
        return None
    names = skip_files.skip_file_names
    added = [d for d in _MIRROR_DIRS if not any(d.startswith(n) for n in names)]
    if not added:
        return None
    old_re = skip_files.skip_file_name_re
    names.update(added)
    skip_files.skip_file_name_re = re.compile(f"^({'|'.join(map(re.escape, sorted(names)))})")
    skip_files.setup_skip_files()

    def restore():
        names.difference_update(added)
        skip_files.skip_file_name_re = old_re
        skip_files.setup_skip_files()

    return restore


def _check_methods(target, overlay_module, overlay_cls):
    """Problems (list of str) with wrapped and added methods of one class."""
    problems = []
    name = target.__name__
    wraps = wraps_of(overlay_module, name, target)
    for method in wraps:
        if method not in vars(target):
            problems.append(f"{name}.{method} (wrapped by the overlay) is not defined by the installed class")
            continue
        ours, theirs = _parameters(vars(overlay_cls)[method]), _parameters(vars(target)[method])
        if theirs is not None and ours != theirs:
            problems.append(f"{name}.{method} takes {theirs}, the overlay's edit of it {ours}")
        if hasattr(target, origin_name(method)):
            problems.append(f"{name}.{origin_name(method)} already exists; the overlay keeps {method}'s original there")
    for method in overlay_methods(overlay_cls):
        if method in wraps or method in REPLACES_UPSTREAM or method in _skipped_edits(target, overlay_module):
            continue
        if hasattr(target, method):
            problems.append(
                f"{name}.{method} is defined by the installed Paddle; the overlay's own {method} would shadow it"
            )
    return problems


def _parameters(fn):
    """[(name, kind)] of ``fn``'s parameters (None: not introspectable)."""
    try:
        signature = inspect.signature(inspect.unwrap(fn))
    except (TypeError, ValueError):
        return None
    return [(p.name, p.kind.name) for p in signature.parameters.values()]


def _targets(version):
    """[(paddle class, overlay module, overlay class)] for every overlay.

    Raises:
        PaddleInternalsChanged: a class of :data:`OVERLAY_MODULES` is missing (checked before any
            overlay module is imported: they import Paddle's classes).
    """
    found = [paddle_class(module_name, class_name) for module_name, class_name in OVERLAY_MODULES]
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
    classes, problems = used_classes()
    classes.update({t.__name__: t for t, _, _ in targets})
    problems += check_call_paths(classes)
    problems += check_internals()
    for target, overlay_module, overlay_cls in targets:
        problems += _check_methods(target, overlay_module, overlay_cls)
    if problems:
        _refuse(version, problems)


def _announce(version, overlap):
    rank = os.environ.get("PADDLE_TRAINER_ID")
    where = f"rank {rank}" if rank is not None else f"process {os.getpid()}, no PADDLE_TRAINER_ID"
    said = f"paddle_overlay: applied to Paddle {version} ({where})"
    if overlap:
        said += (
            "; PADDLE_OVERLAY=overlap: the parameter-sync overlap of every sharding stage 1 optimizer is "
            "turned on with its wrapped model (one line per optimizer)"
        )
    sys.stderr.write(said + "\n")
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

    With ``PADDLE_OVERLAY=overlap`` in the environment when it patches, it
    also installs ``auto_overlap.py``: every sharding stage 1 optimizer gets
    its parameter-sync overlap with the wrapped model that holds its
    parameters, without a call of the switch (one line per optimizer on
    stderr; the line above then says so).

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
            race checker knows, or ``PADDLE_OVERLAY`` is set to a value
            ``_startup.mode`` refuses.
        All are raised before anything is patched.
    """
    # imported here: _startup and auto_overlap are on floor 4 (docs/architecture.md)
    from . import _startup, auto_overlap, race_check

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
    overlap = _startup.mode(os.environ.get(_startup.ENV_VAR)) == "overlap"
    import paddle

    version = paddle.__version__
    _check_version(version)
    targets = _targets(version)
    _check_structure(version, targets)
    plan = []
    for target, overlay_module, overlay_cls in targets:
        wraps = wraps_of(overlay_module, target.__name__, target)
        skipped = _skipped_edits(target, overlay_module)
        for name, fn in overlay_methods(overlay_cls).items():
            if name in skipped:
                continue
            if name in wraps:
                plan.append((target, origin_name(name), vars(target)[name]))
                fn = edit_wrapper(overlay_module, fn, origin_name(name))
            plan.append((target, name, fn))
    if overlap:  # PADDLE_OVERLAY=overlap: wraps what the plan sets, so it comes after
        planned = {(target, name): value for target, name, value in plan}
        auto_plan, problems = auto_overlap.patches(lambda c, n: planned.get((c, n), vars(c).get(n)))
        if problems:
            _refuse(version, problems)
        plan += auto_plan
        _undo.append(auto_overlap.forget)
    for target, name, value in plan:
        _saved.setdefault((target, name), vars(target).get(name, _MISSING))
        setattr(target, name, value)
    _register_new_modules()
    from . import overlap_monitor

    _undo.append(overlap_monitor.install())
    restore_sot = _skip_mirrors_in_sot()
    if restore_sot is not None:
        _undo.append(restore_sot)
    _announce(version, overlap)
    if os.environ.get(REMOVED_DEPTH_ENV, "").strip():
        warnings.warn(
            f"{REMOVED_DEPTH_ENV} is ignored: the launch depth was removed (every "
            "parameter sync now starts inside step() on every rank, so code one rank "
            "runs between steps cannot make the ranks' collectives differ); unset it.",
            UserWarning,
            stacklevel=2,
        )
    _set_check(race_check, check_mode, explicit=True)


def _register_new_modules():
    """Make each module of :data:`NEW_MODULES` importable as ``paddle.<name>``
    (where the installed Paddle has none of that name)."""
    for name in NEW_MODULES:
        full = f"paddle.{name}"
        parent_name, _, leaf = full.rpartition(".")
        parent = importlib.import_module(parent_name)
        if full in sys.modules or hasattr(parent, leaf):
            continue
        module = importlib.import_module(f"paddle_overlay.{name}")
        sys.modules[full] = module
        setattr(parent, leaf, module)

        def unregister(full=full, parent=parent, leaf=leaf, module=module):
            if sys.modules.get(full) is module:
                del sys.modules[full]
            if getattr(parent, leaf, None) is module:
                delattr(parent, leaf)

        _undo.append(unregister)


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
    while _undo:
        _undo.pop()()
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
