"""The virtual clock's benchmark finds what its ranks import (they run ``overlap_clock.py`` itself): the cases
module and the test-only CPU shim it imports from ``tools/collective``, with nothing else on the path."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_overlap_clock_imports_the_cases_module_and_the_shim_from_anywhere(tmp_path):
    code = ("import sys; sys.argv = ['overlap_clock.py']; "
            f"sys.path.insert(0, {HERE!r}); import overlap_clock, sharding_cases, hybrid_parallel_cpu_shim")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
