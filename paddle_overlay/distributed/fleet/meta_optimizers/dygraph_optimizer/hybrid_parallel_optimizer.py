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
(see ``dygraph_sharding_optimizer.py`` in this folder for the convention:
``_step``'s body is the statements put around Paddle's, at ``...``).
"""

from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    hybrid_parallel_optimizer as paddle_hybrid_parallel_optimizer,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)

from .param_sync_overlap import (
    check_overlap_flag,
    plan_hybrid_synced_first,
    wait_before_hybrid_sync,
)

# Paddle's methods these edit.
OVERLAY_WRAPS = ("_insert_sync", "_step")

# Paddle 3.x syncs the pipeline's shared weights after the update too
# (pp_configs.sync_param); 2.6 has no such setting. A release flag:
# tools/make_patch.py keeps the branch of the release a patch is made for.
_HAS_PP_SYNC = hasattr(
    paddle_hybrid_parallel_optimizer.HybridParallelOptimizer,
    "_get_pp_sync_params",
)


class HybridParallelOptimizer:
    """Overlay of ``HybridParallelOptimizer``: holds only the new and
    changed methods; never instantiated."""

    def _set_broadcast_overlap(
        self,
        broadcast_overlap,
        layers=None,
        strict=None,
        bucket_size_mb=None,
    ):
        """``DygraphShardingOptimizer._set_broadcast_overlap`` of the wrapped
        V1 optimizer (same arguments, behaviour, errors); turning it on around
        another optimizer raises ``ValueError`` naming what to set."""
        self._set_overlap_of_inner(
            DygraphShardingOptimizer,
            "_set_broadcast_overlap",
            broadcast_overlap,
            layers,
            strict=strict,
            bucket_size_mb=bucket_size_mb,
        )

    def _set_all_gather_overlap_forward(
        self,
        all_gather_overlap_forward,
        layers=None,
        strict=None,
    ):
        """Turn the all-gather overlap of the wrapped V2 sharding optimizer
        on or off (PaddleFormers calls this with two arguments for
        ``--stage1_allgather_overlap``): arguments, behaviour and errors are
        those of ``DygraphShardingOptimizerV2._set_all_gather_overlap_forward``;
        turning it on around another optimizer raises ``ValueError`` naming
        what to set (V1: ``_set_broadcast_overlap``)."""
        self._set_overlap_of_inner(
            DygraphShardingOptimizerV2,
            "_set_all_gather_overlap_forward",
            all_gather_overlap_forward,
            layers,
            strict=strict,
        )

    def _set_overlap_of_inner(self, kind, method, flag, layers, **kwargs):
        # the flag's argument name is the method's, as in the inner one
        check_overlap_flag(flag, method, method[len("_set_") :])
        inner = self._inner_opt
        if isinstance(inner, kind):
            getattr(inner, method)(flag, layers, **kwargs)
        elif flag:
            hint = "."
            if isinstance(inner, DygraphShardingOptimizer):
                hint = ": use _set_broadcast_overlap(True, layers=model)."
            v2 = kind is DygraphShardingOptimizerV2
            raise ValueError(
                f"{method} needs sharding stage 1 {'V2' if v2 else 'V1'}: "
                "set strategy.hybrid_configs['sharding_degree'] >= 2 and "
                f"sharding_configs.split_param = {v2}; the wrapped "
                f"optimizer is a {type(inner).__name__}{hint}"
            )

    def _step(self, parameters_list):
        # the sharding parameter sync starts inside the inner step(), where
        # Paddle's blocking sync was; the parameters the mp/pp syncs after it
        # read go into its first units (_insert_sync waits for them)
        plan_hybrid_synced_first(
            self, lambda: self._params_synced_after_update(parameters_list)
        )

    def _insert_sync(self, sync_var, src, mp_group, sync_mode):
        # every mp/pp sync of a parameter after the update: its sharding sync
        # first, so it sends and receives the blocking order's values
        wait_before_hybrid_sync(sync_var)

    def _params_synced_after_update(self, parameters_list):
        """list[paddle.Tensor]: the parameters of ``parameters_list`` that
        ``_step`` syncs across the model-parallel group
        (``mp_configs.sync_param``) or, on Paddle 3.x, a pipeline shared
        weight's group (``pp_configs.sync_param``) after the inner update,
        chosen by Paddle's own filters."""
        strategy = fleet.fleet._user_defined_strategy
        configs = strategy.hybrid_configs
        synced = []
        if (
            self._hcg.get_model_parallel_world_size() > 1
            and configs["mp_configs"].sync_param
        ):
            if _HAS_PP_SYNC:
                mp_filter = self._mp_filter_fn
            else:
                mp_filter = self._filter_fn
            synced += [p for p in parameters_list if mp_filter(p, strategy)]
        if _HAS_PP_SYNC:
            if (
                self._hcg.get_pipe_parallel_world_size() > 1
                and configs["pp_configs"].sync_param
            ):
                synced += [p for p in parameters_list if self._pp_filter_fn(p)]
        return synced
