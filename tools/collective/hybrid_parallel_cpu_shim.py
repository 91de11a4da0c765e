# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Test-only shims: run Paddle's hybrid-parallel layers and tensor fusion on
CPU ranks (gloo). Never for training, never part of the Paddle patch.

The one place where the collective tests, the benchmarks and the examples
work around what Paddle's CPU build lacks. It lives in ``tools/collective/``
and is imported by name, ``import hybrid_parallel_cpu_shim``, as
``blocking_calls`` beside it: that folder is on pytest's path
(``pyproject.toml``), on the runner's, and on every rank's ``PYTHONPATH``
that ``collective_launch.launch_collective`` starts; a launch of your own
(a benchmark, the PaddleFormers example) puts it there with
``PYTHONPATH=tools/collective``.

:func:`install` does nothing when Paddle is compiled with CUDA and the ranks
use GPUs; on CPU it replaces, for the test process only:

1. ``paddle.distributed.new_group`` -> the same call between two barriers
   of the global group, and the global group itself for a group of every
   rank. Why: ``fleet.init`` creates every sub-group (pipe, data, model,
   sharding, check) back to back; on gloo, concurrent full-mesh
   connections of different groups on 4 ranks fail at random
   (``pair.cc TIMEOUT``, ``Connection refused``), and a second gloo
   context over all ranks (the "check" group; on 2 ranks also the
   sharding group) reads the first one's rendezvous keys and fails at
   random (``address.cc ... sizeof(impl_) == bytes.size()``,
   ``Connection refused`` under load); and (1b) each sub-group's gloo
   rendezvous through a TCP store of its own (Paddle's ``ProcessGroupGloo``
   reads the launch's one store without a per-group prefix: on 8 ranks
   groups of 2 or 4 failed in 7 of 8 launches).
2. ``ParallelEnv._device_id`` -> a class default of 0. Why:
   ``PipelineLayer.__init__`` reads ``ParallelEnv().device_id``, which is
   only set when a GPU/XPU device is selected; on CPU the attribute is
   missing and the constructor raises ``AttributeError``.
3. ``mp_ops._c_identity`` and ``mp_ops._mp_allreduce`` of the
   model-parallel layers (``paddle.distributed.fleet.layers.mpu``) -> the
   same maths with ``paddle.distributed.all_reduce`` in a PyLayer
   (identity forward / all-reduced gradient, and all-reduced forward /
   identity gradient). Why: the CPU build has no ``c_identity`` kernel and
   gloo has no all-reduce "on calc stream".
4. ``tensor_parallel.broadcast_input_data`` (``TensorParallel`` sends each
   forward's inputs from the model-parallel source rank) -> the same
   broadcast of each input tensor over the model-parallel group. Why:
   Paddle's version asserts a GPU/XPU/custom device.
5. ``p2p_communication.batch_send_recv_on_calc_stream`` (pipeline p2p) ->
   ``paddle.distributed.isend``/``irecv`` of each op (sends towards higher
   ranks first), then a wait for all. Why: gloo has no send/recv "on calc
   stream", and its send/recv block until matched. Paddle 3.x also offers
   ``pp_configs.use_batch_p2p_comm = False`` (isend/irecv), which the tests
   set; Paddle 2.6 always batches.

and :func:`cpu_tensor_fusion` (item 6, a context manager around building
the optimizer) lets ``sharding_configs.tensor_fusion`` build its fused
buffers on the CPU.

Sharding stage 1 V2 (``sharding_configs.split_param = True``,
``DygraphShardingOptimizerV2``), items 7 to 9 (7 by :func:`install`, 8 and 9
around every build of V2's comm buffers, and 8 for the block of
:func:`cpu_sharding_v2`, a context manager around ``fleet.distributed_model``
and ``fleet.distributed_optimizer``):

7. ``paddle.distributed.reduce_scatter`` -> an all-reduce (sum) of a copy of
   the input over the group, then this rank's slice copied into the output
   in place. Why: V2 reduces each comm buffer's gradients with
   ``reduce_scatter`` and gloo has none (``ProcessGroupGLOO does not support
   reduce_scatter with sync_op flag``). Same bits: on 2 ranks every element
   is one addition ``a + b`` whichever collective computes it, and IEEE
   addition is commutative. On 4 ranks the order of the three additions is
   the algorithm's, so the bits may differ from a GPU reduce-scatter; the
   on-vs-off comparisons run this same emulation on both sides (gloo's
   all-reduce gives every rank the same values), so they stay exact. The
   input is left as it was (reduce-scatter does not change it); the
   returned task has already finished.
8. ``tensor_fusion_helper.get_current_device_type`` (Paddle 3.x) -> "cpu",
   with the GPU's 256-byte alignment. Why: building V2's comm buffers pads
   each parameter by the device's alignment and Paddle 3.x asserts a
   GPU/NPU/XPU (``tensor fusion helper now only support dict_keys(['gpu',
   'npu', 'xpu']), but got device unknown instead``). Paddle 2.6 pads with
   ``alignment["gpu"]`` whatever the device and needs nothing here (its
   hard-coded ``device="gpu"`` is only on the non-reduce-scatter path,
   item 6). Restored on exit.
9. ``DygraphShardingOptimizerV2._build_comm_buffers`` (Paddle 2.6 only) ->
   the same call with ``group_size`` = the ``comm_buffer_size_MB`` MiB of
   the innermost open :func:`cpu_sharding_v2` block (``None``: Paddle's
   256 MB), outside any block :data:`SITE_V2_BUFFER_MB`, unless the caller
   passes a size. Why: Paddle 2.6 has no
   ``sharding_configs.comm_buffer_size_MB`` and always groups parameters
   into 256 MB buffers, so a small test model gets one buffer; on 3.x the
   tests set ``comm_buffer_size_MB`` and this item does nothing.

Gradient-communication overlap (``sharding_configs.comm_overlap`` on V1
needs only item 6 around building the optimizer, which is where V1 builds
its fused buffers and reduce hooks; on V2 items 7 and 8), and
``pp_configs.sharding_comm_overlap``, item 10 (by :func:`install`):

10. ``PipelineParallel.register_sharding_comm_overlap_hook`` -> the same
    call inside :func:`cpu_tensor_fusion` (item 6). Why: with
    ``pp_configs.sharding_comm_overlap`` the pipeline builds its own comm
    buffers (``FusedCommBuffer``, one per destination rank and 128 MB group
    of each model chunk: gradient-only ``GradStorage`` for V1, the
    reduce-scatter buffers holding the parameters for V2) in this call,
    which ``train_batch`` makes at its first run, not when the model or the
    optimizer is built. On the CPU that fails in Paddle's words: 3.x
    ``tensor fusion helper now only support dict_keys(['gpu', 'npu',
    'xpu']), but got device unknown instead`` (V1 and V2); 2.6 (V1)
    ``The device should not be ... 'gpu:0'..., since PaddlePaddle is not
    compiled with CUDA`` (``GradStorage`` is made with ``device="gpu"``).
    Item 6 is active only for the duration of the call.

:func:`install_site` is what a per-rank script in upstream's form, which
imports nothing of this project, needs on a CPU rank (items 1, 7, and 8 and
9 around V2's comm buffers: the patch's V2 script); the launcher's site hook
``tools/collective/cpu_site/sitecustomize.py`` calls it before the script
runs, in the CPU ranks of every launch through the ``TestMultipleGpus`` and
``CommunicationTestDistBase`` stand-ins (``test/legacy_test``,
``test/collective``) and of the example launches of ``test/examples``.
:func:`install` includes it.
"""

import contextlib
import functools
import os

import paddle

_INSTALLED = []
# item 9 on Paddle 2.6, for V2 built outside any cpu_sharding_v2 block: the
# comm buffer size the patch's V2 script sets on 3.x (comm_buffer_size_MB)
SITE_V2_BUFFER_MB = 1
_V2_BLOCKS = []  # comm_buffer_size_MB of each open cpu_sharding_v2 block


def _on_cpu():
    return not paddle.is_compiled_with_cuda() or paddle.get_device() == "cpu"


def install_site():
    """Items 1, 7, and 8 and 9 around every build of V2's comm buffers, once
    per process; a no-op on GPU ranks (see the module docstring)."""
    if _on_cpu() and not getattr(paddle.distributed.new_group, "_shim", False):
        _serialize_group_creation()
        _gloo_store_per_group()
        _reduce_scatter_by_all_reduce()
        _v2_comm_buffers_on_cpu()


def _gloo_store_per_group():
    """Item 1b: on CPU ranks (gloo) every process group other than the
    global one rendezvouses through a TCP store of its own, hosted by the
    group's first rank on a free port announced through the default store.
    Why: Paddle's ``ProcessGroupGloo`` constructor connects its gloo context
    through the launch's one store without a prefix (its comm context uses
    ``PrefixStore(gid)``), so the keys of every group's rendezvous are the
    same ("0", "1", ...) and a rank of a later group can read a key an
    earlier group left there before its own peer rewrote it: on 8 ranks,
    ``fleet.init`` with groups of 2 or 4 ranks failed in 7 of 8 launches
    here (``address.cc:30 sizeof(impl_) == bytes.size(). 136 vs 45``, or a
    gloo ``TIMEOUT``), the shim's serialized group creation
    notwithstanding; with this, 0 of 9. The first rank keeps the port it
    announces bound until the store's server has bound it as well
    (``SO_REUSEADDR`` on both), so no other process of a loaded machine can
    take it in between. A no-op for other backends."""
    import socket

    from paddle.base import core
    from paddle.distributed import collective

    original = collective._new_process_group_impl
    if getattr(original, "_store_per_group", False):
        return
    stores = []  # alive as long as the process

    def new_process_group_impl(
        backend, store, rank, world_size, *args, group_id=0, **kwargs
    ):
        if backend == "gloo" and group_id != 0:
            key = f"paddle_overlay_test_group_store/{group_id}"
            holder = None
            if rank == 0:
                endpoint = os.environ.get("PADDLE_CURRENT_ENDPOINT", "")
                host = endpoint.rpartition(":")[0] or "127.0.0.1"
                # the port stays bound (SO_REUSEADDR, not listening) until
                # the store's server has bound it too: no other process
                # can take it between the choice and the server's bind
                holder = socket.socket()
                holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                holder.bind((host, 0))
                store.set(key, f"{host}:{holder.getsockname()[1]}")
            else:
                store.wait(key)
            host, _, port = store.get(key).decode().rpartition(":")
            try:  # the master's constructor returns once every rank joined
                store = core.TCPStore(
                    host, int(port), rank == 0, world_size, 900
                )
            finally:
                if holder is not None:
                    holder.close()
            stores.append(store)
        return original(
            backend, store, rank, world_size, *args, group_id=group_id, **kwargs
        )

    new_process_group_impl._store_per_group = True
    collective._new_process_group_impl = new_process_group_impl


def _serialize_group_creation():
    original = paddle.distributed.new_group

    @functools.wraps(original)
    def new_group_one_at_a_time(ranks=None, *args, **kwargs):
        world = paddle.distributed.get_world_size()
        if ranks is not None and sorted(ranks) == list(range(world)):
            # the whole world again (the hybrid "check" group): the global
            # group has exactly these ranks, and a second gloo context of
            # the same size reads the first one's rendezvous keys
            # ("address.cc ... sizeof(impl_) == bytes.size()")
            from paddle.distributed import collective

            return collective._get_default_group()
        paddle.distributed.barrier()
        group = original(ranks, *args, **kwargs)
        paddle.distributed.barrier()
        return group

    new_group_one_at_a_time._shim = True
    paddle.distributed.new_group = new_group_one_at_a_time


def _default_device_id():
    from paddle.distributed import parallel

    if not hasattr(parallel.ParallelEnv(), "_device_id"):
        parallel.ParallelEnv._device_id = 0


def _identity_for_c_identity():
    from paddle.distributed.fleet.layers.mpu import mp_ops

    original = mp_ops._c_identity

    class _IdentityAllReduceGrad(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, tensor, group):
            ctx.group = group
            return paddle.assign(tensor)

        @staticmethod
        def backward(ctx, grad):
            grad = paddle.assign(grad)
            paddle.distributed.all_reduce(grad, group=ctx.group)
            return grad

    @functools.wraps(original)
    def c_identity(tensor, group=None, *args, **kwargs):
        if group is None or group.nranks <= 1:
            return original(tensor, group, *args, **kwargs)
        return _IdentityAllReduceGrad.apply(tensor, group)

    mp_ops._c_identity = c_identity

    class _AllReduceIdentityGrad(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, tensor, group):
            out = paddle.assign(tensor)
            paddle.distributed.all_reduce(out, group=group)
            return out

        @staticmethod
        def backward(ctx, grad):
            return paddle.assign(grad)

    original_allreduce = mp_ops._mp_allreduce

    @functools.wraps(original_allreduce)
    def mp_allreduce(tensor, *args, group=None, **kwargs):
        if group is None or group.nranks <= 1:
            return original_allreduce(tensor, *args, group=group, **kwargs)
        return _AllReduceIdentityGrad.apply(tensor, group)

    mp_ops._mp_allreduce = mp_allreduce


def _broadcast_input_data_on_cpu():
    from paddle.distributed.fleet.meta_parallel import tensor_parallel

    def broadcast_input_data(hcg, *inputs, **kwargs):
        group = hcg.get_model_parallel_group()
        src = hcg.get_model_parallel_group_src_rank()
        for value in list(inputs) + list(kwargs.values()):
            if isinstance(value, paddle.Tensor):
                paddle.distributed.broadcast(value, src=src, group=group)
        return inputs, kwargs

    tensor_parallel.broadcast_input_data = broadcast_input_data


def _pipeline_p2p_with_isend_irecv():
    from paddle.distributed.fleet.meta_parallel.pp_utils import (
        p2p_communication as p2p,
    )

    if not hasattr(p2p, "batch_send_recv_on_calc_stream"):
        return

    def batch_send_recv(p2p_op_list):
        # gloo's send/recv block until matched: towards a higher rank send
        # first, towards a lower rank receive first, so two stages that
        # both send and receive never wait on each other's send.
        me = paddle.distributed.get_rank()

        def is_send(op):
            return op.op.__name__ == "_send_on_calc_stream"

        ordered = sorted(
            p2p_op_list, key=lambda op: is_send(op) != (me < op.peer)
        )
        tasks = []
        for op in ordered:
            if is_send(op):
                send = paddle.distributed.isend
                tasks.append(send(op.tensor, dst=op.peer, group=op.group))
            else:
                recv = paddle.distributed.irecv
                tasks.append(recv(op.tensor, src=op.peer, group=op.group))
        for task in tasks:
            task.wait()

    p2p.batch_send_recv_on_calc_stream = batch_send_recv


class _FinishedTask:
    """A task whose collective already ran (gloo runs it in the call)."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True

    def synchronize(self):
        return None


def _reduce_scatter_by_all_reduce():
    """7. (see the module docstring)"""
    original = paddle.distributed.reduce_scatter

    @functools.wraps(original)
    def reduce_scatter(
        tensor, tensor_or_tensor_list, op=None, group=None, sync_op=True
    ):
        from paddle.distributed import collective

        if op is None:
            op = paddle.distributed.ReduceOp.SUM
        group = group or collective._get_default_group()
        if group.rank < 0:  # not in this group
            return _FinishedTask()
        if isinstance(tensor_or_tensor_list, (list, tuple)):
            full = paddle.concat([t.flatten() for t in tensor_or_tensor_list])
        else:
            full = tensor_or_tensor_list.flatten().clone()
        paddle.distributed.all_reduce(full, op=op, group=group, sync_op=True)
        size = int(tensor._numel())
        mine = full._slice(group.rank * size, (group.rank + 1) * size)
        with paddle.no_grad():
            tensor.copy_(mine.reshape(tensor.shape), True)
        return _FinishedTask()

    paddle.distributed.reduce_scatter = reduce_scatter


def _pipeline_comm_buffers_on_cpu():
    """10. (see the module docstring)"""
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel as pp

    original = pp.PipelineParallel.register_sharding_comm_overlap_hook

    @functools.wraps(original)
    def register_sharding_comm_overlap_hook(self, optimizer):
        if not getattr(self, "_sharding_comm_overlap", False):
            return original(self, optimizer)  # builds nothing
        with cpu_tensor_fusion():
            return original(self, optimizer)

    pp.PipelineParallel.register_sharding_comm_overlap_hook = (
        register_sharding_comm_overlap_hook
    )


def install():
    """Apply the shims above once per process; a no-op on GPU ranks.
    Call before ``fleet.init``."""
    if _INSTALLED or not _on_cpu():
        return
    _INSTALLED.append(True)
    install_site()
    _default_device_id()
    _identity_for_c_identity()
    _broadcast_input_data_on_cpu()
    _pipeline_p2p_with_isend_irecv()
    _pipeline_comm_buffers_on_cpu()


@contextlib.contextmanager
def cpu_tensor_fusion():
    """6. Inside this block, ``sharding_configs.tensor_fusion`` builds its
    fused parameter buffers on the CPU. What it replaces, and why:
    ``tensor_fusion_helper`` and ``group_sharded_storage.ParamStorage``
    assume a GPU/XPU/NPU: the alignment table has no CPU entry
    (-> the GPU's 256 bytes), the device type is asserted (-> "cpu"),
    ``cvt_to_device`` refuses the CPU (-> identity), ``device_guard``
    switches to ``gpu:N`` on Paddle 2.6 (-> no-op), and ``add_rank_params``
    copies through ``param.cpu()`` then clears the parameter, which on the
    CPU is the same memory (-> ``convert_gpu=False``). Restored on exit.
    """
    from paddle.distributed.fleet.meta_parallel.sharding import (
        group_sharded_storage as gss,
    )
    from paddle.distributed.fleet.utils import tensor_fusion_helper as tfh

    saved_alignment = dict(tfh.alignment)
    saved_type = getattr(tfh, "__current_device_type__", None)
    saved_cvt = gss.cvt_to_device
    saved_guard = gss.device_guard
    saved_add = gss.ParamStorage.add_rank_params

    def add_rank_params(self, params, param2align, convert_gpu=True):
        return saved_add(self, params, param2align, convert_gpu=False)

    tfh.alignment["cpu"] = tfh.alignment["gpu"]
    if hasattr(tfh, "__current_device_type__"):
        tfh.__current_device_type__ = "cpu"
    gss.cvt_to_device = lambda x, dev_id, blocking=True: x
    gss.device_guard = lambda dev_id=0, device="cpu": contextlib.nullcontext()
    gss.ParamStorage.add_rank_params = add_rank_params
    try:
        yield
    finally:
        tfh.alignment.clear()
        tfh.alignment.update(saved_alignment)
        if hasattr(tfh, "__current_device_type__"):
            tfh.__current_device_type__ = saved_type
        gss.cvt_to_device = saved_cvt
        gss.device_guard = saved_guard
        gss.ParamStorage.add_rank_params = saved_add


@contextlib.contextmanager
def _device_type_cpu():
    """8. (see the module docstring); a no-op on Paddle 2.6."""
    from paddle.distributed.fleet.utils import tensor_fusion_helper as tfh

    if not hasattr(tfh, "__current_device_type__"):
        yield
        return
    saved_alignment = dict(tfh.alignment)
    saved_type = tfh.__current_device_type__
    tfh.alignment["cpu"] = tfh.alignment["gpu"]
    tfh.__current_device_type__ = "cpu"
    try:
        yield
    finally:
        tfh.alignment.clear()
        tfh.alignment.update(saved_alignment)
        tfh.__current_device_type__ = saved_type


def _v2_comm_buffers_on_cpu():
    """8 and 9 around ``DygraphShardingOptimizerV2._build_comm_buffers``."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import (
        dygraph_sharding_optimizer as dso,
    )

    v2 = dso.DygraphShardingOptimizerV2
    original = v2.__dict__["_build_comm_buffers"]
    if getattr(original, "_shim", False):
        return

    @functools.wraps(original)
    def build_comm_buffers(self, acc_steps, *args, **kwargs):
        size_mb = _V2_BLOCKS[-1] if _V2_BLOCKS else SITE_V2_BUFFER_MB
        if not args and not kwargs and size_mb is not None:
            args = (int(size_mb * 1024 * 1024),)  # 9: Paddle 2.6 passes no size
        with _device_type_cpu():
            return original(self, acc_steps, *args, **kwargs)

    build_comm_buffers._shim = True
    v2._build_comm_buffers = build_comm_buffers


@contextlib.contextmanager
def cpu_sharding_v2(comm_buffer_size_MB=None):
    """8 and 9. Inside this block, sharding stage 1 V2 builds its comm
    buffers on the CPU (Paddle 3.x: item 8) and, on Paddle 2.6, in buffers
    of ``comm_buffer_size_MB`` MiB (item 9; ``None`` keeps Paddle's 256 MB).
    Wrap ``fleet.distributed_model`` (a pipeline builds V2's buffers there)
    and ``fleet.distributed_optimizer``. A no-op on GPU ranks."""
    if not _on_cpu():
        yield
        return
    _v2_comm_buffers_on_cpu()
    _V2_BLOCKS.append(comm_buffer_size_MB)
    try:
        with _device_type_cpu():
            yield
    finally:
        _V2_BLOCKS.pop()
