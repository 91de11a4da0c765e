# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Broadcast buckets for sharding stage 1: planning and contiguous storage.

NOTE [broadcast buckets]
A bucket's parameters become views into its 1-D buffer, once, as Paddle's
tensor fusion does (``ShardingGradView._share_param_buffer``); parameter
objects, names and optimizer state stay. Planning is pure, the same on every
rank: windows of the agreed order closed at the cap, one bucket per
(window, owner rank, dtype), slots aligned to ``ALIGN_BYTES``; frozen, tied
repeats and empty tensors get none. With tensor fusion buckets are slices of
Paddle's fused buffers. Memory replaced under a parameter later is put back
into its slot at the next launch, locally (no collective); a dtype or size
change is refused before anything is sent. The 256 MB default is Paddle's
own for fused buffers (``comm_buffer_size_MB``); one broadcast per
parameter leaves the link idle between small messages.
"""

import collections
import math
import os

import paddle

__all__ = []

# the cap when none is given: FLAGS_sharding_overlap_bucket_size_mb, else
# Paddle's own comm_buffer_size_MB default
DEFAULT_BUCKET_SIZE_MB = 256
ALIGN_BYTES = 256

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_ITEMSIZE.update(int8=1, uint8=1, int16=2, int32=4, int64=8, bool=1)
_ITEMSIZE.update(complex64=8, complex128=16)
_SHORT_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def dtype_name(dtype):
    """``paddle.float32`` / ``VarType.FP32`` / ``'float32'`` -> ``'float32'``."""
    name = str(dtype).rsplit(".", 1)[-1].lower()
    return _SHORT_NAMES.get(name, "float64" if name == "fp64" else name)


def itemsize(dtype):
    name = dtype_name(dtype)
    if name not in _ITEMSIZE:
        raise ValueError(f"broadcast buckets: unsupported dtype {dtype}.")
    return _ITEMSIZE[name]


def numel_of(param):
    return math.prod(int(d) for d in param.shape)


def check_bucket_size_mb(bucket_size_mb=None):
    """The cap in bytes (0: one broadcast per parameter) of
    ``bucket_size_mb`` (int | float, MB = 2**20 bytes; None: the environment
    variable ``FLAGS_sharding_overlap_bucket_size_mb``, else
    :data:`DEFAULT_BUCKET_SIZE_MB`); TypeError if not a number, ValueError
    if negative, not finite, or under one byte."""
    if bucket_size_mb is None:
        flag = "FLAGS_sharding_overlap_bucket_size_mb"
        raw = os.getenv(flag, str(DEFAULT_BUCKET_SIZE_MB))
        try:
            bucket_size_mb = float(raw)
        except ValueError:
            raise ValueError(
                f"{flag} must be a number of MB (0 for one broadcast per "
                f"parameter), got {raw!r}."
            ) from None
    if isinstance(bucket_size_mb, bool) or not isinstance(
        bucket_size_mb, (int, float)
    ):
        raise TypeError(
            "bucket_size_mb must be a number of MB (int or float, 0 for one "
            f"broadcast per parameter), got {type(bucket_size_mb).__name__}."
        )
    if not bucket_size_mb >= 0 or bucket_size_mb == float("inf"):
        raise ValueError(
            "bucket_size_mb must be finite and >= 0 (0: one broadcast per "
            f"parameter), got {bucket_size_mb}."
        )
    cap = int(bucket_size_mb * (1 << 20))
    if bucket_size_mb > 0 and cap == 0:
        raise ValueError(
            f"bucket_size_mb={bucket_size_mb} is below one byte; use 0 for "
            "one broadcast per parameter, or a cap of at least 1e-6 MB."
        )
    return cap


# offsets, numels and length (padding included) in elements
BucketSpec = collections.namedtuple(
    "BucketSpec", "window src dtype indices offsets numels length"
)


def plan_buckets(
    order,
    params,
    src_ranks,
    cap_bytes,
    align_bytes=ALIGN_BYTES,
    alone=(),
    lead=0,
):
    """list[BucketSpec] in launch order, no memory touched; ``alone`` (no
    layer waits for them): never bucketed; no window spans the first
    ``lead`` positions of ``order`` and the rest. ValueError: ``order`` not
    a permutation, lengths differ, cap <= 0."""
    specs = []
    windows = _windows(order, params, src_ranks, cap_bytes, alone, lead)
    for window_no, window in enumerate(windows):
        groups = {}  # (src, dtype) -> [indices], in first-use order
        for i in window:
            key = (src_ranks[i], dtype_name(params[i].dtype))
            groups.setdefault(key, []).append(i)
        for (src, dtype), indices in groups.items():
            unit = max(align_bytes // itemsize(dtype), 1)
            numels = tuple(numel_of(params[i]) for i in indices)
            offsets, fill = [], 0
            for numel in numels:
                offsets.append(fill)
                fill += -(-numel // unit) * unit
            spec = (window_no, src, dtype, tuple(indices), tuple(offsets))
            specs.append(BucketSpec(*spec, numels, fill))
    return specs


def _windows(order, params, src_ranks, cap_bytes, alone, lead=0):
    n = len(params)
    if len(src_ranks) != n:
        raise ValueError(
            f"got {n} parameters but {len(src_ranks)} source ranks."
        )
    if sorted(order) != list(range(n)):
        raise ValueError(
            f"order must be a permutation of range({n}) (positions in the "
            "optimizer's parameter list)."
        )
    if not isinstance(cap_bytes, int) or cap_bytes <= 0:
        raise ValueError(
            f"cap_bytes must be a positive int, got {cap_bytes!r}."
        )
    placed, alone = set(), frozenset(alone)  # placed: id() of tied tensors
    windows, window, window_bytes = [], [], 0
    for k, i in enumerate(order):
        if k == lead and window:  # the first part ends: close its window
            windows.append(window)
            window, window_bytes = [], 0
        param = params[i]
        numel = numel_of(param)
        if (
            i in alone
            or param.stop_gradient
            or id(param) in placed
            or not numel
        ):
            continue
        placed.add(id(param))
        window.append(i)
        window_bytes += numel * itemsize(param.dtype)
        if window_bytes >= cap_bytes:
            windows.append(window)
            window, window_bytes = [], 0
    return windows + [window] if window else windows


def plan_fused_slices(
    order, params, src_ranks, cap_bytes, storages, alone=(), lead=0
):
    """[(spec, buffer index, first element)]: slices of Paddle's fused
    ``storages``, one per run of neighbours in a window (windows as in
    :func:`plan_buckets`); ValueError if a parameter lies in no buffer of
    its dtype."""
    bounds = [(t.data_ptr(), end_ptr(t)) for t in storages]
    windows = _windows(order, params, src_ranks, cap_bytes, alone, lead)
    where = {}  # position -> (storage index, element offset)
    for i in (i for window in windows for i in window):
        ptr = params[i].data_ptr()
        k = next((k for k, (lo, hi) in enumerate(bounds) if lo <= ptr < hi), -1)
        if k < 0 or dtype_name(storages[k].dtype) != dtype_name(
            params[i].dtype
        ):
            raise ValueError(
                f"parameter {params[i].name} does not live in a fused "
                "buffer of its dtype; tensor fusion did not place it."
            )
        where[i] = (k, (ptr - bounds[k][0]) // itemsize(params[i].dtype))
    slot_rank = {i: r for r, i in enumerate(sorted(where, key=where.get))}
    plan = []
    for window_no, window in enumerate(windows):
        runs = []  # [positions], neighbours in one buffer, by offset
        for i in sorted(window, key=where.get):
            last = runs[-1][-1] if runs else None
            if (
                last is not None
                and where[last][0] == where[i][0]
                and (slot_rank[i] == slot_rank[last] + 1)
            ):
                runs[-1].append(i)
            else:
                runs.append([i])
        first = {i: n for n, i in enumerate(window)}
        for run in sorted(runs, key=lambda run: min(map(first.get, run))):
            k, begin = where[run[0]]
            numels = tuple(numel_of(params[i]) for i in run)
            offsets = tuple(where[i][1] - begin for i in run)
            head = (window_no, src_ranks[run[0]], dtype_name(storages[k].dtype))
            length = offsets[-1] + numels[-1]
            spec = BucketSpec(*head, tuple(run), offsets, numels, length)
            plan.append((spec, k, begin))
    return plan


def changed_param_error(param, was, now, method):
    """ValueError for a parameter whose dtype or size changed after the
    first step (``was``/``now``: ``(dtype name, elements)``)."""
    return ValueError(
        f"parameter sync overlap: parameter {param.name} changed from "
        f"{was[0]} x {was[1]} elements to {now[0]} x {now[1]} elements "
        "after the first step planned its collectives (e.g. model.to(dtype=...)); "
        "every rank would no longer send the same collectives. Turn the "
        f"overlap off (optimizer.{method}(False)), change the model, then "
        "turn it on again. Nothing was sent."
    )


def end_ptr(tensor):
    return tensor.data_ptr() + int(tensor._numel()) * itemsize(tensor.dtype)


class BucketStorage:
    """Storage for planned buckets (set by :meth:`materialize` or
    :meth:`use_views`): each bucketed parameter a view of its slot."""

    def __init__(self, specs, params, src_ranks, order):
        self._slot_of = {}  # position -> (bucket, offset, elements)
        for b, spec in enumerate(specs):
            for i, offset, numel in zip(
                spec.indices, spec.offsets, spec.numels
            ):
                p = params[i]
                same = (dtype_name(p.dtype), numel_of(p)) == (spec.dtype, numel)
                if i in self._slot_of or not same:
                    raise ValueError(
                        f"bucket plan does not match parameter {i} "
                        f"({getattr(p, 'name', '?')}): plan it from this list."
                    )
                self._slot_of[i] = (b, offset, numel)
        self._specs = list(specs)
        self._params = list(params)
        self._src_ranks = list(src_ranks)
        self._rank_in_order = {i: k for k, i in enumerate(order)}
        self._buffers = []  # one 1-D tensor per spec
        self._slot_ptr = {}  # position -> data_ptr() of its slot
        # tied repeats: position -> position of the tensor's slot
        first_pos, self._alias_of = {}, {}
        for i in order:
            j = first_pos.setdefault(id(self._params[i]), i)
            if j != i:
                self._alias_of[i] = j
        # positions with no slot of their own: sent alone while trainable
        self._unslotted = [
            i
            for i in order
            if i not in self._alias_of and i not in self._slot_of
        ]

    @property
    def specs(self):
        return list(self._specs)

    @property
    def buffers(self):
        return list(self._buffers)

    def bucket_of(self, index):
        """int | None: the bucket holding position ``index`` (or its tie)."""
        slot = self._slot_of.get(self._alias_of.get(index, index))
        return None if slot is None else slot[0]

    def materialize(self):
        """Move each bucketed parameter into its zeroed bucket buffer and make
        it a view of its slot (peak: the parameters plus one bucket)."""
        assert not self._buffers, "materialize() called twice"
        for spec in self._specs:
            first = self._params[spec.indices[0]]
            buffer = paddle.zeros([spec.length], dtype=first.dtype)
            if str(buffer.place) != str(first.place):
                buffer = buffer._copy_to(first.place, True)
            for i, offset, numel in zip(
                spec.indices, spec.offsets, spec.numels
            ):
                param = self._params[i]
                _bind(param, buffer._slice(offset, offset + numel), numel)
                self._slot_ptr[i] = param.data_ptr()
            self._buffers.append(buffer)

    def use_views(self, buffers):
        """Adopt ``buffers`` (fused slices the parameters already live in);
        ValueError if a parameter is not at its spec's offset."""
        assert not self._buffers, "storage already set"
        for spec, buffer in zip(self._specs, buffers):
            size = itemsize(spec.dtype)
            for i, offset in zip(spec.indices, spec.offsets):
                ptr = self._params[i].data_ptr()
                if ptr != buffer.data_ptr() + offset * size:
                    raise ValueError(
                        f"parameter {self._params[i].name} is not at element "
                        f"{offset} of its planned buffer."
                    )
                self._slot_ptr[i] = ptr
        self._buffers = list(buffers)

    def rebind(self, method):
        """Put every bucketed parameter whose memory was replaced since
        (``_share_buffer_to``, a loader sharing new memory) back into its
        slot, copying its value: local, nothing to agree. Returns the
        positions rebound. ValueError (nothing changed) if a parameter's
        dtype or size is no longer its slot's (``method``: the optimizer
        method to name in the fix)."""
        params, moved = self._params, []
        for i, ptr in self._slot_ptr.items():
            param = params[i]
            b, offset, numel = self._slot_of[i]
            was = (self._specs[b].dtype, numel)
            now = (dtype_name(param.dtype), numel_of(param))
            if now != was:
                raise changed_param_error(param, was, now, method)
            if param.data_ptr() != ptr:
                moved.append(i)
        for i in moved:
            b, offset, numel = self._slot_of[i]
            view = self._buffers[b]._slice(offset, offset + numel)
            _bind(params[i], view, numel)
            self._slot_ptr[i] = params[i].data_ptr()
        return moved

    @property
    def params(self):
        return self._params

    @property
    def src_ranks(self):
        return self._src_ranks

    @property
    def rank_in_order(self):
        """dict[int, int]: position -> its rank in the agreed order."""
        return self._rank_in_order

    @property
    def alias_of(self):
        """dict[int, int]: tied repeat position -> its slot's position."""
        return self._alias_of

    @property
    def unslotted(self):
        """list[int]: positions with no slot (frozen at planning, alone,
        empty), in order: sent alone while trainable."""
        return self._unslotted


def _bind(param, view, numel):
    # Paddle's tensor fusion (ShardingGradView._share_param_buffer): copy the
    # value in, share the slot's memory, keep the parameter's shape
    with paddle.no_grad():
        shape = list(param.shape)
        paddle.assign(param.reshape([numel]), view)
        view._share_buffer_to(param)
        param.get_tensor()._set_dims(shape)
