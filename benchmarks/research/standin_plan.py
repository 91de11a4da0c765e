"""The dumped bucket plan, the V2 comm buffers and their storage layout, as
the timeline model's comparison (``compare.py``) reads them.

No torch, no Paddle: ``test_standin_plan.py`` tests it on the CPU. (The
torch stand-ins that replayed the plan on a GPU, and the launch-depth policy
they shared, were removed: see the research README.)

The plan files (``data/llama7b_plan_s{2,8}.json``) are written by
``dump_plan.py`` from the product's own CPU planner; their format is
described in that script's docstring.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


def plan_path(degree: int) -> str:
    return os.path.join(DATA, f"llama7b_plan_s{degree}.json")


def load_plan(path_or_degree) -> dict:
    """The plan dict from a path or a sharding degree (2 or 8)."""
    path = plan_path(path_or_degree) if isinstance(path_or_degree, int) else path_or_degree
    with open(path) as f:
        plan = json.load(f)
    check_plan(plan)
    return plan


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def param_bytes(p: Mapping) -> int:
    return numel(p["shape"]) * ITEMSIZE[p["dtype"]]


def check_plan(plan: Mapping) -> None:
    """Raise ValueError unless the plan is self-consistent: the order is a
    permutation, every parameter is in exactly one bucket, each bucket has
    one owner and one dtype, and its slots fit its length."""
    n = len(plan["params"])
    if sorted(plan["order"]) != list(range(n)):
        raise ValueError("plan order is not a permutation of the parameters")
    seen = []
    for b in plan["buckets"]:
        for i, off, ne in zip(b["indices"], b["offsets"], b["numels"]):
            p = plan["params"][i]
            if p["owner"] != b["src"] or p["dtype"] != b["dtype"]:
                raise ValueError(f"bucket {b['indices'][:3]}... mixes owners or dtypes")
            if ne != numel(p["shape"]) or off + ne > b["length"]:
                raise ValueError(f"parameter {i} does not fit its bucket slot")
            seen.append(i)
    if sorted(seen) != list(range(n)):
        raise ValueError("not every parameter is in exactly one bucket")


def units_in_order(plan: Mapping) -> List[str]:
    """Units (leaf layers) that own parameters, in forward order."""
    out: List[str] = []
    for i in plan["order"]:
        u = plan["params"][i]["unit"]
        if u not in out:
            out.append(u)
    return out


# --------------------------------------------------------------------------
# Groups: what one collective delivers (lists of parameter positions)
# --------------------------------------------------------------------------
def v1_groups(plan: Mapping, mode: str) -> List[List[int]]:
    """``buckets``: the plan's buckets, in launch order; ``per_parameter``:
    one group per parameter in the agreed (forward) order
    (``bucket_size_mb=0``)."""
    if mode == "buckets":
        return [list(b["indices"]) for b in plan["buckets"]]
    if mode == "per_parameter":
        return [[i] for i in plan["order"]]
    raise ValueError(f"unknown V1 mode {mode!r}")


def v2_groups(plan: Mapping, cap_mb: float = 256, norms: str = "bf16") -> List[List[int]]:
    """Paddle-sized V2 comm buffers: the parameter list in its own order
    (``model.parameters()``), a buffer closed once it holds at least
    ``cap_mb`` MB (``sharding_configs.comm_buffer_size_MB``, default 256).

    ``norms="fp32_last"``: the 1-D norm weights are kept in float32 and go
    to a buffer of their own after every bf16 buffer (what AMP O2 with fp32
    norms gives: one buffer per dtype, the fp32 one last in the launch
    order). ``"bf16"``: every parameter bf16.
    """
    if norms not in ("bf16", "fp32_last"):
        raise ValueError("norms must be 'bf16' or 'fp32_last'")
    cap = int(cap_mb * (1 << 20))
    main, tail = [], []
    for i, p in enumerate(plan["params"]):
        (tail if norms == "fp32_last" and len(p["shape"]) == 1 else main).append(i)
    groups: List[List[int]] = []
    cur, size = [], 0
    for i in main:
        cur.append(i)
        size += param_bytes(plan["params"][i])
        if size >= cap:
            groups.append(cur)
            cur, size = [], 0
    if cur:
        groups.append(cur)
    if tail:
        groups.append(tail)
    return groups


def group_dtype(plan: Mapping, group: Sequence[int], norms: str = "bf16") -> str:
    if norms == "fp32_last" and all(len(plan["params"][i]["shape"]) == 1 for i in group):
        return "float32"
    return plan["params"][group[0]]["dtype"]


def layout(plan: Mapping, groups: Sequence[Sequence[int]], *, align_bytes: int = 256,
           pad_multiple: int = 1, dtypes: Optional[Sequence[str]] = None) -> List[dict]:
    """Per group: ``length`` (elements, padding included, a multiple of
    ``pad_multiple`` so an all-gather splits it evenly), ``dtype`` and
    ``slots`` [(param position, element offset, numel)]. Each slot starts at
    a multiple of ``align_bytes``, as ``plan_buckets`` places them."""
    out = []
    for gi, g in enumerate(groups):
        dtype = dtypes[gi] if dtypes else plan["params"][g[0]]["dtype"]
        unit = max(align_bytes // ITEMSIZE[dtype], 1)
        slots, fill = [], 0
        for i in g:
            ne = numel(plan["params"][i]["shape"])
            slots.append((i, fill, ne))
            fill += -(-ne // unit) * unit
        if len(g) == 1 and pad_multiple == 1:
            fill = slots[0][2]  # a parameter on its own: its own allocation, no padding
        fill = -(-fill // pad_multiple) * pad_multiple
        out.append({"length": fill, "dtype": dtype, "slots": slots})
    return out


def group_bytes(lay: Sequence[Mapping]) -> List[int]:
    return [g["length"] * ITEMSIZE[g["dtype"]] for g in lay]


def unit_needs(plan: Mapping, groups: Sequence[Sequence[int]]) -> Dict[str, List[int]]:
    """Unit name -> sorted group indices holding one of its parameters."""
    where = {i: gi for gi, g in enumerate(groups) for i in g}
    needs: Dict[str, set] = {}
    for i, p in enumerate(plan["params"]):
        needs.setdefault(p["unit"], set()).add(where[i])
    return {u: sorted(s) for u, s in needs.items()}
