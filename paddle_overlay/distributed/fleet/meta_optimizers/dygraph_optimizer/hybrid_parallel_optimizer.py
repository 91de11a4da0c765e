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
"""New and changed methods of Paddle's ``HybridParallelOptimizer``.

Single source for ``paddle_overlay.apply()`` and ``tools/make_patch.py``
(see ``dygraph_sharding_optimizer.py`` in this folder for the convention).
"""

from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)

from .broadcast_buckets import DEFAULT_BUCKET_SIZE_MB
from .broadcast_overlap import (
    check_broadcast_overlap_flag,
    get_broadcast_overlap,
)

# Methods that replace an existing one and call it as _origin_<name>.
OVERLAY_WRAPS = ("_step",)


class HybridParallelOptimizer:
    """Overlay of ``HybridParallelOptimizer``: holds only the new and
    changed methods; never instantiated."""

    def _set_broadcast_overlap(
        self,
        broadcast_overlap,
        layers=None,
        strict=False,
        bucket_size_mb=DEFAULT_BUCKET_SIZE_MB,
        max_in_flight=None,
    ):
        """Turn broadcast overlap on or off for the wrapped sharding optimizer.

        The object ``fleet.distributed_optimizer`` returns delegates to its
        ``DygraphShardingOptimizer``; arguments, behaviour and errors are
        those of ``DygraphShardingOptimizer._set_broadcast_overlap``.

        Raises:
            TypeError: ``broadcast_overlap`` is not a bool (and see above).
            ValueError: turning overlap on while the wrapped optimizer is not
                sharding stage 1 V1 (``sharding_degree`` 1, or
                ``sharding_configs.split_param = True`` which selects V2).
        """
        check_broadcast_overlap_flag(broadcast_overlap)
        inner = self._inner_opt
        if not isinstance(inner, DygraphShardingOptimizer):
            if broadcast_overlap and isinstance(
                inner, DygraphShardingOptimizerV2
            ):
                inner._set_broadcast_overlap(True)  # names the V2 method
            if broadcast_overlap:
                raise ValueError(
                    "broadcast overlap needs sharding stage 1 (V1): set "
                    "strategy.hybrid_configs['sharding_degree'] >= 2 and keep "
                    "sharding_configs.split_param = False; the wrapped "
                    f"optimizer is a {type(inner).__name__}."
                )
            self._broadcast_overlap = False
            return
        inner._set_broadcast_overlap(
            broadcast_overlap,
            layers,
            strict=strict,
            bucket_size_mb=bucket_size_mb,
            max_in_flight=max_in_flight,
        )
        self._broadcast_overlap = broadcast_overlap
        self._layers = layers if broadcast_overlap else None

    def _set_all_gather_overlap_forward(
        self,
        all_gather_overlap_forward,
        layers=None,
        strict=False,
        max_in_flight=None,
    ):
        """Turn the all-gather overlap of sharding stage 1 V2 on or off.

        Delegates to ``DygraphShardingOptimizerV2._set_all_gather_overlap_forward``
        (arguments, behaviour and errors are its own); PaddleFormers calls
        this with two arguments for ``--stage1_allgather_overlap``.

        Raises:
            TypeError: ``all_gather_overlap_forward`` is not a bool.
            ValueError: turning it on while the wrapped optimizer is not V2
                (``sharding_configs.split_param = False`` selects V1, whose
                overlap is ``_set_broadcast_overlap``).
        """
        check_broadcast_overlap_flag(all_gather_overlap_forward)
        inner = self._inner_opt
        if not isinstance(inner, DygraphShardingOptimizerV2):
            if all_gather_overlap_forward:
                raise ValueError(
                    "the all-gather overlap needs sharding stage 1 V2 "
                    "(sharding_configs.split_param = True, sharding_degree >= "
                    f"2); the wrapped optimizer is a {type(inner).__name__}"
                    + (
                        ": use _set_broadcast_overlap(True, layers=model)."
                        if isinstance(inner, DygraphShardingOptimizer)
                        else "."
                    )
                )
            self._all_gather_overlap_forward = False
            return
        inner._set_all_gather_overlap_forward(
            all_gather_overlap_forward,
            layers,
            strict=strict,
            max_in_flight=max_in_flight,
        )
        self._all_gather_overlap_forward = all_gather_overlap_forward
        self._layers = layers if all_gather_overlap_forward else None

    def _step(self, parameters_list):
        """Paddle's ``_step``, with the sharding broadcast launched only after
        its model/pipeline-parallel parameter syncs (see
        ``StageOneBroadcastOverlap.deferred_launch``)."""
        overlap = get_broadcast_overlap(self)
        if overlap is None:
            return self._origin_step(parameters_list)
        with overlap.deferred_launch():
            return self._origin_step(parameters_list)
