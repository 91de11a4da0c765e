"""broadcast_buckets and unit_plan's bucket plans: planning, views, rebinding replaced memory, dtypes,
odd sizes, memory (one process, no ranks)."""

import collections
import json
import os
import subprocess
import sys
import unittest

import numpy as np
import paddle


class _Group:
    ranks = [0, 1]
    nranks = 2
    rank = 0


GROUP = _Group()

from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import unit_plan
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.broadcast_buckets import (
    ALIGN_BYTES,
    DEFAULT_BUCKET_SIZE_MB,
    BucketStorage,
    check_bucket_size_mb,
    itemsize,
    plan_buckets,
    plan_fused_slices,
)

METHOD = "_set_broadcast_overlap"

MB = 1 << 20
FakeParam = collections.namedtuple("FakeParam", ["shape", "dtype", "stop_gradient"])
HERE = os.path.dirname(os.path.abspath(__file__))
SWEEP = os.path.join(HERE, "..", "..", "..", "shared", "reference", "h200_bucket_sweep.json")


def llama7b_stand_in(layers=32):
    """The stand-in's parameters: 9 per LLaMA-7B layer, bf16, owners alternate by index."""
    H, I = 4096, 11008
    shapes = [(H, H)] * 4 + [(I, H), (I, H), (H, I), (H,), (H,)]
    params = [FakeParam(s, "bfloat16", False) for _ in range(layers) for s in shapes]
    return params, [i % 2 for i in range(len(params))]


def build(specs_dtypes, seed=0):
    """Real parameters of the given (shape, dtype, stop_gradient) with distinct values."""
    rng = np.random.default_rng(seed)
    params = []
    for shape, dtype, frozen in specs_dtypes:
        p = paddle.create_parameter(
            list(shape), dtype, default_initializer=paddle.nn.initializer.Constant(0.0)
        )
        with paddle.no_grad():
            p.set_value(paddle.to_tensor(rng.standard_normal(shape).astype("float32")).astype(dtype))
        p.stop_gradient = frozen
        params.append(p)
    return params


def materialized(params, src, cap_bytes, order=None):
    order = list(range(len(params))) if order is None else order
    specs = plan_buckets(order, params, src, cap_bytes)
    storage = BucketStorage(specs, params, src, order)
    storage.materialize()
    return storage


def planned(params, src, cap_bytes, order=None):
    """unit_plan's bucket plan (the storage materialized, the units built)."""
    order = list(range(len(params))) if order is None else order
    return unit_plan.Buckets(src, cap_bytes).plan(order, params, GROUP)


def in_buffer(buffer, tensor):
    begin = buffer.data_ptr()
    return begin <= tensor.data_ptr() < begin + int(buffer._numel()) * itemsize(buffer.dtype)


def values(params):
    return [p.astype("float32").numpy().copy() for p in params]


class TestPlan(unittest.TestCase):
    def test_counts_match_the_stand_in_sweep(self):
        params, src = llama7b_stand_in()
        order = list(range(len(params)))
        with open(SWEEP) if os.path.exists(SWEEP) else open(os.devnull) as f:
            text = f.read()
        expected = {8: 257, 32: 257, 64: 226, 128: 162, 256: 86, 512: 46, 1024: 24}
        if text:  # the reference copy, when present, says the same
            run = json.loads(text)["runs"][0]["S1024"]
            self.assertEqual(
                {c: run[f"cap{c}MB"]["broadcasts"] for c in expected}, expected
            )
        for cap, count in expected.items():
            self.assertEqual(len(plan_buckets(order, params, src, cap * MB)), count, cap)

    def test_default_cap_cuts_llama_broadcasts_below_a_third(self):
        params, src = llama7b_stand_in()
        specs = plan_buckets(list(range(288)), params, src, DEFAULT_BUCKET_SIZE_MB * MB)
        self.assertEqual(len(specs), 86)
        self.assertEqual(sorted(i for s in specs for i in s.indices), list(range(288)))

    def test_windows_follow_the_order_and_owners_split_them(self):
        params = [FakeParam((4,), "float32", False) for _ in range(6)]  # 16 bytes each
        src = [0, 1, 0, 1, 0, 1]
        order = [5, 4, 3, 2, 1, 0]
        specs = plan_buckets(order, params, src, 48, align_bytes=4)  # 3 params per window
        self.assertEqual(
            [(s.window, s.src, s.indices) for s in specs],
            [(0, 1, (5, 3)), (0, 0, (4,)), (1, 0, (2, 0)), (1, 1, (1,))],
        )

    def test_frozen_tied_and_empty_get_no_slot(self):
        a = FakeParam((3,), "float32", False)
        frozen = FakeParam((3,), "float32", True)
        empty = FakeParam((0, 4), "float32", False)
        params = [a, frozen, a, empty]
        specs = plan_buckets([2, 0, 1, 3], params, [0, 1, 1, 0], MB)
        self.assertEqual([s.indices for s in specs], [(2,)])  # a's first position in the order

    def test_dtypes_never_share_a_bucket(self):
        params = [FakeParam((5,), d, False) for d in ("float32", "float16", "float32", "bfloat16")]
        specs = plan_buckets(list(range(4)), params, [0] * 4, MB)
        self.assertEqual(
            sorted((s.dtype, s.indices) for s in specs),
            [("bfloat16", (3,)), ("float16", (1,)), ("float32", (0, 2))],
        )

    def test_odd_sizes_are_aligned_and_never_overlap(self):
        shapes = [(1,), (), (3,), (7, 1), (1, 1, 1), (65,), (2, 3)]
        for dtype in ("float32", "float16", "float64"):
            params = [FakeParam(s, dtype, False) for s in shapes]
            (spec,) = plan_buckets(list(range(len(shapes))), params, [0] * len(shapes), MB)
            unit = ALIGN_BYTES // itemsize(dtype)
            ends = 0
            for off, n in zip(spec.offsets, spec.numels):
                self.assertEqual(off % unit, 0)
                self.assertGreaterEqual(off, ends)
                ends = off + n
            self.assertLessEqual(ends, spec.length)
            self.assertEqual(spec.length % unit, 0)

    def test_plan_depends_on_values_not_identity(self):
        def plan_of(seed):
            params = build([((3, 5), "float32", False), ((7,), "float16", False),
                            ((2,), "float32", True), ((9, 2), "float32", False)], seed)
            return plan_buckets([3, 1, 0, 2], params, [1, 0, 1, 0], 64)
        self.assertEqual(plan_of(0), plan_of(1))

    def test_bad_input_raises(self):
        params = [FakeParam((2,), "float32", False)] * 2
        with self.assertRaises(ValueError):
            plan_buckets([0, 0], params, [0, 0], MB)
        with self.assertRaises(ValueError):
            plan_buckets([0, 1], params, [0], MB)
        with self.assertRaises(ValueError):
            plan_buckets([0, 1], params, [0, 0], 0)
        for bad in (-1, float("nan"), float("inf")):
            with self.assertRaises(ValueError):
                check_bucket_size_mb(bad)
        for bad in (True, "256"):
            with self.assertRaises(TypeError):
                check_bucket_size_mb(bad)
        self.assertEqual(check_bucket_size_mb(0), 0)
        self.assertEqual(check_bucket_size_mb(0.5), MB // 2)

    def test_none_reads_the_flag_as_paddle_reads_its_sharding_knobs(self):
        from unittest import mock

        flag = "FLAGS_sharding_overlap_bucket_size_mb"
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop(flag, None)
            self.assertEqual(check_bucket_size_mb(None), 256 * MB)  # the default
            self.assertEqual(check_bucket_size_mb(), 256 * MB)
            os.environ[flag] = "0"
            self.assertEqual(check_bucket_size_mb(None), 0)
            os.environ[flag] = "0.5"
            self.assertEqual(check_bucket_size_mb(None), MB // 2)
            self.assertEqual(check_bucket_size_mb(1), MB)  # an argument wins
            for bad, error in (("lots", f"{flag} must be a number"), ("-1", "finite and >= 0")):
                os.environ[flag] = bad
                with self.assertRaisesRegex(ValueError, error):
                    check_bucket_size_mb(None)


class TestStorage(unittest.TestCase):
    SHAPES = [((3, 5), "float32", False), ((1,), "float32", False), ((), "float32", False),
              ((7,), "float16", False), ((4, 4), "float32", True), ((11,), "float32", False),
              ((2, 2), "bfloat16", False)]

    def test_views_keep_values_names_shapes_and_flags(self):
        params = build(self.SHAPES)
        before = values(params)
        meta = [(p.name, list(p.shape), p.dtype, p.stop_gradient) for p in params]
        storage = materialized(params, [0, 1, 0, 1, 0, 1, 0], 64)
        for p, v in zip(params, before):
            np.testing.assert_array_equal(p.astype("float32").numpy(), v)
        self.assertEqual([(p.name, list(p.shape), p.dtype, p.stop_gradient) for p in params], meta)
        for b, spec in enumerate(storage.specs):
            buf = storage.buffers[b]
            self.assertEqual(buf.shape, [spec.length])
            for i, off in zip(spec.indices, spec.offsets):
                self.assertEqual(params[i].data_ptr() - buf.data_ptr(), off * itemsize(spec.dtype))
                self.assertEqual(storage.bucket_of(i), b)
        self.assertIsNone(storage.bucket_of(4))  # frozen

    def test_writes_to_the_buffer_reach_the_parameters(self):
        params = build(self.SHAPES)
        storage = materialized(params, [0] * 7, MB)
        with paddle.no_grad():
            for buf in storage.buffers:
                buf.set_value(paddle.arange(buf.shape[0], dtype="float32").astype(buf.dtype))
        for b, spec in enumerate(storage.specs):
            for i, off, n in zip(spec.indices, spec.offsets, spec.numels):
                expect = np.arange(off, off + n, dtype="float32").astype(spec.dtype if spec.dtype != "bfloat16" else "float32")
                got = params[i].astype("float32").numpy().ravel()
                if spec.dtype == "float32":
                    np.testing.assert_array_equal(got, expect)
                else:
                    self.assertEqual(got.shape, expect.shape)

    def test_units_cover_every_trainable_position_once(self):
        params = build(self.SHAPES)
        order = [6, 5, 4, 3, 2, 1, 0]
        plan = planned(params, [0, 1, 0, 1, 0, 1, 0], 64, order)
        units = plan.units()
        covered = [i for u in units for i in u.indices]
        self.assertEqual(sorted(covered), [0, 1, 2, 3, 5, 6])
        self.assertIs(plan.units(), units)  # the same list while nothing changed
        params[4].stop_gradient = False
        self.assertIsNot(plan.units(), units)  # the trainable set changed
        firsts = [order.index(u.indices[0]) for u in units]
        self.assertEqual(firsts, sorted(firsts))

    def test_unfrozen_later_is_sent_alone(self):
        params = build(self.SHAPES)
        plan = planned(params, [0] * 7, MB)
        params[4].stop_gradient = False
        units = plan.units()
        self.assertIn(((4,), 0), [(u.indices, u.src) for u in units])
        self.assertIs([u for u in units if u.indices == (4,)][0].tensor, params[4])

    def test_tied_parameter_one_slot_all_positions_covered(self):
        (a, b) = build([((3, 2), "float32", False), ((5,), "float32", False)])
        params = [a, b, a]
        plan = planned(params, [0, 1, 0], MB, order=[2, 1, 0])
        storage = plan.storage
        slots = [i for s in storage.specs for i in s.indices]
        self.assertEqual(slots, [2, 1])
        self.assertEqual(storage.bucket_of(0), storage.bucket_of(2))
        unit = [u for u in plan.units() if 2 in u.indices][0]
        self.assertEqual((unit.indices, unit.src), ((2, 0), 0))  # owner of its first position
        # every position in exactly one unit: the repeat is not sent a second time on its own
        self.assertEqual(sorted(i for u in plan.units() for i in u.indices), [0, 1, 2])

    def test_optimizer_bitwise_equal_and_state_keys_unchanged(self):
        def train(bucketed):
            paddle.seed(7)
            with paddle.utils.unique_name.guard():
                model = paddle.nn.Sequential(paddle.nn.Linear(5, 3), paddle.nn.Linear(3, 1))
                model[0].bias.stop_gradient = True  # frozen under weight decay
                params = list(model.parameters())
                if bucketed:
                    materialized(params, [0, 1, 0, 1], 64)
                opt = paddle.optimizer.AdamW(0.1, parameters=params, weight_decay=0.5)
                x = paddle.to_tensor(np.linspace(-1, 1, 20, dtype="float32").reshape([4, 5]))
                for _ in range(3):
                    model(x).square().mean().backward()
                    opt.step()
                    opt.clear_grad()
            return values(params), sorted(opt.state_dict()), model
        off, off_keys, off_model = train(False)
        on, on_keys, on_model = train(True)
        for a, b in zip(off, on):
            np.testing.assert_array_equal(a, b)
        self.assertEqual(off_keys, on_keys)
        self.assertEqual(sorted(off_model.state_dict()), sorted(on_model.state_dict()))

    def test_set_state_dict_lands_in_the_bucket(self):
        model = paddle.nn.Linear(4, 3)
        params = list(model.parameters())
        storage = materialized(params, [0, 0], MB)
        ptrs = [p.data_ptr() for p in params]
        new = {k: paddle.full(v.shape, 3.0, v.dtype) for k, v in model.state_dict().items()}
        model.set_state_dict(new)
        self.assertEqual([p.data_ptr() for p in params], ptrs)
        self.assertTrue((storage.buffers[0].numpy()[: 12] == 3.0).all())

    def test_memory_handed_in_by_a_loader_is_rebound_into_its_slot(self):
        model = paddle.nn.Linear(4, 3)
        params = list(model.parameters())
        storage = materialized(params, [0, 0], MB)
        slot = params[0].data_ptr()
        self.assertEqual(storage.rebind(METHOD), [])
        fresh = paddle.full([4, 3], 5.0, "float32")
        params[0].get_tensor()._share_data_with(fresh.get_tensor())  # a loader that hands tensors
        self.assertNotEqual(params[0].data_ptr(), slot)
        self.assertEqual(storage.rebind(METHOD), [0])
        self.assertEqual(params[0].data_ptr(), slot)
        self.assertEqual(params[0].shape, [4, 3])
        self.assertTrue((storage.buffers[0].numpy()[:12] == 5.0).all())
        fresh.set_value(paddle.zeros([4, 3]))  # no longer shared
        self.assertTrue((params[0].numpy() == 5.0).all())
        self.assertEqual(storage.rebind(METHOD), [])

    def test_rebind_through_the_plan_counts_what_it_put_back(self):
        model = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 2))
        params = list(model.parameters())
        plan = planned(params, [0, 1, 0, 1], MB, order=[3, 2, 1, 0])
        units = plan.units()
        for i in (1, 3):
            paddle.full(params[i].shape, 2.0)._share_buffer_to(params[i])
        self.assertEqual(plan.prepare(METHOD), 2)
        self.assertIs(plan.units(), units)  # same buckets, same units
        for i in (1, 3):
            self.assertTrue(any(in_buffer(u.tensor, params[i]) for u in units))
        self.assertEqual(plan.prepare(METHOD), 0)

    def test_dtype_change_is_refused_naming_the_parameter_nothing_rebound(self):
        model = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 2))
        params = list(model.parameters())
        storage = materialized(params, [0, 1, 0, 1], MB, order=[3, 2, 1, 0])
        moved = paddle.full([4, 3], 1.0)
        moved._share_buffer_to(params[0])  # replaced, would be rebound
        model[1].to(dtype="float16")
        with self.assertRaises(ValueError) as ctx:
            storage.rebind(METHOD)
        message = str(ctx.exception)
        self.assertIn(f"parameter {params[3].name} changed from float32 x 2 elements to float16 x 2", message)
        self.assertIn(f"optimizer.{METHOD}(False)", message)
        self.assertEqual(params[0].data_ptr(), moved.data_ptr())  # checked before anything moved

    def test_spec_from_another_list_is_refused(self):
        params = build([((3,), "float32", False)])
        other = build([((4,), "float32", False)])
        specs = plan_buckets([0], params, [0], MB)
        with self.assertRaises(ValueError):
            BucketStorage(specs, other, [0], [0])


class TestFusedSlices(unittest.TestCase):
    """Parameters already living in a fused buffer (tensor fusion): slices."""

    def fused(self, layout):
        """Six float32 parameters of 16 elements, laid out in one buffer in
        ``layout`` order (as tensor fusion lays them out by size)."""
        params = build([((16,), "float32", False)] * 6)
        storage = materialized(params, [0] * 6, MB, order=layout)
        return params, storage.buffers[0]

    def test_neighbours_in_a_window_share_a_slice(self):
        params, buf = self.fused([0, 1, 2, 3, 4, 5])
        plan = plan_fused_slices(list(range(6)), params, [0] * 6, 3 * 64, [buf])
        self.assertEqual([(s.window, s.indices, k) for s, k, _ in plan], [(0, (0, 1, 2), 0), (1, (3, 4, 5), 0)])
        unit = ALIGN_BYTES // 4
        self.assertEqual([b for _, _, b in plan], [0, 3 * unit])
        self.assertEqual(plan[0][0].offsets, (0, unit, 2 * unit))

    def test_scattered_layout_gives_one_slice_per_run_never_overlapping(self):
        params, buf = self.fused([3, 0, 4, 1, 5, 2])
        plan = plan_fused_slices(list(range(6)), params, [0] * 6, 3 * 64, [buf])
        self.assertEqual([s.indices for s, _, _ in plan], [(0,), (1,), (2,), (3,), (4,), (5,)])
        spans = sorted((b, b + s.length) for s, _, b in plan)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            self.assertLessEqual(end, start)
        units = unit_plan.FusedSlices([0] * 6, 3 * 64, [buf]).plan(list(range(6)), params, GROUP).units()
        self.assertEqual([u.indices for u in units], [(0,), (1,), (2,), (3,), (4,), (5,)])
        for unit in units:  # each slice is its parameter's memory, in the fused buffer
            (p,) = unit.params
            self.assertEqual(unit.tensor.data_ptr(), p.data_ptr())
            self.assertTrue(in_buffer(buf, unit.tensor))

    def test_parameter_outside_the_buffers_is_refused(self):
        params, buf = self.fused([0, 1, 2, 3, 4, 5])
        stray = build([((16,), "float32", False)])
        with self.assertRaises(ValueError):
            plan_fused_slices([0, 1], [params[0], stray[0]], [0, 0], MB, [buf])


# 24 layers: 96 MiB of parameters in a peak RSS of about 730 MiB (measured), so a second copy of
# them kept by the buckets (+13%) fails the 1% criterion, which leaves 7 MiB, less than one bucket.
MEMORY_LAYERS = 24
MEMORY_SCRIPT = r"""
import resource, sys, numpy as np, paddle
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.broadcast_buckets import (
    BucketStorage, plan_buckets)
paddle.seed(0)
layers = [paddle.nn.Linear(1024, 1024) for _ in range(LAYERS)]   # LAYERS x 4 MB weights + biases
params = [p for l in layers for p in l.parameters()]
if sys.argv[1] == "buckets":
    order = list(range(len(params)))
    src = [i % 2 for i in order]
    s = BucketStorage(plan_buckets(order, params, src, 8 << 20), params, src, order)
    s.materialize()
opt = paddle.optimizer.AdamW(1e-3, parameters=params)
x = paddle.ones([8, 1024])
for _ in range(2):
    h = x
    for l in layers:
        h = l(h)
    h.mean().backward(); opt.step(); opt.clear_grad()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


class TestMemory(unittest.TestCase):
    def test_peak_memory_within_one_percent(self):
        peaks = {}
        # never under coverage (its subprocess patch starts it from COVERAGE_* variables): the tracer's own memory
        # would be in the peaks compared; the buckets' code is covered in-process above
        env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
        for mode in ("per_parameter", "buckets"):
            out = subprocess.run(
                [sys.executable, "-c", f"LAYERS = {MEMORY_LAYERS}\n" + MEMORY_SCRIPT, mode], capture_output=True,
                text=True, check=True, env={**env, "OMP_NUM_THREADS": "1"},
            )
            peaks[mode] = int(out.stdout.strip().splitlines()[-1])
        param_bytes = MEMORY_LAYERS * (1024 * 1024 + 1024) * 4
        ratio = peaks["buckets"] / peaks["per_parameter"]
        print(f"peak RSS per-parameter {peaks['per_parameter'] / MB:.1f} MiB, buckets "
              f"{peaks['buckets'] / MB:.1f} MiB, ratio {ratio:.4f}; params "
              f"{param_bytes / MB:.1f} MiB, difference "
              f"{(peaks['buckets'] - peaks['per_parameter']) / param_bytes:+.2%} of them")
        self.assertLess(ratio, 1.01)


if __name__ == "__main__":
    unittest.main()
