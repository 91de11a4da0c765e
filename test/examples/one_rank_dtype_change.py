# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: after two steps with the parameter sync overlap on (V1 buckets), rank 1 alone
shares float64 memory into a float32 parameter (a loader handing the wrong dtype), between
backward and step(), leaving the gradients as they are. Its step() must refuse with the overlay's
ValueError before anything is sent; rank 0 goes on into the step's collectives, and the launch must
end with rank 1's error named (Paddle's launcher stops rank 0), never hang.
test_one_rank_change_launch.py runs it."""

import time

import paddle
import paddle_overlay
from paddle.distributed import fleet

paddle_overlay.apply()

strategy = fleet.DistributedStrategy()
strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1,
                           "sharding_degree": paddle.distributed.get_world_size()}
fleet.init(is_collective=True, strategy=strategy)
rank = paddle.distributed.get_rank()
paddle.seed(7)
net = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 4))
model = fleet.distributed_model(net)
opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-3, parameters=model.parameters()))
opt._set_broadcast_overlap(True, layers=model)
for step in range(4):
    loss = model(paddle.rand([4, 8])).mean()
    loss.backward()
    if step == 2 and rank == 1:
        weight = net[0].weight
        paddle.zeros(weight.shape, dtype="float64")._share_buffer_to(weight)
        assert weight.dtype == paddle.float64, weight.dtype
        print(f"ONE-RANK-CHANGE rank 1 changed {net[0].weight.name} at {time.time():.3f}", flush=True)
    opt.step()
    opt.clear_grad()
    print(f"ONE-RANK-CHANGE rank {rank} finished step {step}", flush=True)
