"""The parameter sync's schedule on the virtual clock, in one process over fake sharding groups
(``vclock/fake_group.py``): Paddle's optimizers and the overlay's public entry points run unchanged;
the clock wraps the fake group's collective methods. A LLaMA-7B-shaped model of ``LAYERS`` decoder
layers built tiny (each parameter carrying its bf16 LLaMA-7B size). The properties are deterministic
virtual-clock times (ms), so they are asserted exactly or within a stated margin:

* the product exposes the bound (``MARGIN_MS``) when the sync is shorter than the forward (4k tokens,
  no contention), V1 per parameter and in buckets, V2 comm buffers, 2 and 8 ways;
* a model built head-first costs upstream's name-sorted order more than the product's agreed order;
* the schedule broken on purpose moves the numbers: a forward pre-hook that waits for every unit, or
  the units started in reverse order, expose at least ``BROKEN_MS`` more than the bound.
"""

import functools

import pytest

import paddle_overlay
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer.param_sync_overlap import (
    get_param_sync_overlap,
)
from vclock import llama, runs

LAYERS = 2
MARGIN_MS = 0.01  # product exposed - bound, sync shorter than forward, no contention
BROKEN_MS = 1.0  # a broken schedule's exposed - bound, same setting
SHORT = "4k_free"  # 4096 tokens, no contention: the sync is shorter than the forward


@pytest.fixture(scope="module", autouse=True)
def overlay_restored():
    """The runs apply or remove the overlay per mode; leave it as it was."""
    was = paddle_overlay.is_applied()
    yield
    if not was:
        paddle_overlay.remove()


def last(mode, variant="llama7b", ways=2, scenario=SHORT, between=None):
    """The last step's record of ``mode`` (a key of runs.MODES) in ``scenario``, and its clock; runs
    without ``between`` are made once per module."""
    clock = _run(mode, variant, ways) if between is None else _fresh(mode, variant, ways, between)
    return clock.steps(scenario)[-1], clock


def _fresh(mode, variant, ways, between=None):
    return runs.run(runs.FakeBackend(ways), runs.MODES[mode], variant, LAYERS, between=between)[0]


@functools.lru_cache(maxsize=None)
def _run(mode, variant, ways):
    return _fresh(mode, variant, ways)


def forward_ms(tokens=4096):
    model = llama.build("llama7b", LAYERS)
    return sum(ms[tokens] for _, ms, _ in llama.segments(model, [tokens]))


def test_off_exposes_the_whole_sync_in_step():
    record, _ = last("off")
    assert record.exposed_ms > 0
    assert record.waits == {"step": pytest.approx(record.exposed_ms)}


@pytest.mark.parametrize("ways", [2, 8])
@pytest.mark.parametrize("mode", ["ours_v1_per_param", "ours_v1_bucket_256", "ours_v2_buffer_256"])
def test_the_product_exposes_the_bound_when_the_sync_is_shorter_than_the_forward(mode, ways):
    off, _ = last("off_v2" if "v2" in mode else "off", ways=ways)
    assert off.exposed_ms < forward_ms()  # the whole sync alone is shorter than the forward
    record, _ = last(mode, ways=ways)
    assert record.exposed_ms == pytest.approx(record.bound_ms, abs=MARGIN_MS)
    assert set(record.waits) == {"forward pre-hook"}


@pytest.mark.parametrize("scenario", [SHORT, "4k"])
def test_a_head_first_model_costs_upstreams_name_order_more_than_the_agreed_order(scenario):
    ours, _ = last("ours_v1_per_param", "head_first", scenario=scenario)
    upstream, _ = last("upstream_v1", "head_first", scenario=scenario)
    assert upstream.bound_ms == ours.bound_ms  # the same units, the same forward
    assert upstream.exposed_ms > ours.exposed_ms + 0.3


def _over_waiting_hook(monkeypatch):
    """Break: every forward pre-hook waits for every unit (more than its layer needs)."""

    def after_first_step(step, model, opt):
        owner_type = type(get_param_sync_overlap(opt))
        wait = owner_type.wait

        def wait_everything(self, units, reason, path=None):
            return wait(self, self.units if reason == "waited_in_forward" else units, reason, path)

        if step == 0:
            monkeypatch.setattr(owner_type, "wait", wait_everything)

    return after_first_step


def _reversed_issue_order(monkeypatch):
    """Break: each launch starts the units last first (the k-th start call starts the k-th unit
    from the end)."""

    def after_first_step(step, model, opt):
        owner = get_param_sync_overlap(opt)
        unit_type = type(owner.units[0])
        start = unit_type.start
        calls = []

        def start_mirrored(unit, comm):
            units = owner.units
            start(units[len(units) - 1 - len(calls) % len(units)], comm)
            calls.append(unit)

        if step == 0:
            monkeypatch.setattr(unit_type, "start", start_mirrored)

    return after_first_step


@pytest.mark.parametrize("break_schedule", [_over_waiting_hook, _reversed_issue_order])
def test_a_broken_schedule_moves_the_numbers(break_schedule, monkeypatch):
    intact, _ = last("ours_v1_bucket_256")
    broken, _ = last("ours_v1_bucket_256", between=break_schedule(monkeypatch))
    assert broken.bound_ms == intact.bound_ms
    assert broken.exposed_ms > broken.bound_ms + BROKEN_MS
    assert broken.exposed_ms > intact.exposed_ms + BROKEN_MS


def test_a_forward_collective_queues_behind_the_sync():
    off, _ = last("off", "forward_collective")
    ours, _ = last("ours_v1_bucket_256", "forward_collective")
    assert ours.exposed_ms > 0.9 * off.exposed_ms
    assert ours.waits["forward"] > 0.5 * ours.exposed_ms
    ours_v2, _ = last("ours_v2_buffer_256", "forward_collective")
    upstream_v2, _ = last("upstream_v2", "forward_collective")  # one gather in flight: less queued
    assert upstream_v2.waits.get("forward", 0.0) < ours_v2.waits["forward"]


def test_a_read_between_steps_is_waited_by_the_read():
    def read_the_final_norm(step, model, opt):
        model.norm.weight.numpy()

    # the final norm's broadcast is the last but one in the agreed order: the read waits for almost the
    # whole sync, and the forward's pre-hooks find it done
    record, _ = last("ours_v1_per_param", between=read_the_final_norm)
    assert set(record.waits) == {"read"}
    assert record.waits["read"] > 0.9 * record.exposed_ms


def test_modelled_bytes_are_the_parameters_llama7b_sizes():
    model = llama.build("llama7b", LAYERS)
    total = sum(llama.modelled_sizes(model).values())
    for mode in ("ours_v1_per_param", "ours_v1_bucket_256", "ours_v2_buffer_256", "upstream_v1", "off_v2"):
        record, clock = last(mode)
        assert record.sync_bytes == total, mode
    # the order agreement (an int64 count, then the order) is not part of the sync: its real bytes
    _, clock = last("ours_v1_bucket_256")
    issues = [detail for event, detail in clock.trace if event == "issue"]
    n = len(list(model.parameters()))
    assert [d for d in issues if d[0] == "broadcast" and not d[2]] == [("broadcast", 8, False), ("broadcast", 8 * n, False)]


def test_the_clock_is_deterministic_and_steady():
    clock_a, clock_b = _fresh("ours_v1_bucket_256", "llama7b", 2), _fresh("ours_v1_bucket_256", "llama7b", 2)
    assert [r.as_dict() for r in clock_a.steps("1k")] == [r.as_dict() for r in clock_b.steps("1k")]
    assert clock_a.trace == clock_b.trace
    previous, latest = clock_a.steps("1k")[-2:]  # steps 2 and 3: the same up to rounding
    assert latest.exposed_ms == pytest.approx(previous.exposed_ms, abs=1e-9)
    assert latest.step_ms == pytest.approx(previous.step_ms, abs=1e-9)
