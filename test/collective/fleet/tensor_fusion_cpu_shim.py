# Copyright (c) 2026 paddle_overlay authors. All Rights Reserved.
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
"""TEST-ONLY CPU shim for Paddle's tensor fusion (never for training).

``sharding_configs.tensor_fusion`` builds fused parameter buffers with
``tensor_fusion_helper`` and ``group_sharded_storage.ParamStorage``, which
assume a GPU/XPU/NPU: the alignment table has no CPU entry, the device type
is asserted, ``cvt_to_device`` refuses the CPU, ``device_guard`` switches
to ``gpu:N`` (Paddle 2.6), and ``add_rank_params`` copies through
``param.cpu()`` then clears the parameter (on the CPU that is the same
memory). Inside :func:`cpu_tensor_fusion` these five are
patched so the same buffers are built on the CPU, with the GPU alignment
(256 bytes); everything is restored on exit. Paddle 3.3.1 and 2.6.2.
"""

import contextlib

from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage as gss
from paddle.distributed.fleet.utils import tensor_fusion_helper as tfh


@contextlib.contextmanager
def cpu_tensor_fusion():
    saved_alignment = dict(tfh.alignment)
    saved_type = getattr(tfh, "__current_device_type__", None)
    saved_cvt = gss.cvt_to_device
    saved_guard = gss.device_guard
    saved_add = gss.ParamStorage.add_rank_params

    def add_rank_params(self, params, param2align, convert_gpu=True):
        return saved_add(self, params, param2align, convert_gpu=False)

    tfh.alignment["cpu"] = tfh.alignment["gpu"]
    if hasattr(tfh, "__current_device_type__"):
        tfh.__current_device_type__ = "cpu"
    gss.cvt_to_device = lambda x, dev_id, blocking=True: x
    gss.device_guard = lambda dev_id=0, device="cpu": contextlib.nullcontext()
    gss.ParamStorage.add_rank_params = add_rank_params
    try:
        yield
    finally:
        tfh.alignment.clear()
        tfh.alignment.update(saved_alignment)
        if hasattr(tfh, "__current_device_type__"):
            tfh.__current_device_type__ = saved_type
        gss.cvt_to_device = saved_cvt
        gss.device_guard = saved_guard
        gss.ParamStorage.add_rank_params = saved_add
