# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/count_cases.py on a small made-up checkout, and on this one."""

import glob
import os
import pathlib
import textwrap

import count_cases

PATCH_SERIES = 'PRS = ({"files": ("paddle_overlay/x.py", "test/collective/fleet/carried.py"),},)\n'
HELPERS = '''\
import functools


def check(x):
    assert x, x
    if not x:
        raise AssertionError("no")
    raise ValueError("not an assertion")


def unused():
    assert False


class Checker:
    def method(self):
        assert True


compare = functools.partial(check, 1)
'''
SCRIPT = '''\
import functools

import helpers as h
from helpers import Checker, check


def case_plain():
    assert 1
    check(1)
    check(2)


def case_through_a_class():
    Checker().method()


case_assigned = functools.partial(h.compare)


TABLE = {"from_a_loop": (1, lambda: None), "other": (2, check)}
for _name, (_n, _fn) in TABLE.items():
    globals()[f"case_{_name}"] = functools.partial(h.compare, _n)

PICKED = {f"picked_{v}": functools.partial(check, v) for v in (1, 2)}


def launch_cases():
    return {**PICKED}
'''


def write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_lines_of_the_set_and_each_case_with_its_assertions(tmp_path):
    fleet = "test/collective/fleet"
    write(tmp_path, {
        "tools/patch_series.py": PATCH_SERIES,
        f"{fleet}/helpers.py": HELPERS,
        f"{fleet}/script.py": SCRIPT,
        f"{fleet}/carried.py": "def case_upstream():\n    assert 1\n",
        f"{fleet}/test_driver.py": "import unittest\n",
        "test/launcher/node.py": "def case_node():\n    assert 2\n",
    })
    files = count_cases.counted_files(str(tmp_path))
    assert files == {f"{fleet}/helpers.py": len(HELPERS.splitlines()), f"{fleet}/script.py": len(SCRIPT.splitlines())}
    script = f"{fleet}/script.py"
    expected = [
        (f"{fleet}/carried.py", "upstream", 1),
        (script, "assigned", 2),  # check's two, through the module-level partial
        (script, "from_a_loop", 2),  # the loop body's partial, not the other key's value
        (script, "other", 2),
        (script, "picked_1", 2),
        (script, "picked_2", 2),
        (script, "plain", 3),  # its own, and check's two (once, though called twice)
        (script, "through_a_class", 1),  # every method of a class it names
        ("test/launcher/node.py", "node", 1),
    ]
    assert count_cases.case_counts(str(tmp_path)) == expected
    lines = count_cases.report(str(tmp_path))
    assert lines[-1] == "total 9 cases, 16 assertions", lines
    assert f"  {script} plain 3" in lines and f"total {sum(files.values())} lines in 2 files" in lines


def test_this_checkout_lists_the_case_scripts():
    scripts = {path for path, _, _ in count_cases.case_counts(count_cases.ROOT)}
    assert "test/collective/fleet/dygraph_sharding_stage1_broadcast_overlap_models.py" in scripts, scripts
    assert "test/launcher/collective_multinode_overlap.py" in scripts, scripts


def test_dict_case_keys_come_from_constants_alone():
    module = count_cases.ast.parse(textwrap.dedent('''
        D = {f"k{a}{b}": a for a in (1, 2) for b in ("x",)}
    '''))
    assert sorted(count_cases._dict_cases(module.body[0].value)) == ["k1x", "k2x"]


def test_every_script_with_cases_is_launched_by_a_driver_of_its_folder():
    """A script whose cases no driver names runs nowhere (e.g. a group dropped from a launch's list): each one's
    file name is in some ``test_*.py`` of its folder (as a string: a driver's script or a group's)."""
    root = count_cases.ROOT
    scripts = {path for path, _, _ in count_cases.case_counts(root)}
    unnamed = []
    for path in sorted(scripts):
        folder, name = os.path.split(os.path.join(root, path))
        drivers = glob.glob(os.path.join(folder, "test_*.py"))
        if not any(f'"{name}"' in pathlib.Path(d).read_text() for d in drivers):
            unnamed.append(path)
    assert len(scripts) > 10 and unnamed == [], unnamed


def test_cases_ran_reads_each_log_format(tmp_path):
    """The three ways a rank log says a case passed, and a case that ran nowhere."""
    logs = {
        "runs/row/groups_script-ab12cd/workerlog.0": "CASE fleet_script[SETUP=v1]/grouped PASS (rank 0, 0.1 s)\n",
        "runs/row/own_script-x9/workerlog.1": "CASE plain PASS\nCASE failed FAIL (rank 1) boom\n",
        "patched/runs/chained_scripts-q1/workerlog.0": "=== chained script carried.py\n=== cases called case_a,case_b\n",
    }
    for rel, text in logs.items():
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).write_text(text)
    ran = count_cases.cases_ran([str(tmp_path / "runs"), str(tmp_path / "patched")])
    assert ran == {("fleet_script.py", "grouped"), ("own_script.py", "plain"), ("carried.py", "a"), ("carried.py", "b")}
