# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""A git tree shaped like a Paddle checkout at a wheel's tag, for testing the patches.

``python/`` comes from an installed wheel (the files the patch touches, as
:func:`make_patch.layout_wheel_tree` lays them out); ``test/`` from the stand-ins in
``test/patch/checkout_like`` (see its README.md). It has no
``tools/gen_ut_cmakelists.py``: a test that needs one writes a stand-in.
"""

import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "test", "patch", "checkout_like")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_patch  # noqa: E402

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
    pkg = make_patch.paddle_package_dir(venv)
    shutil.copytree(os.path.join(FIXTURE, "test"), os.path.join(dest, "test"))
    version_dir = os.path.join(dest, "python", "paddle", "version")
    os.makedirs(version_dir)
    shutil.copyfile(os.path.join(pkg, "version", "__init__.py"), os.path.join(version_dir, "__init__.py"))
    return make_patch.layout_wheel_tree(pkg, dest)


def read_bytes(tree, rel):
    with open(os.path.join(tree, rel), "rb") as f:
        return f.read()


def snapshot(tree):
    """{path: bytes} of upstream's files the patch must not change."""
    return {rel: read_bytes(tree, rel) for rel in UPSTREAM_FILES}


def build_patched_package(pkg_dir, patched_tree, out_dir):
    """A ``paddle`` package at ``out_dir/paddle`` that is the installed one plus the patch.

    Every file and folder links to ``pkg_dir`` (the installed package), except the folders on
    the way to ``dygraph_optimizer``, which are real, and the files of ``dygraph_optimizer``
    that ``patched_tree`` (a patched Paddle tree) has, which are copies. Put ``out_dir`` first
    on PYTHONPATH to import it. Returns ``out_dir/paddle``.
    """
    rel_parts = make_patch.TREE_OPT_DIR.split("/")[2:]  # distributed/fleet/meta_optimizers/dygraph_optimizer
    if os.path.lexists(out_dir):
        shutil.rmtree(out_dir)
    src, dst = pkg_dir, os.path.join(out_dir, "paddle")
    chain = [None] + rel_parts
    for depth, part in enumerate(chain):
        if part is not None:
            src, dst = os.path.join(src, part), os.path.join(dst, part)
        os.makedirs(dst)
        keep_real = chain[depth + 1] if depth + 1 < len(chain) else None
        for entry in sorted(os.listdir(src)):
            if entry == keep_real or entry == "__pycache__":
                continue
            os.symlink(os.path.join(src, entry), os.path.join(dst, entry))
    tree_dir = os.path.join(patched_tree, make_patch.TREE_OPT_DIR)
    for entry in sorted(os.listdir(tree_dir)):
        path = os.path.join(dst, entry)
        if os.path.lexists(path):
            os.remove(path)
        shutil.copyfile(os.path.join(tree_dir, entry), path)
    return os.path.join(out_dir, "paddle")
