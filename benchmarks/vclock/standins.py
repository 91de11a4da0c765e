"""The torch stand-ins' schedules replayed on the clock's model (:class:`vclock.timeline.Timeline` with
:mod:`vclock.costs`), next to what the stand-ins measured (``benchmarks/data/``).

* ``h200_issue_strategy.json`` (2x H200, NCCL): 32 LLaMA-7B decoder layers, 9 parameters each, owners
  alternating by parameter index; the broadcasts of every parameter, then the forward (1 micro-batch),
  each layer waiting for its own broadcasts. Modes replayed (:data:`ISSUE_MODES`): ``off`` (all, wait
  all, then the forward), ``eager_*`` (all issued at once), ``lazy_*_1`` (one layer ahead, issued as the
  previous layer starts), by unit: ``param`` (one broadcast per parameter), ``flat`` (one per layer),
  ``fsplit`` (one per layer and owner). Not replayed: the copy-in/out and NCCL-group modes.
* ``h200_bucket_sweep.json`` (2x H200, NCCL): the same, issued at once in buckets: windows of
  consecutive parameters in forward order closed at a cap of N MB (:data:`SWEEP_CAPS`, 0: one broadcast
  per parameter), one bucket per owner and window.
* ``h200_v2_schedule_1gpu.json`` (1x H200): the same forward, each layer's 202 MB share arriving by a
  side-stream copy (SM copy on 16 blocks, or copy engine) issued all at the step boundary or chained
  from the layers' pre-hooks with K in flight (:data:`V2_SCHEDULES`); the copy's time alone and the
  contention from ``h200_contention_1gpu.json`` (same GPU, same copies).

Each replay uses its stand-in's own measured forward time. Exposed = the boundary's span minus the
forward alone, in ms, as the stand-ins define it.
"""

from . import costs
from . import timeline as tl

__all__ = ["ISSUE_MODES", "V2_SCHEDULES", "SWEEP_CAPS", "issue_strategy", "v2_schedule", "bucket_sweep"]

ISSUE_MODES = ("off", "eager_param", "eager_flat", "eager_fsplit", "lazy_param_1", "lazy_flat_1",
               "lazy_fsplit_1")
V2_SCHEDULES = ("all_at_step", "chain1", "chain2", "chain4")
SWEEP_CAPS = (0, 8, 32, 64, 128, 256, 512, 1024)


def _layer_units(unit, layer, shape):
    """Bytes of each broadcast of decoder layer ``layer`` by ``unit`` (param, flat, fsplit)."""
    h, f, b = shape.hidden, shape.ffn, shape.dtype_bytes
    sizes = [h * h * b] * 4 + [h * f * b] * 3 + [h * b] * 2
    if unit == "param":
        return sizes
    if unit == "flat":
        return [sum(sizes)]
    owners = {}
    for i, nbytes in enumerate(sizes):  # owners alternate by parameter index over the whole model
        owner = (layer * len(sizes) + i) % 2
        owners[owner] = owners.get(owner, 0) + nbytes
    return [owners[o] for o in sorted(owners)]


def _measured(mode, tokens):
    data = costs.load("h200_issue_strategy")
    runs = data["runs"] + [data["run_with_copy_and_group_modes"]]
    rows = [run[f"S{tokens}"] for run in runs]
    exposed = [row[mode]["exposed_ms"] for row in rows if mode in row]
    forward = [row["fwd_only"]["ms"] for row in rows]
    return sum(exposed) / len(exposed), sum(forward) / len(forward), runs[0]["layers"]


def issue_strategy(mode, tokens, contention, collective_costs=None, shape=costs.LLAMA7B):
    """(modelled, measured) exposed ms of the issue-strategy stand-in's ``mode`` (:data:`ISSUE_MODES`)
    at ``tokens`` (1024, 4096), with ``contention`` (rc, rb); measured: the mean of its runs.
    ValueError: an unknown mode."""
    if mode not in ISSUE_MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {ISSUE_MODES}")
    measured, forward_ms, layers = _measured(mode, tokens)
    layer_ms = forward_ms / layers
    cc = collective_costs or costs.CollectiveCosts.from_anchor()
    line = tl.Timeline(contention, cc.pipelined_ms)
    unit = "param" if mode == "off" else mode.split("_")[1]

    def issue(layer):
        return [line.issue("sharding", cc.broadcast_ms(n), True) for n in _layer_units(unit, layer, shape)]

    if mode == "off":
        for item in [item for layer in range(layers) for item in issue(layer)]:
            line.wait(item)
        pending = {}
    elif mode.startswith("eager"):
        pending = {layer: issue(layer) for layer in range(layers)}
    else:
        pending = {0: issue(0)}
    for layer in range(layers):
        if mode.startswith("lazy") and layer + 1 < layers:
            pending[layer + 1] = issue(layer + 1)
        for item in pending.pop(layer, ()):
            line.wait(item)
        line.compute(layer_ms)
    return line.now - layers * layer_ms, measured


def v2_schedule(schedule, engine, tokens, contention):
    """(modelled, measured) exposed ms of the V2 schedule proxy's ``schedule`` (:data:`V2_SCHEDULES`)
    with ``engine`` "sm" (SM copy on 16 blocks) or "ce" (copy engine) at ``tokens``, with ``contention``
    (rc, rb). ValueError: an unknown schedule or engine."""
    if schedule not in V2_SCHEDULES or engine not in ("sm", "ce"):
        raise ValueError(f"unknown schedule {schedule!r} or engine {engine!r}")
    proxy = costs.load("h200_v2_schedule_1gpu")
    row = proxy[f"S{tokens}"]
    layers = proxy["layers"]
    copy = costs.load("h200_contention_1gpu")[f"S{tokens}"]["sm16" if engine == "sm" else "ce"]
    transfer_ms = copy["transfer_alone_ms"] / layers
    layer_ms = row["fwd_alone_ms"] / layers
    depth = layers if schedule == "all_at_step" else int(schedule[len("chain"):])
    line = tl.Timeline(contention)
    arrivals, started = {}, 0
    while started < min(depth, layers):
        arrivals[started] = line.issue("side", transfer_ms, True)
        started += 1
    for layer in range(layers):
        line.wait(arrivals[layer])
        while started < layers and started < layer + 1 + depth:  # keep `depth` in flight
            arrivals[started] = line.issue("side", transfer_ms, True)
            started += 1
        line.compute(layer_ms)
    return line.now - layers * layer_ms, row[f"{engine}_{schedule}"]["exposed_ms"]


def _sweep_units(cap_mb, layers, shape):
    """[(bytes, layers it holds)] of the bucket sweep's broadcasts at ``cap_mb``, in issue order."""
    units, window, held = [], {}, 0
    sizes = _layer_units("param", 0, shape)
    for layer in range(layers):
        for i, nbytes in enumerate(sizes):
            owner = (layer * len(sizes) + i) % 2
            window.setdefault(owner, []).append((nbytes, layer))
            held += nbytes
            if held >= cap_mb * 2**20:
                units += [(sum(b for b, _ in window[o]), {l for _, l in window[o]}) for o in sorted(window)]
                window, held = {}, 0
    return units + [(sum(b for b, _ in window[o]), {l for _, l in window[o]}) for o in sorted(window)]


def bucket_sweep(cap_mb, tokens, contention, collective_costs=None, shape=costs.LLAMA7B):
    """(modelled, measured) exposed ms of the bucket-sweep stand-in at ``cap_mb`` (:data:`SWEEP_CAPS`)
    and ``tokens``, with ``contention`` (rc, rb); measured: the mean of its runs. ValueError: an
    unmeasured cap."""
    if cap_mb not in SWEEP_CAPS:
        raise ValueError(f"cap {cap_mb} MB not measured; one of {SWEEP_CAPS}")
    runs = costs.load("h200_bucket_sweep")["runs"]
    rows = [run[f"S{tokens}"] for run in runs]
    measured = sum(row[f"cap{cap_mb}MB"]["exposed_ms"] for row in rows) / len(rows)
    layers = runs[0]["layers"]
    layer_ms = sum(row["fwd_only_ms"] for row in rows) / len(rows) / layers
    cc = collective_costs or costs.CollectiveCosts.from_anchor()
    line = tl.Timeline(contention, cc.pipelined_ms)
    units = [(line.issue("sharding", cc.broadcast_ms(n), True), held) for n, held in _sweep_units(cap_mb, layers, shape)]
    for layer in range(layers):
        for item, held in units:
            if layer in held:
                line.wait(item)
        line.compute(layer_ms)
    return line.now - layers * layer_ms, measured
