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
sets them onto the installed class, and ``tools/make_patch.py`` splices the
same source text into Paddle's ``dygraph_sharding_optimizer.py``.

Each name in ``OVERLAY_WRAPS`` (per class) replaces a method Paddle already
has; the original stays reachable as ``_origin_<name without leading underscores>``
(set by ``apply()``, renamed in the patch) and runs unchanged whenever
broadcast overlap is off. Every other method here is new.
"""

from paddle.distributed import fleet

from .broadcast_buckets import DEFAULT_BUCKET_SIZE_MB
from .broadcast_overlap import (
    StageOneBroadcastOverlap,
    check_broadcast_overlap_flag,
    check_max_in_flight,
    get_broadcast_overlap,
    launch_or_sync,
    set_broadcast_overlap_owner,
    sweep_abandoned,
    wait_then,
)

# Per class: methods that replace an existing one and call it as
# _origin_<name>.
OVERLAY_WRAPS = {
    "DygraphShardingOptimizer": (
        "_sharding_sync_parameters",
        "minimize",
        "step",
    ),
    "DygraphShardingOptimizerV2": ("_sharding_sync_parameters", "step"),
}


class DygraphShardingOptimizer:
    """Overlay of ``DygraphShardingOptimizer``: holds only the new and
    changed methods; never instantiated."""

    def _set_broadcast_overlap(
        self,
        broadcast_overlap,
        layers=None,
        strict=False,
        bucket_size_mb=DEFAULT_BUCKET_SIZE_MB,
        max_in_flight=None,
    ):
        """Overlap the post-update parameter broadcast with the next forward.

        When on, after each ``step()``/``minimize()`` every owner rank
        broadcasts its updated parameters with ``sync_op=False`` in the order
        forward first uses them (recorded before the first update and agreed
        across the sharding group), and a forward pre-hook on each layer that
        owns parameters waits only for that layer's own tasks. Every Python
        read of a parameter through its layer (attribute access,
        ``parameters()``, ``state_dict``/``set_state_dict``, ``to``) and
        the optimizer's ``state_dict`` wait first, so no manual
        ``paddle.device.synchronize()`` is needed before ``paddle.save``.
        Same entry point as upstream Paddle PR #63945; see NOTE [broadcast
        overlap] in ``broadcast_overlap.py`` for what differs.

        Args:
            broadcast_overlap (bool): True to turn overlap on, False to turn
                it off (waits for pending tasks and removes every hook).
            layers (paddle.nn.Layer): the model that runs the forward;
                required when turning overlap on.
            strict (bool): the first hooked layer to run in each forward
                waits for every pending task (safe, no overlap); only needed
                when the model keeps tensor references to parameters across
                ``step()`` and reads them in forward (every read through a
                layer waits anyway). Default False.
            bucket_size_mb (int | float): broadcast buckets: at the first
                update the parameters move into contiguous buffers, one per
                (window of this many MB in the agreed order, owner rank,
                dtype), and each launch issues one broadcast per bucket
                (NOTE [broadcast buckets] in ``broadcast_buckets.py``, which
                says why the default is 256). 0: one broadcast per parameter.
            max_in_flight (int | str | None): broadcasts in flight at once
                (>= 1) or ``"all"``; None reads ``PADDLE_OVERLAY_MAX_IN_FLIGHT``
                and defaults to all at the step (NOTE [broadcast overlap]).

        Raises:
            TypeError: ``broadcast_overlap`` or ``strict`` is not a bool,
                ``layers`` is not a ``paddle.nn.Layer``, or
                ``bucket_size_mb`` is not a number.
            ValueError: ``layers`` is None or owns none of the optimizer's
                parameters; ``bucket_size_mb`` is negative or not finite;
                sharding degree is 1; ``pp_configs.sharding_comm_overlap``
                together with ``tensor_fusion`` or ``comm_overlap`` (Paddle's
                own limit). (``tensor_fusion`` and ``comm_overlap`` are
                supported: buckets are
                slices of its fused buffers.)
            Nothing is changed when an error is raised.
        """
        check_broadcast_overlap_flag(broadcast_overlap)
        current = get_broadcast_overlap(self)
        if not broadcast_overlap:
            sweep_abandoned()
            if current is not None:
                current.close()
            set_broadcast_overlap_owner(self, None)
            self._broadcast_overlap = False
            return

        depth = check_max_in_flight(max_in_flight, None)
        if self._sharding_world_size < 2:
            raise ValueError(
                "broadcast overlap needs sharding stage 1 with sharding_degree "
                f">= 2; this optimizer's sharding degree is "
                f"{self._sharding_world_size}. Set strategy.hybrid_configs"
                "['sharding_degree'] to the number of sharding ranks."
            )
        strategy = fleet.fleet._user_defined_strategy
        fused_by_paddle = getattr(self, "tensor_fusion", False) or getattr(
            self, "comm_overlap", False
        )
        if (
            fused_by_paddle
            and strategy is not None
            and getattr(
                strategy.hybrid_configs["pp_configs"],
                "sharding_comm_overlap",
                False,
            )
        ):
            # Paddle refuses this when it builds the optimizer ("Can not
            # enable pp's sharding_comm_overlap and sharding's tensor_fusion
            # at the same time."); reachable only if the strategy changed
            raise ValueError(
                "Paddle cannot combine pp_configs.sharding_comm_overlap with "
                "sharding_configs.tensor_fusion or comm_overlap (its own "
                "check when it builds the optimizer); set "
                "pp_configs.sharding_comm_overlap = False, or tensor_fusion "
                "and comm_overlap to False."
            )
        group = self._hcg.get_sharding_parallel_group()
        src_of = {
            id(p): group.ranks[rank]
            for rank, params in self._rank2params.items()
            for p in params
        }
        params = list(self._origin_parameter_list)
        fused = None
        if fused_by_paddle and getattr(self, "_rank2fused", None):
            # Paddle fused the parameters into per-rank buffers (for
            # tensor_fusion, and for comm_overlap alone): send slices of
            # them, never move a parameter out of Paddle's storage
            fused = [
                t for r in sorted(self._rank2fused) for t in self._rank2fused[r]
            ]
        new = StageOneBroadcastOverlap(
            params,
            [src_of[id(p)] for p in params],
            group,
            layers,
            strict,
            bucket_size_mb=bucket_size_mb,
            fused_storages=fused,
            max_in_flight=depth,
        )
        if current is not None:
            current.close()
        new.open()
        new.close_with(self)
        set_broadcast_overlap_owner(self, new)
        self._broadcast_overlap = True

    def _sharding_sync_parameters(self):
        """Broadcast the updated parameters from their owners.

        With broadcast overlap on, launches them asynchronously in the agreed
        forward order (waited by forward pre-hooks); otherwise runs the
        installed Paddle's blocking version unchanged.
        """
        return launch_or_sync(self, self._origin_sharding_sync_parameters)

    def step(self):
        """Wait for pending broadcasts, then run Paddle's ``step()``."""
        return wait_then(self, "waited_before_update", self._origin_step)

    def minimize(
        self, loss, startup_program=None, parameters=None, no_grad_set=None
    ):
        """Wait for pending broadcasts, then run Paddle's ``minimize()``."""
        return wait_then(
            self,
            "waited_before_update",
            self._origin_minimize,
            loss,
            startup_program,
            parameters,
            no_grad_set,
        )

    def state_dict(self):
        """The inner optimizer's ``state_dict()``, after pending broadcasts."""
        return wait_then(self, "waited_on_demand", self._inner_opt.state_dict)


class DygraphShardingOptimizerV2:
    """Overlay of ``DygraphShardingOptimizerV2`` (sharding stage 1 with
    ``split_param``): holds only the new and changed methods; never
    instantiated."""

    def _set_all_gather_overlap_forward(
        self,
        all_gather_overlap_forward,
        layers=None,
        strict=False,
        max_in_flight=None,
    ):
        """Overlap the post-update parameter all-gather with the next forward.

        V2 keeps each parameter's optimizer slice in Paddle's comm buffers
        (``FusedCommBuffer``, ``sharding_configs.comm_buffer_size_MB`` MB
        each on 3.x, 256 MB on 2.6.2); after each ``step()`` every buffer is
        all-gathered. When on, the all-gathers start asynchronously in the
        order forward first uses the buffers (recorded before the first
        update and agreed across the sharding group), at most
        ``max_in_flight`` at a time; a forward pre-hook on each layer that
        owns parameters waits for that layer's buffers, and every Python
        read of a parameter (attribute, ``parameters()``, ``state_dict``,
        compiled programs) waits for its own buffer, so no synchronize is
        needed before ``paddle.save``. Paddle's buffer layout is kept
        exactly. Same entry point as Paddle 3.x's own (PaddleFormers
        ``--stage1_allgather_overlap``); upstream's faults are listed in
        NOTE [broadcast overlap] of ``broadcast_overlap.py``.

        Args:
            all_gather_overlap_forward (bool): True to turn it on, False to
                wait for pending gathers and remove every hook.
            layers (paddle.nn.Layer): the model that runs the forward;
                required when turning it on.
            strict (bool): the first hooked layer of each forward waits for
                everything (safe, no overlap). Default False.
            max_in_flight (int | str | None): all-gathers in flight at once
                (>= 1) or ``"all"``; None reads ``PADDLE_OVERLAY_MAX_IN_FLIGHT``
                and defaults to 1, as upstream keeps one (Paddle PR #73406:
                gathers queued all at once delayed the forward's own
                communication).

        Raises:
            TypeError: a flag is not a bool, ``layers`` is not a Layer,
                ``max_in_flight`` is not an int or ``"all"``.
            ValueError: ``layers`` is None or owns none of the parameters;
                sharding degree is 1; ``max_in_flight`` < 1; or a setting
                this overlap is not tested with is on (named in the message:
                one that moves gradient or optimizer-state storage, e.g.
                ``release_gradients``). ``comm_overlap`` (reduce-scatter
                hooks in backward) and ``pp_configs.sharding_comm_overlap``
                (the pipeline's comm buffers, collected at the first step)
                are supported: the units are planned at the first launch
                from whatever buffers V2 then holds.
            Nothing is changed when an error is raised.
        """
        check_broadcast_overlap_flag(all_gather_overlap_forward)
        current = get_broadcast_overlap(self)
        if not all_gather_overlap_forward:
            sweep_abandoned()
            if current is not None:
                current.close()
            set_broadcast_overlap_owner(self, None)
            return
        depth = check_max_in_flight(max_in_flight, 1)
        if self._sharding_world_size < 2:
            raise ValueError(
                "the all-gather overlap needs sharding stage 1 with "
                "sharding_degree >= 2; this optimizer's sharding degree is "
                f"{self._sharding_world_size}."
            )
        self._check_all_gather_overlap_settings()
        new = StageOneBroadcastOverlap(
            list(self._parameter_list),
            None,
            self._hcg.get_sharding_parallel_group(),
            layers,
            strict,
            comm_buffers=lambda: self._comm_buffer_list,
            max_in_flight=depth,
        )
        if current is not None:
            current.close()
        # Paddle 3.x's own overlap path stays off: step() then calls
        # _sharding_sync_parameters, which launches the owner's units.
        self._all_gather_overlap_forward = False
        new.open()
        new.close_with(self)
        set_broadcast_overlap_owner(self, new)

    def _set_broadcast_overlap(self, broadcast_overlap, layers=None, **kwargs):
        """Refused: V2 syncs parameters by all-gather, not broadcast.

        Raises:
            ValueError: always when turning on; names
                ``_set_all_gather_overlap_forward``.
        """
        check_broadcast_overlap_flag(broadcast_overlap)
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
        """All-gather the updated comm buffers: launched asynchronously in
        the agreed order when the overlap is on; otherwise Paddle's
        blocking version unchanged."""
        return launch_or_sync(self, self._origin_sharding_sync_parameters)

    def step(self):
        """Wait for pending all-gathers, then run Paddle's ``step()``."""
        return wait_then(self, "waited_before_update", self._origin_step)

    def state_dict(self):
        """The inner optimizer's ``state_dict()``, after pending gathers."""
        return wait_then(self, "waited_on_demand", self._inner_opt.state_dict)

    def _check_all_gather_overlap_settings(self):
        """Raise ``ValueError`` for a V2 setting the all-gather overlap is
        not tested with, naming it (before anything changes)."""
        # settings that move gradient or optimizer-state storage, not yet
        # covered by a collective test with this overlap
        untested = (
            (
                "sharding_configs",
                "release_gradients",
                "frees gradient storage after each step",
            ),
            (
                "pp_configs",
                "release_gradients",
                "frees gradient storage after each step",
            ),
            (
                "sharding_configs",
                "free_grads_in_comm",
                "frees gradients inside the reduce",
            ),
            (
                "sharding_configs",
                "enable_fuse_optimizer_states",
                "fuses optimizer states into one storage",
            ),
        )
        strategy = fleet.fleet._user_defined_strategy
        if strategy is None:
            return
        for section, name, what in untested:
            if getattr(strategy.hybrid_configs[section], name, 0):
                raise ValueError(
                    f"the all-gather overlap is not tested with {section}."
                    f"{name} (it {what}); set it to its default or leave the "
                    "all-gather overlap off."
                )
