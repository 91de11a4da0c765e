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
"""Per-rank script: the broadcast buckets of sharding stage 1
(``broadcast_buckets.py``), on 2 ranks.

The parameters of a small model move into contiguous buckets (objects and
values kept), each bucket is broadcast from its owner rank, and every rank
then holds the owners' values; memory replaced under a parameter is put
back into its slot; a dtype change is refused; the cap's flag. Run with
``python -m paddle.distributed.launch --nproc_per_node 2``; a failed check
raises, so the rank exits non-zero.
"""

import os

import numpy as np
from sharding_param_sync_utils import (
    init_sharding_group,
    make_ranks_differ,
    rank_values,
)

import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    broadcast_buckets,
)

CAP_BYTES = 1024  # several buckets for the model below


def model_and_params():
    """A model whose parameters differ on each rank."""
    paddle.seed(2026)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    make_ranks_differ(model.parameters())
    return model, model.parameters()


def plan(params, group, cap=CAP_BYTES):
    src_ranks = [group.ranks[i % 2] for i in range(len(params))]
    order = list(reversed(range(len(params))))  # not the parameter order
    specs = broadcast_buckets.plan_buckets(order, params, src_ranks, cap)
    storage = broadcast_buckets.BucketStorage(specs, params, src_ranks, order)
    return src_ranks, specs, storage


def case_buckets_hold_the_owners_values(group):
    model, params = model_and_params()
    values = [rank_values(p, group) for p in params]  # before: every rank's
    src_ranks, specs, storage = plan(params, group)
    assert 1 < len(specs) < len(params), specs
    ids = [id(p) for p in model.parameters()]
    storage.materialize()
    assert [id(p) for p in model.parameters()] == ids
    rank = group.ranks.index(dist.get_rank())
    for p, v in zip(params, values):
        np.testing.assert_array_equal(p.numpy(), v[rank])  # moved, unchanged
    for spec, buffer in zip(storage.specs, storage.buffers):
        begin, end = buffer.data_ptr(), broadcast_buckets.end_ptr(buffer)
        for i in spec.indices:
            assert begin <= params[i].data_ptr() < end, params[i].name
        dist.broadcast(buffer, src=spec.src, group=group)
    for p, v, src in zip(params, values, src_ranks):
        np.testing.assert_array_equal(p.numpy(), v[group.ranks.index(src)])


def case_replaced_memory_is_rebound_and_a_dtype_change_refused(group):
    model, params = model_and_params()
    _, _, storage = plan(params, group)
    storage.materialize()
    assert storage.rebind("_set_broadcast_overlap") == []
    paddle.full(params[0].shape, 2.0)._share_buffer_to(params[0])
    assert storage.rebind("_set_broadcast_overlap") == [0]
    np.testing.assert_array_equal(
        params[0].numpy(), np.full(params[0].shape, 2.0)
    )
    bucket = storage.buffers[storage.bucket_of(0)]
    assert (
        bucket.data_ptr()
        <= params[0].data_ptr()
        < (broadcast_buckets.end_ptr(bucket))
    )
    model[2].to(dtype="float64")  # a dtype change under the plan
    try:
        storage.rebind("_set_broadcast_overlap")
    except ValueError as e:
        assert any(p.name in str(e) for p in model[2].parameters()), e
    else:
        raise AssertionError("a dtype change was not refused")


def case_the_cap_reads_its_flag():
    flag = "FLAGS_sharding_overlap_bucket_size_mb"
    saved = os.environ.pop(flag, None)
    try:
        assert broadcast_buckets.check_bucket_size_mb(None) == 256 << 20
        os.environ[flag] = "0"
        assert broadcast_buckets.check_bucket_size_mb(None) == 0
        assert broadcast_buckets.check_bucket_size_mb(1) == 1 << 20
    finally:
        os.environ.pop(flag, None)
        if saved is not None:
            os.environ[flag] = saved


if __name__ == "__main__":
    group = init_sharding_group()
    case_buckets_hold_the_owners_values(group)
    case_replaced_memory_is_rebound_and_a_dtype_change_refused(group)
    case_the_cap_reads_its_flag()
    print("3 passed", flush=True)
