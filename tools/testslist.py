# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Read and check ``testslist.csv`` files in upstream Paddle's format.

Columns: ``name,os,arch,timeout,run_type,launcher,num_port,run_serial,envs,conditions``.
Lists inside a cell are separated by ``;``. ``timeout`` is in seconds (empty: upstream's
``bash_test_modules`` default of 350 s). Used by ``gen_ut_cmakelists.py`` (CMake entries)
and ``collective_runner.py`` (what to run, with which timeout, and what a row requires).
"""

import csv
import re
import sys
from dataclasses import dataclass

FIELDS = ("name", "os", "arch", "timeout", "run_type", "launcher", "num_port", "run_serial", "envs", "conditions")
DEFAULT_TIMEOUT = 350  # seconds, as upstream's bash_test_modules
OS_NAMES = ("LINUX", "APPLE", "WIN32")
ARCH_NAMES = ("GPU", "ROCM", "XPU", "ASCEND", "ASCEND_CL")
RUN_TYPES = ("NIGHTLY", "EXCLUSIVE", "CINN", "DIST", "GPUPS", "INFER", "EXCLUSIVE:NIGHTLY", "DIST:NIGHTLY")
_NAME_RE = re.compile(r"^test_[0-9A-Za-z_]+$")
_ENV_RE = re.compile(r"^[A-Za-z_][0-9A-Za-z_]*=[^ ]*$")


@dataclass(frozen=True)
class TestRow:
    """One row. Tuples hold the ``;``-separated items; ``timeout`` is seconds or None."""

    name: str
    os: tuple
    arch: tuple
    timeout: object
    run_type: str
    launcher: str
    num_port: int
    run_serial: bool
    envs: tuple
    conditions: tuple
    line: int = 0

    @property
    def timeout_seconds(self):
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUT

    def env_dict(self):
        """The ``envs`` cell as a dict (``KEY=VALUE`` items)."""
        return dict(item.split("=", 1) for item in self.envs)


def _items(cell):
    return tuple(x.strip() for x in cell.split(";") if x.strip())


def parse_row(cells, line=0):
    """Turn the 10 cells of one CSV line into a :class:`TestRow`; raises ValueError if malformed."""
    if len(cells) != len(FIELDS):
        raise ValueError(f"expected {len(FIELDS)} columns {FIELDS}, got {len(cells)}")
    c = dict(zip(FIELDS, (x.strip() for x in cells)))
    if not _NAME_RE.match(c["name"]):
        raise ValueError(f"name must look like test_[0-9A-Za-z_]+, got {c['name']!r}")
    os_ = tuple(x.upper() for x in _items(c["os"]))
    arch = tuple(x.upper() for x in _items(c["arch"]))
    for x in os_:
        if x not in OS_NAMES:
            raise ValueError(f"os must be among {OS_NAMES}, got {x!r}")
    for x in arch:
        if x not in ARCH_NAMES:
            raise ValueError(f"arch must be among {ARCH_NAMES}, got {x!r}")
    if c["timeout"] and not c["timeout"].isdigit():
        raise ValueError(f"timeout must be whole seconds, got {c['timeout']!r}")
    if c["run_type"] and c["run_type"] not in RUN_TYPES:
        raise ValueError(f"run_type must be among {RUN_TYPES}, got {c['run_type']!r}")
    if c["run_serial"] not in ("", "0", "1"):
        raise ValueError(f"run_serial must be 0, 1 or empty, got {c['run_serial']!r}")
    if c["num_port"] and not c["num_port"].isdigit():
        raise ValueError(f"num_port must be a whole number, got {c['num_port']!r}")
    envs = _items(c["envs"])
    for e in envs:
        if not _ENV_RE.match(e):
            raise ValueError(f"envs items must be NAME=VALUE without spaces, got {e!r}")
    if not c["launcher"]:
        raise ValueError("launcher is required (e.g. ../../legacy_test/dist_test.sh or test_runner.py)")
    return TestRow(
        name=c["name"], os=os_, arch=arch, timeout=int(c["timeout"]) if c["timeout"] else None,
        run_type=c["run_type"], launcher=c["launcher"], num_port=int(c["num_port"] or 0),
        run_serial=c["run_serial"] == "1", envs=envs, conditions=_items(c["conditions"]), line=line,
    )


def read_testslist(path):
    """All rows of ``path`` in file order. Raises ValueError naming ``path:line`` on a bad row."""
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


# --------------------------------------------------------------------------- requirements


def platform_facts(cuda=False, rocm=False, xpu=False):
    """CMake-style symbols known on this machine, for :func:`unmet_requirements`."""
    return {
        "LINUX": sys.platform.startswith("linux"),
        "APPLE": sys.platform == "darwin",
        "WIN32": sys.platform.startswith("win"),
        "WITH_GPU": cuda,
        "WITH_NCCL": cuda,
        "WITH_ROCM": rocm,
        "WITH_RCCL": rocm,
        "WITH_XPU": xpu,
        "WITH_TESTING": True,
    }


_TOKEN_RE = re.compile(r"\s*(\(|\)|[A-Za-z_][A-Za-z0-9_]*)")


def eval_condition(expr, facts):
    """Evaluate a CMake condition made of symbols, AND, OR, NOT and parentheses.

    Returns True/False; raises ValueError for anything else (e.g. ``VERSION_GREATER_EQUAL``)
    or an unknown symbol.
    """
    pos, out = 0, []
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if not m:
            raise ValueError(f"cannot evaluate condition {expr!r}")
        tok = m.group(1)
        pos = m.end()
        if tok in ("(", ")"):
            out.append(tok)
        elif tok in ("AND", "OR", "NOT"):
            out.append(tok.lower())
        elif tok in facts:
            out.append(str(bool(facts[tok])))
        else:
            raise ValueError(f"unknown symbol {tok!r} in condition {expr!r}")
    try:
        return bool(eval(" ".join(out), {"__builtins__": {}}, {}))  # only True/False/and/or/not/()
    except SyntaxError:
        raise ValueError(f"cannot evaluate condition {expr!r}") from None


def unmet_requirements(row, device, facts):
    """Reasons (list of str) why ``row`` cannot run on ``device`` (``cpu``/``gpu``) here; empty if it can."""
    reasons = []
    if row.os and not any(facts.get(o) for o in row.os):
        reasons.append(f"needs os {' or '.join(row.os)}")
    if row.arch:
        here = {"cpu": (), "gpu": ("GPU",)}.get(device, ())
        if not set(row.arch) & set(here):
            reasons.append(f"needs arch {' or '.join(row.arch)}, running on {device}")
    for cond in row.conditions:
        try:
            ok = eval_condition(cond, facts)
        except ValueError as e:
            reasons.append(str(e))
            continue
        if not ok:
            reasons.append(f"condition {cond} is false here")
    return reasons
