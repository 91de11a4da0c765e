"""Dump the product's V1 broadcast-bucket plan for LLaMA-7B-shaped parameters.

Runs on the CPU with Paddle and this package installed (no kernels, no
communication): builds the 291 parameters of a PaddleNLP-style LLaMA-7B
(embedding, 32 decoder layers, final norm, LM head; bf16; Paddle's shapes,
``Linear`` weights ``[in, out]``) in ``model.parameters()`` order, gives each
its owner by Paddle's V1 partition (``DygraphShardingOptimizer.
_partition_parameters``: by numel, largest first, to the least-loaded rank;
``timeline_sim.paddle_partition``), puts them in forward
first-use order (the order the product agrees on) and calls the product's
planner (``plan_buckets`` in ``paddle_overlay/.../broadcast_buckets.py``)
with the default cap. The result is what the product broadcasts each step.

    .venv-test/paddle-3.3.1/bin/python benchmarks/research/dump_plan.py      # writes both files

Output, ``benchmarks/research/data/llama7b_plan_s{degree}.json``:

* ``params``: in parameter-list order, each ``{name, shape, dtype, owner,
  unit}`` (``unit``: the leaf layer that first uses it, named as in
  ``timeline_sim.llama_units``);
* ``order``: the agreed broadcast order, positions in ``params``;
* ``buckets``: the planner's ``BucketSpec`` fields, in launch order
  (``window, src, dtype, indices, offsets, numels, length``) plus ``bytes``;
* ``bucket_size_mb``, ``degree``, where it came from and when.

The stand-ins (``v1_plan_replay.py``, ``launch_depth.py``,
``onegpu_proxy.py``) replay exactly these buckets.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import timeline_sim as ts  # noqa: E402

PACKAGE = "paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer"
Fake = collections.namedtuple("Fake", ["shape", "dtype", "stop_gradient"])


def find_planner():
    """(plan function, default cap MB, module name). Looks first where the
    planner lives today, then in every module of the package, so a rename
    of the module does not break the dump."""
    names = [f"{PACKAGE}.broadcast_buckets"]
    try:
        pkg = importlib.import_module(PACKAGE)
        names += [f"{PACKAGE}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    except ImportError:
        pass
    for name in names:
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that needs a newer Paddle is simply skipped
            continue
        fn = getattr(mod, "plan_buckets", None)
        if callable(fn):
            cap = getattr(mod, "DEFAULT_BUCKET_SIZE_MB", None)
            if cap is None:
                cap = getattr(importlib.import_module(f"{PACKAGE}.broadcast_overlap"), "DEFAULT_BUCKET_SIZE_MB", 256)
            return fn, cap, name
    raise SystemExit("dump_plan: no plan_buckets() found in " + PACKAGE)


def llama7b_params(degree):
    """(records, forward order) for LLaMA-7B at ``degree``."""
    shape = ts.LLAMA_7B
    H, I, V = shape.hidden, shape.ffn, shape.vocab
    shapes = {"embed": [V, H], "q": [H, H], "k": [H, H], "v": [H, H], "o": [H, H],
              "gate": [H, I], "up": [H, I], "down": [I, H], "norm1": [H], "norm2": [H],
              "final_norm": [H], "lm_head": [H, V]}
    params = ts.llama_params(shape, degree)
    recs = []
    for p in params:
        kind = p.unit.split(".")[-1]
        rec = {"name": p.name, "shape": shapes[kind], "dtype": "bfloat16", "owner": p.owner, "unit": p.unit}
        n = 1
        for d in rec["shape"]:
            n *= d
        assert n * 2 == p.nbytes, p
        recs.append(rec)
    units = ts.llama_units(ts.Calibration.from_anchor(), 4096)
    pos = {u.name: i for i, u in enumerate(units)}
    order = sorted(range(len(params)), key=lambda i: pos[params[i].unit])  # stable: list order inside a unit
    return recs, order


def git_head():
    try:
        return subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def dump(degree, cap_mb, out_dir):
    fn, default_cap, where = find_planner()
    cap_mb = default_cap if cap_mb is None else cap_mb
    recs, order = llama7b_params(degree)
    fakes = [Fake(tuple(r["shape"]), r["dtype"], False) for r in recs]
    kwargs = {}
    if "alone" in inspect.signature(fn).parameters:
        kwargs["alone"] = ()
    specs = fn(order, fakes, [r["owner"] for r in recs], int(cap_mb * (1 << 20)), **kwargs)
    buckets = []
    for s in specs:
        get = (lambda k: getattr(s, k)) if hasattr(s, "indices") else (lambda k: s[k])
        b = {k: get(k) for k in ("window", "src", "dtype", "indices", "offsets", "numels", "length")}
        b = {k: (list(v) if isinstance(v, tuple) else v) for k, v in b.items()}
        b["bytes"] = b["length"] * 2
        buckets.append(b)
    try:
        import paddle

        paddle_version = paddle.__version__
    except ImportError:
        paddle_version = None
    out = {
        "what": f"The product's V1 broadcast-bucket plan for LLaMA-7B (bf16, 291 parameters) at sharding {degree}, "
                f"bucket_size_mb={cap_mb}, forward order; computed on the CPU, no kernels run.",
        "generated_by": "benchmarks/research/dump_plan.py",
        "planner": f"{where}.{fn.__name__}",
        "commit": git_head(),
        "paddle": paddle_version,
        "date": datetime.date.today().isoformat(),
        "degree": degree,
        "bucket_size_mb": cap_mb,
        "params": recs,
        "order": order,
        "buckets": buckets,
    }
    path = os.path.join(out_dir, f"llama7b_plan_s{degree}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    per_owner = collections.Counter(b["src"] for b in buckets)
    print(f"{path}: {len(recs)} parameters, {len(buckets)} buckets (per owner {dict(sorted(per_owner.items()))}), "
          f"largest {max(b['bytes'] for b in buckets) / 2**20:.0f} MiB, planner {where}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--degrees", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--bucket-size-mb", type=float, default=None, help="default: the product's default")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "data"))
    args = ap.parse_args(argv)
    for d in args.degrees:
        dump(d, args.bucket_size_mb, args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
