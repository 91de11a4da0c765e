# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Read ``testslist.csv`` files in upstream Paddle's format, and what a row requires here.

Columns: ``name,os,arch,timeout,run_type,launcher,num_port,run_serial,envs,conditions``; lists in a
cell are ``;``-separated; ``timeout`` in seconds (empty: upstream's ``bash_test_modules`` default,
350 s). Used by ``collective_runner.py`` and ``make_patch.py``.
"""

import collections
import csv
import re
import sys

FIELDS = ("name", "os", "arch", "timeout", "run_type", "launcher", "num_port", "run_serial", "envs", "conditions")
DEFAULT_TIMEOUT = 350  # seconds, as upstream's bash_test_modules
OS_NAMES = ("LINUX", "APPLE", "WIN32")
ARCH_NAMES = ("GPU", "ROCM", "XPU", "ASCEND", "ASCEND_CL")
RUN_TYPES = ("NIGHTLY", "EXCLUSIVE", "CINN", "DIST", "GPUPS", "INFER", "EXCLUSIVE:NIGHTLY", "DIST:NIGHTLY")


class TestRow(collections.namedtuple("TestRow", FIELDS + ("line",))):
    """One row. Tuples hold the ``;``-separated items; ``timeout`` is seconds or None."""

    @property
    def timeout_seconds(self):
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUT

    def env_dict(self):
        return dict(item.split("=", 1) for item in self.envs)


def _items(cell, upper=False):
    return tuple(x.strip().upper() if upper else x.strip() for x in cell.split(";") if x.strip())


def parse_row(cells, line=0):
    """The 10 cells of one CSV line as a :class:`TestRow`; ValueError if malformed."""
    if len(cells) != len(FIELDS):
        raise ValueError(f"expected {len(FIELDS)} columns {FIELDS}, got {len(cells)}")
    c = dict(zip(FIELDS, (x.strip() for x in cells)))
    os_, arch, envs = _items(c["os"], True), _items(c["arch"], True), _items(c["envs"])
    checks = [  # (bad, message)
        (not re.fullmatch(r"test_[0-9A-Za-z_]+", c["name"]),
         f"name must look like test_[0-9A-Za-z_]+, got {c['name']!r}"),
        *((x not in OS_NAMES, f"os must be among {OS_NAMES}, got {x!r}") for x in os_),
        *((x not in ARCH_NAMES, f"arch must be among {ARCH_NAMES}, got {x!r}") for x in arch),
        (c["timeout"] and not c["timeout"].isdigit(), f"timeout must be whole seconds, got {c['timeout']!r}"),
        (c["run_type"] not in ("", *RUN_TYPES), f"run_type must be among {RUN_TYPES}, got {c['run_type']!r}"),
        (c["run_serial"] not in ("", "0", "1"), f"run_serial must be 0, 1 or empty, got {c['run_serial']!r}"),
        (c["num_port"] and not c["num_port"].isdigit(), f"num_port must be a whole number, got {c['num_port']!r}"),
        *((not re.fullmatch(r"[A-Za-z_][0-9A-Za-z_]*=[^ ]*", e),
           f"envs items must be NAME=VALUE without spaces, got {e!r}") for e in envs),
        (not c["launcher"], "launcher is required (e.g. ../../legacy_test/dist_test.sh or test_runner.py)"),
    ]
    for bad, message in checks:
        if bad:
            raise ValueError(message)
    return TestRow(c["name"], os_, arch, int(c["timeout"]) if c["timeout"] else None, c["run_type"], c["launcher"],
                   int(c["num_port"] or 0), c["run_serial"] == "1", envs, _items(c["conditions"]), line)


def read_testslist(path):
    """All rows of ``path`` in file order; ValueError naming ``path:line`` on a bad row."""
    rows = []
    with open(path, newline="") as f:
        for line, cells in enumerate(csv.reader(f), start=1):
            if not cells or (line == 1 and cells[0].strip() == "name"):
                continue
            try:
                rows.append(parse_row(cells, line))
            except ValueError as e:
                raise ValueError(f"{path}:{line}: {e}") from None
    return rows


def platform_facts(cuda=False):
    """CMake-style symbols known on this machine, for :func:`unmet_requirements`."""
    return {"LINUX": sys.platform.startswith("linux"), "APPLE": sys.platform == "darwin",
            "WIN32": sys.platform.startswith("win"), "WITH_GPU": cuda, "WITH_NCCL": cuda, "WITH_ROCM": False,
            "WITH_RCCL": False, "WITH_XPU": False, "WITH_TESTING": True}


def eval_condition(expr, facts):
    """A CMake condition of symbols, AND, OR, NOT and parentheses; ValueError for anything else."""
    words = {"AND": "and", "OR": "or", "NOT": "not", "(": "(", ")": ")"}
    python = []
    for token in re.findall(r"\w+|\S", expr):
        if token not in words and token not in facts:
            raise ValueError(f"unknown symbol or operator {token!r} in condition {expr!r}")
        python.append(words[token] if token in words else str(bool(facts[token])))
    try:  # only Python's and, or, not, parentheses, True and False are left to evaluate
        return bool(eval(" ".join(python), {"__builtins__": {}}))
    except SyntaxError:
        raise ValueError(f"cannot evaluate condition {expr!r}") from None


def unmet_requirements(row, device, facts):
    """Why ``row`` cannot run on ``device`` (``cpu``/``gpu``) here (list of str); empty if it can."""
    reasons = [f"needs os {' or '.join(row.os)}"] if row.os and not any(facts.get(o) for o in row.os) else []
    if row.arch and not (device == "gpu" and "GPU" in row.arch):
        reasons.append(f"needs arch {' or '.join(row.arch)}, running on {device}")
    for cond in row.conditions:
        try:
            if not eval_condition(cond, facts):
                reasons.append(f"condition {cond} is false here")
        except ValueError as e:
            reasons.append(str(e))
    return reasons
