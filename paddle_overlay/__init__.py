"""paddle_overlay: sharding stage 1 parameter broadcast overlapped with forward.

Usage::

    import paddle_overlay
    paddle_overlay.apply()                  # patch the installed Paddle
    optimizer = fleet.distributed_optimizer(optimizer)
    optimizer._set_broadcast_overlap(True, layers=model)

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

__all__ = [
    "SUPPORTED_PADDLE",
    "TESTED_PADDLE",
    "PaddleInternalsChanged",
    "UnsupportedPaddleVersion",
    "apply",
    "is_applied",
    "remove",
    "__version__",
]
