"""Set the overlay methods onto the installed Paddle classes, and take them off.

Each overlay module under ``paddle_overlay/distributed/...`` mirrors the
Paddle module of the same dotted path and holds one class of the same name
as the Paddle class, plus ``OVERLAY_WRAPS``: the names that replace an
existing method, whose original is kept as ``_origin_<name>``.
"""

import gc
import importlib
import re

__all__ = [
    "OVERLAY_MODULES",
    "SUPPORTED_PADDLE",
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
    (f"{_DYGRAPH_OPT}.hybrid_parallel_optimizer", "HybridParallelOptimizer"),
)

SUPPORTED_PADDLE = "2.6.x and 3.x (>=2.6, <4)"

_MISSING = object()
# (class, attribute name) -> the attribute before apply() (or _MISSING).
_saved = {}


class UnsupportedPaddleVersion(RuntimeError):
    """The installed Paddle is outside :data:`SUPPORTED_PADDLE`."""


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


def _check_version(version):
    match = re.match(r"(\d+)\.(\d+)", version)
    major_minor = tuple(int(v) for v in match.groups()) if match else None
    if major_minor is None or not ((2, 6) <= major_minor < (4, 0)):
        raise UnsupportedPaddleVersion(
            f"paddle_overlay supports Paddle {SUPPORTED_PADDLE}; the installed "
            f"Paddle is {version}. Install a supported paddlepaddle or "
            "paddlepaddle-gpu; nothing was patched."
        )


def _targets():
    """[(paddle class, overlay module, overlay class)] for every overlay."""
    import paddle

    _check_version(paddle.__version__)
    found = []
    for module_name, class_name in OVERLAY_MODULES:
        target_module = importlib.import_module(f"paddle.{module_name}")
        overlay_module = importlib.import_module(f"paddle_overlay.{module_name}")
        found.append(
            (
                getattr(target_module, class_name),
                overlay_module,
                getattr(overlay_module, class_name),
            )
        )
    return found


def apply():
    """Patch the installed Paddle with the overlay methods. Idempotent.

    Raises:
        UnsupportedPaddleVersion: Paddle is outside :data:`SUPPORTED_PADDLE`
            (checked before anything is patched).
        AttributeError: a method listed in ``OVERLAY_WRAPS`` is missing from
            the installed class (nothing is patched).
    """
    if _saved:
        return
    targets = _targets()
    plan = []
    for target, overlay_module, overlay_cls in targets:
        methods = overlay_methods(overlay_cls)
        for name in overlay_module.OVERLAY_WRAPS:
            if name not in vars(target):
                raise AttributeError(
                    f"{target.__name__}.{name} is not in the installed Paddle; "
                    "cannot wrap it. Nothing was patched."
                )
            plan.append((target, origin_name(name), vars(target)[name]))
        plan.extend((target, name, fn) for name, fn in methods.items())
    for target, name, value in plan:
        _saved.setdefault((target, name), vars(target).get(name, _MISSING))
        setattr(target, name, value)


def remove():
    """Restore the exact attributes that :func:`apply` replaced. Idempotent.

    Raises:
        RuntimeError: an optimizer still has broadcast overlap on (its hooks
            and pending tasks belong to the overlay); nothing is restored.
    """
    if _saved:
        from .distributed.fleet.meta_optimizers.dygraph_optimizer import (
            broadcast_overlap,
        )

        gc.collect()  # overlaps of unreachable models/optimizers do not count
        still_open = broadcast_overlap.open_overlaps()
        if still_open:
            raise RuntimeError(
                f"{len(still_open)} optimizer(s) still have broadcast overlap "
                "on; call optimizer._set_broadcast_overlap(False) on each "
                "before paddle_overlay.remove(). Nothing was removed."
            )
    while _saved:
        (target, name), original = _saved.popitem()
        if original is _MISSING:
            delattr(target, name)
        else:
            setattr(target, name, original)


def is_applied():
    """bool: whether :func:`apply` is in effect."""
    return bool(_saved)
