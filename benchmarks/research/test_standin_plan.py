"""Tests of the stand-ins' pure-Python side (no torch, no GPU): the dumped
plan, its layout, and the timeline model's launch depth and host issue time."""

import collections
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

import standin_plan as P  # noqa: E402
import timeline_sim as ts  # noqa: E402


@pytest.fixture(scope="module", params=[2, 8])
def plan(request):
    return P.load_plan(request.param)


def test_plan_is_the_forward_order_and_every_bucket_one_owner(plan):
    assert len(plan["params"]) == 291
    assert {2: 87, 8: 223}[plan["degree"]] == len(plan["buckets"])
    units = P.units_in_order(plan)
    assert units[0] == "embed" and units[1] == "L0.norm1" and units[-1] == "lm_head"
    for b in plan["buckets"]:
        assert len({plan["params"][i]["owner"] for i in b["indices"]}) == 1


def test_plan_files_match_the_products_planner_when_paddle_is_there(tmp_path):
    pytest.importorskip("paddle")
    import dump_plan

    for degree in (2, 8):
        fresh = dump_plan.dump(degree, None, str(tmp_path))
        kept = P.load_plan(degree)
        assert fresh["buckets"] == kept["buckets"], "plan JSON is stale: rerun benchmarks/research/dump_plan.py"
        assert fresh["order"] == kept["order"] and fresh["params"] == kept["params"]


def test_layout_places_slots_where_the_planner_does(plan):
    groups = P.v1_groups(plan, "buckets")
    for b, g in zip(plan["buckets"], P.layout(plan, groups)):
        assert [o for _, o, _ in g["slots"]] == b["offsets"] and g["length"] == b["length"]
    per = P.layout(plan, P.v1_groups(plan, "per_parameter"))
    assert sum(P.group_bytes(per)) == sum(P.param_bytes(p) for p in plan["params"])


def test_v2_buffers_close_at_the_cap_and_split_evenly(plan):
    d = plan["degree"]
    groups = P.v2_groups(plan, 256)
    assert sorted(i for g in groups for i in g) == list(range(291))
    sizes = [sum(P.param_bytes(plan["params"][i]) for i in g) for g in groups]
    assert all(s >= 256 << 20 for s in sizes[:-1])
    lay = P.layout(plan, groups, pad_multiple=d * 128)
    assert all(g["length"] % d == 0 for g in lay)
    tail = P.v2_groups(plan, 256, norms="fp32_last")[-1]
    assert all(len(plan["params"][i]["shape"]) == 1 for i in tail) and len(tail) == 65


def _toy():
    cal = ts.Calibration((1, 10**9), (1.0, 1.0), 0.0, 1.0, 1.0, {1: 1.0}, 1.0)
    units = [ts.Unit("a", 2.0), ts.Unit("b", 2.0), ts.Unit("c", 2.0)]
    params = [ts.Param("pa", 1, "a"), ts.Param("pb", 1, "b"), ts.Param("pc", 1, "c")]
    return cal, units, params, [["pa"], ["pb"], ["pc"]]


def test_depth_none_and_depth_at_least_all_groups_agree():
    cal, units, params, groups = _toy()
    a = ts.simulate_groups(units, params, groups, cal, contention=False)
    b = ts.simulate_groups(units, params, groups, cal, contention=False, depth=3)
    assert a.forward_end_ms == pytest.approx(b.forward_end_ms) == pytest.approx(7.0)


def test_depth_one_starts_a_collective_only_when_its_hook_runs():
    cal, units, params, groups = _toy()
    r = ts.simulate_groups(units, params, groups, cal, contention=False, depth=1)
    # pa 0..1 then a 1..3; pb launched at a's hook (t=1) runs 1..2; pc launched at b's hook (t=3) runs 3..4
    comm = [(s.label, s.start, s.end) for s in r.segments if s.stream == "comm"]
    assert comm == [("pa", 0.0, 1.0), ("pb", 1.0, 2.0), ("pc", 3.0, 4.0)]
    assert r.forward_end_ms == pytest.approx(7.0)


def test_host_issue_time_delays_the_collectives_and_the_forward():
    from dataclasses import replace

    cal, units, params, groups = _toy()
    r = ts.simulate_groups(units, params, groups, replace(cal, host_launch_ms=0.5), contention=False)
    comm = [(s.label, s.start) for s in r.segments if s.stream == "comm"]
    assert comm == [("pa", 0.5), ("pb", 1.5), ("pc", 2.5)]
    assert r.wait_ms["a"] == pytest.approx(1.5)  # the forward is issued after the 3 launches, pa ends at 1.5
    assert r.forward_end_ms == pytest.approx(7.5)


def test_proxy_results_record_what_ran():
    with open(os.path.join(HERE, "data", "standin_onegpu_proxy.json")) as f:
        d = json.load(f)
    assert d["gpus"] == 1 and d["nccl"] and d["torch"] and d["date"] and not d["quick"]
    assert "NOT Paddle" in d["label"]
    counts = collections.Counter(k.split("_", 1)[1] for k in d["v1_buckets_s2"]["S1024"] if k != "fwd_alone")
    assert counts == {"off": 2, "all_at_step": 2, "chain1": 2, "chain2": 2, "chain4": 2}
