# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/make_patch.py: the direct edits, the series, the committed patches, and applying them.

The editing rules are checked on small synthetic modules (no Paddle needed). The committed series
and single patches are checked against the installed wheels in ``.venv-test/paddle-<version>``
(skipped with the reason when a venv is missing): regenerating gives the committed bytes; the series
applies PR by PR with ``git am`` to a tree laid out from that wheel, giving each PR's files; nothing
of this project's name, no ``_origin_`` method and no alias reaches it; upstream's superseded overlap
is gone; and the overlay's wrappers and the patch's edits are the same statements.
"""

import ast
import os
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


# --------------------------------------------------------------------------- fences and release flags

FENCED = dedent(
    '''
    import os
    # series: reads
    import sys
    # series: end

    A = 1
    # series: until buckets
    # B = 0
    # series: end
    # series: buckets
    B = 2
    # series: end
    '''
)


def test_fences_leave_later_prs_out_and_until_lines_in_before_their_pr():
    owner, buckets, reads = (make_patch.PR_KEYS.index(k) for k in ("owner", "buckets", "reads"))
    assert make_patch.text_at(FENCED, owner) == "import os\n\nA = 1\nB = 0\n"
    assert make_patch.text_at(FENCED, buckets) == "import os\n\nA = 1\nB = 2\n"
    assert make_patch.text_at(FENCED, reads) == "import os\nimport sys\n\nA = 1\nB = 2\n"
    for bad, why in (("# series: end\n", "without a fence"), ("# series: reads\n", "not closed"),
                     ("# series: nope\nx\n# series: end\n", "no PR 'nope'"),
                     ("# series: reads\n# series: v2\n", "do not nest"),
                     ("from a import (  # series: reads; series: end\n    b,\n)\n", "a line of its own")):
        with pytest.raises(PatchError, match=why):
            make_patch.text_at(bad, len(make_patch.PR_KEYS) - 1)


def test_tidy_writes_what_black_and_isort_would_leave():
    text = "import os\n\nimport sys\nimport numpy\n\n\nimport paddle\nfrom . import a\n\n\n\n\nx = 1\n\n\n"
    assert make_patch.tidy(text) == "import os\nimport sys\n\nimport numpy\n\nimport paddle\n\nfrom . import a\n\n\nx = 1\n"


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


# --------------------------------------------------------------------------- committed patches


@pytest.mark.parametrize("version", VERSIONS)
def test_regenerating_gives_the_committed_series_and_patch_byte_for_byte(version):
    pkg = wheel_package(version)
    series, found = make_patch.make_wheel_series(pkg, version)
    assert found == version
    committed = make_patch.series_files(version)
    stale = f"stale: regenerate with bash tools/update_generated.sh"
    assert [os.path.basename(p) for p in committed] == [name for name, _ in series], stale
    for path, (_, text) in zip(committed, series):
        assert make_patch._read(path) == text, f"{os.path.relpath(path, ROOT)} is {stale}"
    single, _ = make_patch.make_wheel_patch(pkg, version)
    assert make_patch._read(make_patch.patch_path(version)) == single, f"the single patch is {stale}"
    assert [name[:5] for name, _ in series] == [f"{k + 1:04d}-" for k in range(len(make_patch.PR_KEYS))]


def test_generation_is_deterministic():
    pkg = wheel_package("3.3.1")
    assert make_patch.make_wheel_series(pkg) == make_patch.make_wheel_series(pkg)
    first = make_patch.make_wheel_series(pkg)[0][0][1]
    assert first.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert "Date: Thu, 1 Jan 2026 00:00:00 +0000" in first and not first.rstrip().endswith(("-- ", "--"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_series_applies_pr_by_pr_with_git_am_and_each_state_compiles(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    expected = [make_patch.patched_files(tree, k) for k in range(len(make_patch.PR_KEYS))]
    for k, patch in enumerate(make_patch.series_files(version)):
        make_patch.git(tree, "am", "--quiet", "--keep-non-patch", patch)
        for rel, text in expected[k].items():
            assert make_patch._read(os.path.join(tree, rel)) == text, (k, rel)
            compile(text, rel, "exec")
    subjects = make_patch.git(tree, "log", "--format=%s", f"v{version}..HEAD").splitlines()[::-1]
    assert subjects == [pr["title"] for pr in make_patch.patch_series.PRS]
    # the single patch is the series' sum; the other version's does not fit
    fresh = wheel_tree(version, tmp_path / "fresh")
    make_patch.git(fresh, "apply", make_patch.patch_path(version))
    for rel, text in expected[-1].items():
        assert make_patch._read(os.path.join(fresh, rel)) == text, rel
    other = [v for v in VERSIONS if v != version][0]
    third = wheel_tree(version, tmp_path / "third")
    proc = subprocess.run(["git", "am", make_patch.series_files(other)[0]], cwd=third, capture_output=True)
    assert proc.returncode != 0


@pytest.mark.parametrize("version", VERSIONS)
def test_nothing_of_this_project_reaches_paddle(version):
    """No paddle_overlay / PADDLE_OVERLAY, no _origin_ name (Paddle's own _origin_parameter_list aside),
    no alias of broadcast_overlap.py in any added line or message of the series or the single patch."""
    for path in make_patch.series_files(version) + [make_patch.patch_path(version)]:
        assert make_patch.banned_in(make_patch._read(path)) == [], os.path.relpath(path, ROOT)
    assert make_patch.banned_in("+        self._origin_step()\n") == ["1: _origin_step"]
    assert make_patch.banned_in("+x = get_broadcast_overlap(opt)\n") == ["1: get_broadcast_overlap"]
    assert make_patch.banned_in("+from .broadcast_overlap import x\n+s = 'dygraph_broadcast_overlap.py'\n") == [
        "1: .broadcast_overlap"]
    assert make_patch.banned_in("+    def _set_broadcast_overlap(self, broadcast_overlap):\n") == []
    assert make_patch.banned_in(" self._origin_step()  # upstream context\n+p = self._origin_parameter_list\n") == []


UPSTREAM_OVERLAP = ("_forward_pre_hook_function", "_try_start_bucket_param_sync", "make_forward_hook",
                    "_register_pre_forward_hooks", "_broadcast_order_params", "_forward_pre_hook_remove_helper",
                    "has_register_forward_hook", "FusedCommBuffer.Status", "sync_param_task")


@pytest.mark.parametrize("version", VERSIONS)
def test_upstreams_superseded_overlap_is_gone_and_compiled_programs_call_the_registry(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    report = []
    files = make_patch.patched_files(tree, report=report)
    dso = files[make_patch.tree_path(make_patch.SPLICED[0][0])]
    assert [name for name in UPSTREAM_OVERLAP if name in dso] == []
    if version == "3.3.1":  # every SUPERSEDED entry applied
        overlay_mod = ast.parse(make_patch._read(make_patch.overlay_path(make_patch.SPLICED[0][0])))
        expected = []
        for class_name in ("DygraphShardingOptimizer", "DygraphShardingOptimizerV2"):
            for method, what in make_patch._superseded(overlay_mod, "", class_name).items():
                expected += [f"{class_name}.{method}"] if what == "*" else [f"{class_name}.{method}: {w}" for w in what]
        assert sorted(report) == sorted(expected)
    else:  # 2.6 has no upstream overlap
        assert report == []
    translator = files["python/paddle/jit/dy2static/program_translator.py"]
    call = make_patch._find_class(ast.parse(translator), "StaticFunction")[1]["__call__"]
    assert ast.dump(body_dumps_node(call)[0]) == ast.dump(ast.parse("run_pre_call_hooks()").body[0])
    assert "fleet" not in translator and "fleet" not in files["python/paddle/jit/dy2static/pre_call_hooks.py"]
    pso = files[make_patch.tree_path("distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap")]
    assert ("move_to_end" in pso) == (version == "2.6.2") and "_HAS_PREPEND" not in pso and "import inspect" not in pso


def body_dumps_node(fn):
    return fn.body[1:] if make_patch._is_docstring(fn.body[0]) else fn.body


# --------------------------------------------------------------------------- what the patch holds


def blocks(patch):
    """{path: diff block text} of a patch."""
    out = {}
    for block in patch.split("diff --git a/")[1:]:
        out[block.split(" ", 1)[0]] = block
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_changes_python_only_and_adds_new_files_and_carries_the_rows(version):
    patch = make_patch._read(make_patch.patch_path(version))
    found = blocks(patch)
    changed = sorted(p for p, b in found.items() if "\nnew file mode " not in b.split("\n@@", 1)[0])
    assert changed == sorted({make_patch.tree_path(m) for m, _ in make_patch.SPLICED})
    added = sorted(p for p in found if p not in changed)
    expected = [make_patch.tree_path(m) for m in make_patch.NEW_MODULES]
    expected += [f"{make_patch.TREE_TEST_DIR}/{n}" for n in make_patch.TEST_FILES]
    assert added == sorted(expected)
    assert "testslist.csv" not in " ".join(found) and "CMakeLists.txt" not in " ".join(found)
    head = patch.split("diff --git", 1)[0]
    rows = [ln[len(make_patch.ROW_PREFIX) :] for ln in head.splitlines() if ln.startswith(make_patch.ROW_PREFIX)]
    assert rows == make_patch.testslist_rows() and len(rows) == 2
    in_series = []
    for k, path in enumerate(make_patch.series_files(version)):
        notes = make_patch._read(path).split("\n---\n", 1)[1].split("\ndiff --git", 1)[0]
        new = [ln[len(make_patch.ROW_PREFIX) :] for ln in notes.splitlines() if ln.startswith(make_patch.ROW_PREFIX)]
        in_series += new
        assert in_series == make_patch.testslist_rows(k), k
        for row in new:  # a PR registers the driver it adds
            assert f"+++ b/{make_patch.TREE_TEST_DIR}/{row.split(',')[0]}.py" in make_patch._read(path)


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
    launch through one of Paddle's own multi-process bases."""
    assert selection_problems() == {}
    for kept_here in ("sharding_cases.py", "param_sync_checker.py"):
        assert os.path.isfile(os.path.join(make_patch.TEST_DIR, kept_here)), kept_here
        assert kept_here not in make_patch.TEST_FILES
    rows = make_patch.testslist_rows()
    assert sorted(r.split(",")[0] + ".py" for r in rows) == sorted(n for n in make_patch.TEST_FILES if n.startswith("test_"))
    for row in rows:
        driver = make_patch._read(os.path.join(make_patch.TEST_DIR, row.split(",")[0] + ".py"))
        assert "from legacy_test.test_parallel_dygraph_dataparallel import TestMultipleGpus" in driver
        assert "self.run_mnist_2gpu(" in driver and "collective_launch" not in driver


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
        for banned in ("paddle_overlay", "rank_ready", *tools):
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
    os.makedirs(os.path.join(tree, make_patch.TREE_TEST_DIR))
    with open(os.path.join(tree, make_patch.TREE_TEST_DIR, make_patch.TEST_FILES[0]), "w") as f:
        f.write("# upstream has a file of this name\n")
    with pytest.raises(PatchError, match="the patch adds new files only"):
        make_patch.patched_files(tree)


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_for_a_checkout_like_tree_is_the_committed_one(version, tmp_path):
    """--paddle-src on a checkout at the tag (upstream's test files present) gives the committed
    diffs: new files do not depend on what test/ already holds."""
    import checkout_tree
    tree = str(tmp_path / "checkout")
    checkout_tree.build(wheel_package(version), tree)
    ours = make_patch.make_patch(tree, "a checkout")
    committed = make_patch._read(make_patch.patch_path(version))
    assert ours.split("\ndiff --git", 1)[1] == committed.split("\ndiff --git", 1)[1]
    assert [t for _, t in make_patch.make_series(tree, version)] == [
        make_patch._read(p) for p in make_patch.series_files(version)]


@pytest.mark.parametrize("legacy_classes", [("TestMultipleGpus",), ("TestMultipleAccelerators",), ()])
def test_drivers_follow_the_checkouts_name_of_the_test_base(legacy_classes, tmp_path):
    """A later Paddle names upstream's base TestMultipleAccelerators (run_mnist_2accelerators):
    drivers generated for such a checkout use it, still formatted as Paddle wants."""
    from test_format import formatted

    tree = wheel_tree("3.3.1", tmp_path)
    legacy = os.path.join(tree, make_patch.LEGACY_BASE)
    os.makedirs(os.path.dirname(legacy))
    with open(legacy, "w") as f:
        f.write("".join(f"class {c}(unittest.TestCase):\n    pass\n" for c in legacy_classes))
    files = make_patch.patched_files(tree)
    drivers = {rel: text for rel, text in files.items() if os.path.basename(rel).startswith("test_")}
    assert len(drivers) == 2
    renamed = legacy_classes == ("TestMultipleAccelerators",)
    for rel, text in drivers.items():
        original = make_patch._read(os.path.join(make_patch.TEST_DIR, os.path.basename(rel)))
        if not renamed:
            assert text == original
            continue
        assert "TestMultipleGpus" not in text and "run_mnist_2gpu" not in text
        assert "(TestMultipleAccelerators):" in text and "self.run_mnist_2accelerators(" in text
        new = formatted({"original.py": original, "renamed.py": text})
        assert new["renamed.py"] == make_patch.adapt_test_base(tree, new["original.py"]), rel


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
            if rel.startswith(make_patch.TREE_PY):
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


def test_cli_writes_the_series_and_the_patch(tmp_path):
    wheel_package("2.6.2")
    venv = os.path.join(ROOT, ".venv-test", "paddle-2.6.2")
    tool = os.path.join(ROOT, "tools", "make_patch.py")
    out = tmp_path / "p.patch"
    proc = subprocess.run([sys.executable, tool, "--from-wheel", venv, "--version", "2.6.2", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == make_patch._read(make_patch.patch_path("2.6.2"))
    proc = subprocess.run([sys.executable, tool, "--from-wheel", venv, "--series", str(tmp_path / "s")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "s")) == [os.path.basename(p) for p in make_patch.series_files("2.6.2")]
    bad = subprocess.run([sys.executable, tool, "--from-wheel", venv, "--version", "3.3.1"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "is Paddle 2.6.2, not 3.3.1" in bad.stderr
