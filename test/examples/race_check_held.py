# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: a model that keeps a reference to a weight across step() and reads
it in forward (the one read no hook can intercept). Run with PADDLE_OVERLAY_CHECK set;
the race checker's summary at exit must name the parameter, the layer and the path."""

import paddle
import paddle_overlay
from paddle.distributed import fleet

paddle_overlay.apply()  # mode from PADDLE_OVERLAY_CHECK


class HeldModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(8, 8)
        self.held = [self.proj.weight]  # a plain list: not a parameter path

    def forward(self, x):
        return paddle.matmul(x, self.held[0]) + self.proj(x)


strategy = fleet.DistributedStrategy()
strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1,
                           "sharding_degree": paddle.distributed.get_world_size()}
fleet.init(is_collective=True, strategy=strategy)
paddle.seed(7)
net = HeldModel()
print(f"HELD-PARAM {net.proj.weight.name} {net.full_name()}", flush=True)
model = fleet.distributed_model(net)
opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-3, parameters=model.parameters()))
opt._set_broadcast_overlap(True, layers=model)
for step in range(3):
    loss = model(paddle.rand([4, 8])).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
