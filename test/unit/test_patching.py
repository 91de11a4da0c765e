"""paddle_overlay.apply()/remove() on the installed Paddle (one process, no launch)."""

import unittest

import paddle
from parameterized import parameterized

import paddle_overlay
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
)
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelOptimizer,
)

CLASSES = (DygraphShardingOptimizer, HybridParallelOptimizer)


def snapshot():
    return {cls: dict(vars(cls)) for cls in CLASSES}


class TestApplyRemove(unittest.TestCase):
    def tearDown(self):
        paddle_overlay.remove()

    def test_apply_then_remove_restores_exact_attributes(self):
        before = snapshot()
        paddle_overlay.apply()
        paddle_overlay.apply()  # idempotent
        self.assertTrue(paddle_overlay.is_applied())
        self.assertIs(
            DygraphShardingOptimizer._origin_step, before[DygraphShardingOptimizer]["step"]
        )
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

    @parameterized.expand([("2.5.0",), ("4.0.0",), ("0.0.0",), ("dev",)])
    def test_unsupported_version_patches_nothing(self, version):
        before = snapshot()
        real = paddle.__version__
        paddle.__version__ = version
        try:
            with self.assertRaises(paddle_overlay.UnsupportedPaddleVersion) as ctx:
                paddle_overlay.apply()
        finally:
            paddle.__version__ = real
        message = str(ctx.exception)
        self.assertIn(version, message)
        self.assertIn(paddle_overlay.SUPPORTED_PADDLE, message)
        self.assertFalse(paddle_overlay.is_applied())
        self.assertEqual(snapshot(), before)

    @parameterized.expand([("2.6.0",), ("2.6.2",), ("3.0.0rc1",), ("3.3.1",)])
    def test_supported_versions_apply(self, version):
        real = paddle.__version__
        paddle.__version__ = version
        try:
            paddle_overlay.apply()
        finally:
            paddle.__version__ = real
        self.assertTrue(paddle_overlay.is_applied())


if __name__ == "__main__":
    unittest.main()
