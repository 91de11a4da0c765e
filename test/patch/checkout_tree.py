# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""A git tree shaped like a Paddle checkout at a wheel's tag, for testing the patches.

:func:`make_patch.layout_wheel_tree` lays it out: ``python/`` from an installed wheel (the files the
patch touches or reads), ``test/`` from the stand-ins in ``test/patch/checkout_like`` (see its README.md)
and the release's test base (``make_patch.test_base_stand_in``). It has no
``tools/gen_ut_cmakelists.py``: a test that needs one writes a stand-in.
"""

import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "test", "patch", "checkout_like")
import make_patch  # tools/, on pytest's pythonpath (pyproject.toml) and the collective runner's sys.path

FLEET = make_patch.TREE_TEST_DIR
# Upstream's bf16 files (stand-ins of the same names): the patch must leave them as they are.
UPSTREAM_FILES = (
    f"{FLEET}/test_dygraph_sharding_stage1_bf16.py",
    f"{FLEET}/dygraph_group_sharded_stage1_bf16.py",
    f"{FLEET}/testslist.csv",
    f"{FLEET}/CMakeLists.txt",
)
UPSTREAM_ROW = "test_dygraph_sharding_stage1_bf16"


def build(venv, dest):
    """Lay out the checkout-like tree for the wheel installed in ``venv`` at ``dest`` (a new
    git repository, committed and tagged ``v<version>``). Returns the wheel's version.

    Raises :class:`make_patch.PatchError` when ``venv`` has no installed paddle.
    """
    return make_patch.layout_wheel_tree(make_patch.paddle_package_dir(venv), dest)


def read_bytes(tree, rel):
    with open(os.path.join(tree, rel), "rb") as f:
        return f.read()


def snapshot(tree):
    """{path: bytes} of upstream's files the patch must not change."""
    return {rel: read_bytes(tree, rel) for rel in UPSTREAM_FILES}


def build_patched_package(pkg_dir, patched_tree, out_dir):
    """A ``paddle`` package at ``out_dir/paddle`` that is the installed one plus the patch.

    Every file and folder links to ``pkg_dir`` (the installed package), except the folders on
    the way to a file that ``patched_tree`` (a patched Paddle tree) has under ``python/paddle``,
    which are real, and those files, which are copies. Put ``out_dir`` first on PYTHONPATH to
    import it. Returns ``out_dir/paddle``.
    """
    tree_pkg = os.path.join(patched_tree, make_patch.TREE_PY)
    files = set()
    for folder, dirs, names in os.walk(tree_pkg):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files.update(os.path.relpath(os.path.join(folder, n), tree_pkg) for n in names)
    real = {os.path.dirname(f) for f in files}
    while True:  # every folder on the way
        more = {os.path.dirname(d) for d in real if d} - real
        if not more:
            break
        real |= more
    if os.path.lexists(out_dir):
        shutil.rmtree(out_dir)

    def mirror(rel):
        src, dst = os.path.join(pkg_dir, rel), os.path.join(out_dir, "paddle", rel)
        os.makedirs(dst)
        for entry in sorted(os.listdir(src)) if os.path.isdir(src) else ():
            path = os.path.join(rel, entry) if rel else entry
            if path in real:
                mirror(path)
            elif path not in files and entry != "__pycache__":
                os.symlink(os.path.join(src, entry), os.path.join(dst, entry))
        for path in sorted(real):  # folders the installed package lacks
            if path and os.path.dirname(path) == rel and not os.path.isdir(os.path.join(pkg_dir, path)):
                mirror(path)

    mirror("")
    for rel in sorted(files):
        shutil.copyfile(os.path.join(tree_pkg, rel), os.path.join(out_dir, "paddle", rel))
    return os.path.join(out_dir, "paddle")
