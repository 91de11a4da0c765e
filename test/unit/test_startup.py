"""PADDLE_OVERLAY start-up hook: parsing, and real interpreters of this venv.

The subprocess cases start this venv's own Python, so they go through the
``paddle_overlay_startup.pth`` that ``pip install .`` / ``pip install -e .``
put in site-packages (one process each; Paddle imported where a case says so).
"""

import os
import subprocess
import sys
import sysconfig
import unittest
from unittest import mock

from parameterized import parameterized

from paddle_overlay import _startup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTH_SOURCE = os.path.join(ROOT, "build_backend", "paddle_overlay_startup.pth")


def run_python(code, value):
    """Run ``code`` in a fresh interpreter with PADDLE_OVERLAY=value (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != _startup.ENV_VAR}
    if value is not None:
        env[_startup.ENV_VAR] = value
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


class TestParse(unittest.TestCase):
    @parameterized.expand([(v,) for v in ("1", "true", "TRUE", " yes ", "On")])
    def test_on(self, value):
        self.assertIs(_startup.parse(value), True)

    @parameterized.expand([(v,) for v in (None, "", "0", "false", "No", " off ")])
    def test_off(self, value):
        self.assertIs(_startup.parse(value), False)

    @parameterized.expand([(v,) for v in ("yes please", "2", "enable", "-1", "ture")])
    def test_bad_value_names_it_and_the_accepted_ones(self, value):
        with self.assertRaises(ValueError) as ctx:
            _startup.parse(value)
        message = str(ctx.exception)
        self.assertIn(f"PADDLE_OVERLAY={value!r}", message)
        self.assertIn("Set PADDLE_OVERLAY=1", message)
        self.assertIn("0 (or unset it)", message)

    def test_off_installs_nothing(self):
        before = list(sys.meta_path)
        self.assertFalse(_startup.install({"PADDLE_OVERLAY": "0"}))
        self.assertFalse(_startup.install({}))
        self.assertEqual(sys.meta_path, before)


class TestLauncherDetection(unittest.TestCase):
    @parameterized.expand(
        [
            ("launch", ["python", "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "t.py"], True),
            ("fleet_launch", ["python", "-u", "-m", "paddle.distributed.fleet.launch", "t.py"], True),
            ("rank", ["python", "-u", "train.py", "--lr", "1"], False),
            ("warnings_option", ["python", "-W", "ignore", "-m", "paddle.distributed.launch", "t.py"], True),
            ("other_module", ["python", "-m", "mytrain", "-m", "paddle.distributed.launch"], False),
            ("script_argument", ["python", "train.py", "-m", "paddle.distributed.launch"], False),
            ("command", ["python", "-c", "pass", "-m", "paddle.distributed.launch"], False),
        ]
    )
    def test_orig_argv(self, _name, argv, expected):
        with mock.patch.object(sys, "orig_argv", argv, create=True), mock.patch.object(sys, "argv", argv[1:]):
            self.assertIs(_startup._is_launcher_process(), expected)

    def test_fleetrun_console_script(self):
        argv = ["/venv/bin/python", "/venv/bin/fleetrun", "--gpus", "0,1", "train.py"]
        with mock.patch.object(sys, "orig_argv", argv, create=True), mock.patch.object(sys, "argv", argv[1:]):
            self.assertIs(_startup._is_launcher_process(), True)


class TestInstalledHook(unittest.TestCase):
    """What a real interpreter of this venv does at start-up."""

    @classmethod
    def setUpClass(cls):
        site_packages = sysconfig.get_paths()["purelib"]
        installed = os.path.join(site_packages, "paddle_overlay_startup.pth")
        if not os.path.isfile(installed):
            raise AssertionError(
                f"{installed} is missing: this venv's paddle_overlay was installed before the "
                f"start-up hook existed; reinstall it: {sys.executable} -m pip install -e {ROOT} --no-deps"
            )
        with open(installed) as a, open(PTH_SOURCE) as b:
            assert a.read() == b.read(), f"{installed} differs from {PTH_SOURCE}; reinstall the project"

    def test_unset_imports_nothing(self):
        out = run_python(
            "import sys; print(sorted(m for m in sys.modules if m.startswith(('paddle', 'paddle_overlay'))),"
            " [type(f).__name__ for f in sys.meta_path if type(f).__name__ == '_AfterPaddleImport'])",
            None,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "[] []")

    def test_on_applies_once_paddle_is_imported_and_flags_set_before_still_count(self):
        # One interpreter for both (each start costs a Paddle import): the flag set before
        # `import paddle` is why the overlay waits for that import instead of importing Paddle
        # at start-up.
        out = run_python(
            "import os, sys\n"
            "print('paddle' in sys.modules, 'paddle_overlay._startup' in sys.modules)\n"
            "os.environ['FLAGS_check_nan_inf'] = '1'\n"
            "import paddle, paddle_overlay\n"
            "print(paddle_overlay.is_applied(), any(type(f).__name__ == '_AfterPaddleImport' for f in sys.meta_path))\n"
            "print(paddle.get_flags(['FLAGS_check_nan_inf'])['FLAGS_check_nan_inf'])\n",
            "1",
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split("\n")[:3], ["False True", "True False", "True"])
        announced = [l for l in out.stderr.splitlines() if l.startswith("paddle_overlay: applied to Paddle ")]
        self.assertEqual(len(announced), 1, out.stderr)

    def test_spec_looked_up_first_still_applies(self):
        # transformers (used by PaddleFormers/PaddleNLP) probes packages with find_spec.
        out = run_python(
            "import importlib.util, sys\n"
            "assert importlib.util.find_spec('paddle') is not None and 'paddle' not in sys.modules\n"
            "import paddle, paddle_overlay\n"
            "print(paddle_overlay.is_applied())\n",
            "1",
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip().splitlines()[-1], "True")

    def test_off_value_does_not_apply(self):
        out = run_python("import paddle, paddle_overlay; print(paddle_overlay.is_applied())", "0")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip().splitlines()[-1], "False")

    def test_bad_value_fails_import_paddle_with_the_message(self):
        out = run_python("import paddle", "yes please")
        self.assertNotEqual(out.returncode, 0)
        last = out.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith("ValueError: PADDLE_OVERLAY='yes please' is not understood."), last)
        ok = run_python("print('no paddle here')", "yes please")  # processes without Paddle run on
        self.assertEqual((ok.returncode, ok.stdout, ok.stderr), (0, "no paddle here\n", ""))


if __name__ == "__main__":
    unittest.main()
