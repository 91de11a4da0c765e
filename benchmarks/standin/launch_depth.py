"""Torch+NCCL stand-in, suite ``launch_depth``: see ``nccl_replay.py`` (torchrun, one process per GPU).

    torchrun --nproc_per_node 2 benchmarks/standin/launch_depth.py --out benchmarks/data/standin_launch_depth_s2.json
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nccl_replay  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(nccl_replay.main(suite="launch_depth"))
