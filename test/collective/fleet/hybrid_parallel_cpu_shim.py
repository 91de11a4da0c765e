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
"""Test-only shim: run Paddle's hybrid-parallel layers on CPU ranks (gloo).

The one place where the collective tests work around what Paddle's CPU
build lacks for pipeline- and model-parallel training. :func:`install` does
nothing when Paddle is compiled with CUDA and the ranks use GPUs; on CPU it
replaces, for the test process only:

1. ``paddle.distributed.new_group`` -> the same call between two barriers
   of the global group. Why: ``fleet.init`` creates every sub-group
   (pipe, data, model, sharding, check) back to back; on gloo, concurrent
   full-mesh connections of different groups on 4 ranks fail at random
   (``pair.cc TIMEOUT`` or ``Connection refused``). One group at a time
   always connects.
2. ``ParallelEnv._device_id`` -> a class default of 0. Why:
   ``PipelineLayer.__init__`` reads ``ParallelEnv().device_id``, which is
   only set when a GPU/XPU device is selected; on CPU the attribute is
   missing and the constructor raises ``AttributeError``.
3. The ``c_identity`` forward of model-parallel layers
   (``paddle.distributed.fleet.layers.mpu.mp_ops._c_identity``) -> an
   identity with the same backward (all-reduce of the gradient over the
   model-parallel group). Why: the CPU build has no ``c_identity`` kernel.

Pipeline p2p on gloo also needs ``pp_configs.use_batch_p2p_comm = False``
(gloo has no send/recv "on calc stream"); that is a strategy setting, set
by the tests' ``DistributedStrategy``, not patched here.
"""

import functools

import paddle

_INSTALLED = []


def _on_cpu():
    return not paddle.is_compiled_with_cuda() or paddle.get_device() == "cpu"


def _serialize_group_creation():
    original = paddle.distributed.new_group

    @functools.wraps(original)
    def new_group_one_at_a_time(*args, **kwargs):
        paddle.distributed.barrier()
        group = original(*args, **kwargs)
        paddle.distributed.barrier()
        return group

    paddle.distributed.new_group = new_group_one_at_a_time


def _default_device_id():
    from paddle.distributed import parallel

    if not hasattr(parallel.ParallelEnv(), "_device_id"):
        parallel.ParallelEnv._device_id = 0


def _identity_for_c_identity():
    from paddle.distributed.fleet.layers.mpu import mp_ops

    original = mp_ops._c_identity

    class _IdentityAllReduceGrad(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, tensor, group):
            ctx.group = group
            return paddle.assign(tensor)

        @staticmethod
        def backward(ctx, grad):
            grad = paddle.assign(grad)
            paddle.distributed.all_reduce(grad, group=ctx.group)
            return grad

    @functools.wraps(original)
    def c_identity(tensor, group=None, *args, **kwargs):
        if group is None or group.nranks <= 1:
            return original(tensor, group, *args, **kwargs)
        return _IdentityAllReduceGrad.apply(tensor, group)

    mp_ops._c_identity = c_identity


def install():
    """Apply the shims above once per process; a no-op on GPU ranks.
    Call before ``fleet.init``."""
    if _INSTALLED or not _on_cpu():
        return
    _INSTALLED.append(True)
    _serialize_group_creation()
    _default_device_id()
    _identity_for_c_identity()
