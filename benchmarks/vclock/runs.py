"""Training steps of one mode of the parameter sync under the virtual clock.

Modes (:data:`MODES`): overlap off (V1's blocking broadcast, V2's blocking all-gather), the product
(``paddle_overlay``: V1 one broadcast per parameter or per bucket of a cap, V2 one all-gather per comm
buffer of a size) and upstream Paddle 3.3.1's own overlap (V1 ``_set_broadcast_overlap``, V2
``_set_all_gather_overlap_forward``, run with the overlay removed). Caps and sizes are in modelled MB
(LLaMA-7B's bf16 sizes; :func:`vclock.llama.tiny_mb` converts).

A :class:`Backend` builds the sharding optimizer: :class:`FakeBackend` in one process over a fake group of
N ranks (values not checked), :class:`FleetBackend` on real ranks under ``paddle.distributed.launch``
(``fleet`` initialised by the caller; V2 through the test-only CPU shim on gloo). :func:`run` trains
``steps`` steps of one mode and returns its clock and the losses.
"""

import contextlib

import paddle
import paddle_overlay

from . import clock as vc
from . import contention, costs, llama

__all__ = ["Mode", "MODES", "FakeBackend", "FleetBackend", "run", "scenarios"]

# modelled bytes an AdamW update moves per owned parameter (bf16 parameter, fp32 master, moments and
# gradient: read 16, write 14); an assumption, not measured
UPDATE_BYTES_PER_PARAM = 30
BACKWARD_PER_FORWARD = 2.0  # backward = 2x forward, an assumption (no recompute)


class Mode:
    """How the parameter sync runs: ``family`` "v1" (broadcast) or "v2" (``split_param``), ``kind``
    "off", "ours" or "upstream", ``size_mb`` the modelled bucket cap (V1, 0: per parameter) or comm
    buffer size (V2)."""

    def __init__(self, name, family, kind, size_mb):
        self.name, self.family, self.kind, self.size_mb = name, family, kind, size_mb

    @property
    def v2(self):
        return self.family == "v2"

    def enable(self, opt, model):
        """Turn this mode's overlap on (upstream V1 warns that a manual synchronize is needed before
        saving: its own warning)."""
        if self.kind == "off":
            return
        if self.v2:
            opt._set_all_gather_overlap_forward(True, model)
        elif self.kind == "ours":
            opt._set_broadcast_overlap(True, layers=model, bucket_size_mb=llama.tiny_mb(self.size_mb))
        else:
            opt._set_broadcast_overlap(True, layers=model)

    def disable(self, opt, model):
        if self.kind == "off":
            return
        if self.v2:
            opt._set_all_gather_overlap_forward(False, model)
        else:
            opt._set_broadcast_overlap(False)


def _modes():
    out = [Mode("off", "v1", "off", 0), Mode("ours_v1_per_param", "v1", "ours", 0)]
    out += [Mode(f"ours_v1_bucket_{cap}", "v1", "ours", cap) for cap in (64, 256, 1024)]
    out += [Mode("upstream_v1", "v1", "upstream", 0), Mode("off_v2", "v2", "off", 256)]
    out += [Mode(f"ours_v2_buffer_{size}", "v2", "ours", size) for size in (128, 256, 1024)]
    out += [Mode("upstream_v2", "v2", "upstream", 256)]
    return {m.name: m for m in out}


MODES = _modes()


@contextlib.contextmanager
def overlay(applied):
    """The overlay applied (or removed, for upstream's own overlap) for the block; applied after it."""
    if applied:
        paddle_overlay.apply()
    else:
        paddle_overlay.remove()
    try:
        yield
    finally:
        paddle_overlay.apply()


class FakeBackend:
    """One process playing rank 0 of a fake sharding group of ``nranks`` (:mod:`vclock.fake_group`)."""

    values_checked = False

    def __init__(self, nranks):
        from . import fake_group

        self.nranks, self._fg = nranks, fake_group
        self.group = fake_group.fake_group(nranks)

    def process_group_classes(self):
        return [self._fg.FakeProcessGroup]

    def session(self, mode):
        """The block a mode's optimizer lives in: fleet's strategy as ``fleet.init`` would set it."""
        return self._fg.sharding_strategy(mode.v2, llama.tiny_mb(mode.size_mb) if mode.v2 else 256)

    def optimizer(self, model, mode):
        return self._fg.sharding_optimizer(model.parameters(), self.group, mode.v2)

    def reduce_gradients(self, opt, model):
        # HybridParallelOptimizer.step does this before the sharding step on real ranks
        opt.reduce_gradients(list(model.parameters()), opt._hcg)


class FleetBackend:
    """Real ranks: ``fleet.init`` done with every rank in one sharding group (``sharding_cases``)."""

    values_checked = True

    def __init__(self):
        from paddle.distributed import fleet

        import sharding_cases

        self._fleet, self._cases = fleet, sharding_cases
        self.group = fleet.get_hybrid_communicate_group().get_sharding_parallel_group()
        self.nranks = self.group.nranks

    def process_group_classes(self):
        from paddle.base import core

        return [getattr(core, n) for n in dir(core) if n.startswith("ProcessGroup")
                and isinstance(getattr(core, n), type) and issubclass(getattr(core, n), core.ProcessGroup)]

    def session(self, mode):
        """The block a mode's optimizer lives in: V2's ``sharding_configs`` and the CPU shim's comm
        buffers (``sharding_cases.sharding_v2``)."""
        return self._cases.sharding_v2(int(llama.tiny_mb(mode.size_mb))) if mode.v2 else contextlib.nullcontext()

    def optimizer(self, model, mode):
        inner = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
        return self._fleet.distributed_optimizer(inner)

    def reduce_gradients(self, opt, model):
        return None  # HybridParallelOptimizer.step reduces first


def scenarios(contention_source="nccl_2gpu"):
    """The clock's scenarios: 1k and 4k tokens, each without contention (``*_free``) and with the
    contention of ``contention_source`` (:func:`vclock.contention.contention`)."""
    out = []
    for tokens in costs.TOKENS:
        k = f"{tokens // 1024}k"
        out.append(vc.Scenario(f"{k}_free", tokens, (1.0, 1.0)))
        out.append(vc.Scenario(k, tokens, contention.contention(contention_source, tokens)))
    return out


def run(backend, mode, variant="llama7b", layers=32, steps=3, clock_scenarios=None, between=None):
    """Train ``steps`` steps of ``mode`` on a fresh ``variant`` model; returns (clock, losses). The first
    step records the forward order; the clock's records close at a final ``begin_step``. ``between``:
    called as ``between(step, model, optimizer)`` after each step's ``clear_grad()`` (what user code
    does between steps)."""
    clock_scenarios = clock_scenarios or scenarios()
    tokens = sorted({s.tokens for s in clock_scenarios})
    with overlay(mode.kind != "upstream"), backend.session(mode):
        model = llama.build(variant, layers, backend.group)
        opt = backend.optimizer(model, mode)
        mode.enable(opt, model)
        clock = vc.VirtualClock(costs.CollectiveCosts.from_anchor(), clock_scenarios)
        sizes = llama.modelled_sizes(model)
        clock.register(sizes)
        forward = {t: 0.0 for t in tokens}
        for layer, ms, params in llama.segments(model, tokens):
            clock.add_segment(layer, ms, params)
            for t in tokens:
                forward[t] += ms[t]
        n_params = sum(sizes.values()) // 2  # bf16
        copy_per_ms = costs.load("h200_anchor")["d2d_copy_GBps"] * 1e6
        update = {t: UPDATE_BYTES_PER_PARAM * n_params / backend.nranks / copy_per_ms for t in tokens}
        backward = {t: BACKWARD_PER_FORWARD * forward[t] for t in tokens}
        clock.install(backend.process_group_classes())
        losses = []
        try:
            for step in range(steps):
                clock.begin_step()
                loss = model(llama.batch(step)).astype("float32").mean()
                clock.end_forward()
                loss.backward()
                clock.compute("backward", backward)
                clock.compute("update", update)
                backend.reduce_gradients(opt, model)
                opt.step()
                opt.clear_grad()
                losses.append(float(loss))
                if between is not None:
                    between(step, model, opt)
            clock.begin_step()
        finally:
            clock.uninstall()
            mode.disable(opt, model)
    return clock, losses

