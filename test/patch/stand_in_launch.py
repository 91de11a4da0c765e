# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""What the test base of a checkout-like tree runs (``make_patch.test_base_stand_in``): the driver's
per-rank script on 2 ranks through this project's launcher, with the patched Paddle (never the overlay),
each CPU rank given the test-only CPU shim's site items from outside (nothing of it is in the tree).

Two ways, chosen by the environment:

- ``$PATCHED_TREE_COLLECT`` set (a file): the driver's call is recorded there (its test, the script, the
  launch settings) and nothing is launched; ``python stand_in_launch.py`` then launches every recorded
  script of one setting in one 2-rank launch (:mod:`chained_scripts`: the scripts one after the other in
  each rank's process), so a PR's drivers cost one Paddle start-up per rank instead of one per driver;
  ``python stand_in_launch.py DRIVER...`` runs the drivers that record them first, in the same process
  (:func:`collect_and_launch`: one Paddle import for both);
  with ``$PATCHED_TREE_PROBE_MODULES`` each such launch also records what its ranks imported
  (``{"probe": [rank 0's, rank 1's]}``, :func:`chained_scripts.probe`);
- otherwise each call launches its script at once.

Either way every script is recorded, one JSON line in ``$PATCHED_TREE_RECORD`` (when set): the driver's
test, the script, and on each rank the number in the script's closing ``N passed`` line (None when a rank
printed none), so a driver that ran nothing cannot pass unnoticed.
"""

import json
import os
import re
import sys
import unittest

from collective_launch import launch_collective

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CPU_SITE = os.path.join(ROOT, "tools", "collective", "cpu_site")
RECORD_ENV = "PATCHED_TREE_RECORD"
COLLECT_ENV = "PATCHED_TREE_COLLECT"
PROBE_ENV = "PATCHED_TREE_PROBE_MODULES"  # chained_scripts.probe's modules: recorded as {"probe": per rank}
CHAIN = os.path.join(HERE, "chained_scripts.py")
DRIVERS_FAILED = 3  # collect_and_launch's exit code when a driver failed


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


def _launch_env(allocator_strategy, need_envs):
    env = {"FLAGS_allocator_strategy": allocator_strategy, **(need_envs or {})}
    env["PADDLE_OVERLAY_CPU_SHIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (CPU_SITE, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _record(entries):
    record = os.environ.get(RECORD_ENV)
    if record:
        with open(record, "a") as f:
            f.writelines(json.dumps(e) + "\n" for e in entries)
    failed = [e for e in entries if "passed" in e and not all(e["passed"])]
    if failed:
        raise AssertionError("ran no case on every rank (passed per rank): "
                             + ", ".join(f"{e['script']}: {e['passed']}" for e in failed))


def run(test_case, target_file_name, allocator_strategy, need_envs):
    script = _script(test_case, target_file_name)
    collect = os.environ.get(COLLECT_ENV)
    if collect:
        with open(collect, "a") as f:
            f.write(json.dumps({"test": test_case.id(), "script": script, "allocator_strategy": allocator_strategy,
                                "need_envs": need_envs or {}}) + "\n")
        return None
    result = launch_collective(script, nproc=2, env=_launch_env(allocator_strategy, need_envs))
    _record([{"test": test_case.id(), "script": os.path.basename(script),
              "passed": passed_counts(result.rank_logs)}])
    return result


def segments(rank_log):
    """{script name: its part of one rank's log} from the markers :mod:`chained_scripts` prints."""
    parts = re.split(r"^=== chained script (\S+)$", rank_log, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def run_collected(collect):
    """Launch the scripts recorded in ``collect``: one chained 2-rank launch per launch setting, in the
    order recorded; each script's ``N passed`` counts read from its own part of each rank's log."""
    with open(collect) as f:
        calls = [json.loads(line) for line in f]
    groups = {}
    for call in calls:
        key = json.dumps([call["allocator_strategy"], call["need_envs"]], sort_keys=True)
        groups.setdefault(key, []).append(call)
    for group in groups.values():
        env = _launch_env(group[0]["allocator_strategy"], group[0]["need_envs"])
        env[f"{COLLECT_ENV}_SCRIPTS"] = os.pathsep.join(call["script"] for call in group)
        result = launch_collective(CHAIN, nproc=2, env=env)
        if os.environ.get(PROBE_ENV):
            probes = [re.findall(r"^=== probe (.*)$", log, re.M) for log in result.rank_logs]
            _record([{"probe": [json.loads(p[-1]) if p else None for p in probes]}])
        parts = [segments(log) for log in result.rank_logs]
        entries = []
        for call in group:
            logs = [p.get(os.path.basename(call["script"]), "") for p in parts]
            called = [re.findall(r"^=== cases called (.*)$", log, re.M) for log in logs]
            entries.append({"test": call["test"], "script": os.path.basename(call["script"]),
                            "passed": passed_counts(logs),
                            "called": [c[-1].split(",") if c and c[-1] else [] for c in called]})
        _record(entries)


def collect_and_launch(drivers):
    """``python -m unittest -v DRIVER...`` in this process with ``$PATCHED_TREE_COLLECT`` set (the drivers'
    calls recorded, nothing launched), then :func:`run_collected`: one Paddle import for both. Exit code 0,
    :data:`DRIVERS_FAILED` when a driver failed (nothing launched), 1 when a launch failed."""
    sys.path.insert(0, os.getcwd())  # as `python -m` puts it first: the drivers are imported from there
    program = unittest.main(module=None, argv=["python -m unittest", "-v", *drivers], exit=False)
    if not program.result.wasSuccessful():
        return DRIVERS_FAILED
    run_collected(os.environ[COLLECT_ENV])
    return 0


if __name__ == "__main__":
    sys.exit(collect_and_launch(sys.argv[1:]) if len(sys.argv) > 1 else run_collected(os.environ[COLLECT_ENV]))
