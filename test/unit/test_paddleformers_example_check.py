# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""examples/paddleformers/check_results.py on hand-made results (no PaddleFormers needed)."""

import contextlib
import io
import os
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import check_results  # noqa: E402

LOSSES = np.array([6.5, 6.25, 6.0, 5.75], dtype="float32")
PARAMS = {"param/w": np.arange(6, dtype="float32").reshape(2, 3), "param/b": np.ones(3, dtype="float32")}


def write(run_dir, applied, losses, params, order=2, hooks=3, stage="v1", buffers=3):
    """A result.npz as train_tiny_llama.py writes it: V1 (broadcasts, no comm buffer)
    or V2 (one all-gather per comm buffer)."""
    os.makedirs(run_dir)
    v2 = stage == "v2"
    np.savez(
        os.path.join(run_dir, "result.npz"),
        applied=np.array(applied),
        overlap_order=np.array(order if applied else 0),
        overlap_hooks=np.array(hooks if applied else 0),
        overlap_units=np.array((buffers if v2 else 2) if applied else 0),
        overlap_all_gather=np.array(int(v2 and applied)),
        comm_buffers=np.array(buffers if v2 else 0),
        losses=losses,
        **params,
    )


class TestCheckResults(unittest.TestCase):
    def run_check(self, off_params=PARAMS, on_applied=1, stage="v1", expect=None, on_buffers=3):
        with tempfile.TemporaryDirectory() as tmp:
            on, off, resume = (os.path.join(tmp, n) for n in ("on", "off", "resume"))
            write(on, on_applied, LOSSES, PARAMS, stage=stage, buffers=on_buffers)
            write(off, 0, LOSSES, off_params, stage=stage)
            write(resume, 1, LOSSES[2:], PARAMS, stage=stage)
            out = io.StringIO()
            args = [on, off, resume, "2"] + ([expect] if expect else [])
            with contextlib.redirect_stdout(out):
                code = check_results.main(args)
        return code, out.getvalue().splitlines()

    def failed(self, lines):
        return [l for l in lines if l.startswith("FAIL")]

    def test_all_equal_passes(self):
        code, lines = self.run_check()
        self.assertEqual(code, 0)
        self.assertEqual(lines[-1], "7 passed, 0 failed")
        self.assertIn("on: V1, broadcasts", lines[2])

    def test_v2_all_equal_passes(self):
        code, lines = self.run_check(stage="v2", expect="v2")
        self.assertEqual(code, 0, lines)
        self.assertEqual(lines[-1], "7 passed, 0 failed")
        self.assertIn("on: V2, one all-gather per comm buffer", lines[2])

    def test_v2_expected_but_v1_ran_fails_the_stage_check_only(self):
        code, lines = self.run_check(stage="v1", expect="v2")
        self.assertEqual(code, 1)
        self.assertEqual(len(self.failed(lines)), 1)
        self.assertIn("on: V2, one all-gather per comm buffer", self.failed(lines)[0])

    def test_v2_with_fewer_units_than_comm_buffers_fails(self):
        with tempfile.TemporaryDirectory() as tmp:
            on, off, resume = (os.path.join(tmp, n) for n in ("on", "off", "resume"))
            write(on, 1, LOSSES, PARAMS, stage="v2", buffers=3)
            write(off, 0, LOSSES, PARAMS, stage="v2", buffers=4)  # off built another layout
            write(resume, 1, LOSSES[2:], PARAMS, stage="v2")
            with contextlib.redirect_stdout(io.StringIO()) as out:
                code = check_results.main([on, off, resume, "2", "v2"])
        failed = self.failed(out.getvalue().splitlines())
        self.assertEqual(code, 1)
        self.assertEqual(len(failed), 1)
        self.assertIn("comm_buffers=3 (off: 4)", failed[0])

    def test_v2_with_one_comm_buffer_fails(self):
        code, lines = self.run_check(stage="v2", expect="v2", on_buffers=1)
        self.assertEqual(code, 1)
        self.assertIn("on: V2", self.failed(lines)[0])

    def test_unknown_stage_is_a_usage_error(self):
        with self.assertRaises(SystemExit):
            check_results.main(["a", "b", "c", "2", "v3"])

    def test_one_flipped_bit_fails_the_parameter_check(self):
        w = PARAMS["param/w"].copy()
        w.view("int32")[0, 1] ^= 1  # lowest mantissa bit of one value
        code, lines = self.run_check(off_params={**PARAMS, "param/w": w})
        self.assertEqual(code, 1)
        failed = self.failed(lines)
        self.assertEqual(len(failed), 1)
        self.assertIn("on vs off: parameters bitwise equal", failed[0])
        self.assertIn("['param/w']", failed[0])

    def test_overlay_not_applied_in_the_on_run_fails(self):
        code, lines = self.run_check(on_applied=0)
        self.assertEqual(code, 1)
        self.assertTrue(lines[0].startswith("FAIL  on: overlay applied"), lines[0])


if __name__ == "__main__":
    unittest.main()
