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
One async broadcast per parameter costs host time per call and leaves the
link idle between small messages. Measured with a torch+NCCL stand-in of our
pattern on 2x H200 (paddle_overlay ``benchmarks/data/h200_issue_strategy.json``, 32 LLaMA-7B layers), one
broadcast per (layer, owner) bucket whose parameters *live* in one buffer
exposes 19 / 14-16 ms instead of 27-28 / 21-22 ms (1k / 4k tokens) and
issues in 3.2 ms instead of 12.4 ms; copying parameters into a separate
bucket every step gives most of that back. So a bucket's parameters become
views into the bucket's buffer, as Paddle's tensor fusion does
(``tensor_fusion_helper.ShardingGradView._share_param_buffer``,
``group_sharded_storage.ParamStorage._add_param_as_view``: copy the value
into ``buffer._slice(begin, end)``, ``_share_buffer_to(param)``, then
``param.get_tensor()._set_dims(shape)``). The parameter objects, their
names, ``stop_gradient`` and the optimizer's state keyed by name stay as
they were; only the memory under them moves, once.

This module has one job: given the agreed broadcast order, say which
parameters share a bucket (:func:`plan_buckets`, pure and the same on every
rank) and move them into contiguous storage (:class:`BucketStorage`). It
never communicates; ``StageOneBroadcastOverlap`` launches
:meth:`BucketStorage.units` and waits for them.

Planning (:func:`plan_buckets`) walks the agreed order, adds each bucketable
parameter to the current window and closes the window once it holds at least
the cap (the rule of the stand-in sweep, ``benchmarks/data/h200_bucket_sweep.json``). Inside a
window each (owner rank, dtype) gets one bucket, in the order of its first
parameter. Not bucketed: frozen parameters (``stop_gradient=True`` at
planning; never broadcast, as in the per-parameter path), a repeat of a
tensor already placed (tied: one slot, under its first position in the
order), and empty tensors.

With Paddle's tensor fusion (``sharding_configs.tensor_fusion``) the
parameters already live in per-rank fused buffers; :func:`plan_fused_slices`
uses the same windows and sends, per window and buffer, one slice per run of
neighbouring parameters (:meth:`BucketStorage.use_views`); nothing moves.

Storage: each parameter's slot starts at a multiple of ``ALIGN_BYTES``
(256 bytes, Paddle's fused-buffer alignment for GPUs, so views keep the
alignment vectorised kernels expect); padding is zero and travels with the
broadcast. Lengths depend only on shapes and dtypes, so every rank computes
the same ones.

Staleness: a parameter whose memory was replaced after bucketing
(``model.to(dtype=...)``, ``param.get_tensor()._share_data_with(...)`` or
any other path that gives it a new allocation) no longer points into its
slot. :meth:`BucketStorage.replaced` notices that (one ``data_ptr()``
compare per parameter, cheap); the owner then agrees across the sharding
group that some rank saw a replacement and every rank plans and moves its
buckets afresh from the parameters' current memory, so no rank ever sends
a bucket another rank no longer has. ``set_value``/``set_state_dict`` copy
in place and keep the views (checked on Paddle 2.6.2 and 3.3.1); a loader
that hands new tensors (``_share_data_with``) is such a replacement.

Default cap, ``DEFAULT_BUCKET_SIZE_MB = 256``, from the stand-in sweep
(``benchmarks/data/h200_bucket_sweep.json``, 2x H200, two runs): exposed broadcast per
parameter 28.5-31.1 ms (1k tokens) and 17.0-20.9 ms (4k); at 256 MB
21.4-21.5 ms and 11.0-12.9 ms with 86 broadcasts instead of 288. 256 MB is
the lowest exposure at 4k tokens in both runs (512 MB: 11.6-14.5, 1024 MB:
12.9-14.3); larger caps still help at 1k (512 MB 19.7-19.9 ms) but make the
first layer wait for a larger first bucket and vary more at 4k. Caps of 32 MB
or less change almost nothing (257 of 288 broadcasts) because most LLaMA-7B
weights are 32-86 MB on their own. 256 MB is also Paddle's own default for
fused buffers (``sharding_configs.comm_buffer_size_MB``).
"""

import collections
import math

import paddle

from .comm_unit import CommUnit

__all__ = [
    "ALIGN_BYTES",
    "plan_fused_slices",
    "DEFAULT_BUCKET_SIZE_MB",
    "BucketSpec",
    "BucketStorage",
    "check_bucket_size_mb",
    "plan_buckets",
]

DEFAULT_BUCKET_SIZE_MB = 256
ALIGN_BYTES = 256

_ITEMSIZE = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}


def dtype_name(dtype):
    """str: ``paddle.float32`` / ``VarType.FP32`` / ``'float32'`` ->
    ``'float32'`` (rank-independent; used as a bucket key)."""
    name = str(dtype)
    for prefix in ("paddle.", "VarType.", "DataType."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    name = name.lower()
    return {
        "fp16": "float16",
        "bf16": "bfloat16",
        "fp32": "float32",
        "fp64": "float64",
    }.get(name, name)


def itemsize(dtype):
    """int: bytes per element of ``dtype``.

    Raises:
        ValueError: a dtype this module does not know.
    """
    name = dtype_name(dtype)
    if name not in _ITEMSIZE:
        raise ValueError(f"broadcast buckets: unsupported dtype {dtype}.")
    return _ITEMSIZE[name]


def _numel(param):
    n = 1
    for d in param.shape:
        n *= int(d)
    return n


def check_bucket_size_mb(bucket_size_mb):
    """Raise ``TypeError``/``ValueError`` unless ``bucket_size_mb`` is a
    non-negative int or float (MB = 2**20 bytes; 0 means per-parameter).

    Returns:
        int: the cap in bytes (0 for per-parameter).
    """
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


BucketSpec = collections.namedtuple(
    "BucketSpec",
    ["window", "src", "dtype", "indices", "offsets", "numels", "length"],
)
BucketSpec.__doc__ = """One bucket of the plan.

    window (int): the window it was closed in (0, 1, ...).
    src (int): global rank that owns and broadcasts every parameter in it.
    dtype (str): the dtype name of its buffer and of all its parameters.
    indices (tuple[int]): positions in the optimizer's parameter list, in the
        agreed broadcast order.
    offsets (tuple[int]): element offset of each parameter's slot in the
        buffer (each a multiple of ``ALIGN_BYTES`` / itemsize).
    numels (tuple[int]): elements of each parameter.
    length (int): elements of the buffer, padding included.
"""


def plan_buckets(
    order, params, src_ranks, cap_bytes, align_bytes=ALIGN_BYTES, alone=()
):
    """Group parameters into broadcast buckets (no memory is touched).

    Args:
        order (list[int]): the agreed broadcast order, a permutation of
            ``range(len(params))``.
        params (list): the optimizer's parameter list; only ``.shape``,
            ``.dtype`` and ``.stop_gradient`` are read.
        src_ranks (list[int]): owner (global rank) of each entry of ``params``.
        cap_bytes (int): a window closes once it holds at least this many
            bytes (> 0).
        align_bytes (int): each slot starts at a multiple of this many bytes.
        alone (iterable[int]): positions never bucketed (the owner passes
            the parameters no layer owns: they are waited right after their
            launch, and a bucket holding one would lose its overlap).

    Returns:
        list[BucketSpec]: in launch order (window, then first parameter).
        Positions in ``alone``, tied repeats, frozen and empty parameters are
        in none.

    Raises:
        ValueError: ``order`` is not a permutation of the parameter
            positions, the lengths differ, or ``cap_bytes`` <= 0.

    The result depends only on the arguments' values (positions, shapes,
    dtypes, ``stop_gradient``, ranks): every rank gets the same plan from the
    same agreed order. Object identity is used only to spot a tensor that
    appears twice, which keeps its first position in ``order``.
    """
    specs = []
    for window_no, window in enumerate(
        _windows(order, params, src_ranks, cap_bytes, alone)
    ):
        groups = {}  # (src, dtype) -> [indices], insertion = first use
        for i in window:
            key = (src_ranks[i], dtype_name(params[i].dtype))
            groups.setdefault(key, []).append(i)
        for (src, dtype), indices in groups.items():
            unit = max(align_bytes // itemsize(dtype), 1)
            offsets, numels, fill = [], [], 0
            for i in indices:
                numel = _numel(params[i])
                offsets.append(fill)
                numels.append(numel)
                fill += -(-numel // unit) * unit
            specs.append(
                BucketSpec(
                    window_no,
                    src,
                    dtype,
                    tuple(indices),
                    tuple(offsets),
                    tuple(numels),
                    fill,
                )
            )
    return specs


def _windows(order, params, src_ranks, cap_bytes, alone):
    """Yield the windows (lists of positions, in ``order``) of the
    bucketable parameters; see :func:`plan_buckets` for the rule and the
    errors raised."""
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
    placed = set()  # id() of tensors already given a slot (tied repeats)
    alone = frozenset(alone)
    window, window_bytes = [], 0
    for i in order:
        param = params[i]
        if (
            i in alone
            or param.stop_gradient
            or id(param) in placed
            or _numel(param) == 0
        ):
            continue
        placed.add(id(param))
        window.append(i)
        window_bytes += _numel(param) * itemsize(param.dtype)
        if window_bytes >= cap_bytes:
            yield window
            window, window_bytes = [], 0
    if window:
        yield window


def plan_fused_slices(order, params, src_ranks, cap_bytes, storages, alone=()):
    """Plan broadcasts of slices of buffers the parameters already live in
    (Paddle's tensor fusion, ``sharding_configs.tensor_fusion``: one fused
    1-D buffer per owner rank and group, built by
    ``tensor_fusion_helper.fused_parameters``). Nothing is moved.

    Windows as in :func:`plan_buckets`. Inside a window, the parameters of
    one buffer are sorted by position in it and split into runs of
    neighbours (no other parameter's slot between them); each run is one
    slice, so no memory is sent twice and nothing outside the window is
    sent early.

    Args:
        order, params, src_ranks, cap_bytes, alone: as :func:`plan_buckets`.
        storages (list[paddle.Tensor]): the fused 1-D buffers (every rank's,
            the same list on every rank).

    Returns:
        list[tuple[BucketSpec, int, int]]: per slice, in launch order: its
        spec (offsets relative to the slice start), the index of its buffer
        in ``storages`` and the slice's first element in that buffer.

    Raises:
        ValueError: a bucketable parameter lies in none of ``storages``, or
            in one of another dtype (not the layout tensor fusion builds).

    Positions come from ``data_ptr()`` differences: the same on every rank,
    since every rank builds the same fused layout.
    """
    starts = [t.data_ptr() for t in storages]
    ends = [
        t.data_ptr() + int(t._numel()) * itemsize(t.dtype) for t in storages
    ]
    where = {}  # position -> (storage index, element offset)
    for window in _windows(order, params, src_ranks, cap_bytes, alone):
        for i in window:
            ptr = params[i].data_ptr()
            k = next(
                (k for k in range(len(storages)) if starts[k] <= ptr < ends[k]),
                None,
            )
            if k is None or dtype_name(storages[k].dtype) != dtype_name(
                params[i].dtype
            ):
                raise ValueError(
                    f"parameter {params[i].name} does not live in a fused "
                    "buffer of its dtype; tensor fusion did not place it."
                )
            where[i] = (k, (ptr - starts[k]) // itemsize(params[i].dtype))
    # each slot's rank inside its buffer, to find neighbours
    rank_in_buffer = {}
    for k in range(len(storages)):
        slots = sorted((off, i) for i, (kk, off) in where.items() if kk == k)
        rank_in_buffer.update({i: r for r, (_, i) in enumerate(slots)})
    plan = []
    for window_no, window in enumerate(
        _windows(order, params, src_ranks, cap_bytes, alone)
    ):
        runs = []  # [(k, [positions by offset])], first use order
        by_buffer = {}
        for i in window:
            by_buffer.setdefault(where[i][0], []).append(i)
        for k, indices in by_buffer.items():
            indices.sort(key=lambda i: where[i][1])
            run = [indices[0]]
            for i in indices[1:]:
                if rank_in_buffer[i] == rank_in_buffer[run[-1]] + 1:
                    run.append(i)
                else:
                    runs.append((k, run))
                    run = [i]
            runs.append((k, run))
        first = {i: n for n, i in enumerate(window)}
        runs.sort(key=lambda kr: min(first[i] for i in kr[1]))
        for k, run in runs:
            begin = where[run[0]][1]
            numels = tuple(_numel(params[i]) for i in run)
            offsets = tuple(where[i][1] - begin for i in run)
            plan.append(
                (
                    BucketSpec(
                        window_no,
                        src_ranks[run[0]],
                        dtype_name(storages[k].dtype),
                        tuple(run),
                        offsets,
                        numels,
                        offsets[-1] + numels[-1],
                    ),
                    k,
                    begin,
                )
            )
    return plan


class BucketStorage:
    """Contiguous storage for planned buckets, and the units to launch.

    Args:
        specs (list[BucketSpec]): from :func:`plan_buckets`.
        params (list[paddle.Tensor]): the optimizer's parameter list (the
            same list the plan was made from).
        src_ranks (list[int]): owner of each parameter.
        order (list[int]): the agreed broadcast order (units are returned in
            it).

    Raises:
        ValueError: a spec does not match the parameters (dtype, size, or a
            position in two buckets): the plan is from another list.

    The constructor only checks; :meth:`materialize` moves the parameters.
    """

    def __init__(self, specs, params, src_ranks, order):
        seen = set()
        for spec in specs:
            for i, numel in zip(spec.indices, spec.numels):
                p = params[i]
                if (
                    i in seen
                    or dtype_name(p.dtype) != spec.dtype
                    or _numel(p) != numel
                ):
                    raise ValueError(
                        f"bucket plan does not match parameter {i} "
                        f"({getattr(p, 'name', '?')}): plan it from this list."
                    )
                seen.add(i)
        self._specs = list(specs)
        self._params = list(params)
        self._src_ranks = list(src_ranks)
        self._order = list(order)
        self._rank_in_order = {i: k for k, i in enumerate(self._order)}
        self._buffers = []  # one 1-D tensor per spec, after materialize()
        # position -> data_ptr() of its slot, for every bucketed parameter
        self._slot_ptr = {}
        self._bucket_of = {i: b for b, s in enumerate(specs) for i in s.indices}
        # position -> number of elements of its slot
        self._slot_numel = {
            i: n for s in specs for i, n in zip(s.indices, s.numels)
        }
        # tied repeats: position -> position of the tensor's slot
        first_pos = {}
        self._alias_of = {}
        for i in self._order:
            j = first_pos.setdefault(id(self._params[i]), i)
            if j != i:
                self._alias_of[i] = j
        # positions with no slot of their own: sent alone while trainable
        self._unslotted = [
            i
            for i in self._order
            if i not in self._alias_of and i not in self._bucket_of
        ]
        self._units = None

    # ------------------------------------------------------------------
    @property
    def specs(self):
        """list[BucketSpec]: the plan."""
        return list(self._specs)

    @property
    def buffers(self):
        """list[paddle.Tensor]: the 1-D bucket buffers (after materialize)."""
        return list(self._buffers)

    def bucket_of(self, index):
        """int | None: the bucket holding position ``index`` (a tied repeat
        answers for its slot), None if it has no slot."""
        return self._bucket_of.get(self._alias_of.get(index, index))

    # ------------------------------------------------------------------
    def materialize(self):
        """Move every bucketed parameter into its bucket's buffer.

        Per bucket: allocate a zeroed 1-D buffer of ``spec.length`` elements
        on the parameters' place, copy each value into its slot and make the
        parameter a view of the slot. A parameter's old memory is freed when
        it is re-pointed, so the peak is the parameters plus one bucket.
        Call once, with no broadcast pending and no autograd in flight.
        """
        assert not self._buffers, "materialize() called twice"
        with paddle.no_grad():
            for spec in self._specs:
                first = self._params[spec.indices[0]]
                buffer = paddle.zeros([spec.length], dtype=first.dtype)
                if str(buffer.place) != str(first.place):
                    buffer = buffer._copy_to(first.place, True)
                for i, offset, numel in zip(
                    spec.indices, spec.offsets, spec.numels
                ):
                    param = self._params[i]
                    shape = list(param.shape)
                    view = buffer._slice(offset, offset + numel)
                    paddle.assign(param.reshape([numel]), view)
                    view._share_buffer_to(param)
                    param.get_tensor()._set_dims(shape)
                    self._slot_ptr[i] = param.data_ptr()
                self._buffers.append(buffer)
        self._units = None

    def use_views(self, buffers):
        """Adopt ``buffers`` (one 1-D tensor per spec, e.g. slices of fused
        storage from :func:`plan_fused_slices`) in which the parameters
        already live; nothing is copied.

        Raises:
            ValueError: a parameter is not at its spec's offset in its buffer.
        """
        assert not self._buffers, "storage already set"
        for spec, buffer in zip(self._specs, buffers):
            size = itemsize(spec.dtype)
            for i, offset in zip(spec.indices, spec.offsets):
                if (
                    self._params[i].data_ptr()
                    != buffer.data_ptr() + offset * size
                ):
                    raise ValueError(
                        f"parameter {self._params[i].name} is not at element "
                        f"{offset} of its planned buffer."
                    )
                self._slot_ptr[i] = self._params[i].data_ptr()
        self._buffers = list(buffers)
        self._units = None

    # ------------------------------------------------------------------
    def replaced(self):
        """list[int]: positions of bucketed parameters whose memory is no
        longer their slot (replaced since planning), in order position.

        Raises:
            RuntimeError: a bucketed parameter was resized in place (see
                :meth:`_check_slot_sizes`).
        """
        self._check_slot_sizes()
        params = self._params
        return sorted(
            (
                i
                for i, ptr in self._slot_ptr.items()
                if params[i].data_ptr() != ptr
            ),
            key=self._rank_in_order.get,
        )

    def units(self, group):
        """The collectives of one launch, in the agreed order.

        Args:
            group: the sharding process group the units broadcast over.

        Returns:
            list[CommUnit]: one broadcast per bucket (the whole buffer,
            always sent), then, in order position, one per parameter outside
            any bucket that is trainable now (frozen at planning and
            unfrozen since). Sorted by the order position of each unit's
            first index; the same list is returned while nothing changed, so
            a caller may cache per-list tables.
        """
        assert self._buffers or not self._specs, "materialize() first"
        loose = self._loose_trainable()
        if self._units is not None and loose == self._units_loose:
            return self._units
        self._units = self._build_units(loose, group)
        self._units_loose = loose
        return self._units

    def _check_slot_sizes(self):
        """Raise if a bucketed parameter changed its number of elements in
        place (``paddle.assign(bigger, param)``, ``param.copy_(bigger)``):
        its memory is still the slot, so the write ran past the slot into
        the next parameter's; nothing may be broadcast from that bucket.

        Raises:
            RuntimeError: names the parameter, its slot size and its size.
        """
        params, numel_of = self._params, self._slot_numel
        for i in self._slot_ptr:
            numel = math.prod(params[i].shape)
            if numel != numel_of[i]:
                raise RuntimeError(
                    f"broadcast buckets: parameter {params[i].name} now has "
                    f"{numel} elements but its bucket slot holds "
                    f"{numel_of[i]}: it was resized in place while bucketed, "
                    "so the write overran the slot into its neighbours. "
                    "Change a parameter's shape only with overlap off "
                    "(_set_broadcast_overlap(False)), or use "
                    "bucket_size_mb=0."
                )

    def _loose_trainable(self):
        """tuple[int]: positions without a slot that must be sent now."""
        params = self._params
        return tuple(i for i in self._unslotted if not params[i].stop_gradient)

    def _build_units(self, loose, group):
        aliases = collections.defaultdict(list)  # slot position -> repeats
        for i, j in self._alias_of.items():
            aliases[j].append(i)
        rank_of = self._rank_in_order.get
        units = []
        for b, spec in enumerate(self._specs):
            covered = tuple(
                k
                for i in spec.indices
                for k in [i] + sorted(aliases[i], key=rank_of)
            )
            unit = CommUnit(
                "broadcast",
                self._buffers[b],
                covered,
                [self._params[i] for i in spec.indices],
                group,
                src=spec.src,
                always=True,
                label=f"bucket{b}",
            )
            units.append((rank_of(spec.indices[0]), unit))
        for i in loose:
            covered = (i, *sorted(aliases[i], key=rank_of))
            unit = CommUnit(
                "broadcast",
                self._params[i],
                covered,
                [self._params[i]],
                group,
                src=self._src_ranks[i],
                label=self._params[i].name,
            )
            units.append((rank_of(i), unit))
        units.sort(key=lambda item: item[0])
        return [unit for _, unit in units]
