# examples/readme_train.py (the README's snippet; test/examples checks they match and runs it)
# run: python -m paddle.distributed.launch --nproc_per_node 2 examples/readme_train.py
import paddle, paddle_overlay
from paddle.distributed import fleet

paddle_overlay.apply()          # patch the installed Paddle (or PADDLE_OVERLAY=1, see below)


class MyModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 4)

    def forward(self, x):
        return self.l2(paddle.nn.functional.relu(self.l1(x)))


loader = [paddle.rand([8, 16]) for _ in range(5)]   # your DataLoader
strategy = fleet.DistributedStrategy()
# dp * mp * pp * sharding degrees must equal the number of ranks: here every rank shards
strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1,
                           "sharding_degree": paddle.distributed.get_world_size()}
fleet.init(is_collective=True, strategy=strategy)
net = MyModel()
model = fleet.distributed_model(net)
optimizer = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-4, parameters=model.parameters()))
optimizer._set_broadcast_overlap(True, layers=model)   # every read of a parameter waits for its broadcast
for batch in loader:
    loss = model(batch).mean(); loss.backward(); optimizer.step(); optimizer.clear_grad()
if paddle.distributed.get_rank() == 0:   # stage 1: every rank holds every parameter after step()
    # save `net`, not the fleet wrapper `model` (its keys start with "_layers."); no synchronize needed
    paddle.save(net.state_dict(), "model.pdparams")
# resume: net = MyModel(); net.set_state_dict(paddle.load("model.pdparams")), before fleet.distributed_model
