"""Timeline simulator: sharding stage-1 parameter broadcast overlapped with forward.

Predicts, for one training step, how long the first micro-batch's forward
takes when the post-update parameter broadcasts of DygraphShardingOptimizer
(stage 1, V1) run

* ``off``      - before the forward (every broadcast is waited for first);
* ``upstream`` - overlapped, issued in Paddle's built-in order (PR #63945:
                 sorted by the integer in the parameter name);
* ``ours``     - overlapped, issued in forward first-use order
                 (what ``paddle_overlay`` does);
* ``ideal``    - forward first-use order and no contention between the two
                 streams: each layer waits only for its own bytes and the
                 link is always busy.

It is a model, not a measurement. Every hardware number comes from
``data/h200_anchor.json`` (2x H200, NVLink, NCCL 2.28.9, measured with
PyTorch; the one-GPU copy proxy's results, ``data/standin_onegpu_proxy.json``,
carry the same fields):

* broadcast time by message size, interpolated piecewise-linearly in bytes;
  back-to-back broadcasts on one stream hide part of each launch latency,
  fitted so that the per-parameter broadcast of one decoder layer matches
  ``layer_bcast_ms_per_param`` exactly;
* forward time of one LLaMA-7B decoder layer at S = 1024 and 4096 tokens,
  split into its leaf layers (memory-bound pieces by bytes at the measured
  copy bandwidth, the rest by FLOPs);
* two-stream contention: while a broadcast and a forward kernel are both in
  flight, compute progresses at rate ``rc`` and communication at rate ``rb``
  (1 = full speed).  The anchor's overlapped-vs-serial measurements at both
  sequence lengths fix ``(1 - rc) / rb``; the default takes ``rb = 1``
  (NCCL keeps its speed, the GEMMs lose SMs and memory bandwidth).  Any pair
  in the family that fits both anchor points gives the same answer within a
  few tenths of a millisecond (``--contention-rb`` shows it).

What is *not* measured and is an explicit assumption, printed with the
tables: sharding degree 8 uses the 2-GPU bandwidth curve plus a per-hop ring
latency (``--hop-us``, default 3 us per extra rank and call); backward costs
``--bwd-factor`` (2.0) times forward; gradient reduce (V1 reduces each
gradient synchronously, fp32 main grads) costs what a broadcast of the same
bytes costs; the AdamW update moves 30 bytes per owned parameter at the
measured copy bandwidth.  These only set the step-time denominator.

Broadcast buckets (one broadcast per group of parameters living in one
buffer, :func:`simulate_groups`) and two per-call costs of overlapping
(``call_stall_ms``, ``call_gap_ms``, zero in the anchor calibration) are
fitted on the torch stand-in's bucket measurements in
``timeline_standin.py`` (which imports this module; run it for Tables S1
and S2).

Run ``python benchmarks/research/timeline_sim.py`` for the tables and
``--plot docs/img`` to draw the timelines (needs matplotlib).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ANCHOR = os.path.join(HERE, "data", "h200_anchor.json")
DEFAULT_CHANNELS = os.path.join(HERE, "data", "h200_nccl_channels.json")

# Tolerance for "this piece of work is finished" in milliseconds.
_EPS = 1e-12


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One parameter as the sharding optimizer sees it."""

    name: str  # Paddle name, e.g. "linear_3.w_0"; upstream orders by it
    nbytes: int  # bytes broadcast each step
    unit: str  # the compute unit (leaf layer) that first uses it
    owner: int = 0  # sharding rank that updates it and broadcasts it

    @property
    def numel(self) -> int:
        return self.nbytes // 2  # bf16 parameters


@dataclass(frozen=True)
class Unit:
    """A piece of forward compute, in forward order.

    Units that own parameters are leaf layers (a forward pre-hook waits for
    their parameters before they start); units without parameters (attention
    core, activation) just run.
    """

    name: str
    fwd_ms: float


# --------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    bcast_bytes: Tuple[int, ...]  # anchor message sizes, ascending
    bcast_ms: Tuple[float, ...]  # measured broadcast time for each size
    pipelined_saving_ms: float  # latency hidden per back-to-back broadcast
    rc: float  # compute rate while a broadcast is in flight
    rb: float  # broadcast rate while compute is in flight
    layer_fwd_ms: Mapping[int, float]  # tokens -> one decoder layer forward
    copy_gbps: float  # device copy bandwidth, read + write bytes per second
    hop_ms: float = 0.003  # ring latency per extra rank per call (assumed)
    source: str = ""
    # Per-call costs of overlapping, 0 unless fitted on the stand-in
    # (timeline_standin.py): each broadcast that starts while a forward
    # unit runs stalls that unit by call_stall_ms and itself by call_gap_ms.
    call_stall_ms: float = 0.0
    call_gap_ms: float = 0.0
    # Host time to issue one collective (0: the host is never the limit).
    # The stand-ins time each boundary from an idle GPU, so the host's
    # issue of the boundary's launches shows: the k-th collective cannot
    # start before k * host_launch_ms, nor the forward before all of them.
    host_launch_ms: float = 0.0
    # V2's unit, the all-gather of one comm buffer: measured time by the
    # bytes of the whole gathered buffer (an anchor's ``allgather_ms_by_bytes``;
    # never measured: the two-GPU stand-in did not run); empty: see
    # :meth:`allgather_ms_for`.
    allgather_bytes: Tuple[int, ...] = ()
    allgather_ms: Tuple[float, ...] = ()

    # -- loading / fitting -------------------------------------------------
    @classmethod
    def from_anchor(
        cls,
        anchor: Mapping | str = DEFAULT_ANCHOR,
        *,
        rb: Optional[float] = None,
        hop_us: float = 3.0,
        copy_gbps: Optional[float] = None,
    ) -> "Calibration":
        """Build from an ``h200_anchor.json``-style dict or path.

        ``rb=None`` fits both contention rates to the anchor's overlapped
        measurements; a number fixes ``rb`` and fits ``rc`` only.
        ``copy_gbps`` fills in for anchors that lack ``d2d_copy_GBps``
        (the per-channel files).
        """
        src = anchor if isinstance(anchor, str) else "<dict>"
        if isinstance(anchor, str):
            with open(anchor) as f:
                anchor = json.load(f)
        pts = sorted((int(k), float(v)) for k, v in anchor["broadcast_ms_by_bytes"].items())
        base = cls(
            bcast_bytes=tuple(p[0] for p in pts),
            bcast_ms=tuple(p[1] for p in pts),
            pipelined_saving_ms=0.0,
            rc=1.0,
            rb=1.0,
            layer_fwd_ms={
                int(k.rsplit("S", 1)[1]): float(v)
                for k, v in anchor.items()
                if k.startswith("layer_fwd_ms_S")
            },
            copy_gbps=float(anchor.get("d2d_copy_GBps", copy_gbps or 0.0)),
            hop_ms=hop_us / 1000.0,
            source=src,
        )
        if base.copy_gbps <= 0:
            raise ValueError("anchor has no d2d_copy_GBps; pass copy_gbps=")
        saving = fit_pipelined_saving(base, anchor)
        rc, rb, _ = fit_contention(anchor, rb=rb)
        cal = replace(base, pipelined_saving_ms=saving, rc=rc, rb=rb)
        return cal.with_allgather(anchor) if "allgather_ms_by_bytes" in anchor else cal

    def with_allgather(self, anchor: Mapping | str) -> "Calibration":
        """This calibration with the all-gather curve of ``anchor`` (a dict
        or path with ``allgather_ms_by_bytes``: whole-buffer bytes -> ms;
        no such file was ever measured)."""
        if isinstance(anchor, str):
            with open(anchor) as f:
                anchor = json.load(f)
        pts = sorted((int(k), float(v)) for k, v in anchor["allgather_ms_by_bytes"].items())
        if not pts:
            raise ValueError("allgather_ms_by_bytes is empty")
        return replace(self, allgather_bytes=tuple(p[0] for p in pts), allgather_ms=tuple(p[1] for p in pts))

    # -- model -------------------------------------------------------------
    def isolated_bcast_ms(self, nbytes: int) -> float:
        """Measured broadcast time, piecewise-linear in bytes between anchor
        points; linear extrapolation (bandwidth) above the largest one, the
        smallest measured time (latency floor) below the smallest one."""
        xs, ys = self.bcast_bytes, self.bcast_ms
        if nbytes <= xs[0]:
            return ys[0]
        i = bisect.bisect_left(xs, nbytes)
        if i == len(xs):
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)

    def bcast_ms_for(self, nbytes: int, ranks: int = 2, pipelined: bool = True) -> float:
        t = self.isolated_bcast_ms(nbytes) + max(ranks - 2, 0) * self.hop_ms
        if pipelined:
            # Never below a tenth of the isolated time: a broadcast cannot be free.
            t = max(t - self.pipelined_saving_ms, 0.1 * t)
        return t

    def allgather_ms_for(self, nbytes: int, ranks: int = 2) -> float:
        """Time of one all-gather delivering a whole buffer of ``nbytes``
        (each rank contributes ``nbytes / ranks``): the measured curve,
        interpolated like the broadcast's, plus the per-hop latency beyond
        two ranks. Without a curve, the assumption ``compare.py``
        states: a broadcast of the bytes each rank receives,
        ``nbytes * (ranks - 1) / ranks``, not pipelined."""
        if not self.allgather_bytes:
            return self.bcast_ms_for(nbytes * (ranks - 1) // ranks, ranks, pipelined=False)
        xs, ys = self.allgather_bytes, self.allgather_ms
        if len(xs) == 1 or nbytes <= xs[0]:
            t = ys[0] if nbytes <= xs[0] else ys[0] * nbytes / xs[0]
        else:
            i = min(bisect.bisect_left(xs, nbytes), len(xs) - 1)
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            t = y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)
        return t + max(ranks - 2, 0) * self.hop_ms

    def layer_ms(self, tokens: int) -> float:
        if tokens not in self.layer_fwd_ms:
            raise ValueError(
                f"no measured decoder-layer forward for S={tokens}; "
                f"the anchor has S in {sorted(self.layer_fwd_ms)}"
            )
        return self.layer_fwd_ms[tokens]

    def mem_ms(self, nbytes: float) -> float:
        """Time of a memory-bound op moving ``nbytes`` (reads + writes)."""
        return nbytes / (self.copy_gbps * 1e6)


def _layer_params_bytes(hidden=4096, ffn=11008, dtype_bytes=2) -> List[int]:
    # q, k, v, o, gate, up, down, two norms - the anchor probe's layer.
    return [hidden * hidden * dtype_bytes] * 4 + [ffn * hidden * dtype_bytes] * 3 + [
        hidden * dtype_bytes
    ] * 2


def fit_pipelined_saving(cal: Calibration, anchor: Mapping) -> float:
    """Latency hidden per broadcast when broadcasts run back to back.

    The anchor times 9 per-parameter broadcasts of one layer in a row; the
    first one pays its full launch latency, the other 8 hide part of it.
    """
    sizes = _layer_params_bytes()
    assert sum(sizes) == anchor["layer_param_bytes"], "anchor layer is not LLaMA-7B shaped"
    isolated = sum(cal.isolated_bcast_ms(b) for b in sizes)
    return max((isolated - anchor["layer_bcast_ms_per_param"]) / (len(sizes) - 1), 0.0)


def overlapped_ms(fwd: float, bcast: float, rc: float, rb: float) -> float:
    """Closed form of the anchor's two-stream case: one forward of ``fwd`` ms
    and one broadcast of ``bcast`` ms started together, rates ``rc``/``rb``
    while both run, full speed for whichever is left."""
    if bcast / rb <= fwd / rc:  # broadcast finishes first
        return fwd + bcast * (1.0 - rc) / rb
    return bcast + fwd * (1.0 - rb) / rc


def contention_residuals(anchor: Mapping, rc: float, rb: float) -> List[Tuple[int, float, float]]:
    """(S, measured overlapped ms, modelled overlapped ms) per anchor case."""
    b = anchor["layer_bcast_ms_per_param"]
    out = []
    for key in sorted(k for k in anchor if k.startswith("layer_fwd_ms_S")):
        s = int(key.rsplit("S", 1)[1])
        out.append((s, anchor[f"overlap_fwd+bcast_ms_S{s}"], overlapped_ms(anchor[key], b, rc, rb)))
    return out


def fit_contention(anchor: Mapping, rb: Optional[float] = None) -> Tuple[float, float, float]:
    """Fit (rc, rb) to the anchor's overlapped times; return (rc, rb, rms ms).

    The probe broadcasts one layer's parameters on a side stream while
    another layer's forward runs, at S = 1024 and 4096.  Grid search: rb in
    steps of 0.01 (or the given value), rc in steps of 0.002.  Two points
    often leave a one-dimensional family of equally good fits; ties (within
    1 us rms) go to the largest rb, i.e. the least slowed-down broadcast.
    """

    # (measured, forward) per case, as contention_residuals reads them
    cases = [(x, anchor[f"layer_fwd_ms_S{s}"]) for s, x, _ in contention_residuals(anchor, 1.0, 1.0)]
    b = anchor["layer_bcast_ms_per_param"]

    def rms(rc, rb_):
        return (sum((overlapped_ms(f, b, rc, rb_) - x) ** 2 for x, f in cases) / len(cases)) ** 0.5

    rbs = [rb] if rb is not None else [i / 100 for i in range(20, 101)]
    best = []
    for rb_ in rbs:
        e, rc = min((rms(j / 500, rb_), j / 500) for j in range(5, 501))
        best.append((e, rb_, rc))
    emin = min(b[0] for b in best)
    e, rb_, rc = max((b for b in best if b[0] <= emin + 1e-3), key=lambda b: b[1])
    return rc, rb_, e


# --------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------
@dataclass
class Segment:
    stream: str  # "comm", "compute" or "wait" (compute stream stalled)
    label: str  # parameter or unit name
    start: float
    end: float
    contended: bool = False


@dataclass
class SimResult:
    forward_end_ms: float  # when the last forward unit finishes
    comm_end_ms: float  # when the last broadcast finishes
    compute_ms: float  # forward time with no waits and no contention
    segments: List[Segment] = field(default_factory=list)
    wait_ms: Dict[str, float] = field(default_factory=dict)  # per unit stall

    @property
    def exposed_ms(self) -> float:
        """Time the forward loses to communication (waits plus slow-down).

        A broadcast still running after the forward ended is counted too:
        the next phase (backward) would have to wait for or share with it.
        """
        return max(self.forward_end_ms, self.comm_end_ms) - self.compute_ms


def _simulate_work(
    comm_ms: Sequence[float],
    needs: Sequence[set],
    units: Sequence[Unit],
    cal: Calibration,
    *,
    contention: bool,
    labels: Optional[Sequence[str]] = None,
    launched0: Optional[int] = None,
    launch_upto: Optional[Sequence[int]] = None,
) -> SimResult:
    """Two streams, event driven.

    ``comm_ms[i]`` is broadcast i's duration at full speed, run in this
    order on one stream.  ``needs[u]`` is the set of broadcast indices unit
    ``u`` waits for (forward pre-hook).  While both streams are busy,
    compute runs at ``cal.rc`` and communication at ``cal.rb``.

    Launch depth: by default every broadcast is issued at t=0.  With
    ``launch_upto`` only the first ``launched0`` are; once the compute
    stream reaches unit ``u`` (its pre-hook) the first ``launch_upto[u]``
    are issued, and an issued collective can start no earlier than that
    moment (it waits for the compute stream, as NCCL's stream does).
    """
    labels = labels or [f"b{i}" for i in range(len(comm_ms))]
    segs: List[Segment] = []
    wait: Dict[str, float] = {}
    t = 0.0
    ci, crem = 0, (comm_ms[0] if comm_ms else 0.0)
    ui, urem = 0, (units[0].fwd_ms if units else 0.0)
    done: set = set()
    n_comm = len(comm_ms)
    launched = n_comm if launch_upto is None else min(launched0 or 0, n_comm)
    hooked = -1
    # Host issue times (all 0 unless cal.host_launch_ms): avail[i] for each
    # collective, issue[u] for each unit (after the launches before it).
    h = cal.host_launch_ms
    avail = [(i + 1) * h for i in range(launched)] + [0.0] * (n_comm - launched)
    issue = [launched * h] * len(units)
    if launch_upto is not None and h > 0:
        k, host = launched, launched * h
        for u in range(len(units)):
            while k < min(launch_upto[u], n_comm):
                host += h
                avail[k] = host
                k += 1
            issue[u] = host

    def add(stream, label, a, b, cont):
        if b - a <= _EPS:
            return
        last = segs[-1] if segs else None
        for s in reversed(segs):
            if s.stream == stream or (stream in ("compute", "wait") and s.stream in ("compute", "wait")):
                last = s
                break
        else:
            last = None
        if last and last.stream == stream and last.label == label and last.contended == cont and abs(last.end - a) < 1e-9:
            last.end = b
        else:
            segs.append(Segment(stream, label, a, b, cont))

    while ui < len(units):
        if launch_upto is not None and hooked < ui:
            hooked = ui
            new = min(max(launched, launch_upto[ui]), n_comm)
            if ci == launched < new and ci > 0 and contention and needs[ui] <= done:
                urem += cal.call_stall_ms  # an idle stream starts a collective under a running unit
                crem += cal.call_gap_ms
            launched = new
        comm_active = ci < launched and avail[ci] <= t + _EPS
        ready = needs[ui] <= done and issue[ui] <= t + _EPS
        pending = [x - t for x in ((avail[ci] if ci < launched else 0.0), issue[ui]) if x > t + _EPS]
        if not ready and not comm_active and not pending:
            missing = sorted(needs[ui] - done)
            raise ValueError(
                f"unit {units[ui].name!r} waits for broadcasts {missing} that are never issued"
            )
        both = comm_active and ready and contention
        rc = cal.rc if both else 1.0
        rb = cal.rb if both else 1.0
        steps = []
        if comm_active:
            steps.append(crem / rb)
        if ready:
            steps.append(urem / rc)
        dt = min(steps + pending)
        if comm_active:
            add("comm", labels[ci], t, t + dt, both)
            crem -= dt * rb
        if ready:
            add("compute", units[ui].name, t, t + dt, both)
            urem -= dt * rc
        else:
            add("wait", units[ui].name, t, t + dt, False)
            wait[units[ui].name] = wait.get(units[ui].name, 0.0) + dt
        t += dt
        if comm_active and crem <= _EPS:
            done.add(ci)
            ci += 1
            crem = comm_ms[ci] if ci < len(comm_ms) else 0.0
            if ci < launched and contention and needs[ui] <= done:
                urem += cal.call_stall_ms
                crem += cal.call_gap_ms
        if ready and urem <= _EPS:
            ui += 1
            urem = units[ui].fwd_ms if ui < len(units) else 0.0
    forward_end = t
    # Broadcasts nobody waited for keep going after the forward.
    comm_end = t
    if ci < len(comm_ms):
        add("comm", labels[ci], t, t + crem, False)
        comm_end = t + crem
        for j in range(ci + 1, len(comm_ms)):
            add("comm", labels[j], comm_end, comm_end + comm_ms[j], False)
            comm_end += comm_ms[j]
    else:
        comm_end = max((s.end for s in segs if s.stream == "comm"), default=0.0)
    return SimResult(
        forward_end_ms=forward_end,
        comm_end_ms=comm_end,
        compute_ms=sum(u.fwd_ms for u in units),
        segments=segs,
        wait_ms=wait,
    )


def simulate(
    units: Sequence[Unit],
    params: Sequence[Param],
    order: Sequence[str],
    cal: Calibration,
    *,
    ranks: int = 2,
    overlap: bool = True,
    contention: bool = True,
) -> SimResult:
    """Simulate one forward after a step's broadcasts.

    ``order`` lists parameter names in broadcast issue order.  With
    ``overlap=False`` every broadcast is waited for before the first unit
    (Paddle's default path); the order then does not matter.
    """
    return simulate_groups(
        units, params, [[n] for n in order], cal, ranks=ranks, overlap=overlap, contention=contention
    )


def bucket_groups(params: Sequence[Param], order: Sequence[str], cap_bytes: int) -> List[List[str]]:
    """Broadcast buckets as ``broadcast_buckets.plan_buckets`` forms them:
    walk ``order``, close a window once it holds at least ``cap_bytes``,
    one bucket per owner inside a window (by first appearance).  ``cap_bytes``
    0 gives one group per parameter."""
    by_name = {p.name: p for p in params}
    if cap_bytes <= 0:
        return [[n] for n in order]
    groups: List[List[str]] = []
    window: List[str] = []
    size = 0

    def close():
        per_owner: Dict[int, List[str]] = {}
        for n in window:
            per_owner.setdefault(by_name[n].owner, []).append(n)
        groups.extend(per_owner.values())

    for n in order:
        window.append(n)
        size += by_name[n].nbytes
        if size >= cap_bytes:
            close()
            window, size = [], 0
    if window:
        close()
    return groups


def simulate_groups(
    units: Sequence[Unit],
    params: Sequence[Param],
    groups: Sequence[Sequence[str]],
    cal: Calibration,
    *,
    ranks: int = 2,
    overlap: bool = True,
    contention: bool = True,
    depth: Optional[int] = None,
    comm_bytes: Optional[Sequence[int]] = None,
    collective: str = "broadcast",
) -> SimResult:
    """Like :func:`simulate`, with one broadcast per group of parameters
    (a bucket living in one contiguous buffer: its bytes in one call); a
    unit waits for every group holding one of its parameters.

    ``depth=None``: every group issued at the step boundary (what the
    product does).  ``depth=K``: launches chained from the pre-hooks, a
    model of upstream V2 (K = 1) and of the product's former launch depth:
    the boundary issues groups ``0..K-1``; the pre-hook of a unit whose
    groups end at ``h`` issues up to ``h + K``.  ``comm_bytes``
    overrides each group's bytes (padding, or the share an all-gather
    delivers). ``collective="all_gather"``: each group is one V2 comm
    buffer, all-gathered (:meth:`Calibration.allgather_ms_for` of its
    bytes, the whole buffer's) instead of broadcast."""
    by_name = {p.name: p for p in params}
    order = [n for g in groups for n in g]
    if len(set(order)) != len(order):
        raise ValueError("broadcast order names a parameter twice")
    unknown = [n for n in order if n not in by_name]
    if unknown:
        raise ValueError(f"broadcast order names unknown parameters: {unknown[:5]}")
    index = {n: gi for gi, g in enumerate(groups) for n in g}
    sizes = comm_bytes if comm_bytes is not None else [sum(by_name[n].nbytes for n in g) for g in groups]
    if len(sizes) != len(groups):
        raise ValueError("comm_bytes needs one entry per group")
    if collective == "broadcast":
        comm = [cal.bcast_ms_for(b, ranks, pipelined=i > 0) for i, b in enumerate(sizes)]
    elif collective == "all_gather":
        comm = [cal.allgather_ms_for(b, ranks) for b in sizes]
    else:
        raise ValueError(f"collective must be 'broadcast' or 'all_gather', not {collective!r}")
    unit_names = [u.name for u in units]
    if len(set(unit_names)) != len(unit_names):
        raise ValueError("unit names must be unique")
    needs: List[set] = [set() for _ in units]
    pos = {n: i for i, n in enumerate(unit_names)}
    for p in params:
        if p.unit not in pos:
            raise ValueError(f"parameter {p.name!r} names unknown unit {p.unit!r}")
        if p.name in index:
            needs[pos[p.unit]].add(index[p.name])
    if not overlap and units:
        needs[0] = set(range(len(groups)))
    labels = [g[0] if len(g) == 1 else f"{g[0]}+{len(g) - 1}" for g in groups]
    launched0 = upto = None
    if depth is not None and overlap:
        if depth < 1:
            raise ValueError("depth must be None or >= 1")
        n = len(groups)
        launched0 = min(depth, n)
        upto, reach = [], launched0
        for u in needs:
            if u:  # a unit with parameters has a pre-hook
                h = max(u)
                reach = max(reach, min(h + 1 + depth, n))
            upto.append(reach)
    return _simulate_work(
        comm, needs, units, cal, contention=contention, labels=labels, launched0=launched0, launch_upto=upto
    )


# --------------------------------------------------------------------------
# Broadcast orders
# --------------------------------------------------------------------------
def upstream_order(params: Sequence[Param]) -> List[str]:
    """Paddle PR #63945: stable sort by the integer in the name's first part
    (``linear_3.w_0`` -> 3); any name without one -> parameter-list order."""
    try:
        ordered = sorted(params, key=lambda p: int(p.name.split(".")[0].split("_")[-1]))
    except ValueError:
        ordered = list(params)
    return [p.name for p in ordered]


def forward_order(units: Sequence[Unit], params: Sequence[Param]) -> List[str]:
    """First-use order: by the forward position of the unit that first uses
    each parameter, parameter-list order within a unit."""
    pos = {u.name: i for i, u in enumerate(units)}
    return [p.name for p in sorted(params, key=lambda p: pos[p.unit])]


def owner_order(params: Sequence[Param], degree: int) -> List[str]:
    """Non-overlapped path: rank by rank, each rank's list order."""
    return [p.name for r in range(degree) for p in params if p.owner == r]


def paddle_partition(params: Sequence[Param], degree: int) -> List[Param]:
    """Owner per DygraphShardingOptimizer._partition_parameters (V1): sort by
    numel descending (stable), give each to the least-loaded rank."""
    sizes = [0] * degree
    owner: Dict[str, int] = {}
    for p in sorted(params, key=lambda p: p.numel, reverse=True):
        r = sizes.index(min(sizes))
        owner[p.name] = r
        sizes[r] += p.numel
    return [Param(p.name, p.nbytes, p.unit, owner[p.name]) for p in params]


# --------------------------------------------------------------------------
# LLaMA model description
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaShape:
    layers: int = 32
    hidden: int = 4096
    ffn: int = 11008
    vocab: int = 32000
    dtype_bytes: int = 2  # bf16


LLAMA_7B = LlamaShape()


NAMINGS = {
    "auto": "Paddle auto names, PaddleNLP construction order (embedding, layers, norm, lm_head)",
    "head_first": "Paddle auto names, lm_head an nn.Linear built before the layers",
    "custom": "ParamAttr(name='model.layers.N.<proj>.weight') names: no integer to sort by",
}


def llama_params(shape: LlamaShape = LLAMA_7B, degree: int = 2, naming: str = "auto") -> List[Param]:
    """Parameters in ``model.parameters()`` order, named as Paddle would
    name them, with owners from Paddle's V1 partition.

    ``auto``: Paddle's per-type counters for a PaddleNLP-style LLaMA -
    ``embedding_0``; ``linear_N`` for q/k/v/o/gate/up/down, created in that
    order; ``llama_rms_norm_N`` for the two norms, created after them;
    ``llama_lm_head_0`` last.  ``head_first``: the head is an ``nn.Linear``
    created (and registered) first, so it is ``linear_0``.  ``custom``:
    every parameter named through ``ParamAttr`` in a checkpoint-like style.
    """
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {sorted(NAMINGS)}")
    H, I, V, b = shape.hidden, shape.ffn, shape.vocab, shape.dtype_bytes
    lin = 1 if naming == "head_first" else 0
    norm = 0
    ps: List[Param] = []
    if naming == "head_first":
        ps.append(Param("linear_0.w_0", H * V * b, "lm_head"))
    emb = "model.embed_tokens.weight" if naming == "custom" else "embedding_0.w_0"
    ps.append(Param(emb, V * H * b, "embed"))
    projs = (("q", H * H), ("k", H * H), ("v", H * H), ("o", H * H), ("gate", I * H), ("up", I * H), ("down", I * H))
    for i in range(shape.layers):
        for proj, n in projs:
            name = f"model.layers.{i}.{proj}_proj.weight" if naming == "custom" else f"linear_{lin}.w_0"
            ps.append(Param(name, n * b, f"L{i}.{proj}"))
            lin += 1
        for which in ("norm1", "norm2"):
            name = f"model.layers.{i}.{which}.weight" if naming == "custom" else f"llama_rms_norm_{norm}.w_0"
            ps.append(Param(name, H * b, f"L{i}.{which}"))
            norm += 1
    ps.append(Param("model.norm.weight" if naming == "custom" else f"llama_rms_norm_{norm}.w_0", H * b, "final_norm"))
    if naming != "head_first":
        ps.append(Param("lm_head.weight" if naming == "custom" else "llama_lm_head_0.w_0", H * V * b, "lm_head"))
    return paddle_partition(ps, degree)


def bytes_needed_before(units: Sequence[Unit], params: Sequence[Param], order: Sequence[str]) -> Dict[str, int]:
    """For each unit that owns parameters: bytes that must have arrived
    (everything issued up to its last parameter) before it can start."""
    by_name = {p.name: p for p in params}
    cum, acc = {}, 0
    for n in order:
        acc += by_name[n].nbytes
        cum[n] = acc
    last: Dict[str, int] = {}
    for p in params:
        last[p.unit] = max(last.get(p.unit, 0), cum[p.name])
    return {u.name: last[u.name] for u in units if u.name in last}


def llama_units(cal: Calibration, tokens: int, shape: LlamaShape = LLAMA_7B) -> List[Unit]:
    """Forward compute units of one micro-batch of ``tokens`` tokens.

    One decoder layer's measured forward time is split into leaf layers:
    memory-bound pieces (norms, residual adds, SiLU*mul) by the bytes they
    move at the measured copy bandwidth; the remainder among the GEMMs and
    the attention core by FLOPs.  The LM head runs at the same achieved
    FLOP rate; the loss is memory bound.
    """
    if (shape.hidden, shape.ffn) != (4096, 11008):
        raise ValueError("the anchor measured a hidden=4096, ffn=11008 layer only")
    S, H, I, V, b = tokens, shape.hidden, shape.ffn, shape.vocab, shape.dtype_bytes
    act = S * H * b
    mem = {
        "norm1": cal.mem_ms(2 * act),
        "o": cal.mem_ms(3 * act),  # residual add after o_proj
        "norm2": cal.mem_ms(2 * act),
        "act": cal.mem_ms(3 * S * I * b),  # silu(gate) * up
        "down": cal.mem_ms(3 * act),  # residual add after down_proj
    }
    flops = {
        "q": 2 * S * H * H,
        "k": 2 * S * H * H,
        "v": 2 * S * H * H,
        "attn": 2 * S * S * H,  # causal: half of 4*S^2*H
        "o": 2 * S * H * H,
        "gate": 2 * S * H * I,
        "up": 2 * S * H * I,
        "down": 2 * S * I * H,
    }
    layer = cal.layer_ms(S)
    gemm_ms = layer - sum(mem.values())
    rate = sum(flops.values()) / gemm_ms  # FLOP per ms actually achieved
    order = ["norm1", "q", "k", "v", "attn", "o", "norm2", "gate", "up", "act", "down"]
    per = {n: flops.get(n, 0) / rate + mem.get(n, 0.0) for n in order}
    assert abs(sum(per.values()) - layer) < 1e-9
    units = [Unit("embed", cal.mem_ms(2 * act))]
    for i in range(shape.layers):
        units += [Unit(f"L{i}.{n}", per[n]) for n in order]
    units.append(Unit("final_norm", cal.mem_ms(2 * act)))
    units.append(Unit("lm_head", 2 * S * H * V / rate))
    # Softmax cross-entropy over bf16 logits with fp32 math: read, write, read.
    units.append(Unit("loss", cal.mem_ms(S * V * (b + 4 + 4))))
    return units


# --------------------------------------------------------------------------
# Step model and the report
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class StepAssumptions:
    bwd_factor: float = 2.0  # backward / forward time, no recompute
    grad_bytes: int = 4  # fp32 main grads (amp_master_grad)
    adam_bytes_per_param: int = 30  # fp32 master+m+v+grad read, master+m+v+bf16 write


@dataclass
class StepReport:
    mode: str
    forward1_ms: float  # first micro-batch forward incl. exposed broadcast
    exposed_ms: float
    step_ms: float

    @property
    def exposed_pct(self) -> float:
        return 100.0 * self.exposed_ms / self.step_ms


def step_reports(
    cal: Calibration,
    *,
    degree: int,
    micro_batches: int,
    tokens: int,
    shape: LlamaShape = LLAMA_7B,
    assume: StepAssumptions = StepAssumptions(),
    naming: str = "auto",
) -> Tuple[Dict[str, StepReport], Dict[str, SimResult], Dict[str, float]]:
    params = llama_params(shape, degree, naming)
    units = llama_units(cal, tokens, shape)
    fwd = sum(u.fwd_ms for u in units)
    orders = {
        "off": owner_order(params, degree),
        "upstream": upstream_order(params),
        "ours": forward_order(units, params),
        "ideal": forward_order(units, params),
    }
    sims = {
        "off": simulate(units, params, orders["off"], cal, ranks=degree, overlap=False),
        "upstream": simulate(units, params, orders["upstream"], cal, ranks=degree),
        "ours": simulate(units, params, orders["ours"], cal, ranks=degree),
        "ideal": simulate(units, params, orders["ideal"], cal, ranks=degree, contention=False),
        # What the order alone is worth if the two streams did not contend.
        "upstream_free": simulate(units, params, orders["upstream"], cal, ranks=degree, contention=False),
    }
    reduce_ms = sum(
        cal.bcast_ms_for(p.numel * assume.grad_bytes, degree, pipelined=i > 0) for i, p in enumerate(params)
    )
    owned = [0] * degree
    for p in params:
        owned[p.owner] += p.numel
    adam_ms = cal.mem_ms(max(owned) * assume.adam_bytes_per_param)
    rest = (
        micro_batches * fwd * (1 + assume.bwd_factor) + reduce_ms + adam_ms
    )  # everything but the broadcast's exposed part
    reports = {
        m: StepReport(m, fwd + s.exposed_ms, s.exposed_ms, rest + s.exposed_ms) for m, s in sims.items()
    }
    parts = {
        "forward_ms": fwd,
        "backward_ms": fwd * assume.bwd_factor,
        "reduce_ms": reduce_ms,
        "adam_ms": adam_ms,
        "bcast_serial_ms": sims["off"].exposed_ms,
        "tokens_per_step": tokens * micro_batches,
    }
    return reports, sims, parts


UPSTREAM_PUBLISHED = {
    "what": "Paddle PR #63945 description: LLaMA-7B, sharding 8, tokens/s no_overlap 6877 -> overlap 7053.3",
    "no_overlap": 6877.0,
    "overlap": 7053.3278,
}


def format_table(rows: Iterable[Sequence], header: Sequence[str]) -> str:
    rows = [[str(c) for c in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |"
    sep = "| " + " | ".join("-" * w[i] for i in range(len(header))) + " |"
    body = ["| " + " | ".join(r[i].rjust(w[i]) for i in range(len(header))) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def run_report(cal: Calibration, *, tokens_list=(4096, 1024), degrees=(2, 8), mbs=(1, 8), assume=StepAssumptions()):
    upstream_gain = 100.0 * (UPSTREAM_PUBLISHED["overlap"] / UPSTREAM_PUBLISHED["no_overlap"] - 1)
    rows, all_sims = [], {}
    for S in tokens_list:
        for d in degrees:
            for m in mbs:
                rep, sims, parts = step_reports(cal, degree=d, micro_batches=m, tokens=S, assume=assume)
                all_sims[(S, d, m)] = (rep, sims, parts)
                off = rep["off"].step_ms
                row = [S, d, m, f"{parts['forward_ms']:.1f}", f"{off:.1f}"]
                for mode in ("off", "upstream", "ours", "ideal"):
                    r = rep[mode]
                    row.append(f"{r.exposed_ms:.2f} ({r.exposed_pct:.2f}%)")
                for mode in ("upstream", "ours", "ideal"):
                    row.append(f"{100.0 * (off / rep[mode].step_ms - 1):+.2f}%")
                rows.append(row)
    header = [
        "S",
        "degree",
        "micro-batches",
        "fwd/mb ms",
        "step off ms",
        "exposed off",
        "exposed upstream",
        "exposed ours",
        "exposed ideal",
        "speedup upstream",
        "speedup ours",
        "speedup ideal",
    ]
    return format_table(rows, header), all_sims, upstream_gain


def variants_report(cal: Calibration, *, tokens: int, degree: int, micro_batches: int = 1) -> str:
    """Per naming variant: how far each order is from forward order (bytes
    that must arrive before a unit can start, beyond what forward order
    needs) and what it costs in exposed time, with the measured contention
    and with free overlap."""
    rows = []
    for naming, what in NAMINGS.items():
        params = llama_params(LLAMA_7B, degree, naming)
        units = llama_units(cal, tokens)
        need_fwd = bytes_needed_before(units, params, forward_order(units, params))
        need_up = bytes_needed_before(units, params, upstream_order(params))
        excess = [need_up[u] - need_fwd[u] for u in need_fwd]
        worst = max(need_fwd, key=lambda u: need_up[u] - need_fwd[u])
        rep, sims, _ = step_reports(cal, degree=degree, micro_batches=micro_batches, tokens=tokens, naming=naming)
        rows.append(
            [
                naming,
                f"{max(excess) / 2**20:.0f} ({worst})",
                f"{sum(e > 0 for e in excess)} of {len(excess)}",
                f"{rep['upstream'].exposed_ms:.2f}",
                f"{rep['ours'].exposed_ms:.2f}",
                f"{sims['upstream_free'].exposed_ms:.2f}",
                f"{sims['ideal'].exposed_ms:.2f}",
            ]
        )
    header = [
        "naming",
        "upstream: max extra MiB before a layer (which)",
        "leaf layers delayed",
        "exposed upstream ms",
        "exposed ours ms",
        "upstream, free overlap ms",
        "ours, free overlap (ideal) ms",
    ]
    return format_table(rows, header)


def channels_report(channels_path: str, main_anchor: Mapping, *, tokens: int = 4096, degree: int = 8, hop_us: float = 3.0) -> str:
    """Same prediction recalibrated from each NCCL_MAX_NCHANNELS run: fewer
    channels = slower broadcast but less contention."""
    with open(channels_path) as f:
        data = json.load(f)["by_max_nchannels"]
    rows = []
    for ch in sorted(data, key=int):
        c = Calibration.from_anchor(data[ch], hop_us=hop_us, copy_gbps=main_anchor["d2d_copy_GBps"])
        _, _, rms = fit_contention(data[ch])
        row = [ch, f"{c.rc:.2f}", f"{c.rb:.2f}", f"{rms * 1000:.0f}"]
        for m in (1, 8):
            rep, _, _ = step_reports(c, degree=degree, micro_batches=m, tokens=tokens)
            off = rep["off"].step_ms
            row += [
                f"{rep['off'].exposed_ms:.1f}",
                f"{rep['upstream'].exposed_ms:.1f}",
                f"{rep['ours'].exposed_ms:.1f}",
                f"{100 * (off / rep['upstream'].step_ms - 1):+.2f}% / {100 * (off / rep['ours'].step_ms - 1):+.2f}%",
            ] if m == 1 else [f"{100 * (off / rep['upstream'].step_ms - 1):+.2f}% / {100 * (off / rep['ours'].step_ms - 1):+.2f}%"]
        rows.append(row)
    header = [
        "NCCL_MAX_NCHANNELS",
        "rc",
        "rb",
        "fit rms us",
        "exposed off ms",
        "exposed upstream ms",
        "exposed ours ms",
        "speedup up/ours mb=1",
        "speedup up/ours mb=8",
    ]
    return format_table(rows, header)


def describe(cal: Calibration, anchor: Mapping, assume: StepAssumptions = StepAssumptions()) -> str:
    lines = [
        f"calibration: {cal.source}",
        f"  broadcast: {len(cal.bcast_bytes)} sizes, piecewise linear; back-to-back saving "
        f"{cal.pipelined_saving_ms * 1000:.1f} us/call (fits layer_bcast_ms_per_param="
        f"{anchor['layer_bcast_ms_per_param']:.3f} ms exactly)",
        f"  flat 404.8 MB broadcast: model {cal.isolated_bcast_ms(anchor['layer_param_bytes']):.3f} ms, "
        f"measured {anchor['layer_bcast_ms_flat']:.3f} ms",
        f"  contention: compute rate rc={cal.rc:.3f}, comm rate rb={cal.rb:.3f} while both run",
    ]
    for s, meas, model in contention_residuals(anchor, cal.rc, cal.rb):
        serial = anchor[f"serial_fwd+bcast_ms_S{s}"]
        lines.append(
            f"    S={s}: overlapped measured {meas:.3f} ms, model {model:.3f} ms "
            f"(serial measured {serial:.3f}, ideal {max(cal.layer_ms(s), anchor['layer_bcast_ms_per_param']):.3f})"
        )
    lines.append(
        f"  share of a broadcast hidden behind a longer forward: 1 - (1 - rc) / rb = "
        f"{1 - (1 - cal.rc) / cal.rb:.0%} (free overlap would hide 100%)"
    )
    lines.append(
        f"  assumed, not measured: +{cal.hop_ms * 1000:.1f} us per extra ring rank per call; "
        f"backward = {assume.bwd_factor} x forward; fp32 grad reduce costs a broadcast of the same bytes; "
        f"AdamW {assume.adam_bytes_per_param} B/param"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------
def _color(label: str, layers: int):
    import matplotlib

    if label.startswith(("embed", "embedding")):
        return "#7f7f7f"
    if label.startswith(("lm_head", "llama_lm_head", "loss")):
        return "#d62728"
    if label.startswith("final_norm"):
        return "#ff7f0e"
    cmap = matplotlib.colormaps["viridis"]
    if label.startswith("L"):
        i = int(label[1:].split(".")[0])
        return cmap(i / max(layers - 1, 1))
    return "#17becf"


def _param_layer(params: Sequence[Param]) -> Dict[str, str]:
    return {p.name: p.unit for p in params}


def plot_timelines(sims: Mapping[str, SimResult], params: Sequence[Param], path: str, *, title: str, xlim=None, layers: int = 32):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    unit_of = _param_layer(params)
    modes = [m for m in ("off", "upstream", "ours", "ideal") if m in sims]
    fig, ax = plt.subplots(figsize=(13, 1.1 + 1.05 * len(modes)))
    yt, yl = [], []
    for k, mode in enumerate(modes):
        base = (len(modes) - 1 - k) * 3.0
        for seg in sims[mode].segments:
            if seg.stream == "comm":
                y, lab = base + 1.2, unit_of.get(seg.label, seg.label)
            else:
                y, lab = base, seg.label
            if xlim and seg.start > xlim[1]:
                continue
            if seg.stream == "wait":
                ax.broken_barh([(seg.start, seg.end - seg.start)], (y, 1.0), facecolors="white", edgecolor="#d62728", hatch="xxx", linewidth=0.0)
            else:
                ax.broken_barh(
                    [(seg.start, seg.end - seg.start)],
                    (y, 1.0),
                    facecolors=_color(lab, layers),
                    edgecolor="black" if seg.contended else "none",
                    hatch="//" if seg.contended else None,
                    linewidth=0.0,
                )
        s = sims[mode]
        ax.axvline(s.forward_end_ms, ymin=0, ymax=1, color="none")
        ax.text(
            (xlim[1] if xlim else max(s.forward_end_ms, s.comm_end_ms)) * 1.002,
            base + 0.5,
            f"fwd {s.forward_end_ms:.1f} ms\nexposed {s.exposed_ms:.1f} ms",
            va="center",
            fontsize=8,
        )
        yt += [base + 0.5, base + 1.7]
        yl += [f"{mode}: compute", f"{mode}: broadcast"]
    ax.set_yticks(yt)
    ax.set_yticklabels(yl, fontsize=8)
    ax.set_xlabel("ms since the optimizer step issued the broadcasts")
    if xlim:
        ax.set_xlim(*xlim)
    ax.set_title(title, fontsize=10)
    handles = [
        Patch(facecolor="#7f7f7f", label="embedding"),
        Patch(facecolor=matplotlib.colormaps["viridis"](0.0), label="decoder layer 0"),
        Patch(facecolor=matplotlib.colormaps["viridis"](1.0), label=f"decoder layer {layers - 1}"),
        Patch(facecolor="#d62728", label="lm_head / loss"),
        Patch(facecolor="white", edgecolor="black", hatch="//", label="both streams busy (contention)"),
        Patch(facecolor="white", edgecolor="#d62728", hatch="xxx", label="compute stalled on a hook"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=6, fontsize=7, frameon=False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_exposed_bars(all_sims, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(all_sims)
    modes = ("off", "upstream", "ours", "ideal")
    colors = {"off": "#7f7f7f", "upstream": "#ff7f0e", "ours": "#2ca02c", "ideal": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(11, 3.6))
    w = 0.2
    for j, mode in enumerate(modes):
        xs = [i + (j - 1.5) * w for i in range(len(keys))]
        ys = [all_sims[k][0][mode].exposed_pct for k in keys]
        ax.bar(xs, ys, w, label=mode, color=colors[mode])
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"S={s}\ndeg {d}, mb {m}" for s, d, m in keys], fontsize=8)
    ax.set_ylabel("exposed broadcast, % of step")
    ax.set_title("Predicted exposed broadcast (LLaMA-7B, bf16, H200 anchor; model, not measured)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", default=DEFAULT_ANCHOR, help="h200_anchor.json-style calibration file")
    ap.add_argument("--channels", default=DEFAULT_CHANNELS, help="h200_nccl_channels.json-style file ('' to skip)")
    ap.add_argument(
        "--contention-rb",
        type=float,
        default=None,
        help="fix the comm rate while compute runs (default: fit it; rc is always fitted)",
    )
    ap.add_argument("--hop-us", type=float, default=3.0, help="assumed ring latency per extra rank per broadcast (us)")
    ap.add_argument("--bwd-factor", type=float, default=2.0, help="backward time / forward time")
    ap.add_argument("--plot", metavar="DIR", help="write timeline PNGs to DIR (needs matplotlib)")
    args = ap.parse_args(argv)

    with open(args.anchor) as f:
        anchor = json.load(f)
    cal = Calibration.from_anchor(anchor, rb=args.contention_rb, hop_us=args.hop_us)
    cal = replace(cal, source=args.anchor)
    assume = StepAssumptions(bwd_factor=args.bwd_factor)
    print(describe(cal, anchor, assume))
    print()
    table, all_sims, upstream_gain = run_report(cal, assume=assume)
    print("Table 1. Exposed broadcast per step, ms (% of step), and step speedup over overlap off; LLaMA-7B bf16:")
    print(table)
    print()
    print(
        f"Upstream published (PR #63945, LLaMA-7B, sharding 8; sequence length, accumulation and GPU not stated): "
        f"{UPSTREAM_PUBLISHED['no_overlap']:.0f} -> {UPSTREAM_PUBLISHED['overlap']:.1f} tokens/s = {upstream_gain:+.2f}%"
    )
    for S in (4096, 1024):
        for m in (1, 8):
            rep = all_sims[(S, 8, m)][0]
            pred = 100.0 * (rep["off"].step_ms / rep["upstream"].step_ms - 1)
            print(
                f"  model, upstream order, degree 8, S={S}, {m} micro-batch(es): {pred:+.2f}% "
                f"(published minus model: {upstream_gain - pred:+.2f} points)"
            )
    for S in (4096, 1024):
        print()
        print(f"Table 2. Order quality by naming, LLaMA-7B, S={S}, degree 8, 1 micro-batch:")
        print(variants_report(cal, tokens=S, degree=8))
    if args.channels:
        print()
        print("Table 3. Recalibrated per NCCL_MAX_NCHANNELS run (LLaMA-7B, S=4096, degree 8):")
        print(channels_report(args.channels, anchor, hop_us=args.hop_us))
    print()
    print("Tables S1 and S2 (buckets, calibrated on the torch stand-in): python benchmarks/research/timeline_standin.py")
    if args.plot:
        S, d, m = 4096, 8, 1
        rep, sims, parts = all_sims[(S, d, m)]
        shown = {k: v for k, v in sims.items() if k in ("off", "upstream", "ours", "ideal")}
        params = llama_params(LLAMA_7B, d)
        plot_timelines(
            shown,
            params,
            os.path.join(args.plot, f"timeline_llama7b_S{S}_deg{d}.png"),
            title=f"LLaMA-7B, S={S}, sharding {d}: broadcasts and first micro-batch forward (simulated from the H200 anchor)",
        )
        plot_timelines(
            shown,
            params,
            os.path.join(args.plot, f"timeline_llama7b_S{S}_deg{d}_first10ms.png"),
            title="Same, first 10 ms: upstream's name order sends lm_head (red) 4th and later layers' norms early",
            xlim=(0, 10),
        )
        rep, sims, parts = all_sims[(1024, d, m)]
        shown = {k: v for k, v in sims.items() if k in ("off", "upstream", "ours", "ideal")}
        plot_timelines(
            shown,
            params,
            os.path.join(args.plot, f"timeline_llama7b_S1024_deg{d}.png"),
            title=f"LLaMA-7B, S=1024, sharding {d}: broadcast-bound (simulated from the H200 anchor)",
        )
        plot_exposed_bars(all_sims, os.path.join(args.plot, "exposed_llama7b.png"))
        print(f"\nwrote PNGs to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
