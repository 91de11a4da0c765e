"""Unit tests for benchmarks/research/timeline_sim.py and timeline_standin.py: pure Python, no Paddle,
no timing."""

import json
import os
import sys
import warnings

import pytest


import timeline_sim as ts  # noqa: E402
import timeline_standin as tsi  # noqa: E402

ANCHOR = json.load(open(ts.DEFAULT_ANCHOR))


@pytest.fixture(autouse=True, scope="module")
def _coverage_paused():
    """Pause coverage (``tools/run_tests.sh`` runs the unit tests under it) while these tests
    run: the simulator never imports ``paddle_overlay``, the only package it measures, and its
    tracer would still slow every one of the simulator's calls (2 to 3 times)."""
    try:
        import coverage
    except ImportError:
        coverage = None
    cov = coverage.Coverage.current() if coverage is not None else None
    if cov is not None:
        cov.stop()
    try:
        yield
    finally:
        if cov is not None:
            with warnings.catch_warnings():  # "already imported a file that will be measured": it was, before the pause
                warnings.simplefilter("ignore", coverage.exceptions.CoverageWarning)
                cov.start()


def flat_cal(**kw):
    """A calibration where every broadcast takes exactly 1 ms."""
    base = dict(
        bcast_bytes=(1, 2),
        bcast_ms=(1.0, 1.0),
        pipelined_saving_ms=0.0,
        rc=1.0,
        rb=1.0,
        layer_fwd_ms={1: 1.0},
        copy_gbps=1.0,
        hop_ms=0.0,
    )
    base.update(kw)
    return ts.Calibration(**base)


def two_layer_model():
    units = [ts.Unit("a", 2.0), ts.Unit("b", 2.0)]
    params = [ts.Param("pa", 2, "a"), ts.Param("pb", 2, "b")]
    return units, params


# -- calibration -------------------------------------------------------------
def test_interpolation_hits_anchor_points_and_extrapolates_by_bandwidth():
    cal = ts.Calibration.from_anchor(ANCHOR)
    for k, v in ANCHOR["broadcast_ms_by_bytes"].items():
        assert cal.isolated_bcast_ms(int(k)) == pytest.approx(v)
    assert cal.isolated_bcast_ms(1) == pytest.approx(ANCHOR["broadcast_ms_by_bytes"]["8192"])
    big, bigger = 1 << 30, 2 << 30
    slope = cal.isolated_bcast_ms(bigger) - cal.isolated_bcast_ms(big)
    assert slope == pytest.approx(
        ANCHOR["broadcast_ms_by_bytes"]["1073741824"] - ANCHOR["broadcast_ms_by_bytes"]["268435456"], rel=1e-9
    ) or slope > 0
    mid = (8388608 + 33554432) // 2
    lo, hi = cal.isolated_bcast_ms(8388608), cal.isolated_bcast_ms(33554432)
    assert lo < cal.isolated_bcast_ms(mid) < hi


def test_pipelined_saving_reproduces_per_param_layer_broadcast():
    cal = ts.Calibration.from_anchor(ANCHOR)
    sizes = ts._layer_params_bytes()
    total = sum(cal.bcast_ms_for(b, pipelined=i > 0) for i, b in enumerate(sizes))
    assert total == pytest.approx(ANCHOR["layer_bcast_ms_per_param"], rel=1e-9)


def test_contention_fit_reproduces_anchor_overlap_within_one_percent():
    cal = ts.Calibration.from_anchor(ANCHOR)
    assert 0 < cal.rc < 1 and 0 < cal.rb <= 1
    for s, measured, model in ts.contention_residuals(ANCHOR, cal.rc, cal.rb):
        assert model == pytest.approx(measured, rel=0.01), s
        # Contention is modelled, not assumed away: overlapped > ideal max().
        assert model > max(ANCHOR[f"layer_fwd_ms_S{s}"], ANCHOR["layer_bcast_ms_per_param"])


def test_fixed_rb_fits_rc_only():
    rc, rb, _ = ts.fit_contention(ANCHOR, rb=0.9)
    assert rb == 0.9 and 0 < rc < 1


def test_closed_form_matches_event_simulation():
    for rc, rb, f, b in [(0.3, 1.0, 2.0, 1.0), (0.5, 0.6, 1.0, 3.0), (0.9, 0.9, 1.0, 1.0)]:
        cal = flat_cal(rc=rc, rb=rb)
        r = ts._simulate_work([b], [set()], [ts.Unit("f", f)], cal, contention=True)
        assert max(r.forward_end_ms, r.comm_end_ms) == pytest.approx(ts.overlapped_ms(f, b, rc, rb))


def test_no_contention_forward_order_hides_all_but_first_wait():
    units, params = two_layer_model()
    r = ts.simulate(units, params, ["pa", "pb"], flat_cal(), contention=False)
    # pa arrives at 1, a runs 1..3, pb arrived at 2, b runs 3..5.
    assert r.forward_end_ms == pytest.approx(5.0)
    assert r.exposed_ms == pytest.approx(1.0)
    assert r.wait_ms == {"a": pytest.approx(1.0)}


def test_reversed_order_waits_for_both():
    units, params = two_layer_model()
    r = ts.simulate(units, params, ["pb", "pa"], flat_cal(), contention=False)
    assert r.forward_end_ms == pytest.approx(6.0)


def test_overlap_off_is_all_broadcasts_then_forward():
    units, params = two_layer_model()
    r = ts.simulate(units, params, ["pb", "pa"], flat_cal(), overlap=False)
    assert r.forward_end_ms == pytest.approx(2.0 + 4.0)
    assert r.exposed_ms == pytest.approx(2.0)


def test_contention_slows_compute_while_comm_runs():
    units, params = two_layer_model()
    r = ts.simulate(units, params, ["pa", "pb"], flat_cal(rc=0.5), contention=True)
    # a starts at 1 with pb in flight until 2: 0.5 ms of work done, 1.5 left.
    assert r.forward_end_ms == pytest.approx(2.0 + 1.5 + 2.0)
    assert any(s.contended for s in r.segments)


def test_parameter_left_out_of_the_order_is_not_waited_for():
    # Frozen parameters are not broadcast, so no hook waits for them.
    units, params = two_layer_model()
    r = ts.simulate(units, params, ["pb"], flat_cal(), contention=False)
    assert r.wait_ms == {}
    assert r.forward_end_ms == pytest.approx(4.0)


def test_wait_for_a_broadcast_never_issued_is_an_error():
    with pytest.raises(ValueError, match="never issued"):
        ts._simulate_work([1.0], [{0, 1}], [ts.Unit("a", 1.0)], flat_cal(), contention=False)


def test_duplicate_or_unknown_order_entries_are_errors():
    units, params = two_layer_model()
    with pytest.raises(ValueError, match="twice"):
        ts.simulate(units, params, ["pa", "pa", "pb"], flat_cal())
    with pytest.raises(ValueError, match="unknown"):
        ts.simulate(units, params, ["pa", "pb", "zz"], flat_cal())


def test_broadcast_still_running_after_forward_counts_as_exposed():
    # One unit needs broadcast 0; broadcast 1 is still running when it ends.
    r = ts._simulate_work([1.0, 1.0], [{0}], [ts.Unit("a", 0.5)], flat_cal(), contention=False)
    assert r.forward_end_ms == pytest.approx(1.5)
    assert r.comm_end_ms == pytest.approx(2.0)
    assert r.exposed_ms == pytest.approx(1.5)


# -- orders and names --------------------------------------------------------
def test_upstream_order_is_stable_sort_by_name_integer():
    p = lambda n: ts.Param(n, 2, "u")  # noqa: E731
    params = [p("embedding_0.w_0"), p("linear_1.w_0"), p("linear_0.w_0"), p("llama_rms_norm_0.w_0"), p("llama_lm_head_0.w_0")]
    assert ts.upstream_order(params) == [
        "embedding_0.w_0",
        "linear_0.w_0",
        "llama_rms_norm_0.w_0",
        "llama_lm_head_0.w_0",
        "linear_1.w_0",
    ]


def test_upstream_order_falls_back_to_list_order_for_custom_names():
    params = ts.llama_params(ts.LlamaShape(layers=2), naming="custom")
    assert ts.upstream_order(params) == [p.name for p in params]


def test_llama_names_match_paddle_auto_naming():
    params = ts.llama_params(ts.LlamaShape(layers=2))
    names = [p.name for p in params]
    assert names[:3] == ["embedding_0.w_0", "linear_0.w_0", "linear_1.w_0"]
    assert names[8:10] == ["llama_rms_norm_0.w_0", "llama_rms_norm_1.w_0"]
    assert names[-2:] == ["llama_rms_norm_4.w_0", "llama_lm_head_0.w_0"]
    assert len(params) == 1 + 2 * 9 + 2


def test_upstream_sends_lm_head_fourth_for_llama_and_ours_last():
    cal = ts.Calibration.from_anchor(ANCHOR)
    params = ts.llama_params()
    units = ts.llama_units(cal, 4096)
    assert ts.upstream_order(params)[:4] == ["embedding_0.w_0", "linear_0.w_0", "llama_rms_norm_0.w_0", "llama_lm_head_0.w_0"]
    ours = ts.forward_order(units, params)
    assert ours[0] == "embedding_0.w_0" and ours[-1] == "llama_lm_head_0.w_0"
    assert ours[1] == "llama_rms_norm_0.w_0"  # layer 0's input norm runs before q


def test_forward_order_needs_minimal_bytes():
    cal = ts.Calibration.from_anchor(ANCHOR)
    for naming in ts.NAMINGS:
        params = ts.llama_params(ts.LlamaShape(layers=4), naming=naming)
        units = ts.llama_units(cal, 1024, ts.LlamaShape(layers=4))
        fwd = ts.bytes_needed_before(units, params, ts.forward_order(units, params))
        up = ts.bytes_needed_before(units, params, ts.upstream_order(params))
        # Forward order is a prefix order: each unit needs exactly the bytes
        # of the units up to and including it.
        assert list(fwd.values()) == sorted(fwd.values())
        assert fwd["lm_head"] == sum(p.nbytes for p in params)
        cum = 0
        for u in units:
            cum += sum(p.nbytes for p in params if p.unit == u.name)
            if u.name in fwd:
                assert fwd[u.name] == cum
        # Upstream's name order makes some layer wait for bytes it does not use.
        assert max(up[u] - fwd[u] for u in fwd) > 0, naming


def test_partition_matches_paddle_greedy_by_size():
    params = [ts.Param(f"p{i}", n, "u") for i, n in enumerate([2, 8, 4, 8, 2])]
    owners = {p.name: p.owner for p in ts.paddle_partition(params, 2)}
    # sorted by numel desc (stable): p1(4) p3(4) p2(2) p0(1) p4(1)
    assert owners == {"p1": 0, "p3": 1, "p2": 0, "p0": 1, "p4": 1}


def test_units_sum_to_measured_layer_time():
    cal = ts.Calibration.from_anchor(ANCHOR)
    for S in (1024, 4096):
        units = ts.llama_units(cal, S, ts.LlamaShape(layers=1))
        layer = sum(u.fwd_ms for u in units if u.name.startswith("L0."))
        assert layer == pytest.approx(ANCHOR[f"layer_fwd_ms_S{S}"])
    with pytest.raises(ValueError, match="S=2048"):
        ts.llama_units(cal, 2048)


# -- the report --------------------------------------------------------------
def test_step_report_orders_modes_sensibly():
    cal = ts.Calibration.from_anchor(ANCHOR)
    for S, d, m in [(4096, 2, 1), (1024, 8, 8)]:
        rep, sims, parts = ts.step_reports(cal, degree=d, micro_batches=m, tokens=S)
        assert rep["ideal"].exposed_ms <= rep["ours"].exposed_ms <= rep["off"].exposed_ms
        assert rep["ideal"].exposed_ms <= rep["upstream"].exposed_ms <= rep["off"].exposed_ms
        # Overlap off exposes exactly the serial broadcast time.
        assert rep["off"].exposed_ms == pytest.approx(parts["bcast_serial_ms"])
        assert 0 < rep["ours"].exposed_pct < 100


def test_main_prints_tables(capsys):
    assert ts.main([]) == 0
    out = capsys.readouterr().out
    assert "Table 1" in out and "Table 2" in out and "Table 3" in out and "+2.56%" in out


def test_run_as_a_script_the_model_loads_once():
    """``timeline_sim.py`` run as a script is ``__main__`` only: nothing it imports imports it
    again (``timeline_standin`` imports it, so the model never imports ``timeline_standin``)."""
    import subprocess

    code = ("import runpy, sys; sys.argv = ['timeline_sim.py']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('again' if 'timeline_sim' in sys.modules else 'once')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ts.HERE, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "once"


# -- buckets, calibrated on the torch stand-in (timeline_standin.py) ----------
@pytest.fixture(scope="module")
def stand_in_fit():
    cal = ts.Calibration.from_anchor(ANCHOR)
    points = tsi.load_points()
    fitted, worst = tsi.fit_stand_in(cal, points)
    return fitted, worst, points


def test_bucket_groups_reproduce_the_sweep_broadcast_counts():
    cal = ts.Calibration.from_anchor(ANCHOR)
    sweep = json.load(open(tsi.SWEEP))["runs"][0]["S1024"]
    units, params = tsi.stand_in_model(cal, 1024, 21.1)
    order = [p.name for p in params]
    for cap in (0, *tsi.CAPS_MB):
        groups = ts.bucket_groups(params, order, cap << 20)
        assert len(groups) == sweep[f"cap{cap}MB"]["broadcasts"], cap
        assert sorted(n for g in groups for n in g) == sorted(order)
        for g in groups:
            assert len({p.owner for p in params if p.name in g}) == 1


def test_per_parameter_groups_equal_simulate():
    cal = ts.Calibration.from_anchor(ANCHOR)
    units = ts.llama_units(cal, 1024)
    params = ts.llama_params(ts.LLAMA_7B, 2)
    order = ts.forward_order(units, params)
    a = ts.simulate(units, params, order, cal)
    b = ts.simulate_groups(units, params, [[n] for n in order], cal)
    assert a.exposed_ms == b.exposed_ms


def test_stand_in_fit_reproduces_every_32_layer_point_within_10_percent(stand_in_fit):
    fitted, worst, points = stand_in_fit
    assert len(points) == 20
    assert worst <= 0.10
    for p in points:
        model, _ = tsi.model_point(fitted, p)
        assert abs(tsi.distance(model, p["measured"])) <= 0.10, (p["tokens"], p["mode"], model, p["measured"])
    # the per-call costs are what makes buckets pay: without them the model
    # misses the stand-in's per-parameter vs bucket gap
    assert fitted.call_stall_ms > 0


def test_default_cap_beats_per_parameter_on_llama_7b(stand_in_fit):
    fitted = stand_in_fit[0]
    for S in (1024, 4096):
        units = ts.llama_units(fitted, S)
        params = ts.llama_params(ts.LLAMA_7B, 2)
        order = ts.forward_order(units, params)
        per = ts.simulate(units, params, order, fitted)
        groups = ts.bucket_groups(params, order, 256 << 20)
        assert len(groups) < len(params) / 3
        bucketed = ts.simulate_groups(units, params, groups, fitted)
        assert bucketed.exposed_ms < 0.85 * per.exposed_ms, S


def test_allgather_unit_uses_its_curve_and_hop_latency():
    cal = flat_cal(hop_ms=0.5).with_allgather({"allgather_ms_by_bytes": {"100": 1.0, "300": 3.0}})
    assert cal.allgather_ms_for(200) == pytest.approx(2.0)  # interpolated in whole-buffer bytes
    assert cal.allgather_ms_for(50) == pytest.approx(1.0)  # latency floor
    assert cal.allgather_ms_for(600) == pytest.approx(6.0)  # extrapolated by bandwidth
    assert cal.allgather_ms_for(200, ranks=8) == pytest.approx(2.0 + 6 * 0.5)
    anchor = dict(ANCHOR, allgather_ms_by_bytes={"1024": 0.25})
    assert ts.Calibration.from_anchor(anchor).allgather_ms == (0.25,)


def test_allgather_without_curve_is_a_broadcast_of_the_received_share():
    cal = ts.Calibration.from_anchor()
    assert cal.allgather_bytes == ()
    assert cal.allgather_ms_for(8 << 20, ranks=2) == cal.bcast_ms_for(4 << 20, 2, pipelined=False)


def test_allgather_groups_wait_like_buffers_and_keep_launch_depth():
    # two comm buffers of 2 parameters; unit a needs buffer 0, unit b buffer 1
    cal = flat_cal().with_allgather({"allgather_ms_by_bytes": {"1": 1.0, "2": 2.0}})
    units = [ts.Unit("a", 1.0), ts.Unit("b", 1.0)]
    params = [ts.Param("p0", 1, "a"), ts.Param("p1", 1, "a"), ts.Param("p2", 1, "b"), ts.Param("p3", 1, "b")]
    groups = [["p0", "p1"], ["p2", "p3"]]
    kw = dict(contention=False, collective="all_gather")
    off = ts.simulate_groups(units, params, groups, cal, overlap=False, **kw)
    assert off.forward_end_ms == pytest.approx(2.0 + 2.0 + 2.0)  # both gathers (2 ms each), then the forward
    all_at_step = ts.simulate_groups(units, params, groups, cal, **kw)
    assert all_at_step.forward_end_ms == pytest.approx(2.0 + 2.0 + 1.0)  # b waits for the second gather
    chain = ts.simulate_groups(units, params, groups, cal, depth=1, **kw)
    assert chain.forward_end_ms == pytest.approx(all_at_step.forward_end_ms)
    with pytest.raises(ValueError, match="collective"):
        ts.simulate_groups(units, params, groups, cal, collective="reduce")
