"""Contention: while a collective (or copy) is in flight the forward runs at rate ``rc`` and, while the
forward runs, the collective at rate ``rb`` (1 = full speed), as two rates of
:class:`vclock.timeline.Timeline`. A model calibrated on measured H200 torch stand-in figures.

Sources (:func:`contention`):

* ``nccl_2gpu`` (the benchmark's default): NCCL broadcasts beside the forward on 2x H200. (rc, rb)
  fitted so that the issue-strategy stand-in's one-broadcast-per-layer mode (``eager_flat``, at 1024 and
  4096 tokens) is reproduced (:func:`nccl_2gpu`); its other modes then check the fit
  (``test_vclock_standins.py``).
* ``sm16_1gpu`` / ``ce_1gpu``: ``h200_contention_1gpu.json`` (one H200: 32 layers' forward beside a
  side-stream copy of one sharding-2 rank's share, an SM copy on 16 blocks or a copy-engine copy,
  started together; both spans measured), solved for the two rates. These reproduce the one-GPU V2
  schedule proxy, not the two-GPU NCCL stand-in: a device-to-device copy loads HBM about twice as a
  receiver does, and beside the forward the SM copy ran at 20-33% of its speed, where the 2-GPU
  broadcasts kept most of theirs.
* ``nccl_anchor``: ``h200_anchor.json``'s overlapped layer (one layer's forward beside the next layer's
  9 broadcasts, 2x H200), with rb = 1: rc 0.32-0.33. It predicts about 25 ms exposed for the
  issue-strategy's per-layer broadcasts where 15-16 ms were measured over 32 layers.
* ``none``: (1, 1).
"""

import functools

from . import costs, standins

__all__ = ["SOURCES", "contention", "nccl_2gpu"]

SOURCES = ("none", "nccl_2gpu", "sm16_1gpu", "ce_1gpu", "nccl_anchor")


def _two_streams(alone_fwd, alone_x, fwd_with, x_with):
    """(rc, rb) of a forward and a transfer started together: ``alone_*`` alone, ``*_with`` beside each
    other; whichever ended first ran contended throughout, the other ran alone after it."""
    if x_with >= fwd_with:
        return alone_fwd / fwd_with, (alone_x - (x_with - fwd_with)) / fwd_with
    return (alone_fwd - (fwd_with - x_with)) / x_with, alone_x / x_with


def _grid(lo, hi, step):
    n = int(round((hi - lo) / step))
    return [round(lo + i * step, 6) for i in range(n + 1)]


@functools.lru_cache(maxsize=None)
def nccl_2gpu():
    """(rc, rb) minimising the squared error of the issue-strategy stand-in's ``eager_flat`` exposed time
    at 1024 and 4096 tokens; a grid of 0.05, then of 0.005 around the best (deterministic)."""

    def error(rates):
        return sum((m - s) ** 2 for m, s in (standins.issue_strategy("eager_flat", t, rates) for t in costs.TOKENS))

    best = min(((rc, rb) for rc in _grid(0.1, 1.0, 0.05) for rb in _grid(0.1, 1.0, 0.05)), key=error)
    fine = [(rc, rb) for rc in _grid(best[0] - 0.05, best[0] + 0.05, 0.005)
            for rb in _grid(best[1] - 0.05, best[1] + 0.05, 0.005) if 0 < rc <= 1 and 0 < rb <= 1]
    return min(fine, key=error)


def contention(source, tokens):
    """(rc, rb) of ``source`` (:data:`SOURCES`) at ``tokens`` per micro-batch (1024 or 4096).
    ValueError: an unknown source or unmeasured ``tokens``."""
    if source not in SOURCES:
        raise ValueError(f"unknown contention source {source!r}; one of {SOURCES}")
    if source == "none":
        return 1.0, 1.0
    if tokens not in costs.TOKENS:
        raise ValueError(f"contention measured at {costs.TOKENS} tokens only, got {tokens}")
    if source == "nccl_2gpu":
        return nccl_2gpu()
    if source == "nccl_anchor":
        a = costs.load("h200_anchor")
        fwd, bcast = a[f"layer_fwd_ms_S{tokens}"], a["layer_bcast_ms_per_param"]
        # the broadcast (rate 1) ends first: both = bcast + (fwd - rc * bcast)
        return (fwd + bcast - a[f"overlap_fwd+bcast_ms_S{tokens}"]) / bcast, 1.0
    row = costs.load("h200_contention_1gpu")[f"S{tokens}"]
    copy = row["sm16" if source == "sm16_1gpu" else "ce"]
    rc, rb = _two_streams(row["fwd_alone_ms"], copy["transfer_alone_ms"], copy["fwd_with_transfer_ms"],
                          copy["transfer_with_fwd_ms"])
    return min(1.0, rc), min(1.0, rb)
