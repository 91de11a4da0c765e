"""The virtual clock's time model (``vclock/timeline.py``): streams, contention, waits, the bound.
Pure Python; every expected value is worked out by hand in the test."""

import pytest

from vclock import timeline as tl


def test_one_group_completes_in_issue_order_and_a_queued_call_saves_its_latency():
    line = tl.Timeline(pipelined_ms=0.1)
    first = line.issue("g", 2.0, sync=True)
    second = line.issue("g", 1.0, sync=True)  # queued: 1.0 - 0.1
    assert line.wait(second) == pytest.approx(2.9)
    assert (first.done_at, second.done_at) == (pytest.approx(2.0), pytest.approx(2.9))
    assert line.wait(first) == 0.0


def test_groups_have_streams_of_their_own():
    line = tl.Timeline()
    a = line.issue("a", 3.0, sync=True)
    b = line.issue("b", 2.0, sync=False)
    line.wait(a)
    assert (a.done_at, b.done_at, line.now) == (3.0, 2.0, 3.0)


def test_compute_beside_a_collective_runs_at_the_contended_rates():
    # rc 0.5, rb 1: the 4 ms collective ends at 4 with 2 ms of compute done; 8 ms remain alone: 12
    line = tl.Timeline(contention=(0.5, 1.0))
    item = line.issue("g", 4.0, sync=True)
    assert line.compute(10.0) == pytest.approx(12.0)
    assert item.done_at == pytest.approx(4.0)
    # rc 0.5, rb 0.5: the collective ends at 8 (4 ms of compute done), 6 ms remain alone: 14
    line = tl.Timeline(contention=(0.5, 0.5))
    item = line.issue("g", 4.0, sync=True)
    assert line.compute(10.0) == pytest.approx(14.0)
    assert item.done_at == pytest.approx(8.0)


def test_a_wait_idles_the_compute_and_the_collective_runs_at_full_speed():
    line = tl.Timeline(contention=(0.5, 0.5))
    item = line.issue("g", 4.0, sync=True)
    line.compute(1.0)  # 2 ms: the collective did 1 ms of its 4
    assert line.wait(item) == pytest.approx(3.0)
    assert line.now == pytest.approx(5.0)


def test_free_sync_costs_nothing_and_leaves_other_collectives_as_they_are():
    line = tl.Timeline(contention=(0.5, 1.0), free_sync=True)
    sync = line.issue("g", 4.0, sync=True)
    other = line.issue("g", 2.0, sync=False)
    assert sync.done_at == 0.0
    assert line.wait(other) == pytest.approx(2.0)


def test_bad_rates_are_refused():
    for rates in ((0.0, 1.0), (1.0, 1.5)):
        with pytest.raises(ValueError, match="contention rates"):
            tl.Timeline(contention=rates)


def test_bound_numbers_units_by_their_first_user():
    segments = [(1.0, {"a"}), (4.0, {"b"}), (2.0, {"c"})]
    # unit a (3 ms) first used by segment 0: 3 - 0; unit b (2 ms) by segment 1: 5 - 1 = 4; c: 6 - 5
    assert tl.bound_ms([(3.0, {"a"}), (2.0, {"b"}), (1.0, {"c"})], segments) == pytest.approx(4.0)
    # listed in another order, or with a unit nobody uses: the same
    assert tl.bound_ms([(1.0, {"c"}), (9.0, {"x"}), (2.0, {"b"}), (3.0, {"a"})], segments) == pytest.approx(4.0)
    # each unit after the first saves 0.5 ms queued
    assert tl.bound_ms([(3.0, {"a"}), (2.0, {"b"})], segments, pipelined_ms=0.5) == pytest.approx(3.5)
    assert tl.bound_ms([(0.5, {"a"})], segments) == pytest.approx(0.5)
    assert tl.bound_ms([], segments) == 0.0


@pytest.mark.parametrize(
    "units, forward",
    [
        ([2.0, 1.0, 3.0, 0.5], [1.0, 1.0, 1.0, 1.0]),  # sync longer than forward
        ([0.2, 0.2, 0.2, 0.2], [1.0, 1.0, 1.0, 1.0]),  # shorter
        ([0.1, 5.0, 0.1, 0.1], [2.0, 0.5, 3.0, 0.5]),
    ],
)
def test_the_bound_is_reached_by_first_use_order_and_waits_for_own_units_only(units, forward):
    """Without contention, every unit issued at once in first-use order and each segment waiting for
    its own unit exposes exactly the bound."""
    line = tl.Timeline(pipelined_ms=0.05)
    items = [line.issue("g", ms, sync=True) for ms in units]
    for item, ms in zip(items, forward):
        line.wait(item)
        line.compute(ms)
    exposed = line.now - sum(forward)
    bound = tl.bound_ms([(ms, {k}) for k, ms in enumerate(units)], [(ms, {k}) for k, ms in enumerate(forward)],
                        pipelined_ms=0.05)
    assert exposed == pytest.approx(bound, abs=1e-9)
