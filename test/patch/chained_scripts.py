# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script (test only): the per-rank scripts named in ``$PATCHED_TREE_COLLECT_SCRIPTS`` (absolute
paths, ``os.pathsep``-separated), one after the other in this rank's process, each as its own ``__main__``
from its own folder (as the launcher would start it). Before each it prints ``=== chained script NAME``, so
:func:`stand_in_launch.segments` can give each script its part of the rank's log, and after it ``=== cases
called NAMES``: the script's module-level ``case_*`` functions that ran (:func:`instrumented`), so a case
dropped from a script's main is seen even where its ``N passed`` count is written by hand. A script that
raises or exits non-zero ends the rank with that error; the scripts after it do not run.

First, when ``$PATCHED_TREE_PROBE_MODULES`` names modules (``os.pathsep``-separated), it prints one line
``=== probe JSON`` (:func:`probe`): where this rank imported Paddle and those modules from, and whether any
``_origin_`` method or ``paddle_overlay`` is there, for the patched-tree test to check.
"""

import ast
import importlib
import json
import os
import sys
import types

CALLED = "__chained_scripts_called__"


def probe(modules):
    """{"version", "paddle": its __init__.py, "files": {module: file}, "origin": the ``_origin_*`` attributes
    of the patched classes, "overlay": whether paddle_overlay is imported}."""
    import paddle
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        dygraph_sharding_optimizer as dso,
        hybrid_parallel_optimizer as hpo,
    )
    from paddle.jit.dy2static import program_translator as pt

    classes = (dso.DygraphShardingOptimizer, dso.DygraphShardingOptimizerV2, hpo.HybridParallelOptimizer,
               pt.StaticFunction)
    return {
        "version": paddle.__version__,
        "paddle": paddle.__file__,
        "files": {name: importlib.import_module(name).__file__ for name in modules},
        "origin": sorted(f"{c.__name__}.{a}" for c in classes for a in vars(c) if a.startswith("_origin_")),
        "overlay": "paddle_overlay" in sys.modules,
    }


def instrumented(script):
    """``script`` compiled with a first statement in each module-level ``def case_*`` that appends the case's
    name to the list :data:`CALLED` of the globals it runs in (line numbers kept)."""
    with open(script) as f:
        module = ast.parse(f.read(), script)
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("case_"):
            mark = ast.parse(f"{CALLED}.append({node.name!r})").body[0]
            node.body.insert(0, ast.copy_location(mark, node.body[0]))
    return compile(ast.fix_missing_locations(module), script, "exec")


def run_as_main(script):
    """Run ``script`` as ``__main__`` (as the launcher would start it); returns the names of its
    ``case_*`` functions it called, in call order."""
    called = []
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __builtins__=__builtins__, **{CALLED: called})
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module
    try:
        exec(instrumented(script), module.__dict__)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.modules["__main__"] = saved
    return called


def main():
    modules = [m for m in os.environ.get("PATCHED_TREE_PROBE_MODULES", "").split(os.pathsep) if m]
    if modules:
        print("=== probe " + json.dumps(probe(modules)), flush=True)
    for script in os.environ["PATCHED_TREE_COLLECT_SCRIPTS"].split(os.pathsep):
        folder = os.path.dirname(script)
        print(f"=== chained script {os.path.basename(script)}", flush=True)
        os.chdir(folder)
        sys.argv = [script]
        if folder not in sys.path:
            sys.path.insert(0, folder)
        called = run_as_main(script)
        print(f"=== cases called {','.join(sorted(set(called)))}", flush=True)


if __name__ == "__main__":
    main()
