# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank training script that never imports or applies paddle_overlay itself.

Trains a small model with sharding stage 1 and broadcast overlap for 3 steps, then
prints one line ``STARTUP-CHECK {json}`` with what this rank ran: whether
paddle_overlay was loaded before this script looked (only the start-up hook can
have loaded it), whether it is applied, and which module the optimizer's
``_set_broadcast_overlap`` came from.
"""

import json
import sys

import paddle
from paddle.distributed import fleet

loaded_by_startup = "paddle_overlay" in sys.modules  # read before anything below imports it

world = paddle.distributed.get_world_size()
strategy = fleet.DistributedStrategy()
strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": world}
fleet.init(is_collective=True, strategy=strategy)
paddle.seed(2026)
model = fleet.distributed_model(paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 4)))
optimizer = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-2, parameters=model.parameters()))
set_overlap = getattr(type(optimizer._inner_opt), "_set_broadcast_overlap", None)
if set_overlap is not None:
    optimizer._set_broadcast_overlap(True, layers=model)
for step in range(3):
    x = paddle.rand([4, 8])
    loss = model(x).mean()
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
state = model.state_dict()  # waits for pending broadcasts under the overlay

import paddle_overlay  # noqa: E402  (only to read is_applied(); never apply()d here)

print(
    "STARTUP-CHECK "
    + json.dumps(
        {
            "rank": paddle.distributed.get_rank(),
            "loaded_by_startup": loaded_by_startup,
            "is_applied": paddle_overlay.is_applied(),
            "set_broadcast_overlap_from": getattr(set_overlap, "__module__", None),
            "loss": float(loss),
        }
    ),
    flush=True,
)
