# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The committed test/**/CMakeLists.txt match their testslist.csv, and one row's CMake form."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, TOOLS)
import gen_ut_cmakelists  # noqa: E402
from testslist import eval_condition, parse_row, platform_facts, unmet_requirements  # noqa: E402

SAMPLE = ("test_sample_overlap,LINUX,GPU,200,DIST,../../legacy_test/dist_test.sh,2,1,"
          "NVIDIA_TF32_OVERRIDE=0;http_proxy=;PYTHONPATH=../..,WITH_NCCL").split(",")


def test_committed_cmakelists_up_to_date():
    out = subprocess.run([sys.executable, os.path.join(TOOLS, "gen_ut_cmakelists.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_sample_row_cmake_entry():
    text = gen_ut_cmakelists.cmake_entry(parse_row(SAMPLE), 21300)
    assert text == (
        "if((WITH_GPU) AND (LINUX) AND (WITH_NCCL))\n"
        "  bash_test_modules(\n"
        "    test_sample_overlap\n"
        "    START_BASH\n"
        "    ../../legacy_test/dist_test.sh\n"
        "    TIMEOUT\n"
        '    "200"\n'
        "    LABELS\n"
        '    "RUN_TYPE=DIST"\n'
        "    ENVS\n"
        '    "PADDLE_DIST_UT_PORT=21300;NVIDIA_TF32_OVERRIDE=0;http_proxy=;PYTHONPATH=../..:${PADDLE_BINARY_DIR}/python")\n'
        '  set_tests_properties(test_sample_overlap PROPERTIES TIMEOUT "200" RUN_SERIAL 1)\n'
        "elseif(COMMAND paddle_overlay_unmet_test)\n"
        '  paddle_overlay_unmet_test(test_sample_overlap TIMEOUT "200" REASON "needs (WITH_GPU) AND (LINUX) AND (WITH_NCCL)")\n'
        "endif()\n"
    )


def test_unconditional_row_has_no_skip_branch():
    row = parse_row(["test_plain", "", "", "", "DIST", "../../legacy_test/dist_test.sh", "2", "", "http_proxy=", ""])
    text = gen_ut_cmakelists.cmake_entry(row, 21200)
    assert text.startswith("if(LOCAL_ALL_ARCH AND LOCAL_ALL_PLAT)\n")
    assert "elseif" not in text and 'TIMEOUT "350"' in text and "RUN_SERIAL 0" in text


@pytest.mark.parametrize(
    "cells, message",
    [
        (["sample"] + SAMPLE[1:], "name must look like"),
        (SAMPLE[:2] + ["TPU"] + SAMPLE[3:], "arch must be among"),
        (SAMPLE[:3] + ["ten"] + SAMPLE[4:], "timeout must be whole seconds"),
        (SAMPLE[:8] + ["A B=1"] + SAMPLE[9:], "envs items"),
        (SAMPLE[:5], "expected 10 columns"),
    ],
)
def test_malformed_rows_are_rejected(cells, message):
    with pytest.raises(ValueError, match=message):
        parse_row(cells)


def test_requirements_on_cpu_name_their_reason():
    row = parse_row(SAMPLE)
    reasons = unmet_requirements(row, "cpu", platform_facts(cuda=False))
    assert "needs arch GPU, running on cpu" in reasons
    assert "condition WITH_NCCL is false here" in reasons
    if sys.platform.startswith("linux"):
        assert unmet_requirements(row, "gpu", platform_facts(cuda=True)) == []


def test_condition_evaluation():
    facts = {"A": True, "B": False}
    assert eval_condition("A AND NOT B", facts)
    assert not eval_condition("(A AND B) OR B", facts)
    with pytest.raises(ValueError):
        eval_condition("${NCCL_VERSION} VERSION_GREATER_EQUAL 2212", facts)
