# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""What the test base of a checkout-like tree runs (``make_patch.test_base_stand_in``): the driver's
per-rank script on 2 ranks through this project's launcher, with the patched Paddle (never the overlay),
each CPU rank given the test-only CPU shim's site items from outside (nothing of it is in the tree).

Every launch is recorded, one JSON line per launch in ``$PATCHED_TREE_RECORD`` (when set): the driver's
test, the script, and on each rank the number in the script's closing ``N passed`` line (None when a rank
printed none), so a driver that ran nothing cannot pass unnoticed.
"""

import json
import os
import re
import sys

from collective_launch import launch_collective

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_SITE = os.path.join(ROOT, "tools", "collective", "cpu_site")
RECORD_ENV = "PATCHED_TREE_RECORD"


def _script(test_case, target_file_name):
    """``target_file_name`` next to the driver (as upstream's ``dist_test.sh`` runs it from there)."""
    driver = getattr(sys.modules.get(type(test_case).__module__), "__file__", None) or ""
    beside = os.path.join(os.path.dirname(os.path.abspath(driver)), target_file_name)
    return beside if os.path.isfile(beside) else os.path.abspath(target_file_name)


def passed_counts(rank_logs):
    """Per rank: the N of the last ``N passed`` line, or None."""
    counts = []
    for log in rank_logs:
        found = re.findall(r"^(\d+) passed$", log, re.M)
        counts.append(int(found[-1]) if found else None)
    return counts


def run(test_case, target_file_name, allocator_strategy, need_envs):
    env = {"FLAGS_allocator_strategy": allocator_strategy, **(need_envs or {})}
    env["PADDLE_OVERLAY_CPU_SHIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (CPU_SITE, os.environ.get("PYTHONPATH", "")) if p)
    script = _script(test_case, target_file_name)
    result = launch_collective(script, nproc=2, env=env)
    counts = passed_counts(result.rank_logs)
    record = os.environ.get(RECORD_ENV)
    if record:
        with open(record, "a") as f:
            f.write(json.dumps({"test": test_case.id(), "script": os.path.basename(script), "passed": counts}) + "\n")
    if not all(counts):
        raise AssertionError(f"{os.path.basename(script)} ran no case on every rank (passed per rank: {counts}); "
                             f"logs: {result.log_dir}")
    return result
