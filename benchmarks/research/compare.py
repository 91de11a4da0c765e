"""``timeline_sim.py`` against the stand-in measurements (pure Python, CPU).

**Model vs torch stand-in; nothing here is a measurement of Paddle.**

* One-GPU proxy (``data/standin_onegpu_proxy.json``, written by the torch
  script ``onegpu_proxy.py``, removed after 07348d7): for each copy engine the model is calibrated from
  the proxy's own anchor fields (copy time by size, one layer's forward,
  that layer overlapped with the next layer's copies: the same fit
  ``timeline_sim.Calibration.from_anchor`` makes from ``h200_anchor.json``),
  the forward's units are scaled to the measured forward alone, and every
  measured configuration (V1 per parameter and the product's exact bucket
  plan, V2 256 MB buffers; off, all at the step, 1/2/4 in flight) is
  simulated with the same groups, bytes and launch depth.
* Two-GPU NCCL stand-ins: never run (no machine with two GPUs was lent;
  the scripts were removed after 07348d7); the model's predictions for
  them are printed, marked not run.

``chainK`` schedules (launches chained from the pre-hooks, K in flight)
model upstream V2 and the product's former launch depth, which the product
removed: the product starts every unit in ``step()`` (``all_at_step``).

    .venv-test/paddle-3.3.1/bin/python benchmarks/research/compare.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import standin_plan as P  # noqa: E402
import timeline_sim as ts  # noqa: E402
import timeline_standin as tsi  # noqa: E402

DATA = os.path.join(HERE, "data")
PROXY = os.path.join(DATA, "standin_onegpu_proxy.json")


def model_params(plan: Mapping) -> List[ts.Param]:
    return [ts.Param(str(i), P.param_bytes(p), p["unit"], p["owner"]) for i, p in enumerate(plan["params"])]


def groups_for(plan: Mapping, config: str) -> Tuple[List[List[int]], List[int]]:
    """(groups, bytes each collective moves per rank) for a config name as
    ``onegpu_proxy.py`` and the NCCL scripts name them."""
    if config == "v1_per_parameter":
        g = P.v1_groups(plan, "per_parameter")
        return g, P.group_bytes(P.layout(plan, g))
    if config.startswith("v1_buckets"):
        g = P.v1_groups(plan, "buckets")
        return g, P.group_bytes(P.layout(plan, g))
    if config.startswith("v2_256MB"):
        d = plan["degree"]
        g = P.v2_groups(plan, 256)
        full = P.group_bytes(P.layout(plan, g, pad_multiple=d * 128))
        return g, [b * (d - 1) // d for b in full]
    raise ValueError(config)


def predict(cal: ts.Calibration, plan: Mapping, config: str, tokens: int, schedule: str,
            fwd_ms: Optional[float] = None, ranks: int = 2) -> float:
    """Modelled exposed ms of one configuration."""
    units = ts.llama_units(cal, tokens)
    if fwd_ms is not None:
        scale = fwd_ms / sum(u.fwd_ms for u in units)
        units = [ts.Unit(u.name, u.fwd_ms * scale) for u in units]
    params = model_params(plan)
    groups, nbytes = groups_for(plan, config)
    names = [[str(i) for i in g] for g in groups]
    depth = int(schedule[len("chain"):]) if schedule.startswith("chain") else None
    sim = ts.simulate_groups(units, params, names, cal, ranks=ranks, overlap=schedule != "off",
                             depth=depth, comm_bytes=nbytes)
    return sim.exposed_ms


def measured_range(row: Mapping, fwd_ms: float) -> Tuple[float, float, float]:
    """(median, low, high) exposed ms; low/high from the spread of the timed
    boundaries (25th/75th percentile) minus the forward alone's median."""
    v = sorted(row["ms_all"])
    q = lambda f: v[min(len(v) - 1, max(0, round(f * (len(v) - 1))))]
    return row["exposed_ms"], q(0.25) - fwd_ms, q(0.75) - fwd_ms


def distance(model: float, lo: float, hi: float, floor: float = 1.0) -> float:
    """Relative distance of ``model`` from [lo, hi], relative to the range's
    nearer end but never to less than ``floor`` ms (a 0.5 ms exposure is not
    "off by 100%" when the model says 1 ms)."""
    if model < lo:
        return (model - lo) / max(lo, floor)
    if model > hi:
        return (model - hi) / max(hi, floor)
    return 0.0


def proxy_calibration(anchor: Mapping, host_launch_ms: float = 0.0) -> ts.Calibration:
    from dataclasses import replace

    return replace(ts.Calibration.from_anchor(dict(anchor), hop_us=0.0), host_launch_ms=host_launch_ms)


def proxy_points(proxy: Mapping) -> List[dict]:
    """Every measured proxy configuration, one dict each."""
    plans, out = {}, []
    for config in proxy["configs"]:
        degree = int(config.rsplit("_s", 1)[1]) if "_s" in config else 2
        plan = plans.setdefault(degree, P.load_plan(degree))
        n = len(groups_for(plan, config)[0])
        for skey, row in proxy[config].items():
            fwd = row["fwd_alone"]["ms"]
            for key, m in row.items():
                if key == "fwd_alone":
                    continue
                engine, schedule = key.split("_", 1)
                med, lo, hi = measured_range(m, fwd)
                out.append(dict(config=config, plan=plan, tokens=int(skey[1:]), engine=engine, schedule=schedule,
                                groups=n, fwd=fwd, med=med, lo=min(lo, med), hi=max(hi, med),
                                host_ms=m["host_issue_ms"]))
    return out


def host_launch_ms(points: Sequence[Mapping], pt: Mapping) -> float:
    """Measured host time per launch for ``pt``: the host issue time of the
    same configuration's all-at-step boundary / its collectives (chains
    issue from the pre-hooks, where the host time is not separable)."""
    for p in points:
        if (p["config"], p["tokens"], p["engine"], p["schedule"]) == (pt["config"], pt["tokens"], pt["engine"],
                                                                      "all_at_step"):
            return p["host_ms"] / p["groups"]
    return 0.0


def proxy_rows(proxy: Mapping) -> Tuple[List[list], Dict[str, ts.Calibration]]:
    from dataclasses import replace

    points = proxy_points(proxy)
    cals = {k[len("anchor_"):]: proxy_calibration(v) for k, v in proxy.items() if k.startswith("anchor_")}
    rows = []
    for p in points:
        cal = cals[p["engine"]]
        a = predict(cal, p["plan"], p["config"], p["tokens"], p["schedule"], fwd_ms=p["fwd"])
        h = host_launch_ms(points, p)
        b = predict(replace(cal, host_launch_ms=h), p["plan"], p["config"], p["tokens"], p["schedule"],
                    fwd_ms=p["fwd"])
        rows.append([p["config"], p["tokens"], p["engine"], p["schedule"], p["groups"], f"{p['fwd']:.1f}",
                     f"{p['med']:.1f}", f"{p['lo']:.1f}-{p['hi']:.1f}",
                     f"{a:.1f}", f"{100 * distance(a, p['lo'], p['hi']):+.0f}%",
                     f"{1000 * h:.0f}", f"{b:.1f}", f"{100 * distance(b, p['lo'], p['hi']):+.0f}%"])
    return rows, cals


PROXY_HEADER = ["config", "S", "engine", "schedule", "collectives", "fwd alone ms", "measured exposed ms",
                "IQR ms", "model ms", "off by", "host us/launch", "model + host ms", "off by"]


def standin_calibration() -> ts.Calibration:
    cal = ts.Calibration.from_anchor()
    fitted, _ = tsi.fit_stand_in(cal, tsi.load_points())
    return fitted


def nccl_prediction_rows(cal: ts.Calibration, tokens=(1024, 4096)) -> List[list]:
    """Predictions for the two-GPU NCCL stand-ins (stand-in calibration of
    ``timeline_standin.py``), which never ran."""
    rows = []
    plan = P.load_plan(2)
    fwd = {S: tsi.load_points()[0 if S == 1024 else 10]["fwd_ms"] for S in tokens}
    for config, schedules in (("v1_per_parameter", ("off", "all_at_step")),
                              ("v1_buckets_s2", ("off", "all_at_step", "chain1", "chain2", "chain4")),
                              ("v2_256MB_s2", ("off", "all_at_step", "chain1", "chain2", "chain4"))):
        for S in tokens:
            for sched in schedules:
                model = predict(cal, plan, config, S, sched, fwd_ms=fwd[S])
                rows.append([config, S, sched, f"{model:.1f}", "not run", "no 2-GPU kind lent"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy", default=PROXY)
    args = ap.parse_args(argv)
    if os.path.exists(args.proxy):
        with open(args.proxy) as f:
            proxy = json.load(f)
        rows, cals = proxy_rows(proxy)
        print(f"One-GPU proxy ({proxy['gpu_name']}, {proxy['gpus']} GPU, torch {proxy['torch']}, "
              f"NCCL {proxy['nccl']} unused: copies stand in for collectives; {proxy['date']}):")
        for e, c in cals.items():
            print(f"  {e}: one-layer fit rc={c.rc:.3f} rb={c.rb:.2f}, latency hidden per back-to-back copy "
                  f"{1000 * c.pipelined_saving_ms:.1f} us")
        print(ts.format_table(rows, PROXY_HEADER))
        for col, name in ((9, "model"), (12, "model + measured host time")):
            within = sum(1 for r in rows if abs(float(r[col].rstrip("%"))) <= 10)
            print(f"  {name}: {within} of {len(rows)} configurations within 10% of the measured IQR")
            kept = [r for r in rows if not r[3].startswith("chain")]
            within = sum(1 for r in kept if abs(float(r[col].rstrip("%"))) <= 10)
            print(f"  {name}, off and all-at-step schedules only (no chained launches): {within} of {len(kept)}")
        print()
    print("Two-GPU NCCL stand-in configurations, model with the stand-in calibration (timeline_standin.py); "
          "V2 all-gathers assumed to cost a broadcast of the bytes each rank receives (no all-gather anchor "
          "measured yet); the MoE all-to-all is not modelled:")
    print(ts.format_table(nccl_prediction_rows(standin_calibration()),
                          ["config", "S", "schedule", "model exposed ms", "measured exposed ms", "source"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
