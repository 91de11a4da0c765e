# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Compare the ``result.npz`` of the on, off and resumed runs of train_tiny_llama.py.

usage: check_results.py ON_DIR OFF_DIR RESUME_DIR RESUMED_AT_STEP [v1|v2]

Checks, each printed as one PASS/FAIL line:
  * the on run had paddle_overlay applied with overlap on (an agreed order of
    every parameter, forward pre-hooks held); the off run had neither;
  * the on run's collectives are those of the stage (last argument, default v1):
    v1, broadcasts and no V2 comm buffer; v2, one all-gather per V2 comm buffer,
    2 or more buffers, as many as the off run's;
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


def count(result, key):
    """An int read-out; 0 when this result has none (written before it existed)."""
    return int(result[key]) if key in result else 0


def stage_check(stage, on, off):
    """(name, ok, detail) for the on run's collectives, as the module says."""
    units, gathers, buffers = count(on, "overlap_units"), count(on, "overlap_all_gather"), count(on, "comm_buffers")
    detail = f"units={units} all_gather={gathers} comm_buffers={buffers} (off: {count(off, 'comm_buffers')})"
    if stage == "v2":
        ok = gathers == 1 and units == buffers == count(off, "comm_buffers") >= 2
        return "on: V2, one all-gather per comm buffer", ok, detail
    return "on: V1, broadcasts (no V2 comm buffer)", gathers == 0 and buffers == 0 and units > 0, detail


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def differing(a, b):
    """Parameter names whose values differ in any bit (or that only one side has)."""
    names = sorted(set(a) | set(b))
    return [n for n in names if n not in a or n not in b or not same_bits(a[n], b[n])]


def main(argv):
    if len(argv) not in (4, 5) or (len(argv) == 5 and argv[4] not in ("v1", "v2")):
        sys.exit(__doc__)
    on, off, resume = (load(d) for d in argv[:3])
    step = int(argv[3])
    stage = argv[4] if len(argv) == 5 else "v1"
    n_params = len(params(on))
    checks = [
        (
            "on: overlay applied, overlap on for every parameter",
            int(on["applied"]) == 1 and int(on["overlap_order"]) == n_params > 0 and int(on["overlap_hooks"]) > 0,
            f"applied={int(on['applied'])} order={int(on['overlap_order'])}/{n_params} hooks={int(on['overlap_hooks'])}",
        ),
        ("off: overlay not applied", int(off["applied"]) == 0, f"applied={int(off['applied'])}"),
        stage_check(stage, on, off),
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
