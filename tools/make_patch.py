#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Turn the overlay source into a ``git apply``-able patch for a Paddle tree (docs/patches.md).

:data:`NEW_MODULES` and :data:`TEST_FILES` are added byte for byte (their ``testslist.csv`` rows go in
the header); each class of :data:`SPLICED` has its methods spliced into Paddle's class of the same
name. The patch is ``git diff`` in a throw-away repository without the user's git configuration:
same inputs, same bytes. Exit codes: 0 ok, 2 bad input (the message says what to fix).
"""

import argparse
import ast
import builtins
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import symtable
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testslist  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERLAY_DIR = os.path.join(ROOT, "paddle_overlay", "distributed", "fleet", "meta_optimizers", "dygraph_optimizer")
TEST_DIR = os.path.join(ROOT, "test", "collective", "fleet")
PATCH_DIR = os.path.join(ROOT, "patches")

# Paths inside a Paddle tree.
TREE_OPT_DIR = "python/paddle/distributed/fleet/meta_optimizers/dygraph_optimizer"
TREE_TEST_DIR = "test/collective/fleet"
TARGET_PACKAGE = "paddle.distributed.fleet.meta_optimizers.dygraph_optimizer"

# What the patch carries, in three short lists (edit them here). (module file, class) of the
# overlay spliced into Paddle's file of the same name, in this order:
SPLICED = (
    ("dygraph_sharding_optimizer.py", "DygraphShardingOptimizer"),
    ("dygraph_sharding_optimizer.py", "DygraphShardingOptimizerV2"),
    ("hybrid_parallel_optimizer.py", "HybridParallelOptimizer"),
)
# Overlay modules added to Paddle's dygraph_optimizer folder as new files:
NEW_MODULES = (
    "broadcast_buckets.py",
    "comm_unit.py",
    "param_sync_overlap.py",
    "read_interception.py",
    "sync_registry.py",
    "unit_plan.py",
)
# Files of test/collective/fleet added as new files: drivers in upstream's form (their testslist.csv
# rows travel in the header) and the per-rank scripts they launch (test_make_patch.py fails for a
# carried file that needs one left out, such as the wait checker or the CPU shim).
TEST_FILES = (
    "test_dygraph_sharding_stage1_broadcast_overlap.py",
    "dygraph_sharding_stage1_broadcast_overlap.py",
)
# Prefix of the patch-header lines that carry the testslist.csv rows.
ROW_PREFIX = "testslist.csv row: "

# git with neither the user's nor the system's configuration (git's defaults apply), and an identity
# for the commits of layout_wheel_tree
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
GIT_IDENTITY = ["-c", "user.name=paddle_overlay make_patch", "-c", "user.email=make_patch@paddle-overlay.invalid"]


class PatchError(Exception):
    """Bad input: the message says what is wrong and how to fix it."""


def origin_name(name):
    """``paddle_overlay._patching.origin_name`` (here: the tool runs without Paddle)."""
    return "_origin_" + name.lstrip("_")


def _find_class(module, name, filename):
    """The top-level class ``name`` of ``module`` and its methods, {name: node}."""
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    raise PatchError(f"{filename}: no top-level class {name}")


def _first_line(node, lines):
    """1-based first line of a method: its decorators and the comment lines right above them."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    indent = re.match(r"\s*", lines[start - 1]).group()
    while start > 1 and lines[start - 2].startswith(indent + "#"):
        start -= 1
    return start


def _top_level_bindings(module_node):
    """name -> ('import', absolute source, imported name) or ('def', kind) for top-level names."""
    bound = {}
    for node in module_node.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                bound[name] = ("import", a.name if a.asname else name, None)
        elif isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), TARGET_PACKAGE)
            for a in node.names:
                bound[a.asname or a.name] = ("import", source, a.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = ("def", type(node).__name__)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                bound.update({n.id: ("def", "assignment") for n in ast.walk(t) if isinstance(n, ast.Name)})
    return bound


def _globals_used(overlay_text, filename, class_name):
    """{method: global names it reads (nested scopes included)} of the overlay class."""
    table = symtable.symtable(overlay_text, filename, "exec")
    cls = next(t for t in table.get_children() if t.get_type() == "class" and t.get_name() == class_name)

    def reads(t):
        return set(t.get_globals()).union(*map(reads, t.get_children()))

    return {t.get_name(): reads(t) for t in cls.get_children() if t.get_type() == "function"}


def _names_read_at_definition(node):
    """Names a method's decorators, default values and annotations read: Python evaluates them
    where the ``def`` runs (the class body, then the module), not in the method's scope."""
    outside_body = [*node.decorator_list, node.args] + ([node.returns] if node.returns else [])
    return {n.id for e in outside_body for n in ast.walk(e) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def splice(target_text, overlay_text, class_name, target_name="<target>", overlay_name="<overlay>"):
    """Target module text with the overlay class's methods spliced into ``class_name``; PatchError when
    that cannot be done faithfully (wrapped method missing, tree patched, a name it cannot carry)."""
    overlay_mod, target_mod = ast.parse(overlay_text, overlay_name), ast.parse(target_text, target_name)
    o_lines, t_lines = overlay_text.splitlines(), target_text.splitlines()
    t_cls, t_methods = _find_class(target_mod, class_name, target_name)
    _, o_methods = _find_class(overlay_mod, class_name, overlay_name)
    wraps = _overlay_wraps(overlay_mod, overlay_name, class_name)
    for name in wraps:
        if name not in o_methods:
            raise PatchError(f"{overlay_name}: OVERLAY_WRAPS names {name}, which the class does not define")
    # Imports: every global a method reads must be a builtin or an overlay import that the
    # target module binds the same way (or gets added).
    o_bound, t_bound = _top_level_bindings(overlay_mod), _top_level_bindings(target_mod)
    missing = {}  # absolute module -> {names}
    used = _globals_used(overlay_text, overlay_name, class_name)
    for method, node in o_methods.items():
        for name in sorted(used.get(method, set()) | _names_read_at_definition(node)):
            how = o_bound.get(name)
            if how is None and hasattr(builtins, name):
                continue
            if how is None:
                raise PatchError(f"{overlay_name}: {class_name}.{method} reads {name}, "
                                 "which is neither imported nor builtin")
            if how[0] != "import":
                raise PatchError(f"{overlay_name}: {class_name}.{method} reads module-level {name} ({how[1]}); "
                                 "the patch carries methods only: import it from a Paddle module instead")
            if how[1].split(".")[0] == "paddle_overlay":
                raise PatchError(f"{overlay_name}: {class_name}.{method} uses {name} from {how[1]}, absent in Paddle")
            there = t_bound.get(name)
            if there is None and how[2] is None:
                raise PatchError(f"{overlay_name}: plain 'import' of {name} is not supported; use 'from ... import'")
            if there is None:
                missing.setdefault(how[1], set()).add(how[2])
            elif there != how:
                raise PatchError(f"{target_name}: {name} is bound to {there[1:]} but {class_name}.{method} "
                                 f"expects {how[1:]} (from {overlay_name})")
    # Method edits, as (first line, last line, new lines) on the target; 1-based, inclusive.
    edits, appended = [], []
    for name, node in o_methods.items():
        text = o_lines[_first_line(node, o_lines) - 1 : node.end_lineno]
        if name in wraps:
            if name not in t_methods:
                raise PatchError(f"{target_name}: {class_name}.{name} to wrap is missing (wrong Paddle version?)")
            if origin_name(name) in t_methods:
                raise PatchError(f"{target_name}: {class_name}.{origin_name(name)} exists: the tree is already patched")
            orig = t_methods[name]
            renamed, n = re.subn(rf"\bdef\s+{re.escape(name)}\s*\(", f"def {origin_name(name)}(",
                                 t_lines[orig.lineno - 1], count=1)
            if n != 1:
                raise PatchError(f"{target_name}:{orig.lineno}: cannot find 'def {name}(' to rename")
            start = _first_line(orig, t_lines)
            edits.append((orig.lineno, orig.lineno, [renamed]))
            edits.append((start, start - 1, text + [""]))  # insertion above the original
        elif name in t_methods:
            edits.append((_first_line(t_methods[name], t_lines), t_methods[name].end_lineno, text))
        else:
            appended.extend([""] + text)
    if appended:
        edits.append((t_cls.end_lineno + 1, t_cls.end_lineno, appended))
    if missing:
        edits.append(_import_edit(target_mod, missing))
    out = list(t_lines)
    # Apply bottom-up so earlier line numbers stay valid; insertions (end < start) at the same
    # line as a replacement go after it is applied, i.e. sort by start, then by end.
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out[start - 1 : end] = new
    result = "\n".join(out) + ("\n" if target_text.endswith("\n") else "")
    compile(result, target_name, "exec")  # a SyntaxError here is a bug of this tool, not of the input
    return result


def _overlay_wraps(overlay_mod, overlay_name, class_name=None):
    """The names ``class_name`` wraps: the module's ``OVERLAY_WRAPS`` tuple, or its entry in such a dict."""
    assigned = {t.id: node.value for node in overlay_mod.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    if "OVERLAY_WRAPS" not in assigned:
        raise PatchError(f"{overlay_name}: no module-level OVERLAY_WRAPS")
    value = ast.literal_eval(assigned["OVERLAY_WRAPS"])
    if isinstance(value, dict):
        value = tuple(value.get(class_name, ()))
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise PatchError(f"{overlay_name}: OVERLAY_WRAPS must be a tuple of str")
    return value


def _import_edit(target_mod, missing):
    """Insertion of ``from module import names`` for ``missing`` ({absolute module: names}) after the
    last top-level import of the same kind (relative for a module of ``TARGET_PACKAGE``)."""
    imports = [n for n in target_mod.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports:
        raise PatchError("target module has no top-level imports to place new ones after")
    new_lines = []
    for module in sorted(missing):
        mod = "." + module[len(TARGET_PACKAGE) + 1 :] if module.startswith(TARGET_PACKAGE + ".") else module
        # isort's order (profile black, order_by_type): classes, then functions
        names = sorted(missing[module], key=lambda n: (not n[:1].isupper(), n))
        one = f"from {mod} import {', '.join(names)}"
        new_lines += [one] if len(one) <= 80 else [f"from {mod} import ("] + [f"    {n}," for n in names] + [")"]
    relative_needed = any(m.startswith(TARGET_PACKAGE + ".") for m in missing)
    same_kind = [n for n in imports if (isinstance(n, ast.ImportFrom) and n.level > 0) == relative_needed]
    after = (same_kind or imports)[-1].end_lineno
    return (after + 1, after, new_lines)


def _read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def patch_source_files():
    """Repository paths of every file whose text goes into the patch."""
    overlay, tests = os.path.relpath(OVERLAY_DIR, ROOT), os.path.relpath(TEST_DIR, ROOT)
    return [f"{overlay}/{n}" for n in sorted([name for name, _ in SPLICED] + list(NEW_MODULES))] + [
        f"{tests}/{n}" for n in sorted(TEST_FILES)]


def testslist_rows():
    """The lines of our testslist.csv whose driver the patch carries, as written; PatchError for a bad row."""
    path = os.path.join(TEST_DIR, "testslist.csv")
    try:
        rows = testslist.read_testslist(path)
    except ValueError as e:
        raise PatchError(str(e)) from None
    for row in rows:
        if not os.path.isfile(os.path.join(TEST_DIR, row.name + ".py")):
            raise PatchError(f"{path}:{row.line}: {row.name} has no {row.name}.py in {TEST_DIR}")
    lines = _read(path).splitlines()
    return [lines[row.line - 1] for row in rows if row.name + ".py" in TEST_FILES]


def patched_files(tree):
    """{path in ``tree``: new text} of every file the patch adds or changes; PatchError when a file
    to splice is missing or one to add exists already."""
    for folder, names in ((OVERLAY_DIR, [n for n, _ in SPLICED] + list(NEW_MODULES)), (TEST_DIR, TEST_FILES)):
        absent = [n for n in names if not os.path.isfile(os.path.join(folder, n))]
        if absent:
            raise PatchError(f"listed in tools/make_patch.py but not in {os.path.relpath(folder, ROOT)}: {absent}")
    out = {}
    for filename, class_name in SPLICED:
        rel, overlay = f"{TREE_OPT_DIR}/{filename}", os.path.join(OVERLAY_DIR, filename)
        if not os.path.isfile(os.path.join(tree, rel)):
            raise PatchError(f"{os.path.join(tree, rel)} not found: is {tree} a Paddle tree (python/paddle/...)?")
        target = out.get(rel) or _read(os.path.join(tree, rel))  # the second class of a file: the first's result
        out[rel] = splice(target, _read(overlay), class_name, rel, os.path.relpath(overlay, ROOT))
    added = {f"{TREE_OPT_DIR}/{n}": os.path.join(OVERLAY_DIR, n) for n in NEW_MODULES}
    added.update({f"{TREE_TEST_DIR}/{n}": os.path.join(TEST_DIR, n) for n in TEST_FILES})
    for rel, src in sorted(added.items()):
        if os.path.lexists(os.path.join(tree, rel)):
            raise PatchError(f"{rel} exists in {tree}: the patch adds new files only (is the tree patched already, "
                             "or does upstream have a file of that name? rename ours)")
        out[rel] = adapt_test_base(tree, _read(src)) if rel.startswith(TREE_TEST_DIR + "/") else _read(src)
    return out


# Upstream's multi-process test base: the name our drivers use, and the newer name (develop
# after the 3.x releases renamed it) with its method.
LEGACY_BASE = "test/legacy_test/test_parallel_dygraph_dataparallel.py"
BASE_NAMES = (("TestMultipleGpus", "run_mnist_2gpu"), ("TestMultipleAccelerators", "run_mnist_2accelerators"))


def base_classes(tree):
    """The class names of :data:`BASE_NAMES` that the tree's ``LEGACY_BASE`` defines (none without that file)."""
    path = os.path.join(tree, LEGACY_BASE)
    legacy = _read(path) if os.path.isfile(path) else ""
    return {cls for cls, _ in BASE_NAMES if re.search(rf"^class {cls}\b", legacy, re.M)}


def adapt_test_base(tree, text):
    """``text`` with the base's newer names when the tree's ``LEGACY_BASE`` has only those (a later Paddle)."""
    (old_cls, old_fn), (new_cls, new_fn) = BASE_NAMES
    if base_classes(tree) != {new_cls}:
        return text
    module = "legacy_test.test_parallel_dygraph_dataparallel"
    # the longer name no longer fits one 80-column line: the form black and isort give it
    text = text.replace(f"from {module} import {old_cls}\n", f"from {module} import (\n    {new_cls},\n)\n")
    return re.sub(rf"\b{old_fn}\(", f"{new_fn}(", re.sub(rf"\b{old_cls}\b", new_cls, text))


HEADER = """\
Sharding stage 1: the parameter sync after step() overlapped with the next
forward (DygraphShardingOptimizer V1: broadcast; V2, split_param: all-gather),
for {description}.

Generated by tools/make_patch.py of paddle_overlay from its overlay source; do not
edit by hand. It changes files under python/ and adds new files only, so it applies
with plain git apply to a checkout at the matching tag:
    git apply --check FILE && git apply FILE
"""
REGISTER = f"""\
Then register the new tests: append each line below that starts with
"{ROW_PREFIX.strip()}", without that prefix, to {TREE_TEST_DIR}/testslist.csv
and regenerate the CMakeLists.txt next to it with
    python3 tools/gen_ut_cmakelists.py -f {TREE_TEST_DIR}/testslist.csv
(tools/apply_patch.sh PADDLE_SRC FILE of paddle_overlay does both steps).

"""


def header(description, rows):
    """The patch's leading text (``git apply`` ignores it), with the rows to register after :data:`ROW_PREFIX`."""
    return HEADER.format(description=description) + (REGISTER if rows else "") + "".join(
        f"{ROW_PREFIX}{row}\n" for row in rows) + "\n"


def git(repo, *args):
    """stdout of git in ``repo``, without the user's configuration; CalledProcessError on failure."""
    return subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, env={**os.environ, **GIT_ENV},
                          capture_output=True, text=True, check=True).stdout


def make_patch(tree, description):
    """Patch text for ``tree``: ``git diff`` of :func:`patched_files` against the tree's files."""
    files = patched_files(tree)
    with tempfile.TemporaryDirectory(prefix="make_patch-") as repo:
        git(repo, "init", "-q")
        for rel in files:
            os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
            if os.path.isfile(os.path.join(tree, rel)):
                shutil.copyfile(os.path.join(tree, rel), os.path.join(repo, rel))
        git(repo, "add", "-A")
        original = git(repo, "write-tree").strip()
        for rel, text in files.items():
            _write(os.path.join(repo, rel), text)
        git(repo, "add", "-A")
        # full blob ids; the rest pins what GIT_EXTERNAL_DIFF or a later git's defaults could change
        body = git(repo, "diff", "--cached", "--full-index", "--no-renames", "--no-ext-diff", "--diff-algorithm=myers",
                   "--indent-heuristic", "--unified=3", original)
    return header(description, testslist_rows()) + body


def paddle_package_dir(path):
    """The installed ``paddle`` package of a venv, a site-packages folder or the package itself."""
    path = os.path.abspath(path)
    candidates = [path, os.path.join(path, "paddle")]
    candidates += sorted(glob.glob(os.path.join(path, "lib", "python3*", "site-packages", "paddle")))
    for c in candidates:
        if os.path.basename(c) == "paddle" and os.path.isfile(os.path.join(c, "version", "__init__.py")):
            return c
    raise PatchError(f"no installed paddle package under {path}: give a venv (with lib/python3*/site-packages/"
                     "paddle), a site-packages folder, or the paddle package folder")


def wheel_version(pkg_dir):
    """``full_version`` and ``commit`` of an installed paddle package, read without importing it."""
    text = _read(os.path.join(pkg_dir, "version", "__init__.py"))
    version = re.search(r"^full_version\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    commit = re.search(r"^commit\s*=\s*['\"]([0-9a-f]+)['\"]", text, re.M)
    if not version:
        raise PatchError(f"{pkg_dir}/version/__init__.py has no full_version")
    return version.group(1), commit.group(1) if commit else None


def layout_wheel_tree(pkg_dir, dest):
    """The wheel's files the patch touches as a git repository at ``dest``, laid out and tagged as a
    checkout (``python/paddle/...``, ``v<version>``). Returns the version."""
    version, _ = wheel_version(pkg_dir)
    src_dir = os.path.join(pkg_dir, *TREE_OPT_DIR.split("/")[2:])
    dst_dir = os.path.join(dest, TREE_OPT_DIR)
    os.makedirs(dst_dir, exist_ok=True)
    for filename, _ in SPLICED:
        shutil.copyfile(os.path.join(src_dir, filename), os.path.join(dst_dir, filename))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", f"Paddle {version} wheel files"],
                 ["tag", f"v{version}"]):
        git(dest, *args)
    return version


def patch_path(version):
    return os.path.join(PATCH_DIR, f"paddle-v{version}-stage1-broadcast-overlap.patch")


def make_wheel_patch(venv, version=None):
    """(patch text, version) for the installed wheel found at ``venv``."""
    pkg = paddle_package_dir(venv)
    found, commit = wheel_version(pkg)
    if version and version != found:
        raise PatchError(f"{pkg} is Paddle {found}, not {version}")
    with tempfile.TemporaryDirectory(prefix="paddle-wheel-tree-") as tree:
        layout_wheel_tree(pkg, tree)
        return make_patch(tree, f"Paddle {found}" + (f" (commit {commit})" if commit else "")), found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--paddle-src", metavar="DIR", help="Paddle tree laid out as python/paddle/... (a checkout)")
    src.add_argument("--from-wheel", metavar="VENV", help="installed paddle wheel (venv, site-packages or package)")
    parser.add_argument("--version", help="with --from-wheel: fail unless the wheel is this Paddle version")
    parser.add_argument("--out", metavar="FILE", help="write the patch here (default: stdout)")
    args = parser.parse_args(argv)
    try:
        if args.from_wheel:
            text, _ = make_wheel_patch(args.from_wheel, args.version)
        else:
            if args.version:
                parser.error("--version goes with --from-wheel")
            tree = os.path.abspath(args.paddle_src)
            text = make_patch(tree, f"the Paddle tree {os.path.basename(tree)}")
    except PatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        _write(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
