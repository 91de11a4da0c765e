"""The patch's per-rank script (test/collective/fleet/dygraph_sharding_stage1_broadcast_overlap.py)
run as one process with the overlay applied: its case selection, and its GPU-only ``bf16`` case
refusing a device without bf16 before anything is set up (the driver skips there; the case's O1
runs are exercised on the CPU by the catalogue's ``..._bf16_cpu.py``)."""

import os
import subprocess
import sys
import unittest

import paddle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "test", "collective", "fleet", "dygraph_sharding_stage1_broadcast_overlap.py")


def run_script(cases):
    env = {**os.environ, "PADDLE_OVERLAY": "1", "PADDLE_OVERLAY_TEST_DEVICE": "cpu", "BROADCAST_OVERLAP_CASES": cases}
    return subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=300)


class TestPatchScriptCases(unittest.TestCase):
    def test_unknown_case_lists_the_cases_bf16_among_them(self):
        out = run_script("no_such_case")
        self.assertEqual(out.returncode, 2, out.stderr[-2000:])
        self.assertIn("unknown cases ['no_such_case']; known: ['on_off_bitwise', ", out.stdout)
        self.assertIn("'bf16']", out.stdout)

    @unittest.skipIf(paddle.amp.is_bfloat16_supported(), "this CPU has bf16")
    def test_bf16_case_refuses_a_device_without_bf16(self):
        out = run_script("bf16")
        self.assertEqual(out.returncode, 1, out.stdout[-2000:])
        self.assertIn("RuntimeError: bf16 is not supported on cpu; the driver should have skipped this test", out.stderr)


if __name__ == "__main__":
    unittest.main()
