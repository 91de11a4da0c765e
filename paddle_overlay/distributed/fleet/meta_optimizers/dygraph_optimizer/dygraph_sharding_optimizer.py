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
"""New and changed methods of Paddle's sharding stage 1 optimizers:
``DygraphShardingOptimizer`` (V1) and ``DygraphShardingOptimizerV2``
(``sharding_configs.split_param``).

This module is the single source of these methods: ``paddle_overlay.apply()``
sets them onto the installed class, and ``tools/make_patch.py`` writes the
same source text into Paddle's ``dygraph_sharding_optimizer.py``:

* a method named in ``OVERLAY_WRAPS`` is an edit of Paddle's method of that
  name: its body (docstring aside) is the statements the patch puts at the
  top of Paddle's body; a ``...`` statement stands for Paddle's body, and
  what follows it goes at the end. ``apply()`` runs the same statements
  around Paddle's original, kept as ``_origin_<name without leading
  underscores>``; the signature must be Paddle's.
* ``EDITED_WHERE_DEFINED``: edits of methods only some releases define
  (3.x's V2 ``rebuild``, ``clear_param_storage``): where Paddle's class
  lacks one, neither ``apply()`` nor the patch adds it.
* every other method replaces Paddle's of the same name or is new.
* ``SUPERSEDED``: upstream's own overlap code these methods replace, which
  the patch deletes (the overlay leaves it in place, unreachable);
  ``SUPERSEDED_ELSEWHERE``: code of other Paddle modules only that overlap
  used.
"""

import weakref

from paddle.distributed import fleet

from . import unit_plan
from .broadcast_buckets import check_bucket_size_mb
from .param_sync_overlap import (
    ParamSyncOverlap,
    check_overlap_flag,
    launch_param_sync,
    prepare_param_sync_update,
    switch_owner,
    wait_param_sync,
)

# Per class: Paddle's methods these edit (see the module docstring).
OVERLAY_WRAPS = {
    "DygraphShardingOptimizer": (
        "_sharding_sync_parameters",
        "minimize",
        "step",
    ),
    "DygraphShardingOptimizerV2": (
        "_sharding_sync_parameters",
        "clear_param_storage",
        "rebuild",
        "step",
    ),
}
# Per class: the edits of OVERLAY_WRAPS applied only where the release
# defines the method (Paddle 2.6's V2 has neither).
EDITED_WHERE_DEFINED = {
    "DygraphShardingOptimizerV2": ("clear_param_storage", "rebuild"),
}

# Upstream's overlap (Paddle 3.x; 2.6 has none), deleted by the patch: per
# class and method, the statements to delete, each by the start of its
# source text (whitespace collapsed; it must match one statement), or "*"
# for the whole method. A deleted ``if`` keeps the branch it takes with
# upstream's overlap off: ``else`` (``if flag:``) or its body (``if not``).
SUPERSEDED = {
    "DygraphShardingOptimizer": {
        "__init__": (
            "self._broadcast_overlap = False",
            "self._forward_pre_hook_remove_helper = []",
            "try: # The fp32 params such as layer_norm_0.w_0",
        ),
        "_forward_pre_hook_function": "*",
        "_sharding_sync_parameters": ("if self._broadcast_overlap:",),
        "step": ("if self._broadcast_overlap:",),
    },
    "DygraphShardingOptimizerV2": {
        "__init__": (
            "self._all_gather_overlap_forward = False",
            "self._forward_pre_hook_remove_helper = []",
            "self.has_register_forward_hook = False",
        ),
        "rebuild": (
            "self._all_gather_overlap_forward = False",
            "self._forward_pre_hook_remove_helper = []",
            "self.has_register_forward_hook = False",
        ),
        "_forward_pre_hook_function": "*",
        "_try_start_bucket_param_sync": "*",
        "make_forward_hook": "*",
        "_register_pre_forward_hooks": "*",
        "_sharding_sync_parameters": ("if self._all_gather_overlap_forward:",),
        "step": (
            "if self._all_gather_overlap_forward:",
            "if not self._all_gather_overlap_forward:",
        ),
    },
}
# Per Paddle module: the code only upstream's V2 overlap used (the
# asynchronous all-gather of FusedCommBuffer.sync_params and the status it
# kept), deleted with it; a statement entry may be (prefix, branch kept),
# "parameter: NAME" deletes a parameter of the method.
SUPERSEDED_ELSEWHERE = {
    "distributed.fleet.utils.tensor_fusion_helper": {
        "FusedCommBuffer": {
            "Status": "*",
            "__init__": (
                "self.status = FusedCommBuffer.Status.READY",
                "self.sync_param_task = None",
            ),
            "sync_params": (
                ("if sync:", "body"),
                "parameter: sync",
                "parameter: param2task",
            ),
        },
    },
}


class DygraphShardingOptimizer:
    """Overlay of ``DygraphShardingOptimizer``: holds only the new and
    changed methods; never instantiated."""

    def _set_broadcast_overlap(
        self,
        broadcast_overlap,
        layers=None,
        strict=None,
        bucket_size_mb=None,
    ):
        """Overlap the post-update parameter broadcast with the next forward.

        When on, every ``step()``/``minimize()`` starts the owner ranks'
        broadcasts of the updated parameters with ``sync_op=False``, all of
        them, on every rank, in the order forward first uses them (agreed
        across the sharding group at the first update); each layer's forward
        pre-hook waits for its own broadcasts only, and the optimizer's
        ``state_dict()`` waits first. No hook issues a collective, so code
        that one rank alone runs between steps cannot make the ranks'
        collectives differ. The entry point PR #63945 added; NOTE [parameter
        sync overlap] in ``param_sync_overlap.py`` has the rules.
        Every read of a parameter waits for its own broadcast too, without
        issuing a collective (no synchronize before ``paddle.save``).

        Args:
            broadcast_overlap (bool): on, or off (waits for pending
                broadcasts and removes every hook).
            layers (paddle.nn.Layer): the model that runs the forward;
                required to turn it on.
            strict (bool | None): the first hooked layer of each forward
                waits for everything (no overlap); for models that read a
                tensor reference to a parameter kept across ``step()``.
                None: ``FLAGS_sharding_overlap_strict`` (default off).
            bucket_size_mb (int | float | None): MB (2**20 bytes) per window
                of the agreed order; at the first update the parameters move
                into one contiguous buffer per (window, owner rank, dtype),
                one broadcast each (with ``tensor_fusion``/``comm_overlap``:
                slices of Paddle's fused buffers). 0: one per parameter.
                None: ``FLAGS_sharding_overlap_bucket_size_mb`` (default
                256).

        Raises:
            TypeError: a flag is not a bool, ``layers`` is not a
                ``paddle.nn.Layer``.
            ValueError: ``layers`` is None or owns none of the parameters;
                sharding degree 1; ``pp_configs.sharding_comm_overlap`` with
                ``tensor_fusion`` or ``comm_overlap`` (Paddle's own limit).
            TypeError / ValueError: ``bucket_size_mb`` is not a number, or
                out of range.
            Nothing changes when an error is raised.
        """
        method = "_set_broadcast_overlap"
        check_overlap_flag(broadcast_overlap, method, "broadcast_overlap")
        if not broadcast_overlap:
            return switch_owner(self, None)
        cap_bytes = check_bucket_size_mb(bucket_size_mb)
        if self._sharding_world_size < 2:
            raise ValueError(
                "broadcast overlap needs sharding stage 1 with sharding_degree "
                f">= 2; this optimizer's sharding degree is "
                f"{self._sharding_world_size}. Set strategy.hybrid_configs"
                "['sharding_degree'] to the number of sharding ranks."
            )
        strategy = fleet.fleet._user_defined_strategy
        pp = None if strategy is None else strategy.hybrid_configs["pp_configs"]
        fused_by_paddle = self.tensor_fusion or self.comm_overlap
        if fused_by_paddle and pp is not None and pp.sharding_comm_overlap:
            # Paddle refuses it at the build; the strategy changed since
            raise ValueError(
                "Paddle cannot combine pp_configs.sharding_comm_overlap with "
                "sharding_configs.tensor_fusion or comm_overlap (its own "
                "check when it builds the optimizer); set "
                "pp_configs.sharding_comm_overlap = False, or tensor_fusion "
                "and comm_overlap to False."
            )
        group = self._hcg.get_sharding_parallel_group()
        rank_of = {id(p): r for r, ps in self._rank2params.items() for p in ps}
        params = list(self._origin_parameter_list)
        src_ranks = [group.ranks[rank_of[id(p)]] for p in params]
        planner = unit_plan.PerParameter(src_ranks)
        if cap_bytes and fused_by_paddle and self._rank2fused:
            # Paddle's per-rank fused buffers: send slices, never move them
            fused = [
                t for r in sorted(self._rank2fused) for t in self._rank2fused[r]
            ]
            planner = unit_plan.FusedSlices(src_ranks, cap_bytes, fused)
        elif cap_bytes:
            planner = unit_plan.Buckets(src_ranks, cap_bytes)
        new = ParamSyncOverlap(params, group, layers, planner, method, strict)
        switch_owner(self, new)

    def _sharding_sync_parameters(self):
        """With overlap on: launch the broadcasts, not the blocking sync."""
        if launch_param_sync(self):
            return

    def step(self):
        """Before the update: wait for pending broadcasts and check the
        parameters against the plan."""
        prepare_param_sync_update(self)

    def minimize(
        self, loss, startup_program=None, parameters=None, no_grad_set=None
    ):
        """Before the update: wait for pending broadcasts and check the
        parameters against the plan."""
        prepare_param_sync_update(self)

    def state_dict(self):
        """The inner optimizer's ``state_dict()``, after pending broadcasts."""
        wait_param_sync(self)
        return self._inner_opt.state_dict()


class DygraphShardingOptimizerV2:
    """Overlay of ``DygraphShardingOptimizerV2`` (sharding stage 1 with
    ``split_param``): holds only the new and changed methods; never
    instantiated."""

    def _set_all_gather_overlap_forward(
        self,
        all_gather_overlap_forward,
        layers=None,
        strict=None,
    ):
        """Overlap the post-update parameter all-gather with the next forward.

        After each ``step()`` V2 all-gathers every comm buffer
        (``FusedCommBuffer``, ``comm_buffer_size_MB`` each; Paddle's layout
        is kept). When on, ``step()`` starts every gather asynchronously, on
        every rank, in the order forward first uses the buffers (agreed
        across the group at the first update); each layer's pre-hook waits
        for its buffers and every read of a parameter for its own (no
        synchronize before ``paddle.save``). No hook or read issues a
        collective, so a forward or a read on one rank alone cannot hang
        the next barrier. The entry point PaddleFormers'
        ``--stage1_allgather_overlap`` calls; NOTE [parameter sync overlap]
        in ``param_sync_overlap.py`` has the rules.

        Args:
            all_gather_overlap_forward (bool): on, or off (waits for pending
                gathers and removes every hook).
            layers (paddle.nn.Layer): the model that runs the forward.
            strict (bool): as in V1's ``_set_broadcast_overlap``.

        Raises:
            TypeError: a flag is not a bool, ``layers`` is not a Layer.
            ValueError: ``layers`` is None or owns none of the parameters;
                sharding degree 1; a setting that moves gradient or
                optimizer-state storage is on (named: ``release_gradients``,
                ``free_grads_in_comm``, ``enable_fuse_optimizer_states``).
            Nothing changes when an error is raised.
        """
        method = "_set_all_gather_overlap_forward"
        flag = all_gather_overlap_forward
        check_overlap_flag(flag, method, "all_gather_overlap_forward")
        if not flag:
            return switch_owner(self, None)
        if self._sharding_world_size < 2:
            raise ValueError(
                "the all-gather overlap needs sharding stage 1 with "
                "sharding_degree >= 2; this optimizer's sharding degree is "
                f"{self._sharding_world_size}."
            )
        self._check_all_gather_overlap_settings()
        # read at the first step (V2 may rebuild the list); a weak
        # reference, so the owner never keeps the optimizer alive
        optimizer = weakref.ref(self)
        planner = unit_plan.CommBuffers(lambda: optimizer()._comm_buffer_list)
        new = ParamSyncOverlap(
            list(self._parameter_list),
            self._hcg.get_sharding_parallel_group(),
            layers,
            planner,
            method,
            strict,
        )
        switch_owner(self, new)

    def _set_broadcast_overlap(self, broadcast_overlap, layers=None, **kwargs):
        """V2 syncs by all-gather: ``ValueError`` naming the V2 method."""
        check_overlap_flag(
            broadcast_overlap, "_set_broadcast_overlap", "broadcast_overlap"
        )
        if broadcast_overlap:
            raise ValueError(
                "this optimizer is sharding stage 1 V2 "
                "(sharding_configs.split_param = True), which syncs "
                "parameters by all-gather: use optimizer."
                "_set_all_gather_overlap_forward(True, model) (PaddleFormers: "
                "--stage1_allgather_overlap true), or set split_param = "
                "False for V1's broadcast overlap."
            )

    def _sharding_sync_parameters(self):
        """With overlap on: launch the all-gathers, not the blocking sync."""
        if launch_param_sync(self):
            return

    def step(self):
        """Before the update: wait for pending all-gathers."""
        prepare_param_sync_update(self)

    def rebuild(self):
        """Before V2 builds new comm buffers from the parameters: wait for
        pending all-gathers (the next launch plans the new buffers)."""
        wait_param_sync(self)

    def clear_param_storage(self, color):
        """Before V2 frees the parameter storage of ``color``'s comm
        buffers: wait for pending all-gathers."""
        wait_param_sync(self)

    def state_dict(self):
        """The inner optimizer's ``state_dict()``, after pending gathers."""
        wait_param_sync(self)
        return self._inner_opt.state_dict()

    def _check_all_gather_overlap_settings(self):
        # settings that move gradient or optimizer-state storage: untested
        strategy = fleet.fleet._user_defined_strategy
        if strategy is None:
            return
        for section, name, what in (
            ("sharding_configs", "release_gradients", "frees gradients"),
            ("pp_configs", "release_gradients", "frees gradients"),
            ("sharding_configs", "free_grads_in_comm", "frees gradients"),
            (
                "sharding_configs",
                "enable_fuse_optimizer_states",
                "fuses optimizer states",
            ),
        ):
            if getattr(strategy.hybrid_configs[section], name, 0):
                raise ValueError(
                    f"the all-gather overlap is not tested with {section}."
                    f"{name} (it {what}); set it to its default or leave the "
                    "all-gather overlap off."
                )
