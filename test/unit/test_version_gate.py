"""The version gate's rows for V2, Paddle's fusion and V1's fusion flags (_version_gate.CALL_PATHS and
REQUIRED_INTERNALS): the installed Paddle passes every row; a Paddle where one of them moved is
refused by apply() with PaddleInternalsChanged naming it, and nothing is patched."""

import ast
import contextlib
import inspect
import unittest
from unittest import mock

import paddle
import pytest
from parameterized import parameterized

import paddle_overlay
from paddle_overlay import _patching, _version_gate

pytestmark = pytest.mark.overlay_off  # these tests apply and remove it themselves
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import dygraph_sharding_optimizer
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelOptimizer,
)
from paddle.distributed.fleet.utils import tensor_fusion_helper
from paddle.distributed.fleet.utils.tensor_fusion_helper import FusedCommBuffer

CLASSES = (DygraphShardingOptimizer, DygraphShardingOptimizerV2, HybridParallelOptimizer, FusedCommBuffer)
BY_NAME = {cls.__name__: cls for cls in CLASSES}
FLAG = "self._all_gather_overlap_forward"

# The instance attributes the new CALL_PATHS rows require __init__ to mention: (class, needle).
ATTRIBUTE_ROWS = [
    ("DygraphShardingOptimizer", "self.tensor_fusion"),
    ("DygraphShardingOptimizer", "self.comm_overlap"),
    ("DygraphShardingOptimizer", "self._rank2fused"),
    ("DygraphShardingOptimizerV2", "self._comm_buffer_list"),
    ("DygraphShardingOptimizerV2", "self._parameter_list"),
    ("DygraphShardingOptimizerV2", "self._hcg"),
    ("DygraphShardingOptimizerV2", "self._sharding_world_size"),
    ("DygraphShardingOptimizerV2", "self._inner_opt"),
    ("FusedCommBuffer", "self._comm_group"),
    ("FusedCommBuffer", "self._params"),
    ("FusedCommBuffer", "self.param_storage"),
]


def snapshot():
    return {cls: dict(vars(cls)) for cls in CLASSES + (paddle.Tensor,)}


@contextlib.contextmanager
def removed(cls, name):
    """``cls`` without its own attribute ``name`` (a Paddle that dropped it)."""
    original = vars(cls)[name]
    delattr(cls, name)
    try:
        yield
    finally:
        setattr(cls, name, original)


@contextlib.contextmanager
def renamed_in_source(owner, name):
    """``owner``'s source, as the gate reads it, with every ``name`` renamed ``name_moved``."""
    real = _version_gate._source

    def source(obj):
        text = real(obj)
        return text.replace(name, name + "_moved") if obj is owner else text

    with mock.patch.object(_version_gate, "_source", source):
        yield


class TestInstalledPaddlePasses(unittest.TestCase):
    """The installed release (3.3.1 and 2.6.2 here) passes every row of the gate."""

    @parameterized.expand([(row[0] if row[1] is None else f"{row[0]}.{row[1]}", row) for row in _version_gate.CALL_PATHS])
    def test_call_path_row(self, _, row):
        classes, problems = _version_gate.used_classes()
        classes.update(BY_NAME)
        self.assertEqual(problems, [])
        with mock.patch.object(_version_gate, "CALL_PATHS", (row,)):
            self.assertEqual(_version_gate.check_call_paths(classes), [])

    @parameterized.expand([(what, check) for what, _, check in _version_gate.REQUIRED_INTERNALS])
    def test_required_internal(self, _, check):
        self.assertIsNone(check())

    def test_new_rows_are_in_the_gate(self):
        rows = {(c, n) for c, m, needles, _ in _version_gate.CALL_PATHS if m == "__init__" for n in needles}
        self.assertEqual(set(ATTRIBUTE_ROWS) - rows, set())
        whats = {what for what, _, _ in _version_gate.REQUIRED_INTERNALS}
        for what in ("DygraphShardingOptimizerV2.step", "DygraphShardingOptimizerV2._sharding_sync_parameters",
                     "FusedCommBuffer.sync_params", "FusedCommBuffer._clear_param_storage", "paddle.Tensor"):
            self.assertIn(what, whats)

    def test_v2_sync_is_gated_only_where_the_release_has_the_flag(self):
        """3.x: step and _sharding_sync_parameters reach the blocking sync only with the flag
        False; 2.6.2 has no flag and always reaches it."""
        for method, call in (("step", "self._sharding_sync_parameters()"),
                             ("_sharding_sync_parameters", "comm_buffer.sync_params()")):
            tree, problem = _version_gate._method_tree(DygraphShardingOptimizerV2, method)
            self.assertIsNone(problem)
            has_flag = _version_gate._mentions(inspect.getsource(vars(DygraphShardingOptimizerV2)[method]), FLAG)
            with_flag_on = {ast.unparse(c) for c in _version_gate._calls_taken(tree, FLAG, True)}
            self.assertEqual(call in with_flag_on, not has_flag, method)
            if paddle.__version__ in ("2.6.2", "3.3.1"):
                self.assertEqual(has_flag, paddle.__version__ == "3.3.1", method)

    def test_freed_storage_reads_uninitialized(self):
        """Where Paddle frees a comm buffer's storage (3.x: _clear_to_zero_allocation),
        _is_initialized() says so; 2.6.2 has no way to free it."""
        if "_clear_param_storage" not in vars(FusedCommBuffer):
            self.assertNotIn("clear_param_storage", vars(DygraphShardingOptimizerV2))
            return
        storage = paddle.zeros([8])
        self.assertTrue(storage._is_initialized())
        storage._clear_to_zero_allocation()
        self.assertFalse(storage._is_initialized())


class TestMovedInternalRefused(unittest.TestCase):
    """A Paddle where one of the rows moved: apply() names it and patches nothing."""

    def tearDown(self):
        paddle_overlay.remove()

    def assert_refused(self, expected, alone=True):
        before = snapshot()
        with self.assertRaises(paddle_overlay.PaddleInternalsChanged) as ctx:
            paddle_overlay.apply()
        message = str(ctx.exception)
        self.assertIn(expected, message)
        self.assertIn("Nothing was patched", message)
        if alone:  # the fake moved that one thing only
            self.assertNotIn("; ", message)
        self.assertFalse(paddle_overlay.is_applied())
        self.assertEqual(snapshot(), before)

    @parameterized.expand(ATTRIBUTE_ROWS)
    def test_attribute_no_longer_set_in_init(self, class_name, needle):
        cls = BY_NAME[class_name]
        with renamed_in_source(vars(cls)["__init__"], needle):
            self.assert_refused(f"{class_name}.__init__ no longer mentions {needle} (")

    def test_fused_comm_buffer_missing(self):
        with mock.patch.dict(vars(tensor_fusion_helper)):
            del tensor_fusion_helper.FusedCommBuffer
            self.assert_refused("paddle.distributed.fleet.utils.tensor_fusion_helper.FusedCommBuffer is missing",
                                alone=False)

    def test_v2_missing(self):
        with mock.patch.dict(vars(dygraph_sharding_optimizer)):
            del dygraph_sharding_optimizer.DygraphShardingOptimizerV2
            self.assert_refused("dygraph_sharding_optimizer.DygraphShardingOptimizerV2 is missing")

    # V2.step: with the flag False it must call _sharding_sync_parameters
    def test_v2_step_no_longer_syncs(self):
        def step(self):
            self._inner_opt.step()

        with mock.patch.object(DygraphShardingOptimizerV2, "step", step):
            self.assert_refused(f"DygraphShardingOptimizerV2.step: with {FLAG} False it no longer always calls "
                                "self._sharding_sync_parameters()")

    def test_v2_step_syncs_under_another_flag(self):
        def step(self):  # a later Paddle renaming the flag: the overlay's False would not reach it
            if not self._all_gather_overlap_forward_v2:
                self._sharding_sync_parameters()

        with mock.patch.object(DygraphShardingOptimizerV2, "step", step):
            self.assert_refused("DygraphShardingOptimizerV2.step: with")

    def test_v2_step_syncs_only_with_the_flag_on(self):
        def step(self):
            if self._all_gather_overlap_forward:
                self._sharding_sync_parameters()

        with mock.patch.object(DygraphShardingOptimizerV2, "step", step):
            self.assert_refused("DygraphShardingOptimizerV2.step: with")

    # V2._sharding_sync_parameters: with the flag False, each comm buffer's blocking sync_params()
    def test_v2_sync_no_longer_blocking(self):
        def _sharding_sync_parameters(self):
            for comm_buffer in self._comm_buffer_list:
                comm_buffer.sync_params(sync=False)

        with mock.patch.object(DygraphShardingOptimizerV2, "_sharding_sync_parameters", _sharding_sync_parameters):
            self.assert_refused(f"DygraphShardingOptimizerV2._sharding_sync_parameters: with {FLAG} False it no "
                                "longer always calls a comm buffer's sync_params()")

    def test_v2_sync_blocking_only_with_the_flag_on(self):
        def _sharding_sync_parameters(self):
            if self._all_gather_overlap_forward:
                for comm_buffer in self._comm_buffer_list:
                    comm_buffer.sync_params()

        with mock.patch.object(DygraphShardingOptimizerV2, "_sharding_sync_parameters", _sharding_sync_parameters):
            self.assert_refused("DygraphShardingOptimizerV2._sharding_sync_parameters: with")

    def test_v2_sync_gathers_another_way(self):
        def _sharding_sync_parameters(self):
            for comm_buffer in self._comm_buffer_list:
                paddle.distributed.all_gather([], comm_buffer.param_storage)

        with mock.patch.object(DygraphShardingOptimizerV2, "_sharding_sync_parameters", _sharding_sync_parameters):
            self.assert_refused("DygraphShardingOptimizerV2._sharding_sync_parameters: with")

    # FusedCommBuffer.sync_params: process_group.all_gather(shard, full), waited, by default
    def test_fused_sync_arguments_swapped(self):
        def sync_params(self, sync=True, param2task={}):
            full_buffer = self.param_storage
            group = self._comm_group
            slice_buffer = full_buffer._slice(0, 1)
            group.process_group.all_gather(full_buffer, slice_buffer).wait()

        with mock.patch.object(FusedCommBuffer, "sync_params", sync_params):
            self.assert_refused("FusedCommBuffer.sync_params: it no longer always waits for "
                                "group.process_group.all_gather(shard, full)")

    def test_fused_sync_gathers_another_storage(self):
        def sync_params(self):
            full_buffer = self.grad_storage
            slice_buffer = full_buffer._slice(0, 1)
            self._comm_group.process_group.all_gather(slice_buffer, full_buffer).wait()

        with mock.patch.object(FusedCommBuffer, "sync_params", sync_params):
            self.assert_refused("FusedCommBuffer.sync_params: it no longer always waits")

    def test_fused_sync_not_waited(self):
        def sync_params(self):
            full_buffer = self.param_storage
            slice_buffer = full_buffer._slice(0, 1)
            self.sync_param_task = self._comm_group.process_group.all_gather(slice_buffer, full_buffer)

        with mock.patch.object(FusedCommBuffer, "sync_params", sync_params):
            self.assert_refused("FusedCommBuffer.sync_params: it no longer always waits")

    def test_fused_sync_through_another_collective(self):
        def sync_params(self):
            full_buffer = self.param_storage
            slice_buffer = full_buffer._slice(0, 1)
            paddle.distributed.all_gather_into_tensor(full_buffer, slice_buffer, group=self._comm_group)

        with mock.patch.object(FusedCommBuffer, "sync_params", sync_params):
            self.assert_refused("FusedCommBuffer.sync_params: it no longer always waits")

    def test_fused_sync_asynchronous_by_default(self):
        def sync_params(self, sync=False, param2task={}):
            full_buffer = self.param_storage
            slice_buffer = full_buffer._slice(0, 1)
            if sync:
                self._comm_group.process_group.all_gather(slice_buffer, full_buffer).wait()

        with mock.patch.object(FusedCommBuffer, "sync_params", sync_params):
            self.assert_refused("FusedCommBuffer.sync_params: its sync argument defaults to False")

    # FusedCommBuffer._clear_param_storage: freed storage reads as not initialized
    def test_storage_freed_another_way(self):
        def clear_param_storage(self, color):
            for comm_buffer in self._comm_buffer_list:
                comm_buffer._clear_param_storage()

        def _clear_param_storage(self):
            self.param_storage = None

        with mock.patch.object(DygraphShardingOptimizerV2, "clear_param_storage", clear_param_storage, create=True), \
                mock.patch.object(FusedCommBuffer, "_clear_param_storage", _clear_param_storage, create=True):
            self.assert_refused("FusedCommBuffer._clear_param_storage: FusedCommBuffer._clear_param_storage no "
                                "longer mentions param_storage._clear_to_zero_allocation")

    def test_storage_freed_outside_the_comm_buffer(self):
        def clear_param_storage(self, color):
            for comm_buffer in self._comm_buffer_list:
                comm_buffer.param_storage._clear_to_zero_allocation()

        with mock.patch.object(DygraphShardingOptimizerV2, "clear_param_storage", clear_param_storage, create=True):
            self.assert_refused("DygraphShardingOptimizerV2.clear_param_storage no longer mentions "
                                "_clear_param_storage")

    def test_comm_buffer_lost_its_freeing_method(self):
        def clear_param_storage(self, color):
            for comm_buffer in self._comm_buffer_list:
                comm_buffer._clear_param_storage()

        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(DygraphShardingOptimizerV2, "clear_param_storage",
                                                  clear_param_storage, create=True))
            if "_clear_param_storage" in vars(FusedCommBuffer):
                stack.enter_context(removed(FusedCommBuffer, "_clear_param_storage"))
            self.assert_refused("FusedCommBuffer defines no _clear_param_storage (while clear_param_storage exists)")

    # paddle.Tensor: the methods the units call on storages
    @parameterized.expand([(name,) for name in _version_gate._TENSOR_METHODS])
    def test_tensor_method_missing(self, name):
        fake = type("Tensor", (), {n: lambda self: None for n in _version_gate._TENSOR_METHODS if n != name})
        with mock.patch.object(paddle, "Tensor", fake):
            self.assert_refused(f"paddle.Tensor: it lacks {name} (")


if __name__ == "__main__":
    unittest.main()
