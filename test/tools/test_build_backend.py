"""build_backend/ (the package's build backend): the start-up .pth added to a wheel and recorded in its RECORD."""

import base64
import hashlib
import os
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKEND_DIR = os.path.join(ROOT, "build_backend")
import paddle_overlay_build_backend as backend  # noqa: E402


def make_wheel(path, files):
    """A minimal wheel: ``files`` (name -> bytes) plus a RECORD listing them."""
    record = "".join(backend.record_line(n, d) for n, d in files.items())
    record += "demo-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("demo-0.1.dist-info/RECORD", record)


class TestAddPth(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.wheel = os.path.join(self.tmp.name, "demo-0.1-py3-none-any.whl")
        self.files = {"demo/__init__.py": b"x = 1\n", "demo-0.1.dist-info/METADATA": b"Name: demo\n"}
        make_wheel(self.wheel, self.files)

    def tearDown(self):
        self.tmp.cleanup()

    def test_pth_at_top_and_recorded_with_its_hash(self):
        backend.add_pth(self.wheel)
        with open(backend.PTH_SOURCE, "rb") as f:
            pth = f.read()
        with zipfile.ZipFile(self.wheel) as z:
            self.assertEqual(z.read("paddle_overlay_startup.pth"), pth)
            for name, data in self.files.items():
                self.assertEqual(z.read(name), data)
            record = z.read("demo-0.1.dist-info/RECORD").decode().splitlines()
        digest = base64.urlsafe_b64encode(hashlib.sha256(pth).digest()).rstrip(b"=").decode()
        self.assertIn(f"paddle_overlay_startup.pth,sha256={digest},{len(pth)}", record)
        self.assertEqual(len(record), len(self.files) + 2)

    def test_twice_refused(self):
        backend.add_pth(self.wheel)
        with self.assertRaisesRegex(ValueError, "paddle_overlay_startup.pth present: True"):
            backend.add_pth(self.wheel)

    def test_pth_is_one_import_line_reading_the_variable(self):
        # site.py executes a .pth line only when it starts with "import".
        with open(backend.PTH_SOURCE) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0].startswith("import os;"))
        self.assertIn('os.environ.get("PADDLE_OVERLAY")', lines[0])

    def test_pyproject_uses_this_backend(self):
        with open(os.path.join(ROOT, "pyproject.toml")) as f:
            lines = f.read().splitlines()
        self.assertIn('build-backend = "paddle_overlay_build_backend"', lines)
        self.assertIn('backend-path = ["build_backend"]', lines)

    def test_license_is_an_spdx_string_and_its_setuptools_required(self):
        # The TOML-table form ({ text = ... }) warns on every build and stops building with
        # setuptools releases after 2027-02-18; the string form needs setuptools>=77, which
        # needs Python 3.9.
        with open(os.path.join(ROOT, "pyproject.toml")) as f:
            lines = f.read().splitlines()
        self.assertIn('license = "Apache-2.0"', lines)
        self.assertIn('requires = ["setuptools>=77"]', lines)
        self.assertIn('requires-python = ">=3.9"', lines)


if __name__ == "__main__":
    unittest.main()
