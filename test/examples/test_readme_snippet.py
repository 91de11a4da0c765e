# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The README's training snippet is examples/readme_train.py, its checkpoint resumes, and
the race checker (PADDLE_OVERLAY_CHECK=1, report mode: it records, never waits) finds no read
of a pending parameter in it.

Runs with this venv's Paddle (``sys.executable``): run it once per Paddle venv.
"""

import json
import os
import re
import tempfile
import unittest

from collective_launch import launch_collective
from test_race_check_launch import summary_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNIPPET = os.path.join(ROOT, "examples", "readme_train.py")
CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "readme_train_check.py")
TIMEOUT = 240  # seconds for the 2-rank launch
PARAMS = ["l1.bias", "l1.weight", "l2.bias", "l2.weight"]


def readme_python_blocks():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), flags=re.S | re.M)


class TestReadmeSnippet(unittest.TestCase):
    def test_readme_block_is_the_file_verbatim(self):
        with open(SNIPPET) as f:
            snippet = f.read()
        blocks = readme_python_blocks()
        self.assertIn(
            snippet, blocks,
            "README.md has no ```python block equal to examples/readme_train.py; paste the file "
            "into the README's training block (or edit the file to match)",
        )

    def test_two_ranks_save_a_fresh_model_loads_it_and_no_read_races(self):
        out = tempfile.mkdtemp(prefix="readme-train-", dir=os.environ.get("PADDLE_OVERLAY_RUN_DIR"))
        result = launch_collective(
            CHECK, nproc=2, timeout=TIMEOUT, env={"README_TRAIN_DIR": out, "PADDLE_OVERLAY_CHECK": "1"})
        self.assertEqual(sorted(os.listdir(out)), ["model.pdparams"])
        for rank, log in enumerate(result.rank_logs):
            lines = [l for l in log.splitlines() if l.startswith("README-CHECK ")]
            self.assertEqual(len(lines), 1, f"rank {rank}: {result.log_dir}")
            report = json.loads(lines[0][len("README-CHECK "):])
            self.assertEqual(
                report,
                {
                    "rank": rank,
                    "file_keys": PARAMS,
                    "model_keys": PARAMS,
                    "values_equal": True,
                    "fresh_init_differed": True,
                    "overlay_applied": True,
                },
            )
            self.assertEqual(summary_lines(log, rank), (0, []), f"rank {rank}: {result.log_dir}")
            self.assertIn("none: every read waited for its sync", log)


if __name__ == "__main__":
    unittest.main()
