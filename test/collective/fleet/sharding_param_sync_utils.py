# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""What the per-rank scripts of the parameter sync tests share: the
sharding group of 2 ranks, parameters that differ on each rank, and every
rank's value of a tensor.
"""

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet


def init_sharding_group():
    """fleet on 2 ranks, both sharding (stage 1); the sharding group."""
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {
        "dp_degree": 1,
        "mp_degree": 1,
        "pp_degree": 1,
        "sharding_degree": 2,
    }
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group().get_sharding_parallel_group()


def make_ranks_differ(params):
    """Add 10 x rank to every parameter: each rank's values differ."""
    with paddle.no_grad():
        for p in params:
            p.set_value(p + 10.0 * dist.get_rank())


def rank_values(tensor, group):
    """Every rank's value of ``tensor`` (numpy arrays, by rank in ``group``)."""
    out = []
    dist.all_gather(out, tensor, group=group)
    return [t.numpy() for t in out]
