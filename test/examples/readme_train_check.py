# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Per-rank script: run examples/readme_train.py as it is, then load what it saved.

Runs the README's snippet in ``$README_TRAIN_DIR`` (so its ``model.pdparams`` lands
there), waits for rank 0's save, then on every rank loads the file into a fresh
``MyModel`` and checks: same keys as the trained model's own ``state_dict`` (no
``_layers.`` prefix), nothing missing or unexpected, every value bitwise equal to the
trained parameters, and the fresh model's own initial values differed (so the load
is what made them equal). Prints ``README-CHECK {json}``.
"""

import json
import os
import runpy

import paddle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNIPPET = os.path.join(ROOT, "examples", "readme_train.py")

os.chdir(os.environ["README_TRAIN_DIR"])


def main():
    snippet = runpy.run_path(SNIPPET, run_name="__main__")
    net = snippet["net"]
    trained = {k: v.numpy() for k, v in net.state_dict().items()}
    paddle.distributed.barrier()  # rank 0 has written model.pdparams
    fresh = snippet["MyModel"]()
    before = {k: v.numpy() for k, v in fresh.state_dict().items()}
    loaded = paddle.load("model.pdparams")
    fresh.set_state_dict(loaded)
    after = {k: v.numpy() for k, v in fresh.state_dict().items()}
    report = {
        "rank": paddle.distributed.get_rank(),
        "file_keys": sorted(loaded),
        "model_keys": sorted(trained),
        "values_equal": sorted(trained) == sorted(after)
        and all(trained[k].tobytes() == after[k].tobytes() for k in trained),
        "fresh_init_differed": any(before[k].tobytes() != trained[k].tobytes() for k in trained),
        "overlay_applied": __import__("paddle_overlay").is_applied(),
    }
    print("README-CHECK " + json.dumps(report), flush=True)


main()
