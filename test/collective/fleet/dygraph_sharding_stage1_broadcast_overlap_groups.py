# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: case groups of several per-rank scripts in one launch (Paddle's start-up costs seconds per rank and
launch).

Env ``BROADCAST_OVERLAP_GROUPS``: a JSON list of ``[script, cases(, env)]`` run in that order after one ``fleet.init``
(every script's ``init_fleet``, default ``sharding_cases.init_fleet``, must be the same): ``script`` a per-rank script
of this folder, imported (``env``: a copy of its own imported with these variables set); ``cases`` a comma list of the
cases a launch of it runs (``cases.launch_cases``), ``""`` for all. Each case prints ``CASE <script>[env]/<case>
PASS|FAIL``; the exit code is non-zero if any case failed or a group names an unknown script or case (then nothing
runs)."""

import importlib.util
import json
import os
import sys
import unittest.mock

import sharding_cases as cases


def load_groups(text):
    """[(label, {case: function}, names, notices)] of the groups in ``text``, and the fleet init they share; raises
    ValueError on a bad group. ``notices``: the script's ``NOTICES``, regexes of warnings its cases may raise."""
    groups, inits = [], set()
    for script, wanted, *env in json.loads(text):
        if not script.endswith(".py"):
            raise ValueError(f"{script!r} is not a per-rank script")
        label = script[: -len(".py")]
        module = importlib.import_module(label) if not env else imported_with(label, env[0])
        label += "".join(f"[{k}={v}]" for k, v in dict(*env).items())
        inits.add(getattr(module, "init_fleet", cases.init_fleet))
        found = cases.launch_cases(module)
        names = [n for n in wanted.split(",") if n] or list(found)
        unknown = [n for n in names if n not in found]
        if unknown:
            raise ValueError(f"{script}: unknown cases {unknown}; known: {sorted(found)}")
        groups.append((label, found, names, getattr(module, "NOTICES", ())))
    if len(inits) != 1:
        raise ValueError(f"the groups need {len(inits)} different fleet set-ups: one launch each")
    return groups, inits.pop()


def imported_with(name, env):
    """A copy of its own of the module ``name``, imported with the environment variables ``env`` set."""
    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    with unittest.mock.patch.dict(os.environ, env):
        spec.loader.exec_module(module)
    return module


def main():
    try:
        groups, init = load_groups(os.environ["BROADCAST_OVERLAP_GROUPS"])
    except (KeyError, ValueError) as e:
        print(f"bad BROADCAST_OVERLAP_GROUPS: {e!r}", flush=True)
        return 2
    init()
    failed, total = [], 0
    for label, found, names, notices in groups:
        print(f"GROUP {label}: {len(names)} case(s)", flush=True)
        total += len(names)
        failed += cases.run_named(found, names, f"{label}/", notices=notices)
    print(f"{total - len(failed)} passed, {len(failed)} failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
