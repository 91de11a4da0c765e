# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script (test only): the per-rank scripts named in ``$PATCHED_TREE_COLLECT_SCRIPTS`` (absolute
paths, ``os.pathsep``-separated), one after the other in this rank's process, each as its own ``__main__``
from its own folder (as the launcher would start it). Before each it prints ``=== chained script NAME``, so
:func:`stand_in_launch.segments` can give each script its part of the rank's log. A script that raises
or exits non-zero ends the rank with that error; the scripts after it do not run.
"""

import os
import runpy
import sys

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
