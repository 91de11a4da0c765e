# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""examples/paddleformers/check_results.py on hand-made results (no PaddleFormers needed)."""

import contextlib
import io
import os
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "paddleformers"))
import check_results  # noqa: E402

LOSSES = np.array([6.5, 6.25, 6.0, 5.75], dtype="float32")
PARAMS = {"param/w": np.arange(6, dtype="float32").reshape(2, 3), "param/b": np.ones(3, dtype="float32")}


def write(run_dir, applied, losses, params, order=2, hooks=3):
    os.makedirs(run_dir)
    np.savez(
        os.path.join(run_dir, "result.npz"),
        applied=np.array(applied),
        overlap_order=np.array(order if applied else 0),
        overlap_hooks=np.array(hooks if applied else 0),
        losses=losses,
        **params,
    )


class TestCheckResults(unittest.TestCase):
    def run_check(self, off_params=PARAMS, on_applied=1):
        with tempfile.TemporaryDirectory() as tmp:
            on, off, resume = (os.path.join(tmp, n) for n in ("on", "off", "resume"))
            write(on, on_applied, LOSSES, PARAMS)
            write(off, 0, LOSSES, off_params)
            write(resume, 1, LOSSES[2:], PARAMS)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = check_results.main([on, off, resume, "2"])
        return code, out.getvalue().splitlines()

    def test_all_equal_passes(self):
        code, lines = self.run_check()
        self.assertEqual(code, 0)
        self.assertEqual(lines[-1], "6 passed, 0 failed")

    def test_one_flipped_bit_fails_the_parameter_check(self):
        w = PARAMS["param/w"].copy()
        w.view("int32")[0, 1] ^= 1  # lowest mantissa bit of one value
        code, lines = self.run_check(off_params={**PARAMS, "param/w": w})
        self.assertEqual(code, 1)
        failed = [l for l in lines if l.startswith("FAIL")]
        self.assertEqual(len(failed), 1)
        self.assertIn("on vs off: parameters bitwise equal", failed[0])
        self.assertIn("['param/w']", failed[0])

    def test_overlay_not_applied_in_the_on_run_fails(self):
        code, lines = self.run_check(on_applied=0)
        self.assertEqual(code, 1)
        self.assertTrue(lines[0].startswith("FAIL  on: overlay applied"), lines[0])


if __name__ == "__main__":
    unittest.main()
