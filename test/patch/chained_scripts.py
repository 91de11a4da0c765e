# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script (test only): the per-rank scripts named in ``$PATCHED_TREE_COLLECT_SCRIPTS`` (absolute
paths, ``os.pathsep``-separated), one after the other in this rank's process, each as its own ``__main__``
from its own folder (as the launcher would start it). Before each it prints ``=== chained script NAME``, so
:func:`stand_in_launch.segments` can give each script its part of the rank's log. A script that raises
or exits non-zero ends the rank with that error; the scripts after it do not run.

First, when ``$PATCHED_TREE_PROBE_MODULES`` names modules (``os.pathsep``-separated), it prints one line
``=== probe JSON`` (:func:`probe`): where this rank imported Paddle and those modules from, and whether any
``_origin_`` method or ``paddle_overlay`` is there, for the patched-tree test to check.
"""

import importlib
import json
import os
import runpy
import sys


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
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
        sys.stdout.flush()


if __name__ == "__main__":
    main()
