"""The virtual clock's costs (``vclock/costs.py``, ``vclock/contention.py``) against the measured H200
figures in ``benchmarks/data/``, and the torch stand-ins replayed on the clock's model
(``vclock/standins.py``) within the tolerances ``docs/performance.md`` Section 3 states:

* issue-strategy stand-in (2x H200, NCCL), every replayed mode at 1k and 4k tokens: within
  ``ISSUE_TOLERANCE`` of the measured exposed time (its one-broadcast-per-layer mode, the contention's
  calibration, within 1%);
* V2 schedule proxy (1x H200): all gathers at the step boundary with SM copies within
  ``V2_SM_TOLERANCE``; every copy-engine row within ``V2_CE_MS`` ms (not reproduced, and not tested: SM
  copies chained with 1-4 in flight, where the model gives 10.5-11.7 ms and 6.2-7.4 were measured);
* bucket sweep (2x H200): 1k tokens within ``SWEEP_1K_TOLERANCE``; 4k tokens with caps up to 64 MB
  within ``SWEEP_4K_TOLERANCE`` (not reproduced: 4k tokens with caps of 128 MB and more, +15% to +33%).
"""

import pytest

from vclock import contention, costs, standins
from vclock import timeline as tl

ISSUE_TOLERANCE = 0.21
V2_SM_TOLERANCE = 0.22
V2_CE_MS = 1.2
SWEEP_1K_TOLERANCE = 0.24
SWEEP_4K_TOLERANCE = 0.10


def test_broadcast_curve_is_the_measured_one_between_its_points():
    anchor = costs.load("h200_anchor")
    cc = costs.CollectiveCosts.from_anchor()
    points = sorted((int(b), ms) for b, ms in anchor["broadcast_ms_by_bytes"].items())
    for nbytes, ms in points:
        assert cc.broadcast_ms(nbytes) == ms
    (b0, m0), (b1, m1) = points[-2], points[-1]
    assert cc.broadcast_ms((b0 + b1) // 2) == pytest.approx((m0 + m1) / 2)
    assert cc.broadcast_ms(1) == points[0][1]


def test_all_gather_is_a_broadcast_of_the_bytes_each_rank_receives():
    cc = costs.CollectiveCosts.from_anchor()
    assert cc.time_ms("all_gather", 800 << 20, 2) == cc.broadcast_ms(400 << 20)
    assert cc.time_ms("all_gather", 800 << 20, 8) == cc.broadcast_ms(700 << 20)
    assert cc.time_ms("all_reduce", 800 << 20, 2) == cc.broadcast_ms(800 << 20)
    assert cc.time_ms("broadcast", 800 << 20, 8) == cc.broadcast_ms(800 << 20)


def test_a_layers_nine_broadcasts_back_to_back_take_the_measured_time():
    anchor = costs.load("h200_anchor")
    cc = costs.CollectiveCosts.from_anchor()
    h, f = costs.LLAMA7B.hidden, costs.LLAMA7B.ffn
    line = tl.Timeline(pipelined_ms=cc.pipelined_ms)
    items = [line.issue("g", cc.broadcast_ms(n * 2), True) for n in [h * h] * 4 + [h * f] * 3 + [h] * 2]
    line.wait(items[-1])
    assert line.now == pytest.approx(anchor["layer_bcast_ms_per_param"])


@pytest.mark.parametrize("tokens", costs.TOKENS)
def test_a_decoder_layers_segments_add_up_to_its_measured_forward(tokens):
    parts = costs.llama_segments(tokens)
    assert sum(parts[r] for r in costs.DECODER_ROLES) == pytest.approx(costs.load("h200_anchor")[f"layer_fwd_ms_S{tokens}"])
    assert all(ms > 0 for ms in parts.values())
    with pytest.raises(ValueError, match="measured at"):
        costs.llama_segments(2048)


@pytest.mark.parametrize("tokens", costs.TOKENS)
@pytest.mark.parametrize("source, copy", [("sm16_1gpu", "sm16"), ("ce_1gpu", "ce")])
def test_one_gpu_rates_give_back_both_measured_spans(source, copy, tokens):
    row = costs.load("h200_contention_1gpu")[f"S{tokens}"]
    line = tl.Timeline(contention.contention(source, tokens))
    transfer = line.issue("side", row[copy]["transfer_alone_ms"], True)
    line.compute(row["fwd_alone_ms"])
    line.wait(transfer)
    assert (line.now, transfer.done_at) == (pytest.approx(row[copy]["boundary_ms"]),
                                            pytest.approx(row[copy]["transfer_with_fwd_ms"]))


def test_nccl_rates_reproduce_their_calibration_and_the_anchors_rates_do_not():
    rates = contention.nccl_2gpu()
    assert 0 < rates[0] <= 1 and 0 < rates[1] <= 1
    for tokens in costs.TOKENS:
        model, measured = standins.issue_strategy("eager_flat", tokens, rates)
        assert model == pytest.approx(measured, rel=0.01)
    # the 2-GPU anchor's overlapped layer alone (rc 0.32, rb 1) overshoots the 32-layer stand-in
    model, measured = standins.issue_strategy("eager_flat", 4096, contention.contention("nccl_anchor", 4096))
    assert model > 1.5 * measured


@pytest.mark.parametrize("tokens", costs.TOKENS)
@pytest.mark.parametrize("mode", standins.ISSUE_MODES)
def test_issue_strategy_stand_in_reproduced(mode, tokens):
    model, measured = standins.issue_strategy(mode, tokens, contention.nccl_2gpu())
    assert model == pytest.approx(measured, rel=ISSUE_TOLERANCE)


@pytest.mark.parametrize("tokens", costs.TOKENS)
def test_v2_proxy_all_at_step_with_sm_copies_reproduced(tokens):
    model, measured = standins.v2_schedule("all_at_step", "sm", tokens, contention.contention("sm16_1gpu", tokens))
    assert model == pytest.approx(measured, rel=V2_SM_TOLERANCE)


@pytest.mark.parametrize("tokens", costs.TOKENS)
@pytest.mark.parametrize("schedule", standins.V2_SCHEDULES)
def test_v2_proxy_copy_engine_rows_reproduced(schedule, tokens):
    model, measured = standins.v2_schedule(schedule, "ce", tokens, contention.contention("ce_1gpu", tokens))
    assert model == pytest.approx(measured, abs=V2_CE_MS)


@pytest.mark.parametrize("cap", standins.SWEEP_CAPS)
def test_bucket_sweep_reproduced_where_stated(cap):
    rates = contention.nccl_2gpu()
    model, measured = standins.bucket_sweep(cap, 1024, rates)
    assert model == pytest.approx(measured, rel=SWEEP_1K_TOLERANCE)
    if cap <= 64:
        model, measured = standins.bucket_sweep(cap, 4096, rates)
        assert model == pytest.approx(measured, rel=SWEEP_4K_TOLERANCE)


def test_unknown_inputs_are_refused():
    with pytest.raises(ValueError, match="unknown contention source"):
        contention.contention("nvlink5", 1024)
    with pytest.raises(ValueError, match="unknown mode"):
        standins.issue_strategy("eager_group", 1024, (1.0, 1.0))
    with pytest.raises(ValueError, match="not measured"):
        standins.bucket_sweep(16, 1024, (1.0, 1.0))
