"""Table B2 of ``buckets.py`` (LLaMA-7B's bucket plan, computed by the product's planner; no
kernels, no ranks): the counts README.md and docs/performance.md quote."""

import os

import pytest



def test_llama7b_parameters_owners_and_forward_order():
    pytest.importorskip("paddle")
    import buckets

    numels, owners, order = buckets.llama7b_params(2)
    assert len(numels) == 291 and sum(numels) == 6_738_415_616  # LLaMA-7B: 6.74 B parameters
    assert sorted(order) == list(range(291)) and order[:2] == [0, 8]  # embedding, then layer 0's input norm
    assert order[-1] == 290 and set(owners) == {0, 1}


def test_llama7b_plan_counts_quoted_in_the_docs():
    pytest.importorskip("paddle")
    import buckets

    rows = [line.split("|")[1:-1] for line in buckets.llama7b_plan_table().splitlines()[2:]]
    counts = {(int(d), int(c)): int(n) for d, c, _, n in rows}
    assert counts[(2, 0)] == counts[(8, 0)] == 291
    assert counts[(2, 256)] == 87 and counts[(8, 256)] == 223
