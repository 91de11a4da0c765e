# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The size of the collective tests' launched code, and every case with its assertion count.

    python3 tools/count_cases.py [--root CHECKOUT] [--ran FOLDER ...]

Prints, for the checkout at ``--root`` (default: this one):

1. the lines of *the launched per-rank scripts and helpers*: ``test/collective/fleet/*.py`` less the
   ``test_*.py`` drivers and the files the patches carry (the ``test/`` files of ``tools/patch_series.py``'s
   PRs, ``make_patch.TEST_FILES``), one line per file, then the total;
2. one line per case, ``<script> <case> <assertions>``, for every per-rank script of ``test/collective/fleet``
   and ``test/launcher`` (``test/harness`` in a checkout before its rename; every ``.py`` but the drivers)
   that has cases, then the totals.

With ``--ran``: instead, every case of (2) that no rank log (``workerlog.N``) below the ``FOLDER`` s shows
passing (:func:`cases_ran`), less :data:`NOT_RUN_HERE`; exit code 1 if there is one (``tools/run_tests.sh``
ends with it: a case dropped from every launch fails the suite).

Read with ``ast`` only (nothing is imported, no Paddle needed). A script's cases are what
``sharding_cases.cases_of()`` and a script's ``launch_cases()`` find: module-level functions ``case_<name>``,
module-level assignments to ``case_<name>``, the keys of a module-level dict that a module-level ``for`` loop
turns into ``case_`` globals, and the keys of a module-level dict that ``launch_cases()`` merges in (a dict
display, or a comprehension over constant tuples, its keys evaluated from those constants alone).

Rule of the count: a case's assertions are the ``assert`` statements and ``raise AssertionError`` statements
in its code and in every definition its code refers to, followed transitively, each statement counted once
per case. A case's code: its function (nested functions and lambdas included), or its assigned expression;
for a dict case, the dict's value for its key and the loop body or ``launch_cases()`` that makes it a case.
A definition is a module-level function, class (all its methods) or assignment (its value) of the script
or of a module it imports (found beside the script, in ``test/collective/fleet`` or in ``tools/collective``);
code refers to it by name (called or passed on, as ``functools.partial(f)`` or ``after_step=f``) or as
``module.name``. So an assertion in a shared helper counts for every case that reaches it, and moving
code into a helper changes no count.
"""

import argparse
import ast
import glob
import os
import re
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLEET = os.path.join("test", "collective", "fleet")
# test/launcher was test/harness before its rename: a checkout before it counts the same way
CASE_FOLDERS = (FLEET, os.path.join("test", "launcher"), os.path.join("test", "harness"))
MODULE_FOLDERS = (FLEET, os.path.join("tools", "collective"))


def patch_test_files(root):
    """Base names of the test files the patches carry (``tools/patch_series.py`` of ``root``)."""
    prs = runpy.run_path(os.path.join(root, "tools", "patch_series.py"))["PRS"]
    return {os.path.basename(p) for pr in prs for p in pr["files"] if p.startswith("test/")}


def counted_files(root):
    """The launched per-rank scripts and helpers: {path relative to ``root``: lines}."""
    carried = patch_test_files(root)
    files = {}
    for path in sorted(glob.glob(os.path.join(root, FLEET, "*.py"))):
        name = os.path.basename(path)
        if not name.startswith("test_") and name not in carried:
            with open(path) as f:
                files[os.path.relpath(path, root)] = len(f.read().splitlines())
    return files


class Module:
    """One parsed module: its definitions (name -> node) and imports (name -> (module, attribute or None))."""

    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.tree = ast.parse(f.read(), path)
        self.defs, self.imports = {}, {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = node.value
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (alias.name, None)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)


class Finder:
    """Parses modules by name (beside the script, then :data:`MODULE_FOLDERS`) and counts assertions."""

    def __init__(self, root):
        self.root, self.modules = root, {}

    def module(self, name, near):
        for folder in (near,) + tuple(os.path.join(self.root, f) for f in MODULE_FOLDERS):
            path = os.path.join(folder, name.replace(".", os.sep) + ".py")
            if os.path.isfile(path):
                if path not in self.modules:
                    self.modules[path] = Module(path)
                return self.modules[path]
        return None

    def resolve(self, module, name, attr=None):
        """The definition ``name`` (``name.attr`` when ``name`` is a module) refers to in ``module``, as
        ``(module, node)``, or None when it is not one of ours."""
        if attr is None and name in module.defs:
            return module, module.defs[name]
        if name not in module.imports:
            return None
        source, imported = module.imports[name]
        near = os.path.dirname(module.path)
        if imported is None:  # import source [as name]
            target = self.module(source, near)
            return target and attr is not None and self.resolve(target, attr)
        target = self.module(source, near)
        if target is not None and attr is None:  # from source import imported [as name]
            return self.resolve(target, imported)
        target = self.module(f"{source}.{imported}", near)  # from package import module
        return target and attr is not None and self.resolve(target, attr)

    def assertions(self, module, nodes, skip=()):
        """Assertion statements reachable from ``nodes`` (of ``module``) but through ``skip``: a set of (path,
        line, column)."""
        found, todo = set(), [(module, n) for n in nodes]
        seen = {(module.path, id(n)) for n in skip}
        while todo:
            mod, node = todo.pop()
            if (mod.path, id(node)) in seen:
                continue
            seen.add((mod.path, id(node)))
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assert) or (isinstance(sub, ast.Raise) and _raises_assertion(sub)):
                    found.add((mod.path, sub.lineno, sub.col_offset))
                ref = None
                if isinstance(sub, ast.Name):
                    ref = self.resolve(mod, sub.id)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                    ref = self.resolve(mod, sub.value.id, sub.attr)
                if ref:
                    todo.append(ref)
        return found


def _raises_assertion(node):
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "AssertionError"


def _dict_cases(value):
    """{key: value node} of a dict display with string keys, or of a comprehension over constant tuples."""
    if isinstance(value, ast.Dict):
        return {k.value: v for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant)}
    if isinstance(value, ast.DictComp):
        keys = ast.Expression(ast.ListComp(elt=value.key, generators=value.generators))
        code = compile(ast.fix_missing_locations(keys), "<keys>", "eval")
        return {key: value.value for key in eval(code, {"__builtins__": {}})}
    return {}


def _names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def cases(module):
    """{case name: ([code nodes], [nodes not followed])} of a per-rank script (see the module docstring): a
    dict case does not reach the other keys' values through its dict."""
    found = {}
    for name, node in module.defs.items():
        if name.startswith("case_"):
            found[name[len("case_"):]] = ([node], [])
    dicts = {name: node for name, node in module.defs.items() if isinstance(node, (ast.Dict, ast.DictComp))}
    makers = [n for n in module.tree.body if isinstance(n, ast.For) and "globals" in _names_in(n)]
    launch = module.defs.get("launch_cases")
    if isinstance(launch, ast.FunctionDef):
        makers.append(launch)
    for maker in makers:
        for name in sorted(_names_in(maker) & set(dicts)):
            for key, value in _dict_cases(dicts[name]).items():
                found.setdefault(key, ([value, maker], [dicts[name]]))
    return found


def case_counts(root):
    """[(script path relative to ``root``, case, assertions)] of every per-rank script with cases."""
    finder, found = Finder(root), []
    for folder in CASE_FOLDERS:
        for path in sorted(glob.glob(os.path.join(root, folder, "*.py"))):
            if os.path.basename(path).startswith("test_"):
                continue
            module = finder.module(os.path.basename(path)[:-3], os.path.dirname(path))
            for name, (nodes, skip) in sorted(cases(module).items()):
                found.append((os.path.relpath(path, root), name, len(finder.assertions(module, nodes, skip))))
    return found


# (script, case) that no CPU launch of the suite runs, and why
NOT_RUN_HERE = {
    ("dygraph_sharding_stage1_broadcast_overlap.py", "bf16"): "GPU only: its driver skips on the CPU",
    ("dygraph_sharding_stage1_v2_allgather_overlap.py", "bf16"): "GPU only: its driver skips on the CPU",
    ("dygraph_sharding_stage1_broadcast_overlap_hybrid.py", "paddle_moment_sync_owners_differ_hangs"):
        "Paddle's own hang, overlap off: its launch must time out, so it never passes",
}


def cases_ran(folders):
    """{(script file name, case)} that the rank logs below ``folders`` show passing: ``CASE [<script>[<env>]/]<case>
    PASS`` lines (``sharding_cases.run_named``; without a script, the launch folder's, ``<script stem>-<suffix>``) and
    the patched tree's ``=== cases called case_<name>,...`` after ``=== chained script <script>``."""
    ran = set()
    for folder in folders:
        for log in glob.glob(os.path.join(folder, "**", "workerlog.*"), recursive=True):
            script = os.path.basename(os.path.dirname(log)).rsplit("-", 1)[0] + ".py"
            with open(log, errors="replace") as f:
                for line in f:
                    chained = re.match(r"=== chained script (\S+)$", line)
                    called = re.match(r"=== cases called (.*)$", line)
                    passed = re.match(r"CASE (\S+) PASS\b", line)
                    if chained:
                        script = chained.group(1)
                    elif called:
                        ran |= {(script, c[len("case_"):]) for c in called.group(1).split(",") if c}
                    elif passed:
                        label, _, case = passed.group(1).rpartition("/")
                        ran.add((re.sub(r"\[.*\]$", "", label) + ".py" if label else script, case))
    return ran


def not_ran(counts, folders):
    """[(script path, case)] of ``counts`` (:func:`case_counts`) that :func:`cases_ran` did not see, less
    :data:`NOT_RUN_HERE`."""
    ran = cases_ran(folders)
    return [(path, case) for path, case, _ in counts
            if (os.path.basename(path), case) not in ran and (os.path.basename(path), case) not in NOT_RUN_HERE]


def report(root):
    """The printed lines."""
    files, found = counted_files(root), case_counts(root)
    lines = ["launched per-rank scripts and helpers (test/collective/fleet/*.py less the test_*.py drivers and"
             " the patches' files):"]
    lines += [f"  {path} {n}" for path, n in files.items()]
    lines.append(f"total {sum(files.values())} lines in {len(files)} files")
    lines.append("cases (script case assertions):")
    lines += [f"  {path} {name} {n}" for path, name, n in found]
    lines.append(f"total {len(found)} cases, {sum(n for _, _, n in found)} assertions")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=ROOT, help="the checkout to count (default: this one)")
    parser.add_argument("--ran", nargs="+", metavar="FOLDER", help="list the cases no rank log below these folders "
                        "shows passing (exit code 1 if any)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    if not args.ran:
        print("\n".join(report(root)))
        return 0
    counts = case_counts(root)
    missing = not_ran(counts, args.ran)
    for path, case in missing:
        print(f"not run: {path} {case}")
    total = len(counts)
    print(f"{total - len(missing) - len(NOT_RUN_HERE)} of {total} cases passed in some launch, {len(missing)} in "
          f"none; not run here: {'; '.join(f'{s} {c} ({why})' for (s, c), why in NOT_RUN_HERE.items())}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
