# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/v2_upstream_faults.py is opt-in (it runs Paddle's own V2 overlap, not the product), so nothing in the
suite launches it: these checks keep what it names in step with the all-gather script and the document, without
Paddle (a renamed or merged case otherwise breaks the tool unseen)."""

import ast
import re

import v2_upstream_faults as tool


def script_cases():
    """The case names of the all-gather script: its ``case_*`` functions and the keys of its ``COMPARES`` table."""
    module = ast.parse(open(tool.SCRIPT).read())
    names = {n.name[len("case_"):] for n in module.body if isinstance(n, ast.FunctionDef) and n.name.startswith("case_")}
    for node in module.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COMPARES"]:
            names |= {key.value for key in node.value.keys}
    return names


def test_every_case_the_tool_runs_is_a_case_of_the_script():
    cases = script_cases()
    assert "equal_on_off" in cases and len(cases) > 10, sorted(cases)  # the parse found the table and the functions
    missing = sorted((set(tool.FAULTS) | set(tool.PASSES)) - cases)
    assert missing == [], f"tools/v2_upstream_faults.py names cases the script no longer has: {missing}"


def test_the_document_has_one_row_per_fault_and_the_baselines():
    text = open(tool.DOC).read()
    table = text[text.index(tool.BEGIN) + len(tool.BEGIN):text.index(tool.END)]
    rows = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert rows == list(tool.FAULTS), rows
    last = table.strip().splitlines()[-1]
    assert all(f"`{case}`" in last for case in tool.PASSES), last
