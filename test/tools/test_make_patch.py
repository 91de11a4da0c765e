# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/make_patch.py and its manifest tools/patch_series.py: the direct edits, whole definitions per
PR, the series, the committed patches.

The editing rules are checked on small synthetic modules (no Paddle needed). The committed patches (the
3.3.1 series, the 2.6.2 single patch) and the ones generated on demand (the 2.6.2 series, the 3.3.1 single
patch) are checked against the installed wheels in ``.venv-test/paddle-<version>`` (skipped with the
reason when a venv is missing), laid out as checkout-like trees: regenerating gives the committed bytes;
the series applies PR by PR with ``git am``, giving each PR's files and appending its rows; every size the
docs quote is measured; nothing of this project's name, no ``_origin_`` method and no alias reaches it;
upstream's superseded overlap is gone; the drivers call only what the release's test base has; and the
overlay's wrappers and the patch's edits are the same statements.
"""

import ast
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import make_patch
from make_patch import PatchError, splice

VERSIONS = ("2.6.2", "3.3.1")


def dedent(text):
    return textwrap.dedent(text).lstrip("\n")


# --------------------------------------------------------------------------- editing rules

TARGET = dedent(
    '''
    import os

    from paddle import framework

    from ...utils.log_util import logger


    class Opt:
        def __init__(self):
            self.x = 1
            self._hooks = []

        # Synchronize parameters.
        @framework.dygraph_only
        @framework.no_grad
        def step(self):
            """Paddle's step."""
            if self._overlap:
                self.remove_hooks()
            return 1

        def sync(self, a):
            # upstream's comment
            if self._overlap:
                self.a = a + 1
            else:
                self.a = a + 2

        def _hook_function(self, tasks):
            return tasks

        def replaced(self, a):
            return a

        def __getattr__(self, item):
            return getattr(self.x, item)


    class Other:
        def step(self):
            return 2
    '''
)

OVERLAY = dedent(
    '''
    """Overlay docstring: not spliced."""

    import weakref

    from paddle import framework

    from . import helper_module
    from .helper import Helper

    OVERLAY_WRAPS = {"Opt": ("step", "sync")}
    SUPERSEDED = {
        "Opt": {
            "__init__": ("self._hooks = []",),
            "step": ("if self._overlap:",),
            "sync": ("if self._overlap:",),
            "_hook_function": "*",
        }
    }


    class Opt:
        """Overlay class docstring: not spliced."""

        def step(self):
            """The edit's docstring: not spliced."""
            # waits first
            Helper.wait(self)

        def sync(self, a):
            helper_module.before(self)

            ...  # Paddle's body
            helper_module.after(self)

        def replaced(self, a, b=None):
            with framework.no_grad():
                return [isinstance(v, int) for v in (a, b)]

        def added(self):
            return weakref.ref(Helper)
    '''
)


def methods_of(text, name="Opt"):
    """{method: its source text} of class ``name``."""
    module, lines = ast.parse(text), text.splitlines(True)
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {n.name: "".join(lines[make_patch._first_line(n, text.splitlines()) - 1 : n.end_lineno])
            for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_edits_go_at_the_top_and_end_of_paddles_methods_without_renaming():
    out, deleted = splice(TARGET, OVERLAY, "Opt")
    methods = methods_of(out)
    assert methods["step"] == textwrap.indent(dedent(
        '''
        # Synchronize parameters.
        @framework.dygraph_only
        @framework.no_grad
        def step(self):
            """Paddle's step."""
            # waits first
            Helper.wait(self)
            return 1
        '''), "    ")
    assert methods["sync"] == textwrap.indent(dedent(
        '''
        def sync(self, a):
            helper_module.before(self)

            # upstream's comment
            self.a = a + 2
            helper_module.after(self)
        '''), "    ")
    assert "_origin_" not in out and "not spliced" not in out and "OVERLAY_WRAPS" not in out
    assert methods_of(out, "Other") == methods_of(TARGET, "Other")  # the other class is untouched
    assert deleted == ["Opt.__init__: self._hooks = []", "Opt.step: if self._overlap:", "Opt.sync: if self._overlap:",
                       "Opt._hook_function"]


def test_superseded_code_is_deleted_and_an_if_keeps_the_branch_taken_without_it():
    out, _ = splice(TARGET, OVERLAY, "Opt")
    methods = methods_of(out)
    assert "_hook_function" not in methods and "self._hooks" not in out and "_overlap" not in out
    assert "self.a = a + 2" in methods["sync"] and "a + 1" not in methods["sync"]
    not_flag = TARGET.replace("if self._overlap:\n            self.a = a + 1", "if not self._overlap:\n"
                              "            self.a = a + 1")
    assert not_flag != TARGET
    overlay = OVERLAY.replace('"sync": ("if self._overlap:",)', '"sync": ("if not self._overlap:",)')
    out, _ = splice(not_flag, overlay, "Opt")
    assert "self.a = a + 1" in methods_of(out)["sync"] and "a + 2" not in out


def test_a_release_without_the_superseded_code_skips_it_and_an_ambiguous_prefix_is_refused():
    bare = TARGET.replace("        self._hooks = []\n", "")
    assert bare != TARGET
    _, deleted = splice(bare, OVERLAY, "Opt")
    assert "Opt.__init__: self._hooks = []" not in deleted
    twice = TARGET.replace("        return 1\n", "        if self._overlap:\n            pass\n        return 1\n")
    assert twice != TARGET
    with pytest.raises(PatchError, match="2 statements of Opt.step start with"):
        splice(twice, OVERLAY, "Opt")


def test_replaced_in_place_and_new_methods_appended_and_only_missing_imports_added():
    out, _ = splice(TARGET, OVERLAY, "Opt")
    assert list(methods_of(out)) == ["__init__", "step", "sync", "replaced", "__getattr__", "added"]
    overlay = methods_of(OVERLAY)
    for name in ("replaced", "added"):
        assert methods_of(out)[name] == overlay[name]
    lines = out.splitlines()
    assert lines[:2] == ["import os", "import weakref"]  # a plain import among the plain ones
    assert lines.count("from paddle import framework") == 1
    i = lines.index("from ...utils.log_util import logger")
    assert lines[i + 1 : i + 3] == ["from . import helper_module", "from .helper import Helper"]
    assert splice(TARGET, OVERLAY, "Opt") == splice(TARGET, OVERLAY, "Opt")  # stable
    compile(out, "spliced", "exec")


def test_edits_that_would_read_other_names_or_run_too_late_are_refused():
    with pytest.raises(PatchError, match="the overlay's edit takes"):
        splice(TARGET, OVERLAY.replace("def sync(self, a):", "def sync(self, b):"), "Opt")
    returns = TARGET.replace("            self.a = a + 2\n", "            self.a = a + 2\n        return a\n")
    assert returns != TARGET
    with pytest.raises(PatchError, match="returns before its end"):
        splice(returns, OVERLAY, "Opt")
    with pytest.raises(PatchError, match="more than one"):
        splice(TARGET, OVERLAY.replace("...  # Paddle's body", "...\n        ..."), "Opt")
    with pytest.raises(PatchError, match="to edit is missing"):
        splice(TARGET.replace("def sync(self, a):", "def sink(self, a):"), OVERLAY, "Opt")


def test_names_the_patch_cannot_carry_are_refused():
    with pytest.raises(PatchError, match="module-level OVERLAY_WRAPS"):
        splice(TARGET, OVERLAY.replace("return weakref.ref(Helper)", "return OVERLAY_WRAPS"), "Opt")
    with pytest.raises(PatchError, match="framework is bound to"):
        splice(TARGET.replace("from paddle import framework", "from paddle.base import framework"), OVERLAY, "Opt")
    with pytest.raises(PatchError, match="absent in Paddle"):
        splice(TARGET, OVERLAY.replace("from .helper import Helper", "from paddle_overlay.x import Helper"), "Opt")
    with pytest.raises(PatchError, match="must not reach Paddle"):
        splice(TARGET, OVERLAY.replace("Helper.wait(self)", "self._origin_step()"), "Opt")


def test_names_read_by_defaults_decorators_and_annotations_get_imported():
    """They are evaluated where the def runs (class body, then module), not in the method."""
    overlay = OVERLAY.replace("from .helper import Helper", "from .helper import SIZE, Helper, Kind, wrap")
    overlay = overlay.replace("    def added(self):\n", "    @wrap\n    def added(self, size=SIZE, *, kind: Kind = None) -> Kind:\n")
    out, _ = splice(TARGET, overlay, "Opt")
    assert "from .helper import Helper, Kind, SIZE, wrap" in out.splitlines()
    compile(out, "spliced", "exec")


def test_superseded_entries_delete_nested_classes_keep_a_named_branch_and_drop_parameters():
    target = dedent(
        '''
        import enum


        class Buffer:
            class Status(enum.Enum):
                READY = 1

            def __init__(self):
                self.params = []
                self.status = Buffer.Status.READY

            def sync(self, sync=True, tasks={}):
                if sync:
                    self.gather().wait()
                else:
                    tasks[0] = self.gather()
        '''
    )
    deletions = {"Status": "*", "__init__": ("self.status = Buffer.Status.READY",),
                 "sync": (("if sync:", "body"), "parameter: sync", "parameter: tasks")}
    out, done = make_patch.delete_superseded(target, deletions, "Buffer")
    assert "Status" not in out and "tasks" not in out and "def sync(self):" in out
    assert "        self.gather().wait()\n" in out and "else" not in out
    assert done == ["Buffer.Status", "Buffer.__init__: self.status = Buffer.Status.READY", "Buffer.sync: if sync:",
                    "Buffer.sync: parameter: sync", "Buffer.sync: parameter: tasks"]
    with pytest.raises(PatchError, match="must be"):
        make_patch._check_superseded({"sync": (("if sync:", "elsewhere"),)}, "x")


# --------------------------------------------------------------------------- whole definitions per PR

MODULE = dedent(
    '''
    """A module of two PRs."""

    import os

    from .later import helper

    _REGISTRY = {"a": 1}
    # added by the second PR, with this comment
    _REGISTRY["b"] = 2


    class Owner:
        """Its docstring names only what the first PR has."""

        KIND = "x"
        # the second PR's
        LATER = "y"

        def first(self):
            return os.sep

        @property
        def second(self):
            return helper(self)


    def later_function():
        return helper(None)
    '''
)


def test_text_at_leaves_a_later_prs_definitions_out_with_their_comments_and_imports(monkeypatch):
    path = "paddle_overlay/x.py"
    monkeypatch.setattr(make_patch, "FIRST_PR", {path: 0})
    monkeypatch.setattr(make_patch, "ADDED_IN", {(path, "_REGISTRY['b']"): 1, (path, "Owner.LATER"): 1,
                                                 (path, "Owner.second"): 1, (path, "later_function"): 2})
    first = make_patch.text_at(MODULE, path, 0)
    assert "helper" not in first and "LATER" not in first and "second" not in first and '"b"' not in first
    assert "with this comment" not in first and "the second PR's" not in first
    compile(first, path, "exec")
    second = make_patch.text_at(MODULE, path, 1)
    assert "from .later import helper" in second and "def second" in second and "later_function" not in second
    assert make_patch.text_at(MODULE, path, 2) == MODULE
    monkeypatch.setattr(make_patch, "ADDED_IN", {(path, "no_such"): 1})
    with pytest.raises(PatchError, match="does not define"):
        make_patch.text_at(MODULE, path, 0)
    monkeypatch.setattr(make_patch, "FIRST_PR", {path: 1})
    monkeypatch.setattr(make_patch, "ADDED_IN", {(path, "later_function"): 1})
    with pytest.raises(PatchError, match="not before it"):
        make_patch.text_at(MODULE, path, 1)
    assert make_patch.text_at(MODULE, path, 0) is None


def test_the_manifest_names_real_definitions_and_every_carried_file_once():
    listed = [p for pr in make_patch.patch_series.PRS for p in pr["files"]]
    assert len(listed) == len(set(listed))
    assert set(make_patch.patch_source_files()) == {p for p in listed if p in make_patch.patch_source_files()}
    for path in make_patch.patch_source_files():  # every carried file in one PR (text_at checks the adds)
        assert path in make_patch.FIRST_PR, path
        make_patch.source_at(os.path.join(ROOT, path), len(make_patch.PR_KEYS) - 1)
    assert make_patch.PR_KEYS[make_patch.SUPERSEDED_PR] == "cleanup"
    for k, pr in enumerate(make_patch.patch_series.PRS):
        for path, name in (entry.split("::", 1) for entry in pr.get("adds", ())):
            assert make_patch.FIRST_PR[path] < k, (pr["key"], path)


# Paddle's own names the overlay edits or replaces: a PR may name them before the PR that edits them
PADDLE_NAMES = {"step", "rebuild", "clear_param_storage", "_sharding_sync_parameters", "minimize", "__call__",
                "_step", "_insert_sync", "state_dict", "__init__", "_set_broadcast_overlap",
                "_set_all_gather_overlap_forward"}


def later_names(k):
    """Names of module-level definitions and added members that come after PR ``k`` (distinctive ones:
    snake_case with an underscore inside, or CamelCase), for the mention check."""
    names = set()
    for path in make_patch.patch_source_files():
        if not path.startswith("paddle_overlay/"):
            continue  # the tests: whole files of their own PR
        module = ast.parse(make_patch._read(os.path.join(ROOT, path)))
        for name, node in make_patch.definitions(module):
            pr = make_patch.ADDED_IN.get((path, name), make_patch.FIRST_PR[path])
            member = "." in name
            if pr <= k or (member and (path, name) not in make_patch.ADDED_IN):
                continue
            short = name.split(".")[-1]
            if short in PADDLE_NAMES or "[" in short or short.startswith("case_"):
                continue
            if re.search(r"[a-z]_[a-z]", short.strip("_")) or re.match(r"[A-Z][a-z]+[A-Z]", short):
                names.add(short)
    return names - {c for _, c in make_patch.SPLICED}


def test_no_pr_names_what_a_later_pr_adds():
    """A docstring, comment or line of PR k that names a definition of a later PR would dangle in that PR
    (a signature or docstring written for the whole series): whole definitions only, each naming what its
    PR has."""
    found = []
    for k in range(len(make_patch.PR_KEYS)):
        later = later_names(k)
        for path in make_patch.patch_source_files():
            if path not in make_patch.FIRST_PR or not path.startswith("paddle_overlay/"):
                continue
            text = make_patch.source_at(os.path.join(ROOT, path), k)
            for name in later if text else ():
                for m in re.finditer(rf"(?<![\w.]){re.escape(name)}\b", text):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"PR {k + 1} {path}:{line}: {name}")
    assert found == []


# --------------------------------------------------------------------------- release flags

FLAGGED = dedent(
    '''
    import inspect

    import paddle

    # the release's way
    _HAS_PREPEND = "prepend" in inspect.signature(paddle.f).parameters


    def register(layer, hook):
        if _HAS_PREPEND:
            return layer.register(hook, prepend=True)
        else:
            # by hand
            handle = layer.register(hook)
            return handle
    '''
)


def test_release_flags_keep_the_releases_branch_and_drop_what_only_the_flag_used():
    new = make_patch.fold_flags(FLAGGED, {"_HAS_PREPEND": True})
    assert "inspect" not in new and "_HAS_PREPEND" not in new and "prepend=True" in new and "by hand" not in new
    old = make_patch.fold_flags(FLAGGED, {"_HAS_PREPEND": False})
    assert "prepend=True" not in old and "    # by hand\n    handle = layer.register(hook)\n" in old
    compile(new, "new", "exec")
    compile(old, "old", "exec")


# --------------------------------------------------------------------------- the overlay and the patch agree


def wheel_package(version):
    venv = os.path.join(ROOT, ".venv-test", f"paddle-{version}")
    try:
        return make_patch.paddle_package_dir(venv)
    except PatchError as e:
        pytest.skip(f"Paddle {version} wheel not installed: {e}")


def wheel_tree(version, tmp_path):
    tree = str(tmp_path / f"Paddle-{version}")
    make_patch.layout_wheel_tree(wheel_package(version), tree)
    return tree


def body_dumps(fn):
    """ast.dump of each statement of a function's body, its docstring left out."""
    return [ast.dump(st) for st in body_dumps_node(fn)]


def body_dumps_node(fn):
    return fn.body[1:] if make_patch._is_docstring(fn.body[0]) else fn.body


@pytest.mark.parametrize("version", VERSIONS)
def test_each_edited_method_is_the_overlays_statements_around_paddles_body(version, tmp_path):
    """What the overlay runs around Paddle's method (apply()'s wrapper: the edit's statements before
    and after '...') is what the patch puts into it: the patched method's body is those statements
    around upstream's body (the superseded code deleted). A hand edit of either side fails here."""
    tree = wheel_tree(version, tmp_path)
    files = make_patch.patched_files(tree)
    checked = 0
    for module, class_name in make_patch.SPLICED:
        overlay_text = make_patch._read(make_patch.overlay_path(module))
        overlay_mod = ast.parse(overlay_text)
        wraps = make_patch._overlay_wraps(overlay_mod, module, class_name)
        _, o_methods = make_patch._find_class(overlay_mod, class_name)
        upstream = make_patch._read(os.path.join(tree, make_patch.tree_path(module)))
        upstream, _ = make_patch.delete_superseded(
            upstream, make_patch._superseded(overlay_mod, module, class_name), class_name)
        _, t_methods = make_patch._find_class(ast.parse(upstream), class_name)
        _, p_methods = make_patch._find_class(ast.parse(files[make_patch.tree_path(module)]), class_name)
        optional = make_patch._literal(overlay_mod, "EDITED_WHERE_DEFINED", module, class_name, ())
        for name in wraps:
            if name in optional and name not in t_methods:  # edited where the release defines it
                assert name not in p_methods, (version, class_name, name)
                continue
            o_body = body_dumps(o_methods[name])
            mark = next((i for i, d in enumerate(o_body) if "Ellipsis" in d and d.startswith("Expr")), len(o_body))
            expected = o_body[:mark] + body_dumps(t_methods[name]) + o_body[mark + 1 :]
            assert body_dumps(p_methods[name]) == expected, (version, class_name, name)
            checked += 1
    # V1 step/minimize/sync, V2 step/sync (3.x: rebuild/clear_param_storage too), HPO _step/_insert_sync,
    # StaticFunction.__call__
    assert checked == (8 if version.startswith("2.") else 10), checked


def test_apply_builds_its_wrappers_from_the_same_statements():
    """paddle_overlay's edit_wrapper() runs the statements make_patch writes into Paddle (and Paddle's
    original between them), read from the same source."""
    pytest.importorskip("paddle")
    from paddle_overlay import _patching

    for module, class_name in make_patch.SPLICED:
        import importlib

        overlay_module = importlib.import_module(f"paddle_overlay.{module}")
        cls = getattr(overlay_module, class_name)
        text = make_patch._read(make_patch.overlay_path(module))
        _, o_methods = make_patch._find_class(ast.parse(text), class_name)
        for name in _patching.wraps_of(overlay_module, class_name):
            node, prologue, mark, epilogue = _patching._edit_parts(vars(cls)[name])
            lines = text.splitlines()
            pro, epi = make_patch._edit_parts(o_methods[name], lines, name)
            assert [ast.dump(s) for s in prologue] == [ast.dump(s) for s in ast.parse(textwrap.dedent(
                "\n".join(pro))).body], (class_name, name)
            assert [ast.dump(s) for s in epilogue] == [ast.dump(s) for s in ast.parse(textwrap.dedent(
                "\n".join(epi))).body] if epi else epilogue == [], (class_name, name)


# --------------------------------------------------------------------------- committed and generated patches

# what is committed (each has a consumer: the 3.3.1 series is the PR set to submit, the 2.6.2 single patch
# the build patch of the oldest release); the others are generated on demand
COMMITTED_SERIES, COMMITTED_SINGLE = ("3.3.1",), ("2.6.2",)


def test_only_the_patches_with_a_consumer_are_committed():
    found = sorted(os.path.relpath(p, make_patch.PATCH_DIR) for p in glob_patches())
    expected = [os.path.relpath(p, make_patch.PATCH_DIR) for v in COMMITTED_SERIES for p in make_patch.series_files(v)]
    expected += [os.path.relpath(make_patch.patch_path(v), make_patch.PATCH_DIR) for v in COMMITTED_SINGLE]
    assert found == sorted(expected) and len(expected) == len(make_patch.PR_KEYS) + 1


def glob_patches():
    import glob

    return glob.glob(os.path.join(make_patch.PATCH_DIR, "**", "*.patch"), recursive=True)


@pytest.mark.parametrize("version", COMMITTED_SERIES)
def test_regenerating_gives_the_committed_series_byte_for_byte(version):
    series, found = make_patch.make_wheel_series(wheel_package(version), version)
    assert found == version
    committed = make_patch.series_files(version)
    stale = "stale: regenerate with bash tools/update_generated.sh"
    assert [os.path.basename(p) for p in committed] == [name for name, _ in series], stale
    for path, (_, text) in zip(committed, series):
        assert make_patch._read(path) == text, f"{os.path.relpath(path, ROOT)} is {stale}"
    assert [name[:5] for name, _ in series] == [f"{k + 1:04d}-" for k in range(len(make_patch.PR_KEYS))]


@pytest.mark.parametrize("version", COMMITTED_SINGLE)
def test_regenerating_gives_the_committed_single_patch_byte_for_byte(version):
    single, _ = make_patch.make_wheel_patch(wheel_package(version), version)
    assert make_patch._read(make_patch.patch_path(version)) == single, "stale: bash tools/update_generated.sh"


def test_generation_is_deterministic_and_the_author_a_placeholder_unless_given():
    pkg = wheel_package("3.3.1")
    first = make_patch.make_wheel_series(pkg)[0]
    assert first == make_patch.make_wheel_series(pkg)[0]
    text = first[0][1]
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert "From: Author Placeholder <author.placeholder@example.invalid>\n" in text
    assert "Date: Thu, 1 Jan 2026 00:00:00 +0000" in text and not text.rstrip().endswith(("-- ", "--"))
    mine = make_patch.make_wheel_series(pkg, author=("Jane Doe", "jane@example.com"))[0]
    assert "From: Jane Doe <jane@example.com>\n" in mine[0][1]
    assert [t.replace("Jane Doe <jane@example.com>", "") for _, t in mine] == [
        t.replace("Author Placeholder <author.placeholder@example.invalid>", "") for _, t in first]
    assert make_patch.parse_author(" A B <a@b.c> ") == ("A B", "a@b.c")
    with pytest.raises(PatchError, match="--author"):
        make_patch.parse_author("no email")


def message_sections(text):
    head = text.split("\n---\n", 1)[0]
    return re.findall(r"^### (.+)$", head, re.M)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_series_applies_pr_by_pr_with_git_am_and_each_pr_registers_its_tests(version, tmp_path):
    """Generated for the checkout-like tree (committed for 3.3.1): each PR applies with git am, its tree is the
    generated state and compiles, it appends the rows of the drivers it adds (and no other) to testslist.csv,
    its message follows Paddle's template, and the single patch is the series' sum."""
    tree = wheel_tree(version, tmp_path)
    series = make_patch.make_series(tree, version)
    if version in COMMITTED_SERIES:
        assert [t for _, t in series] == [make_patch._read(p) for p in make_patch.series_files(version)]
    titles = [pr["title"] for pr in make_patch.patch_series.PRS]
    rows_before = []
    for name, text in series:
        path = tmp_path / name
        path.write_text(text)
        assert message_sections(text) == ["PR Category", "PR Types", "Description"], name
        assert "Distributed Strategy" in text.split("### PR Types", 1)[0]
        make_patch.git(tree, "am", "--quiet", "--keep-non-patch", str(path))
        k = titles.index(make_patch.git(tree, "log", "-1", "--format=%s").strip())
        for rel, new in make_patch.patched_files(pristine(version, tmp_path), k).items():
            assert make_patch._read(os.path.join(tree, rel)) == new, (k, rel)
            if rel.endswith(".py"):
                compile(new, rel, "exec")
        rows = make_patch.testslist_rows(k)
        added_rows = [ln[1:] for ln in text.split(f"+++ b/{make_patch.TREE_TESTSLIST}\n", 1)[-1].splitlines()
                      if ln.startswith("+")] if make_patch.TREE_TESTSLIST in text else []
        assert added_rows == rows[len(rows_before):], (k, added_rows)
        for row in added_rows:
            assert f"+++ b/{make_patch.TREE_TEST_DIR}/{row.split(',')[0]}.py" in text
        rows_before = rows
    assert make_patch.git(tree, "log", "-1", "--format=%s").strip() == titles[-1 if version != "2.6.2" else -2]
    fresh = wheel_tree(version, tmp_path / "fresh")
    single = make_patch.make_patch(fresh, "a tree", version)
    if version in COMMITTED_SINGLE:
        assert single.split("\ndiff --git", 1)[1] == make_patch._read(make_patch.patch_path(version)).split(
            "\ndiff --git", 1)[1]
    (tmp_path / "single.patch").write_text(single)
    make_patch.git(fresh, "apply", str(tmp_path / "single.patch"))
    for rel, new in make_patch.patched_files(pristine(version, tmp_path)).items():
        assert make_patch._read(os.path.join(fresh, rel)) == new, rel
    other = [v for v in VERSIONS if v != version][0]
    third = wheel_tree(version, tmp_path / "third")
    (tmp_path / "other.patch").write_text(make_patch.make_patch(pristine(other, tmp_path), "other", other))
    proc = subprocess.run(["git", "apply", "--check", str(tmp_path / "other.patch")], cwd=third, capture_output=True)
    assert proc.returncode != 0


_PRISTINE = {}


def pristine(version, tmp_path):
    if version not in _PRISTINE or not os.path.isdir(_PRISTINE[version]):
        _PRISTINE[version] = wheel_tree(version, tmp_path / f"pristine-{version}")
    return _PRISTINE[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_pr_sizes_stay_reviewable_and_the_large_ones_say_why(version, tmp_path):
    """No PR over about 600 changed lines (tests and rows included) unless its message says why; the sizes
    in each message are the commit's own."""
    tree = wheel_tree(version, tmp_path)
    for name, text in make_patch.make_series(tree, version):
        stat = re.search(r"^ (\d+) files? changed(?:, (\d+) insertions?\(\+\))?(?:, (\d+) deletions?\(-\))?$", text,
                         re.M)
        added, deleted = int(stat.group(2) or 0), int(stat.group(3) or 0)
        assert f"+{added} -{deleted} lines" in text, name
        if added + deleted > 620:
            size = text.split("Size: ", 1)[1].split("\n---\n", 1)[0]
            assert "because" in size, f"{name}: {added + deleted} changed lines and no reason in its Size"
        assert added + deleted < 800, name


@pytest.mark.parametrize("version", VERSIONS)
def test_nothing_of_this_project_reaches_paddle(version, tmp_path):
    """No paddle_overlay / PADDLE_OVERLAY, no _origin_ name (Paddle's own _origin_parameter_list aside),
    no alias of broadcast_overlap.py in any added line or message of the series or the single patch."""
    tree = wheel_tree(version, tmp_path)
    texts = [t for _, t in make_patch.make_series(tree, version)] + [make_patch.make_patch(tree, "x", version)]
    for text in texts:
        assert make_patch.banned_in(text) == []
    assert make_patch.banned_in("+        self._origin_step()\n") == ["1: _origin_step"]
    assert make_patch.banned_in("+x = get_broadcast_overlap(opt)\n") == ["1: get_broadcast_overlap"]
    assert make_patch.banned_in("+from .broadcast_overlap import x\n+s = 'dygraph_broadcast_overlap.py'\n") == [
        "1: .broadcast_overlap"]
    assert make_patch.banned_in("+    def _set_broadcast_overlap(self, broadcast_overlap):\n") == []
    assert make_patch.banned_in(" self._origin_step()  # upstream context\n+p = self._origin_parameter_list\n") == []


UPSTREAM_OVERLAP = ("_forward_pre_hook_function", "_try_start_bucket_param_sync", "make_forward_hook",
                    "_register_pre_forward_hooks", "_broadcast_order_params", "_forward_pre_hook_remove_helper",
                    "has_register_forward_hook", "FusedCommBuffer.Status", "sync_param_task")
# write-only after the series: set, never read
WRITE_ONLY = ("_broadcast_overlap", "_all_gather_overlap_forward")


@pytest.mark.parametrize("version", VERSIONS)
def test_upstreams_superseded_overlap_and_write_only_flags_are_gone(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    report = []
    files = make_patch.patched_files(tree, report=report)
    dso = files.get(make_patch.tree_path(make_patch.SPLICED[0][0]))
    hpo = files[make_patch.tree_path("distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer")]
    tfh_rel = make_patch.tree_path("distributed.fleet.utils.tensor_fusion_helper")
    tfh = files.get(tfh_rel) or make_patch._read(os.path.join(tree, tfh_rel))
    assert [name for name in UPSTREAM_OVERLAP if name in dso + tfh] == []
    for flag in WRITE_ONLY:  # neither written nor read by the patched classes
        assert not re.search(rf"self\.{flag}\b", dso + hpo), flag
    assert not re.search(r"self\._layers\b", hpo)
    assert "def sync_params(self):" in tfh or "sync_param_task" not in make_patch._read(os.path.join(tree, tfh_rel))
    expected = []
    if version == "3.3.1":  # every SUPERSEDED entry applied, and what only they used elsewhere
        overlay_mod = ast.parse(make_patch._read(make_patch.overlay_path(make_patch.SPLICED[0][0])))
        for class_name in ("DygraphShardingOptimizer", "DygraphShardingOptimizerV2"):
            for method, what in make_patch._superseded(overlay_mod, "", class_name).items():
                expected += [f"{class_name}.{method}"] if what == "*" else [
                    f"{class_name}.{method}: {w if isinstance(w, str) else w[0]}" for w in what]
        for classes in make_patch.superseded_elsewhere().values():
            for class_name, deletions in classes.items():
                for method, what in deletions.items():
                    expected += [f"{class_name}.{method}"] if what == "*" else [
                        f"{class_name}.{method}: {w if isinstance(w, str) else w[0]}" for w in what]
        assert "import enum" not in tfh  # only Status used it
    assert sorted(report) == sorted(expected)  # 2.6 has no upstream overlap: nothing deleted
    translator = files["python/paddle/jit/dy2static/program_translator.py"]
    call = make_patch._find_class(ast.parse(translator), "StaticFunction")[1]["__call__"]
    assert ast.dump(body_dumps_node(call)[0]) == ast.dump(ast.parse("run_pre_call_hooks()").body[0])
    assert "fleet" not in translator and "fleet" not in files["python/paddle/jit/dy2static/pre_call_hooks.py"]
    pso = files[make_patch.tree_path("distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap")]
    assert ("move_to_end" in pso) == (version == "2.6.2") and "_HAS_PREPEND" not in pso and "import inspect" not in pso


def test_the_write_only_flags_are_read_by_no_trainer():
    """Checked by hand in the index of public code (docs/patches.md): trainers read ``_broadcast_overlap`` only
    of GroupShardedOptimizerStage2; the series deletes the flag from DygraphShardingOptimizer and
    HybridParallelOptimizer only. Here: the overlay sets none of them either."""
    for module, _ in make_patch.SPLICED:
        written = {ast.unparse(t) for n in ast.walk(ast.parse(make_patch._read(make_patch.overlay_path(module))))
                   if isinstance(n, (ast.Assign, ast.AugAssign)) for t in getattr(n, "targets", [n.target] if hasattr(
                       n, "target") else [])}
        assert not written & {"self._broadcast_overlap", "self._all_gather_overlap_forward", "self._layers"}, module


# --------------------------------------------------------------------------- what the patch holds


def blocks(patch):
    """{path: diff block text} of a patch."""
    out = {}
    for block in patch.split("diff --git a/")[1:]:
        out[block.split(" ", 1)[0]] = block
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_changes_python_appends_rows_and_adds_new_files_only(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    found = blocks(make_patch.make_patch(tree, "x", version))
    changed = sorted(p for p, b in found.items() if "\nnew file mode " not in b.split("\n@@", 1)[0])
    edited = {make_patch.tree_path(m) for m, _ in make_patch.SPLICED}
    if version == "3.3.1":
        edited |= {make_patch.tree_path(m) for m in make_patch.superseded_elsewhere()}
    assert changed == sorted(edited | {make_patch.TREE_TESTSLIST})
    added = sorted(p for p in found if p not in changed)
    expected = [make_patch.tree_path(m) for m in make_patch.NEW_MODULES]
    expected += [f"{make_patch.TREE_TEST_DIR}/{n}" for n in make_patch.TEST_FILES]
    assert added == sorted(expected)
    rows = [ln[1:] for ln in found[make_patch.TREE_TESTSLIST].splitlines()
            if ln.startswith("+") and not ln.startswith("+++")]
    assert rows == make_patch.testslist_rows() and "CMakeLists.txt" not in " ".join(found)
    assert len(rows) == sum(1 for n in make_patch.TEST_FILES if n.startswith("test_"))


def optional_imports(tree):
    """Import nodes inside ``try: ... except ImportError`` (may name modules the patch lacks)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id in (
                "ImportError", "ModuleNotFoundError") for h in node.handlers):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def dangling(folder, carried, package=None):
    """{carried file: sorted sibling files of ``folder`` it needs and the patch lacks}: modules it
    imports (``package``: the dotted name of ``folder``, for relative imports) and, for
    drivers, the ``*.py`` files it names."""
    here = {n for n in os.listdir(folder) if n.endswith(".py")}
    out = {}
    for name in carried:
        tree = ast.parse(make_patch._read(os.path.join(folder, name)), name)
        optional, needed = optional_imports(tree), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                mods = [node.module] if node.module else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and package and (node.module or "").startswith(package + "."):
                mods = [node.module[len(package) + 1 :]]
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and not package:
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and name.startswith("test_"):
                needed.update({node.value} & here)
                continue
            else:
                continue
            if id(node) not in optional:
                needed.update(f"{m.split('.')[0]}.py" for m in mods if f"{m.split('.')[0]}.py" in here)
        missing = sorted(needed - set(carried))
        if missing:
            out[name] = missing
    return out


def selection_problems(test_files=make_patch.TEST_FILES):
    """What the files the patch carries need and it leaves out (see :func:`dangling`)."""
    problems = {}
    folders = {}
    for module in [m for m, _ in make_patch.SPLICED] + list(make_patch.NEW_MODULES):
        folders.setdefault(os.path.dirname(make_patch.overlay_path(module)), []).append(
            os.path.basename(make_patch.overlay_path(module)))
    for folder, names in folders.items():
        package = "paddle." + os.path.relpath(folder, make_patch.OVERLAY_ROOT).replace(os.sep, ".")
        problems.update(dangling(folder, names, package))
    return {**problems, **dangling(make_patch.TEST_DIR, test_files)}


def test_patch_carries_upstream_form_tests_only_and_leaves_nothing_dangling():
    """Every carried file's sibling imports and every per-rank script a carried driver names are
    carried too (else: add them to tools/patch_series.py, or make the import optional); the
    project's own test tooling (the case module, the wait checker) stays here; carried drivers
    launch through Paddle's own multi-process base (as the newest releases name it here)."""
    assert selection_problems() == {}
    for kept_here in ("sharding_cases.py", "param_sync_checker.py"):
        assert os.path.isfile(os.path.join(make_patch.TEST_DIR, kept_here)), kept_here
        assert kept_here not in make_patch.TEST_FILES
    rows = make_patch.testslist_rows()
    assert sorted(r.split(",")[0] + ".py" for r in rows) == sorted(n for n in make_patch.TEST_FILES if n.startswith("test_"))
    cls, method = make_patch.SOURCE_BASE
    for row in rows:
        driver = make_patch._read(os.path.join(make_patch.TEST_DIR, row.split(",")[0] + ".py"))
        assert re.search(rf"from legacy_test\.test_parallel_dygraph_dataparallel import \(\n    {cls},\n\)", driver)
        assert f"self.{method}(" in driver and "collective_launch" not in driver


def test_dangling_names_what_a_carried_file_needs(tmp_path):
    files = {
        "test_drv.py": 'SCRIPT = "rank.py"\nOTHER = "not_here.py"\n',
        "rank.py": "import helper\nfrom checker import Checker\ntry:\n    import shim\nexcept ImportError:\n    shim = None\n",
        "helper.py": "import os\n", "checker.py": "", "shim.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert dangling(str(tmp_path), ["test_drv.py"]) == {"test_drv.py": ["rank.py"]}
    assert dangling(str(tmp_path), ["test_drv.py", "rank.py"]) == {"rank.py": ["checker.py", "helper.py"]}
    assert dangling(str(tmp_path), ["test_drv.py", "rank.py", "helper.py", "checker.py"]) == {}


def test_a_selection_that_leaves_a_dependency_out_is_found(monkeypatch, tmp_path):
    reads = "dygraph_sharding_stage1_broadcast_overlap_reads.py"
    if os.path.isfile(os.path.join(make_patch.TEST_DIR, reads)):
        assert "param_sync_checker.py" in selection_problems(make_patch.TEST_FILES + (reads,))[reads]
    monkeypatch.setattr(make_patch, "NEW_MODULES", ("distributed.no_such_module",))
    with pytest.raises(PatchError, match=r"missing: paddle_overlay/distributed/no_such_module.py"):
        make_patch.patched_files(str(tmp_path))


def test_upstream_bf16_names_are_not_taken_and_no_added_file_imports_this_project():
    """Not even optionally: the test-only modules of tools/collective (the CPU shim among them) are brought
    to CPU ranks from outside, never imported by a carried file."""
    ours = make_patch.TEST_FILES
    assert "dygraph_group_sharded_stage1_bf16.py" not in ours and "test_dygraph_sharding_stage1_bf16.py" not in ours
    tools = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, "tools", "collective")) if n.endswith(".py"))
    assert "hybrid_parallel_cpu_shim" in tools and "blocking_calls" in tools, tools
    offenders = {}
    for rel in make_patch.patch_source_files():
        for banned in ("paddle_overlay", "rank_ready", "stand_in_launch", *tools):
            if banned in imports_of(make_patch._read(os.path.join(ROOT, rel)), rel):
                offenders.setdefault(rel, []).append(banned)
    assert offenders == {}


def imports_of(text, filename="<file>"):
    """Top-level module names a Python source imports anywhere (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(text, filename)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_tree_that_already_has_a_file_we_add_is_refused(tmp_path):
    tree = wheel_tree("3.3.1", tmp_path)
    with open(os.path.join(tree, make_patch.TREE_TEST_DIR, make_patch.TEST_FILES[0]), "w") as f:
        f.write("# upstream has a file of this name\n")
    with pytest.raises(PatchError, match="the patch adds new files only"):
        make_patch.patched_files(tree)


# --------------------------------------------------------------------------- the test base of each release


@pytest.mark.parametrize("version", VERSIONS)
def test_drivers_call_only_what_the_releases_test_base_has(version, tmp_path):
    """Each release's test base (make_patch.RELEASE_TEST_BASES, read from stored copies of its tree): the
    drivers of its patch import that class only and call that method only, with the arguments its
    signature takes; the checkout-like tree's stand-in defines exactly that (a driver calling another
    name fails there, at import or call)."""
    cls, method, parameters = make_patch.RELEASE_TEST_BASES[version]
    allowed = {p.split("=")[0].strip() for p in parameters.split(",")} - {"self"}
    tree = wheel_tree(version, tmp_path)
    stand_in = make_patch._read(os.path.join(tree, make_patch.LEGACY_BASE))
    module = ast.parse(stand_in)
    assert [n.name for n in module.body if isinstance(n, ast.ClassDef)] == [cls]
    assert [f.name for f in module.body[-1].body if isinstance(f, ast.FunctionDef)] == [method]
    other = {c for c, _, _ in make_patch.RELEASE_TEST_BASES.values()} - {cls}
    files = make_patch.patched_files(tree)
    drivers = {rel: text for rel, text in files.items() if os.path.basename(rel).startswith("test_")}
    assert len(drivers) == sum(1 for n in make_patch.TEST_FILES if n.startswith("test_"))
    for rel, text in drivers.items():
        tree_ast = ast.parse(text)
        imported = {a.name for n in ast.walk(tree_ast) if isinstance(n, ast.ImportFrom)
                    and n.module == "legacy_test.test_parallel_dygraph_dataparallel" for a in n.names}
        assert imported == {cls}, (rel, imported)
        assert not (other & {n.id for n in ast.walk(tree_ast) if isinstance(n, ast.Name)}), rel
        calls = [n for n in ast.walk(tree_ast) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" and n.func.attr.startswith("run_")]
        assert calls and {c.func.attr for c in calls} == {method}, rel
        for call in calls:
            assert len(call.args) == 1 and {k.arg for k in call.keywords} <= allowed, (rel, ast.unparse(call))


@pytest.mark.parametrize("legacy, expected", [("TestMultipleGpus", "run_mnist_2gpu"),
                                              ("TestMultipleAccelerators", "run_mnist_2accelerators")])
def test_drivers_follow_a_checkouts_own_test_base(legacy, expected, tmp_path):
    """--paddle-src on a checkout: the drivers take the base its LEGACY_BASE defines (any release)."""
    tree = wheel_tree("3.3.1", tmp_path)
    method = dict((c, m) for c, m, _ in make_patch.RELEASE_TEST_BASES.values())[legacy]
    with open(os.path.join(tree, make_patch.LEGACY_BASE), "w") as f:
        f.write(f"import unittest\n\n\nclass {legacy}(unittest.TestCase):\n    def {method}(self, name):\n"
                "        pass\n")
    assert make_patch.test_base_of(tree) == (legacy, expected)
    drivers = [t for r, t in make_patch.patched_files(tree).items() if os.path.basename(r).startswith("test_")]
    assert all(f"self.{expected}(" in t and legacy in t for t in drivers)
    with open(os.path.join(tree, make_patch.LEGACY_BASE), "w") as f:
        f.write("class SomethingElse:\n    pass\n")
    with pytest.raises(PatchError, match="defines none of the test bases"):
        make_patch.patched_files(tree)


# --------------------------------------------------------------------------- every PR's modules


def undefined_globals(text, filename="<spliced>"):
    """Names some scope of ``text`` reads as globals that the module never binds (nor builtins)."""
    import builtins
    import symtable

    top = symtable.symtable(text, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    missing = set()

    def walk(table):
        for sym in table.get_symbols():
            if sym.is_referenced() and (sym.is_global() or table is top) and not sym.is_assigned():
                missing.add(sym.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    return sorted(missing - bound - set(dir(builtins)) - {"__file__", "__name__"})


def test_undefined_globals_finds_a_name_read_by_a_default():
    assert undefined_globals("import os\nclass A:\n    def f(self, x=SIZE):\n        return os, y\n") == ["SIZE", "y"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_prs_modules_read_no_undefined_name(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    for k in range(len(make_patch.PR_KEYS)):
        for rel, text in make_patch.patched_files(tree, k).items():
            if rel.endswith(".py"):
                assert undefined_globals(text, rel) == [], (k, rel)


@pytest.mark.parametrize("version", VERSIONS)
def test_upstream_call_form_of_set_broadcast_overlap_still_fits(version, tmp_path):
    """Upstream's own test calls optimizer._set_broadcast_overlap(broadcast_overlap=..., layers=model)
    (PR #63945): both patched classes keep those two leading parameter names, and the rest
    have defaults, so upstream's test keeps working on the patched sources."""
    tree = wheel_tree(version, tmp_path)
    files = make_patch.patched_files(tree)
    for module, class_name in make_patch.SPLICED[:3]:
        if class_name == "DygraphShardingOptimizerV2":
            continue
        cls = make_patch._find_class(ast.parse(files[make_patch.tree_path(module)]), class_name)[1]
        fn = cls["_set_broadcast_overlap"]
        names = [a.arg for a in fn.args.args]
        assert names[:3] == ["self", "broadcast_overlap", "layers"], (class_name, names)
        assert len(fn.args.args) - len(fn.args.defaults) <= 2, class_name


def test_cli_writes_the_series_and_the_patch(tmp_path, capsys):
    """``main`` in this process (the generation memoized above is reused); the script itself once, on a refusal."""
    wheel_package("2.6.2")
    venv = os.path.join(ROOT, ".venv-test", "paddle-2.6.2")
    tool = os.path.join(ROOT, "tools", "make_patch.py")
    out = tmp_path / "p.patch"
    assert make_patch.main(["--from-wheel", venv, "--version", "2.6.2", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == make_patch._read(make_patch.patch_path("2.6.2"))
    argv = ["--from-wheel", venv, "--series", str(tmp_path / "s"), "--author", "Jane Doe <jane@example.com>"]
    assert make_patch.main(argv) == 0
    names = sorted(os.listdir(tmp_path / "s"))
    assert len(names) == len(make_patch.PR_KEYS) - 1  # 2.6 has no upstream overlap: no cleanup PR
    assert all("From: Jane Doe <jane@example.com>" in (tmp_path / "s" / n).read_text() for n in names)
    capsys.readouterr()
    assert make_patch.main(["--from-wheel", venv, "--version", "3.3.1"]) == 2
    assert "is Paddle 2.6.2, not 3.3.1" in capsys.readouterr().err
    bad = subprocess.run([sys.executable, tool, "--from-wheel", venv, "--author", "nobody"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--author" in bad.stderr


def test_the_sizes_the_docs_quote_are_the_generated_ones(tmp_path):
    """docs/patches.md's table of the series (both releases) and the README's numbers are measured here
    from the series generated for each release's checkout-like tree."""
    measured = {}
    for version in VERSIONS:
        tree = wheel_tree(version, tmp_path / version)
        titles = [pr["title"] for pr in make_patch.patch_series.PRS]
        for name, text in make_patch.make_series(tree, version):
            subject = re.search(r"^Subject: \[PATCH \d+/\d+\] (.*(?:\n .*)*)", text, re.M).group(1)
            k = titles.index(subject.replace("\n ", " "))
            _, added, deleted, tests = make_patch.sizes(
                "\n".join(f"{a}\t{d}\t{p}" for a, d, p in re.findall(r"^(\d+)\t(\d+)\t(.+)$", numstat(text), re.M)))
            measured[(version, k)] = f"+{added} −{deleted} (tests +{tests})"
        measured[(version, "single")] = len(make_patch.make_patch(tree, "x", version).splitlines())
    docs = make_patch._read(os.path.join(ROOT, "docs", "patches.md"))
    rows = re.findall(r"^\| (\d) \| (\[.+?) \| (.+?) \| (.+?) \|$", docs, re.M)
    assert [int(r[0]) for r in rows] == list(range(1, len(make_patch.PR_KEYS) + 1))
    for number, title, v331, v262 in rows:
        k = int(number) - 1
        assert title == make_patch.patch_series.PRS[k]["title"], number
        assert v331 == measured[("3.3.1", k)], (number, v331, measured[("3.3.1", k)])
        assert v262 == measured.get(("2.6.2", k), "(nothing to remove)"), (number, v262)
    readme = make_patch._read(os.path.join(ROOT, "README.md"))
    added = [int(re.match(r"\+(\d+)", measured[("3.3.1", k)]).group(1)) for k in range(len(make_patch.PR_KEYS) - 1)]
    deleted = int(re.search(r"−(\d+)", measured[("3.3.1", len(make_patch.PR_KEYS) - 1)]).group(1))
    flat = " ".join(readme.split())
    assert f"the first eight add {min(added)} to {max(added)} lines each, tests included, the last deletes {deleted}" \
        in flat, (min(added), max(added), deleted)
    assert f"({measured[('2.6.2', 'single')]:,} lines)" in readme
    assert measured[("2.6.2", "single")] == len(make_patch._read(make_patch.patch_path("2.6.2")).splitlines())


def numstat(patch):
    """``git apply --numstat`` of a patch text (added, deleted, path per file)."""
    with tempfile_file(patch) as path:
        return subprocess.run(["git", "apply", "--numstat", path], capture_output=True, text=True, check=True).stdout


class tempfile_file:
    def __init__(self, text):
        import tempfile

        self.file = tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False)
        self.file.write(text)
        self.file.close()

    def __enter__(self):
        return self.file.name

    def __exit__(self, *exc):
        os.remove(self.file.name)
