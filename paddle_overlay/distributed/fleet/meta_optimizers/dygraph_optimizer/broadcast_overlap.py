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

"""Old names of ``param_sync_overlap`` (the owner served V2's all-gather
too, so "broadcast" was the wrong word), kept for one release: importing
them works as before; new code uses the new names. Overlay only: the Paddle
patch carries ``param_sync_overlap`` alone.
"""

from .param_sync_overlap import (  # noqa: F401
    ParamSyncOverlap as StageOneBroadcastOverlap,
    ParamSyncState as BroadcastOverlapState,
    get_param_sync_overlap as get_broadcast_overlap,
)

__all__ = []
