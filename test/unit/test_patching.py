"""paddle_overlay.apply()/remove() on the installed Paddle (one process, no launch):
exact restore, the version gate, the structure checks, the log line."""

import collections
import contextlib
import io
import os
import unittest
import warnings
from unittest import mock

import paddle
import pytest
from parameterized import parameterized

import paddle_overlay
from paddle_overlay import _patching, _version_gate

pytestmark = pytest.mark.overlay_off  # these tests apply and remove it themselves
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
    DygraphShardingOptimizerV2,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelOptimizer,
)
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    dygraph_sharding_optimizer as sharding_overlay,
)

CLASSES = (DygraphShardingOptimizer, DygraphShardingOptimizerV2, HybridParallelOptimizer)


def snapshot():
    return {cls: dict(vars(cls)) for cls in CLASSES}


@contextlib.contextmanager
def paddle_version(version):
    real = paddle.__version__
    paddle.__version__ = version
    try:
        yield
    finally:
        paddle.__version__ = real


def apply_quietly():
    """apply(); returns (stderr text, list of warnings raised)."""
    err = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        paddle_overlay.apply()
    return err.getvalue(), [w for w in caught if "paddle_overlay" in str(w.message)]


def an_added_method():
    """A method the sharding overlay adds (neither wrapped nor replacing upstream's)."""
    for name in _patching.overlay_methods(sharding_overlay.DygraphShardingOptimizer):
        wrapped = _patching.wraps_of(sharding_overlay, "DygraphShardingOptimizer")
        if name not in wrapped and name not in _patching.REPLACES_UPSTREAM:
            return name
    raise AssertionError("the sharding overlay adds no method")


class TestApplyRemove(unittest.TestCase):
    def setUp(self):
        _patching._warned_versions.clear()

    def tearDown(self):
        paddle_overlay.remove()

    def test_apply_then_remove_restores_exact_attributes(self):
        before = snapshot()
        err, _ = apply_quietly()
        paddle_overlay.apply()  # idempotent
        self.assertTrue(paddle_overlay.is_applied())
        self.assertIs(DygraphShardingOptimizer._origin_step, before[DygraphShardingOptimizer]["step"])
        self.assertIsNot(DygraphShardingOptimizer.step, before[DygraphShardingOptimizer]["step"])
        self.assertIn("_set_broadcast_overlap", vars(HybridParallelOptimizer))
        paddle_overlay.remove()
        paddle_overlay.remove()  # idempotent
        self.assertFalse(paddle_overlay.is_applied())
        after = snapshot()
        for cls in CLASSES:
            self.assertEqual(after[cls].keys(), before[cls].keys(), cls.__name__)
            for name, value in before[cls].items():
                self.assertIs(after[cls][name], value, f"{cls.__name__}.{name}")

    def test_log_line_once_per_patching(self):
        with mock.patch.dict("os.environ", {"PADDLE_TRAINER_ID": "3"}):
            err, _ = apply_quietly()
            again, _ = apply_quietly()  # already applied: nothing patched, nothing said
        self.assertEqual(err, f"paddle_overlay: applied to Paddle {paddle.__version__} (rank 3)\n")
        self.assertEqual(again, "")

    @parameterized.expand([("2.5.0",), ("2.6.1",), ("2.6.0",), ("0.0.0",), ("dev",), ("3.1",)])
    def test_older_or_unreadable_version_patches_nothing(self, version):
        before = snapshot()
        with paddle_version(version), self.assertRaises(paddle_overlay.UnsupportedPaddleVersion) as ctx:
            paddle_overlay.apply()
        message = str(ctx.exception)
        self.assertIn(version, message)
        self.assertIn(paddle_overlay.SUPPORTED_PADDLE, message)
        self.assertIn("nothing was patched", message)
        self.assertFalse(paddle_overlay.is_applied())
        self.assertEqual(snapshot(), before)

    def test_version_gate_names_exactly_the_tested_releases(self):
        self.assertEqual(
            paddle_overlay.TESTED_PADDLE,
            ("2.6.2", "3.0.0", "3.1.0", "3.1.1", "3.2.0", "3.2.1", "3.2.2", "3.3.0", "3.3.1"),
        )

    @parameterized.expand([(v,) for v in _patching.TESTED_PADDLE])
    def test_tested_release_applies_without_warning(self, version):
        with paddle_version(version):
            err, caught = apply_quietly()
        self.assertTrue(paddle_overlay.is_applied())
        self.assertEqual(caught, [])
        self.assertIn(f"applied to Paddle {version}", err)

    @parameterized.expand([("3.4.0",), ("4.0.0",), ("3.0.0rc1",)])
    def test_untested_newer_release_warns_once_and_applies(self, version):
        with paddle_version(version):
            _, first = apply_quietly()
            paddle_overlay.remove()
            _, second = apply_quietly()
        self.assertTrue(paddle_overlay.is_applied())
        self.assertEqual(len(first), 1)
        self.assertIn(f"not tested with Paddle {version}", str(first[0].message))
        self.assertIn("3.3.1", str(first[0].message))
        self.assertEqual(second, [])  # one warning per process and version


class TestStructureChecks(unittest.TestCase):
    """apply() refuses, naming what moved, before patching anything."""

    def tearDown(self):
        paddle_overlay.remove()

    def assert_refused(self, *expected):
        before = snapshot()
        with self.assertRaises(paddle_overlay.PaddleInternalsChanged) as ctx:
            paddle_overlay.apply()
        message = str(ctx.exception)
        for text in expected:
            self.assertIn(text, message)
        self.assertIn("Nothing was patched", message)
        self.assertFalse(paddle_overlay.is_applied())
        self.assertEqual(snapshot(), before)

    def test_wrapped_method_missing(self):
        wraps = dict(sharding_overlay.OVERLAY_WRAPS)
        wraps["DygraphShardingOptimizer"] += ("_renamed_in_a_later_paddle",)
        with mock.patch.object(sharding_overlay, "OVERLAY_WRAPS", wraps):
            self.assert_refused("DygraphShardingOptimizer._renamed_in_a_later_paddle (wrapped by the overlay) "
                                "is not defined by the installed class")

    def test_step_no_longer_reaches_the_sharding_sync(self):
        def step(self):  # a later Paddle whose step syncs parameters another way
            return self._inner_opt.step()

        with mock.patch.object(DygraphShardingOptimizer, "step", step):
            self.assert_refused("DygraphShardingOptimizer.step no longer mentions _sharding_sync_parameters")

    def test_hybrid_step_no_longer_goes_through_private_step(self):
        def step(self):
            return self._inner_opt.step()

        with mock.patch.object(HybridParallelOptimizer, "step", step):
            self.assert_refused("HybridParallelOptimizer.step no longer mentions _step")

    def test_internal_attribute_renamed(self):
        real = _version_gate.CALL_PATHS
        moved = tuple(
            (c, m, tuple(n.replace("_rank2params", "_param_owner_table") for n in needles), why)
            for c, m, needles, why in real
        )
        with mock.patch.object(_version_gate, "CALL_PATHS", moved):
            self.assert_refused("DygraphShardingOptimizer no longer mentions _param_owner_table")

    def test_added_method_never_shadows_paddles_own(self):
        name = an_added_method()
        with mock.patch.object(DygraphShardingOptimizer, name, lambda self: None, create=True):
            self.assert_refused(f"DygraphShardingOptimizer.{name} is defined by the installed Paddle")

    def test_origin_slot_taken(self):
        with mock.patch.object(HybridParallelOptimizer, "_origin_step", lambda self: None, create=True):
            self.assert_refused("HybridParallelOptimizer._origin_step already exists")

    def test_every_problem_is_named(self):
        def step(self):
            return None

        name = an_added_method()
        with mock.patch.object(DygraphShardingOptimizer, "step", step), \
                mock.patch.object(DygraphShardingOptimizer, name, lambda self: None, create=True):
            self.assert_refused("DygraphShardingOptimizer.step no longer mentions",
                                f"DygraphShardingOptimizer.{name} is defined")


class TestReadInterceptionInternals(unittest.TestCase):
    """A Paddle that moved an internal the read waits rely on is refused by
    name (_version_gate.REQUIRED_INTERNALS), before anything changes."""

    tearDown = TestStructureChecks.tearDown
    assert_refused = TestStructureChecks.assert_refused

    def test_getattr_no_longer_reads_parameters(self):
        def __getattr__(self, name):  # a Paddle keeping parameters elsewhere
            return object.__getattribute__(self, "_params_store")[name]

        with mock.patch.object(paddle.nn.Layer, "__getattr__", __getattr__):
            self.assert_refused("paddle.nn.Layer.__getattr__: it no longer mentions _parameters[")

    def test_named_parameters_no_longer_iterates_the_dict(self):
        def named_parameters(self, prefix="", include_sublayers=True):
            yield from ()

        with mock.patch.object(paddle.nn.Layer, "named_parameters", named_parameters):
            self.assert_refused("paddle.nn.Layer.named_parameters: it no longer mentions _parameters.items()")

    def test_state_dict_no_longer_iterates_the_dict(self):
        def _state_dict_impl(self, *args, **kwargs):
            return {}

        with mock.patch.object(paddle.nn.Layer, "_state_dict_impl", _state_dict_impl):
            self.assert_refused("paddle.nn.Layer._state_dict_impl: it no longer mentions _parameters.items()")

    def test_parameters_no_longer_goes_through_named_parameters(self):
        def parameters(self, include_sublayers=True):
            return []

        with mock.patch.object(paddle.nn.Layer, "parameters", parameters):
            self.assert_refused("paddle.nn.Layer.parameters: it no longer mentions named_parameters")

    def test_static_function_call_moved(self):
        from paddle.jit.dy2static.program_translator import StaticFunction

        original = vars(StaticFunction)["__call__"]
        del StaticFunction.__call__
        try:
            self.assert_refused("StaticFunction.__call__ (wrapped by the overlay) is not defined by the installed class")
        finally:
            StaticFunction.__call__ = original

    def test_sot_skip_list_moved(self):
        from paddle.jit.sot.opcode_translator import skip_files

        with mock.patch.object(skip_files, "skip_file_names", ["a list now"]):
            self.assert_refused("paddle.jit.sot skip_files: skip_files lacks")


class TestReadInterceptionRestores(unittest.TestCase):
    """Compiled programs wait (the pre-call hook) while any owner is open and
    a layer stays guarded while another open owner uses it; remove() puts
    StaticFunction.__call__, SOT's skip list and Paddle's module names back
    exactly."""

    def test_acquire_release_restores_everything(self):
        from paddle.jit.dy2static.program_translator import StaticFunction
        from paddle.jit.sot.opcode_translator import skip_files

        call, names, regex = StaticFunction.__call__, set(skip_files.skip_file_names), skip_files.skip_file_name_re
        paddle_overlay.apply()
        from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
            read_interception as ri,
            sync_registry,
        )

        self.assertIsNot(StaticFunction.__call__, call)  # runs the pre-call hooks
        self.assertGreater(len(skip_files.skip_file_names), len(names))

        class Owner:  # what read_interception reads of an owner
            def __init__(self, layers):
                self.serial = sync_registry.next_serial()
                self.owning_layers = layers

        layer = paddle.nn.Linear(2, 2)
        a, b = Owner([layer]), Owner([layer])
        for owner in (a, b):  # as ParamSyncOverlap.open()
            sync_registry.add(owner)
            ri.acquire(owner)
        self.assertTrue(ri.is_installed())
        self.assertIs(type(layer._parameters), ri.GuardedParameters)
        for owner, still in ((a, True), (b, False)):  # as close()
            sync_registry.discard(owner)
            ri.release(owner)
            self.assertIs(type(layer._parameters) is ri.GuardedParameters, still)
            self.assertIs(ri.is_installed(), still)
        self.assertIs(type(layer._parameters), collections.OrderedDict)
        paddle_overlay.remove()
        self.assertIs(StaticFunction.__call__, call)
        self.assertEqual(skip_files.skip_file_names, names)
        self.assertIs(skip_files.skip_file_name_re, regex)
        import paddle.jit.dy2static as dy2static

        self.assertFalse(hasattr(dy2static, "pre_call_hooks"))

    def test_optimizer_collected_without_close_restores_everything_at_the_next_call(self):
        import gc

        paddle_overlay.apply()
        from owner_fakes import Net, make_owner

        from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
            read_interception as ri,
            sync_registry,
        )

        class Optimizer:
            pass

        model = Net()
        owner, _ = make_owner(model)
        optimizer = Optimizer()
        owner.close_with(optimizer)
        self.assertTrue(ri.is_installed())
        del optimizer
        gc.collect()  # marked closed there; nothing unhooked inside gc
        self.assertTrue(ri.is_installed())
        self.assertEqual(sync_registry.open_owners(), [])  # the sweep
        self.assertFalse(ri.is_installed())
        self.assertIs(type(model.first._parameters), collections.OrderedDict)
        paddle_overlay.remove()


class TestRemovedDepthSetting(unittest.TestCase):
    """PADDLE_OVERLAY_MAX_IN_FLIGHT (the removed launch depth) still set:
    apply() says it is ignored, when it patches."""

    def setUp(self):
        paddle_overlay.remove()  # apply() only speaks when it patches

    tearDown = setUp

    def apply_with(self, value):
        """apply() with the variable at ``value`` (None: unset); the
        warnings that name it."""
        with mock.patch.dict("os.environ"), warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stderr(io.StringIO()):
            os.environ.pop("PADDLE_OVERLAY_MAX_IN_FLIGHT", None)
            if value is not None:
                os.environ["PADDLE_OVERLAY_MAX_IN_FLIGHT"] = value
            warnings.simplefilter("always")
            paddle_overlay.apply()
        self.assertTrue(paddle_overlay.is_applied())
        return [str(w.message) for w in caught if "MAX_IN_FLIGHT" in str(w.message)]

    @parameterized.expand([("1",), ("all",), ("0",)])
    def test_set_warns_it_is_ignored(self, value):
        (message,) = self.apply_with(value)
        self.assertTrue(message.startswith("PADDLE_OVERLAY_MAX_IN_FLIGHT is ignored: the launch depth was removed"))
        self.assertIn("unset it", message)
        self.assertEqual(self.apply_with(value), [])  # applied already: nothing patched, nothing said

    @parameterized.expand([(None,), ("",), ("  ",)])
    def test_unset_or_empty_says_nothing(self, value):
        self.assertEqual(self.apply_with(value), [])


if __name__ == "__main__":
    unittest.main()
