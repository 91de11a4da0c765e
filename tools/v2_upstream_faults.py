# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Opt-in: Paddle's own V2 all-gather overlap (``DygraphShardingOptimizerV2._set_all_gather_overlap_forward``,
the overlay not applied) on the cases of ``test/collective/fleet/dygraph_sharding_stage1_allgather_overlap.py``
that issue 17 names; each must fail with its error (XFAIL), the baselines must pass. Rewrites the table of
``docs/v2_allgather_overlap.md`` between its markers from the ranks' ``CASE`` lines. Tests Paddle, not the
product: not in the suite. Run with the 3.3.1 venv (the table is measured there):

    .venv-test/paddle-3.3.1/bin/python tools/v2_upstream_faults.py [--check]

``--check``: exit 1 when the document's table differs from the one measured (nothing written).
"""

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tools", "collective"), os.path.join(ROOT, "test")]
FLEET = os.path.join(ROOT, "test", "collective", "fleet")
SCRIPT = os.path.join(FLEET, "dygraph_sharding_stage1_allgather_overlap.py")
DOC = os.path.join(ROOT, "docs", "v2_allgather_overlap.md")
BEGIN, END = "<!-- v2_upstream_faults.py: begin -->", "<!-- v2_upstream_faults.py: end -->"
RELEASE = "3.3.1"
DIFFERS = r"read between steps differs from overlap off"
# case -> (item of issue 17, regex its failure must match, what the product does instead)
FAULTS = {
    "gather_order_follows_forward": ("1: order", r"all-gathers launched in buffer order \[0, 2, 1\], "
                                     r"forward first uses \[2, 0, 1\]", "agreed first-use order"),
    "state_dict_right_after_step": ("2: reads after `step()`", DIFFERS, "bitwise"),
    "parameters_loop_ema_right_after_step": ("2", DIFFERS, "bitwise"),
    "save_right_after_step_and_reload": ("2", DIFFERS, "bitwise, reload equal"),
    "layer_spanning_two_buffers": ("2", DIFFERS, "bitwise"),
    # the ranks start the helper's buffers in a set's iteration order, different per process
    "encode_helper_between_steps": ("3: helper between steps", r"EncodeLM \['after_step', 'prepare'\]: (parameter "
                                    r"(_layers\.)?encoder\.table_\d+|value \d+ read between steps) differs", "bitwise"),
    "freeze_parameters_after_first_step": ("4: frozen-only buffer", r"assert bucket\.sync_param_task is not None",
                                           "skipped buffer, bitwise"),
    "layer_parameter_not_in_optimizer": ("5", r"KeyError: 'linear_\d+\.w_0'", "ignored, bitwise"),
    "root_owned_parameter": ("6: root never hooked", r"reads of a parameter whose sync is pending: "
                             r"\[\('forward:_layers', 'root_param_lm_\d+\.w_0'\)", "waited by the root's hook"),
    "hooks_constant_and_removed": ("6: handles not kept", r"_set_all_gather_overlap_forward\(False\) left \d+ "
                                   r"forward pre-hooks", "constant count, 0 after `False`"),
    "to_static": ("(beyond 1-6)", r"loss \d+ differs", "every compiled program waits first"),
}
PASSES = {"equal_on_off": "pass", "root_owned_parameter_wrapped_layers": "pass"}  # what upstream gets right


def measure():
    """{case: (verdict, first line of the error)} of rank 0, from one 2-rank launch."""
    import paddle
    from collective_launch import launch_collective
    from legacy_test.test_parallel_dygraph_dataparallel import cpu_shim_env

    assert paddle.__version__ == RELEASE, f"measured on Paddle {RELEASE}, this is {paddle.__version__}"
    expected = json.dumps({case: fault[1] for case, fault in FAULTS.items()})
    env = cpu_shim_env({"BROADCAST_OVERLAP_CASES": ",".join(list(FAULTS) + list(PASSES)),
                        "ALLGATHER_OVERLAP_IMPL": "upstream", "PADDLE_OVERLAY": "0",
                        "BROADCAST_OVERLAP_EXPECTED_FAILURES": expected})
    result = launch_collective(SCRIPT, nproc=2, env=env, timeout=400)  # raises when a case is not as expected
    lines = result.rank_logs[0]
    found = {}
    for case in list(FAULTS) + list(PASSES):
        line = re.search(rf"^CASE {case} (PASS|XFAIL) .*$", lines, re.M)
        pattern = FAULTS.get(case, (None, None))[1]
        error = line.group(0).partition(f" expected /{pattern}/ ")[2] if pattern else ""
        found[case] = (line.group(1), error.split(": ", 1)[-1].strip() or f"/{pattern}/")
    return found


def table(found):
    rows = ["| case | upstream fault | upstream 3.3.1 (measured) | product (3.3.1 and 2.6.2) |",
            "| --- | --- | --- | --- |"]
    for case, (item, _, product) in FAULTS.items():
        verdict, error = found[case]
        error = re.sub(r"(?<=_)\d+|\d+\.\d+", "N", error)[:160].replace("|", "\\|")  # ids, floats
        rows.append(f"| `{case}` | {item} | {verdict}: {error} | {product} |")
    rows.append(f"| {', '.join(f'`{c}`' for c in PASSES)} | baseline | pass | pass |")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the document, write nothing")
    args = ap.parse_args(argv)
    new = table(measure())
    text = open(DOC).read()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    updated = text[:start] + "\n" + new + "\n" + text[end:]
    if args.check:
        print("table up to date" if updated == text else "table differs:\n" + new)
        return 0 if updated == text else 1
    with open(DOC, "w") as f:
        f.write(updated)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
