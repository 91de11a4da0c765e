#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Turn the overlay source into patches for a Paddle tree (docs/patches.md): a series of pull
requests (``git format-patch`` files) and the single patch of all of them.

The modules and classes come from ``paddle_overlay/_patching.py`` (``OVERLAY_MODULES``,
``NEW_MODULES``), the split from the manifest ``tools/patch_series.py``: PR k carries the whole
definitions (modules, classes, methods, module-level functions and constants) of PRs 1..k, never a
different text of one. New modules and test files are added as they are (release flags resolved, the
test base named as the release names it); each overlay class is written into Paddle's class of the same
name as direct edits: an ``OVERLAY_WRAPS`` method's statements at the top (and, after a ``...``, at the
end) of Paddle's method, other methods replacing Paddle's of the same name or appended, and, from the PR
the manifest marks ``superseded``, ``SUPERSEDED`` code deleted. Each PR appends its tests' rows to
``test/collective/fleet/testslist.csv``. Every Python file a PR writes is formatted with the release's own
formatter (:data:`FORMATTERS`). Same inputs, same bytes: git runs without the user's configuration, with
a fixed identity (:data:`AUTHOR`, a placeholder; ``--author`` sets the real one) and dates. Exit codes: 0
ok, 2 bad input (the message says what to fix).
"""

import argparse
import ast
import builtins
import functools
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
# the stand-ins of upstream's test/ files a checkout-like tree gets (test/patch/checkout_like/README.md)
CHECKOUT_LIKE = os.path.join(ROOT, "test", "patch", "checkout_like")

# Paths inside a Paddle tree.
TREE_PY = "python/paddle"
TREE_OPT_DIR = f"{TREE_PY}/distributed/fleet/meta_optimizers/dygraph_optimizer"
TREE_TEST_DIR = "test/collective/fleet"
TREE_TESTSLIST = f"{TREE_TEST_DIR}/testslist.csv"
# Read (not changed) to resolve the release flags.
TREE_LAYERS = f"{TREE_PY}/nn/layer/layers.py"

# Names the series must not contain (this project's; an overlay method's original slot), and the
# one exception: Paddle's own attribute DygraphShardingOptimizer._origin_parameter_list.
BANNED = re.compile(r"paddle_overlay|PADDLE_OVERLAY|_origin_(?!parameter_list\b)\w*")
# The old names the overlay keeps as aliases (its module broadcast_overlap): never in the series.
ALIASES = re.compile(r"\.broadcast_overlap\b|\bbroadcast_overlap\.py\b|"
                     r"\b(StageOneBroadcastOverlap|BroadcastOverlapState|get_broadcast_overlap)\b")

# git with neither the user's nor the system's configuration (git's defaults apply), and the identity
# and dates of the series' commits (the tag's commit of layout_wheel_tree too). The author is an obvious
# placeholder: whoever submits the series sets theirs with --author "Name <email>".
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C", "TZ": "UTC"}
AUTHOR = ("Author Placeholder", "author.placeholder@example.invalid")
DATE = "2026-01-01T00:00:00+00:00"
DIFF_OPTIONS = ["--full-index", "--no-renames", "--no-ext-diff", "--diff-algorithm=myers", "--indent-heuristic",
                "--unified=3"]


def commit_env(author=AUTHOR):
    """The environment git commits with: ``author`` (name, email) as author and committer, :data:`DATE`."""
    return {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1], "GIT_AUTHOR_DATE": DATE,
            "GIT_COMMITTER_NAME": author[0], "GIT_COMMITTER_EMAIL": author[1], "GIT_COMMITTER_DATE": DATE}


COMMIT_ENV = commit_env()


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
# files of test/collective/fleet added as new files: drivers in upstream's form (each PR appends their
# testslist.csv rows) and the per-rank scripts they launch
TEST_FILES = tuple(os.path.basename(p) for pr in patch_series.PRS for p in pr["files"] if p.startswith("test/"))
PR_KEYS = tuple(pr["key"] for pr in patch_series.PRS)
# repository path -> the PR it first appears in; (path, definition) -> the later PR that adds it
FIRST_PR = {path: k for k, pr in enumerate(patch_series.PRS) for path in pr["files"]}
def _manifest_name(name):
    """A manifest name as :func:`definition_name` writes it (``_STARTS["x"]`` -> ``_STARTS['x']``)."""
    try:
        return ast.unparse(ast.parse(name, mode="eval").body)
    except SyntaxError:
        return name


ADDED_IN = {(path, _manifest_name(name)): k for k, pr in enumerate(patch_series.PRS) for path, name in
            (entry.split("::", 1) for entry in pr.get("adds", ()))}
# the PR that deletes the upstream code the earlier ones superseded (None: no PR does)
SUPERSEDED_PR = next((k for k, pr in enumerate(patch_series.PRS) if pr.get("superseded")), None)


def _first_pr_of(path):
    """Index of the PR a source file (repository path) first appears in."""
    if path not in FIRST_PR:
        raise PatchError(f"{path} is carried by the patch but no PR of tools/patch_series.py lists it")
    return FIRST_PR[path]


def patch_source_files():
    """Repository paths of every file whose text goes into the patch."""
    paths = {os.path.relpath(overlay_path(m), ROOT) for m, _ in SPLICED} | {
        os.path.relpath(overlay_path(m), ROOT) for m in NEW_MODULES}
    return sorted(paths) + [f"test/collective/fleet/{n}" for n in sorted(TEST_FILES)]


# --------------------------------------------------------------------------- whole definitions per PR


def definition_name(node, owner=None):
    """The manifest's name of a module- or class-level statement: a def or class by its name, an
    assignment by its target's text (``_STARTS["all_gather"]``); None for anything else (a docstring, an
    import, an ``if``: they come with the file)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        name = node.name
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        name = ast.unparse(node.targets[0])
    elif isinstance(node, ast.AnnAssign):
        name = ast.unparse(node.target)
    else:
        return None
    return f"{owner}.{name}" if owner else name


def definitions(module):
    """[(name, node)] of every definition of ``module`` (an ast.Module) and of its classes' bodies."""
    found = []
    for node in module.body:
        name = definition_name(node)
        if name is None:
            continue
        found.append((name, node))
        if isinstance(node, ast.ClassDef):
            found += [(definition_name(m, node.name), m) for m in node.body if definition_name(m, node.name)]
    return found


def _statement_start(node, lines):
    """1-based first line of a definition: its decorators and the comment lines right above them."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    indent = _indent(lines[start - 1])
    while start > 1 and lines[start - 2].startswith(indent + "#"):
        start -= 1
    return start


def text_at(text, path, upto):
    """``text`` (of the repository file ``path``) as of PR ``upto`` (index): the definitions of later PRs
    (the manifest's ``adds``) left out with the comments right above them, and the imports only they used;
    None before the file's own PR. PatchError for a manifest entry that names no definition of the file."""
    first = _first_pr_of(path)
    if upto < first:
        return None
    module = ast.parse(text, path)
    found = definitions(module)
    names = {name for name, _ in found}
    for (where, name), k in ADDED_IN.items():
        if where == path and name not in names:
            raise PatchError(f"tools/patch_series.py: PR {PR_KEYS[k]!r} adds {where}::{name}, which the file "
                             "does not define")
        if where == path and k <= first:
            raise PatchError(f"tools/patch_series.py: PR {PR_KEYS[k]!r} adds {where}::{name}, but the file "
                             f"first appears in PR {PR_KEYS[first]!r}, not before it")
    later = [node for name, node in found if ADDED_IN.get((path, name), first) > upto]
    if not later:
        return text
    lines = text.splitlines()
    spans = sorted({(_statement_start(n, lines), n.end_lineno) for n in later}, reverse=True)
    before = _names_read(text)
    for start, end in spans:
        lines[start - 1 : end] = []
    out = re.sub(r"\n{4,}", "\n\n\n", _join(lines, text))
    return _drop_unused_imports(out, before, path)


def source_at(path, upto):
    """The text of a source file (absolute path) as of PR ``upto``, or None before its first PR."""
    return _checkout_text_at(_read(path), os.path.relpath(path, ROOT), upto)


@functools.lru_cache(maxsize=1024)
def _checkout_text_at(text, path, upto):
    # text_at of this checkout's files, memoized (a pure function of its arguments and of the manifest, which
    # is fixed within a process): the states of the series ask for each file many times
    return text_at(text, path, upto)


# --------------------------------------------------------------------------- release flags

def _has_prepend(tree):
    """Whether the tree's ``Layer.register_forward_pre_hook`` takes ``prepend`` (Paddle 3.x)."""
    path = os.path.join(tree, TREE_LAYERS)
    if not os.path.isfile(path):
        raise PatchError(f"{path} not found: the release flags are read from it")
    arguments = _arguments_of(_read(path), "Layer", "register_forward_pre_hook")
    if arguments is None:
        raise PatchError(f"{TREE_LAYERS} has no Layer.register_forward_pre_hook")
    return "prepend" in arguments


def _has_pp_sync(tree):
    """Whether the tree's ``HybridParallelOptimizer`` syncs the pipeline's shared weights after the update
    (``_get_pp_sync_params``, ``pp_configs.sync_param``: Paddle 3.x)."""
    path = os.path.join(tree, TREE_OPT_DIR, "hybrid_parallel_optimizer.py")
    if not os.path.isfile(path):
        raise PatchError(f"{path} not found: the release flags are read from it")
    return _arguments_of(_read(path), "HybridParallelOptimizer", "_get_pp_sync_params") is not None


@functools.lru_cache(maxsize=64)
def _arguments_of(text, class_name, method):
    """The argument names of ``class_name.method`` in module ``text`` (a tuple), None when it has none."""
    fn = _find_def(ast.parse(text), class_name, method)
    return None if fn is None else tuple(a.arg for a in fn.args.args + fn.args.kwonlyargs)


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
    return _fold_flags(text, tuple(flags.items()), name)


@functools.lru_cache(maxsize=256)
def _fold_flags(text, flags, name):
    # fold_flags, memoized: a pure function of its arguments, asked again for every state and release
    for flag, value in flags:
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


@functools.lru_cache(maxsize=1024)
def _names_read(text):
    """The names ``text`` reads: every ``name`` and every ``name.attr``'s ``name`` (memoized)."""
    names = set()
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            names.add(n.value.id)
    return frozenset(names)


def _drop_unused_imports(text, used_before, name):
    """Remove top-level imports (or the names of one) that ``text`` no longer reads but did
    (``used_before``)."""
    module = ast.parse(text, name)
    now = _names_read(text)
    for node in reversed(module.body):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        bound = [(a.asname or a.name.split(".")[0]) for a in node.names]
        dead = [b for b in bound if b not in now and b in used_before]
        if not dead:
            continue
        keep = [a for a, b in zip(node.names, bound) if b not in dead]
        new = []
        if keep:  # the rest of the import, on one line (the release's formatter wraps it)
            node.names = keep
            new = [ast.unparse(node)]
        lines = text.splitlines()
        text = _join(_replace(lines, node.lineno, node.end_lineno, new), text)
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


def _members(module, name):
    """{name: node} of the methods and nested classes of the top-level class ``name``."""
    cls, methods = _find_class(module, name)
    nested = {n.name: n for n in cls.body if isinstance(n, ast.ClassDef)} if cls is not None else {}
    return {**methods, **nested}


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
    if isinstance(value, dict) and class_name is not None:
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


def _check_superseded(value, where):
    """``value`` ({member: '*' or entries}) or PatchError: an entry is a statement prefix, a (prefix, kept
    branch: "body" or "else") pair, or "parameter: NAME"."""
    for method, what in value.items():
        entries = () if what == "*" else what
        ok = what == "*" or isinstance(what, tuple)
        ok = ok and all(isinstance(w, str) or (isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], str)
                                               and w[1] in ("body", "else")) for w in entries)
        if not ok:
            raise PatchError(f"{where}[{method!r}] must be '*' or a tuple of statement prefixes, (prefix, "
                             "'body' | 'else') pairs and 'parameter: NAME' strings")
    return value


def _superseded(overlay_mod, overlay_name, class_name):
    """{method: '*' or (entry, ...)} of ``SUPERSEDED`` for ``class_name``."""
    value = _literal(overlay_mod, "SUPERSEDED", overlay_name, class_name, {})
    return _check_superseded(value, f"{overlay_name}: SUPERSEDED[{class_name!r}]")


def superseded_elsewhere():
    """{Paddle module: {class: deletions}} of the overlay modules' ``SUPERSEDED_ELSEWHERE``: upstream code
    of other modules that only the superseded overlap used."""
    out = {}
    for module in sorted({m for m, _ in SPLICED}):
        overlay_mod = ast.parse(_read(overlay_path(module)))
        value = _literal(overlay_mod, "SUPERSEDED_ELSEWHERE", module, None, {})
        for target, classes in value.items():
            for class_name, deletions in classes.items():
                where = f"{module}: SUPERSEDED_ELSEWHERE[{target!r}][{class_name!r}]"
                out.setdefault(target, {})[class_name] = _check_superseded(deletions, where)
    return out


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


def _delete_parameter(text, fn, name, target_name):
    """``text`` with parameter ``name`` (and its default) of function ``fn`` deleted, or None when ``fn``
    has no such parameter; the signature is written on one line (the release's formatter wraps it)."""
    args = fn.args
    positional = args.posonlyargs + args.args
    if name in [a.arg for a in positional]:
        i = [a.arg for a in positional].index(name)
        first_default = len(positional) - len(args.defaults)
        if i >= first_default:
            del args.defaults[i - first_default]
        if i < len(args.posonlyargs):
            del args.posonlyargs[i]
        else:
            del args.args[i - len(args.posonlyargs)]
    elif name in [a.arg for a in args.kwonlyargs]:
        i = [a.arg for a in args.kwonlyargs].index(name)
        del args.kwonlyargs[i], args.kw_defaults[i]
    else:
        return None
    lines = text.splitlines()
    indent = _indent(lines[fn.lineno - 1])
    end = None
    for last in range(fn.lineno, fn.body[0].lineno):  # the signature's last line: it parses with a body
        head = "\n".join(line[len(indent):] for line in lines[fn.lineno - 1 : last])
        try:
            ast.parse(head + "\n    pass\n")
        except SyntaxError:
            continue
        end = last
        break
    if end is None:
        raise PatchError(f"{target_name}: cannot find the end of {fn.name}'s signature")
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    signature = f"{indent}def {fn.name}({ast.unparse(args)}){returns}:"
    return _join(_replace(lines, fn.lineno, end, [signature]), text)


def delete_superseded(target_text, deletions, class_name, target_name="<target>"):
    """``target_text`` with ``deletions`` ({member: '*' or entries}) of class ``class_name``
    deleted, and the list of what was deleted ('Class.member' or 'Class.member: entry'). Absent members,
    statements and parameters are skipped (a release without upstream's overlap); an ambiguous prefix is
    an error. A deleted ``if`` keeps the branch taken with upstream's overlap off (see the overlay's
    SUPERSEDED), or the one a (prefix, branch) entry names; "parameter: NAME" deletes a parameter."""
    text, done = target_text, []
    for method, what in deletions.items():
        for entry in ("*",) if what == "*" else what:
            prefix, branch = entry if isinstance(entry, tuple) else (entry, None)
            module = ast.parse(text, target_name)
            fn = _members(module, class_name).get(method)
            if fn is None:
                continue
            lines = text.splitlines()
            if prefix == "*":
                text = _join(_replace(lines, _first_line(fn, lines), fn.end_lineno, []), text)
                done.append(f"{class_name}.{method}")
                continue
            if prefix.startswith("parameter: "):
                new = _delete_parameter(text, fn, prefix[len("parameter: "):], target_name)
                if new is not None:
                    text = new
                    done.append(f"{class_name}.{method}: {prefix}")
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
                keep = branch or ("body" if isinstance(st.test, ast.UnaryOp) and isinstance(st.test.op, ast.Not)
                                  else "else")
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
           package="paddle.distributed.fleet.meta_optimizers.dygraph_optimizer", supersede=True):
    """Target module text with the overlay class written into ``class_name`` as direct edits (see the
    module docstring), and the list of superseded code deleted (``supersede``: whether to delete it);
    PatchError when that cannot be done faithfully. ``package``: the target module's package (for relative
    imports). An ``OVERLAY_WRAPS`` name the overlay text does not define (a later PR's method) is skipped."""
    overlay_mod = ast.parse(overlay_text, overlay_name)
    o_cls, o_methods = _find_class(overlay_mod, class_name)
    if o_cls is None:
        return target_text, []
    if _find_class(ast.parse(target_text, target_name), class_name)[0] is None:
        raise PatchError(f"{target_name}: no top-level class {class_name}")
    wraps = tuple(w for w in _overlay_wraps(overlay_mod, overlay_name, class_name) if w in o_methods)
    o_lines = overlay_text.splitlines()
    for name, node in o_methods.items():
        found = BANNED.search("\n".join(o_lines[_first_line(node, o_lines) - 1 : node.end_lineno]))
        if found:
            raise PatchError(f"{overlay_name}: {class_name}.{name} uses {found.group()!r}, which must not reach Paddle")
    deletions = _superseded(overlay_mod, overlay_name, class_name) if supersede else {}
    text, deleted = delete_superseded(target_text, deletions, class_name, target_name)
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


# --------------------------------------------------------------------------- the tests and their rows

LEGACY_BASE = "test/legacy_test/test_parallel_dygraph_dataparallel.py"
# Each release's base of 2-process drivers, as its LEGACY_BASE defines it: (class, method, the method's
# parameters). Read from stored copies of Paddle's tree (docs/patches.md, "The tests at the tag": which
# commits, and why they stand for the release). The drivers here are written with the newest names
# (SOURCE_BASE); a patch's drivers get its release's.
RELEASE_TEST_BASES = {
    "2.6.2": ("TestMultipleGpus", "run_mnist_2gpu", 'self, target_file_name, allocator_strategy="auto_growth"'),
    "3.3.1": ("TestMultipleAccelerators", "run_mnist_2accelerators",
              'self, target_file_name, allocator_strategy="auto_growth", need_envs={}, accelerator_type="gpu"'),
}
SOURCE_BASE = RELEASE_TEST_BASES["3.3.1"][:2]


def release_test_base(version):
    """(class, method, parameters) of ``version``'s test base: :data:`RELEASE_TEST_BASES`, else by the
    major release (2.x: 2.6.2's, later: 3.3.1's; not checked against a stored copy)."""
    if version in RELEASE_TEST_BASES:
        return RELEASE_TEST_BASES[version]
    return RELEASE_TEST_BASES["2.6.2" if str(version).startswith("2.") else "3.3.1"]


def test_base_of(tree, version=None):
    """(class, method) the drivers of a patch for ``tree`` use: what the tree's LEGACY_BASE defines (of
    the known bases), else ``version``'s (PatchError when neither is known)."""
    path = os.path.join(tree, LEGACY_BASE)
    if os.path.isfile(path):
        text = _read(path)
        for cls, method, _ in RELEASE_TEST_BASES.values():
            if re.search(rf"^class {cls}\b", text, re.M) and re.search(rf"^    def {method}\(", text, re.M):
                return cls, method
        raise PatchError(f"{path} defines none of the test bases "
                         f"{[b[:2] for b in RELEASE_TEST_BASES.values()]}: the drivers would not import")
    version = version or tree_version(tree)
    if version is None:
        raise PatchError(f"{tree} has no {LEGACY_BASE} and no python/paddle/version/__init__.py: cannot tell "
                         "which test base its drivers may use")
    return release_test_base(version)[:2]


def adapt_test_base(text, base):
    """A driver's ``text`` with the test base ``base`` ((class, method)) instead of :data:`SOURCE_BASE`."""
    (old_cls, old_fn), (new_cls, new_fn) = SOURCE_BASE, base
    text = re.sub(rf"\b{old_fn}\(", f"{new_fn}(", re.sub(rf"\b{old_cls}\b", new_cls, text))
    one_line = f"from legacy_test.test_parallel_dygraph_dataparallel import {new_cls}"
    if len(one_line) <= 80:  # as one writes it when it fits (the formatter keeps either form)
        text = text.replace(f"from legacy_test.test_parallel_dygraph_dataparallel import (\n    {new_cls},\n)",
                            one_line)
    return text


def test_base_stand_in(version):
    """The text of a stand-in for ``version``'s LEGACY_BASE in a checkout-like tree: the class and method
    that release defines, with its parameters, running the script on 2 ranks through this project's
    launcher (``test/patch/stand_in_launch.py``, on the PYTHONPATH of the tree's test runs). Nothing else:
    a driver calling a name the release lacks fails there."""
    cls, method, parameters = release_test_base(version)
    envs = "need_envs" if "need_envs" in parameters else "{}"
    return (f"# Stand-in for Paddle {version}'s {LEGACY_BASE}, emitted by tools/make_patch.py\n"
            "# (test_base_stand_in): the base class and method of 2-process drivers that release defines,\n"
            "# with its parameters; the script runs on 2 ranks through this project's launcher.\n"
            "import unittest\n\nimport stand_in_launch\n\n\n"
            f"class {cls}(unittest.TestCase):\n"
            f"    def {method}({parameters}):  # noqa: B006\n"
            f"        stand_in_launch.run(self, target_file_name, allocator_strategy, {envs})\n")


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
    ours = [row for row in rows if row.name + ".py" in carried]
    # each PR appends its own rows: in the order of the PRs, then of our list
    ours.sort(key=lambda row: (_first_pr_of(f"test/collective/fleet/{row.name}.py"), row.line))
    return [lines[row.line - 1] for row in ours]


def test_files_at(upto):
    return [n for n in TEST_FILES if _first_pr_of(f"test/collective/fleet/{n}") <= upto]


# --------------------------------------------------------------------------- formatting

# The formatter of each release's tree (docs/patches.md, "Formatting"; test/tools/test_format.py proves
# it: the formatter leaves the wheel's untouched modules the series edits as they are, the other does
# not). A checkout says it in its .pre-commit-config.yaml; other wheels: --formatter.
FORMATTERS = {"2.6.2": "black", "3.3.1": "ruff"}
FORMATTER_PINS = {"black": "23.3.0", "ruff": "0.9.2"}  # the [test] extra's pins
# Paddle's settings (pyproject.toml's [tool.ruff], and [tool.black] of 2.6): the import sorting both
# releases run through ruff's isort rules, and 3.x's ruff format
RUFF_SETTINGS = """\
line-length = 80
target-version = "py38"

[format]
quote-style = "preserve"

[lint.isort]
combine-as-imports = true
known-first-party = ["paddle"]
"""


def tree_version(tree):
    """``full_version`` of the tree's python/paddle/version/__init__.py (wheel and checkout-like trees
    have one, a source checkout before its build has not): None when absent."""
    path = os.path.join(tree, TREE_PY, "version", "__init__.py")
    if not os.path.isfile(path):
        return None
    found = re.search(r"^full_version\s*=\s*['\"]([^'\"]+)['\"]", _read(path), re.M)
    return found.group(1) if found else None


def formatter_for(tree, version=None):
    """``"ruff"`` or ``"black"``: the formatter ``tree`` is formatted with (its .pre-commit-config.yaml:
    ruff-format or black), else :data:`FORMATTERS` of ``version`` (default: the tree's)."""
    config = os.path.join(tree, ".pre-commit-config.yaml")
    if os.path.isfile(config):
        text = _read(config)
        if re.search(r"id:\s*ruff-format\b", text):
            return "ruff"
        if re.search(r"id:\s*black\b", text):
            return "black"
    version = version or tree_version(tree)
    if version in FORMATTERS:
        return FORMATTERS[version]
    raise PatchError(f"which formatter Paddle {version or '(unknown version)'} uses is not known here "
                     f"({FORMATTERS}): give --formatter black|ruff, or a checkout with its .pre-commit-config.yaml")


def _tool(module, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True)


@functools.lru_cache(maxsize=None)
def check_formatter(formatter):
    """PatchError unless ``formatter``'s tools at their pins run in this python (asked once per process)."""
    tools = ("ruff",) if formatter == "ruff" else ("ruff", "black")
    for tool in tools:
        proc = _tool(tool, "--version")
        if proc.returncode or FORMATTER_PINS[tool] not in proc.stdout + proc.stderr:
            raise PatchError(f"{tool} {FORMATTER_PINS[tool]} is needed to format the patch as Paddle does "
                             f"({sys.executable}: {(proc.stdout + proc.stderr).strip()[:200] or 'not installed'}); "
                             f"pip install {tool}=={FORMATTER_PINS[tool]} (the [test] extra pins it)")


def format_files(files, formatter):
    """``files`` ({tree path: text}) with every ``.py`` file formatted as ``formatter`` (``ruff``: ruff's
    import sorting and formatter with Paddle 3.x's settings; ``black``: ruff's import sorting and black
    with Paddle 2.6's), the others as they are. The same texts are formatted once per process."""
    return format_many([files], formatter)[0]


def format_many(file_sets, formatter):
    """:func:`format_files` of each of ``file_sets`` (a list of {tree path: text}), in one run of each tool."""
    first = {}  # (path, text) -> the first set that has it: a file the same in several states is formatted once
    for k, files in enumerate(file_sets):
        for rel, text in files.items():
            if rel.endswith(".py"):
                first.setdefault((rel, text), k)
    python = {f"{k}/{rel}": text for (rel, text), k in first.items()}
    formatted = _formatted(formatter, tuple(sorted(python.items()))) if python else {}
    return [{rel: formatted[f"{first[rel, text]}/{rel}"] if rel.endswith(".py") else text
             for rel, text in files.items()} for files in file_sets]


@functools.lru_cache(maxsize=64)
def _formatted(formatter, python):
    # {tree path: formatted text} of the .py files ``python`` ((path, text) pairs)
    python = dict(python)
    check_formatter(formatter)
    with tempfile.TemporaryDirectory(prefix="make_patch-format-") as tmp:
        for rel, text in python.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            _write(os.path.join(tmp, rel), text)
        paths = sorted(python)
        _write(os.path.join(tmp, "ruff.toml"), RUFF_SETTINGS)
        # both trees sort imports with ruff's isort rules (Paddle's [tool.ruff.lint] selects "I")
        steps = [("ruff", "check", "--config", "ruff.toml", "--no-cache", "--select", "I", "--fix", "--exit-zero",
                  "--quiet", *paths)]
        if formatter == "ruff":
            steps.append(("ruff", "format", "--config", "ruff.toml", "--no-cache", "--quiet", *paths))
        else:
            steps.append(("black", "--quiet", "-l", "80", "-S", *paths))
        for step in steps:
            proc = _tool(*step, cwd=tmp)
            if proc.returncode:
                raise PatchError(f"{' '.join(step[:2])} failed on the patch's files:\n{proc.stdout}{proc.stderr}")
        return {rel: _read(os.path.join(tmp, rel)) for rel in python}


# --------------------------------------------------------------------------- the files of each PR


def patched_files(tree, upto=None, report=None, formatter=None, formatted=True):
    """{path in ``tree``: new text} of every file the patch changes or adds as of PR ``upto`` (default: the
    last), formatted with ``formatter`` (default: the tree's, :func:`formatter_for`; ``formatted=False``: not
    formatted, for :func:`format_many`); ``report`` (a list) gets what was deleted as superseded. PatchError
    when a file to edit is missing or one to add exists already."""
    upto = len(PR_KEYS) - 1 if upto is None else upto
    for path in [overlay_path(m) for m, _ in SPLICED] + [overlay_path(m) for m in NEW_MODULES] + [
            os.path.join(TEST_DIR, n) for n in TEST_FILES]:
        if not os.path.isfile(path):
            raise PatchError(f"listed in paddle_overlay/_patching.py or tools/patch_series.py but missing: "
                             f"{os.path.relpath(path, ROOT)}")
    flags = None
    supersede = SUPERSEDED_PR is not None and upto >= SUPERSEDED_PR
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
        text, deleted = _spliced(target, fold_flags(overlay, flags, rel), class_name, rel,
                                 os.path.relpath(overlay_path(module), ROOT), _package_of(module), supersede)
        out[rel] = text
        if report is not None:
            report.extend(deleted)
    if supersede:
        for module, classes in superseded_elsewhere().items():
            rel = tree_path(module)
            if not os.path.isfile(os.path.join(tree, rel)):
                raise PatchError(f"{os.path.join(tree, rel)} not found: is {tree} a Paddle tree?")
            text = out.get(rel) or _read(os.path.join(tree, rel))
            for class_name, deletions in classes.items():
                text, deleted = _superseded_deleted(text, deletions, class_name, rel)
                if report is not None:
                    report.extend(deleted)
            if text != _read(os.path.join(tree, rel)):
                out[rel] = text
    for rel in list(out):  # imports only the deleted code read
        out[rel] = _drop_unused_imports(out[rel], _names_read(_read(os.path.join(tree, rel))), rel)
    added = {tree_path(m): overlay_path(m) for m in NEW_MODULES}
    added.update({f"{TREE_TEST_DIR}/{n}": os.path.join(TEST_DIR, n) for n in TEST_FILES})
    base = None
    for rel, src in sorted(added.items()):
        text = source_at(src, upto)
        if text is None:
            continue
        if os.path.lexists(os.path.join(tree, rel)):
            raise PatchError(f"{rel} exists in {tree}: the patch adds new files only (is the tree patched already, "
                             "or does upstream have a file of that name? rename ours)")
        if rel.startswith(TREE_TEST_DIR + "/"):
            base = base or test_base_of(tree)
            text = adapt_test_base(text, base)
        else:
            flags = release_flags(tree) if flags is None else flags
            text = fold_flags(text, flags, rel)
        out[rel] = text
    rows = testslist_rows(upto)
    if rows:
        listed = os.path.join(tree, TREE_TESTSLIST)
        if not os.path.isfile(listed):
            raise PatchError(f"{listed} not found: each PR appends its tests' rows to it (use a checkout, or "
                             "--from-wheel, which lays out a checkout-like tree)")
        text = _read(listed)
        out[TREE_TESTSLIST] = text + ("" if text.endswith("\n") or not text else "\n") + "".join(
            r + "\n" for r in rows)
    return format_files(out, formatter or formatter_for(tree)) if formatted else out


@functools.lru_cache(maxsize=256)
def _spliced(*args):
    # splice(), memoized (a pure function of its texts and names): every state of every release asks again
    text, deleted = splice(*args)
    return text, tuple(deleted)


def _superseded_deleted(text, deletions, class_name, rel):
    # delete_superseded(), memoized the same way (``deletions``, a dict of "*" or entry lists, made hashable)
    frozen = tuple((member, what if what == "*" else tuple(what)) for member, what in deletions.items())
    return _superseded_deleted_frozen(text, frozen, class_name, rel)


@functools.lru_cache(maxsize=256)
def _superseded_deleted_frozen(text, frozen, class_name, rel):
    text, deleted = delete_superseded(text, dict(frozen), class_name, rel)
    return text, tuple(deleted)


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


# --------------------------------------------------------------------------- patches

HEADER = """\
Sharding stage 1: the parameter sync after step() overlapped with the next
forward (DygraphShardingOptimizer V1: broadcast; V2, split_param: all-gather),
for {description}: the pull requests of the series in one diff.

Generated by tools/make_patch.py from its source; do not edit by hand. It changes
files under python/, appends its tests' rows to {testslist}, and adds new
files only, so it applies with plain git apply to a checkout at the matching tag
(the rows' hunk needs the tag's testslist.csv: tools/apply_patch.sh appends them
when it differs):
    git apply --check FILE && git apply FILE

"""


def header(description, version="<version>"):
    """The patch's leading text (``git apply`` ignores it)."""
    return HEADER.format(description=description, version=version, testslist=TREE_TESTSLIST)


def git(repo, *args, env=None, stdin=None, author=AUTHOR):
    """stdout of git in ``repo``, without the user's configuration; CalledProcessError on failure."""
    identity = ["-c", f"user.name={author[0]}", "-c", f"user.email={author[1]}"]
    return subprocess.run(["git", *identity, *args], cwd=repo, env={**os.environ, **GIT_ENV, **(env or {})},
                          input=stdin, capture_output=True, text=True, check=True).stdout


def _tree_copy(tree, repo, rels):
    for rel in rels:
        if os.path.isfile(os.path.join(tree, rel)):
            os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(tree, rel), os.path.join(repo, rel))


def _states(tree, formatter=None):
    """([{path: text}] of every PR's patched files (cumulative), first PR first; [[superseded code each PR
    deleted]])."""
    formatter = formatter or formatter_for(tree)
    states, deleted, before = [], [], set()
    for k in range(len(PR_KEYS)):
        report = []
        states.append(patched_files(tree, k, report, formatted=False))
        deleted.append([d for d in report if d not in before])
        before |= set(report)
    return format_many(states, formatter), deleted


def make_patch(tree, description, version="<version>", formatter=None):
    """The single patch for ``tree``: ``git diff`` of all PRs' files against the tree's."""
    files = patched_files(tree, formatter=formatter)
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
    return header(description, version) + body


def sizes(numstat):
    """(files, added, deleted, added to test/) of ``git show --numstat`` output."""
    added = deleted = tests = files = 0
    for line in numstat.splitlines():
        a, d, path = line.split("\t")
        files += 1
        added, deleted = added + int(a), deleted + int(d)
        tests += int(a) if path.startswith("test/") else 0
    return files, added, deleted, tests


def _size(repo, rev):
    """'N files, +A -D lines (+T of them tests)' of commit ``rev``."""
    files, added, deleted, tests = sizes(git(repo, "show", "--numstat", "--format=", "--no-renames", rev))
    return f"{files} files, +{added} -{deleted} lines (+{tests} of them tests)"


def make_series(tree, version, author=AUTHOR, formatter=None):
    """[(file name, text)] of the series for ``tree``: one ``git format-patch`` file per PR that changes
    something on it (the cleanup of a release without upstream's overlap has nothing to do), each applying
    with ``git am`` on the previous one at the tree's state and appending its tests' rows."""
    states, deleted = _states(tree, formatter)
    every = sorted(set().union(*states))
    with tempfile.TemporaryDirectory(prefix="make_series-") as repo:
        env = commit_env(author)
        git(repo, "init", "-q", author=author)
        _tree_copy(tree, repo, every)
        git(repo, "add", "-A", author=author)
        git(repo, "commit", "-q", "--allow-empty", "-m", "base", env=env, author=author)
        base = git(repo, "rev-parse", "HEAD", author=author).strip()
        for pr, files, gone in zip(patch_series.PRS, states, deleted):
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
                _write(os.path.join(repo, rel), text)
            git(repo, "add", "-A", author=author)
            if not git(repo, "status", "--porcelain", author=author).strip():
                continue  # nothing to do on this release
            git(repo, "commit", "-q", "-m", "size pending", env=env, author=author)
            replaces = bool(gone) or (pr.get("superseded") is None and _replaces_upstream(tree, pr))
            message = patch_series.message(pr, version, _size(repo, "HEAD"), replaces=replaces)
            git(repo, "commit", "-q", "--amend", "--cleanup=verbatim", "-F", "-", env=env, stdin=message,
                author=author)
        names = git(repo, "format-patch", "--zero-commit", "--no-signature", "--numbered", "--no-thread",
                    "--no-attach", "--stat=80", *DIFF_OPTIONS, "-o", "out", f"{base}..HEAD", author=author).split()
        return [(os.path.basename(name), _read(os.path.join(repo, name))) for name in names]


def _replaces_upstream(tree, pr):
    """Whether the release of ``tree`` has the upstream overlap the PR's entry point replaces (Paddle 3.x's
    ``_set_broadcast_overlap`` / ``_set_all_gather_overlap_forward``): its message then says what it
    replaces; else its ``new`` sections say what it adds."""
    if "new" not in pr:
        return True
    method = "_set_all_gather_overlap_forward" if pr["key"] == "v2" else "_set_broadcast_overlap"
    cls = "DygraphShardingOptimizerV2" if pr["key"] == "v2" else "DygraphShardingOptimizer"
    path = os.path.join(tree, TREE_OPT_DIR, "dygraph_sharding_optimizer.py")
    return os.path.isfile(path) and _find_def(ast.parse(_read(path)), cls, method) is not None


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
    edited = {tree_path(m) for m, _ in SPLICED} | {tree_path(m) for m in superseded_elsewhere()}
    return sorted(edited | {TREE_LAYERS, f"{TREE_PY}/version/__init__.py"})


def layout_wheel_tree(pkg_dir, dest):
    """A git repository at ``dest`` shaped like a Paddle checkout at the wheel's tag (``v<version>``):
    ``python/`` the wheel's files the patch touches or reads, ``test/`` this project's stand-ins of
    upstream's test files (:data:`CHECKOUT_LIKE`) with the release's test base
    (:func:`test_base_stand_in`). The wheels ship no tests; none of ``test/`` is copied from Paddle.
    Returns the version."""
    version, _ = wheel_version(pkg_dir)
    for rel in wheel_tree_files():
        src = os.path.join(pkg_dir, *rel.split("/")[2:])
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copyfile(src, os.path.join(dest, rel))
    shutil.copytree(os.path.join(CHECKOUT_LIKE, "test"), os.path.join(dest, "test"), dirs_exist_ok=True)
    os.makedirs(os.path.dirname(os.path.join(dest, LEGACY_BASE)), exist_ok=True)
    _write(os.path.join(dest, LEGACY_BASE), test_base_stand_in(version))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", f"Paddle {version} (checkout-like)"],
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


def make_wheel_patch(venv, version=None, formatter=None):
    """(single patch text, version) for the installed wheel found at ``venv``."""
    pkg, found, description = _wheel_tree(venv, version)
    with tempfile.TemporaryDirectory(prefix="paddle-wheel-tree-") as tree:
        layout_wheel_tree(pkg, tree)
        return make_patch(tree, description, found, formatter), found


def make_wheel_series(venv, version=None, author=AUTHOR, formatter=None):
    """([(file name, text)], version) of the series for the installed wheel found at ``venv``."""
    pkg, found, _ = _wheel_tree(venv, version)
    with tempfile.TemporaryDirectory(prefix="paddle-wheel-tree-") as tree:
        layout_wheel_tree(pkg, tree)
        return make_series(tree, found, author, formatter), found


def write_series(files, folder):
    """Write the series' files into ``folder``, removing other ``*.patch`` files there."""
    os.makedirs(folder, exist_ok=True)
    for old in series_files(folder):
        if os.path.basename(old) not in dict(files):
            os.remove(old)
    for name, text in files:
        _write(os.path.join(folder, name), text)


def parse_author(value):
    """``"Name <email>"`` -> (name, email); PatchError otherwise."""
    m = re.fullmatch(r"\s*([^<>]+?)\s*<([^<>\s]+@[^<>\s]+)>\s*", value or "")
    if not m:
        raise PatchError(f"--author must look like 'Real Name <you@example.com>', got {value!r}")
    return m.group(1), m.group(2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--paddle-src", metavar="DIR", help="Paddle tree laid out as python/paddle/... (a checkout)")
    src.add_argument("--from-wheel", metavar="VENV", help="installed paddle wheel (venv, site-packages or package): "
                     "the patch is made for a checkout-like tree of it")
    parser.add_argument("--version", help="with --from-wheel: fail unless the wheel is this Paddle version; with "
                        "--paddle-src: the version named in the series' messages")
    parser.add_argument("--out", metavar="FILE", help="write the single patch here (default: stdout)")
    parser.add_argument("--series", metavar="DIR", help="write the series (0001-...patch onward) into DIR instead")
    parser.add_argument("--author", metavar="'NAME <EMAIL>'", help="the series' author and committer (default: "
                        f"the placeholder {AUTHOR[0]} <{AUTHOR[1]}>)")
    parser.add_argument("--formatter", choices=("black", "ruff"), help="format as the tree does (default: the "
                        "checkout's .pre-commit-config.yaml, or the release's, tools/make_patch.py FORMATTERS)")
    args = parser.parse_args(argv)
    try:
        author = parse_author(args.author) if args.author else AUTHOR
        if args.from_wheel:
            if args.series:
                files, _ = make_wheel_series(args.from_wheel, args.version, author, args.formatter)
            else:
                text, _ = make_wheel_patch(args.from_wheel, args.version, args.formatter)
        else:
            tree = os.path.abspath(args.paddle_src)
            version = args.version or tree_version(tree) or "<version>"
            if args.series:
                files = make_series(tree, version, author, args.formatter)
            else:
                text = make_patch(tree, f"the Paddle tree {os.path.basename(tree)}", version, args.formatter)
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
