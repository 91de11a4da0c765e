#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Turn the overlay source into patches for a Paddle tree (docs/patches.md): a series of pull
requests (``git format-patch`` files, ``tools/patch_series.py``) and the single patch of all of them.

The modules and classes come from ``paddle_overlay/_patching.py`` (``OVERLAY_MODULES``,
``NEW_MODULES``), the split from ``tools/patch_series.py``. New modules and test files are added as
they are (fences of later PRs and release flags resolved); each overlay class is written into
Paddle's class of the same name as direct edits: an ``OVERLAY_WRAPS`` method's statements at the
top (and, after a ``...``, at the end) of Paddle's method, ``SUPERSEDED`` code deleted, other methods
replacing Paddle's of the same name or appended. Same inputs, same bytes: git runs without the
user's configuration, with a fixed identity and dates. Exit codes: 0 ok, 2 bad input (the message
says what to fix).
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
import patch_series  # noqa: E402
import testslist  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERLAY_ROOT = os.path.join(ROOT, "paddle_overlay")
TEST_DIR = os.path.join(ROOT, "test", "collective", "fleet")
PATCH_DIR = os.path.join(ROOT, "patches")

# Paths inside a Paddle tree.
TREE_PY = "python/paddle"
TREE_OPT_DIR = f"{TREE_PY}/distributed/fleet/meta_optimizers/dygraph_optimizer"
TREE_TEST_DIR = "test/collective/fleet"
# Read (not changed) to resolve the release flags.
TREE_LAYERS = f"{TREE_PY}/nn/layer/layers.py"

# Prefix of the patch-header lines that carry the testslist.csv rows.
ROW_PREFIX = "testslist.csv row: "
# Names the series must not contain (this project's; an overlay method's original slot), and the
# one exception: Paddle's own attribute DygraphShardingOptimizer._origin_parameter_list.
BANNED = re.compile(r"paddle_overlay|PADDLE_OVERLAY|_origin_(?!parameter_list\b)\w*")
# The old names the overlay keeps as aliases (its module broadcast_overlap): never in the series.
ALIASES = re.compile(r"\.broadcast_overlap\b|\bbroadcast_overlap\.py\b|"
                     r"\b(StageOneBroadcastOverlap|BroadcastOverlapState|get_broadcast_overlap)\b")

# git with neither the user's nor the system's configuration (git's defaults apply), and the identity
# and dates of the series' commits (the tag's commit of layout_wheel_tree too)
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C", "TZ": "UTC"}
AUTHOR = ("Sharding Overlap Contributors", "sharding-overlap@users.noreply.github.com")
DATE = "2026-01-01T00:00:00+00:00"
GIT_IDENTITY = ["-c", f"user.name={AUTHOR[0]}", "-c", f"user.email={AUTHOR[1]}"]
COMMIT_ENV = {"GIT_AUTHOR_NAME": AUTHOR[0], "GIT_AUTHOR_EMAIL": AUTHOR[1], "GIT_AUTHOR_DATE": DATE,
              "GIT_COMMITTER_NAME": AUTHOR[0], "GIT_COMMITTER_EMAIL": AUTHOR[1], "GIT_COMMITTER_DATE": DATE}
DIFF_OPTIONS = ["--full-index", "--no-renames", "--no-ext-diff", "--diff-algorithm=myers", "--indent-heuristic",
                "--unified=3"]


class PatchError(Exception):
    """Bad input: the message says what is wrong and how to fix it."""


def _read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


# --------------------------------------------------------------------------- what the patch carries


def _overlay_layout():
    """(OVERLAY_MODULES, NEW_MODULES) of ``paddle_overlay/_patching.py``, read without importing it."""
    module = ast.parse(_read(os.path.join(OVERLAY_ROOT, "_patching.py")))
    names = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("_DYGRAPH_OPT", "OVERLAY_MODULES", "NEW_MODULES"):
                names[name] = eval(compile(ast.Expression(node.value), "_patching.py", "eval"),
                                   {"__builtins__": {}}, dict(names))
    return names["OVERLAY_MODULES"], names["NEW_MODULES"]


def tree_path(module):
    """``distributed.fleet.x`` -> ``python/paddle/distributed/fleet/x.py``."""
    return f"{TREE_PY}/{module.replace('.', '/')}.py"


def overlay_path(module):
    return os.path.join(OVERLAY_ROOT, *module.split(".")) + ".py"


_MODULES, _NEW = _overlay_layout()
# (module, class): the overlay class spliced into Paddle's of the same name, in this order
SPLICED = tuple(_MODULES)
# modules added as new files
NEW_MODULES = tuple(_NEW)
# files of test/collective/fleet added as new files: drivers in upstream's form (their testslist.csv rows
# travel in the header) and the per-rank scripts they launch
TEST_FILES = tuple(os.path.basename(p) for pr in patch_series.PRS for p in pr["files"] if p.startswith("test/"))
PR_KEYS = tuple(pr["key"] for pr in patch_series.PRS)


def _first_pr_of(path):
    """Index of the PR a source file (repository path) first appears in."""
    for k, pr in enumerate(patch_series.PRS):
        if path in pr["files"]:
            return k
    raise PatchError(f"{path} is carried by the patch but no PR of tools/patch_series.py lists it")


def patch_source_files():
    """Repository paths of every file whose text goes into the patch."""
    paths = {os.path.relpath(overlay_path(m), ROOT) for m, _ in SPLICED} | {
        os.path.relpath(overlay_path(m), ROOT) for m in NEW_MODULES}
    return sorted(paths) + [f"test/collective/fleet/{n}" for n in sorted(TEST_FILES)]


# --------------------------------------------------------------------------- fences of the series

FENCE = re.compile(r"^\s*# series: (?:(until) )?([a-z0-9_]+)\s*$")


def text_at(text, upto, name="<text>", first=0):
    """``text`` as of PR ``upto`` (index): fenced regions of later PRs left out, ``until`` regions of
    later PRs uncommented, fence lines dropped. ``first``: the PR the file first appears in."""
    out, region = [], None
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        m = FENCE.match(line)
        if not m and "# series:" in line:
            raise PatchError(f"{name}:{number}: a fence must be a line of its own ('# series: KEY'), "
                             f"not {line.strip()!r} (did isort move it into an import?)")
        if m and m.group(2) == "end":
            if region is None:
                raise PatchError(f"{name}:{number}: '# series: end' without a fence")
            region = None
            continue
        if m:
            if region is not None:
                raise PatchError(f"{name}:{number}: fences do not nest")
            if m.group(2) not in PR_KEYS:
                raise PatchError(f"{name}:{number}: no PR {m.group(2)!r} in tools/patch_series.py ({PR_KEYS})")
            region = (bool(m.group(1)), PR_KEYS.index(m.group(2)))
            if region[1] <= first:
                raise PatchError(f"{name}:{number}: a fence of PR {m.group(2)!r}, which is not after the file's "
                                 f"own PR {PR_KEYS[first]!r}")
            continue
        if region is None or (not region[0] and region[1] <= upto):
            out.append(line)
        elif region[0] and upto < region[1]:
            stripped = re.sub(r"^(\s*)# ?", r"\1", line, count=1)
            out.append(stripped if stripped.strip() else "\n")
    if region is not None:
        raise PatchError(f"{name}: a fence is not closed ('# series: end')")
    return "".join(out)


def source_at(path, upto):
    """The text of a source file (absolute path) as of PR ``upto``, or None before its first PR."""
    first = _first_pr_of(os.path.relpath(path, ROOT))
    if upto < first:
        return None
    return tidy(text_at(_read(path), upto, os.path.relpath(path, ROOT), first))


def _section(node):
    """isort's section of a top-level import (profile black, ``paddle`` first party)."""
    if isinstance(node, ast.ImportFrom) and node.level:
        return 4
    top = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
    return 0 if top == "__future__" else 1 if top in sys.stdlib_module_names else 3 if top == "paddle" else 2


def tidy(text):
    """What leaving fenced lines out leaves behind, as black and isort would write it: no more than two
    blank lines in a row, and in the leading import block one blank line between isort's sections and none
    inside one (isort puts blank lines around the fences' comment lines there)."""
    text = re.sub(r"\n{4,}", "\n\n\n", text).rstrip("\n") + "\n"
    module = ast.parse(text)
    body = module.body[1:] if module.body and isinstance(module.body[0], ast.Expr) else module.body
    block = []
    for node in body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        block.append(node)
    if not block:
        return text
    lines = text.splitlines()
    out, previous, covered = [], None, set()
    for node in block:
        start = _comments_above(lines, node.lineno)
        if previous is not None and _section(node) != _section(previous):
            out.append("")
        out += lines[start - 1 : node.end_lineno]
        covered.update(range(start, node.end_lineno + 1))
        previous = node
    first = _comments_above(lines, block[0].lineno)
    if any(not _blank(lines[n - 1]) and n not in covered for n in range(first, block[-1].end_lineno + 1)):
        return text  # a comment of its own among the imports: left as written
    return _join(lines[: first - 1] + out + lines[block[-1].end_lineno :], text)


# --------------------------------------------------------------------------- release flags

def _has_prepend(tree):
    """Whether the tree's ``Layer.register_forward_pre_hook`` takes ``prepend`` (Paddle 3.x)."""
    path = os.path.join(tree, TREE_LAYERS)
    if not os.path.isfile(path):
        raise PatchError(f"{path} not found: the release flags are read from it")
    fn = _find_def(ast.parse(_read(path)), "Layer", "register_forward_pre_hook")
    if fn is None:
        raise PatchError(f"{TREE_LAYERS} has no Layer.register_forward_pre_hook")
    return any(a.arg == "prepend" for a in fn.args.args + fn.args.kwonlyargs)


def _has_pp_sync(tree):
    """Whether the tree's ``HybridParallelOptimizer`` syncs the pipeline's shared weights after the update
    (``_get_pp_sync_params``, ``pp_configs.sync_param``: Paddle 3.x)."""
    path = os.path.join(tree, TREE_OPT_DIR, "hybrid_parallel_optimizer.py")
    if not os.path.isfile(path):
        raise PatchError(f"{path} not found: the release flags are read from it")
    return _find_def(ast.parse(_read(path)), "HybridParallelOptimizer", "_get_pp_sync_params") is not None


# module-level bools of the overlay source that depend on the release: a patch keeps the branch of
# ``if FLAG:`` that its release takes, without the flag
RELEASE_FLAGS = {"_HAS_PREPEND": _has_prepend, "_HAS_PP_SYNC": _has_pp_sync}


def release_flags(tree):
    return {name: check(tree) for name, check in RELEASE_FLAGS.items()}


def _find_def(module, class_name, method):
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    return None


def fold_flags(text, flags, name="<module>"):
    """``text`` with each ``if FLAG:`` of :data:`RELEASE_FLAGS` replaced by the branch ``flags`` takes, the
    flag's assignment (and the comments right above it) deleted, and imports that only it used removed."""
    for flag, value in flags.items():
        before = _names_read(text)
        while True:
            module = ast.parse(text, name)
            ifs = [n for n in ast.walk(module) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
                   and n.test.id == flag]
            if not ifs:
                break
            lines = text.splitlines()
            node = ifs[0]
            text = _join(_replace(lines, node.lineno, node.end_lineno,
                                  _branch(lines, node, "body" if value else "else", name)), text)
        module = ast.parse(text, name)
        for node in module.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == flag for t in node.targets):
                lines = text.splitlines()
                text = _join(_replace(lines, _comments_above(lines, node.lineno), node.end_lineno, []), text)
                break
        if flag in _names_read(text):
            raise PatchError(f"{name}: release flag {flag} is read other than as 'if {flag}:'")
        text = _drop_unused_imports(text, before, name)
    return text


def _names_read(text):
    return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)} | {
        n.value.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}


def _drop_unused_imports(text, used_before, name):
    """Remove top-level imports whose names ``text`` no longer reads (but did: ``used_before``)."""
    module = ast.parse(text, name)
    now = _names_read(text)
    for node in reversed(module.body):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        bound = [(a.asname or a.name.split(".")[0]) for a in node.names]
        dead = [b for b in bound if b not in now and b in used_before]
        if not dead:
            continue
        if len(dead) != len(bound):
            raise PatchError(f"{name}:{node.lineno}: only part of this import became unused ({dead}); split it")
        lines = text.splitlines()
        text = _join(_replace(lines, node.lineno, node.end_lineno, []), text)
    return text


# --------------------------------------------------------------------------- line editing


def _join(lines, like):
    return "\n".join(lines) + ("\n" if like.endswith("\n") else "")


def _indent(line):
    return re.match(r"\s*", line).group()


def _blank(line):
    return not line.strip()


def _replace(lines, start, end, new):
    """``lines`` (a list of lines, no newlines) with lines ``start``..``end`` (1-based, inclusive) replaced by
    ``new``; deleting leaves one blank line where the neighbours were both blank."""
    out = lines[: start - 1] + list(new) + lines[end:]
    if not new and start >= 2 and start - 1 < len(out) and _blank(out[start - 2]) and _blank(out[start - 1]):
        del out[start - 1]
    return out


def _comments_above(lines, lineno):
    """The first line of the comment block directly above line ``lineno`` (or ``lineno``)."""
    while lineno > 1 and lines[lineno - 2].strip().startswith("#"):
        lineno -= 1
    return lineno


def _reindent(block, old, new, name):
    out = []
    for line in block:
        if _blank(line):
            out.append("")
        elif not line.startswith(old):
            raise PatchError(f"{name}: cannot re-indent {line!r} (expected the indentation {old!r})")
        else:
            out.append(new + line[len(old):])
    return out


def _branch(lines, node, keep, name):
    """The lines of ``if`` ``node``'s body (``keep="body"``) or ``else`` branch (``"else"``; none: []),
    dedented to the ``if``'s own indentation."""
    indent = _indent(lines[node.lineno - 1])
    else_line = None
    if node.orelse:
        for number in range(node.body[-1].end_lineno + 1, node.orelse[0].lineno + 1):
            if re.match(r"\s*else\s*:", lines[number - 1]):
                else_line = number
                break
        if else_line is None:
            raise PatchError(f"{name}:{node.lineno}: an 'elif' chain cannot be folded; rewrite it as if/else")
    if keep == "body":
        start, end = node.test.end_lineno + 1, (else_line - 1 if else_line else node.end_lineno)
    elif else_line is None:
        return []
    else:
        start, end = else_line + 1, node.end_lineno
    block = lines[start - 1 : end]
    while block and _blank(block[-1]):
        block.pop()
    first = next(line for line in block if not _blank(line))
    return _reindent(block, _indent(first), indent, name)


# --------------------------------------------------------------------------- splicing


def _find_class(module, name):
    """The top-level class ``name`` of ``module`` and its methods {name: node}, or (None, {})."""
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return None, {}


def _first_line(node, lines):
    """1-based first line of a method: its decorators and the comment lines right above them."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    indent = _indent(lines[start - 1])
    while start > 1 and lines[start - 2].startswith(indent + "#"):
        start -= 1
    return start


def _package_of(module_name):
    return "paddle." + module_name.rpartition(".")[0] if "." in module_name else "paddle"


def _top_level_bindings(module_node, package):
    """name -> ('import', absolute source, imported name or None) or ('def', kind) for top-level names."""
    bound = {}
    for node in module_node.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                bound[name] = ("import", a.name if a.asname else name, None)
        elif isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
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


def _literal(overlay_mod, name, overlay_name, class_name, default):
    """The module-level literal ``name`` (``OVERLAY_WRAPS``, ``SUPERSEDED``), or its entry for ``class_name``."""
    assigned = {t.id: node.value for node in overlay_mod.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    if name not in assigned:
        return default
    value = ast.literal_eval(assigned[name])
    if isinstance(value, dict):
        value = value.get(class_name, default)
    return value


def _overlay_wraps(overlay_mod, overlay_name, class_name):
    """The Paddle methods ``class_name``'s overlay edits: ``OVERLAY_WRAPS`` (a tuple, or a dict of tuples)."""
    value = _literal(overlay_mod, "OVERLAY_WRAPS", overlay_name, class_name, None)
    if value is None:
        raise PatchError(f"{overlay_name}: no module-level OVERLAY_WRAPS")
    value = tuple(value)
    if not all(isinstance(v, str) for v in value):
        raise PatchError(f"{overlay_name}: OVERLAY_WRAPS must hold tuples of str")
    return value


def _superseded(overlay_mod, overlay_name, class_name):
    """{method: '*' or (statement prefix, ...)} of ``SUPERSEDED`` for ``class_name``."""
    value = _literal(overlay_mod, "SUPERSEDED", overlay_name, class_name, {})
    for method, what in value.items():
        if what != "*" and not (isinstance(what, tuple) and all(isinstance(w, str) for w in what)):
            raise PatchError(f"{overlay_name}: SUPERSEDED[{class_name!r}][{method!r}] must be '*' or a tuple of str")
    return value


def _is_docstring(statement):
    value = getattr(statement, "value", None) if isinstance(statement, ast.Expr) else None
    return isinstance(value, ast.Constant) and isinstance(value.value, str)


def _normalized(text):
    return " ".join(text.split())


def _statements(node):
    """Every statement inside function ``node`` (nested blocks included, nested defs excluded)."""
    found = []
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, ()):
            if isinstance(child, ast.ExceptHandler):
                found.extend(_statements(child))
            elif isinstance(child, ast.stmt):
                found.append(child)
                if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.extend(_statements(child))
    return found


def delete_superseded(target_text, deletions, class_name, target_name="<target>"):
    """``target_text`` with ``deletions`` ({method: '*' or statement prefixes}) of class ``class_name``
    deleted, and the list of what was deleted ('Class.method' or 'Class.method: prefix'). Absent methods
    and statements are skipped (a release without upstream's overlap); an ambiguous prefix is an error.
    A deleted ``if`` keeps the branch taken with upstream's overlap off (see the overlay's SUPERSEDED)."""
    text, done = target_text, []
    for method, what in deletions.items():
        for prefix in ("*",) if what == "*" else what:
            module = ast.parse(text, target_name)
            _, methods = _find_class(module, class_name)
            fn = methods.get(method)
            if fn is None:
                continue
            lines = text.splitlines()
            if prefix == "*":
                text = _join(_replace(lines, _first_line(fn, lines), fn.end_lineno, []), text)
                done.append(f"{class_name}.{method}")
                continue
            want = _normalized(prefix)
            hits = [st for st in _statements(fn)
                    if _normalized("\n".join(lines[st.lineno - 1 : st.end_lineno]).strip()).startswith(want)]
            if not hits:
                continue
            if len(hits) > 1:
                raise PatchError(f"{target_name}: {len(hits)} statements of {class_name}.{method} start with "
                                 f"{prefix!r}: make SUPERSEDED's prefix longer")
            st = hits[0]
            if isinstance(st, ast.If):
                keep = "body" if isinstance(st.test, ast.UnaryOp) and isinstance(st.test.op, ast.Not) else "else"
                new = _branch(lines, st, keep, target_name)
            else:
                new = []
            text = _join(_replace(lines, st.lineno, st.end_lineno, new), text)
            done.append(f"{class_name}.{method}: {prefix}")
    try:
        compile(text, target_name, "exec")
    except SyntaxError as e:
        raise PatchError(f"{target_name}: deleting {done} leaves invalid code ({e}): a block left empty?") from None
    return text, done


def _edit_parts(node, lines, name):
    """(prologue lines, epilogue lines) of an overlay edit method ``node`` (``OVERLAY_WRAPS``): the lines of
    its body (docstring aside) before a top-level ``...`` and after it, as written (comments kept)."""
    body = list(node.body)
    start = _comments_above(lines, body[0].lineno) if body else node.end_lineno + 1
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        start = body[0].end_lineno + 1
        body = body[1:]
    marks = [st for st in body if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
             and st.value.value is Ellipsis]
    if len(marks) > 1:
        raise PatchError(f"{name}: {node.name} has more than one '...' (Paddle's body goes in one place)")
    if not marks:
        return _trimmed(lines[start - 1 : node.end_lineno]), []
    mark = marks[0]
    epilogue = _trimmed(lines[mark.end_lineno : node.end_lineno], keep_leading=True)
    if any(isinstance(n, ast.Return) for st in body[body.index(mark) + 1 :] for n in ast.walk(st)):
        raise PatchError(f"{name}: {node.name}'s statements after '...' return: they run after Paddle's body")
    return _trimmed(lines[start - 1 : _comments_above(lines, mark.lineno) - 1], keep_trailing=True), epilogue


def _trimmed(block, keep_leading=False, keep_trailing=False):
    block = list(block)
    while block and _blank(block[0]) and not (keep_leading and len(block) > 1 and not _blank(block[1])):
        block.pop(0)
    while block and _blank(block[-1]) and not (keep_trailing and len(block) > 1 and not _blank(block[-2])):
        block.pop()
    return block


def _arguments(node):
    a = node.args
    return [(x.arg, kind) for kind, xs in (("pos", a.posonlyargs + a.args), ("kw", a.kwonlyargs)) for x in xs] + [
        ("*" + a.vararg.arg if a.vararg else None, "var"), ("**" + a.kwarg.arg if a.kwarg else None, "varkw")]


def _returns(fn):
    """Whether function ``fn`` returns anywhere in its own body (nested defs aside)."""
    return any(isinstance(st, ast.Return) for st in _statements(fn))


def splice(target_text, overlay_text, class_name, target_name="<target>", overlay_name="<overlay>",
           package="paddle.distributed.fleet.meta_optimizers.dygraph_optimizer"):
    """Target module text with the overlay class written into ``class_name`` as direct edits (see the
    module docstring), and the list of superseded code deleted; PatchError when that cannot be done
    faithfully. ``package``: the target module's package (for relative imports)."""
    overlay_mod = ast.parse(overlay_text, overlay_name)
    o_cls, o_methods = _find_class(overlay_mod, class_name)
    if o_cls is None:
        return target_text, []
    if _find_class(ast.parse(target_text, target_name), class_name)[0] is None:
        raise PatchError(f"{target_name}: no top-level class {class_name}")
    wraps = _overlay_wraps(overlay_mod, overlay_name, class_name)
    for name in wraps:
        if name not in o_methods:
            raise PatchError(f"{overlay_name}: OVERLAY_WRAPS names {name}, which the class does not define")
    o_lines = overlay_text.splitlines()
    for name, node in o_methods.items():
        found = BANNED.search("\n".join(o_lines[_first_line(node, o_lines) - 1 : node.end_lineno]))
        if found:
            raise PatchError(f"{overlay_name}: {class_name}.{name} uses {found.group()!r}, which must not reach Paddle")
    text, deleted = delete_superseded(target_text, _superseded(overlay_mod, overlay_name, class_name), class_name,
                                      target_name)
    target_mod = ast.parse(text, target_name)
    t_lines = text.splitlines()
    t_cls, t_methods = _find_class(target_mod, class_name)
    # edits of methods this release does not define (EDITED_WHERE_DEFINED): left out, not added
    optional = _literal(overlay_mod, "EDITED_WHERE_DEFINED", overlay_name, class_name, ())
    o_methods = {k: v for k, v in o_methods.items() if k not in optional or k in t_methods}
    missing = _imports_needed(overlay_mod, overlay_text, target_mod, class_name, o_methods, overlay_name,
                              target_name, package)
    # Method edits, as (first line, last line, new lines) on the target; 1-based, inclusive.
    edits, appended = [], []
    for name, node in o_methods.items():
        if name in wraps:
            edits += _wrap_edits(node, o_lines, t_methods.get(name), t_lines, f"{target_name}: {class_name}.{name}")
            continue
        o_indent, t_indent = _indent(o_lines[node.lineno - 1]), "    "
        text_lines = _reindent(o_lines[_first_line(node, o_lines) - 1 : node.end_lineno], o_indent, t_indent,
                               overlay_name)
        if name in t_methods:
            edits.append((_first_line(t_methods[name], t_lines), t_methods[name].end_lineno, text_lines))
        else:
            appended.extend([""] + text_lines)
    if appended:
        edits.append((t_cls.end_lineno + 1, t_cls.end_lineno, appended))
    edits += _import_edits(target_mod, t_lines, missing, package)
    out = list(t_lines)
    # Apply bottom-up so earlier line numbers stay valid; insertions (end < start) at the same
    # line as a replacement go after it is applied, i.e. sort by start, then by end.
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out[start - 1 : end] = new
    result = _join(out, text)
    compile(result, target_name, "exec")  # a SyntaxError here is a bug of this tool, not of the input
    return result, deleted


def _wrap_edits(node, o_lines, target, t_lines, where):
    """The insertions of an edit method: its prologue at the top of Paddle's body, its epilogue at the end."""
    if target is None:
        raise PatchError(f"{where} to edit is missing (wrong Paddle version?)")
    if [a for a in _arguments(node)] != [a for a in _arguments(target)]:
        raise PatchError(f"{where}: the overlay's edit takes {_arguments(node)}, Paddle's method "
                         f"{_arguments(target)}: the statements would read other names")
    prologue, epilogue = _edit_parts(node, o_lines, where)
    body = target.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        at = first.end_lineno + 1  # after the docstring
    else:  # the top of the body: above the comments and blank lines before its first statement
        at = first.lineno
        while at - 1 > target.lineno and (_blank(t_lines[at - 2]) or t_lines[at - 2].strip().startswith("#")):
            at -= 1
        while _blank(t_lines[at - 1]):
            at += 1
    old_indent = _indent(o_lines[node.body[0].lineno - 1])
    new_indent = _indent(t_lines[first.lineno - 1])
    edits = [(at, at - 1, _reindent(prologue, old_indent, new_indent, where))] if prologue else []
    if epilogue:
        if _returns(target):
            raise PatchError(f"{where} returns before its end: the overlay's statements after '...' would not run")
        edits.append((target.end_lineno + 1, target.end_lineno, _reindent(epilogue, old_indent, new_indent, where)))
    return edits


def _imports_needed(overlay_mod, overlay_text, target_mod, class_name, o_methods, overlay_name, target_name,
                    package):
    """{absolute module: {names} or {None} (plain import)} the spliced methods need and the target lacks."""
    o_bound = _top_level_bindings(overlay_mod, package)
    t_bound = _top_level_bindings(target_mod, package)
    missing = {}
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
            if there is None:
                missing.setdefault(how[1], set()).add(how[2])
            elif there != how:
                raise PatchError(f"{target_name}: {name} is bound to {there[1:]} but {class_name}.{method} "
                                 f"expects {how[1:]} (from {overlay_name})")
    return missing


def _import_edits(target_mod, t_lines, missing, package):
    """Insertions for ``missing`` where isort (profile black) puts them: ``import name`` among the plain
    stdlib imports, ``from module import names`` among the top-level ``from`` imports of the same kind
    (relative for a module of the target's package), in isort's order of those (more dots first, then the
    module name), or after the last of them."""
    imports = [n for n in target_mod.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports and missing:
        raise PatchError("target module has no top-level imports to place new ones after")
    at = {}  # line to insert before -> new lines
    for module in sorted(missing):
        names = missing[module]
        if None in names:
            plain = [n for n in imports if isinstance(n, ast.Import)]
            after = [n for n in plain if n.names[0].name < module and n.names[0].name.split(".")[0] in
                     sys.stdlib_module_names]
            line = (after[-1].end_lineno + 1) if after else (plain[0].lineno if plain else imports[0].lineno)
            at.setdefault(line, []).append(f"import {module}")
            names = names - {None}
        if not names:
            continue
        if module == package:
            level, mod = 1, "."
        elif module.startswith(package + "."):
            level, mod = 1, "." + module[len(package) + 1 :]
        else:
            level, mod = 0, module
        # isort's order (profile black, order_by_type): classes, then functions
        ordered = sorted(names, key=lambda n: (not n[:1].isupper(), n))
        one = f"from {mod} import {', '.join(ordered)}"
        lines = [one] if len(one) <= 80 else [f"from {mod} import ("] + [f"    {n}," for n in ordered] + [")"]
        same_kind = [n for n in imports if isinstance(n, ast.ImportFrom) and (n.level > 0) == (level > 0)]
        kinds = same_kind or imports
        key = (-level, mod.lstrip("."))
        later = [n for n in same_kind if (-n.level, n.module or "") > key]
        line = later[0].lineno if later else kinds[-1].end_lineno + 1
        at.setdefault(line, []).extend(lines)
    return [(line, line - 1, lines) for line, lines in at.items()]


# --------------------------------------------------------------------------- the files of each PR


def testslist_rows(upto=None):
    """The lines of our testslist.csv whose driver the patch carries (as of PR ``upto``), as written."""
    path = os.path.join(TEST_DIR, "testslist.csv")
    try:
        rows = testslist.read_testslist(path)
    except ValueError as e:
        raise PatchError(str(e)) from None
    for row in rows:
        if not os.path.isfile(os.path.join(TEST_DIR, row.name + ".py")):
            raise PatchError(f"{path}:{row.line}: {row.name} has no {row.name}.py in {TEST_DIR}")
    carried = test_files_at(len(PR_KEYS) - 1 if upto is None else upto)
    lines = _read(path).splitlines()
    return [lines[row.line - 1] for row in rows if row.name + ".py" in carried]


def test_files_at(upto):
    return [n for n in TEST_FILES if _first_pr_of(f"test/collective/fleet/{n}") <= upto]


def patched_files(tree, upto=None, report=None):
    """{path in ``tree``: new text} of every file the patch changes or adds as of PR ``upto`` (default: the
    last); ``report`` (a list) gets what was deleted as superseded. PatchError when a file to edit is
    missing or one to add exists already."""
    upto = len(PR_KEYS) - 1 if upto is None else upto
    for path in [overlay_path(m) for m, _ in SPLICED] + [overlay_path(m) for m in NEW_MODULES] + [
            os.path.join(TEST_DIR, n) for n in TEST_FILES]:
        if not os.path.isfile(path):
            raise PatchError(f"listed in paddle_overlay/_patching.py or tools/patch_series.py but missing: "
                             f"{os.path.relpath(path, ROOT)}")
    flags = None
    out = {}
    for module, class_name in SPLICED:
        overlay = source_at(overlay_path(module), upto)
        if overlay is None:
            continue
        rel = tree_path(module)
        if not os.path.isfile(os.path.join(tree, rel)):
            raise PatchError(f"{os.path.join(tree, rel)} not found: is {tree} a Paddle tree (python/paddle/...)?")
        flags = release_flags(tree) if flags is None else flags
        target = out.get(rel) or _read(os.path.join(tree, rel))  # the second class of a file: the first's result
        text, deleted = splice(target, fold_flags(overlay, flags, rel), class_name, rel,
                               os.path.relpath(overlay_path(module), ROOT), _package_of(module))
        out[rel] = text
        if report is not None:
            report.extend(deleted)
    added = {tree_path(m): overlay_path(m) for m in NEW_MODULES}
    added.update({f"{TREE_TEST_DIR}/{n}": os.path.join(TEST_DIR, n) for n in TEST_FILES})
    for rel, src in sorted(added.items()):
        text = source_at(src, upto)
        if text is None:
            continue
        if os.path.lexists(os.path.join(tree, rel)):
            raise PatchError(f"{rel} exists in {tree}: the patch adds new files only (is the tree patched already, "
                             "or does upstream have a file of that name? rename ours)")
        if rel.startswith(TREE_TEST_DIR + "/"):
            text = adapt_test_base(tree, text)
        else:
            flags = release_flags(tree) if flags is None else flags
            text = fold_flags(text, flags, rel)
        out[rel] = text
    return out


def banned_in(patch):
    """The banned names (:data:`BANNED`, :data:`ALIASES`) a patch's added lines or messages hold, as
    'line: name' strings; context lines (upstream's own text) do not count."""
    found = []
    for number, line in enumerate(patch.splitlines(), 1):
        if line.startswith((" ", "-", "@@", "diff --git", "index ", "--- a/", "+++ b/", "--- /dev/null")):
            continue
        hits = [m.group() for m in BANNED.finditer(line)] + [m.group() for m in ALIASES.finditer(line)]
        found += [f"{number}: {h}" for h in hits]
    return found


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


# --------------------------------------------------------------------------- patches

HEADER = """\
Sharding stage 1: the parameter sync after step() overlapped with the next
forward (DygraphShardingOptimizer V1: broadcast; V2, split_param: all-gather),
for {description}: the pull requests of patches/{version}/ in one diff.

Generated by tools/make_patch.py from its source; do not edit by hand. It changes
files under python/ and adds new files only, so it applies with plain git apply
to a checkout at the matching tag:
    git apply --check FILE && git apply FILE
"""
REGISTER = f"""\
Then register the new tests: append each line below that starts with
"{ROW_PREFIX.strip()}", without that prefix, to {TREE_TEST_DIR}/testslist.csv
and regenerate the CMakeLists.txt next to it with
    python3 tools/gen_ut_cmakelists.py -f {TREE_TEST_DIR}/testslist.csv
(tools/apply_patch.sh PADDLE_SRC FILE does both steps).

"""


def header(description, rows, version="<version>"):
    """The patch's leading text (``git apply`` ignores it), with the rows to register after :data:`ROW_PREFIX`."""
    return HEADER.format(description=description, version=version) + (REGISTER if rows else "") + "".join(
        f"{ROW_PREFIX}{row}\n" for row in rows) + "\n"


def git(repo, *args, env=None, stdin=None):
    """stdout of git in ``repo``, without the user's configuration; CalledProcessError on failure."""
    return subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, env={**os.environ, **GIT_ENV, **(env or {})},
                          input=stdin, capture_output=True, text=True, check=True).stdout


def _tree_copy(tree, repo, rels):
    for rel in rels:
        if os.path.isfile(os.path.join(tree, rel)):
            os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(tree, rel), os.path.join(repo, rel))


def _states(tree):
    """([{path: text}] of every PR's patched files (cumulative), first PR first; [[superseded code each PR
    deleted]])."""
    states, deleted, before = [], [], set()
    for k in range(len(PR_KEYS)):
        report = []
        states.append(patched_files(tree, k, report))
        deleted.append([d for d in report if d not in before])
        before |= set(report)
    return states, deleted


def make_patch(tree, description, version="<version>"):
    """The single patch for ``tree``: ``git diff`` of all PRs' files against the tree's."""
    files = patched_files(tree)
    with tempfile.TemporaryDirectory(prefix="make_patch-") as repo:
        git(repo, "init", "-q")
        _tree_copy(tree, repo, files)
        git(repo, "add", "-A")
        original = git(repo, "write-tree").strip()
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
            _write(os.path.join(repo, rel), text)
        git(repo, "add", "-A")
        body = git(repo, "diff", "--cached", *DIFF_OPTIONS, original)
    return header(description, testslist_rows(), version) + body


def _size(repo, rev):
    """'N files, +A -D lines (tests: +T)' of commit ``rev``."""
    added = deleted = tests = files = 0
    for line in git(repo, "show", "--numstat", "--format=", "--no-renames", rev).splitlines():
        a, d, path = line.split("\t")
        files += 1
        added, deleted = added + int(a), deleted + int(d)
        tests += int(a) if path.startswith("test/") else 0
    return f"{files} files, +{added} -{deleted} lines (+{tests} of them tests)"


def make_series(tree, version):
    """[(file name, text)] of the series for ``tree``: one ``git format-patch`` file per PR, each applying
    with ``git am`` on the previous one at the tree's state; the PR's testslist.csv rows after ``---``."""
    states, deleted = _states(tree)
    every = sorted(set().union(*states))
    out = []
    with tempfile.TemporaryDirectory(prefix="make_series-") as repo:
        git(repo, "init", "-q")
        _tree_copy(tree, repo, every)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", "base", env=COMMIT_ENV)
        base = git(repo, "rev-parse", "HEAD").strip()
        rows_before = []
        for k, (pr, files, gone) in enumerate(zip(patch_series.PRS, states, deleted)):
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
                _write(os.path.join(repo, rel), text)
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", "size pending", env=COMMIT_ENV)
            message = patch_series.message(pr, version, _size(repo, "HEAD"), replaces=bool(gone))
            git(repo, "commit", "-q", "--amend", "--cleanup=verbatim", "-F", "-", env=COMMIT_ENV, stdin=message)
            rows = [r for r in testslist_rows(k) if r not in rows_before]
            rows_before += rows
            out.append(rows)
        names = git(repo, "format-patch", "--zero-commit", "--no-signature", "--numbered",
                    "--no-thread", "--no-attach", "--stat=80", *DIFF_OPTIONS, "-o", "out", f"{base}..HEAD").split()
        result = []
        for name, rows in zip(names, out):
            text = _read(os.path.join(repo, name))
            if rows:
                note = (f"Register the new tests: append each line below that starts with \"{ROW_PREFIX.strip()}\",\n"
                        f"without that prefix, to {TREE_TEST_DIR}/testslist.csv and regenerate its CMakeLists.txt\n"
                        f"(python3 tools/gen_ut_cmakelists.py -f {TREE_TEST_DIR}/testslist.csv).\n"
                        + "".join(f"{ROW_PREFIX}{r}\n" for r in rows) + "\n")
                text = text.replace("\n---\n", "\n---\n" + note, 1)
            result.append((os.path.basename(name), text))
    return result


# --------------------------------------------------------------------------- wheels and trees


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


def wheel_tree_files():
    """Paths (in a tree) of the wheel's files a patch changes or reads."""
    return sorted({tree_path(m) for m, _ in SPLICED} | {TREE_LAYERS})


def layout_wheel_tree(pkg_dir, dest):
    """The wheel's files the patch touches as a git repository at ``dest``, laid out and tagged as a
    checkout (``python/paddle/...``, ``v<version>``). Returns the version."""
    version, _ = wheel_version(pkg_dir)
    for rel in wheel_tree_files():
        src = os.path.join(pkg_dir, *rel.split("/")[2:])
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copyfile(src, os.path.join(dest, rel))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", f"Paddle {version} wheel files"],
                 ["tag", f"v{version}"]):
        git(dest, *args, env=COMMIT_ENV)
    return version


def patch_path(version):
    return os.path.join(PATCH_DIR, f"paddle-v{version}-stage1-broadcast-overlap.patch")


def series_dir(version):
    return os.path.join(PATCH_DIR, version)


def series_files(version_or_dir):
    """The committed series' files of a version (or in a folder), in order."""
    folder = version_or_dir if os.path.isdir(version_or_dir) else series_dir(version_or_dir)
    return sorted(glob.glob(os.path.join(folder, "[0-9][0-9][0-9][0-9]-*.patch")))


def _wheel_tree(venv, version):
    pkg = paddle_package_dir(venv)
    found, commit = wheel_version(pkg)
    if version and version != found:
        raise PatchError(f"{pkg} is Paddle {found}, not {version}")
    return pkg, found, f"Paddle {found}" + (f" (commit {commit})" if commit else "")


def make_wheel_patch(venv, version=None):
    """(single patch text, version) for the installed wheel found at ``venv``."""
    pkg, found, description = _wheel_tree(venv, version)
    with tempfile.TemporaryDirectory(prefix="paddle-wheel-tree-") as tree:
        layout_wheel_tree(pkg, tree)
        return make_patch(tree, description, found), found


def make_wheel_series(venv, version=None):
    """([(file name, text)], version) of the series for the installed wheel found at ``venv``."""
    pkg, found, _ = _wheel_tree(venv, version)
    with tempfile.TemporaryDirectory(prefix="paddle-wheel-tree-") as tree:
        layout_wheel_tree(pkg, tree)
        return make_series(tree, found), found


def write_series(files, folder):
    """Write the series' files into ``folder``, removing other ``*.patch`` files there."""
    os.makedirs(folder, exist_ok=True)
    for old in series_files(folder):
        if os.path.basename(old) not in dict(files):
            os.remove(old)
    for name, text in files:
        _write(os.path.join(folder, name), text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--paddle-src", metavar="DIR", help="Paddle tree laid out as python/paddle/... (a checkout)")
    src.add_argument("--from-wheel", metavar="VENV", help="installed paddle wheel (venv, site-packages or package)")
    parser.add_argument("--version", help="with --from-wheel: fail unless the wheel is this Paddle version; with "
                        "--paddle-src: the version named in the series' messages")
    parser.add_argument("--out", metavar="FILE", help="write the single patch here (default: stdout)")
    parser.add_argument("--series", metavar="DIR", help="write the series (0001-...patch onward) into DIR instead")
    args = parser.parse_args(argv)
    try:
        if args.from_wheel:
            if args.series:
                files, _ = make_wheel_series(args.from_wheel, args.version)
            else:
                text, _ = make_wheel_patch(args.from_wheel, args.version)
        else:
            tree = os.path.abspath(args.paddle_src)
            if args.series:
                files = make_series(tree, args.version or "<version>")
            else:
                text = make_patch(tree, f"the Paddle tree {os.path.basename(tree)}", args.version or "<version>")
    except PatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.series:
        write_series(files, args.series)
        print(f"wrote {len(files)} patches to {args.series}", file=sys.stderr)
    elif args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        _write(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
