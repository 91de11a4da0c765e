# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""tools/make_patch.py: splicing rules, the committed patches, and applying them.

Splicing is checked on small synthetic modules (no Paddle needed). The committed
patches are checked against the installed wheels in ``.venv-test/paddle-<version>``
(skipped with the reason when a venv is missing): regenerating gives the committed
bytes, and the patch applies with ``git apply --check`` to a tree laid out from that
wheel, giving exactly the spliced files.
"""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_patch  # noqa: E402
from make_patch import PatchError, splice  # noqa: E402

VERSIONS = ("2.6.2", "3.3.1")


def dedent(text):
    return textwrap.dedent(text).lstrip("\n")


# --------------------------------------------------------------------------- splicing rules

TARGET = dedent(
    '''
    import os

    from paddle import framework

    from ...utils.log_util import logger


    class Opt:
        def __init__(self):
            self.x = 1

        # Synchronize parameters.
        @framework.dygraph_only
        @framework.no_grad
        def step(self):
            """Paddle's step."""
            return 1

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

    from paddle import framework

    from .helper import Helper

    OVERLAY_WRAPS = ("step",)


    class Opt:
        """Overlay class docstring: not spliced."""

        def step(self):
            """Wrapper."""
            Helper()
            return self._origin_step()

        def replaced(self, a, b=None):
            with framework.no_grad():
                return [isinstance(v, int) for v in (a, b)]

        def added(self):
            return Helper
    '''
)


def spliced_class(text, name="Opt"):
    """{method: its source text} of class ``name`` (``ast.get_source_segment``'s text, without
    splitting the whole file once per method)."""
    module, lines = ast.parse(text), text.splitlines(True)
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)

    def segment(n):
        body = lines[n.lineno - 1 : n.end_lineno]
        body[-1] = body[-1].encode()[: n.end_col_offset].decode()
        body[0] = body[0].encode()[n.col_offset :].decode()
        return "".join(body)

    return {n.name: segment(n) for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_wrap_renames_original_keeps_decorators_and_puts_overlay_above():
    out = splice(TARGET, OVERLAY, "Opt")
    expected = dedent(
        '''
            def step(self):
                """Wrapper."""
                Helper()
                return self._origin_step()

            # Synchronize parameters.
            @framework.dygraph_only
            @framework.no_grad
            def _origin_step(self):
                """Paddle's step."""
                return 1
        '''
    )
    # the comment above the original stays with it
    assert textwrap.indent(expected, "    ") in out
    # the other class of the same module is untouched
    assert spliced_class(out, "Other") == spliced_class(TARGET, "Other")


def test_same_name_replaced_in_place_and_new_methods_appended_in_source_order():
    out = splice(TARGET, OVERLAY, "Opt")
    methods = spliced_class(out)
    assert list(methods) == ["__init__", "step", "_origin_step", "replaced", "__getattr__", "added"]
    overlay = spliced_class(OVERLAY)
    for name in ("step", "replaced", "added"):
        assert methods[name] == overlay[name]
    assert "return a\n" not in out
    assert "Overlay docstring" not in out and "OVERLAY_WRAPS" not in out and "not spliced" not in out


def test_only_missing_imports_are_added_after_the_same_kind():
    out = splice(TARGET, OVERLAY, "Opt")
    lines = out.splitlines()
    assert lines.count("from paddle import framework") == 1
    i = lines.index("from ...utils.log_util import logger")
    assert lines[i + 1] == "from .helper import Helper"
    assert out.count("import") == TARGET.count("import") + 1


def test_result_is_stable_and_parses():
    out = splice(TARGET, OVERLAY, "Opt")
    assert splice(TARGET, OVERLAY, "Opt") == out
    compile(out, "spliced", "exec")


def test_already_patched_tree_is_refused():
    once = splice(TARGET, OVERLAY, "Opt")
    with pytest.raises(PatchError, match="already patched"):
        splice(once.replace("from .helper import Helper\n", ""), OVERLAY, "Opt")


def test_wrapped_method_missing_in_target_is_refused():
    target = TARGET.replace("def step(self):\n        \"\"\"Paddle's", "def stop(self):\n        \"\"\"Paddle's")
    with pytest.raises(PatchError, match="Opt.step to wrap is missing"):
        splice(target, OVERLAY, "Opt")


def test_method_reading_a_module_level_name_is_refused():
    overlay = OVERLAY.replace("return Helper\n", "return OVERLAY_WRAPS\n")
    with pytest.raises(PatchError, match="module-level OVERLAY_WRAPS"):
        splice(TARGET, overlay, "Opt")


def test_name_bound_differently_in_target_is_refused():
    target = TARGET.replace("from paddle import framework", "from paddle.base import framework")
    with pytest.raises(PatchError, match="framework is bound to"):
        splice(target, OVERLAY, "Opt")


def test_paddle_overlay_import_is_refused():
    overlay = OVERLAY.replace("from .helper import Helper", "from paddle_overlay.x import Helper")
    with pytest.raises(PatchError, match="absent in Paddle"):
        splice(TARGET, overlay, "Opt")


def test_real_overlay_sources_splice_into_their_classes():
    """Every overlay method's text lands verbatim in the Paddle class (both versions)."""
    for version in VERSIONS:
        pkg = wheel_package(version)
        for filename, class_name in make_patch.SPLICED:
            target = make_patch._read(os.path.join(pkg, *make_patch.TREE_OPT_DIR.split("/")[2:], filename))
            overlay_text = make_patch._read(os.path.join(make_patch.OVERLAY_DIR, filename))
            out = splice(target, overlay_text, class_name)
            methods = spliced_class(out, class_name)
            for name, text in spliced_class(overlay_text, class_name).items():
                assert methods[name] == text, (version, class_name, name)
            wraps = make_patch._overlay_wraps(ast.parse(overlay_text), filename)
            original = spliced_class(target, class_name)
            for name in wraps:
                renamed = methods[make_patch.origin_name(name)]
                assert renamed.replace(f"def {make_patch.origin_name(name)}(", f"def {name}(", 1) == original[name]


# --------------------------------------------------------------------------- committed patches


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


def run_git(tree, *args):
    return make_patch.git(tree, *args)


@pytest.mark.parametrize("version", VERSIONS)
def test_regenerating_gives_the_committed_patch_byte_for_byte(version):
    committed = make_patch.patch_path(version)
    assert os.path.isfile(committed), f"{committed} missing"
    text, found = make_patch.make_wheel_patch(wheel_package(version), version)
    assert found == version
    with open(committed, encoding="utf-8", newline="") as f:
        assert f.read() == text, (
            f"{os.path.relpath(committed, ROOT)} is stale: regenerate it with "
            f"python tools/make_patch.py --from-wheel .venv-test/paddle-{version} --version {version} "
            f"--out {os.path.relpath(committed, ROOT)}"
        )


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_patch_applies_to_the_wheel_tree(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    expected = make_patch.patched_files(tree)
    patch = make_patch.patch_path(version)
    run_git(tree, "apply", "--check", patch)
    run_git(tree, "apply", patch)
    for rel, text in expected.items():
        with open(os.path.join(tree, rel), encoding="utf-8", newline="") as f:
            assert f.read() == text, rel
        if rel.endswith(".py"):
            compile(text, rel, "exec")
    # the other version's patch does not fit: the trees really differ
    other = [v for v in VERSIONS if v != version][0]
    fresh = wheel_tree(version, tmp_path / "fresh")
    proc = subprocess.run(["git", "apply", "--check", make_patch.patch_path(other)], cwd=fresh, capture_output=True)
    assert proc.returncode != 0


def test_patch_is_deterministic(tmp_path):
    pkg = wheel_package("3.3.1")
    first, _ = make_patch.make_wheel_patch(pkg)
    second, _ = make_patch.make_wheel_patch(pkg)
    assert first == second
    assert "Date:" not in first and "From " not in first.splitlines()[0]


def test_cli_writes_the_patch(tmp_path):
    out = tmp_path / "p.patch"
    venv = os.path.join(ROOT, ".venv-test", "paddle-2.6.2")
    wheel_package("2.6.2")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "make_patch.py"), "--from-wheel", venv, "--version", "2.6.2",
         "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with open(make_patch.patch_path("2.6.2"), encoding="utf-8") as f:
        assert out.read_text(encoding="utf-8") == f.read()
    bad = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "make_patch.py"), "--from-wheel", venv, "--version", "3.3.1"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "is Paddle 2.6.2, not 3.3.1" in bad.stderr


# --------------------------------------------------------------------------- what the patch holds


def blocks(patch):
    """{path: diff block text} of a patch."""
    out = {}
    for block in patch.split("diff --git a/")[1:]:
        out[block.split(" ", 1)[0]] = block
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_changes_python_only_and_adds_new_files(version):
    with open(make_patch.patch_path(version), encoding="utf-8") as f:
        patch = f.read()
    found = blocks(patch)
    changed = sorted(p for p, b in found.items() if "\nnew file mode " not in b.split("\n@@", 1)[0])
    assert changed == sorted({f"{make_patch.TREE_OPT_DIR}/{n}" for n, _ in make_patch.SPLICED})
    added = sorted(p for p in found if p not in changed)
    expected = [f"{make_patch.TREE_OPT_DIR}/{n}" for n in make_patch.NEW_MODULES]
    expected += [f"{make_patch.TREE_TEST_DIR}/{n}" for n in make_patch.TEST_FILES]
    assert added == sorted(expected)
    assert "testslist.csv" not in " ".join(found) and "CMakeLists.txt" not in " ".join(found)
    # registration travels in the header, before the first diff
    head = patch.split("diff --git", 1)[0]
    rows = [ln[len(make_patch.ROW_PREFIX) :] for ln in head.splitlines() if ln.startswith(make_patch.ROW_PREFIX)]
    assert rows == make_patch.testslist_rows() and rows
    for row in rows:
        assert f"{make_patch.TREE_TEST_DIR}/{row.split(',')[0]}.py" in added


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
    problems = dangling(make_patch.OVERLAY_DIR, [n for n, _ in make_patch.SPLICED] + list(make_patch.NEW_MODULES),
                        make_patch.TARGET_PACKAGE)
    return {**problems, **dangling(make_patch.TEST_DIR, test_files)}


def test_patch_carries_upstream_form_tests_only_and_leaves_nothing_dangling():
    """Every carried file's sibling imports and every per-rank script a carried driver names are
    carried too (else: add them to the lists in tools/make_patch.py, or make the import optional);
    the project's own test tooling (the CPU shim, the wait checker) stays here; carried drivers
    launch through one of Paddle's own multi-process bases."""
    assert selection_problems() == {}
    for kept_here in ("hybrid_parallel_cpu_shim.py", "broadcast_overlap_checker.py"):
        assert kept_here not in make_patch.TEST_FILES
    bases = {  # Paddle's own multi-process bases: import, class, the call that launches
        "TestMultipleGpus": (
            "from legacy_test.test_parallel_dygraph_dataparallel import TestMultipleGpus",
            "self.run_mnist_2gpu(",
        ),
        "CommunicationTestDistBase": (
            "from collective.test_communication_api_base import CommunicationTestDistBase",
            "self.run_test_case(",
        ),
    }
    rows = make_patch.testslist_rows()
    assert sorted(r.split(",")[0] + ".py" for r in rows) == sorted(n for n in make_patch.TEST_FILES if n.startswith("test_"))
    for row in rows:
        name = row.split(",")[0]
        driver = make_patch._read(os.path.join(make_patch.TEST_DIR, name + ".py"))
        used = [b for b, (imp, call) in bases.items() if imp in driver and call in driver and b in driver]
        assert used, f"{name}.py does not launch through one of Paddle's bases {sorted(bases)}"
        assert "collective_launch" not in driver and "paddle_overlay" not in driver


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
    pkg = "paddle.distributed.fleet.meta_optimizers.dygraph_optimizer"
    (tmp_path / "owner.py").write_text(f"from .helper import x\nfrom {pkg}.checker import y\nfrom paddle import z\n")
    assert dangling(str(tmp_path), ["owner.py"], pkg) == {"owner.py": ["checker.py", "helper.py"]}


def test_a_selection_that_leaves_a_dependency_out_is_found(monkeypatch, tmp_path):
    reads = "dygraph_sharding_stage1_broadcast_overlap_reads.py"
    assert "broadcast_overlap_checker.py" in selection_problems(make_patch.TEST_FILES + (reads,))[reads]
    monkeypatch.setattr(make_patch, "NEW_MODULES", ("no_such_module.py",))
    with pytest.raises(PatchError, match=r"not in paddle_overlay/.*\['no_such_module.py'\]"):
        make_patch.patched_files(str(tmp_path))


def test_upstream_bf16_names_are_not_taken():
    """Upstream's test_dygraph_sharding_stage1_bf16 and its per-rank script stay untouched."""
    ours = make_patch.TEST_FILES
    assert "dygraph_group_sharded_stage1_bf16.py" not in ours
    assert "test_dygraph_sharding_stage1_bf16.py" not in ours
    assert not any(r.startswith("test_dygraph_sharding_stage1_bf16,") for r in make_patch.testslist_rows())


def test_no_added_file_imports_paddle_overlay():
    """Inside Paddle nothing may need this project: no file the patch adds imports it."""
    offenders = {}
    for rel in make_patch.patch_source_files():
        if rel.endswith(tuple(name for name, _ in make_patch.SPLICED)):
            continue  # spliced: only the methods travel, and splice() refuses paddle_overlay names
        text = make_patch._read(os.path.join(ROOT, rel))
        for banned in ("paddle_overlay", "collective_launch", "rank_ready"):
            if banned in imports_of(text, rel):
                offenders.setdefault(rel, []).append(banned)
    assert offenders == {}, f"files the patch adds import this project's modules: {offenders}"


def imports_of(text, filename="<file>"):
    """Top-level module names a Python source imports anywhere (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(text, filename)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_imports_of_sees_nested_and_conditional_imports():
    text = "import os\nif x:\n    import paddle_overlay.y as z\ndef f():\n    from a.b import c\nfrom . import d\n"
    assert imports_of(text) == {"os", "paddle_overlay", "a"}


def test_tree_that_already_has_a_file_we_add_is_refused(tmp_path):
    tree = wheel_tree("3.3.1", tmp_path)
    name = make_patch.TEST_FILES[0]
    os.makedirs(os.path.join(tree, make_patch.TREE_TEST_DIR))
    with open(os.path.join(tree, make_patch.TREE_TEST_DIR, name), "w") as f:
        f.write("# upstream has a file of this name\n")
    with pytest.raises(PatchError, match="the patch adds new files only"):
        make_patch.patched_files(tree)


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_for_a_checkout_like_tree_is_the_committed_one(version, tmp_path):
    """--paddle-src on a checkout at the tag (upstream's test files present) gives the same
    diff as the committed patch: new files do not depend on what test/ already holds."""
    sys.path.insert(0, os.path.join(ROOT, "test", "patch"))
    try:
        import checkout_tree
    finally:
        sys.path.pop(0)
    tree = str(tmp_path / "checkout")
    checkout_tree.build(wheel_package(version), tree)
    ours = make_patch.make_patch(tree, "a checkout")
    committed, _ = make_patch.make_wheel_patch(wheel_package(version), version)
    assert ours.split("\ndiff --git", 1)[1] == committed.split("\ndiff --git", 1)[1]
    assert [ln for ln in ours.splitlines() if ln.startswith(make_patch.ROW_PREFIX)] == [
        ln for ln in committed.splitlines() if ln.startswith(make_patch.ROW_PREFIX)
    ]


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
    assert drivers
    renamed = legacy_classes == ("TestMultipleAccelerators",)
    for rel, text in drivers.items():
        original = make_patch._read(os.path.join(make_patch.TEST_DIR, os.path.basename(rel)))
        if not renamed or "TestMultipleGpus" not in original:
            assert text == original
            continue
        assert "TestMultipleGpus" not in text and "run_mnist_2gpu" not in text
        assert "(TestMultipleAccelerators):" in text and "self.run_mnist_2accelerators(" in text
        # the renaming adds no formatting change of its own
        new = formatted({"original.py": original, "renamed.py": text})
        assert new["renamed.py"] == make_patch.adapt_test_base(tree, new["original.py"]), rel


def test_names_read_by_defaults_decorators_and_annotations_get_imported():
    """They are evaluated where the def runs (class body, then module), not in the method."""
    overlay = OVERLAY.replace("from .helper import Helper", "from .helper import SIZE, Helper, Kind, wrap")
    overlay = overlay.replace(
        "    def added(self):\n", "    @wrap\n    def added(self, size=SIZE, *, kind: Kind = None) -> Kind:\n"
    )
    assert "def added(self, size=SIZE" in overlay
    out = splice(TARGET, overlay, "Opt")
    assert "from .helper import Helper, Kind, SIZE, wrap" in out.splitlines()
    compile(out, "spliced", "exec")


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
def test_spliced_modules_read_no_undefined_name(version, tmp_path):
    tree = wheel_tree(version, tmp_path)
    files = make_patch.patched_files(tree)
    for rel, text in files.items():
        if rel.startswith(make_patch.TREE_OPT_DIR):
            assert undefined_globals(text, rel) == [], rel


@pytest.mark.parametrize("version", VERSIONS)
def test_upstream_call_form_of_set_broadcast_overlap_still_fits(version, tmp_path):
    """Upstream's own test calls optimizer._set_broadcast_overlap(broadcast_overlap=..., layers=model)
    (PR #63945): both patched classes keep those two leading parameter names, and the rest
    have defaults, so upstream's test keeps working on the patched sources."""
    tree = wheel_tree(version, tmp_path)
    files = make_patch.patched_files(tree)
    for filename, class_name in make_patch.SPLICED:
        module = ast.parse(files[f"{make_patch.TREE_OPT_DIR}/{filename}"])
        cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name)
        fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_set_broadcast_overlap")
        names = [a.arg for a in fn.args.args]
        assert names[:3] == ["self", "broadcast_overlap", "layers"], (class_name, names)
        required = len(fn.args.args) - len(fn.args.defaults)
        assert required <= 2, (class_name, "parameters after broadcast_overlap need defaults")
        assert all(d is not None for d in fn.args.kw_defaults), class_name
