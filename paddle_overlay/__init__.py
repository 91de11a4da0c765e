"""paddle_overlay: sharding stage 1's post-update parameter sync (V1's
broadcasts, V2's all-gathers) overlapped with the next forward.

Usage::

    import paddle_overlay
    paddle_overlay.apply()                  # patch the installed Paddle
    optimizer = fleet.distributed_optimizer(optimizer)
    optimizer._set_broadcast_overlap(True, layers=model)  # V1
    # V2 (split_param): optimizer._set_all_gather_overlap_forward(True, model)
    ...
    print(paddle_overlay.overlap_report(optimizer))  # the overlap you got

The overlay methods live under ``paddle_overlay/distributed/fleet/...`` in
Paddle's own layout; ``tools/make_patch.py`` turns the same source into git
patches for a Paddle checkout.
"""

from ._patching import (
    SUPPORTED_PADDLE,
    TESTED_PADDLE,
    PaddleInternalsChanged,
    UnsupportedPaddleVersion,
    apply,
    is_applied,
    remove,
)

__version__ = "0.1.0"


def overlap_report(optimizer):
    """How much of ``optimizer``'s parameter sync a forward pre-hook waited
    first (the overlap), and who waited for the rest: see
    :func:`paddle_overlay.overlap_monitor.overlap_report`, which it calls
    (imported here, so that importing the package imports no Paddle)."""
    from .overlap_monitor import overlap_report as report

    return report(optimizer)


__all__ = [
    "SUPPORTED_PADDLE",
    "TESTED_PADDLE",
    "PaddleInternalsChanged",
    "UnsupportedPaddleVersion",
    "apply",
    "is_applied",
    "overlap_report",
    "remove",
    "__version__",
]
