# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Compare the ``result.npz`` of the on, off and resumed runs of train_tiny_llama.py.

usage: check_results.py ON_DIR OFF_DIR RESUME_DIR RESUMED_AT_STEP

Checks, each printed as one PASS/FAIL line:
  * the on run had paddle_overlay applied with broadcast overlap on (an agreed
    order of every parameter, forward pre-hooks held); the off run had neither;
  * on vs off: every loss and every parameter bitwise equal;
  * resume (from checkpoint-RESUMED_AT_STEP of the on run, overlay on): its losses
    equal the on run's from that step, and its final parameters equal the on run's,
    bitwise.
Exit code 0 when every check passes, 1 otherwise.
"""

import sys

import numpy as np


def load(run_dir):
    with np.load(f"{run_dir}/result.npz") as data:
        return {k: data[k] for k in data.files}


def params(result):
    return {k: v for k, v in result.items() if k.startswith("param/")}


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def differing(a, b):
    """Parameter names whose values differ in any bit (or that only one side has)."""
    names = sorted(set(a) | set(b))
    return [n for n in names if n not in a or n not in b or not same_bits(a[n], b[n])]


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    on, off, resume = (load(d) for d in argv[:3])
    step = int(argv[3])
    n_params = len(params(on))
    checks = [
        (
            "on: overlay applied, overlap on for every parameter",
            int(on["applied"]) == 1 and int(on["overlap_order"]) == n_params > 0 and int(on["overlap_hooks"]) > 0,
            f"applied={int(on['applied'])} order={int(on['overlap_order'])}/{n_params} hooks={int(on['overlap_hooks'])}",
        ),
        ("off: overlay not applied", int(off["applied"]) == 0, f"applied={int(off['applied'])}"),
        (
            "on vs off: losses bitwise equal",
            same_bits(on["losses"], off["losses"]),
            f"{len(on['losses'])} steps: on {on['losses'].tolist()} off {off['losses'].tolist()}",
        ),
        (
            "on vs off: parameters bitwise equal",
            not differing(params(on), params(off)),
            f"{n_params} parameters; differing: {differing(params(on), params(off))[:5]}",
        ),
        (
            f"resume from step {step}: overlay applied, losses equal the on run's",
            int(resume["applied"]) == 1 and same_bits(resume["losses"], on["losses"][step:]),
            f"resume {resume['losses'].tolist()} on[{step}:] {on['losses'][step:].tolist()}",
        ),
        (
            f"resume from step {step}: final parameters bitwise equal the on run's",
            not differing(params(on), params(resume)),
            f"{n_params} parameters; differing: {differing(params(on), params(resume))[:5]}",
        ),
    ]
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  ({detail})")
    failed = sum(not ok for _, ok, _ in checks)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
